"""The trainer factory bench/ and run_training share, and the run record of trained and released runs."""

import ast
import json

import torch

from harness.config.loading import load_method, resolve
from harness.config.paths import REPO_ROOT
from harness.config.provenance import run_record
from harness.data.prepare import training_rows


def test_bench_reads_no_trainer_private():
    """bench/ builds and steps trainers through harness functions (TRL stays in harness.train.trl:
    test_architecture)."""
    for path in sorted((REPO_ROOT / "bench").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                owner = node.value.attr if isinstance(node.value, ast.Attribute) else getattr(node.value, "id", "")
                assert "trainer" not in owner, f"{path.name}:{node.lineno}: {owner}.{node.attr}"


def test_build_trainer_is_the_run_and_steps_again_at_a_set_progress(tiny_sweep, tmp_path):
    from harness.train.run import build_trainer
    from harness.train.trl.bench_probes import PhaseProbe, sampling_settings, set_budget_progress, train_steps

    overrides, paths = tiny_sweep
    resolved = resolve({"name": "tiny", "preset": "tiny"}, [*overrides, "train.budget.amount=1000"])
    trainer = build_trainer(resolved, load_method("d3s"), 0, paths, tmp_path)
    # the run's prompts in the order of its seed, rendered by the preset's template
    assert trainer.train_dataset["answer"][:5] == [r["answer"] for r in training_rows(paths, 0)[:5]]
    generation, eos = sampling_settings(trainer)
    assert generation.max_new_tokens == 40 and trainer.processing_class.eos_token_id in eos
    probe = PhaseProbe(trainer)
    set_budget_progress(trainer, 0.5)
    assert trainer.step_context().progress == 0.5
    train_steps(trainer, 1, data_seed=1)
    train_steps(trainer, 1, data_seed=2)  # train() a second time reuses the optimizer (it used to fail here)
    assert trainer.ledger.steps == 500 + 2
    assert probe.seconds["generation"]["wall"] > 0 and probe.seconds["loss_forward"]["wall"] > 0
    assert len(probe.completion_lengths) == 8 and len(probe.rollouts_digest) == 12
    assert trainer.ledger.flops["train"] > 0 and trainer.ledger.samples == 16
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 1]  # a fresh step count per train_steps


def test_loss_inputs_drop_and_truncate_before_the_forward(tiny_sweep, tmp_path):
    from harness.train.run import build_trainer
    from harness.train.trl.bench_probes import loss_inputs

    overrides, paths = tiny_sweep
    resolved = resolve({"name": "tiny", "preset": "tiny"}, overrides)
    trainer = build_trainer(resolved, load_method("nat"), 0, paths, tmp_path)
    B, P, T = 4, 3, 6
    completion_mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] * 2 + [0] * 4, [1] * 5 + [0]])
    rollouts = {"prompt_ids": torch.randint(4, 20, (B, P)), "prompt_mask": torch.ones(B, P, dtype=torch.long),
                "completion_ids": torch.randint(4, 20, (B, T)) * completion_mask, "completion_mask": completion_mask,
                "rewards": torch.tensor([1.0, 0.0, 1.0, 0.0]), "group_ids": torch.tensor([0, 0, 1, 1])}
    inputs = loss_inputs(trainer, rollouts, trainer.step_context())
    kept = inputs.completion_mask
    assert kept.shape[0] == B and kept.shape[1] <= T and 0 < kept.sum() <= completion_mask.sum()
    assert (kept <= completion_mask[:, :kept.shape[1]]).all()  # NAT keeps a prefix of each completion
    loss = trainer.compute_loss(trainer.model, inputs)
    assert torch.isfinite(loss)


def test_run_record_of_a_trained_and_of_a_released_run(tiny_sweep):
    overrides, _ = tiny_sweep
    resolved = resolve({"name": "tiny", "preset": "tiny"}, overrides)
    spec = load_method("uniform")
    trained = run_record(resolved, spec, 1, 1, [], {"kind": "steps"}, {"samples": 8}, 2.5, resumed_from=None,
                         data_sha256={"train": "ab"})
    assert list(trained) == ["sweep", "method", "seed", "run_seed", "config", "config_yaml", "budget", "counters",
                             "resumed_from", "train_seconds", "provenance"]
    assert trained["provenance"]["data_sha256"] == {"train": "ab"} and trained["method"]["label"] == "uniform"
    released = run_record(resolved, spec, 0, 0, ["released"], {"kind": "released"}, {}, None,
                          external={"checkpoint": "org/model"})
    assert list(released) == ["sweep", "method", "seed", "run_seed", "config", "config_yaml", "external", "budget",
                              "counters", "train_seconds", "provenance"]
    assert "data_sha256" not in released["provenance"] and released["method"]["deviations"] == ["released"]
