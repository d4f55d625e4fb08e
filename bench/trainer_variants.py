"""Trainers compared step by step (``bench.step_overhead``'s design, shared by ``bench.dynamic_sampling``,
``bench.minibatch_cost`` and ``bench.profile_step``): a variant is a method label or ``trl`` (TRL's own
``GRPOTrainer``), optionally ``+<option>`` (preset overrides); its trainer is built by the harness's factory, reset to
the warm start before each block, and its steps recorded (wall and CPU seconds per phase, the rollouts' digest, the
budget ledger's change). Torch's RNG is seeded from (block, step), so every variant samples identical rollouts."""

from __future__ import annotations

import time
from dataclasses import dataclass

from transformers import TrainerCallback

from bench.fixtures import sweep

NEVER_REACHED_BUDGET = ["train.budget.kind=steps", "train.budget.amount=1e9", "train.budget.checkpoint_fractions=[1.0]"]
HOOKS = ("on_rollouts", "before_forward", "loss_positions", "token_weights")  # a method's per-step code
# variant suffix "+<option>" -> preset overrides; ds = DAPO's dynamic sampling (bench/dynamic_sampling.py), which
# needs a budget that counts generation: samples, never reached
# plaindecode = TRL's plain generate call instead of harness/model/decode.py (train.fast_decode=false)
OPTIONS = {"nogc": ["train.activation_checkpointing=false"],
           "ds": ["train.dynamic_sampling.enabled=true", "train.budget.kind=samples", "train.budget.amount=1e15"],
           "plaindecode": ["train.fast_decode=false"]}
# a block is one generation batch of one optimizer step (r = 1) whatever the preset takes (tiny: 2 mini-batches): a
# ratio compares methods per optimizer step on the same rollouts; bench/minibatch_cost.py measures mini-batch steps
ONE_STEP_PER_GENERATION = ["train.mini_batches=1", "train.ppo_epochs=1"]
DYNAMIC_SAMPLING_KEYS = ("dynamic_sampling/groups_generated", "dynamic_sampling/groups_with_signal",
                         "dynamic_sampling/groups_kept", "dynamic_sampling/groups_filled", "dynamic_sampling/rounds",
                         "dynamic_sampling/rounds_exhausted")


@dataclass
class Variant:
    """A trainer, the warm-start weights it is reset to before each block, its step recorder, and the budget
    progress its method's schedules see (None for TRL's own trainer, which has no budget)."""

    name: str
    trainer: object
    pristine: dict
    recorder: StepRecorder
    progress: float | None


def build_variant(variant: str, preset: str, args, progress: float | None, options: dict | None = None,
                  folder: str = "step_overhead") -> Variant:
    """``variant`` = a method label or ``trl``, optionally ``+<option>`` (a key of ``options``, default ``OPTIONS``:
    preset overrides); its trainer built by the harness's factory, its output in ``<workdir>/<folder>/``."""
    import torch

    from harness.config.loading import load_method
    from harness.train.run import build_trainer
    from harness.train.trl.bench_probes import build_plain_trainer

    options = OPTIONS if options is None else options
    label, _, option = variant.partition("+")
    if option and option not in options:
        raise ValueError(f"unknown variant option {option!r} (known: {', '.join(options)})")
    overrides = [*ONE_STEP_PER_GENERATION, *args.set, *NEVER_REACHED_BUDGET, *options.get(option, [])]
    resolved, paths = sweep(preset, args.workdir, args.warmstart_steps, overrides)
    out_dir = args.workdir / folder / variant.replace("+", "_")
    out_dir.mkdir(parents=True, exist_ok=True)
    if label == "trl":
        trainer = build_plain_trainer(resolved, paths, 0, out_dir)
        progress = None
    else:
        metrics = out_dir / "metrics.jsonl"
        metrics.unlink(missing_ok=True)
        trainer = build_trainer(resolved, load_method(label), 0, paths, out_dir, metrics_path=metrics)
        if resolved.preset.train.budget.kind != "steps":  # set_budget_progress counts steps; only D3S reads it
            progress = None
    pristine = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    torch.set_num_threads(resolved.preset.train.threads)
    return Variant(variant, trainer, pristine, StepRecorder(trainer), progress)


class StepRecorder(TrainerCallback):
    """Per step: wall/CPU seconds from the step's start to its log, per phase (``PhaseProbe``), the rollouts'
    lengths and digest, the budget ledger's change and a few logged metrics. At each step's start torch's RNG is
    seeded from (block, step), so every variant samples identical rollouts."""

    def __init__(self, trainer):
        from harness.train.trl.bench_probes import PhaseProbe

        self.trainer = trainer
        self.probe = PhaseProbe(trainer)
        self.block = 0
        self.steps: list[dict] = []
        self._t0 = None
        self.hooks_wall = 0.0
        method = getattr(trainer, "method", None)  # TRL's own trainer has none
        for hook in HOOKS if method is not None else ():
            setattr(method, hook, self._timed(getattr(method, hook)))
        trainer.add_callback(self)

    def _timed(self, hook):
        """The method's hook on this instance, its wall time added to the step's ``hooks_wall``."""

        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return hook(*args, **kwargs)
            finally:
                self.hooks_wall += time.perf_counter() - started

        return timed

    def seed(self, step: int) -> int:
        return 7919 * (self.block + 1) + step

    def on_step_begin(self, args, state, control, **kwargs):
        import torch

        torch.manual_seed(self.seed(state.global_step))  # identical rollouts in every variant
        self.probe.reset()
        self.hooks_wall = 0.0
        self._ledger0 = _ledger_snapshot(getattr(self.trainer, "ledger", None))  # TRL's own trainer has none
        self._t0 = (time.perf_counter(), time.process_time())

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self._t0 is None or not logs or "loss" not in logs:
            return
        wall, cpu = time.perf_counter() - self._t0[0], time.process_time() - self._t0[1]
        seconds = self.probe.seconds
        record = {"wall": wall, "cpu": cpu, "generation_wall": seconds["generation"]["wall"],
                  "generation_cpu": seconds["generation"]["cpu"],
                  "loss_forward_wall": seconds["loss_forward"]["wall"],
                  "loss_forward_cpu": seconds["loss_forward"]["cpu"], "hooks_wall": self.hooks_wall,
                  "completion_lengths": self.probe.completion_lengths, "rollouts_hash": self.probe.rollouts_digest}
        ledger = getattr(self.trainer, "ledger", None)
        if ledger is not None:
            after = _ledger_snapshot(ledger)
            record["ledger"] = {k: after[k] - self._ledger0[k] for k in after}
        for key in ("tokens/weighted_frac", "rollouts/kept_frac", "method/tokens_kept_frac",
                    "method/forward_length_frac", *DYNAMIC_SAMPLING_KEYS):
            if key in logs:
                record[key] = logs[key]
        self.steps.append(record)
        self._t0 = None


def _ledger_snapshot(ledger) -> dict:
    if ledger is None:
        return {}
    snap = {f"flops_{k}": v for k, v in ledger.flops.items()}
    snap.update({f"seconds_{k}": v for k, v in ledger.seconds.items()})
    snap.update(trained_positions=ledger.trained_positions, weighted_tokens=ledger.weighted_tokens,
                generated_tokens=ledger.generated_tokens, samples=ledger.samples)
    return snap


def run_block(variant: Variant, block: int, steps: int) -> None:
    """``steps`` optimizer steps of one variant from the warm start, on the prompts of ``block``."""
    import torch

    from harness.train.trl.bench_probes import set_budget_progress, train_steps

    trainer = variant.trainer
    with torch.no_grad():
        for name, tensor in trainer.model.state_dict().items():
            tensor.copy_(variant.pristine[name])
    if variant.progress is not None:  # budget progress seen by schedules (D3S): fixed, as at that point of a run
        set_budget_progress(trainer, variant.progress)
    variant.recorder.block = block
    train_steps(trainer, steps, data_seed=1000 + block)  # other prompts in every block, same in every variant

