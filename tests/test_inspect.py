"""`harness inspect`: the public batch format in, advantages/weights/keep/denominator out."""

import json
import math

import pytest
import torch

from harness.cli import main
from harness.ops.inspect_batch import inspect_batch

BATCH = {
    "completion_ids": [[5, 6, 7, 0], [5, 8, 0, 0], [9, 9, 9, 9], [4, 4, 0, 0]],
    "completion_mask": [[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]],
    "rewards": [1.0, 0.0, 1.0, 1.0],
    "group_ids": [0, 0, 1, 1],
    "logp": [[-0.1, -0.2, -0.3, 0.0], [-1.0, -2.0, 0.0, 0.0], [-0.5] * 4, [-0.4, -0.4, 0.0, 0.0]],
    "entropy": [[0.5, 1.5, 0.2, 0.0], [1.0, 2.0, 0.0, 0.0], [0.3] * 4, [0.9, 0.1, 0.0, 0.0]],
    "progress": 0.0,
    "seed": 0,
}


def run(tmp_path, method="uniform", batch=BATCH, overrides=()):
    source = tmp_path / "batch.json"
    source.write_text(json.dumps(batch))
    return inspect_batch(method, source, tmp_path / "out.json", list(overrides))


def test_uniform_is_grpo_token_mean(tmp_path):
    out = run(tmp_path)
    mask = torch.tensor(BATCH["completion_mask"], dtype=torch.float32)
    # group 0: rewards (1, 0): mean 0.5, unbiased std 0.7071 -> +-0.7071; group 1 all correct -> 0
    expected_rollout = torch.tensor([0.5 / (0.5**0.5 + 1e-6), -0.5 / (0.5**0.5 + 1e-6), 0.0, 0.0])
    torch.testing.assert_close(torch.tensor(out["advantages"]), expected_rollout[:, None] * mask)
    torch.testing.assert_close(torch.tensor(out["weights"]), mask)
    assert out["keep"] == [1, 1, 1, 1]
    assert out["denominator"] == pytest.approx(11.0)
    assert json.loads((tmp_path / "out.json").read_text())["denominator"] == out["denominator"]


@pytest.mark.parametrize("aggregation, denominator", [("seq-mean-token-mean", 4.0), ("seq-mean-token-sum-norm", 16.0)])
def test_aggregation_switches(tmp_path, aggregation, denominator):
    out = run(tmp_path, overrides=[f"ctx.aggregation={aggregation}"])
    assert out["denominator"] == pytest.approx(denominator)
    if aggregation == "seq-mean-token-mean":
        assert out["weights"][0][:3] == pytest.approx([1 / 3] * 3)


def test_dr_grpo_scale_none(tmp_path):
    out = run(tmp_path, batch={**BATCH, "scale_rewards": "none"})
    assert out["advantages"][0][0] == pytest.approx(0.5) and out["advantages"][1][0] == pytest.approx(-0.5)


@pytest.mark.parametrize("change, message", [
    ({"rewards": [1.0, 0.0]}, "key 'rewards' has shape \\[2\\], expected \\[4\\]"),
    ({"completion_mask": [[1, 2, 1, 0]] * 4}, "only 0 and 1"),
    ({"progress": 1.5}, "progress"),
    ({"logp": None}, "'logp'"),
])
def test_bad_batches_name_the_key(tmp_path, change, message):
    batch = {**BATCH, **change}
    if change.get("logp", 0) is None:
        del batch["logp"]
    with pytest.raises(ValueError, match=message):
        run(tmp_path, batch=batch)


def test_method_needing_entropy_without_it_is_an_error(tmp_path):
    batch = {k: v for k, v in BATCH.items() if k != "entropy"}
    with pytest.raises(ValueError, match="needs key"):
        run(tmp_path, method="entropy", batch=batch)


def test_gmts_with_beta_needs_ref_logp(tmp_path):
    with pytest.raises(ValueError, match=r"needs key\(s\) \['ref_logp'\]"):
        run(tmp_path, method="gmts", batch={**BATCH, "beta": 0.1})


def test_cli_inspect_every_registered_method(tmp_path, capsys):
    from methods.registry import registered_methods

    source = tmp_path / "batch.json"
    source.write_text(json.dumps({**BATCH, "sum_p2": [[0.5] * 4] * 4, "ref_logp": BATCH["logp"]}))
    for name in registered_methods():
        assert main(["inspect", name, "--batch", str(source), "--out", str(tmp_path / f"{name}.json")]) == 0
        out = json.loads((tmp_path / f"{name}.json").read_text())
        assert len(out["weights"]) == 4 and len(out["keep"]) == 4


def test_cli_unknown_method_lists_registered(tmp_path, capsys):
    source = tmp_path / "batch.json"
    source.write_text(json.dumps(BATCH))
    assert main(["inspect", "gmtz", "--batch", str(source), "--out", str(tmp_path / "o.json")]) == 2
    err = capsys.readouterr().err
    assert "unknown method 'gmtz'" in err and "uniform" in err


LOSS_BATCH = {
    "completion_ids": [[5, 6], [7, 8]], "completion_mask": [[1, 1], [1, 1]], "rewards": [1.0, 0.0],
    "group_ids": [0, 0], "logp": [[math.log(0.5)] * 2] * 2, "entropy": [[1.0, 1.0]] * 2,
    # rollout policy: row 0 had p = 0.25 (r = 2, A > 0: clipped high); row 1 p = 0.5 (r = 1) and p = 0.05 (r = 10)
    "old_logp": [[math.log(0.25)] * 2, [math.log(0.5), math.log(0.05)]],
}


def test_the_loss_is_the_trainers_with_clip_high_and_dual_clip_by_hand(tmp_path):
    a = 0.5 / (0.5**0.5 + 1e-6)  # group advantages +-a
    out = run(tmp_path, batch={**LOSS_BATCH, "clip_ratio_c": 3.0})
    # token losses: row 0: -a * 1.28 twice (clip high); row 1: +a * 1 (r = 1), then A < 0 at r = 10 > c: +a * 3
    assert out["loss"] == pytest.approx((-2 * 1.28 * a + a + 3 * a) / 4, rel=1e-6)
    assert out["clip_fraction"] == pytest.approx(3 / 4)
    assert out["loss_metrics"]["clip_ratio/dual_mean"] == pytest.approx(1 / 4)
    no_dual = run(tmp_path, batch=LOSS_BATCH)  # without dual-clip the r = 10 token pays -A r = 10 a
    assert no_dual["loss"] == pytest.approx((-2 * 1.28 * a + a + 10 * a) / 4, rel=1e-6)
    assert no_dual["clip_fraction"] == pytest.approx(2 / 4)


def test_the_kl_term_by_hand_and_a_missing_reference_is_refused(tmp_path):
    ref = [[math.log(0.25)] * 2] * 2  # log(pi_ref / pi_theta) = log 0.5 everywhere
    batch = {**LOSS_BATCH, "old_logp": LOSS_BATCH["logp"], "ref_logp": ref, "beta": 0.1}
    out = run(tmp_path, batch=batch)
    k3 = 0.5 - math.log(0.5) - 1  # exp(x) - x - 1 at x = log 0.5
    assert out["loss"] == pytest.approx(0.1 * k3, rel=1e-6)  # r = 1: the policy terms cancel (+-a, equal lengths)
    k1 = run(tmp_path, batch={**batch, "kl_estimator": "k1"})
    assert k1["loss"] == pytest.approx(0.1 * -math.log(0.5), rel=1e-6)  # logp - ref_logp = log 2
    assert out["loss_metrics"]["kl"] == pytest.approx(k3, rel=1e-6)
    with pytest.raises(ValueError, match=r"needs key\(s\) \['ref_logp'\] \(beta"):
        run(tmp_path, batch={**LOSS_BATCH, "beta": 0.1})
    with pytest.raises(ValueError, match="clip_ratio_c must be > 1"):
        run(tmp_path, batch={**LOSS_BATCH, "clip_ratio_c": 1.0})


def test_step_settings_in_the_batch_and_on_the_command_line(tmp_path):
    # a trainer's sample_batch.json carries max_completion_length; a ctx. override may set it too
    seq = {**BATCH, "aggregation": "seq-mean-token-sum-norm", "max_completion_length": 8}
    assert run(tmp_path, batch=seq)["denominator"] == pytest.approx(4 * 8)
    assert run(tmp_path, batch=seq, overrides=["ctx.max_completion_length=5"])["denominator"] == pytest.approx(4 * 5)
    assert run(tmp_path, batch={**BATCH, "aggregation": "seq-mean-token-sum-norm"})["denominator"] == 4 * 4  # T


def test_a_malformed_batch_file_names_file_and_line(tmp_path):
    source = tmp_path / "batch.json"
    source.write_text('{"completion_ids": [[1]],\n "rewards": [1.0,\n')
    with pytest.raises(ValueError, match=r"batch\.json:3: malformed JSON"):
        inspect_batch("uniform", source, tmp_path / "out.json", [])
