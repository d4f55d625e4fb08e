#!/usr/bin/env bash
# GPU smoke test: the rehearsal of paper-ktae on CUDA (harness/ops/rehearsal.py, `harness rehearse --mode cuda`):
# the paper sweep's own DAG, launch (accelerate, one process on one GPU), bf16 compute over float32 master weights,
# colocated vLLM rollouts, dynamic sampling, verl's loss micro-batches, the evaluation protocol with vLLM, the claims
# and fidelity table, and a resume after a kill; a randomly initialised 2-layer Qwen2 replaces the model (the path,
# not the model, is under test). Then the performance of each run: step time, rollout tokens/s, training MFU,
# peak memory. Exits non-zero when any job or check fails.
# Usage: scripts/gpu-smoke.sh [OUT_DIR]   (default results/gpu-smoke; needs the `gpu` extra: vLLM)
# PEAK_TFLOPS=<dense bf16 TFLOP/s of the GPU> overrides the table used for MFU.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
out=$(python -c 'import pathlib, sys; print(pathlib.Path(sys.argv[1]).resolve())' "${1:-results/gpu-smoke}")
start=$SECONDS

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("vllm") is None and "vllm is not installed: pip install -e .[gpu]")'

status=0
harness rehearse configs/sweeps/paper-ktae.yaml --mode cuda --out "$out" || status=$?

python - "$out/paper-ktae" <<'EOF'
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
print(f"\nGPU: {name}; peak {peak or '?'} TFLOP/s (bf16 dense; PEAK_TFLOPS overrides)")


def mfu(flops, seconds):
    return f"{100 * flops / seconds / (peak * 1e12):.3f}%" if peak and seconds > 0 else "?"


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
    print(f"{metrics.parent.parent.name}: {len(records)} steps; step {median(s['budget/accel_seconds_total'] for s in steps):.2f} s "
          f"(median); rollouts {tokens / gen_s if gen_s else float('nan'):.0f} tok/s; MFU train fwd+bwd "
          f"{mfu(last['flops/train_total'], last['seconds/train_total'])}, generation "
          f"{mfu(last['flops/generation_total'], gen_s)}; peak memory "
          f"{run['budget']['peak_memory_bytes'] / 2**30:.2f} GiB ({run['budget']['peak_memory_kind']}); "
          f"precision {run['precision']}")
EOF
echo "total: $((SECONDS - start)) s"
exit "$status"
