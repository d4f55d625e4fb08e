"""The TRL boundary and the actor: every TRL touch point holds, and the gradient the trainer produces equals the
loss written out."""

import importlib
import inspect
import json

import pytest
import torch
import trl
from conftest import build_grpo_trainer
from reference_formulas import clipped_surrogate

from harness.config.schema import PresetConfig
from harness.model.checkpoints import load_policy
from harness.train.row_chunks import Sequences, chunk_plan
from harness.train.step_batch import StepBatch
from harness.train.trl import TOUCH_POINTS, TRL_VERSION
from harness.train.trl.settings import grpo_config
from harness.train.trl.trainer import TargetedGRPOTrainer


def test_trl_version_is_pinned():
    # the boundary overrides private methods; a new TRL release must be checked against these tests first
    assert trl.__version__ == TRL_VERSION


def resolve_target(target: str):
    module, _, qualname = target.partition(":")
    found = importlib.import_module(module)
    for name in filter(None, qualname.split(".")):
        found = getattr(found, name)
    return found


@pytest.mark.parametrize("point", TOUCH_POINTS, ids=lambda p: f"{p.kind}:{p.target}")
def test_every_touch_point_holds(point):
    if point.target.startswith("vllm"):
        pytest.importorskip("vllm")
    found = resolve_target(point.target)
    if point.kind in ("override", "signature"):
        assert list(inspect.signature(found).parameters) == list(point.pin)
    elif point.kind == "source":
        source = inspect.getsource(found)
        assert [s for s in point.pin if s not in source] == []
        assert [s for s in point.absent if s in source] == []
    else:
        assert point.kind == "exists"


def test_every_trl_method_the_trainer_overrides_is_a_touch_point():
    overridden = [name for name, value in vars(TargetedGRPOTrainer).items() if callable(value) and name != "__init__"
                  and hasattr(trl.GRPOTrainer, name)]
    # each under the nearest class of TRL's that defines it: the code the override replaces
    overrides = {next(f"{cls.__name__}.{name}" for cls in trl.GRPOTrainer.__mro__ if name in vars(cls))
                 for name in overridden}
    listed = {p.target.partition(":")[2] for p in TOUCH_POINTS if p.kind == "override"}
    assert overrides <= listed and overrides


def make_trainer(model_dir, tmp_path, method="uniform", **train_overrides):
    preset = PresetConfig(name="test")
    preset.train.prompts_per_step, preset.train.num_generations = 2, 2
    preset.train.max_completion_length = 6
    for key, value in train_overrides.items():
        setattr(preset.train, key, value)
    prompts = [{"prompt": f"Q: {i}+1\n", "answer": str(i + 1)} for i in range(8)]
    trainer = build_grpo_trainer(model_dir, tmp_path, preset, prompts,
                                 [lambda completions, **kw: [0.0] * len(completions)], method)
    return trainer, trainer.model


def policy_loss(trainer, model, inputs):
    """The loss of one optimizer step, as the trainer hands it to TRL."""
    return trainer.actor.policy_loss(model, inputs, trainer.step_context())


def before_updates(trainer, reduced):
    return trainer.actor.before_updates(trainer.model, reduced, trainer.step_context())


def raw_inputs(seed=0):
    """A kept batch as ``StepBatch.kept`` gives it, before the passes that precede the updates."""
    g = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(4, 40, (4, 3), generator=g)
    completion_ids = torch.randint(4, 40, (4, 5), generator=g)
    completion_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 0, 0, 0, 0]])
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    advantages = torch.tensor([0.7, -0.7, -0.7, 0.7])
    return StepBatch(
        prompt_ids=prompt_ids, prompt_mask=torch.ones_like(prompt_ids), completion_ids=completion_ids,
        completion_mask=completion_mask, advantages=advantages[:, None] * completion_mask, rewards=rewards,
        group_ids=torch.tensor([0, 0, 1, 1]), rollout_advantages=advantages)


def loss_inputs(trainer, seed=0):
    """The inputs of a training step: the reference's log-probs (beta > 0) computed once, as before the updates."""
    return before_updates(trainer, raw_inputs(seed))


def direct_logp_entropy(model, inputs):
    ids = torch.cat([inputs.prompt_ids, inputs.completion_ids], dim=1)
    mask = torch.cat([inputs.prompt_mask, inputs.completion_mask], dim=1)
    logits = model(input_ids=ids, attention_mask=mask).logits[:, -6:-1].float()
    logp_all = torch.log_softmax(logits, -1)
    logp = logp_all.gather(-1, inputs.completion_ids[..., None]).squeeze(-1)
    return logp, -(logp_all.exp() * logp_all).sum(-1)


def grads(model):
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_uniform_gradient_equals_the_written_out_loss(tiny_model_dir, tmp_path, aggregation):
    trainer, model = make_trainer(tiny_model_dir, tmp_path, aggregation=aggregation, stats_chunk_size=3)
    inputs = loss_inputs(trainer)
    model.zero_grad()
    policy_loss(trainer, model, inputs).backward()
    ours = grads(model)

    model.zero_grad()
    logp, _ = direct_logp_entropy(model, inputs)
    mask, adv = inputs.completion_mask.float(), inputs.advantages
    per_token = clipped_surrogate(logp, logp.detach(), adv)
    if aggregation == "token-mean":
        loss = (per_token * mask).sum() / mask.sum()
    elif aggregation == "seq-mean-token-mean":
        loss = ((per_token * mask).sum(1) / mask.sum(1)).mean()
    else:
        loss = (per_token * mask).sum() / (4 * 6)  # B * max_completion_length
    loss.backward()
    for a, b in zip(ours, grads(model), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_entropy_gradient_equals_top_k_written_out(tiny_model_dir, tmp_path):
    trainer, model = make_trainer(tiny_model_dir, tmp_path, method="entropy")
    inputs = loss_inputs(trainer, seed=1)
    model.zero_grad()
    policy_loss(trainer, model, inputs).backward()
    ours = grads(model)

    model.zero_grad()
    logp, entropy = direct_logp_entropy(model, inputs)
    mask = inputs.completion_mask.bool()
    k = -(-int(mask.sum()) * 2 // 10)  # ceil(0.2 * n)
    threshold = entropy.detach()[mask].topk(k).values.min()
    selected = (mask & (entropy.detach() >= threshold)).float()
    assert int(selected.sum()) == k  # no ties in this random case
    per_token = -inputs.advantages * torch.exp(logp - logp.detach())
    ((per_token * selected).sum() / selected.sum()).backward()
    for a, b in zip(ours, grads(model), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_step_context_carries_the_process_index(tiny_model_dir, tmp_path):
    trainer, _ = make_trainer(tiny_model_dir, tmp_path, method="nat")
    trainer.accelerator.state.process_index = 3  # what rank 3 of an accelerate launch reports
    try:
        assert trainer.step_context().process_index == 3
    finally:
        trainer.accelerator.state.process_index = 0
    assert trainer.step_context().process_index == 0


def test_kl_term_uses_a_frozen_reference(tiny_model_dir, tmp_path):
    trainer, model = make_trainer(tiny_model_dir, tmp_path, beta=0.1)
    assert trainer.actor.reference is not None
    assert not any(p.requires_grad for p in trainer.actor.reference.parameters())
    inputs = loss_inputs(trainer)
    # at pi_theta == pi_ref the k3 KL and its gradient vanish: the loss equals the beta = 0 loss
    with_kl = policy_loss(trainer, model, inputs)
    trainer.preset.train.beta = 0.0
    torch.testing.assert_close(with_kl, policy_loss(trainer, model, inputs))


def test_reference_forward_uses_the_reference_weights(tiny_model_dir, tmp_path):
    # GRPOTrainer patches model.forward with a closure over the policy; a plain deep copy would score with the policy
    trainer, model = make_trainer(tiny_model_dir, tmp_path, beta=0.1)
    inputs = loss_inputs(trainer)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
        policy = trainer.actor.statistics(model, inputs, (), "train", False)["logp"]
        reference = trainer.actor.statistics(trainer.actor.reference, inputs, (), "reference", False)["logp"]
        fresh, _ = load_policy(tiny_model_dir)
        expected = trainer.actor.statistics(fresh, inputs, (), "reference", False)["logp"]
    mask = inputs.completion_mask.bool()
    assert not torch.allclose(policy[mask], reference[mask])
    torch.testing.assert_close(reference[mask], expected[mask])



def test_activation_checkpointing_follows_the_preset(tmp_path):
    # TRL turns it on by default (GPU memory at long lengths); the tiny preset turns it off to save CPU time
    from harness.config.loading import resolve
    from harness.config.paths import REPO_ROOT

    assert grpo_config(PresetConfig(name="test"), tmp_path, seed=0).activation_checkpointing is True
    tiny = resolve(REPO_ROOT / "configs/sweeps/default.yaml").preset
    assert grpo_config(tiny, tmp_path, seed=0).activation_checkpointing is False


@pytest.mark.parametrize("method, beta", [("entropy", 0.0), ("uniform", 0.1), ("gmts", 0.0), ("gmts", 0.1)])
@pytest.mark.parametrize("chunk_rows", [1, 3])
def test_backward_in_row_chunks_gives_the_same_loss_and_gradient(tiny_model_dir, tmp_path, method, beta, chunk_rows):
    # the method still ranks tokens over the whole batch: entropy's top 20% is batch-wide, not per chunk;
    # GMTS with beta > 0 reads ref_logp in its score, so the no-grad pass must compute it (needs_at)
    def loss_and_grads(**overrides):
        trainer, model = make_trainer(tiny_model_dir, tmp_path, method=method, beta=beta, **overrides)
        with torch.no_grad():  # a policy away from the reference, so the KL term has a gradient
            for p in model.parameters():
                p.add_(0.02 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
        model.zero_grad()
        loss = policy_loss(trainer, model, loss_inputs(trainer, seed=2))
        trainer.accelerator.backward(loss)  # what Trainer.training_step does with the returned loss
        return loss.detach(), grads(model), trainer.accounting.step_ledger

    whole_loss, whole_grads, whole_ledger = loss_and_grads()
    chunked_loss, chunked_grads, chunked_ledger = loss_and_grads(backward_chunk_rows=chunk_rows)
    torch.testing.assert_close(chunked_loss, whole_loss, rtol=1e-5, atol=1e-7)
    for a, b in zip(chunked_grads, whole_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    # the extra no-grad forward is counted: one forward more than the single backward's x3
    assert chunked_ledger.flops["train"] > whole_ledger.flops["train"]


@pytest.mark.parametrize("method, beta", [("entropy", 0.0), ("gmts", 0.1)])
def test_chunks_sized_by_tokens_give_the_same_loss_and_gradient(tiny_model_dir, tmp_path, method, beta):
    # raw_inputs' rows are 8, 6, 7 and 4 tokens long (prompt + completion); a 12-token cap makes uneven chunks
    # [[3, 1], [2], [0]]
    # (tests/test_row_chunks.py), forward and backward; the method still ranks its tokens over the whole batch
    def loss_and_grads(**overrides):
        trainer, model = make_trainer(tiny_model_dir, tmp_path, method=method, beta=beta, **overrides)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.02 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
        model.zero_grad()
        inputs = loss_inputs(trainer, seed=2)
        loss = policy_loss(trainer, model, inputs)
        trainer.accelerator.backward(loss)
        return loss.detach(), grads(model), inputs

    whole_loss, whole_grads, inputs = loss_and_grads()
    assert [c.tolist() for c in chunk_plan(inputs, 16, 12)] == [[3, 1], [2], [0]]
    chunked_loss, chunked_grads, _ = loss_and_grads(forward_chunk_tokens=12, backward_chunk_tokens=12)
    torch.testing.assert_close(chunked_loss, whole_loss, rtol=1e-5, atol=1e-7)
    for a, b in zip(chunked_grads, whole_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("beta, chunk_rows, mini_batches", [(0.0, 0, 1), (0.1, 0, 1), (0.1, 1, 1), (0.1, 0, 2)])
def test_nat_urs_runs_the_lm_head_only_at_sampled_tokens_with_the_same_loss_and_gradient(tiny_model_dir, tmp_path,
                                                                                          beta, chunk_rows,
                                                                                          mini_batches):
    from harness.train.budget import forward_flops
    from harness.train.hooks import new_rollout_batch, prepare_batch
    from harness.train.row_chunks import packed_rows, row_chunks
    from methods.nat import NAT

    class EveryPosition(NAT):  # the same weights, the LM head at every position (what ran before)
        def loss_positions(self, batch, ctx):
            return None

    def loss_and_grads(method):
        trainer, model = make_trainer(tiny_model_dir, tmp_path, method="nat", beta=beta, backward_chunk_rows=chunk_rows,
                                      forward_chunk_rows=2, mini_batches=mini_batches)
        trainer.actor.method = method
        with torch.no_grad():  # a policy away from the reference, so the KL term has a gradient
            for p in model.parameters():
                p.add_(0.02 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
        raw = raw_inputs(seed=3)
        batch = new_rollout_batch(raw.completion_ids, raw.completion_mask, raw.rewards, raw.group_ids, "group",
                                  rollout_advantages=raw.rollout_advantages)
        prepared = prepare_batch(method, batch, trainer.step_context())
        inputs = before_updates(trainer, StepBatch.kept(vars(raw), prepared, torch.device("cpu")))
        model.zero_grad()
        loss = policy_loss(trainer, model, inputs)
        trainer.accelerator.backward(loss)
        return loss.detach(), grads(model), trainer, inputs

    config = NAT.Config(scheme="urs")
    loss, picked_grads, trainer, inputs = loss_and_grads(NAT(config))
    every_loss, every_grads, every_trainer, _ = loss_and_grads(EveryPosition(config))
    torch.testing.assert_close(loss, every_loss, rtol=1e-5, atol=1e-7)
    for a, b in zip(picked_grads, every_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    # the ledger counts the LM head only at the sampled tokens: the difference is exactly the skipped logits
    sampled = inputs.extras["nat_sample"]
    assert 0 < int(sampled.sum()) < int(inputs.completion_mask.sum())

    def skipped(rows_per_chunk):  # logit positions not computed; a chunk without a sampled token still runs one
        # (every position: each row's completion tokens up to its last real one, the padding-free forward)
        return sum(int(packed_rows(c).valid.sum()) - max(int(sampled[c.rows].sum()), 1)
                   for c in row_chunks(inputs, chunk_plan(inputs, rows_per_chunk)))

    head = forward_flops(trainer.accounting.model_shape, 0, 1, 0)  # 2 N_head per logit position
    # forward + backward over forward_chunk_rows = 2 rows; with backward chunks, a no-grad pass over those and the
    # forward + backward over one-row chunks. The KL reference runs once, before the updates, over 2-row chunks
    saved = head * skipped(2) + 3.0 * head * skipped(1) if chunk_rows else 3.0 * head * skipped(2)
    every, picked = every_trainer.accounting.step_ledger.flops, trainer.accounting.step_ledger.flops
    assert every["train"] - picked["train"] == pytest.approx(saved)
    if beta > 0:
        assert every["reference"] - picked["reference"] == pytest.approx(head * skipped(2))
    if mini_batches > 1:  # the old-policy pass before the updates skips the same logits (loss against it: above)
        assert inputs.old_logp is not None
        assert every["old_logp"] - picked["old_logp"] == pytest.approx(head * skipped(2))


def test_weights_outside_the_loss_positions_are_refused(tiny_model_dir, tmp_path):
    from harness.train.hooks import new_rollout_batch, prepare_batch
    from methods.nat import NAT

    class TooFewPositions(NAT):  # claims fewer positions than it weighs
        def loss_positions(self, batch, ctx):
            return torch.zeros_like(batch.completion_mask, dtype=torch.bool)

    trainer, model = make_trainer(tiny_model_dir, tmp_path, method="nat")
    trainer.actor.method = TooFewPositions(NAT.Config(scheme="urs"))
    raw = raw_inputs()
    batch = new_rollout_batch(raw.completion_ids, raw.completion_mask, raw.rewards, raw.group_ids, "group")
    inputs = StepBatch.kept(vars(raw), prepare_batch(trainer.method, batch, trainer.step_context()),
                            torch.device("cpu"))
    with pytest.raises(ValueError, match="outside its loss_positions"):
        policy_loss(trainer, model, inputs)


def test_loss_settings_come_from_the_preset(tiny_model_dir, tmp_path):
    from harness.train.loss import LossConfig

    trainer, _ = make_trainer(tiny_model_dir, tmp_path, beta=0.1, clip_ratio_c=3.0, kl_estimator="low_var_kl",
                              clip_eps_low=0.1, clip_eps_high=0.3)
    assert trainer.actor.settings.loss_config() == LossConfig(
        clip_eps_low=0.1, clip_eps_high=0.3, clip_ratio_c=3.0, beta=0.1, kl_estimator="low_var_kl")
    ctx = trainer.step_context()  # the methods see the same settings
    assert (ctx.clip_eps_low, ctx.clip_eps_high, ctx.beta) == (0.1, 0.3, 0.1)
    trainer, _ = make_trainer(tiny_model_dir, tmp_path)
    assert trainer.actor.settings.loss_config() == LossConfig()  # k3, no dual-clip: the schema's defaults


def left_padded_inputs(seed: int, group_prompts: bool = False) -> dict:
    """Six rows of two prompt groups: prompts of 2-5 tokens left-padded to 5, completions of 1-6 tokens.
    ``group_prompts``: each group's rows share one prompt (as GRPO's rollouts do), of 5 and 3 tokens."""
    g = torch.Generator().manual_seed(seed)
    prompt_lengths, completion_lengths = [5, 2, 4, 3, 5, 2], [6, 2, 4, 1, 5, 3]
    prompt_ids = torch.randint(4, 40, (6, 5), generator=g)
    if group_prompts:
        prompt_lengths = [5, 5, 5, 3, 3, 3]
        prompt_ids = prompt_ids[[0, 0, 0, 3, 3, 3]]
    prompt_mask = torch.tensor([[0] * (5 - p) + [1] * p for p in prompt_lengths])
    completion_ids = torch.randint(4, 40, (6, 6), generator=g)
    completion_mask = torch.tensor([[1] * c + [0] * (6 - c) for c in completion_lengths])
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    return {"prompt_ids": prompt_ids * prompt_mask, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
            "completion_mask": completion_mask, "rewards": rewards, "group_ids": torch.tensor([0, 0, 0, 1, 1, 1])}


@pytest.mark.parametrize("method, beta", [("uniform", 0.0), ("uniform", 0.1), ("nat", 0.0), ("d3s", 0.1),
                                          ("entropy", 0.0)])
@pytest.mark.parametrize("forward_rows, backward_rows, checkpointing", [(16, 0, False), (2, 0, True),
                                                                        (16, 2, True)])
@pytest.mark.parametrize("group_prompts", [False, True])
def test_padding_free_forward_gives_the_padded_loss_and_gradient(tiny_model_dir, tmp_path, method, beta,
                                                                  forward_rows, backward_rows, checkpointing,
                                                                  group_prompts):
    # NAT cuts rows (RPC), D3S drops rollouts and selects tokens by entropy; the packed forward must give the padded
    # forward's loss and gradients up to float noise (other matmul shapes: 1e-5 relative), and count only the real
    # tokens it computes; with group_prompts the rows of a group share one computed copy of their prompt
    from harness.train.budget import causal_pairs, forward_flops
    from harness.train.hooks import new_rollout_batch, prepare_batch

    def loss_and_grads(padding_free):
        trainer, model = make_trainer(tiny_model_dir, tmp_path, method=method, beta=beta, padding_free=padding_free,
                                      forward_chunk_rows=forward_rows, backward_chunk_rows=backward_rows)
        with torch.no_grad():  # a policy away from the reference, so the KL term has a gradient
            for p in model.parameters():
                p.add_(0.02 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
        if checkpointing:  # backward recomputes each layer after the forward returned: it must run packed again
            model.activation_checkpointing_enable()
            model.train()
        raw = left_padded_inputs(seed=4, group_prompts=group_prompts)
        batch = new_rollout_batch(raw["completion_ids"], raw["completion_mask"], raw["rewards"], raw["group_ids"],
                                  "group")
        prepared = prepare_batch(trainer.method, batch, trainer.step_context())
        inputs = before_updates(trainer, StepBatch.kept(raw, prepared, torch.device("cpu")))
        model.zero_grad()
        loss = policy_loss(trainer, model, inputs)
        trainer.accelerator.backward(loss)
        return loss.detach(), grads(model), trainer.accounting.step_ledger, inputs

    loss, packed_grads, ledger, inputs = loss_and_grads(True)
    padded_loss, padded_grads, padded_ledger, _ = loss_and_grads(False)
    torch.testing.assert_close(loss, padded_loss, rtol=1e-5, atol=1e-7)
    for a, b in zip(packed_grads, padded_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    # the ledger counts each row's real tokens: its prompt and its completion but the last token (no input needed);
    # a prompt shared by rows of one chunk once
    prompt_lengths, completion_lengths = inputs.prompt_mask.sum(dim=1), inputs.completion_mask.sum(dim=1)
    lengths = prompt_lengths + completion_lengths - 1
    real = int(lengths.sum())
    passes = (2 if backward_rows else 1) + (1 if beta > 0 else 0)  # no-grad pass of backward chunks; reference pass
    one_chunk = forward_rows >= len(lengths) and not backward_rows
    if group_prompts:
        assert ledger.trained_positions < real
        if one_chunk:  # rows 0-2 share a 5-token prompt, rows 3-5 a 3-token one (D3S may have dropped some rows)
            groups = inputs.group_ids.unique().tolist()
            real = sum({0: 5, 1: 3}[g] for g in groups) + int((completion_lengths - 1).clamp(min=0).sum())
            assert ledger.trained_positions == real
    else:
        assert ledger.trained_positions == real < padded_ledger.trained_positions
        assert ledger.forwarded_positions == passes * real
    if one_chunk:  # attention over (rows, longest row)
        shape = trainer_shape(tiny_model_dir, tmp_path)
        expected = 3.0 * forward_flops(shape, real, int(completion_lengths.sum()),
                                       len(lengths) * causal_pairs(int(lengths.max())))
        assert ledger.flops["train"] == pytest.approx(expected)
    assert ledger.flops["train"] < padded_ledger.flops["train"]


def trainer_shape(model_dir, tmp_path):
    return make_trainer(model_dir, tmp_path)[0].accounting.model_shape


def test_packed_rows_share_a_prompt_by_hand():
    # rows 0 and 2 have the same real prompt [5, 6, 7] (left-padded to 4 columns), row 1 its own [9, 8]; completions
    # of 3, 2 and 1 tokens (the last one is no input, so row 2 contributes no completion token at all)
    from harness.train.row_chunks import RowChunk, packed_rows

    ids = torch.tensor([[0, 5, 6, 7, 11, 12, 13], [0, 0, 9, 8, 21, 22, 0], [0, 5, 6, 7, 31, 0, 0]])
    mask = torch.tensor([[0, 1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1, 0], [0, 1, 1, 1, 1, 0, 0]])
    chunk = RowChunk(torch.arange(3), ids, mask, completion_width=3)
    own = packed_rows(chunk, share_prompts=False)
    assert own.input_ids.tolist() == [[5, 6, 7, 11, 12, 9, 8, 21, 5, 6, 7]]
    assert own.gather.tolist() == [[0, 1, 2, 3, 4], [5, 6, 7, 7, 7], [8, 9, 10, 10, 10]]
    shared = packed_rows(chunk, share_prompts=True)
    assert shared.input_ids.tolist() == [[5, 6, 7, 11, 12, 9, 8, 21]]
    assert shared.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2]]
    assert shared.gather.tolist() == [[0, 1, 2, 3, 4], [5, 6, 7, 7, 7], [0, 1, 2, 2, 2]]  # row 2 reads row 0's prompt
    assert shared.scatter.tolist() == [0, 1, 2, 3, 4, 5, 6, 7]  # a shared prompt's outputs come from row 0
    assert shared.predict.tolist() == [[2, 3, 4], [6, 7, 8], [2, 8, 9]]  # row 2's only token: predicted by token 2
    assert shared.valid.tolist() == [[True, True, True], [True, True, False], [True, False, False]]
    # a prompt that differs only in padding is the same prompt; one that differs in a token is not
    other_padding, other_token = ids.clone(), ids.clone()
    other_padding[2, 0], other_token[2, 3] = 99, 8
    assert packed_rows(RowChunk(torch.arange(3), other_padding, mask, 3)).positions == shared.positions
    assert packed_rows(RowChunk(torch.arange(3), other_token, mask, 3)).positions == own.positions


def test_fast_decode_gives_the_same_rollouts_and_losses(tiny_model_dir, tmp_path, monkeypatch):
    # train.fast_decode decodes TRL's generate call with harness/model/decode.py: two steps (the second sampling
    # from weights the first changed) give the same completion ids and losses as TRL's plain generate
    from test_minibatches import run  # trains, recording each generation's completion ids

    from harness.model import decode

    decoded = []
    sample = decode.sample
    # records whether the decoder-layer step applied: TRL's fused forward is lifted while generating (patches)
    monkeypatch.setattr(decode, "sample", lambda model, *args, **kwargs: (
        decoded.append(decode.decoder_layer_step_applies(model)) or sample(model, *args, **kwargs)))

    def two_steps(fast_decode):
        trainer, _ = make_trainer(tiny_model_dir, tmp_path / str(fast_decode), fast_decode=fast_decode,
                                  learning_rate=2e-2, max_completion_length=12)
        trainer.reward_funcs = [lambda completions, **kw: [float(len(c) % 2) for c in completions]]
        trainer.args.max_steps = 2
        rollouts, steps = run(trainer)
        assert "forward" in vars(trainer.model)  # TRL's fused forward is back after generating
        return rollouts, [r["loss"] for r in steps]

    plain_rollouts, plain_losses = two_steps(False)
    assert decoded == []
    fast_rollouts, fast_losses = two_steps(True)
    assert decoded == [True, True]  # one generate call per step went through decode.sample's layer step
    assert len(fast_rollouts) == 2
    assert all(torch.equal(a, b) for a, b in zip(fast_rollouts, plain_rollouts, strict=True))
    assert not torch.equal(fast_rollouts[0], fast_rollouts[1])
    assert len(fast_losses) == 2 and fast_losses == plain_losses and any(loss != 0 for loss in fast_losses)


def test_step_phases_add_up_to_the_step():
    # each phase's seconds are added once; the train phase is the rest of the step
    from harness.train.budget import ModelShape, StepAccounting

    accounting = StepAccounting(ModelShape(n_body=1, n_head=1, n_layers=1, d_model=1), torch.device("cpu"))
    for _ in range(2):
        accounting.close_step({"generation": 3.0, "old_logp": 1.0, "reference": 0.5}, 10.0, lambda counts: counts)
    seconds = accounting.ledger.seconds
    assert seconds == {"generation": 6.0, "old_logp": 2.0, "reference": 1.0, "train": 11.0}
    assert sum(seconds.values()) == accounting.ledger.step_seconds == 20.0 and accounting.ledger.steps == 2


def test_the_actor_trains_without_a_grpo_trainer(tiny_model_dir):
    # the actor alone: one process, a plain model; its gradient is the clipped surrogate's, token-mean
    from types import SimpleNamespace

    from harness.train.actor import Actor
    from harness.train.budget import ModelShape, StepAccounting
    from methods.base import StepContext
    from methods.registry import get_method_class

    model, _ = load_policy(tiny_model_dir)
    train = PresetConfig(name="test").train
    accounting = StepAccounting(ModelShape.of(model), torch.device("cpu"))
    one_process = SimpleNamespace(num_processes=1, device=torch.device("cpu"), backward=lambda loss: loss.backward())
    logged = {}
    actor = Actor(get_method_class("uniform")(), train, accounting, one_process, logged.__setitem__, ())
    inputs = raw_inputs()
    model.zero_grad()
    actor.policy_loss(model, inputs, StepContext(max_completion_length=6)).backward()
    ours = grads(model)
    model.zero_grad()
    logp, _ = direct_logp_entropy(model, inputs)
    mask = inputs.completion_mask.float()
    ((clipped_surrogate(logp, logp.detach(), inputs.advantages) * mask).sum() / mask.sum()).backward()
    for a, b in zip(ours, grads(model), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert logged["loss/denominator"] == float(mask.sum()) and accounting.step_ledger.flops["train"] > 0


def test_sample_batch_is_a_few_whole_groups_through_the_actor_and_off_the_budget(tiny_model_dir, tmp_path):
    """The step-0 sample batch: the first SAMPLE_BATCH_GROUPS groups only (one padded forward over a paper preset's
    whole generation batch needed tens of GB), the actor's own statistics, nothing counted in the budget, and its
    seconds timed as off-budget (the step's seconds are reduced by them)."""
    from harness.train.budget import OFF_BUDGET, BudgetLedger
    from harness.train.hooks import new_rollout_batch
    from harness.train.sample_batch import SAMPLE_BATCH_GROUPS, write_sample_batch

    trainer, model = make_trainer(tiny_model_dir, tmp_path, prompts_per_step=6)
    trainer.sample_batch_path = tmp_path / "sample_batch.json"
    g = torch.Generator().manual_seed(3)
    rows = 6 * 2
    completion_mask = (torch.arange(5)[None] < torch.randint(1, 6, (rows, 1), generator=g)).long()
    out = {"prompt_ids": torch.randint(4, 40, (rows, 3), generator=g), "prompt_mask": torch.ones(rows, 3).long(),
           "completion_ids": torch.randint(4, 40, (rows, 5), generator=g), "completion_mask": completion_mask}
    batch = new_rollout_batch(out["completion_ids"], completion_mask, torch.arange(rows).float() % 3,
                              torch.arange(rows) // 2, "group")
    trainer.clock.collect()
    write_sample_batch(trainer.sample_batch_path, trainer.actor, model, out, batch, trainer.processing_class, 2,
                       trainer.run_seed, writes=True)
    sample = json.loads(trainer.sample_batch_path.read_text())
    kept = SAMPLE_BATCH_GROUPS * 2
    assert sample["group_ids"] == (torch.arange(kept) // 2).tolist()  # whole groups, in order
    assert len(sample["completion_ids"]) == len(sample["logp"]) == len(sample["prompts"]) == kept < rows
    with torch.no_grad():
        logp, entropy = direct_logp_entropy(model, Sequences(*(v[:kept] for v in out.values())))
    mask = completion_mask[:kept].bool()
    assert torch.allclose(torch.tensor(sample["logp"])[mask], logp[mask], atol=1e-5)
    assert torch.allclose(torch.tensor(sample["entropy"])[mask], entropy[mask], atol=1e-4)
    assert trainer.accounting.step_ledger == BudgetLedger()  # nothing counted
    assert set(trainer.clock.collect()) == {OFF_BUDGET}


def test_colocated_vllm_engines_are_seeded_by_the_run_seed_and_keep_trls_engine_index(monkeypatch):
    """TRL seeds colocated engine i with i whatever the run: every seed of a sweep sampled the same rollout
    randomness. The engine now gets run seed x 2^16 + TRL's index (tensor-parallel groups still sample alike)."""
    from trl.generation import vllm_generation

    from harness.train.trl.vllm import colocated_engine_settings

    built = []
    monkeypatch.setattr(vllm_generation, "LLM", lambda **kwargs: built.append(kwargs), raising=False)
    preset = PresetConfig(name="test")
    for run_seed in (0, 1, 7):
        with colocated_engine_settings(preset, run_seed):
            for trl_index in (0, 1):
                vllm_generation.LLM(model="m", seed=trl_index)
    seeds = [kwargs["seed"] for kwargs in built]
    assert seeds == [0, 1, 65536, 65537, 7 * 65536, 7 * 65536 + 1]
    assert len(set(seeds)) == len(seeds) and all(kwargs["dtype"] == preset.model.dtype for kwargs in built)
