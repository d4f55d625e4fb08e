"""``harness inspect``: run a method's hooks on one batch file, exactly as the trainer runs them.

Input (B rollouts, T padded completion positions): ``completion_ids`` int[B][T], ``completion_mask`` 0/1[B][T],
``rewards`` float[B], ``group_ids`` int[B], ``logp`` float[B][T], ``entropy`` float[B][T], optional ``sum_p2``,
``old_logp`` (default: logp), ``ref_logp``, ``progress`` in [0, 1], ``seed``, ``special_token_ids``
(default [151643], Qwen's <|endoftext|>, as the KTAE official code). Optional step settings: ``aggregation``,
``scale_rewards``, ``clip_eps_low``, ``clip_eps_high``, ``beta`` (> 0 needs ``ref_logp``), ``max_completion_length``
(default T), ``step``; loss settings: ``clip_ratio_c`` (dual-clip, default none), ``kl_estimator`` (default k3).

Output: ``advantages`` float[B][T], ``weights`` float[B][T], ``keep`` 0/1[B], ``denominator``, ``metrics``, and
the policy loss of the batch exactly as the trainer computes it (``harness.train.hooks.loss_inputs_for`` and
``harness.train.loss.loss_of_rows``: sum(w l) / D plus the KL term, as one process with the one mean over the
batch, ``train.loss_micro_batch_tokens`` = 0, computes it): ``loss``, ``clip_fraction`` (share of
completion tokens whose gradient a clip removes: low, high or dual) and ``loss_metrics``. NaN and infinite
values (from NaN rewards or -inf log-probs in the input) are written as ``null``, which JSON can hold, and
``non_finite`` lists the keys that hold them.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import torch

from harness.config.loading import load_method, parse_overrides
from harness.config.paths import CONFIG_DIR
from harness.config.schema import ConfigError, TrainConfig
from harness.data.files import read_json, write_json_atomic
from harness.train.hooks import PreparedBatch, new_rollout_batch, run_hooks, statistics_read
from harness.train.step_settings import STEP_KEYS, StepSettings
from methods.base import STATISTICS, TokenStats

DEFAULT_SPECIAL_TOKEN_IDS = (151643,)
BATCH_STEP_KEYS = (*STEP_KEYS, "step")  # a batch file's step keys (and --set ctx.<key>=...): the settings and the step


def _tensor(batch: dict, key: str, source: Path, shape: tuple[int, ...] | None, dtype) -> torch.Tensor:
    if key not in batch:
        raise ValueError(f"{source}: key '{key}' is missing")
    try:
        value = torch.tensor(batch[key], dtype=dtype)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{source}: key '{key}': not a rectangular numeric array ({exc})") from None
    if shape is not None and tuple(value.shape) != shape:
        raise ValueError(f"{source}: key '{key}' has shape {list(value.shape)}, expected {list(shape)}")
    return value


def load_batch(source: Path) -> dict:
    batch = read_json(source)  # malformed JSON: DataFileError (a ValueError) naming file and line
    if not isinstance(batch, dict):
        raise ValueError(f"{source}: the top level must be an object")
    return batch


def _method(label_or_name: str, overrides: list[str]):
    from methods.registry import get_method_class

    method_overrides = [o for o in overrides if not o.startswith("ctx.")]
    if (CONFIG_DIR / "method" / f"{label_or_name}.yaml").is_file():
        spec = load_method(label_or_name, method_overrides)
        return get_method_class(spec.name)(spec.params)
    cls = get_method_class(label_or_name)
    config = dataclasses.asdict(cls.Config()) if dataclasses.is_dataclass(cls.Config) else {}
    from omegaconf import OmegaConf

    merged = OmegaConf.merge(OmegaConf.structured(cls.Config(**config)), parse_overrides(method_overrides))
    return cls(OmegaConf.to_object(merged))


def finite_or_null(value, key: str, found: list[str]):
    """``value`` with NaN and infinite floats replaced by None; their keys (``weights[3][7]``) appended to
    ``found``."""
    if isinstance(value, float) and not math.isfinite(value):
        found.append(key)
        return None
    if isinstance(value, dict):
        return {k: finite_or_null(v, f"{key}.{k}" if key else str(k), found) for k, v in value.items()}
    if isinstance(value, list):
        return [finite_or_null(v, f"{key}[{i}]", found) for i, v in enumerate(value)]
    return value


def inspect_batch(label_or_name: str, batch_file: Path, out_file: Path, overrides: list[str]) -> dict:
    raw = load_batch(batch_file)
    ids = _tensor(raw, "completion_ids", batch_file, None, torch.long)
    if ids.dim() != 2:
        raise ValueError(f"{batch_file}: key 'completion_ids' must be int[B][T]")
    B, T = ids.shape
    mask = _tensor(raw, "completion_mask", batch_file, (B, T), torch.float32)
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError(f"{batch_file}: key 'completion_mask' must hold only 0 and 1")
    rewards = _tensor(raw, "rewards", batch_file, (B,), torch.float32)
    group_ids = _tensor(raw, "group_ids", batch_file, (B,), torch.long)
    logp = _tensor(raw, "logp", batch_file, (B, T), torch.float32)
    optional = {k: _tensor(raw, k, batch_file, (B, T), torch.float32)
                for k in ("old_logp", *STATISTICS) if k in raw}
    progress = float(raw.get("progress", 0.0))
    if not 0.0 <= progress <= 1.0:
        raise ValueError(f"{batch_file}: key 'progress' must be in [0, 1], got {progress}")
    settings = {k: raw[k] for k in BATCH_STEP_KEYS if k in raw}
    settings.update({k.removeprefix("ctx."): v for k, v in parse_overrides(
        [o for o in overrides if o.startswith("ctx.")]).get("ctx", {}).items()})
    unknown = set(settings) - set(BATCH_STEP_KEYS)
    if unknown:
        raise ConfigError(f"unknown step setting(s) {sorted(unknown)}; allowed: {list(BATCH_STEP_KEYS)}")
    step = int(settings.pop("step", 0))
    # the schema's defaults, the batch's width as max_completion_length, then the file's keys and the overrides
    step_settings = StepSettings.of(TrainConfig()).replace(max_completion_length=T).replace(**settings)
    ctx = step_settings.context(progress=progress, step=step, seed=int(raw.get("seed", 0)))
    loss_config = step_settings.loss_config()
    method = _method(label_or_name, overrides)
    missing = sorted(name for name in statistics_read(method, ctx.beta) if name not in optional)
    if missing:
        kl = f" (beta = {ctx.beta} > 0: the KL term reads ref_logp)" if "ref_logp" in missing and ctx.beta > 0 else ""
        raise ValueError(f"{batch_file}: method {method.name!r} needs key(s) {missing}{kl}")
    special = tuple(int(i) for i in raw.get("special_token_ids", DEFAULT_SPECIAL_TOKEN_IDS))
    batch = new_rollout_batch(ids, mask, rewards, group_ids, str(step_settings.scale_rewards), special)

    def stats_for(prepared: PreparedBatch) -> TokenStats:
        def cut(x):
            return None if x is None else x[prepared.rows][:, :prepared.length]

        return TokenStats(logp=cut(logp), old_logp=cut(optional.get("old_logp", logp)),
                          entropy=cut(optional.get("entropy")), sum_p2=cut(optional.get("sum_p2")),
                          ref_logp=cut(optional.get("ref_logp")))

    result = run_hooks(method, batch, stats_for, ctx, loss_config)
    clipped = [f"clip_ratio/{region}_mean" for region in ("low", "high", "dual")]
    output = {"method": method.name, "advantages": result.advantages.tolist(), "weights": result.weights.tolist(),
              "keep": result.keep.int().tolist(), "denominator": result.denominator, "metrics": result.metrics,
              "loss": result.loss, "clip_fraction": sum(result.loss_metrics[k] for k in clipped),
              "loss_metrics": result.loss_metrics}
    non_finite: list[str] = []
    output = finite_or_null(output, "", non_finite)
    output["non_finite"] = non_finite
    write_json_atomic(out_file, output)
    return output
