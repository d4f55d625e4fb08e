"""Shared helpers of the bench/ scripts: environment record, robust statistics, result files, memory probes and
the small sweeps (tiny, smol) the benchmarks train on.

Not a test module: nothing here asserts a threshold. Every script writes ``results/bench/<name>.json`` (raw
timings, settings, versions, hardware, date) and replaces its own section of ``results/bench/summary.md``.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # `python bench/x.py` puts bench/ first on sys.path, not the repository root
    sys.path.insert(0, str(REPO))

RESULTS = REPO / "results" / "bench"
SUMMARY = RESULTS / "summary.md"
DEFAULT_WORKDIR = Path(os.environ.get("BENCH_WORKDIR", "/tmp/harness-bench"))  # cached data + warm starts
CPU_FREE_FLAG = Path("/tmp/cpu_free")


# --- environment ----------------------------------------------------------------------------------------------

def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def memory_total_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def git_commit() -> str | None:
    """HEAD's commit (read-only: ``git rev-parse``)."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def environment() -> dict:
    """Versions, hardware, date, and how busy the machine was (this machine is shared with a sweep)."""
    import torch

    from harness.config.provenance import package_versions

    return {
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "versions": package_versions(),
        "git_commit": git_commit(),
        "hardware": {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "memory_bytes": memory_total_bytes(),
                     "platform": platform.platform(), "cuda": torch.cuda.is_available(),
                     "torch_threads": torch.get_num_threads()},
        "load_average": os.getloadavg(),
        "cpu_free_flag": CPU_FREE_FLAG.exists(),  # False: measured while the shared sweep was still running
        "argv": sys.argv,
    }


# --- statistics -----------------------------------------------------------------------------------------------

def quantile(values: list[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default) without numpy."""
    xs = sorted(values)
    if not xs:
        return float("nan")
    pos = (len(xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def describe(values: list[float]) -> dict:
    """median, interquartile range, min, max, n of a sample."""
    if not values:
        return {"n": 0, "median": float("nan"), "q25": float("nan"), "q75": float("nan"),
                "min": float("nan"), "max": float("nan")}
    return {"n": len(values), "median": statistics.median(values), "q25": quantile(values, 0.25),
            "q75": quantile(values, 0.75), "min": min(values), "max": max(values)}


def paired_ratio(numerator: list[float], denominator: list[float]) -> dict:
    """Ratios of paired measurements (same block, interleaved): the median of the per-pair ratios with their
    interquartile range and extremes, plus the ratio of the medians."""
    pairs = [(a, b) for a, b in zip(numerator, denominator, strict=True) if b > 0]
    ratios = [a / b for a, b in pairs]
    out = describe(ratios)
    med_b = statistics.median([b for _, b in pairs]) if pairs else float("nan")
    out["ratio_of_medians"] = (statistics.median([a for a, _ in pairs]) / med_b) if pairs and med_b else float("nan")
    out["ratio_of_sums"] = sum(a for a, _ in pairs) / sum(b for _, b in pairs) if pairs else float("nan")
    out["ci90_median"] = bootstrap_median_ci(ratios)
    return out


def bootstrap_median_ci(values: list[float], level: float = 0.90, resamples: int = 2000, seed: int = 0) -> list:
    """Percentile bootstrap interval of the median (fixed seed: the same data give the same interval)."""
    import random

    if len(values) < 3:
        return [float("nan"), float("nan")]
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))
    tail = (1 - level) / 2
    return [quantile(medians, tail), quantile(medians, 1 - tail)]


def fmt_ratio(r: dict, digits: int = 2, ci: bool = True) -> str:
    """'1.01 [0.95-1.06] (0.98-1.03)': median of per-pair ratios [interquartile range] (90% bootstrap interval
    of the median)."""
    if not r or r.get("n", 0) == 0:
        return "n/a"
    text = f"{r['median']:.{digits}f} [{r['q25']:.{digits}f}-{r['q75']:.{digits}f}]"
    if ci and r.get("ci90_median") and r["ci90_median"][0] == r["ci90_median"][0]:
        lo, hi = r["ci90_median"]
        text += f" ({lo:.{digits}f}-{hi:.{digits}f})"
    return text


def verdict(met: bool | None) -> str:
    return "n/a" if met is None else ("met" if met else "not met")


# --- result files ---------------------------------------------------------------------------------------------

def write_result(name: str, record: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    record.setdefault("load_average_end", os.getloadavg())  # the machine is shared: how busy it was at the end
    tmp = path.with_suffix(".json.partial")
    tmp.write_text(json.dumps(record, indent=1, default=str) + "\n")
    tmp.replace(path)
    return path


SUMMARY_HEADER = """# Benchmarks

Written by the `bench/` scripts (see `bench/README.md` for the method, targets and findings); each script replaces
only its own section. Ratios are medians of per-pair ratios of interleaved runs:
`median [interquartile range] (90% bootstrap interval of the median)`.
"""


def update_summary(name: str, body: str) -> Path:
    """Replace the section between this script's markers in results/bench/summary.md (append it when new)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    start, end = f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"
    text = SUMMARY.read_text() if SUMMARY.is_file() else SUMMARY_HEADER
    section = f"{start}\n{body.rstrip()}\n{end}"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        text = head + section + tail
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    tmp = SUMMARY.with_suffix(".md.partial")
    tmp.write_text(text)
    tmp.replace(SUMMARY)
    return SUMMARY


def table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# --- memory probes (CPU) ----------------------------------------------------------------------------------------

def ru_maxrss_bytes() -> int:
    """Peak resident set size of this process so far (Linux reports KiB). Cannot be reset."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _status_field(name: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(name + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def current_rss_bytes() -> int | None:
    return _status_field("VmRSS")


def hwm_bytes() -> int | None:
    """VmHWM: the peak RSS since the process started or since the last ``reset_peak_rss``."""
    return _status_field("VmHWM")


def child_env() -> dict:
    """Environment of a memory-measuring subprocess: glibc's malloc with a fixed mmap threshold (64 kB) returns
    every freed block of 64 kB or more to the OS at once, so the resident set follows the live tensors. (By default
    the threshold grows after the first large free, freed memory then stays resident and a pre-run baseline
    overstates what is in use.)"""
    import os

    return {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "131072"}


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0: write 5 to /proc/self/clear_refs). False if refused."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


# --- the tiny and smol sweeps the benchmarks train on --------------------------------------------------------------

def tiny_sweep(workdir: Path, warmstart_steps: int = 300, n_train: int = 4000, overrides: list[str] | None = None):
    """(Resolved, SweepPaths) of a tiny preset sweep in ``workdir``, data and warm start built once and reused."""
    from harness.config.paths import SweepPaths
    from harness.config.schema import resolve
    from harness.train.run import prepare_data, warmstart

    root = Path(workdir) / f"tiny-ws{warmstart_steps}-n{n_train}"
    base = [f"results_dir={root.parent}", f"data.synthetic.n_train={n_train}", "data.synthetic.n_eval=8",
            "data.synthetic.n_ood=8", f"warmstart.steps={warmstart_steps}"]
    resolved = resolve({"name": root.name, "preset": "tiny"}, base + list(overrides or []))
    paths = SweepPaths(resolved.results_dir)
    if not (paths.data_dir / "SHA256SUMS").is_file():
        prepare_data(resolved, paths)
    if not (paths.warmstart_dir / "warmstart.json").is_file():
        started = time.perf_counter()
        warmstart(resolved, paths)
        print(f"[bench] tiny warm start ({warmstart_steps} steps) built in {time.perf_counter() - started:.0f} s "
              f"at {paths.warmstart_dir}", flush=True)
    return resolved, paths


SMOL_WARMSTART = REPO / "results" / "smol" / "warmstart" / "model"


def smol_sweep(workdir: Path, overrides: list[str] | None = None):
    """(Resolved, SweepPaths) of the smol preset with its data in ``workdir``; the model is the converted GGUF in
    results/smol/warmstart/model (built by ``harness warmstart --sweep configs/sweeps/smol.yaml`` when missing)."""
    from harness.config.paths import SweepPaths
    from harness.config.schema import resolve
    from harness.train.run import prepare_data

    root = Path(workdir) / "smol"
    resolved = resolve({"name": root.name, "preset": "smol"}, [f"results_dir={root.parent}", *(overrides or [])])
    paths = SweepPaths(resolved.results_dir)
    if not (paths.data_dir / "SHA256SUMS").is_file():
        prepare_data(resolved, paths)
    ensure_smol_model()
    return resolved, paths


def ensure_smol_model() -> Path:
    if not ((SMOL_WARMSTART / "config.json").is_file() and (SMOL_WARMSTART / "model.safetensors").is_file()):
        print("[bench] converting SmolLM2-135M (GGUF) into results/smol/warmstart/model ...", flush=True)
        harness = Path(sys.executable).parent / "harness"
        subprocess.run([str(harness), "warmstart", "--sweep", str(REPO / "configs" / "sweeps" / "smol.yaml")],
                       cwd=REPO, check=True)
    return SMOL_WARMSTART


def model_dir_for(preset_name: str, paths) -> Path:
    return SMOL_WARMSTART if preset_name == "smol" else paths.warmstart_dir


def training_dataset(resolved, paths, tokenizer, seed: int = 0):
    """The prompts exactly as run_training renders them (shuffled by seed)."""
    from datasets import Dataset

    from harness.data.prompts import render_prompt
    from harness.train.run import training_rows

    rows = training_rows(resolved, paths, seed)
    template = resolved.preset.prompt_template
    return Dataset.from_list([{"prompt": render_prompt(template, r["problem"], tokenizer), "answer": r["answer"]}
                              for r in rows])


class Timer:
    """Wall (perf_counter) and process CPU (process_time) seconds of a block."""

    def __enter__(self):
        self.wall0, self.cpu0 = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.wall0
        self.cpu = time.process_time() - self.cpu0
        return False


# --- rollouts as TRL samples them (transformers generate, left-padded prompts, mask up to the first EOS) ---------

def trl_generation_config(args, model, tokenizer):
    """The GenerationConfig TRL's GRPOTrainer builds from GRPOConfig ``args`` (non-vLLM path), and its EOS ids."""
    from transformers import GenerationConfig

    eos = model.generation_config.eos_token_id
    eos = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    if tokenizer.eos_token_id not in eos:
        eos = [tokenizer.eos_token_id, *eos]
    config = GenerationConfig(max_new_tokens=args.max_completion_length, do_sample=True,
                              pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                              eos_token_id=eos, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                              min_p=args.min_p, repetition_penalty=args.repetition_penalty,
                              cache_implementation=args.cache_implementation, disable_compile=True)
    return config, eos


def sample_rollouts(model, tokenizer, prompts: list[str], num_generations: int, generation_config, eos_ids,
                    seed: int) -> dict:
    """Each prompt repeated ``num_generations`` times (TRL's RepeatSampler), tokenised and left-padded as TRL does,
    sampled with ``generation_config``; the completion mask covers the tokens up to and including the first EOS."""
    import torch

    texts = [p for p in prompts for _ in range(num_generations)]
    ids = [torch.tensor(x) for x in tokenizer(text=texts)["input_ids"]]
    width = max(len(x) for x in ids)
    pad = tokenizer.pad_token_id
    prompt_ids = torch.stack([torch.cat([torch.full((width - len(x),), pad, dtype=x.dtype), x]) for x in ids])
    prompt_mask = torch.stack([torch.cat([torch.zeros(width - len(x), dtype=torch.long),
                                          torch.ones(len(x), dtype=torch.long)]) for x in ids])
    torch.manual_seed(seed)
    with Timer() as timer, torch.no_grad():
        out = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, generation_config=generation_config)
    completion_ids = out[:, width:]
    is_eos = torch.isin(completion_ids, torch.tensor(eos_ids))
    eos_idx = torch.full((is_eos.size(0),), is_eos.size(1), dtype=torch.long)
    eos_idx[is_eos.any(dim=1)] = is_eos.int().argmax(dim=1)[is_eos.any(dim=1)]
    completion_mask = (torch.arange(is_eos.size(1)).expand(is_eos.size(0), -1) <= eos_idx[:, None]).long()
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
            "completion_mask": completion_mask, "wall_s": timer.wall, "cpu_s": timer.cpu,
            "generated_tokens": int(completion_mask.sum()), "padded_steps": int(completion_ids.shape[1]),
            "prompt_tokens": int(prompt_mask.sum()), "rows": len(texts)}
