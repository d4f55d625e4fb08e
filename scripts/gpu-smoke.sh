#!/usr/bin/env bash
# GPU smoke test: the checks of the GPU path that no CPU run can make, one GPU job at a time, cheapest first. Each
# prints PASS, FAIL or skipped with its measurement; a summary table ends the output (also in OUT_DIR/gpu-smoke.log).
#   sbatch      `sbatch --test-only` of the generated flags: skipped (below: the flags exist only inside the SLURM
#               executor plugin's submission of a live Snakemake job).
#   two-gpu     the paper-ktae rehearsal on 2 GPUs: skipped (the rehearsal's cuda mode runs 1 process on 1 GPU).
#   real-shape  the first two updates of paper-ktae at real size (Qwen2.5-Math-1.5B's dimensions, random init, 16 rows
#               of 1024 + 3072 tokens, the preset's chunks and precision; bench/real_shape_step.py): peak
#               torch.cuda.max_memory_allocated against harness/config/memory.py's figure for the same run (`harness
#               plan`'s arithmetic); PASS when the plan does not under-estimate.
#   ktae        the rehearsal of paper-ktae on CUDA (harness/ops/rehearsal.py, `harness rehearse --mode cuda`): the
#               paper sweep's own DAG, launch (accelerate, one process on one GPU, DDP config), bf16 compute over
#               float32 master weights, colocated vLLM rollouts, dynamic sampling, verl's loss micro-batches, the
#               evaluation protocol with vLLM, the claims and fidelity table, and a resume after a kill; a randomly
#               initialised 2-layer Qwen2 replaces the model (the path, not the model, is under test). Then each
#               run's step time, rollout tokens/s, training MFU, peak memory.
#   zero3       the rehearsal of paper-nat on CUDA: DeepSpeed ZeRO-3 through accelerate on one GPU
#               (configs/accelerate/deepspeed_zero3.json; the rehearsal checks stage 3, float32 masters, gradient
#               accumulation and reduction; partitioning only with 2+ processes: at world size 1 DeepSpeed keeps
#               every parameter whole), a 2-layer Qwen3, the same performance lines.
# Only real-shape has run on a GPU (one H200, outside this script: results/bench/summary.md); the rest has not
# (docs/cluster.md). Exits non-zero when any check fails.
# Usage: scripts/gpu-smoke.sh [OUT_DIR [CHECK...]]   (default results/gpu-smoke, all checks in the order above;
#        the rehearsals need the `gpu` extra: vLLM)
# PEAK_TFLOPS=<dense bf16 TFLOP/s of the GPU> overrides the table used for MFU. CHECK_TIMEOUT_S (default 1200) and
# REAL_SHAPE_TIMEOUT_S (default 300) bound each check; a check past its bound is killed and FAILs.
set -uo pipefail  # no -e: a failing check is recorded and the next one still runs
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
out=$(python -c 'import pathlib, sys; print(pathlib.Path(sys.argv[1]).resolve())' "${1:-results/gpu-smoke}")
shift $(($# > 0 ? 1 : 0))
checks=("$@")
[ ${#checks[@]} -gt 0 ] || checks=(sbatch two-gpu real-shape ktae zero3)
mkdir -p "$out"
exec > >(tee -a "$out/gpu-smoke.log") 2>&1
start=$SECONDS
names=() results=() measurements=()

record() {  # name, PASS/FAIL/skipped, measurement
  names+=("$1") results+=("$2") measurements+=("$3")
  echo "== $1: $2: $3"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "nvidia-smi failed"

check_sbatch() {
  if ! command -v sbatch >/dev/null; then
    record sbatch skipped "no sbatch on this machine"
    return
  fi
  # snakemake_executor_plugin_slurm.submit_string.get_submit_command builds the flags from a live Snakemake job
  # (its resources, threads, log paths, run id); `snakemake -n --profile profiles/slurm` shows each job's resources
  # but runs no sbatch, and rebuilding the plugin's mapping here would test a copy, not the plugin
  record sbatch skipped "no stand-alone way to generate the plugin's sbatch flags (they are built inside its job submission)"
}

check_two_gpu() {
  local gpus
  gpus=$(python -c 'import torch; print(torch.cuda.device_count())')
  if [ "$gpus" -ge 2 ]; then
    record two-gpu skipped "needs the rehearsal's cuda mode with 2 processes ($gpus GPUs visible; harness rehearse --mode cuda runs 1 process)"
  else
    record two-gpu skipped "needs 2 GPUs ($gpus visible) and the rehearsal's cuda mode with 2 processes"
  fi
}

check_real_shape() {
  local log="$out/real-shape-step.log" rc line
  timeout --kill-after=30 "${REAL_SHAPE_TIMEOUT_S:-300}" python -m bench.real_shape_step \
    --sweep configs/sweeps/paper-ktae.yaml --device cuda --results "$out" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  line=$(grep '^verdict:' "$log" | tail -1)
  if [ "$rc" -eq 0 ] && [[ "$line" == "verdict: PASS"* ]]; then
    record real-shape PASS "${line#verdict: PASS }"
  elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    record real-shape FAIL "timed out after ${REAL_SHAPE_TIMEOUT_S:-300} s (log: $log)"
  else
    record real-shape FAIL "exit $rc: ${line:-no verdict (log: $log)}"
  fi
}

performance() {  # each run of a rehearsal: step time, rollout tokens/s, MFU, peak memory; last line: the summary
  python - "$1" <<'EOF'
import json
import os
import sys
from pathlib import Path
from statistics import median

import torch

root = Path(sys.argv[1])
name = torch.cuda.get_device_name(0)
PEAK = {"H200": 989.4, "H100": 989.4, "GH200": 989.4, "A100": 312.0, "L40S": 362.1, "L4": 121.0, "A10": 125.0,
        "V100": 125.0}  # dense bf16/fp16 tensor-core TFLOP/s
peak = float(os.environ["PEAK_TFLOPS"]) if os.environ.get("PEAK_TFLOPS") else next(
    (v for k, v in PEAK.items() if k in name), None)
print(f"GPU: {name}; peak {peak or '?'} TFLOP/s (bf16 dense; PEAK_TFLOPS overrides)")


def mfu(flops, seconds):
    return f"{100 * flops / seconds / (peak * 1e12):.3f}%" if peak and seconds > 0 else "?"


step_medians, peaks, engines = [], [], set()
for metrics in sorted(root.glob("runs/*/seed*/metrics.jsonl")):
    records = [json.loads(line) for line in metrics.open()]
    run = json.loads((metrics.parent / "run.json").read_text())
    steps, prev = [], {}
    for rec in records:
        steps.append({k: rec.get(k, 0.0) - prev.get(k, 0.0) for k in
                      ("budget/accel_seconds_total", "seconds/generation_total", "tokens/generated_total")})
        prev = rec
    last = records[-1]
    gen_s, tokens = last["seconds/generation_total"], last["tokens/generated_total"]
    step_medians.append(median(s["budget/accel_seconds_total"] for s in steps))
    peaks.append(run["budget"]["peak_memory_bytes"] / 2**30)
    precision = run["precision"]
    stage = (precision.get("deepspeed") or {}).get("zero_stage")
    engines.add(f"{precision.get('distributed')}{f' ZeRO-{stage}' if stage else ''}")
    print(f"{metrics.parent.parent.name}: {len(records)} steps; step {step_medians[-1]:.2f} s "
          f"(median); rollouts {tokens / gen_s if gen_s else float('nan'):.0f} tok/s; MFU train fwd+bwd "
          f"{mfu(last['flops/train_total'], last['seconds/train_total'])}, generation "
          f"{mfu(last['flops/generation_total'], gen_s)}; peak memory "
          f"{run['budget']['peak_memory_bytes'] / 2**30:.2f} GiB ({run['budget']['peak_memory_kind']}); "
          f"precision {run['precision']}")
if not peaks:
    sys.exit(f"no run's metrics under {root}")
print(f"summary: {len(peaks)} runs, median step {median(step_medians):.2f} s, peak memory up to {max(peaks):.2f} GiB, "
      f"engine {', '.join(sorted(engines))}")
EOF
}

check_rehearsal() {  # check name, sweep name
  local name=$1 sweep=$2 log="$out/rehearse-$2.log" began=$SECONDS rc summary
  if ! python -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("vllm") is None)'; then
    record "$name" FAIL "vllm is not installed: pip install -e .[gpu]"
    return
  fi
  timeout --kill-after=60 "${CHECK_TIMEOUT_S:-1200}" harness rehearse "configs/sweeps/$sweep.yaml" --mode cuda \
    --out "$out" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    record "$name" FAIL "timed out after ${CHECK_TIMEOUT_S:-1200} s (log: $log)"
    return
  fi
  summary=$(performance "$out/$sweep" | tee -a "$log" | tail -1)
  if [ "$rc" -eq 0 ] && [[ "$summary" == summary:* ]]; then
    record "$name" PASS "$((SECONDS - began)) s; ${summary#summary: }"
  else
    record "$name" FAIL "exit $rc after $((SECONDS - began)) s; ${summary:-no performance lines} (log: $log)"
  fi
}

for check in "${checks[@]}"; do
  case "$check" in
    sbatch) check_sbatch ;;
    two-gpu) check_two_gpu ;;
    real-shape) check_real_shape ;;
    ktae) check_rehearsal ktae paper-ktae ;;
    zero3) check_rehearsal zero3 paper-nat ;;
    *) record "$check" FAIL "unknown check (known: sbatch two-gpu real-shape ktae zero3)" ;;
  esac
done

echo
echo "summary ($((SECONDS - start)) s; log: $out/gpu-smoke.log)"
printf '%-11s %-8s %s\n' check result measurement
status=0
for i in "${!names[@]}"; do
  printf '%-11s %-8s %s\n' "${names[$i]}" "${results[$i]}" "${measurements[$i]}"
  [ "${results[$i]}" != FAIL ] || status=1
done
exit "$status"
