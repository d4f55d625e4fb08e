"""Mini-batch PPO updates (train.mini_batches, train.ppo_epochs): TRL's GRPOTrainer is the oracle for the loss and
gradient of every optimizer step; whole prompt groups per mini-batch; the old-policy forward counted once."""

import pytest
import torch
import trl
from conftest import build_grpo_trainer
from datasets import Dataset

from harness.config.launch import per_device_rollouts
from harness.config.loading import resolve
from harness.config.schema import ConfigError, PresetConfig, TrainConfig
from harness.model.checkpoints import load_policy
from harness.train.row_chunks import split_by_prompt_groups
from harness.train.step_batch import StepBatch
from harness.train.trl.settings import grpo_config
from harness.train.trl.trainer import TargetedGRPOTrainer
from methods.registry import get_method_class

PROMPTS = [{"prompt": f"Q: {i}+{i % 3}\n", "answer": str(i)} for i in range(32)]


def length_reward(completions, **kwargs):
    """A reward that separates rollouts of one prompt (any deterministic function of the text would do)."""
    return [float(sum(map(ord, c)) % 7) for c in completions]


def tiny_preset(**train):
    preset = PresetConfig(name="test")
    preset.train.prompts_per_step, preset.train.num_generations = 4, 2
    preset.train.max_completion_length = 6
    preset.train.scale_rewards = "none"  # TRL divides by std + 1e-4, the harness by std + 1e-6: compare without
    # large enough that later mini-batches see ratios outside the clip range; at 3e-2 most tokens clip and the few
    # left make the gradient (and its float32 noise) of the last steps of two epochs sensitive at 1e-5
    preset.train.learning_rate = 2e-2
    preset.train.budget.kind, preset.train.budget.amount = "steps", 4
    for key, value in train.items():
        setattr(preset.train, key, value)
    return preset


def trl_args(preset, tmp_path, loss_type, full_length):
    args = grpo_config(preset, tmp_path, seed=0)
    args.loss_type, args.scale_rewards = loss_type, "none"
    if full_length:  # no EOS before max_completion_length: every mini-batch holds the same number of tokens
        args.generation_kwargs = {"min_new_tokens": preset.train.max_completion_length}
    return args


def record_loss_inputs(trainer) -> list:
    """The inputs of every optimizer step's loss, appended to the returned list as the trainer trains."""
    seen, policy_loss = [], trainer.actor.policy_loss

    def recording(model, inputs, ctx):
        seen.append(inputs)
        return policy_loss(model, inputs, ctx)

    trainer.actor.policy_loss = recording
    return seen


def run(trainer):
    """Trains; returns the rollouts of each generation and the log record of each optimizer step."""
    rollouts, generate = [], trainer._generate_and_score_completions

    def recording(inputs):
        out = generate(inputs)
        ids = out["completion_ids"] if isinstance(out, dict) else out.completion_ids  # TRL's dict; a StepBatch
        rollouts.append(ids.clone())
        return out

    trainer._generate_and_score_completions = recording
    trainer.train()
    return rollouts, [r for r in trainer.state.log_history if "loss" in r]


@pytest.mark.parametrize("loss_type, full_length, ppo_epochs", [("dapo", True, 1), ("bnpo", False, 1),
                                                                 ("dapo", True, 2)])
def test_minibatch_steps_match_trl(tiny_model_dir, tmp_path, monkeypatch, loss_type, full_length, ppo_epochs):
    # TRL's "dapo" divides each mini-batch by the generation batch's tokens / k, the harness's token-mean by the
    # mini-batch's own tokens: equal when all completions have the same length. "bnpo" divides by the mini-batch's
    # own tokens, as the harness does, at any lengths.
    preset = tiny_preset(mini_batches=2, ppo_epochs=ppo_epochs)
    preset.train.budget.amount = 4 * ppo_epochs  # two generation batches
    # TRL shuffles the generation batch by rows before splitting it; the harness keeps whole groups in generation
    # order. Without the shuffle TRL's equal row slices are the same whole groups (no rollout is dropped here).
    monkeypatch.setattr(trl.trainer.grpo_trainer, "shuffle_sequence_dict", lambda batch: batch)

    model, tokenizer = load_policy(tiny_model_dir)
    oracle = trl.GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=[length_reward],
                             args=trl_args(preset, tmp_path / "trl", loss_type, full_length),
                             train_dataset=Dataset.from_list(PROMPTS))
    trl_rollouts, trl_logs = run(oracle)

    model, tokenizer = load_policy(tiny_model_dir)
    ours = TargetedGRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=[length_reward],
                               args=trl_args(preset, tmp_path / "ours", loss_type, full_length),
                               train_dataset=Dataset.from_list(PROMPTS), method=get_method_class("uniform")(),
                               preset=preset, run_seed=0)
    our_rollouts, our_logs = run(ours)

    assert len(trl_rollouts) == len(our_rollouts) == 2  # generation batches
    for a, b in zip(trl_rollouts, our_rollouts, strict=True):
        assert torch.equal(a, b)
    assert len(trl_logs) == len(our_logs) == 4 * ppo_epochs  # optimizer steps
    for theirs, mine in zip(trl_logs, our_logs, strict=True):
        # the loss is a mean of terms A r with |A| up to 6 that largely cancel (A sums to 0 in a group), r from two
        # implementations' float32 log-probs (~1e-7 apart): an absolute floor for losses near 0
        assert mine["loss"] == pytest.approx(theirs["loss"], rel=1e-5, abs=3e-7)
        assert mine["grad_norm"] == pytest.approx(theirs["grad_norm"], rel=1e-5)
        for name in ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"):
            assert mine[name] == pytest.approx(theirs[name], abs=1e-6)
    # the first step of each generation batch is on-policy (r = 1); later ones are not, and some tokens clip
    assert our_logs[0]["clip_ratio/region_mean"] == 0.0
    assert max(r["clip_ratio/region_mean"] for r in our_logs) > 0


def test_trl_runs_no_forward_of_its_own(tiny_model_dir, tmp_path, monkeypatch):
    # TRL 1.16 would compute old log-probs itself (full logits, the unreduced batch) with steps_per_generation > 1
    def refuse(*args, **kwargs):
        raise AssertionError("TRL ran a log-prob forward of its own")

    monkeypatch.setattr(trl.GRPOTrainer, "_get_per_token_logps_and_entropies", refuse)
    preset = tiny_preset(mini_batches=2, ppo_epochs=2)
    trainer = build_grpo_trainer(tiny_model_dir, tmp_path, preset, PROMPTS, [length_reward])
    assert trainer.args.steps_per_generation == 2 and trainer.num_iterations == 2
    trainer.model.train()
    batches = [trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))]
    batches.append(trainer._prepare_inputs(None))  # the schedule's next mini-batch, no generation
    # the rollout policy's log-probs, once, over the whole reduced batch: the old_logp phase of the ledger
    ledger = trainer.accounting.step_ledger
    assert ledger.flops["old_logp"] > 0 and ledger.flops["train"] == 0
    assert trainer.args.steps_per_generation == 2 and trainer.num_iterations == 2  # restored after generation
    for batch in batches:
        groups = batch.group_ids
        assert batch.old_logp.shape == batch.completion_ids.shape
        assert groups.tolist() == sorted(groups.tolist()) and len(groups) == 4  # whole groups, generation order
    assert set(batches[0].group_ids.tolist()) == {0, 1}
    assert set(batches[1].group_ids.tolist()) == {2, 3}


def test_split_by_prompt_groups_keeps_groups_whole_and_in_order():
    # 4 groups of a process, rollouts of group 1 partly dropped and group 2 entirely (D3S-style)
    group_index = torch.tensor([0, 0, 1, 3, 3, 3])
    ids = torch.arange(12).reshape(6, 2)
    rows = torch.arange(6).float()
    batch = StepBatch(ids, torch.ones_like(ids), ids, torch.ones_like(ids), advantages=rows[:, None] * ids,
                      rewards=rows, group_ids=group_index, rollout_advantages=rows, extras={"sample": rows},
                      old_logp=None, ref_logp=-ids.float())
    first, second = split_by_prompt_groups(batch, group_index, groups=4, parts=2)
    assert first.rewards.tolist() == [0, 1, 2] and second.rewards.tolist() == [3, 4, 5]
    for field in ("completion_ids", "prompt_mask", "advantages", "rollout_advantages", "group_ids", "ref_logp"):
        assert torch.equal(getattr(second, field), getattr(batch, field)[3:]), field  # every per-row field alike
    assert second.extras["sample"].tolist() == [3, 4, 5] and second.old_logp is None
    with pytest.raises(ValueError, match="do not divide"):
        split_by_prompt_groups(batch, group_index, groups=4, parts=3)


def test_mini_batches_must_divide_the_prompt_groups_of_a_process():
    with pytest.raises(ValueError, match=r"train.mini_batches=3 must divide the 4 prompt groups"):
        per_device_rollouts(tiny_preset(mini_batches=3).train, 1)
    assert per_device_rollouts(tiny_preset(mini_batches=4).train, 1) == 8


@pytest.mark.parametrize("overrides, message", [
    (["train.mini_batches=3"], "train.mini_batches=3 must divide the 16 prompt groups"),
    (["train.mini_batches=0"], "key 'train.mini_batches': 0 is outside the allowed range"),
    (["train.ppo_epochs=0"], "key 'train.ppo_epochs': 0 is outside the allowed range"),
    (["train.clip_ratio_c=1.0"], r"train.clip_ratio_c=1.0 must be > 1"),
    (["train.kl_estimator=k2"], r"key 'train.kl_estimator': 'k2' is not one of \['k1', 'k3', 'low_var_kl'\]"),
    (["train.mini_batches=2", "train.save_every_steps=3"], "train.save_every_steps=3 must be a multiple of"),
])
def test_config_keys_are_checked(overrides, message):
    with pytest.raises(ConfigError, match=message):
        resolve({"name": "t", "preset": "tiny"}, overrides)


def test_config_defaults_and_the_tiny_presets_two_mini_batches(tmp_path):
    resolved = resolve({"name": "t", "preset": "tiny"}, ["train.mini_batches=4", "train.ppo_epochs=2",
                                                         "train.clip_ratio_c=3", "train.kl_estimator=low_var_kl"])
    train = resolved.preset.train
    assert (train.mini_batches, train.ppo_epochs, train.clip_ratio_c, train.kl_estimator) == (4, 2, 3.0, "low_var_kl")
    args = grpo_config(resolved.preset, tmp_path, seed=0)
    assert (args.steps_per_generation, args.num_iterations, args.per_device_train_batch_size) == (4, 2, 32)
    assert (TrainConfig().mini_batches, TrainConfig().ppo_epochs) == (1, 1)  # the schema: one step per batch
    tiny = resolve({"name": "t", "preset": "tiny"}).preset  # the default sweep's preset: two mini-batch updates
    assert (tiny.train.mini_batches, tiny.train.ppo_epochs) == (2, 1)
    assert tiny.train.clip_ratio_c is None and tiny.train.kl_estimator == "k3"
    args = grpo_config(tiny, tmp_path, seed=0)
    assert (args.steps_per_generation, args.num_iterations, args.per_device_train_batch_size) == (2, 1, 64)


def test_gmts_scores_the_current_policy_against_the_rollout_policy_on_every_mini_batch(tiny_model_dir, tmp_path):
    # GMTS's H and r come from each mini-batch's own training forward: the policy before that mini-batch's update,
    # what the official codes' no-grad forward at the start of each mini-batch gives; r = 1 only on the first
    preset = tiny_preset(mini_batches=2)
    method = get_method_class("gmts")()
    trainer = build_grpo_trainer(tiny_model_dir, tmp_path, preset, PROMPTS, [length_reward], method)
    seen, scores = [], method.scores

    def recording(stats, batch, ctx):
        mask = batch.completion_mask > 0
        ratio = torch.exp(stats.logp.detach() - stats.old_logp)[mask]
        with torch.no_grad():  # the current weights' entropy, computed again here (budget in steps: no effect)
            current = trainer.actor.statistics(trainer.model, last_inputs[-1], ("entropy",), "train", False)
        seen.append((float((ratio - 1).abs().max()), torch.equal(stats.entropy[mask], current["entropy"][mask])))
        return scores(stats, batch, ctx)

    method.scores = recording
    last_inputs = record_loss_inputs(trainer)
    trainer.train()
    assert len(seen) == 4  # two generation batches of two mini-batches
    assert seen[0][0] == 0.0 and seen[2][0] == 0.0  # first mini-batch: the rollout policy itself
    assert seen[1][0] > 0.0 and seen[3][0] > 0.0  # second: the updated policy against the rollout policy
    assert all(same for _, same in seen)  # H of the current weights


def test_reference_log_probs_are_computed_once_per_generation_batch(tiny_model_dir, tmp_path):
    # as verl (ref log-probs once per generation batch, before the updates): 4 optimizer steps (2 mini-batches x 2
    # epochs) read the rows of one reference pass, which the ledger counts once
    preset = tiny_preset(mini_batches=2, ppo_epochs=2, beta=0.1)
    trainer = build_grpo_trainer(tiny_model_dir, tmp_path, preset, PROMPTS, [length_reward])
    seen = record_loss_inputs(trainer)
    trainer.train()
    assert len(seen) == 4  # one generation batch (no BudgetCallback here: step_ledger holds the whole run)
    ledger = trainer.accounting.step_ledger
    # one no-grad forward of the reduced batch each, same model shape: the reference pass counts what pi_old's does
    assert ledger.flops["reference"] > 0 and ledger.flops["reference"] == pytest.approx(ledger.flops["old_logp"])
    # each step's KL term reads what a reference forward of its own mini-batch gives (what it computed before)
    for inputs in seen:
        expected = trainer.actor.reference_log_probs(inputs)
        mask = inputs.completion_mask.bool()
        torch.testing.assert_close(inputs.ref_logp[mask], expected[mask])
    logs = [r for r in trainer.state.log_history if "loss" in r]
    assert logs[0]["kl"] == 0.0 and logs[-1]["kl"] > 0  # pi_theta leaves pi_ref after the first update
