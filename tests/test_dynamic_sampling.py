"""DAPO dynamic sampling (train.dynamic_sampling): the groups trained are the first with signal over all processes
in generation order, split over the processes in equal contiguous shares; every round reads the one prompt stream;
groups without signal never reach a trained mini-batch, every generated group is in the budget, rounds are capped
and logged, and bad configurations are refused. (Two processes end to end: tests/test_distributed.py.)"""

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import build_grpo_trainer

from harness.config.loading import load_method, resolve
from harness.config.schema import ConfigError, PresetConfig
from harness.train.budget import ModelShape
from harness.train.dynamic_sampling import GroupCollector, PromptStream, concat_rollouts, groups_with_signal
from harness.train.run import run_training

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
    return build_grpo_trainer(model_dir, tmp_path, preset, prompts, [mixed_reward], method)


def record_trained_batches(trainer) -> list:
    seen, policy_loss = [], trainer.actor.policy_loss

    def recording(model, inputs, ctx):
        seen.append(inputs)  # a StepBatch: its tensors are not changed in place
        return policy_loss(model, inputs, ctx)

    trainer.actor.policy_loss = recording
    return seen


def record_rounds(trainer) -> list[dict]:
    rounds, generate = [], trainer._generate_round

    def recording(inputs):
        out = generate(inputs)
        rounds.append(
            {
                "prompts": [x["prompt"] for x in inputs],
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


def test_prompt_stream_reads_whole_rounds_of_one_seeded_permutation_per_pass():
    stream = PromptStream(10, seed=3)
    rounds = [stream.take(4) for _ in range(5)]  # a pass holds 2 rounds of 4; its last 2 prompts are skipped
    assert stream.cursor == 24 and stream.passes == 2.4
    for first, second in ((rounds[0], rounds[1]), (rounds[2], rounds[3])):
        assert len(set(first + second)) == 8  # no prompt twice within a pass
    assert rounds[0] + rounds[1] != rounds[2] + rounds[3]  # another order each pass
    assert PromptStream(10, seed=4).take(4) != PromptStream(10, seed=3).take(4)
    whole = PromptStream(10, seed=3)
    assert sorted(whole.take(10)) == list(range(10)) and sorted(whole.take(10)) == list(range(10))
    with pytest.raises(ValueError, match="a round of 11 prompts exceeds the 10 training prompts"):
        whole.take(11)


def test_prompt_stream_resumes_from_its_cursor():
    stream = PromptStream(10, seed=3)
    for _ in range(3):
        stream.take(4)
    resumed = PromptStream(10, seed=3, cursor=stream.cursor)  # what a checkpoint restores
    assert [resumed.take(4) for _ in range(4)] == [stream.take(4) for _ in range(4)]


def tags(round_index: int, process: int, group: int, group_size: int) -> list[int]:
    """The token that identifies each rollout of a group in ``process_rollouts``."""
    return [1000 * round_index + 100 * process + group * group_size + j for j in range(group_size)]


def process_rollouts(round_index: int, process: int, groups: int, group_size: int) -> dict:
    """One process's rows of a round, as TRL returns them: prompts left-padded to 3 columns (the first all padding),
    completions right-padded to 4 (the last two all padding); token 0 is the pad."""
    ids = torch.tensor([t for g in range(groups) for t in tags(round_index, process, g, group_size)])
    rows = len(ids)
    return {
        "prompt_ids": torch.stack([torch.zeros(rows, dtype=torch.long), ids % 7 + 1, ids], dim=1),
        "prompt_mask": torch.tensor([[0, 1, 1]] * rows),
        "completion_ids": torch.stack([ids, ids, torch.zeros_like(ids), torch.zeros_like(ids)], dim=1),
        "completion_mask": torch.tensor([[1, 1, 0, 0]] * rows),
    }


def sample_on_processes(signal: list[list[list[int]]], groups_per_step: int, group_size: int = 2,
                        max_rounds: int = 10):
    """Dynamic sampling on len(signal[0]) simulated processes: ``signal[r][p][g]`` = 1 when group g of process p
    has signal in round r (scores 0, 1, 0, ... else all 0). Rounds stop as the trainer stops them; the exchange
    hands each process what the others' ``outgoing`` hold for it. -> (collectors, [(rollouts, rewards)] per process)."""
    processes = len(signal[0])
    collectors = [GroupCollector(groups_per_step, processes, p, group_size, pad_token_id=0) for p in range(processes)]
    for r, round_signal in enumerate(signal[:max_rounds]):
        scores_all = torch.tensor([float(j % 2) * s for groups in round_signal for s in groups
                                   for j in range(group_size)])
        rewards_all = 1000.0 * r + torch.arange(len(scores_all), dtype=torch.float)
        for p, collector in enumerate(collectors):
            collector.add_round(process_rollouts(r, p, len(round_signal[p]), group_size), rewards_all, scores_all)
        assert len({c.full for c in collectors}) == 1  # every process takes the same decision
        if collectors[0].full:
            break
    outgoing = [c.outgoing() for c in collectors]
    results = []
    for q, collector in enumerate(collectors):
        assert collector.sources() == [p for p in range(processes) if q in outgoing[p]]
        results.append(collector.batch({k: v for p in collector.sources() for k, v in outgoing[p][q].items()}))
    return collectors, results


def trained_tags(result) -> list[int]:
    return result[0]["completion_ids"][:, 0].tolist()


def test_acceptance_counts_the_groups_with_signal_of_all_processes():
    # 2 processes, 4 groups per step, 3 groups per process per round. Round 1: process 0 has signal in all 3 groups,
    # process 1 in none; round 2: process 1 in group 1 only. Over both processes 3 + 1 = 4 groups: two rounds. (A
    # quota of 2 per process would have needed a third round for process 1.)
    collectors, results = sample_on_processes(
        [[[1, 1, 1], [0, 0, 0]], [[0, 0, 0], [0, 1, 0]], [[1, 1, 1], [1, 1, 1]]], groups_per_step=4)
    assert collectors[0].rounds == 2
    chosen = [(0, 0, 0), (0, 0, 1), (0, 0, 2), (1, 1, 1)]  # (round, process, group): the first 4 with signal
    assert all(c.chosen() == chosen for c in collectors)
    assert collectors[0].assigned(0) == chosen[:2] and collectors[0].assigned(1) == chosen[2:]
    # process 0 trains its own groups 0 and 1; process 1 its round-2 group 1 and group 2 of process 0's round 1
    assert trained_tags(results[0]) == tags(0, 0, 0, 2) + tags(0, 0, 1, 2)
    assert trained_tags(results[1]) == tags(0, 0, 2, 2) + tags(1, 1, 1, 2)
    assert results[1][1].tolist() == [4.0, 5.0, 1008.0, 1009.0]  # summed rewards from the gather, not moved
    assert collectors[1].metrics() == {
        "groups_generated": 12,
        "groups_with_signal": 4,
        "groups_kept": 4,
        "groups_filled": 0,
        "groups_moved": 1,
        "rounds": 2,
        "rounds_exhausted": 0.0,
    }


def test_the_surplus_of_the_last_round_is_discarded_and_every_process_trains_the_same_count():
    # 3 processes, 6 groups per step (2 each), 2 groups per process and round; round 1: 3 with signal, round 2: 4
    collectors, results = sample_on_processes(
        [[[0, 1], [1, 0], [0, 1]], [[1, 1], [0, 1], [1, 0]]], groups_per_step=6)
    assert collectors[0].chosen() == [(0, 0, 1), (0, 1, 0), (0, 2, 1), (1, 0, 0), (1, 0, 1), (1, 1, 1)]
    assert [len(trained_tags(r)) for r in results] == [4, 4, 4]  # 2 groups of 2 rollouts each
    assert trained_tags(results[2]) == tags(1, 0, 1, 2) + tags(1, 1, 1, 2)
    metrics = collectors[0].metrics()
    assert (metrics["groups_with_signal"], metrics["groups_kept"], metrics["groups_moved"]) == (7, 6, 5)


def test_moved_groups_arrive_whole_and_compact():
    collectors, results = sample_on_processes([[[1, 1], [0, 0]]], groups_per_step=2)
    (rollouts, _), original = results[1], process_rollouts(0, 0, 2, 2)
    assert trained_tags(results[1]) == tags(0, 0, 1, 2)  # process 0's group 1, sent to process 1
    # the padding columns every row of the group shares are not sent: prompts 2 columns, completions 2
    sent = collectors[0].outgoing()[1][(0, 0, 1)]
    assert sent["completion_ids"].dtype == torch.int32 and sent["completion_mask"].dtype == torch.bool
    assert rollouts["prompt_ids"].tolist() == original["prompt_ids"][2:, 1:].tolist()
    assert rollouts["completion_ids"].tolist() == original["completion_ids"][2:, :2].tolist()
    assert {k: v.dtype for k, v in rollouts.items()} == {k: v.dtype for k, v in original.items()}


def test_rounds_exhausted_completes_the_step_with_the_first_zero_variance_groups():
    collectors, results = sample_on_processes(
        [[[0, 0], [0, 1]], [[1, 0], [0, 0]]], groups_per_step=4, max_rounds=2)
    assert not collectors[0].full and collectors[0].rounds == 2
    # the 2 with signal, (0, 1, 1) and (1, 0, 0), and the first 2 without, (0, 0, 0) and (0, 0, 1), in order
    assert collectors[0].chosen() == [(0, 0, 0), (0, 0, 1), (0, 1, 1), (1, 0, 0)]
    metrics = collectors[1].metrics()
    assert (metrics["groups_kept"], metrics["groups_filled"], metrics["rounds_exhausted"]) == (2, 2, 1.0)
    assert trained_tags(results[1]) == tags(0, 1, 1, 2) + tags(1, 0, 0, 2)


def test_one_process_trains_its_first_groups_with_signal():
    collectors, results = sample_on_processes([[[0, 1, 1]], [[1, 0, 1]]], groups_per_step=3)
    assert collectors[0].rounds == 2 and collectors[0].outgoing() == {} and collectors[0].sources() == []
    assert trained_tags(results[0]) == tags(0, 0, 1, 2) + tags(0, 0, 2, 2) + tags(1, 0, 0, 2)
    assert collectors[0].metrics()["groups_moved"] == 0


def test_a_process_holds_only_groups_it_may_train():
    # 2 groups per step: the first 2 with signal and the first 2 without (fillers) are candidates, all on process 0
    collectors, results = sample_on_processes([[[1, 1, 0, 0], [1, 1, 0, 0]]], groups_per_step=2)
    assert sorted(collectors[0]._held) == [(0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 0, 3)]
    assert collectors[1]._held == {}
    assert trained_tags(results[1]) == tags(0, 0, 1, 2)


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
        rewards, groups = inputs.rewards, inputs.group_ids
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
    # every round is the next 6 prompts of the stream (2 rollouts each; the sampler's batch is not generated),
    # until 4 groups have signal
    stream = PromptStream(len(PROMPTS), seed=0)
    assert [r["prompts"][::2] for r in rounds] == [[PROMPTS[i]["prompt"] for i in stream.take(6)] for _ in rounds]
    signal = [sum(a == "mixed" for a in r["answers"][::2]) for r in rounds]
    assert sum(signal[:-1]) < 4 <= sum(signal)
    assert trainer.prompt_stream.cursor == 6 * len(rounds)
    tokenizer = trainer.processing_class
    vocab = len(tokenizer)
    # conftest's model: one layer, d = 32, MLP 64: q, k, v, o = 4 x 32 x 32, gate, up, down = 3 x 32 x 64
    assert trainer.accounting.model_shape == ModelShape(n_body=10240, n_head=vocab * 32, n_layers=1, d_model=32)
    expected, samples = 0.0, 0
    for r in rounds:
        for p, c in zip(r["prompt_mask"].sum(dim=1).tolist(), r["completion_mask"].sum(dim=1).tolist(), strict=True):
            n = p + c  # prefill + one position per generated token; logits for generated ones; causal pairs
            expected += 2 * 10240 * n + 2 * vocab * 32 * c + 4 * 1 * 32 * n * (n + 1) // 2
            samples += 1
    ledger = trainer.accounting.step_ledger
    assert ledger.flops["generation"] == pytest.approx(expected, rel=1e-12)
    assert ledger.samples == samples == 12 * len(rounds)  # every rollout generated, discarded ones too


def test_rounds_are_capped_and_the_step_says_so(tiny_model_dir, tmp_path, caplog):
    no_signal = [{**p, "answer": "none"} for p in PROMPTS]
    trainer = make_trainer(tiny_model_dir, tmp_path, prompts=no_signal, max_generation_rounds=3, mini_batches=2)
    trainer.args.max_steps = 2
    seen = record_trained_batches(trainer)
    with caplog.at_level("WARNING", logger="harness.train.trl.trainer"):
        trainer.train()
    record = next(r for r in trainer.state.log_history if "dynamic_sampling/rounds" in r)
    assert record["dynamic_sampling/rounds"] == 3 and record["dynamic_sampling/rounds_exhausted"] == 1
    assert record["dynamic_sampling/groups_generated"] == 12 and record["dynamic_sampling/groups_filled"] == 4
    assert record["dynamic_sampling/groups_kept"] == 0
    assert "ran out of its 3 rounds with 0 of 4 groups with signal" in caplog.text
    assert [len(inputs.completion_ids) for inputs in seen] == [4, 4]  # the step keeps its size


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
    assert len(lines) >= 3

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
    ] == 4 * lines[0]["dynamic_sampling/rounds"]  # every round: 4 prompts of the stream
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
