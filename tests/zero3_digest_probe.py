"""Run by tests/test_zero3_digests.py under torchrun (2 processes, DeepSpeed ZeRO-3 over gloo on CPU): each process
writes OUT/rank-<rank>.json (OUT: the first argument): the weight digest of the unsharded model and of the same model
once ZeRO-3 has partitioned it. A file, not stdout: the processes share the pipe, and a rank's line went missing
from it in CI."""

import copy
import json
import os
import sys
from pathlib import Path

import deepspeed
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from harness.train.budget import weights_sha256

deepspeed.init_distributed(dist_backend="gloo")
torch.manual_seed(0)
model = Qwen2ForCausalLM._from_config(Qwen2Config(
    vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, tie_word_embeddings=False), dtype=torch.float32)
unsharded = weights_sha256(copy.deepcopy(model))
config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "zero_allow_untested_optimizer": True,
          "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3), config=config)
parameters = list(engine.module.parameters())
rank = int(os.environ["RANK"])
Path(sys.argv[1], f"rank-{rank}.json").write_text(json.dumps({"rank": rank, "unsharded": unsharded,
                             "sharded": weights_sha256(engine.module),
                             "data_numel": sum(p.data.numel() for p in parameters),  # 0: what the old digest hashed
                             "partition_numel": sum(p.ds_tensor.numel() for p in parameters),
                             "full_numel": sum(p.ds_numel for p in parameters)}))
