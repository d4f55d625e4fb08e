"""What the harness changes on TRL's, transformers' and accelerate's live objects, each a small shim (the list with
the reasons: ``harness.train.trl.TOUCH_POINTS``)."""

from __future__ import annotations

import copy
import inspect
from contextlib import contextmanager

import torch


def frozen_copy(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A frozen copy of the policy in ``dtype`` (model.dtype: the reference needs no master weights) for the
    reference. GRPOTrainer replaces ``model.forward`` by a closure over the original model's forward; a deep copy
    would keep calling the policy through it, so the copy gets its class's own forward back."""
    reference = copy.deepcopy(model).eval().requires_grad_(False).to(dtype)
    reference.__dict__.pop("forward", None)
    return reference


@contextmanager
def class_forward_while_generating(model):
    """TRL 1.16 puts a fused-LM-head forward on the policy instance (``_fused_forward`` in trl/trainer/utils.py).
    Called without ``fused_lm_head=True``, as ``generate`` calls it, it only calls the forward it replaced. When that
    is the class's own forward (no mixed-precision wrapper in between), the instance attribute is lifted while TRL
    generates: every call computes the same, and harness.model.decode sees a plain model whose decoder layers it
    may call directly (its faster step). Anything else is left as it is."""
    patched = vars(model).get("forward")
    func = getattr(patched, "__func__", None)
    original = (inspect.getclosurevars(func).nonlocals.get("original_forward")
                if func is not None and func.__code__.co_name == "_fused_forward" else None)
    if getattr(original, "__func__", None) is not type(model).forward or original.__self__ is not model:
        yield
        return
    del model.forward
    try:
        yield
    finally:
        model.forward = patched


@contextmanager
def one_step_per_generation(trainer):
    """TRL 1.16 runs a forward of its own for old log-probs when steps_per_generation x num_iterations exceeds
    gradient_accumulation_steps: full-vocabulary logits over the batch before rollout dropping, outside the
    budget. The harness computes them on the reduced batch (``Actor.before_updates``), so while TRL generates
    it sees the values for which it computes none (the only place TRL reads them there)."""
    saved = trainer.args.steps_per_generation, trainer.num_iterations
    trainer.args.steps_per_generation, trainer.num_iterations = 1, 1
    try:
        yield
    finally:
        trainer.args.steps_per_generation, trainer.num_iterations = saved


def skippable_step(optimizer, actor) -> None:
    """The optimizer's ``step`` does nothing once when ``actor.skip_optimizer_step`` is set (a non-finite loss):
    Adam's moments would still move the weights on zero gradients."""
    step = optimizer.step

    def step_unless_skipped(*args, **kwargs):
        if actor.skip_optimizer_step:
            actor.skip_optimizer_step = False
            return None
        return step(*args, **kwargs)

    optimizer.step = step_unless_skipped


class AcceleratorProcesses:
    """accelerate's ``Accelerator`` as the actor's ``Processes``."""

    def __init__(self, accelerator):
        self.accelerator = accelerator

    @property
    def num_processes(self) -> int:
        return self.accelerator.num_processes

    @property
    def device(self) -> torch.device:
        return self.accelerator.device

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        return values if self.num_processes == 1 else self.accelerator.reduce(values, reduction="sum")

    def max(self, value: int) -> int:
        if self.num_processes == 1:
            return value
        values = self.accelerator.gather(torch.tensor([value], dtype=torch.int64, device=self.device))
        return int(values.max())

    def backward(self, loss: torch.Tensor) -> None:
        self.accelerator.backward(loss)

    def autocast(self):
        return self.accelerator.autocast()

    @contextmanager
    def accumulating(self, model):
        """A backward that adds to the gradients without synchronising them (DDP/FSDP no_sync) and without an
        optimizer step (DeepSpeed steps in every backward at a gradient-accumulation boundary)."""
        gradient_state = self.accelerator.gradient_state
        sync = gradient_state.sync_gradients
        gradient_state._set_sync_gradients(False)
        try:
            with self.accelerator.no_sync(model):
                yield
        finally:
            gradient_state._set_sync_gradients(sync)
