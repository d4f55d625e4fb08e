"""harness/train/step_settings.py: the one place a step's settings are read from the training config."""

import dataclasses

import pytest

from harness.config.schema import TrainConfig
from harness.train.loss import LossConfig
from harness.train.step_settings import STEP_KEYS, StepSettings
from methods.base import StepContext


def test_every_setting_is_a_training_config_key_with_the_schemas_default():
    train = TrainConfig()
    settings = StepSettings.of(train)
    assert all(getattr(settings, key) == getattr(train, key) for key in STEP_KEYS)
    # what a method and the loss see when nothing is set: the schema's defaults, not a second set below it
    assert settings.loss_config() == LossConfig()
    context = settings.context()
    assert all(getattr(context, f.name) == getattr(settings, f.name)
               for f in dataclasses.fields(StepContext) if f.name in STEP_KEYS)


def test_context_and_loss_carry_a_changed_setting():
    settings = StepSettings.of(TrainConfig(clip_eps_high=0.5, beta=0.1, kl_estimator="k1", clip_ratio_c=3.0))
    ctx = settings.context(progress=0.25, step=3, seed=7, process_index=1)
    assert (ctx.clip_eps_high, ctx.beta, ctx.progress, ctx.step, ctx.seed, ctx.process_index) == (0.5, 0.1, 0.25, 3,
                                                                                                  7, 1)
    assert settings.loss_config() == LossConfig(clip_eps_high=0.5, beta=0.1, kl_estimator="k1", clip_ratio_c=3.0)


def test_a_batch_files_keys_replace_settings_and_unknown_ones_are_named():
    settings = StepSettings.of(TrainConfig()).replace(aggregation="seq-mean-token-mean", max_completion_length=5)
    assert settings.context().aggregation == "seq-mean-token-mean" and settings.context().max_completion_length == 5
    with pytest.raises(ValueError, match=r"unknown step setting\(s\) \['clip_eps'\]; allowed: \['clip_eps_low'"):
        settings.replace(clip_eps=0.1)


def test_the_sample_batch_records_what_a_methods_selection_reads():
    record = StepSettings.of(TrainConfig(beta=0.1)).method_record()
    assert set(record) == {"aggregation", "scale_rewards", "clip_eps_low", "clip_eps_high", "max_completion_length"}
    assert set(record) <= set(STEP_KEYS)  # harness inspect reads them back as step keys
