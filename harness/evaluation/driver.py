"""Evaluate one checkpoint on one benchmark: lm-eval generates, harness.data.scoring grades, we count.

Protocol (``EvalConfig``): k samples per problem at ``temperature``/``top_p`` -> avg@k, unbiased pass@j
(j = 1, 2, 4, ..., k), maj@k; plus one greedy completion per problem when ``greedy``. Prompts are
``harness.data.prompts.render_prompt(template, problem, tokenizer)``, the text training sees, tokenized without special
tokens as training does (``add_bos_token=False``); no lm-eval chat template is applied on top.

How the task is built. The YAMLs in ``harness/evaluation/tasks`` (a base ``_default_template_yaml`` plus ``include:``
variants) hold the scoring hooks. For a run we write, under ``out_dir/lm_eval/``:
  * ``docs.jsonl``: the benchmark rows (first ``limit``) with the rendered ``prompt``, ``scorer`` and
    ``scoring_timeout_s`` added, so lm-eval needs no template logic and the docs are exactly what was asked;
  * ``<task>.yaml`` per mode (sampled, greedy): ``include:`` of the variant
  (``harness/evaluation/tasks/<bench>.yaml``, or
    the base when there is none, e.g. ``arith_ood``) by absolute path, overriding ``task``,
    ``dataset_kwargs.data_files`` (absolute), ``process_docs: null``, ``repeats`` and ``generation_kwargs``.
These files are passed to ``simple_evaluate`` as task paths with ``TaskManager(include_defaults=False)``: only
public lm-eval features (YAML ``include``, a YAML path as a task name), and the exact task that ran is kept
next to its results. (A dict config would also work, but a dict is a full config, not an override, and
``!function`` hooks in a dict would need lm-eval's private YAML loader.)

Traps handled here: ``repeats: k`` alone scores only the first sample (lm-eval #3297), so the tasks use an
identity filter; ``max_gen_toks`` defaults to 256 in lm-eval, so it is always set (in the task, and in the vLLM
model args; HFLM has no such argument); transformers samples with ``top_k=50`` unless told otherwise and applies a
checkpoint's generation_config.json (Qwen2.5 ships top_k=20, repetition_penalty=1.05), so the hf backend passes
``top_k=0`` and ``repetition_penalty=1.0`` explicitly (vLLM's SamplingParams defaults are already those).

Outputs (written atomically; ``results.json`` last, so its presence means the run finished):
``samples.jsonl`` one row per (problem, sample) and ``results.json`` (protocol, metrics, data checksum,
versions, the lock file the installed packages match, timings, and lm-eval's own aggregate of the same scores as a
cross-check).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import math
import os
import shutil
import time
from collections import Counter
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.config.code_digests import code_record
from harness.config.launch import require_vllm_cpu_build
from harness.config.loopback import use_loopback
from harness.config.package_lock import lock_provenance
from harness.config.paths import REPO_ROOT
from harness.config.schema import BenchmarkConfig, EvalConfig
from harness.data.files import (
    DataFileError,
    read_jsonl,
    verify_checksum,
    write_json_atomic,
    write_jsonl_atomic,
    write_text_atomic,
)
from harness.data.score_names import GREEDY_ACCURACY, avg_at, maj_at, pass_at

TASKS_DIR = Path(__file__).resolve().parent / "tasks"
BASE_TASK = TASKS_DIR / "_default_template_yaml"
HF_CACHE = "hf_datasets_cache"


# --- metrics (pure) -----------------------------------------------------------------------------------------------


def avg_at_k(correct: Sequence[bool]) -> float:
    """Fraction of a problem's samples that are correct (avg@k when len(correct) == k)."""
    if not correct:
        raise ValueError("avg_at_k: no samples")
    return sum(bool(c) for c in correct) / len(correct)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k).

    Chen et al. 2021 (arXiv:2107.03374), eq. 1; computed as the product 1 - prod_{i=n-c+1}^{n} (1 - k/i),
    which avoids huge binomials.
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def majority_answer(extracted: Sequence[str | None]) -> str | None:
    """Most frequent extracted answer (None = nothing extracted, never a candidate); ties go to the earliest."""
    counts = Counter(a for a in extracted if a is not None)
    return counts.most_common(1)[0][0] if counts else None


def majority_correct(extracted: Sequence[str | None], correct: Sequence[bool]) -> bool:
    """maj@k: is the majority answer (over exact extracted strings) correct? False when nothing was extracted."""
    answer = majority_answer(extracted)
    if answer is None:
        return False
    return bool(next(c for a, c in zip(extracted, correct, strict=True) if a == answer))


def pass_levels(k: int) -> list[int]:
    """The j of pass@j we report: powers of two below k, and k itself."""
    levels = [j for j in (2**i for i in range(k.bit_length())) if j < k]
    return [*levels, k]


def summarize(samples: Sequence[dict], k: int, max_gen_toks: int) -> dict[str, float | int | None]:
    """Metrics from per-sample rows (the rows of ``samples.jsonl``); means run over gradable problems only."""
    by_problem: dict[str, list[dict]] = {}
    greedy: dict[str, dict] = {}
    for row in samples:
        if row["mode"] == "sampled":
            by_problem.setdefault(row["id"], []).append(row)
        else:
            greedy[row["id"]] = row
    gradable = {pid: rows for pid, rows in by_problem.items() if all(r["gradable"] for r in rows)}
    for pid, rows in by_problem.items():
        if len(rows) != k:
            raise ValueError(f"problem {pid}: {len(rows)} sampled completions, expected k={k}")

    def mean(values):
        values = list(values)
        return sum(values) / len(values) if values else None

    sampled_rows = [r for rows in by_problem.values() for r in rows]
    metrics: dict[str, float | int | None] = {
        avg_at(k): mean(avg_at_k([r["correct"] for r in rows]) for rows in gradable.values()),
    }
    for j in pass_levels(k):
        metrics[pass_at(j)] = mean(pass_at_k(k, sum(r["correct"] for r in rows), j) for rows in gradable.values())
    metrics[maj_at(k)] = mean(float(majority_correct([r["extracted"] for r in rows], [r["correct"] for r in rows]))
                               for rows in gradable.values())
    metrics["mean_response_tokens"] = mean(r["response_tokens"] for r in sampled_rows)
    metrics["format_ok_rate"] = mean(float(r["format_ok"]) for r in sampled_rows)
    metrics["clipped_rate"] = mean(float(r["response_tokens"] >= max_gen_toks) for r in sampled_rows)
    if greedy:
        greedy_gradable = [r for r in greedy.values() if r["gradable"]]
        metrics[GREEDY_ACCURACY] = mean(float(r["correct"]) for r in greedy_gradable)
        metrics["greedy_mean_response_tokens"] = mean(r["response_tokens"] for r in greedy.values())
        metrics["greedy_format_ok_rate"] = mean(float(r["format_ok"]) for r in greedy.values())
    metrics["n_gradable"] = len(gradable)
    metrics["ungradable"] = len(by_problem) - len(gradable)
    metrics["timed_out"] = sum(bool(r["timed_out"]) for r in samples)
    return metrics


# --- the lm-eval run ----------------------------------------------------------------------------------------------


def generation_kwargs(eval_cfg: EvalConfig, stops: Sequence[str], mode: str) -> dict:
    """lm-eval generation_kwargs for one mode; max_gen_toks always explicit (lm-eval's default is 256)."""
    kwargs: dict = {"until": list(stops), "max_gen_toks": eval_cfg.max_gen_toks}
    hf = eval_cfg.backend == "hf"
    if hf:
        kwargs["repetition_penalty"] = 1.0  # override a checkpoint's generation_config
    if mode == "greedy" or eval_cfg.temperature == 0.0:
        return {**kwargs, "do_sample": False}
    kwargs.update(do_sample=True, temperature=eval_cfg.temperature, top_p=eval_cfg.top_p)
    if hf:
        kwargs["top_k"] = 0  # transformers would otherwise apply top_k=50 (or the checkpoint's value)
    return kwargs


def model_args(model_dir: Path, eval_cfg: EvalConfig, device: str) -> dict:
    if eval_cfg.backend == "hf":
        return {"pretrained": str(model_dir), "dtype": "float32" if device == "cpu" else "auto",
                "add_bos_token": False, "trust_remote_code": False}  # HFLM takes max_gen_toks from the task only
    if importlib.util.find_spec("vllm") is None:
        raise RuntimeError("eval.backend is 'vllm' but vllm is not installed here; install the GPU extra "
                           "(pip install -e '.[gpu]') or set eval.backend=hf")
    v = eval_cfg.vllm
    if v.device == "cpu":
        return vllm_cpu_model_args(model_dir, eval_cfg)
    if v.data_parallel_size > 1 and importlib.util.find_spec("ray") is None:
        raise RuntimeError(f"eval.vllm.data_parallel_size={v.data_parallel_size} needs ray, which is not installed")
    return {"pretrained": str(model_dir), "dtype": "auto", "add_bos_token": False,
            "tensor_parallel_size": v.tensor_parallel_size, "data_parallel_size": v.data_parallel_size,
            "gpu_memory_utilization": v.gpu_memory_utilization,
            "max_model_len": vllm_max_model_len(model_dir, eval_cfg), "seed": eval_cfg.seed,
            "max_gen_toks": eval_cfg.max_gen_toks}


def vllm_max_model_len(model_dir: Path, eval_cfg: EvalConfig) -> int:
    """``eval.vllm.max_model_len``, capped at the model's ``max_position_embeddings``: vLLM refuses a longer context
    (the tiny preset's char Llama has 160 positions)."""
    import json

    config_file = Path(model_dir) / "config.json"
    limit = json.loads(config_file.read_text()).get("max_position_embeddings") if config_file.is_file() else None
    return min(eval_cfg.vllm.max_model_len, int(limit)) if limit else eval_cfg.vllm.max_model_len


def vllm_cpu_model_args(model_dir: Path, eval_cfg: EvalConfig) -> dict:
    """``eval.vllm.device=cpu``: vLLM's CPU build (its distribution `vllm` carries ``+cpu`` in the version, see
    scripts/vllm-cpu/), float32 like the hf backend on CPU, eager mode (no graph compilation for a short eval), the
    engine in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: no spawned worker, no batching across processes)
    and a KV cache of ``VLLM_CPU_KVCACHE_SPACE`` GiB (1 unless set)."""
    require_vllm_cpu_build("eval.vllm.device")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    return {"pretrained": str(model_dir), "dtype": "float32", "add_bos_token": False, "tensor_parallel_size": 1,
            "data_parallel_size": 1, "max_model_len": vllm_max_model_len(model_dir, eval_cfg), "seed": eval_cfg.seed,
            "max_gen_toks": eval_cfg.max_gen_toks, "enforce_eager": True}


def write_task_file(task_dir: Path, bench_name: str, mode: str, docs_file: Path, repeats: int,
                    gen_kwargs: dict) -> Path:
    """A task YAML that includes our variant and overrides only what this run sets (see module docstring)."""
    import yaml

    variant = TASKS_DIR / f"{bench_name}.yaml"
    task = f"harness_{bench_name}__{mode}"
    cfg = {
        "include": str(variant if variant.is_file() else BASE_TASK),
        "task": task,
        # datasets' arrow cache goes next to the docs (removed after the run), not into the shared ~/.cache
        "dataset_kwargs": {"data_files": {"test": str(docs_file.resolve())},
                           "cache_dir": str((task_dir / HF_CACHE).resolve())},
        "process_docs": None,  # the docs file already holds prompt, scorer and timeout
        "repeats": repeats,
        "generation_kwargs": gen_kwargs,
    }
    path = task_dir / f"{task}.yaml"
    return write_text_atomic(path, yaml.safe_dump(cfg, sort_keys=False, allow_unicode=True))


def _portable(path: Path) -> str:
    """Repo-relative when inside the repo, so results compare across checkouts and machines."""
    path = path.resolve()
    return path.relative_to(REPO_ROOT).as_posix() if path.is_relative_to(REPO_ROOT) else str(path)


def _lm_eval_metrics(task_results: dict) -> dict:
    """lm-eval's aggregates for one task ("avg_at_k,all" -> "avg_at_k"); NaN (no gradable problem) -> None."""
    out = {}
    for key, value in task_results.items():
        if "," in key and "_stderr" not in key:
            out[key.split(",")[0]] = None if isinstance(value, float) and math.isnan(value) else value
    return out


def _versions(backend: str) -> dict[str, str]:
    names = ["lm_eval", "transformers", "torch", "math-verify", "datasets"] + (["vllm"] if backend == "vllm" else [])
    out = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def _collect_samples(res: dict, task_files: dict[str, Path], modes: dict[str, int], prompts: dict[str, str],
                     n_docs: int) -> list[dict]:
    """One row per (problem, sample) from lm-eval's logged samples, in problem order, checking what lm-eval did."""
    samples = []
    for mode, task_file in task_files.items():
        task = task_file.stem
        logged = sorted(res["samples"][task], key=lambda s: s["doc_id"])
        if len(logged) != n_docs:
            raise RuntimeError(f"lm-eval returned {len(logged)} docs for {task}, expected {n_docs}")
        for entry in logged:
            doc = entry["doc"]
            context = entry["arguments"][0][0]  # (context, gen_kwargs) of the doc's request
            if context != prompts[doc["id"]]:
                raise RuntimeError(f"{task}: lm-eval changed the prompt of {doc['id']!r}: {context!r}")
            completions = entry["filtered_resps"][0]
            if isinstance(completions, str):
                completions = [completions]
            if len(completions) != modes[mode]:
                raise RuntimeError(f"{task}: {len(completions)} completions for {doc['id']!r}, "
                                   f"expected {modes[mode]} (is the keep-all filter in place?)")
            samples += [{"id": doc["id"], "sample": i, "mode": mode, "gold": doc["answer"], "completion": c}
                        for i, c in enumerate(completions)]
    return samples


def _score_samples(samples: list[dict], scorer: str, timeout_s: float, tokenizer) -> None:
    """Add the score fields and the response length to each row, in place.

    The scorer is the one process_results used, so these are cache hits. ``response_tokens`` re-tokenizes the
    returned text (stop string and EOS removed, special tokens skipped by lm-eval's decode): exact for the
    char-level model, within a token or two of the generated count for BPE tokenizers.
    """
    from harness.data.scoring import score_batch

    texts = [s["completion"] for s in samples]
    scores = score_batch(texts, [s["gold"] for s in samples], scorer, timeout_s)
    lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]] if texts else []
    for row, score, length in zip(samples, scores, lengths, strict=True):
        row.update(extracted=score.extracted, correct=score.correct, format_ok=score.format_ok,
                   gradable=score.gradable, timed_out=score.timed_out, response_tokens=length)


def import_eval_stack(backend: str) -> None:
    """Import what ``evaluate_benchmark`` needs (lm-eval, its task manager, transformers' tokenizers and, for the hf
    backend, lm-eval's HFLM and its torch/transformers model code) ahead of the work, so a job's start-up is one
    measurable block. vLLM is left to lm-eval, which imports it when the model is built."""
    import lm_eval  # noqa: F401
    from lm_eval.tasks import TaskManager  # noqa: F401
    from transformers import AutoTokenizer  # noqa: F401

    if backend == "hf":
        from lm_eval.models.huggingface import HFLM  # noqa: F401

        import harness.evaluation.hflm  # noqa: F401  (HFLM with harness/model/decode.py, eval.fast_decode)


@contextmanager
def without_environment_probe():
    """lm-eval's ``simple_evaluate`` (0.4.13) ends every call with ``add_env_info`` (torch's collect_env: about 40
    subprocesses such as pip, conda and nvidia-smi, ~0.3 CPU s and more wall time each call) and a git hash of the
    working directory; ``evaluate_benchmark`` reads neither (results.json records the versions itself), so they are
    replaced by no-ops for the call. Nothing that generates or scores is touched."""
    import lm_eval.evaluator as evaluator

    saved = evaluator.add_env_info, evaluator.get_git_commit_hash
    evaluator.add_env_info, evaluator.get_git_commit_hash = (lambda storage: None), (lambda: None)
    try:
        yield
    finally:
        evaluator.add_env_info, evaluator.get_git_commit_hash = saved


def lm_eval_model_name(eval_cfg: EvalConfig) -> str:
    """The lm-eval model type the backend runs: for ``vllm`` lm-eval's VLLM with a seed per request (one engine
    serves all the checkpoint's benchmarks, harness/evaluation/vllm_lm.py); for ``hf`` our HFLM with the fast decoding
    loop (``eval.fast_decode``: the same completions, less Python per decoding step) or lm-eval's own ``hf``."""
    if eval_cfg.backend == "vllm":
        from harness.evaluation.vllm_lm import MODEL_NAME

        return MODEL_NAME
    if eval_cfg.fast_decode:
        from harness.evaluation.hflm import MODEL_NAME

        return MODEL_NAME
    return eval_cfg.backend


@dataclass
class LoadedCheckpoint:
    """What the benchmarks of one checkpoint share in an eval process: its tokenizer and lm-eval's model (for vLLM
    its engine), built once as ``simple_evaluate`` builds it from a name (same arguments). Each benchmark is still
    its own ``simple_evaluate`` call, which seeds python, numpy and torch before generating; HFLM holds no sampling
    state between calls and vLLM samples each request from a seed of its own (harness/evaluation/vllm_lm.py), so a
    benchmark's samples are those of a model built for it alone (tests/test_evaluate.py, tests/test_vllm_cpu.py).
    ``release`` after the last benchmark frees a vLLM engine before the next checkpoint builds its own."""

    model_dir: Path
    tokenizer: Any
    lm: Any

    def release(self) -> None:
        if hasattr(self.lm, "release"):
            self.lm.release()
        self.lm = None


def load_checkpoint(model_dir: Path, eval_cfg: EvalConfig, device: str = "cpu") -> LoadedCheckpoint:
    import lm_eval.api.registry
    from transformers import AutoTokenizer

    model_dir = Path(model_dir)
    arguments = model_args(model_dir, eval_cfg, device)  # first: a clear error when vllm is missing
    extra = {"batch_size": eval_cfg.batch_size, "max_batch_size": None, "device": device}
    if eval_cfg.backend == "vllm":
        extra = {"batch_size": "auto", "max_batch_size": None, "device": None}
        use_loopback()  # the engine's Gloo and NCCL listeners and its rendezvous address on loopback
    lm = lm_eval.api.registry.get_model(lm_eval_model_name(eval_cfg)).create_from_arg_obj(arguments, extra)
    return LoadedCheckpoint(model_dir, AutoTokenizer.from_pretrained(model_dir), lm)


def evaluate_benchmark(model_dir: Path, bench_name: str, bench: BenchmarkConfig, data_file: Path,
                       eval_cfg: EvalConfig, prompt_template: str, out_dir: Path, device: str = "cpu",
                       loaded: LoadedCheckpoint | None = None) -> dict:
    """Generate, score and summarise ``bench`` for the checkpoint in ``model_dir``; write and return results.json.
    ``loaded``: the checkpoint's ``load_checkpoint``, shared by its benchmarks (loaded here when None).
    Four steps: the benchmark's rows, lm-eval's tasks over them, generation, then scoring and the record."""
    start = time.monotonic()
    data_file, out_dir, model_dir = Path(data_file), Path(out_dir), Path(model_dir)
    data_sha256 = verify_checksum(data_file)  # before any model work: a corrupt file fails in seconds
    (out_dir / "results.json").unlink(missing_ok=True)  # results.json present <=> this run finished
    rows = benchmark_rows(bench_name, bench, data_file)
    model_args(model_dir, eval_cfg, device)  # fails early when vllm is missing
    if loaded is not None and loaded.model_dir != model_dir:
        raise ValueError(f"evaluate_benchmark: model_dir {model_dir} but the loaded checkpoint is {loaded.model_dir}")
    owned = loaded is None  # loaded here: released here
    loaded = loaded or load_checkpoint(model_dir, eval_cfg, device)
    tasks = BenchmarkTasks.write(rows, bench_name, bench, eval_cfg, prompt_template, loaded.tokenizer,
                                 out_dir / "lm_eval")
    gen_start = time.monotonic()
    res = generate(loaded, tasks, eval_cfg, device)
    generate_s = time.monotonic() - gen_start
    if owned:
        loaded.release()
    shutil.rmtree(out_dir / "lm_eval" / HF_CACHE, ignore_errors=True)

    samples = _collect_samples(res, tasks.files, tasks.modes, tasks.prompts, len(rows))
    score_start = time.monotonic()
    _score_samples(samples, bench.scorer, eval_cfg.scoring_timeout_s, loaded.tokenizer)
    score_s = time.monotonic() - score_start
    metrics = summarize(samples, eval_cfg.k, eval_cfg.max_gen_toks)
    metrics["prompts_truncated"] = prompts_truncated(model_dir, eval_cfg, loaded.tokenizer, tasks.prompts)
    write_jsonl_atomic(out_dir / "samples.jsonl", samples)
    results = {
        "bench": bench_name,
        "model_dir": _portable(model_dir),
        "scorer": bench.scorer,
        "prompt_template": prompt_template,
        "n_problems": len(rows),
        "k": eval_cfg.k,
        "temperature": eval_cfg.temperature,
        "top_p": eval_cfg.top_p,
        "max_gen_toks": eval_cfg.max_gen_toks,
        "greedy": eval_cfg.greedy,
        "backend": eval_cfg.backend,
        "device": device if eval_cfg.backend == "hf" else f"vllm-{eval_cfg.vllm.device}",
        "seed": eval_cfg.seed,
        "scoring_timeout_s": eval_cfg.scoring_timeout_s,
        "stop_sequences": list(tasks.stops),
        "metrics": metrics,
        "lm_eval_metrics": {tasks.files[m].stem: _lm_eval_metrics(res["results"][tasks.files[m].stem])
                            for m in tasks.modes},
        "data_file": _portable(data_file),
        "data_sha256": data_sha256,
        "samples_file": "samples.jsonl",
        "versions": _versions(eval_cfg.backend),
        **lock_provenance(),  # the lock file the installed packages match (harness/config/package_lock.py)
        "code": code_record(),
        "generate_s": round(generate_s, 3),
        "score_s": round(score_s, 3),
        "elapsed_s": round(time.monotonic() - start, 3),
    }
    write_json_atomic(out_dir / "results.json", results)
    return results


def benchmark_rows(bench_name: str, bench: BenchmarkConfig, data_file: Path) -> list[dict]:
    """The benchmark's rows (its first ``limit``), with unique ids: per-sample rows are keyed by id."""
    rows = read_jsonl(data_file)
    if not rows:  # metrics of no problems would all be None
        raise DataFileError(f"{data_file}: benchmark {bench_name!r} has no rows")
    if bench.limit > 0:
        rows = rows[:bench.limit]
    if len({r["id"] for r in rows}) != len(rows):
        raise ValueError(f"{data_file}: duplicate ids; per-sample rows are keyed by id")
    return rows


@dataclass
class BenchmarkTasks:
    """lm-eval's tasks of one benchmark in ``task_dir``: the rendered prompts by id, the stop sequences, and one
    task file per mode (``sampled``: k repeats; ``greedy``: one, when eval.greedy)."""

    prompts: dict
    stops: tuple
    modes: dict
    files: dict

    @classmethod
    def write(cls, rows: list[dict], bench_name: str, bench: BenchmarkConfig, eval_cfg: EvalConfig,
              prompt_template: str, tokenizer, task_dir: Path) -> BenchmarkTasks:
        from harness.data.prompts import render_prompt, stop_sequences

        prompts = {r["id"]: render_prompt(prompt_template, r["problem"], tokenizer) for r in rows}
        docs = [{"id": r["id"], "problem": r["problem"], "answer": str(r["answer"]), "prompt": prompts[r["id"]],
                 "scorer": bench.scorer, "scoring_timeout_s": eval_cfg.scoring_timeout_s} for r in rows]
        docs_file = write_jsonl_atomic(task_dir / "docs.jsonl", docs)
        stops = stop_sequences(prompt_template, eval_cfg.stop)
        modes = {"sampled": eval_cfg.k, **({"greedy": 1} if eval_cfg.greedy else {})}
        files = {mode: write_task_file(task_dir, bench_name, mode, docs_file, repeats,
                                       generation_kwargs(eval_cfg, stops, mode)) for mode, repeats in modes.items()}
        return cls(prompts, stops, modes, files)


def generate(loaded: LoadedCheckpoint, tasks: BenchmarkTasks, eval_cfg: EvalConfig, device: str) -> dict:
    """lm-eval's ``simple_evaluate`` over the tasks with the loaded model, seeded by ``eval.seed``."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    with without_environment_probe():
        return lm_eval.simple_evaluate(
            model=loaded.lm, tasks=[str(p) for p in tasks.files.values()],
            task_manager=TaskManager(include_defaults=False), num_fewshot=0,
            batch_size=eval_cfg.batch_size if eval_cfg.backend == "hf" else "auto",
            device=device if eval_cfg.backend == "hf" else None, apply_chat_template=False, log_samples=True,
            bootstrap_iters=0, random_seed=eval_cfg.seed, numpy_random_seed=eval_cfg.seed,
            torch_random_seed=eval_cfg.seed, fewshot_random_seed=eval_cfg.seed)


def prompts_truncated(model_dir: Path, eval_cfg: EvalConfig, tokenizer, prompts: dict) -> int | None:
    """Prompts longer than the context leaves room for beside max_gen_toks (lm-eval left-truncates them); None when
    the model declares no context length."""
    from transformers import AutoConfig

    context_limit = (vllm_max_model_len(model_dir, eval_cfg) if eval_cfg.backend == "vllm"
                     else getattr(AutoConfig.from_pretrained(model_dir), "max_position_embeddings", None))
    if not context_limit:
        return None
    prompt_lengths = [len(ids) for ids in tokenizer(list(prompts.values()), add_special_tokens=False)["input_ids"]]
    return sum(n > context_limit - eval_cfg.max_gen_toks for n in prompt_lengths)
