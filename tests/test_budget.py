"""Matched budgets: the FLOP model by hand, stop at budget, equal spend across methods, resume keeps the count."""

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM

from harness.config.loading import load_method, resolve
from harness.train.budget import BudgetLedger, ModelShape, causal_pairs, forward_flops, generation_flops
from harness.train.run import run_training


def tiny_llama(tie: bool = False) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=10, hidden_size=8, intermediate_size=16, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=tie)
    return LlamaForCausalLM(config)


def test_model_shape_counts_matmul_weights_by_hand():
    shape = ModelShape.of(tiny_llama())
    # per layer: q, k, v, o = 4 * 8 * 8 = 256; gate, up, down = 3 * 8 * 16 = 384 -> 640; two layers
    assert shape == ModelShape(n_body=1280, n_head=80, n_layers=2, d_model=8)
    assert ModelShape.of(tiny_llama(tie=True)).n_head == 80  # a tied head still multiplies


def test_forward_and_generation_flops_by_hand():
    shape = ModelShape(n_body=1280, n_head=80, n_layers=2, d_model=8)
    # 5 positions, logits at 2, causal pairs 1+2+3+4+5 = 15
    expected = 2 * 1280 * 5 + 2 * 80 * 2 + 4 * 2 * 8 * 15
    assert causal_pairs(5) == 15
    assert forward_flops(shape, 5, 2, 15) == expected == 14080
    # rollouts (prompt 3, completion 2) and (prompt 1, completion 4): 5 positions each, logits at 2 and at 4
    assert generation_flops(shape, [3, 1], [2, 4]) == expected + (2 * 1280 * 5 + 2 * 80 * 4 + 4 * 2 * 8 * 15)


def test_ledger_spend_by_kind():
    ledger = BudgetLedger(steps=3, samples=48, generated_tokens=100, prompt_tokens=40, forwarded_positions=300,
                          flops={"generation": 1.0, "reference": 0.5, "train": 2.0}, step_seconds=7.5)
    assert ledger.spent("steps") == 3 and ledger.spent("samples") == 48
    assert ledger.spent("tokens") == 440 and ledger.spent("flops") == 3.5 and ledger.spent("accel_seconds") == 7.5
    with pytest.raises(ValueError, match="joules"):
        ledger.spent("joules")


def train(tiny_sweep, label: str, *extra: str):
    overrides, paths = tiny_sweep
    resolved = resolve({"name": "tiny", "preset": "tiny"}, [*overrides, *extra])
    return run_training(resolved, load_method(label), 0, paths), paths


def step_flops(paths, label):
    lines = [json.loads(x) for x in (paths.run_dir(label, 0) / "metrics.jsonl").open()]
    totals = [0.0] + [m["budget/flops_total"] for m in lines]
    return [b - a for a, b in zip(totals, totals[1:], strict=False)]


def test_flops_budget_stops_within_one_step_and_nat_gets_more_steps(tiny_sweep):
    amount = 1.2e10
    records = {}
    for label in ("uniform", "nat"):
        record, paths = train(tiny_sweep, label, "train.budget.kind=flops", f"train.budget.amount={amount}",
                              "train.budget.checkpoint_fractions=[0.5,1.0]")
        spent, steps = record["budget"]["spent"], record["budget"]["spent_steps"]
        per_step = step_flops(paths, label)
        assert spent >= amount and spent - per_step[-1] < amount  # stopped at the first step reaching the budget
        assert len(per_step) == steps
        assert record["budget"]["clock"] == "process_time" and record["budget"]["ledger"]["step_seconds"] > 0
        assert record["budget"]["ledger"]["seconds"]["generation"] > 0 and record["budget"]["peak_memory_bytes"] > 0
        # the phases partition the steps (generation was counted twice before: issue #27)
        ledger = record["budget"]["ledger"]
        assert sum(ledger["seconds"].values()) == pytest.approx(ledger["step_seconds"], rel=1e-9)
        first_half = record["budget"]["checkpoint_spend"]["ckpt-050"]
        assert first_half["spent"] >= amount / 2 and first_half["spent"] - per_step[first_half["step"] - 1] < amount / 2
        records[label] = record
    # NAT's prefix cutting computes fewer training positions per step: more steps for the same FLOPs
    assert records["nat"]["budget"]["spent_steps"] > records["uniform"]["budget"]["spent_steps"]


def test_steps_budget_is_exact(tiny_sweep):
    record, _ = train(tiny_sweep, "uniform", "train.budget.amount=3", "train.budget.checkpoint_fractions=[1.0]")
    assert record["budget"]["spent_steps"] == 3 and record["budget"]["checkpoints"] == {"ckpt-100": 3}


def test_mini_batches_stop_and_save_at_the_end_of_a_generation_batch(tiny_sweep):
    # 2 mini-batches x 2 epochs = 4 optimizer steps per generation batch: a 5-step budget runs 2 batches (8 steps)
    record, paths = train(tiny_sweep, "entropy", "train.budget.amount=5", "train.budget.checkpoint_fractions=[0.5,1.0]",
                          "train.mini_batches=2", "train.ppo_epochs=2")
    assert record["budget"]["spent_steps"] == 8
    assert record["budget"]["checkpoints"] == {"ckpt-050": 4, "ckpt-100": 8}  # 2.5 steps -> the end of batch 1
    lines = [json.loads(x) for x in (paths.run_dir("entropy", 0) / "metrics.jsonl").open()]
    assert [m["step"] for m in lines] == list(range(1, 9))
    # the old-policy forward: once per generation batch, one no-grad forward (x1) over the rows that the epoch's
    # mini-batches then train on (x3); the mini-batches are trimmed to their own longest rows, so at most as wide
    old = [m["flops/old_logp_total"] for m in lines]
    assert old[0] > 0 and old[0] == old[3] and old[4] > old[3]
    assert old[0] >= lines[1]["flops/train_total"] / 3 * (1 - 1e-9)
    assert "rollouts/kept_frac" in lines[0] and "rollouts/kept_frac" not in lines[1]  # hooks once per batch


@pytest.mark.parametrize("mini_batches", [1, 2])
def test_a_resumed_run_continues_the_budget_and_matches_an_uninterrupted_one(tiny_sweep, monkeypatch, mini_batches):
    # 4 generation batches of `mini_batches` optimizer steps; trainer checkpoints at generation-batch ends (the
    # only place a run can resume with its own rollouts); the crash loses the first step of the third batch
    from harness.train import callbacks as trainer_module

    steps, crash_step = 4 * mini_batches, 2 * mini_batches + 1
    settings = (f"train.budget.amount={steps}", "train.budget.checkpoint_fractions=[0.5,1.0]",
                f"train.save_every_steps={mini_batches}", f"train.mini_batches={mini_batches}")
    full, paths = train(tiny_sweep, "uniform", *settings)
    full_metrics = (paths.run_dir("uniform", 0) / "metrics.jsonl").read_text().splitlines()
    full_weights = load_file(paths.run_dir("uniform", 0) / "ckpt-100" / "model.safetensors")

    original = trainer_module.BudgetCallback.on_step_end

    def crash_at_the_step(self, args, state, control, **kwargs):
        if state.global_step == crash_step:
            raise KeyboardInterrupt("injected crash")  # the checkpoint before it exists, this step is lost
        return original(self, args, state, control, **kwargs)

    import shutil

    shutil.rmtree(paths.run_dir("uniform", 0))
    monkeypatch.setattr(trainer_module.BudgetCallback, "on_step_end", crash_at_the_step)
    with pytest.raises(KeyboardInterrupt):
        train(tiny_sweep, "uniform", *settings)
    monkeypatch.setattr(trainer_module.BudgetCallback, "on_step_end", original)
    resumed, _ = train(tiny_sweep, "uniform", *settings)

    assert resumed["resumed_from"] == f"checkpoint-{crash_step - 1}"
    checkpoint = paths.run_dir("uniform", 0) / "trl" / f"checkpoint-{steps}"
    assert (checkpoint / "model.safetensors").is_file()
    from transformers.trainer_pt_utils import safe_globals  # numpy's RNG-state types, allow-listed by transformers

    with safe_globals():
        for state_file in checkpoint.glob("*.p*"):  # optimizer, scheduler, RNG: loadable without unpickling code
            torch.load(state_file, weights_only=True)
    assert resumed["budget"]["spent_steps"] == steps
    for key in ("flops", "samples", "generated_tokens", "forwarded_positions"):
        assert resumed["budget"]["ledger"][key] == full["budget"]["ledger"][key]
    resumed_metrics = (paths.run_dir("uniform", 0) / "metrics.jsonl").read_text().splitlines()
    keys = ("step", "reward", "loss", "completions/mean_length", "budget/flops_total")
    # rewards are logged on a generation batch's first step only
    assert [{k: json.loads(x).get(k) for k in keys} for x in resumed_metrics] == [
        {k: json.loads(x).get(k) for k in keys} for x in full_metrics]
    assert len(resumed_metrics) == steps
    resumed_weights = load_file(paths.run_dir("uniform", 0) / "ckpt-100" / "model.safetensors")
    assert resumed_weights.keys() == full_weights.keys()
    for name, tensor in full_weights.items():
        torch.testing.assert_close(resumed_weights[name], tensor)


@pytest.mark.parametrize("metrics_moved", [True, False])
def test_a_run_killed_after_its_last_step_resumes_to_the_same_end(tiny_sweep, metrics_moved):
    # found by tests/test_live_slurm.py: a job killed after its final trainer checkpoint but before run.json was
    # written trained one step more on resume, and lost the metrics already moved to metrics.jsonl
    import shutil

    settings = ("train.budget.amount=3", "train.budget.checkpoint_fractions=[1.0]", "train.save_every_steps=1")
    shutil.rmtree(tiny_sweep[1].run_dir("ktae", 0), ignore_errors=True)  # a fresh run for each case
    full, paths = train(tiny_sweep, "ktae", *settings)
    run_dir = paths.run_dir("ktae", 0)
    assert full["resumed_from"] is None
    full_metrics = (run_dir / "metrics.jsonl").read_text()
    full_weights = (run_dir / "ckpt-100" / "model.safetensors").read_bytes()
    (run_dir / "run.json").unlink()  # the kill: after checkpoint-3 and ckpt-100, before run.json
    if not metrics_moved:
        (run_dir / "metrics.jsonl").replace(run_dir / "metrics.jsonl.partial")
    resumed, _ = train(tiny_sweep, "ktae", *settings)
    assert resumed["resumed_from"] == "checkpoint-3"
    assert resumed["budget"]["spent_steps"] == full["budget"]["spent_steps"] == 3
    assert resumed["budget"]["ledger"] == full["budget"]["ledger"]
    assert (run_dir / "metrics.jsonl").read_text() == full_metrics
    assert (run_dir / "ckpt-100" / "model.safetensors").read_bytes() == full_weights


def test_a_partially_written_checkpoint_is_never_resumed(tmp_path):
    from harness.train.budget import LEDGER_FILE
    from harness.train.run import last_complete_checkpoint

    for step, key in ((2, "this"), (4, "this"), (6, None), (8, "other")):
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"...")
        if key:
            (folder / LEDGER_FILE).write_text(json.dumps({"run_key": key}))
    assert last_complete_checkpoint(tmp_path, "this") == str(tmp_path / "checkpoint-4")
    assert not (tmp_path / "checkpoint-6").exists() and not (tmp_path / "checkpoint-8").exists()
    assert last_complete_checkpoint(tmp_path / "absent", "this") is None


def test_rotation_keeps_the_newest_complete_checkpoints_and_never_a_torn_one_in_their_place(tmp_path):
    from harness.train.budget import LEDGER_FILE, rotate_checkpoints

    for step, complete in ((2, True), (4, True), (6, False), (8, True), (10, False)):
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        if complete:
            (folder / LEDGER_FILE).write_text("{}")
    rotate_checkpoints(tmp_path, keep=2)
    # 4 and 8 are the two newest complete ones; the torn 6 between them and the torn 10 after them stay (a resume
    # removes torn folders: last_complete_checkpoint), 2 goes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-10", "checkpoint-4", "checkpoint-6",
                                                            "checkpoint-8"]
    rotate_checkpoints(tmp_path, keep=5)  # fewer complete ones than kept: nothing removed
    assert len(list(tmp_path.iterdir())) == 4


def test_ledger_counters_round_trip_and_add():
    from harness.train.budget import BudgetLedger

    a = BudgetLedger(steps=2, samples=16, generated_tokens=300, weighted_tokens=40, step_seconds=1.5)
    a.flops["train"], a.seconds["generation"] = 3e9, 0.25
    total = BudgetLedger()
    total.add_counters([x + y for x, y in zip(a.counters(), a.counters(), strict=True)])  # two processes
    assert total.to_dict() == {**a.to_dict(), "steps": 4, "samples": 32, "generated_tokens": 600,
                               "weighted_tokens": 80, "step_seconds": 3.0,
                               "flops": {**a.flops, "train": 6e9}, "seconds": {**a.seconds, "generation": 0.5}}
    assert isinstance(total.samples, int)
