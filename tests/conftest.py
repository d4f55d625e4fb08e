"""Shared fixtures: a tiny random char-level Llama saved as a model directory."""

from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from harness.config import ModelConfig
    from harness.models import build_char_llama, build_char_tokenizer, save_policy

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("tiny_model")
    tokenizer = build_char_tokenizer()
    model = build_char_llama(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64),
                             tokenizer, seed=0)
    save_policy(model, tokenizer, out)
    return out
