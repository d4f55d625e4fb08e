#!/usr/bin/env bash
# GPU smoke test of the cluster path on ONE GPU, in well under 8 minutes (SmolLM2-135M):
#   1. convert the smol preset's GGUF to a trainable checkpoint (`harness warmstart`),
#   2. 5 RL steps with vLLM colocated in the training process, for uniform and for entropy (a selection method),
#   3. evaluate the uniform checkpoint on the first 50 MATH-500 problems with vLLM (lm-eval),
#   4. print step times, rollout throughput and MFU (from metrics.jsonl and results.json).
# Usage: scripts/gpu-smoke.sh [OUT_DIR]   (default results/gpu-smoke; needs the `gpu` extra: vLLM)
# PEAK_TFLOPS=<dense bf16 TFLOP/s of the GPU> overrides the table used for MFU.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
out=$(python -c 'import pathlib, sys; print(pathlib.Path(sys.argv[1]).resolve())' "${1:-results/gpu-smoke}")
mkdir -p "$out"
sweep="$out/gpu-smoke.yaml"
start=$SECONDS

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("vllm") is None and "vllm is not installed: pip install -e .[gpu]")'

cat > "$sweep" <<EOF
# written by scripts/gpu-smoke.sh
name: gpu-smoke
preset: smol
results_dir: $out
methods: [uniform, entropy]
seeds: [0]
model: {dtype: bfloat16}
train:
  prompts_per_step: 8
  num_generations: 8
  max_completion_length: 256
  use_vllm: true
  vllm_mode: colocate
  vllm_gpu_memory_utilization: 0.3
  vllm_max_model_length: 1024
  budget: {kind: steps, amount: 5, checkpoint_fractions: [1.0]}
eval:
  backend: vllm
  k: 4
  max_gen_toks: 512
  greedy: false
  benchmarks:
    math500: {file: data/benchmarks/math500.jsonl, scorer: math_verify, limit: 50}
  vllm: {tensor_parallel_size: 1, data_parallel_size: 1, gpu_memory_utilization: 0.5, max_model_len: 1024}
resources:
  train: {gpus: 1}
  eval: {gpus: 1}
EOF

phase() {  # phase NAME COMMAND...: run, time, and show the log's tail on failure
  local name=$1 t0=$SECONDS log="$out/$1.log"
  shift
  echo "== $name"
  if ! "$@" > "$log" 2>&1; then
    tail -40 "$log"
    echo "FAILED: $name (log: $log)" >&2
    exit 1
  fi
  echo "   $name: $((SECONDS - t0)) s"
}

phase data harness data --sweep "$sweep"
phase warmstart harness warmstart --sweep "$sweep"
for method in uniform entropy; do
  phase "train-$method" harness train --sweep "$sweep" --method "$method" --seed 0
done
phase eval-math500 harness eval --sweep "$sweep" --label uniform --seed 0 --ckpt ckpt-100 --bench math500

python - "$out" <<'EOF'
import json
import os
import sys
from pathlib import Path

import torch

out = Path(sys.argv[1])
name = torch.cuda.get_device_name(0)
PEAK = {"H200": 989.4, "H100": 989.4, "GH200": 989.4, "A100": 312.0, "L40S": 362.1, "L4": 121.0, "A10": 125.0,
        "V100": 125.0}  # dense bf16/fp16 tensor-core TFLOP/s
peak = float(os.environ["PEAK_TFLOPS"]) if os.environ.get("PEAK_TFLOPS") else next(
    (v for k, v in PEAK.items() if k in name), None)
print(f"\nGPU: {name}; peak {peak or '?'} TFLOP/s (bf16 dense; PEAK_TFLOPS overrides)")


def mfu(flops, seconds):
    return f"{100 * flops / seconds / (peak * 1e12):.2f}%" if peak and seconds > 0 else "?"


for method in ("uniform", "entropy"):
    records = [json.loads(line) for line in (out / "gpu-smoke" / "runs" / method / "seed0" / "metrics.jsonl").open()]
    print(f"\n{method}: {len(records)} steps (analytic FLOPs of harness/train/budget.py over CUDA-event seconds)")
    print(f"  {'step':>4} {'step s':>7} {'gen s':>7} {'train s':>7} {'gen tok':>8} {'rollout tok/s':>13}")
    prev: dict = {}
    for rec in records:
        def delta(key, rec=rec, prev=prev):
            return rec.get(key, 0.0) - prev.get(key, 0.0)
        gen_s, tokens = delta("seconds/generation_total"), delta("tokens/generated_total")
        print(f"  {rec['step']:>4} {delta('budget/accel_seconds_total'):>7.2f} {gen_s:>7.2f} "
              f"{delta('seconds/train_total'):>7.2f} {tokens:>8.0f} {tokens / gen_s if gen_s else float('nan'):>13.0f}")
        prev = rec
    last = records[-1]
    print(f"  MFU: generation {mfu(last['flops/generation_total'], last['seconds/generation_total'])}, "
          f"train fwd+bwd {mfu(last['flops/train_total'], last['seconds/train_total'])}, "
          f"whole steps {mfu(last['budget/flops_total'], last['budget/accel_seconds_total'])}")

res = json.loads((out / "gpu-smoke" / "eval" / "uniform" / "seed0" / "ckpt-100" / "math500" / "results.json").read_text())
metrics, k = res["metrics"], res["k"]
generated = (metrics.get("mean_response_tokens") or 0) * res["n_problems"] * k
print(f"\neval math500: {res['n_problems']} problems x k={k} with {res['backend']}: avg@{k} = {metrics.get(f'avg@{k}')}, "
      f"generation {res['generate_s']} s (~{generated / max(res['generate_s'], 1e-9):.0f} tok/s), "
      f"elapsed {res['elapsed_s']} s")
EOF
echo "total: $((SECONDS - start)) s (target: under 480 s)"
