#!/usr/bin/env bash
# TRL's vLLM server mode inside one train job (train.use_vllm=true, train.vllm_mode=server): the job's last
# SERVER_GPUS GPUs run `trl vllm-serve` (tensor parallel over them), the other GPUs run the training command,
# which reaches the server on free ports exported as HARNESS_VLLM_SERVER_PORT / HARNESS_VLLM_GROUP_PORT (read by
# harness.train.adapter.vllm_settings). The Snakefile's train rule calls this (harness.ops.resources.train_command):
#
#   train-with-vllm-server.sh MODEL_DIR SERVER_GPUS GPU_MEMORY_UTILIZATION MAX_MODEL_LEN SERVER_LOG -- COMMAND...
#
# MODEL_DIR is the starting policy (the server loads it; TRL pushes the trained weights before each generation);
# MAX_MODEL_LEN 0 = the model's own context. The server stops when the command ends.
#
# The server authenticates no one and accepts new weights from whoever reaches it, so it listens on the loopback
# address only: HARNESS_VLLM_HOST (default 127.0.0.1) changes the address it binds, which the training command
# then connects to (docs/cluster-security.md: what loopback does not cover on a shared node, and what does).
set -euo pipefail
if [ $# -lt 7 ] || [ "$6" != "--" ]; then
  echo "usage: $0 MODEL_DIR SERVER_GPUS GPU_MEMORY_UTILIZATION MAX_MODEL_LEN SERVER_LOG -- COMMAND..." >&2
  exit 2
fi
model_dir=$1 server_gpus=$2 memory=$3 max_len=$4 server_log=$5
shift 6
host=${HARNESS_VLLM_HOST:-127.0.0.1}

# the GPUs of this job: SLURM (or the user) sets CUDA_VISIBLE_DEVICES; otherwise every GPU nvidia-smi lists
visible=${CUDA_VISIBLE_DEVICES:-$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd, -)}
IFS=, read -ra gpus <<< "$visible"
n_train=$(( ${#gpus[@]} - server_gpus ))
if (( server_gpus < 1 || n_train < 1 )); then
  echo "$0: ${#gpus[@]} GPU(s) visible ($visible): need $server_gpus for the vLLM server and at least 1 to train" >&2
  exit 2
fi
train_gpus=$(IFS=,; echo "${gpus[*]:0:n_train}")
serve_gpus=$(IFS=,; echo "${gpus[*]:n_train}")

read -r server_port group_port < <(python - <<'EOF'
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
EOF
)
# the trainer reaches a server bound to every address (0.0.0.0) through loopback
export HARNESS_VLLM_SERVER_PORT=$server_port HARNESS_VLLM_GROUP_PORT=$group_port
export HARNESS_VLLM_SERVER_HOST=$([ "$host" = 0.0.0.0 ] && echo 127.0.0.1 || echo "$host")

max_len_args=()
if [ "$max_len" != 0 ]; then max_len_args=(--max_model_len "$max_len"); fi
echo "vLLM server on GPU(s) $serve_gpus, $host port $server_port (weight sync port $group_port); training on GPU(s) $train_gpus" >&2
CUDA_VISIBLE_DEVICES=$serve_gpus trl vllm-serve --model "$model_dir" --tensor_parallel_size "$server_gpus" \
  --host "$host" --port "$server_port" --gpu_memory_utilization "$memory" "${max_len_args[@]}" \
  > "$server_log" 2>&1 &
server_pid=$!
trap 'kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true' EXIT

# TRL's client waits for the server (GRPOConfig.vllm_server_timeout) before the first generation
CUDA_VISIBLE_DEVICES=$train_gpus "$@"
