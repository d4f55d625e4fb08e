"""Peak memory of the chunked token statistics against full logits, as the completion grows.

Variants, for completion lengths T (default 256, 1024, 4096) with a realistic vocabulary (V = 49152 and hidden
H = 576, SmolLM2-135M's LM head):
- ``chunked``: ``harness.train.token_statistics.token_statistics(hidden, lm_head, targets, (), chunk_size=256)``,
  logp only (what the trainer asks for when a method needs no extra statistic), then ``logp.sum().backward()``;
- ``chunked+entropy``: the same with ``extras=("entropy",)``, what every method pays in training (entropy is
  logged for every method);
- ``full``: ``log_softmax(hidden @ W.T)`` over the whole B x T x V tensor, gather, ``.sum().backward()``;
- ``trl-kernel+entropy``: TRL's own fused LM head with entropy (``harness.train.trl.bench_probes.trl_fused_log_probs``).

One fresh subprocess per (variant, length): it allocates the inputs (hidden states with grad, the LM head, the
targets), records its resident set size as the baseline, resets the kernel's peak-RSS mark (``VmHWM``, by writing
5 to /proc/self/clear_refs), runs one forward + backward, and reports the peak minus the baseline. ``ru_maxrss``
(which cannot be reset) is recorded as well; the two agree when nothing before the baseline peaked higher. The
weight gradient of the LM head (V x H x 4 bytes = 113 MB) is allocated in every variant.

Expected: ``full`` grows with T x V (4 bytes x V = 197 kB per position for each live B x T x V tensor), the chunked
variants with chunk_size x V (about 50 MB per live chunk tensor) plus the (T x H) hidden-state gradient, i.e. almost
flat in T.

Usage:  python -m bench.tokenstats_memory [--lengths 256,1024,4096] [--vocab 49152] [--hidden 576] [--chunk 256]
        [--results DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from bench.machine import Timer, environment
from bench.memory import child_env, current_rss_bytes, hwm_bytes, reset_peak_rss, ru_maxrss_bytes
from bench.publish import add_path_args, table, update_summary, write_result

VARIANTS = ("chunked", "chunked+entropy", "full", "trl-kernel+entropy")
MB = 1024 * 1024


def child(args) -> None:
    import torch

    from harness.train.token_statistics import token_statistics

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    B, T, H, V = args.rows, args.length, args.hidden, args.vocab
    hidden = (torch.randn(B, T, H) * 0.5).requires_grad_(True)
    lm_head = torch.nn.Linear(H, V, bias=False)
    targets = torch.randint(0, V, (B, T))
    # touch every page of the inputs so they count in the baseline
    hidden.data.add_(0.0)
    lm_head.weight.data.add_(0.0)

    def forward_backward(h, t):
        if args.variant == "full":
            logits = torch.nn.functional.linear(h, lm_head.weight).float()
            logp = torch.log_softmax(logits, dim=-1).gather(-1, t[..., None]).squeeze(-1)
        elif args.variant == "trl-kernel+entropy":  # TRL 1.16's fused LM head, what GRPOTrainer itself uses
            from harness.train.trl.bench_probes import trl_fused_log_probs

            logp = trl_fused_log_probs(h.reshape(-1, h.shape[-1]), lm_head.weight, t.reshape(-1), args.trl_vocab_chunk)
        else:
            extras = ("entropy",) if args.variant == "chunked+entropy" else ()
            logp = token_statistics(h, lm_head, t, extras, 1.0, args.chunk)["logp"]
        logp.sum().backward()

    # warm-up on 2 chunks' worth of positions: one-time allocations (autograd engine, BLAS buffers) happen here,
    # not in the measurement; the LM head's gradient is freed again, so the measured run allocates it like a step
    small = min(T, 2 * args.chunk)
    forward_backward(hidden[:, :small].detach().requires_grad_(True), targets[:, :small])
    lm_head.weight.grad = None
    baseline_rss, baseline_maxrss = current_rss_bytes(), ru_maxrss_bytes()
    reset_ok = reset_peak_rss()
    with Timer() as timer:
        forward_backward(hidden, targets)
    peak_hwm, peak_maxrss = hwm_bytes(), ru_maxrss_bytes()
    print(json.dumps({
        "variant": args.variant, "length": T, "rows": B, "vocab": V, "hidden": H, "chunk": args.chunk,
        "baseline_rss": baseline_rss, "peak_hwm": peak_hwm, "hwm_reset": reset_ok,
        "peak_above_baseline_hwm": (peak_hwm - baseline_rss) if reset_ok and peak_hwm and baseline_rss else None,
        "baseline_ru_maxrss": baseline_maxrss, "peak_ru_maxrss": peak_maxrss,
        "peak_above_baseline_ru_maxrss": peak_maxrss - baseline_maxrss,
        "wall_s": timer.wall, "cpu_s": timer.cpu, "threads": args.threads,
    }))


def run_child(variant: str, length: int, args) -> dict:
    cmd = [sys.executable, "-m", "bench.tokenstats_memory", "--child", "--variant", variant, "--length",
           str(length), "--rows", str(args.rows), "--vocab", str(args.vocab), "--hidden", str(args.hidden),
           "--chunk", str(args.chunk), "--threads", str(args.threads), "--trl-vocab-chunk", str(args.trl_vocab_chunk)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, env=child_env())
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="256,1024,4096")
    parser.add_argument("--rows", type=int, default=1, help="B: rows of completions (positions = B x T)")
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--chunk", type=int, default=256, help="train.stats_chunk_size")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2, help="subprocesses per (variant, length)")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--trl-vocab-chunk", type=int, default=8192,
                        help="trl-kernel: vocabulary columns per tile (TRL's trainer uses 32768; tile = 4096 x this)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--name", default="tokenstats_memory")
    add_path_args(parser, workdir=False)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return {}
    lengths = [int(x) for x in args.lengths.split(",") if x]
    variants = tuple(v for v in args.variants.split(",") if v)
    env = environment(args.cpu_free_flag)
    raw, started = [], time.perf_counter()
    for repeat in range(args.repeats):
        for length in lengths:
            order = variants if repeat % 2 == 0 else variants[::-1]  # interleaved
            for variant in order:
                result = run_child(variant, length, args)
                result["repeat"] = repeat
                raw.append(result)
                print(f"[bench] {variant:16s} T={length:5d}: peak above inputs "
                      f"{(result['peak_above_baseline_hwm'] or 0) / MB:8.1f} MB (VmHWM), "
                      f"{result['peak_above_baseline_ru_maxrss'] / MB:8.1f} MB (ru_maxrss), {result['wall_s']:.2f} s",
                      flush=True)
    record = analyse(raw, lengths, variants, args, env, time.perf_counter() - started)
    write_result(args.results, args.name, record)
    update_summary(args.results, args.name, summary_markdown(record))
    print(summary_markdown(record))
    return record


def _peak(r: dict) -> int:
    return r["peak_above_baseline_hwm"] if r["peak_above_baseline_hwm"] is not None else \
        r["peak_above_baseline_ru_maxrss"]


def analyse(raw: list[dict], lengths: list[int], variants, args, env: dict, elapsed: float) -> dict:
    rows = {}
    for variant in variants:
        for length in lengths:
            runs = [r for r in raw if r["variant"] == variant and r["length"] == length]
            peaks = sorted(_peak(r) for r in runs)
            rows[f"{variant}@{length}"] = {"variant": variant, "length": length,
                                           "peak_mb_median": peaks[len(peaks) // 2] / MB,
                                           "peak_mb_min": peaks[0] / MB, "peak_mb_max": peaks[-1] / MB,
                                           "wall_s_median": sorted(r["wall_s"] for r in runs)[len(runs) // 2]}
    growth = {}
    for variant in variants:  # marginal growth between the two longest completions (both past one chunk)
        first, last = rows[f"{variant}@{lengths[-2 if len(lengths) > 1 else 0]}"], rows[f"{variant}@{lengths[-1]}"]
        positions = max(1, (lengths[-1] - lengths[-2 if len(lengths) > 1 else 0]) * args.rows)
        growth[variant] = {"mb_per_1k_positions": (last["peak_mb_median"] - first["peak_mb_median"]) / positions
                           * 1000, "bytes_per_position": (last["peak_mb_median"] - first["peak_mb_median"]) * MB
                           / positions}
    logits_bytes_per_position = 4 * args.vocab
    chunk_logits_mb = args.chunk * args.vocab * 4 / MB
    # the chunked statistics "grow with chunk x vocab, not with length x vocab": their growth per position must stay
    # far below one float32 row of logits (4 V bytes); only O(H) per position (hidden-state gradient) is allowed
    met = all(growth[v]["bytes_per_position"] < 0.1 * logits_bytes_per_position
              for v in ("chunked", "chunked+entropy") if v in growth)
    return {"benchmark": "tokenstats_memory",
            "settings": {"lengths": lengths, "rows": args.rows, "vocab": args.vocab, "hidden": args.hidden,
                         "chunk": args.chunk, "threads": args.threads, "repeats": args.repeats,
                         "variants": list(variants), "trl_vocab_chunk": args.trl_vocab_chunk,
                         "measure": "VmHWM after clear_refs reset minus VmRSS after allocating inputs "
                                    "(ru_maxrss delta recorded too)"},
            "environment": env, "elapsed_s": elapsed, "table": rows, "growth": growth,
            "logits_bytes_per_position": logits_bytes_per_position, "chunk_logits_mb": chunk_logits_mb,
            "target": "chunked peak grows with chunk x vocab, not with length x vocab (marginal growth per "
                      "position between the two longest lengths < 10% of one float32 logits row)",
            "met": met, "raw": raw}


def summary_markdown(record: dict) -> str:
    s, t = record["settings"], record["table"]
    lines = ["## Token statistics memory", "",
             f"{record['environment']['date']}; V = {s['vocab']}, H = {s['hidden']}, B = {s['rows']} row(s), "
             f"chunk = {s['chunk']} positions, {s['threads']} threads; one subprocess per (variant, length), "
             f"{s['repeats']} repeats; peak RSS above the inputs during one forward + backward "
             "(VmHWM reset after allocating inputs).", ""]
    header = ["variant"] + [f"T = {n} (MB)" for n in s["lengths"]] + [
        f"growth per position ({s['lengths'][-2]} -> {s['lengths'][-1]})", "wall s at max T"]
    rows = []
    for variant in s["variants"]:
        cells = [variant]
        for n in s["lengths"]:
            r = t[f"{variant}@{n}"]
            cells.append(f"{r['peak_mb_median']:.0f} ({r['peak_mb_min']:.0f}-{r['peak_mb_max']:.0f})")
        g = record["growth"][variant]["bytes_per_position"]
        cells.append(f"{g / 1024:.1f} kB")
        longest = t[f"{variant}@{s['lengths'][-1]}"]
        cells.append(f"{longest['wall_s_median']:.2f}")
        rows.append(cells)
    lines.append(table(header, rows))
    lines += ["", f"One float32 logits row is {record['logits_bytes_per_position'] / 1024:.0f} kB per position; one "
              f"chunk of logits {record['chunk_logits_mb']:.0f} MB. Target ({record['target']}): "
              f"**{'met' if record['met'] else 'not met'}**."]
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1:])
