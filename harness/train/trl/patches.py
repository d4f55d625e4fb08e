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
    budget. The harness computes them on the kept batch (``Actor.before_updates``), so while TRL generates
    it sees the values for which it computes none (the only place TRL reads them there)."""
    saved = trainer.args.steps_per_generation, trainer.num_iterations
    trainer.args.steps_per_generation, trainer.num_iterations = 1, 1
    try:
        yield
    finally:
        trainer.args.steps_per_generation, trainer.num_iterations = saved


def skippable_step(optimizer, actor) -> None:
    """The optimizer's ``step`` does nothing while ``actor.skip_optimizer_step`` is set: Adam's moments would still
    move the weights on zero gradients. The actor sets the flag alike on every process, for each update (a loss that
    was non-finite on any process), and only the next update's loss clears it: under DeepSpeed ZeRO-3 this is the
    inner optimizer, whose ``step`` the engine calls once per parameter sub-group, inside ``accelerator.backward``,
    and every one of those calls is skipped. The gradients of a skipped step (possibly NaN) are dropped by the
    zero_grad that follows every step (the Trainer's; ZeRO-3's own after its step)."""
    step = optimizer.step

    def step_unless_skipped(*args, **kwargs):
        if actor.skip_optimizer_step:
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


def deepspeed_engine_facts(engine) -> dict:
    """What a DeepSpeed engine trains with, read from it: the ZeRO stage, the dtypes of the module, of gradient
    accumulation and of gradient reduction (bf16 for both unless configured: configs/accelerate/deepspeed_zero3.json
    asks float32), and how many parameters are partitioned over the processes (a ZeRO-3 parameter's local partition
    ``ds_tensor`` is smaller than the whole ``ds_numel``)."""
    model_dtype, grad_accum_dtype = engine.get_data_types()
    parameters = list(engine.module.parameters())
    partitioned = sum(1 for p in parameters
                      if getattr(p, "ds_tensor", None) is not None and p.ds_tensor.numel() < p.ds_numel)
    return {"zero_stage": engine.zero_optimization_stage(), "module_dtype": str(model_dtype),
            "grad_accum_dtype": str(grad_accum_dtype), "communication_dtype": str(engine.communication_data_type),
            "partitioned_parameters": partitioned, "parameters": len(parameters)}


def skip_cpu_inference_allreduce_build() -> None:
    """DeepSpeed's torch backend JIT-compiles a shared-memory all-reduce when it initialises on a CPU machine
    (``build_shm_op``; used only by ``inference_all_reduce``, never by ZeRO training): about 2 minutes of every
    process's CPU, again whenever its build cache was made with other compiler flags. The CPU rehearsals of the
    ZeRO-3 presets skip it; on GPUs it is never called (``TargetedGRPOTrainer`` calls this only without CUDA)."""
    import sys

    import deepspeed.comm.torch  # noqa: F401  (the name resolves to torch in deepspeed.comm: read sys.modules)

    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
