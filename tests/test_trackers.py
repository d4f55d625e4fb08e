"""Trackers (harness/train/trackers.py): a run's TensorBoard event files hold metrics.jsonl's numbers under the same
names and its config; unknown or uninstalled trackers are clear errors; Weights & Biases runs (against a fake
`wandb`, and the real one when the trackers extra is installed) are grouped by sweep and label, continue their id
when resumed and need credentials online; each checkpoint's eval scores reach every tracker at the checkpoint's
step, in files of their own."""

import importlib.util
import json
import re
import sys

import pytest

from harness.config.loading import load_method, resolve
from harness.config.schema import ConfigError
from harness.train.run import run_training
from harness.train.trackers import (
    check_trackers,
    checkpoint_step,
    eval_scalars,
    log_eval_scores,
    open_trackers,
)

SEED = 8  # a seed no other test of the session's tiny sweep trains


def test_tensorboard_events_hold_the_metrics_and_the_config(tiny_sweep):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    overrides, paths = tiny_sweep
    resolved = resolve({"name": "tiny", "preset": "tiny"},
                       [*overrides, "train.budget.amount=3", "train.budget.checkpoint_fractions=[1.0]"])
    assert resolved.preset.train.report_to == ["tensorboard"]  # by default
    run_training(resolved, load_method("uniform"), SEED, paths)
    run_dir = paths.run_dir("uniform", SEED)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0}).Reload()
    tags = set(events.Tags()["scalars"])
    for name in ("loss", "entropy", "budget/flops_total", "tokens/generated_total", "reward"):
        assert name in tags
        scalars = events.Scalars(name)
        assert [e.step for e in scalars] == [m["step"] for m in metrics]
        assert [e.value for e in scalars] == pytest.approx([m[name] for m in metrics], rel=1e-6)  # stored as float32
    config_text = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "learning_rate: 0.0001" in config_text and "cpu_kernels: pinned" in config_text


def test_report_to_names_only_known_trackers(tiny_sweep):
    overrides, _ = tiny_sweep
    with pytest.raises(ConfigError, match="report_to"):
        resolve({"name": "tiny", "preset": "tiny"}, [*overrides, "train.report_to=[tensorboard,neptune]"])


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed")
def test_an_uninstalled_tracker_says_how_to_install_it(tmp_path):
    with pytest.raises(ValueError, match=r"pip install -e \.\[trackers\]"):
        open_trackers(["wandb"], tmp_path, "tiny/uniform/seed0", {}, "")


# --- Weights & Biases modes and eval scores per checkpoint, against a fake `wandb` (no extra needed) --------------


class FakeRun:
    def __init__(self, kwargs):
        self.kwargs, self.id, self.logged, self.metrics, self.finished = kwargs, kwargs["id"], [], [], False

    def log(self, data, step=None):
        self.logged.append((data, step))

    def define_metric(self, name, step_metric=None):
        self.metrics.append((name, step_metric))

    def finish(self):
        self.finished = True


@pytest.fixture
def fake_wandb(monkeypatch, tmp_path):
    """A `wandb` module that records every run it starts; no W&B credentials in the environment."""
    import types

    module = types.ModuleType("wandb")
    module.runs = []

    def init(**kwargs):
        module.runs.append(FakeRun(kwargs))
        return module.runs[-1]

    module.init = init
    monkeypatch.setitem(sys.modules, "wandb", module)
    for variable in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL", "WANDB_PROJECT"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    return module


def test_wandb_runs_are_grouped_by_sweep_and_label_and_a_resumed_job_continues_its_id(fake_wandb, tmp_path):
    [tracker] = open_trackers(["wandb"], tmp_path, "tiny/entropy/seed3", {"lr": 1}, "", 0)
    first = fake_wandb.runs[0].kwargs
    assert {k: first[k] for k in ("mode", "group", "job_type", "name", "resume", "project", "config", "dir")} == {
        "mode": "offline", "group": "tiny", "job_type": "entropy", "name": "seed3", "resume": "allow",
        "project": "tokentarget-harness", "config": {"lr": 1}, "dir": str(tmp_path / "wandb")}
    assert re.fullmatch(r"tiny-entropy-seed3-[0-9a-f]{8}", first["id"])
    assert (tmp_path / "wandb" / "run_id").read_text().strip() == first["id"]
    tracker.log({"step": 2, "loss": 0.5, "flag": True, "nan": float("nan")})
    assert fake_wandb.runs[0].logged == [({"loss": 0.5}, 2)]
    open_trackers(["wandb"], tmp_path, "tiny/entropy/seed3", {}, "", resumed_step=4)  # resumed: the same W&B run
    assert fake_wandb.runs[1].kwargs["id"] == first["id"]
    open_trackers(["wandb"], tmp_path, "tiny/entropy/seed3", {}, "", 0)  # afresh: a new run, never appended to
    assert fake_wandb.runs[2].kwargs["id"] != first["id"]


def test_wandb_online_needs_credentials_and_says_which_key(fake_wandb, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=r"key 'train.wandb_mode' is online, but no Weights & Biases credentials.*"
                                         r"WANDB_API_KEY.*wandb login.*api\.wandb\.ai.*wandb_mode=offline"):
        open_trackers(["tensorboard", "wandb"], tmp_path, "tiny/uniform/seed0", {}, "", 0, wandb_mode="online")
    assert fake_wandb.runs == [] and not (tmp_path / "tensorboard").exists()  # refused before any tracker started
    open_trackers(["wandb"], tmp_path, "tiny/uniform/seed0", {}, "", 0, wandb_mode="offline")  # offline needs none
    netrc_file = tmp_path / "netrc"
    netrc_file.write_text("machine api.wandb.ai login user password 0123456789abcdef\n")  # what `wandb login` writes
    monkeypatch.setenv("NETRC", str(netrc_file))
    open_trackers(["wandb"], tmp_path, "tiny/uniform/seed0", {}, "", 0, wandb_mode="online")
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.org")  # a key for another server does not count
    with pytest.raises(ValueError, match=r"netrc entry for wandb\.example\.org"):
        check_trackers(["wandb"], "online")
    monkeypatch.setenv("WANDB_API_KEY", "0123456789abcdef")
    open_trackers(["wandb"], tmp_path, "tiny/uniform/seed0", {}, "", 0, wandb_mode="online")
    assert [run.kwargs["mode"] for run in fake_wandb.runs] == ["offline", "online", "online"]
    check_trackers(["tensorboard"], "online")  # wandb not asked for: nothing to check


def test_wandb_mode_is_a_setting_left_out_of_the_training_digest(tiny_sweep):
    from harness.config.snapshot import train_job_config

    overrides, _ = tiny_sweep
    offline = resolve({"name": "tiny", "preset": "tiny"}, overrides)
    assert offline.preset.train.wandb_mode == "offline"  # by default: nothing leaves the machine
    online = resolve({"name": "tiny", "preset": "tiny"}, [*overrides, "train.wandb_mode=online"])
    assert train_job_config(online, load_method("uniform")) == train_job_config(offline, load_method("uniform"))
    with pytest.raises(ConfigError, match="wandb_mode"):
        resolve({"name": "tiny", "preset": "tiny"}, [*overrides, "train.wandb_mode=cloud"])


RESULTS = {  # two benchmarks' results.json metrics: the mean is taken over the accuracy metrics both have
    "arith": {"metrics": {"avg@4": 0.5, "pass@1": 0.5, "pass@4": 0.75, "maj@4": 0.5, "greedy_accuracy": None,
                          "mean_response_tokens": 20.0, "n_gradable": 40, "ungradable": 0}},
    "arith_ood": {"metrics": {"avg@4": 0.25, "pass@1": 0.25, "pass@4": 0.5, "maj@4": 0.0, "greedy_accuracy": 0.3,
                              "mean_response_tokens": 30.0, "n_gradable": 30, "ungradable": 0}},
}


def test_eval_scalars_are_every_metric_and_the_mean_of_the_accuracies():
    scores = eval_scalars(RESULTS)
    assert scores["eval/arith/avg@4"] == 0.5 and scores["eval/arith_ood/greedy_accuracy"] == 0.3
    assert "eval/arith/greedy_accuracy" not in scores  # None: no gradable problem, nothing to plot
    assert scores["eval/arith/n_gradable"] == 40.0
    means = {k: v for k, v in scores.items() if k.startswith("eval/mean/")}
    assert means == {"eval/mean/avg@4": 0.375, "eval/mean/pass@1": 0.375, "eval/mean/pass@4": 0.625,
                     "eval/mean/maj@4": 0.25}  # by hand; no greedy mean (arith has none), no mean of counts
    assert not any(k.startswith("eval/mean/") for k in eval_scalars(RESULTS, mean=False))


def test_checkpoint_step_is_run_jsons_and_none_without_a_training_run(tmp_path):
    run_file = tmp_path / "run.json"
    assert checkpoint_step(run_file, "ckpt-000") is None  # the warm start: no run.json
    run_file.write_text(json.dumps({"budget": {"kind": "released", "checkpoints": {"ckpt-100": None}}}))
    assert checkpoint_step(run_file, "ckpt-100") is None  # a released checkpoint: no step
    run_file.write_text(json.dumps({"budget": {"checkpoints": {"ckpt-050": 3, "ckpt-100": 7}}}))
    assert (checkpoint_step(run_file, "ckpt-050"), checkpoint_step(run_file, "ckpt-075")) == (3, None)


def tensorboard_scalars(folder) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0}).Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_each_checkpoints_scores_go_to_files_of_its_own_at_its_step(fake_wandb, tmp_path):
    """Eval jobs of two checkpoints (on a cluster: at once) write separate event folders and separate W&B runs of
    the training run's group, each at its checkpoint's optimizer step; a rerun replaces its checkpoint's folder."""
    [train] = open_trackers(["wandb"], tmp_path, "tiny/entropy/seed3", {}, "", 0)
    train_id = fake_wandb.runs[0].kwargs["id"]
    scores = eval_scalars(RESULTS)
    for ckpt, step in (("ckpt-050", 3), ("ckpt-100", 7)):
        lines = log_eval_scores(["tensorboard", "wandb"], tmp_path, "tiny/entropy/seed3", ckpt, step, scores)
        assert lines[0] == f"tensorboard {tmp_path / 'tensorboard' / 'eval' / ckpt}"
        assert lines[1] == f"wandb (offline) run {train_id}-eval-{ckpt}"
    for ckpt, step in (("ckpt-050", 3), ("ckpt-100", 7)):
        folder = tmp_path / "tensorboard" / "eval" / ckpt
        assert len(list(folder.glob("events.out.tfevents.*"))) == 1
        logged = tensorboard_scalars(folder)
        assert set(logged) == set(scores)
        assert logged["eval/mean/avg@4"] == [(step, 0.375)] and logged["eval/arith/pass@4"] == [(step, 0.75)]
    evals = fake_wandb.runs[1:]
    assert [r.kwargs["id"] for r in evals] == [f"{train_id}-eval-ckpt-050", f"{train_id}-eval-ckpt-100"]
    for run, (ckpt, step) in zip(evals, (("ckpt-050", 3), ("ckpt-100", 7)), strict=True):
        assert {k: run.kwargs[k] for k in ("group", "job_type", "name", "mode", "resume", "tags", "config")} == {
            "group": "tiny", "job_type": "entropy-eval", "name": "seed3", "mode": "offline", "resume": "allow",
            "tags": [ckpt], "config": {"ckpt": ckpt, "step": step, "train_run_id": train_id}}
        assert run.kwargs["dir"] == str(tmp_path / "wandb" / "eval" / ckpt)
        assert run.metrics == [("train/step", None), ("eval/*", "train/step")]  # the step as the x-axis
        assert run.logged == [({"train/step": step, **scores}, None)] and run.finished
    (tmp_path / "wandb" / "eval" / "ckpt-050" / "stale").write_text("an earlier eval's offline files")
    log_eval_scores(["tensorboard", "wandb"], tmp_path, "tiny/entropy/seed3", "ckpt-050", 3, {"eval/arith/avg@4": 1.0})
    assert tensorboard_scalars(tmp_path / "tensorboard" / "eval" / "ckpt-050") == {"eval/arith/avg@4": [(3, 1.0)]}
    assert not (tmp_path / "wandb" / "eval" / "ckpt-050" / "stale").exists()
    assert train.run.logged == []  # nothing went into the training run itself


def test_a_tracker_that_fails_to_log_eval_scores_is_reported_not_raised(fake_wandb, tmp_path):
    def broken(**kwargs):
        raise ConnectionError("W&B unreachable")

    fake_wandb.init = broken
    lines = log_eval_scores(["wandb", "tensorboard"], tmp_path, "tiny/uniform/seed0", "ckpt-100", 4,
                            {"eval/arith/avg@4": 0.5})
    assert lines[0] == "wandb: not logged: ConnectionError: W&B unreachable"
    assert tensorboard_scalars(tmp_path / "tensorboard" / "eval" / "ckpt-100") == {"eval/arith/avg@4": [(4, 0.5)]}


def test_mlflow_eval_scores_are_a_run_nested_under_the_training_run(monkeypatch, tmp_path):
    import types

    calls = []

    class Client:
        def __init__(self, tracking_uri):
            calls.append(("client", tracking_uri))

        def search_runs(self, experiment_ids, filter_string, order_by, max_results):
            calls.append(("search", experiment_ids, filter_string))
            return [types.SimpleNamespace(info=types.SimpleNamespace(run_id="parent-id"))]

        def create_run(self, experiment_id, tags, run_name):
            calls.append(("create", experiment_id, tags, run_name))
            return types.SimpleNamespace(info=types.SimpleNamespace(run_id="eval-id"))

        def log_metric(self, run_id, key, value, step):
            calls.append(("metric", run_id, key, value, step))

        def set_terminated(self, run_id):
            calls.append(("end", run_id))

    mlflow, tracking = types.ModuleType("mlflow"), types.ModuleType("mlflow.tracking")
    tracking.MlflowClient = Client
    monkeypatch.setitem(sys.modules, "mlflow", mlflow)
    monkeypatch.setitem(sys.modules, "mlflow.tracking", tracking)
    scores = {"eval/arith/avg@4": 0.5, "eval/mean/pass@2": 0.25}
    [line] = log_eval_scores(["mlflow"], tmp_path, "tiny/uniform/seed0", "ckpt-100", 7, scores)
    assert line.startswith("mlflow: nothing logged") and calls == []  # the run has no MLflow store
    (tmp_path / "mlruns").mkdir()
    [line] = log_eval_scores(["mlflow"], tmp_path, "tiny/uniform/seed0", "ckpt-100", 7, scores)
    assert line == f"mlflow run eval-id in {tmp_path / 'mlruns'}"
    assert calls == [
        ("client", (tmp_path / "mlruns").resolve().as_uri()),
        ("search", ["0"], "tags.`mlflow.runName` = 'tiny/uniform/seed0'"),
        ("create", "0", {"ckpt": "ckpt-100", "step": "7", "mlflow.parentRunId": "parent-id"},
         "tiny/uniform/seed0/eval/ckpt-100"),
        ("metric", "eval-id", "eval/arith/avg_at_4", 0.5, 7), ("metric", "eval-id", "eval/mean/pass_at_2", 0.25, 7),
        ("end", "eval-id")]


def test_an_eval_job_logs_each_checkpoints_scores_at_its_step(tmp_path, tiny_sweep, tiny_model_dir, fake_wandb):
    """`harness eval` of a run's checkpoints logs each one's results.json scores to the run's trackers at the step
    run.json records for it; an evaluation written elsewhere (--out) logs nothing."""
    import yaml
    from test_eval_jobs import _eval_sweep

    from harness.cli import main

    sweep_file, root = _eval_sweep(tmp_path, tiny_sweep, tiny_model_dir)
    sweep = yaml.safe_load(sweep_file.read_text())
    sweep.setdefault("train", {})["report_to"] = ["tensorboard", "wandb"]
    sweep_file.write_text(yaml.safe_dump(sweep))
    run = root / "runs" / "x" / "seed0"
    (run / "run.json").write_text(json.dumps({"budget": {"checkpoints": {"ckpt-050": 3, "ckpt-100": 7}}}))
    common = ["--sweep", str(sweep_file), "--label", "x", "--seed", "0"]
    assert main(["eval", *common, "--ckpt", "ckpt-050", "ckpt-100"]) == 0
    for ckpt, step in (("ckpt-050", 3), ("ckpt-100", 7)):
        results = {bench: json.loads((root / "eval" / "x" / "seed0" / ckpt / bench / "results.json").read_text())
                   for bench in ("arith", "arith_ood")}
        expected = eval_scalars(results)
        logged = tensorboard_scalars(run / "tensorboard" / "eval" / ckpt)
        assert logged.keys() == expected.keys() and "eval/mean/avg@2" in logged
        assert all(logged[k] == [(step, pytest.approx(v, rel=1e-6))] for k, v in expected.items())
    assert [(r.kwargs["id"], r.kwargs["job_type"], r.logged[0][0]["train/step"]) for r in fake_wandb.runs] == [
        ("tiny-x-seed0-eval-ckpt-050", "x-eval", 3), ("tiny-x-seed0-eval-ckpt-100", "x-eval", 7)]  # no run_id file
    assert main(["eval", *common, "--ckpt", "ckpt-100", "--out", str(tmp_path / "alone")]) == 0
    assert len(fake_wandb.runs) == 2


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb is not installed (the trackers extra)")
def test_the_real_wandb_writes_offline_runs_for_training_and_each_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    for variable in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(variable, raising=False)
    [tracker] = open_trackers(["wandb"], tmp_path, "tiny/uniform/seed0", {"lr": 1e-4}, "", 0)
    train_id = tracker.run.id
    assert (tracker.run.group, tracker.run.job_type, tracker.run.name) == ("tiny", "uniform", "seed0")
    tracker.log({"step": 1, "loss": 0.25})
    tracker.close()
    [line] = log_eval_scores(["wandb"], tmp_path, "tiny/uniform/seed0", "ckpt-100", 1, {"eval/arith/avg@4": 0.5})
    assert line == f"wandb (offline) run {train_id}-eval-ckpt-100"
    assert list((tmp_path / "wandb" / "wandb").glob(f"offline-run-*-{train_id}"))
    assert list((tmp_path / "wandb" / "eval" / "ckpt-100" / "wandb").glob(f"offline-run-*-{train_id}-eval-ckpt-100"))
