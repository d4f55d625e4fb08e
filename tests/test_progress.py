"""Budget progress of a running job (harness/train/progress.py) and `harness progress` over a sweep
(harness/ops/progress.py)."""

import io
import json

from harness.cli import main
from harness.ops.progress import STALE_AFTER_S, format_progress, job_progress
from harness.train.progress import PROGRESS_FILE, ProgressLog, eta_seconds


def test_eta_extrapolates_this_process_rate():
    assert eta_seconds(spent_now=40.0, spent_at_start=20.0, amount=100.0, elapsed_s=10.0) == 30.0
    assert eta_seconds(spent_now=20.0, spent_at_start=20.0, amount=100.0, elapsed_s=10.0) is None


def test_progress_log_writes_the_file_every_step_and_a_line_per_interval(tmp_path):
    stream = io.StringIO()
    log = ProgressLog(tmp_path, "flops", 1e11, spent_at_start=0.0, every_s=3600, stream=stream)
    log.update(step=12, spent=3.75e10)
    log.update(step=13, spent=4.0e10)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1  # the first update logs, the next one falls within the interval
    assert lines[0].startswith("budget 37.5% (3.75e+10/1e+11 flops), step 12, elapsed ")
    assert "ETA " in lines[0]
    saved = json.loads((tmp_path / PROGRESS_FILE).read_text())
    assert saved["step"] == 13 and saved["fraction"] == 0.4 and saved["eta_s"] > 0


def test_job_states_and_the_table(tmp_path):
    done, running, stalled, pending = (tmp_path / name for name in ("done", "running", "stalled", "pending"))
    for folder in (done, running, stalled, pending):
        folder.mkdir()
    for folder in (done, running, stalled):
        ProgressLog(folder, "steps", 10, 0.0, stream=io.StringIO()).update(step=5, spent=5)
    (done / "run.json").write_text("{}")
    now = json.loads((stalled / PROGRESS_FILE).read_text())["updated_unix"] + STALE_AFTER_S + 1
    states = {f.name: job_progress(f, now)["state"] for f in (done, running, stalled, pending)}
    assert states == {"done": "done", "running": "stalled", "stalled": "stalled", "pending": "pending"}
    assert job_progress(running, now - STALE_AFTER_S)["state"] == "running"
    table = format_progress([{"label": "uniform", "seed": 0, **job_progress(running, now - STALE_AFTER_S)},
                             {"label": "nat", "seed": 1, **job_progress(pending, now)}])
    assert "uniform" in table and "50.0%" in table and table.splitlines()[-1] == "1 pending, 1 running"


def test_progress_command_lists_every_job_of_the_sweep(tmp_path, capsys):
    assert main(["progress", "--set", f"results_dir={tmp_path}"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == "16 pending"  # the default sweep: 8 labels x 2 seeds, none started
