"""DAPO's soft overlong punishment (harness/train/rewards.py): hand-computed values at the window's boundaries, verl's
DAPORewardManager restated over every reachable length, config errors naming the key, the paper presets, and a tiny
training run whose advantages come from correctness + overlong with both terms in metrics.jsonl."""

import json

import pytest
import torch

from harness.config.loading import load_method, resolve
from harness.config.paths import REPO_ROOT
from harness.config.schema import ConfigError
from harness.train.rewards import overlong_reward, overlong_reward_functions
from methods.base import group_advantages

DEFAULT = REPO_ROOT / "configs" / "sweeps" / "default.yaml"


def rewards(lengths, max_length, buffer, penalty):
    return overlong_reward(torch.tensor(lengths), max_length, buffer, penalty).tolist()


def test_dapo_8020_setting_at_the_boundaries_by_hand():
    # L_max = 20480, L_cache = 4096, factor 1.0: no punishment up to 16384 tokens, then -1/4096 per token
    assert rewards([0, 16384, 16385, 18432, 20479, 20480], 20480, 4096, 1.0) == [
        0.0, 0.0, -1 / 4096, -0.5, -4095 / 4096, -1.0]


def test_ktae_setting_and_a_penalty_factor_by_hand():
    # L_max = 3072, L_cache = 512: the window is 2560 < |o| <= 3072
    assert rewards([2560, 2561, 2816, 3072], 3072, 512, 1.0) == [0.0, -1 / 512, -0.5, -1.0]
    assert rewards([2560, 2561, 3072], 3072, 512, 0.5) == [0.0, -0.5 / 512, -0.5]
    assert rewards([4, 5, 6, 8], 8, 4, 2.0) == [0.0, -0.5, -1.0, -2.0]
    assert rewards([5, 8], 8, 4, 0.0) == [0.0, 0.0]  # factor 0: the term is off


def test_beyond_the_maximum_is_minus_the_factor():
    # DAPO Eq. 13; verl's min(...) would continue the ramp (-4097/4096 at 20481); generation never gets there
    assert rewards([20481, 40000], 20480, 4096, 1.0) == [-1.0, -1.0]
    assert rewards([9], 8, 4, 2.0) == [-2.0]


def verl_overlong_reward(valid_response_length: int, max_resp_len: int, overlong_buffer_len: int,
                         overlong_penalty_factor: float) -> float:
    """verl recipe/dapo DAPORewardManager (verl/workers/reward_manager/dapo.py @003364bc), restated."""
    expected_len = max_resp_len - overlong_buffer_len
    exceed_len = valid_response_length - expected_len
    return min(-exceed_len / overlong_buffer_len * overlong_penalty_factor, 0)


@pytest.mark.parametrize("max_length, buffer, penalty", [(20480, 4096, 1.0), (3072, 512, 1.0), (48, 7, 0.3)])
def test_matches_verl_at_every_reachable_length(max_length, buffer, penalty):
    lengths = list(range(max_length + 1))
    ours = rewards(lengths, max_length, buffer, penalty)
    theirs = [verl_overlong_reward(n, max_length, buffer, penalty) for n in lengths]
    assert ours == pytest.approx(theirs, rel=1e-12, abs=1e-15)


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="buffer"):
        overlong_reward(torch.tensor([1]), 8, 8, 1.0)
    with pytest.raises(ValueError, match="penalty"):
        overlong_reward(torch.tensor([1]), 8, 4, -1.0)


@pytest.mark.parametrize("override, fragment", [
    (["train.overlong.buffer=48"],
     "key 'train.overlong.buffer': 48 must be smaller than train.max_completion_length=48"),
    (["train.overlong.buffer=60"], "key 'train.overlong.buffer': 60 must be smaller"),
    (["train.overlong.buffer=-1"], "key 'train.overlong.buffer': -1 is outside the allowed range"),
    (["train.overlong.buffer=8", "train.overlong.penalty=-0.5"], "key 'train.overlong.penalty': -0.5 is outside"),
])
def test_bad_overlong_config_names_the_key(override, fragment):
    with pytest.raises(ConfigError) as info:
        resolve(DEFAULT, override)
    assert fragment in str(info.value)


def test_off_by_default_so_the_default_sweep_has_one_reward_function():
    train = resolve(DEFAULT).preset.train
    assert (train.overlong.buffer, train.overlong.penalty) == (0, 1.0)
    assert overlong_reward_functions(train) == []
    on = resolve(DEFAULT, ["train.overlong.buffer=8", "train.overlong.penalty=0.5"]).preset.train
    (function,) = overlong_reward_functions(on)
    assert function.__name__ == "overlong"  # TRL's metric: rewards/overlong/mean
    # TRL passes token-id lists; tiny's max_completion_length is 48, so the window is 40 < |o| <= 48
    assert function(prompts=["p"] * 3, completions=["c"] * 3, completion_ids=[[1] * 40, [1] * 44, [1] * 48]) == [
        0.0, -0.25, -0.5]


def test_paper_presets_set_the_dapo_buffers():
    from harness.report.fidelity import load_fidelity

    expected = {"paper-8020": (20480, 4096, 1.0), "paper-ktae": (3072, 512, 1.0), "paper-ktae-grpo": (3072, 0, 1.0)}
    for sweep, (max_length, buffer, penalty) in expected.items():
        resolved = resolve(REPO_ROOT / "configs" / "sweeps" / f"{sweep}.yaml")
        train = resolved.preset.train
        assert (train.max_completion_length, train.overlong.buffer, train.overlong.penalty) == (
            max_length, buffer, penalty), sweep
        fidelity = load_fidelity(REPO_ROOT / "configs" / "fidelity" / f"{sweep}.yaml", resolved)
        assert next(r for r in fidelity.rows if r.element == "overlong").status == "match", sweep


def test_tiny_run_trains_on_correctness_plus_overlong(tiny_sweep, monkeypatch):
    """Two steps of the tiny preset with a 40-token maximum and a 30-token buffer (window 10 < |o| <= 40): TRL's
    per-function rewards hold correctness and the overlong term of each completion's length, the rollout
    advantages are the group advantages of their sum, and metrics.jsonl logs both terms and the sum."""
    from harness.train import actor
    from harness.train.run import run_training
    from harness.train.trl import trainer as adapter

    captured_rewards, captured_batches = [], []
    calculate_rewards, prepare_batch = adapter.TargetedGRPOTrainer._calculate_rewards, actor.prepare_batch

    def spy_rewards(self, *args):
        out = calculate_rewards(self, *args)
        captured_rewards.append(out.detach().cpu().clone())
        return out

    def spy_prepare(method, batch, ctx):
        captured_batches.append({"rewards": batch.rewards.clone(), "advantages": batch.rollout_advantages.clone(),
                                 "lengths": batch.completion_mask.sum(dim=1), "groups": batch.group_ids.clone()})
        return prepare_batch(method, batch, ctx)

    monkeypatch.setattr(adapter.TargetedGRPOTrainer, "_calculate_rewards", spy_rewards)
    monkeypatch.setattr(actor, "prepare_batch", spy_prepare)  # Actor.step_batch's hooks
    overrides, paths = tiny_sweep
    settings = ["train.budget.amount=2", "train.budget.checkpoint_fractions=[1.0]", "train.overlong.buffer=30",
                "train.overlong.penalty=1.0"]
    resolved = resolve({"name": "tiny", "preset": "tiny"}, [*overrides, *settings])
    assert resolved.preset.train.max_completion_length == 40
    run_training(resolved, load_method("uniform"), 0, paths)

    lines = [json.loads(x) for x in (paths.run_dir("uniform", 0) / "metrics.jsonl").open()]
    assert len(lines) == len(captured_rewards) == len(captured_batches) == 2
    differs = False
    for per_func, batch, line in zip(captured_rewards, captured_batches, lines, strict=True):
        assert per_func.shape == (8, 2)  # 2 prompts x 4 rollouts; correctness, overlong
        correct, overlong = per_func[:, 0].double(), per_func[:, 1].double()
        assert set(correct.tolist()) <= {0.0, 1.0}
        expected = overlong_reward(batch["lengths"], 40, 30, 1.0)
        torch.testing.assert_close(overlong, expected, rtol=0, atol=1e-6)
        total = (correct + overlong).float()
        torch.testing.assert_close(batch["rewards"], total)
        torch.testing.assert_close(batch["advantages"], group_advantages(total, batch["groups"]))
        differs |= not torch.allclose(batch["advantages"], group_advantages(correct.float(), batch["groups"]))
        assert line["rewards/overlong/mean"] == pytest.approx(float(overlong.mean()), abs=1e-6)
        assert line["rewards/correct_numeric/mean"] == pytest.approx(float(correct.mean()), abs=1e-6)
        assert line["reward"] == pytest.approx(float(total.mean()), abs=1e-6)
    assert differs, "the overlong term changed no advantage in two steps: the test shows nothing"


def test_the_reward_scoring_pool_size_and_its_use(monkeypatch):
    from harness.train.trl import settings

    train = resolve(DEFAULT, ["train.reward=math_verify"]).preset.train
    monkeypatch.setattr(settings.os, "sched_getaffinity", lambda pid: set(range(16)))
    assert settings.reward_scoring_workers(train, {"LOCAL_WORLD_SIZE": "4"}) == 4  # 16 CPUs over 4 processes
    assert settings.reward_scoring_workers(train, {}) == settings.MAX_SCORING_WORKERS
    assert settings.reward_scoring_workers(train, {"LOCAL_WORLD_SIZE": "32"}) == 1
    train.reward_scoring_workers = 3
    assert settings.reward_scoring_workers(train, {"LOCAL_WORLD_SIZE": "4"}) == 3
    calls = []
    monkeypatch.setattr(settings, "score_batch", lambda *args: calls.append(args) or [])
    settings.reward_function("math_verify", 5.0, workers=3)([], [], [])
    assert calls == [([], [], "math_verify", 5.0, 3)]
