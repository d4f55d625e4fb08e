"""DAPO dynamic sampling (train.dynamic_sampling): groups without signal never reach a trained mini-batch, every
generated group is in the budget, rounds are capped and logged, and bad configurations are refused."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from datasets import Dataset

from harness.config.schema import ConfigError, PresetConfig, load_method, resolve
from harness.model.checkpoints import load_policy
from harness.train.adapter import ROLLOUT_KEY_PREFIX, TargetedGRPOTrainer, grpo_config
from harness.train.budget import ModelShape
from harness.train.dynamic_sampling import GroupCollector, PromptStream, concat_rollouts, groups_with_signal
from harness.train.run import run_training
from methods.registry import get_method_class

SWEEPS = Path(__file__).resolve().parent.parent / "configs" / "sweeps"
# prompts whose answer is "mixed" get rewards 0, 1, 0, 1, ... over their rollouts (signal); the others all 0
PROMPTS = [{"prompt": f"Q: {i}+{i % 3}\n", "answer": "mixed" if i % 3 == 0 else "none"} for i in range(48)]


def mixed_reward(completions, answer, **kwargs):
    # the rollouts of a prompt are consecutive rows of a call (TRL's sampler), G even: a group of a "mixed"
    # prompt holds both values
    return [float(j % 2) if a == "mixed" else 0.0 for j, a in enumerate(answer)]


def make_trainer(model_dir, tmp_path, prompts=PROMPTS, method="uniform", **train):
    preset = PresetConfig(name="test")
    preset.train.prompts_per_step, preset.train.num_generations = 4, 2
    preset.train.max_completion_length = 6
    preset.train.budget.kind, preset.train.budget.amount = "samples", 1e9
    preset.train.dynamic_sampling.enabled = True
    for key, value in train.items():
        target = (
            preset.train.dynamic_sampling if key in ("prompts_per_round", "max_generation_rounds") else preset.train
        )
        setattr(target, key, value)
    model, tokenizer = load_policy(model_dir)
    trainer = TargetedGRPOTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=[mixed_reward],
        args=grpo_config(preset, tmp_path, seed=0),
        train_dataset=Dataset.from_list(prompts),
        method=get_method_class(method)(),
        preset=preset,
        run_seed=0,
    )
    return trainer


def record_trained_batches(trainer) -> list[dict]:
    seen, compute_loss = [], trainer._compute_loss

    def recording(model, inputs):
        seen.append({k: v.detach().clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)})
        return compute_loss(model, inputs)

    trainer._compute_loss = recording
    return seen


def record_rounds(trainer) -> list[dict]:
    rounds, generate = [], trainer._generate_round

    def recording(inputs):
        out = generate(inputs)
        rounds.append(
            {
                "answers": [x["answer"] for x in inputs],
                "prompt_mask": out[0]["prompt_mask"].clone(),
                "completion_mask": out[0]["completion_mask"].clone(),
            }
        )
        return out

    trainer._generate_round = recording
    return rounds


# --- the pure parts -----------------------------------------------------------------------------------------------


def test_groups_with_signal_compares_each_group_with_itself():
    scores = torch.tensor([0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.5, 0.5])
    assert groups_with_signal(scores, 2).tolist() == [False, True, False, False]
    assert groups_with_signal(scores, 4).tolist() == [True, True]


def test_prompt_stream_is_a_seeded_permutation_per_pass_and_its_cursor_is_its_state():
    stream = PromptStream(5, seed=3)
    first = stream.take(7)
    assert sorted(first[:5]) == list(range(5))  # one pass is a permutation
    assert stream.cursor == 7
    resumed = PromptStream(5, seed=3, cursor=7)  # what a checkpoint restores
    assert resumed.take(8) == stream.take(8)
    assert PromptStream(5, seed=3).take(15)[5:10] != PromptStream(5, seed=3).take(5)  # another order each pass
    assert PromptStream(5, seed=4).take(5) != PromptStream(5, seed=3).take(5)


def rollouts(groups: int, group_size: int, tag: int) -> dict:
    rows = groups * group_size
    return {
        "prompt_ids": torch.full((rows, 2), tag),
        "prompt_mask": torch.ones(rows, 2, dtype=torch.long),
        "completion_ids": torch.arange(rows)[:, None] + 100 * tag,
        "completion_mask": torch.ones(rows, 1),
    }


def test_collector_keeps_each_process_its_first_groups_with_signal_and_drops_the_surplus():
    # 2 processes, quota 2 groups each, groups of 2; round 1: process 0 has signal in groups 0 and 2, process 1 only
    # in group 1; round 2: process 0 in groups 0, 1 (surplus), process 1 in group 2
    collector = GroupCollector(quota=2, processes=2, process_index=1, group_size=2)
    round_1 = torch.tensor([0, 1, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0], dtype=torch.float)  # 3 groups per process
    collector.add_round(rollouts(3, 2, tag=1), torch.arange(6.0), round_1)
    assert not collector.full
    round_2 = torch.tensor([0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0], dtype=torch.float)
    collector.add_round(rollouts(3, 2, tag=2), torch.arange(6.0) + 10, round_2)
    assert collector.full
    assert collector.metrics() == {
        "groups_generated": 12,
        "groups_with_signal": 6,
        "groups_kept": 4,
        "groups_filled": 0,
        "rounds": 2,
        "rounds_exhausted": 0.0,
    }
    batch, rewards = collector.batch(pad_token_id=0)
    # process 1 keeps round 1's group 1 and round 2's group 2, in generation order
    assert batch["completion_ids"].flatten().tolist() == [102, 103, 204, 205]
    assert rewards.tolist() == [2.0, 3.0, 14.0, 15.0]


def test_collector_completes_the_step_with_zero_variance_groups_when_rounds_run_out():
    collector = GroupCollector(quota=3, processes=1, process_index=0, group_size=2)
    collector.add_round(rollouts(3, 2, tag=1), torch.zeros(6), torch.tensor([0, 0, 1, 0, 1, 1.0]))
    assert not collector.full
    metrics = collector.metrics()
    assert (metrics["groups_kept"], metrics["groups_filled"], metrics["rounds_exhausted"]) == (1, 2, 1.0)
    batch, _ = collector.batch(pad_token_id=0)
    assert batch["completion_ids"].flatten().tolist() == [100, 101, 102, 103, 104, 105]  # generation order


def test_concat_rollouts_pads_prompts_left_and_completions_right():
    a = {
        "prompt_ids": torch.tensor([[5, 6]]),
        "prompt_mask": torch.tensor([[1, 1]]),
        "completion_ids": torch.tensor([[7]]),
        "completion_mask": torch.tensor([[1]]),
    }
    b = {
        "prompt_ids": torch.tensor([[8]]),
        "prompt_mask": torch.tensor([[1]]),
        "completion_ids": torch.tensor([[9, 10, 11]]),
        "completion_mask": torch.tensor([[1, 1, 0]]),
    }
    out = concat_rollouts([a, b], pad_token_id=0)
    assert out["prompt_ids"].tolist() == [[5, 6], [0, 8]] and out["prompt_mask"].tolist() == [[1, 1], [0, 1]]
    assert out["completion_ids"].tolist() == [[7, 0, 0], [9, 10, 11]]
    assert out["completion_mask"].tolist() == [[1, 0, 0], [1, 1, 0]]


# --- the trainer ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "settings", [{"mini_batches": 2}, {"mini_batches": 2, "ppo_epochs": 2}, {"backward_chunk_rows": 3}]
)
def test_no_trained_mini_batch_holds_a_group_without_signal(tiny_model_dir, tmp_path, settings):
    trainer = make_trainer(tiny_model_dir, tmp_path, **settings)
    trainer.args.max_steps = 2 * settings.get("mini_batches", 1) * settings.get("ppo_epochs", 1)
    seen = record_trained_batches(trainer)
    trainer.train()
    assert len(seen) == trainer.args.max_steps
    for inputs in seen:
        rewards, groups = inputs[f"{ROLLOUT_KEY_PREFIX}rewards"], inputs[f"{ROLLOUT_KEY_PREFIX}group_ids"]
        for g in groups.unique():
            assert rewards[groups == g].std() > 0
        assert len(groups) == 4 * 2 // settings.get("mini_batches", 1)  # whole mini-batches of whole groups
    logged = [r for r in trainer.state.log_history if "dynamic_sampling/rounds" in r]
    assert len(logged) == 2  # once per generation batch
    for record in logged:
        assert record["dynamic_sampling/groups_kept"] == 4 and record["dynamic_sampling/rounds_exhausted"] == 0
        assert record["dynamic_sampling/groups_generated"] == 4 * record["dynamic_sampling/rounds"]


def test_every_generated_group_is_in_the_ledger_by_hand(tiny_model_dir, tmp_path):
    trainer = make_trainer(tiny_model_dir, tmp_path, prompts_per_round=6)
    rounds = record_rounds(trainer)
    trainer.model.train()
    trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    # round 1 = the sampler's 4 prompts + 2 from the stream, later rounds 6 from the stream (2 rollouts each), until
    # 4 groups have signal
    assert all(len(r["answers"]) == 12 for r in rounds)
    signal = [sum(a == "mixed" for a in r["answers"][::2]) for r in rounds]
    assert sum(signal[:-1]) < 4 <= sum(signal)
    assert trainer.prompt_stream.cursor == 2 + 6 * (len(rounds) - 1)
    tokenizer = trainer.processing_class
    vocab = len(tokenizer)
    # conftest's model: one layer, d = 32, MLP 64: q, k, v, o = 4 x 32 x 32, gate, up, down = 3 x 32 x 64
    assert trainer.model_shape == ModelShape(n_body=10240, n_head=vocab * 32, n_layers=1, d_model=32)
    expected, samples = 0.0, 0
    for r in rounds:
        for p, c in zip(r["prompt_mask"].sum(dim=1).tolist(), r["completion_mask"].sum(dim=1).tolist(), strict=True):
            n = p + c  # prefill + one position per generated token; logits for generated ones; causal pairs
            expected += 2 * 10240 * n + 2 * vocab * 32 * c + 4 * 1 * 32 * n * (n + 1) // 2
            samples += 1
    ledger = trainer.step_ledger
    assert ledger.flops["generation"] == pytest.approx(expected, rel=1e-12)
    assert ledger.samples == samples == 12 * len(rounds)  # every rollout generated, discarded ones too


def test_rounds_are_capped_and_the_step_says_so(tiny_model_dir, tmp_path, caplog):
    no_signal = [{**p, "answer": "none"} for p in PROMPTS]
    trainer = make_trainer(tiny_model_dir, tmp_path, prompts=no_signal, max_generation_rounds=3, mini_batches=2)
    trainer.args.max_steps = 2
    seen = record_trained_batches(trainer)
    with caplog.at_level("WARNING", logger="harness.train.adapter"):
        trainer.train()
    record = next(r for r in trainer.state.log_history if "dynamic_sampling/rounds" in r)
    assert record["dynamic_sampling/rounds"] == 3 and record["dynamic_sampling/rounds_exhausted"] == 1
    assert record["dynamic_sampling/groups_generated"] == 12 and record["dynamic_sampling/groups_filled"] == 4
    assert record["dynamic_sampling/groups_kept"] == 0
    assert "ran out of its 3 rounds with 0 of 4 groups with signal" in caplog.text
    assert [len(inputs["completion_ids"]) for inputs in seen] == [4, 4]  # the step keeps its size


def test_a_run_logs_dynamic_sampling_and_resumes_with_the_same_prompts(tiny_sweep, monkeypatch):
    from harness.train import callbacks as trainer_module

    overrides, paths = tiny_sweep
    settings = [
        *overrides,
        "train.dynamic_sampling.enabled=true",
        "train.dynamic_sampling.prompts_per_round=4",
        "train.dynamic_sampling.max_generation_rounds=2",
        "train.budget.kind=samples",
        "train.budget.amount=96",
        "train.budget.checkpoint_fractions=[1.0]",
        "train.save_every_steps=1",
    ]
    resolved = resolve({"name": "tiny", "preset": "tiny"}, settings)
    run_dir = paths.run_dir("uniform", 0)
    shutil.rmtree(run_dir, ignore_errors=True)
    full = run_training(resolved, load_method("uniform"), 0, paths)
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").open()]
    # every line a generation batch here: groups of 4 rollouts, all of them counted
    assert [m["budget/samples_total"] for m in lines] == list(
        torch.tensor([4 * m["dynamic_sampling/groups_generated"] for m in lines]).cumsum(0).tolist()
    )
    assert all(m["dynamic_sampling/groups_kept"] + m["dynamic_sampling/groups_filled"] == 2 for m in lines)
    assert full["budget"]["spent"] >= 96
    assert len(lines) >= 3 and all(m["dynamic_sampling/rounds"] > 1 for m in lines)  # every step draws the stream

    original = trainer_module.BudgetCallback.on_step_end

    def crash_at_step_2(self, args, state, control, **kwargs):
        if state.global_step == 2:
            raise KeyboardInterrupt("injected crash")
        return original(self, args, state, control, **kwargs)

    shutil.rmtree(run_dir)
    monkeypatch.setattr(trainer_module.BudgetCallback, "on_step_end", crash_at_step_2)
    with pytest.raises(KeyboardInterrupt):
        run_training(resolved, load_method("uniform"), 0, paths)
    monkeypatch.setattr(trainer_module.BudgetCallback, "on_step_end", original)
    assert json.loads((run_dir / "trl" / "checkpoint-1" / "harness_budget.json").read_text())[
        "prompt_stream_cursor"
    ] == 2 + 4 * (lines[0]["dynamic_sampling/rounds"] - 1)  # round 1: 2 from the sampler, 2 from the stream
    resumed = run_training(resolved, load_method("uniform"), 0, paths)
    assert resumed["resumed_from"] == "checkpoint-1"
    # the prompts drawn show in the prompt tokens, the rollouts in the generated tokens
    keys = (
        "step",
        "reward",
        "loss",
        "dynamic_sampling/groups_generated",
        "budget/samples_total",
        "tokens/prompt_total",
        "tokens/generated_total",
    )
    assert [{k: json.loads(x)[k] for k in keys} for x in (run_dir / "metrics.jsonl").open()] == [
        {k: m[k] for k in keys} for m in lines
    ]


# --- configuration ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["train.dynamic_sampling.enabled=true", "train.budget.kind=steps"],
            r"train.dynamic_sampling.enabled=true needs a budget that counts the generation of the groups it discards: "
            r"train.budget.kind must be one of \['flops', 'accel_seconds', 'tokens', 'samples'\], got 'steps'",
        ),
        (
            ["train.dynamic_sampling.enabled=true", "train.dynamic_sampling.prompts_per_round=8"],
            r"train.dynamic_sampling.prompts_per_round=8 must be 0 or at least train.prompts_per_step=16",
        ),
        (
            ["train.dynamic_sampling.max_generation_rounds=0"],
            r"key 'train.dynamic_sampling.max_generation_rounds': 0 is outside the allowed range",
        ),
        (
            ["train.dynamic_sampling.max_rounds=3"],
            r"key 'train.dynamic_sampling.max_rounds'.*"
            r"allowed keys here: enabled, max_generation_rounds, prompts_per_round",
        ),
        (["train.dynamic_sampling.enabled=maybe"], r"key 'train.dynamic_sampling.enabled'"),
    ],
)
def test_config_keys_are_checked(overrides, message):
    with pytest.raises(ConfigError, match=message):
        resolve({"name": "t", "preset": "tiny"}, overrides)


def test_off_by_default_and_the_trainer_refuses_a_budget_it_cannot_account(tiny_model_dir, tmp_path):
    default = resolve({"name": "t", "preset": "tiny"}).preset.train.dynamic_sampling
    assert (default.enabled, default.prompts_per_round, default.max_generation_rounds) == (False, 0, 10)
    with pytest.raises(ConfigError, match=r"train.budget.kind must be one of .*got 'steps'"):
        make_trainer(tiny_model_dir, tmp_path, budget=PresetConfig().train.budget)  # kind steps


def test_the_dapo_presets_sample_dynamically_with_the_papers_values():
    for sweep, prompts, round_prompts in (("paper-8020", 512, 1536), ("paper-ktae", 1024, 2048)):
        train = resolve(SWEEPS / f"{sweep}.yaml").preset.train
        config = train.dynamic_sampling
        assert train.prompts_per_step == prompts
        assert (config.enabled, config.prompts_per_round, config.max_generation_rounds) == (True, round_prompts, 10)
    assert not resolve(SWEEPS / "paper-ktae-grpo.yaml").preset.train.dynamic_sampling.enabled
