"""Shared fixtures: a tiny random char-level Llama saved as a model directory, a tiny sweep, and the one way tests
build a ``TargetedGRPOTrainer`` (``build_grpo_trainer``)."""

import os
from pathlib import Path

from harness.config.kernels import PINNED_ENV

# the tiny preset's pinned CPU kernels, set before anything imports torch (torch reads them once)
os.environ.update(PINNED_ENV)

import pytest  # noqa: E402
import torch  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from harness.config.schema import ModelConfig
    from harness.model.char_llama import build_char_llama, build_char_tokenizer
    from harness.model.checkpoints import save_policy

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("tiny_model")
    tokenizer = build_char_tokenizer()
    model = build_char_llama(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64),
                             tokenizer, seed=0)
    save_policy(model, tokenizer, out)
    return out


@pytest.fixture(scope="session")
def tiny_sweep(tmp_path_factory):
    """A tiny preset sweep with its data and a 10-step warm start: (overrides, SweepPaths)."""
    from harness.config.loading import resolve
    from harness.config.paths import SweepPaths
    from harness.data.prepare import prepare_data
    from harness.model.warmstart import warmstart

    root = tmp_path_factory.mktemp("tiny_sweep")
    overrides = [f"results_dir={root}", "data.synthetic.n_train=300", "data.synthetic.n_eval=4",
                 "data.synthetic.n_ood=4", "warmstart.steps=10", "warmstart.batch_size=8",
                 "train.prompts_per_step=2", "train.num_generations=4", "train.max_completion_length=40",
                 # one optimizer step per generation batch: the step counts of these tests; the preset's two
                 # mini-batches run in the sweep integration test, mini-batch updates in test_minibatches.py
                 "train.budget.kind=steps", "train.mini_batches=1"]
    resolved = resolve({"name": "tiny", "preset": "tiny"}, overrides)
    paths = SweepPaths(resolved.results_dir)
    prepare_data(resolved, paths)
    warmstart(resolved, paths)
    return overrides, paths


def build_grpo_trainer(model_dir: Path, out_dir: Path, preset, prompts: list[dict], reward_funcs: list,
                       method="uniform", seed: int = 0):
    """A ``TargetedGRPOTrainer`` as a run builds it, on the policy of ``model_dir`` and the ``prompts`` rows
    (``prompt``, ``answer``): ``method`` a registered name or a ``Method``; TRL's output under ``out_dir``."""
    from datasets import Dataset

    from harness.model.checkpoints import load_policy
    from harness.train.trl.settings import grpo_config
    from harness.train.trl.trainer import TargetedGRPOTrainer
    from methods.registry import get_method_class

    model, tokenizer = load_policy(model_dir)
    return TargetedGRPOTrainer(model=model, processing_class=tokenizer, train_dataset=Dataset.from_list(prompts),
                               reward_funcs=reward_funcs, args=grpo_config(preset, out_dir, seed=seed),
                               method=get_method_class(method)() if isinstance(method, str) else method,
                               preset=preset, run_seed=seed)
