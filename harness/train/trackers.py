"""Experiment trackers a run logs to besides metrics.jsonl (``train.report_to``): the same records under the same
names, one per optimizer step, and the run's configuration; then, from the eval jobs, each checkpoint's eval scores
at the optimizer step the checkpoint was saved at (``log_eval_scores``). TensorBoard event files
(``<run>/tensorboard``), Weights & Biases (``<run>/wandb``), MLflow with a local file store (``<run>/mlruns``;
``mlflow ui --backend-store-uri <run>/mlruns``). wandb and mlflow are optional (``pip install -e .[trackers]``);
TensorBoard comes with the harness.

Weights & Biases (``train.wandb_mode``). Offline by default: nothing leaves the machine unless asked (``wandb sync``
on the offline-run folders under ``<run>/wandb`` uploads them later). Online logs live and needs credentials
(WANDB_API_KEY, or the netrc entry ``wandb login`` writes): a job without them stops at its start naming the key
(``check_trackers``), before wandb could wait at a prompt for one. Both modes: group = the sweep, job type = the label,
name = ``seed<N>``, project = WANDB_PROJECT (default tokentarget-harness). A run's id is drawn when it starts afresh
and kept in ``<run>/wandb/run_id``: a job resumed from a trainer checkpoint continues the same W&B run, a run
started afresh (its tracker folders cleared) gets a new one, so it never appends to an earlier attempt's history.

Eval scores (``eval_scalars``): every finite number of each benchmark's results.json ``metrics`` as
``eval/<bench>/<metric>`` (fractions, as results.json: avg@k, pass@j, maj@k, greedy accuracy, lengths, counts), and
the unweighted mean over the sweep's benchmarks of the accuracy metrics as ``eval/mean/<metric>``, at the optimizer
step run.json records for the checkpoint (``budget.checkpoints``). The eval jobs of a run's checkpoints may run at
once (``eval.job_scope: checkpoint`` on a cluster), and the files of a tracker must have one writer; so an eval job
never writes into the training run's files nor into another eval job's:

- TensorBoard: an event-file folder per checkpoint, ``<run>/tensorboard/eval/<ckpt>/`` (a rerun of the checkpoint's
  eval replaces it); ``tensorboard --logdir results/<sweep>/runs`` lists each as a run beside the training run, and
  charts a tag's points of all checkpoints together;
- Weights & Biases: one W&B run resumed by several processes at once is not safe, so each checkpoint's scores are a
  run of their own in the training run's group: job type ``<label>-eval``, name ``seed<N>``, id ``<training run
  id>-eval-<ckpt>`` (a rerun of that eval continues it), config ``ckpt``, ``step`` and ``train_run_id``, the
  checkpoint's optimizer step as the x-axis of every ``eval/*`` chart (the metric ``train/step``); offline files in
  ``<run>/wandb/eval/<ckpt>/``;
- MLflow: a run per checkpoint in the training run's store, nested under the training run (tag
  ``mlflow.parentRunId``), named ``<training run name>/eval/<ckpt>``, metrics at the checkpoint's step with ``@``
  spelt ``_at_`` (MLflow refuses ``@`` in a name); nothing is logged when the run has no MLflow store (mlflow was not
  in report_to when it trained).

The warm start and released checkpoints (no training run, no step) are not logged. A tracker that fails to log a
checkpoint's scores is reported in the eval job's log without failing the job: results.json holds the scores.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import re
import secrets
import shutil
from netrc import NetrcParseError, netrc
from pathlib import Path
from urllib.parse import urlsplit

from harness.data.files import write_text_atomic
from harness.data.score_names import GREEDY_ACCURACY, SAMPLED_PREFIXES

TRACKER_FOLDERS = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlruns"}
TRACKER_PACKAGES = {"wandb": "wandb", "mlflow": "mlflow"}  # the optional ones (the trackers extra)
WANDB_MODES = ("offline", "online")
WANDB_PROJECT = "tokentarget-harness"  # unless WANDB_PROJECT says otherwise
WANDB_HOST = "https://api.wandb.ai"  # unless WANDB_BASE_URL says otherwise
WANDB_RUN_ID_FILE = "run_id"  # in <run>/wandb: the training run's W&B id (module docstring)
EVAL_FOLDER = "eval"  # in a tracker's folder: one sub-folder per checkpoint's eval scores
EVAL_STEP_METRIC = "train/step"  # the x-axis of the eval scores in W&B
SCORE_PREFIXES = (*SAMPLED_PREFIXES, GREEDY_ACCURACY)  # results.json metrics averaged over benchmarks
MLFLOW_EXPERIMENT = "0"  # MLflow's default experiment, where mlflow.start_run puts a run without one


def tracker_run_name(sweep: str, label: str, seed: int | str) -> str:
    """The name a run's trackers know it by: ``<sweep>/<label>/seed<N>`` (``run_parts`` reads it back)."""
    return f"{sweep}/{label}/seed{seed}"


def run_parts(name: str) -> tuple[str | None, str | None, str]:
    """(group, job type, name) of a run named ``<sweep>/<label>/seed<N>``: (sweep, label, ``seed<N>``); a name of
    another shape is the name alone."""
    parts = name.split("/")
    return (parts[0], parts[1], parts[2]) if len(parts) == 3 else (None, None, name)


def scalars(record: dict) -> dict[str, float]:
    """The finite numbers of a metrics.jsonl record but its step: what trackers plot."""
    return {k: float(v) for k, v in record.items()
            if k != "step" and isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)}


class TensorBoardTracker:
    """Event files in ``folder``; a resumed run first drops the events after the step it resumed from."""

    def __init__(self, folder: Path, name: str, config: dict, config_yaml: str, resumed_step: int):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(folder), purge_step=resumed_step + 1 if resumed_step else None)
        if not resumed_step:
            self.writer.add_text("config", f"run {name}\n\n```yaml\n{config_yaml}```")

    def log(self, record: dict) -> None:
        for key, value in scalars(record).items():
            self.writer.add_scalar(key, value, record["step"])
        self.writer.flush()  # a running sweep's plots stay current

    def close(self) -> None:
        self.writer.close()


def wandb_project() -> str:
    return os.environ.get("WANDB_PROJECT") or WANDB_PROJECT


def _wandb_slug(name: str) -> str:
    """``name`` as the start of a W&B run id (which refuses ``:;,#?/'``)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-")[:48] or "run"


def wandb_run_id(folder: Path, name: str, fresh: bool) -> str:
    """The W&B id of the run in ``folder``: kept in ``folder/run_id`` for a resumed job, drawn anew (``<sweep>-<label>-
    seed<N>-<8 hex>``) and kept there for a run that starts afresh (module docstring)."""
    path = folder / WANDB_RUN_ID_FILE
    if not fresh and path.is_file() and path.read_text().strip():
        return path.read_text().strip()
    run_id = f"{_wandb_slug(name)}-{secrets.token_hex(4)}"
    write_text_atomic(path, run_id + "\n")  # never through a link planted at its name
    return run_id


def wandb_credentials() -> str | None:
    """Where the credentials of an online W&B run would come from: WANDB_API_KEY, WANDB_IDENTITY_TOKEN_FILE, or the
    netrc entry (NETRC, else ~/.netrc) for WANDB_BASE_URL's host that ``wandb login`` writes; None without any."""
    for variable in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE"):
        if os.environ.get(variable, "").strip():
            return variable
    host = urlsplit(os.environ.get("WANDB_BASE_URL") or WANDB_HOST).netloc
    try:
        path = Path(os.environ.get("NETRC") or Path.home() / ".netrc")
        entry = netrc(str(path)).authenticators(host)
    except (OSError, RuntimeError, NetrcParseError):  # RuntimeError: no home directory
        return None
    return str(path) if entry and entry[2] else None


class WandbTracker:
    """A Weights & Biases run in ``folder``, offline or online (``mode``): group = sweep, job type = label, name =
    ``seed<N>``; a resumed job continues the run's id (module docstring)."""

    def __init__(self, folder: Path, name: str, config: dict, config_yaml: str, resumed_step: int,
                 mode: str = "offline"):
        import wandb

        folder.mkdir(parents=True, exist_ok=True)
        group, job_type, run_name = run_parts(name)
        self.run = wandb.init(dir=str(folder), project=wandb_project(), mode=mode,
                              id=wandb_run_id(folder, name, fresh=not resumed_step), resume="allow", group=group,
                              job_type=job_type, name=run_name, config=config)

    def log(self, record: dict) -> None:
        self.run.log(scalars(record), step=record["step"])

    def close(self) -> None:
        self.run.finish()


class MlflowTracker:
    """An MLflow run in a local file store in ``folder``: the configuration as an artifact, the metrics by step."""

    def __init__(self, folder: Path, name: str, config: dict, config_yaml: str, resumed_step: int):
        import mlflow

        self.mlflow = mlflow
        mlflow.set_tracking_uri(folder.resolve().as_uri())
        mlflow.start_run(run_name=name)
        mlflow.log_text(config_yaml, "config.yaml")

    def log(self, record: dict) -> None:
        self.mlflow.log_metrics(scalars(record), step=record["step"])

    def close(self) -> None:
        self.mlflow.end_run()


TRACKERS = {"tensorboard": TensorBoardTracker, "wandb": WandbTracker, "mlflow": MlflowTracker}


def check_trackers(report_to: list[str], wandb_mode: str = "offline") -> None:
    """Refuse at a job's start what would fail or hang later: an unknown tracker, one whose optional package is not
    installed, wandb online without credentials (wandb would ask for a key at a prompt, or fail mid-job)."""
    for key in report_to:
        if key not in TRACKERS:
            raise ValueError(f"key 'train.report_to': {key!r} is not one of {sorted(TRACKERS)}")
        if key in TRACKER_PACKAGES:
            try:
                importlib.import_module(TRACKER_PACKAGES[key])
            except ImportError as exc:
                raise ValueError(f"key 'train.report_to' names {key!r}, which needs the package "
                                 f"{exc.name or TRACKER_PACKAGES[key]!r}: `pip install -e .[trackers]`, or leave it "
                                 "out of train.report_to") from None
    if wandb_mode not in WANDB_MODES:
        raise ValueError(f"key 'train.wandb_mode': {wandb_mode!r} is not one of {list(WANDB_MODES)}")
    if "wandb" in report_to and wandb_mode == "online" and wandb_credentials() is None:
        host = urlsplit(os.environ.get("WANDB_BASE_URL") or WANDB_HOST).netloc
        raise ValueError(f"key 'train.wandb_mode' is online, but no Weights & Biases credentials are configured "
                         f"here: set WANDB_API_KEY where the jobs run, or run `wandb login` (a netrc entry for "
                         f"{host}); or set train.wandb_mode=offline and upload later with `wandb sync`")


def open_trackers(report_to: list[str], run_dir: Path, name: str, config: dict, config_yaml: str,
                  resumed_step: int = 0, wandb_mode: str = "offline") -> list:
    """One tracker per name of ``report_to``, each writing under ``run_dir``; ``name``: ``tracker_run_name``;
    ``resumed_step``: the optimizer step a resumed run continues from (0: a fresh run); ``wandb_mode``:
    ``train.wandb_mode``. A missing optional package or missing W&B credentials are clear errors, before any tracker
    starts (``check_trackers``)."""
    check_trackers(report_to, wandb_mode)
    return [TRACKERS[key](run_dir / TRACKER_FOLDERS[key], name, config, config_yaml, resumed_step,
                          **({"mode": wandb_mode} if key == "wandb" else {}))
            for key in report_to]


# --- eval scores per checkpoint (module docstring) ----------------------------------------------------------------


def checkpoint_step(run_file: Path, ckpt: str) -> int | None:
    """The optimizer step at which the run of ``run_file`` (its run.json) saved ``ckpt``; None without one: no
    run.json (the warm start), a released checkpoint (no step), a checkpoint the run did not save."""
    if not run_file.is_file():
        return None
    step = ((json.loads(run_file.read_text(encoding="utf-8")).get("budget") or {}).get("checkpoints") or {}).get(ckpt)
    return None if isinstance(step, bool) or not isinstance(step, int) else step


def eval_scalars(results: dict[str, dict], mean: bool = True) -> dict[str, float]:
    """One checkpoint's eval scores as tracker scalars from its results.json per benchmark: ``eval/<bench>/<metric>``
    for every finite number of ``metrics``; with ``mean`` (every benchmark of the sweep is in ``results``), the
    unweighted mean over them of each accuracy metric (``SCORE_PREFIXES``) they all have, ``eval/mean/<metric>``."""
    per_bench = {bench: scalars(results[bench]["metrics"]) for bench in sorted(results)}
    out = {f"eval/{bench}/{key}": value for bench, metrics in per_bench.items() for key, value in metrics.items()}
    if mean and per_bench:
        common = set.intersection(*(set(metrics) for metrics in per_bench.values()))
        for key in sorted(k for k in common if k.startswith(SCORE_PREFIXES)):
            out[f"eval/mean/{key}"] = math.fsum(m[key] for m in per_bench.values()) / len(per_bench)
    return out


def _eval_folder(folder: Path, ckpt: str) -> Path:
    """This checkpoint's own folder of eval files, emptied: a rerun of its eval replaces what an earlier one wrote."""
    out = folder / EVAL_FOLDER / ckpt
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    return out


def tensorboard_eval(folder: Path, name: str, ckpt: str, step: int, scores: dict[str, float], mode: str) -> str:
    """The scores as one event file in ``<run>/tensorboard/eval/<ckpt>/``, at ``step``."""
    from torch.utils.tensorboard import SummaryWriter

    out = _eval_folder(folder, ckpt)
    writer = SummaryWriter(str(out))
    for key, value in scores.items():
        writer.add_scalar(key, value, step)
    writer.close()
    return f"tensorboard {out}"


def wandb_eval(folder: Path, name: str, ckpt: str, step: int, scores: dict[str, float], mode: str) -> str:
    """The scores as a W&B run of their own in the training run's group, x-axis ``train/step`` (module docstring)."""
    import wandb

    group, job_type, run_name = run_parts(name)
    id_file = folder / WANDB_RUN_ID_FILE
    train_id = (id_file.read_text().strip() if id_file.is_file() else "") or _wandb_slug(name)
    run = wandb.init(dir=str(_eval_folder(folder, ckpt)), project=wandb_project(), mode=mode,
                     id=f"{train_id}-eval-{ckpt}", resume="allow", group=group,
                     job_type=f"{job_type}-eval" if job_type else "eval", name=run_name, tags=[ckpt],
                     config={"ckpt": ckpt, "step": step, "train_run_id": train_id})
    run.define_metric(EVAL_STEP_METRIC)
    run.define_metric("eval/*", step_metric=EVAL_STEP_METRIC)
    run.log({EVAL_STEP_METRIC: step, **scores})
    run.finish()
    return f"wandb ({mode}) run {train_id}-eval-{ckpt}"


def mlflow_metric_name(key: str) -> str:
    """``key`` as MLflow takes it (letters, digits and ``_-. /:``): ``eval/aime24/avg@16`` ->
    ``eval/aime24/avg_at_16``."""
    return re.sub(r"[^\w\-. /:]", "_", key.replace("@", "_at_"))


def mlflow_eval(folder: Path, name: str, ckpt: str, step: int, scores: dict[str, float], mode: str) -> str:
    """The scores as an MLflow run nested under the training run in its store (module docstring)."""
    if not folder.is_dir():
        return (f"mlflow: nothing logged, {folder} holds no MLflow store (mlflow was not in train.report_to when the "
                "run trained)")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=folder.resolve().as_uri())
    parents = client.search_runs([MLFLOW_EXPERIMENT], filter_string=f"tags.`mlflow.runName` = '{name}'",
                                 order_by=["attributes.start_time DESC"], max_results=1)
    tags = {"ckpt": ckpt, "step": str(step), **({"mlflow.parentRunId": parents[0].info.run_id} if parents else {})}
    run_id = client.create_run(MLFLOW_EXPERIMENT, tags=tags, run_name=f"{name}/eval/{ckpt}").info.run_id
    for key, value in scores.items():
        client.log_metric(run_id, mlflow_metric_name(key), value, step=step)
    client.set_terminated(run_id)
    return f"mlflow run {run_id} in {folder}"


EVAL_LOGGERS = {"tensorboard": tensorboard_eval, "wandb": wandb_eval, "mlflow": mlflow_eval}


def log_eval_scores(report_to: list[str], run_dir: Path, name: str, ckpt: str, step: int, scores: dict[str, float],
                    wandb_mode: str = "offline") -> list[str]:
    """Log one checkpoint's eval scores (``eval_scalars``) at its optimizer ``step`` to every tracker of
    ``report_to``, each into files of this checkpoint's own (module docstring); one line per tracker saying where
    they went, or why they did not (a tracker's failure is reported, not raised: results.json holds the scores)."""
    lines = []
    for key in report_to:
        try:
            lines.append(EVAL_LOGGERS[key](run_dir / TRACKER_FOLDERS[key], name, ckpt, step, scores, wandb_mode))
        except Exception as exc:  # any tracker's error: the eval's results stand
            lines.append(f"{key}: not logged: {type(exc).__name__}: {exc}")
    return lines
