"""One eval process for several checkpoints of a run (eval.job_scope=run) gives exactly what a process per
checkpoint gives, and every job's ``startup:`` line is what bench/sweep_breakdown.py reads."""

import json
import shutil
import sys

import pytest
import yaml

from harness.cli import main, mark_startup
from harness.config.paths import REPO_ROOT


def _eval_sweep(tmp_path, tiny_sweep, tiny_model_dir):
    """The tiny sweep's data, a run `x` whose ckpt-050 is the warm start and ckpt-100 the random tiny model."""
    overrides, paths = tiny_sweep
    sweep = {"name": "tiny", "preset": "tiny", "methods": ["uniform"], "seeds": [0],
             "results_dir": str(tmp_path / "results")}
    for item in overrides:
        key, value = item.split("=", 1)
        if key != "results_dir":
            node = sweep
            *parents, leaf = key.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = yaml.safe_load(value)
    sweep["eval"] = {"k": 2, "max_gen_toks": 12}
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text(yaml.safe_dump(sweep))
    root = tmp_path / "results" / "tiny"
    shutil.copytree(paths.data_dir, root / "data")
    run = root / "runs" / "x" / "seed0"
    shutil.copytree(paths.warmstart_dir, run / "ckpt-050")
    shutil.copytree(tiny_model_dir, run / "ckpt-100")
    return sweep_file, root


@pytest.mark.slow
def test_checkpoints_in_one_process_equal_one_process_each(tmp_path, tiny_sweep, tiny_model_dir, capfd):
    sweep_file, root = _eval_sweep(tmp_path, tiny_sweep, tiny_model_dir)
    common = ["--sweep", str(sweep_file), "--label", "x", "--seed", "0"]
    assert main(["eval", *common, "--ckpt", "ckpt-050", "ckpt-100"]) == 0
    # ckpt-100 alone, as the first (and only) evaluation of its call: what a process of its own computes
    assert main(["eval", *common, "--ckpt", "ckpt-100", "--out", str(tmp_path / "alone")]) == 0
    err = capfd.readouterr().err
    assert err.count("startup: command=eval ") == 2
    metrics = {}
    for bench in ("arith", "arith_ood"):
        together = root / "eval" / "x" / "seed0" / "ckpt-100" / bench
        alone = tmp_path / "alone" / bench
        assert (together / "samples.jsonl").read_text() == (alone / "samples.jsonl").read_text()
        metrics[bench] = json.loads((together / "results.json").read_text())["metrics"]
        assert metrics[bench] == json.loads((alone / "results.json").read_text())["metrics"]
        assert (root / "eval" / "x" / "seed0" / "ckpt-050" / bench / "results.json").is_file()
    # the two checkpoints are different models, so the comparison above is not between identical outputs
    first = root / "eval" / "x" / "seed0" / "ckpt-050" / "arith" / "samples.jsonl"
    assert first.read_text() != (root / "eval" / "x" / "seed0" / "ckpt-100" / "arith" / "samples.jsonl").read_text()


def test_model_dir_takes_one_checkpoint(tmp_path, capsys):
    code = main(["eval", "--model-dir", str(tmp_path), "--ckpt", "ckpt-050", "ckpt-100"])
    assert code == 2 and "--model-dir evaluates one model" in capsys.readouterr().err


def test_startup_line_is_read_by_the_sweep_breakdown(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO_ROOT / "bench"))
    sys.modules.pop("sweep_breakdown", None)
    import sweep_breakdown

    mark_startup("eval")
    line = capsys.readouterr().err
    assert line.startswith("startup: command=eval cpu_s=")
    bench, logs = tmp_path / "benchmarks", tmp_path / "logs"
    (bench / "eval").mkdir(parents=True)
    (logs / "eval").mkdir(parents=True)
    (bench / "eval" / "x_seed0.tsv").write_text("s\th:m:s\tmax_rss\tcpu_time\n12.5\t0:00:12\t600\t11.0\n")
    (logs / "eval" / "x_seed0.log").write_text("some lm-eval output\n" + line + "more\n")
    (logs / "data.log").write_text("startup: command=data cpu_s=1.500 wall_s=2.25 torch_threads=n/a\n")
    (logs / "report.log").write_text("a log from before the startup line\n")
    jobs = sweep_breakdown.read_benchmarks(bench, logs)
    by_rule = {j["rule"]: j for j in jobs}
    assert set(by_rule) == {"eval", "data"}
    cpu = float(line.split("cpu_s=")[1].split()[0])
    assert by_rule["eval"]["startup_cpu_s"] == pytest.approx(cpu) and by_rule["eval"]["s"] == 12.5
    assert by_rule["data"] == {**by_rule["data"], "s": None, "startup_cpu_s": 1.5, "startup_wall_s": 2.25,
                               "torch_threads": None}
    rules = sweep_breakdown.group(jobs, "rule")
    assert rules["data"]["jobs"] == 1 and rules["data"]["startup_wall_s"] == 2.25
    assert rules["eval"]["jobs"] == 1 and rules["eval"]["total_s"] == 12.5


def test_sweep_breakdown_counts_the_seconds_each_number_of_jobs_ran(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO_ROOT / "bench"))
    sys.modules.pop("sweep_breakdown", None)
    import sweep_breakdown

    log = "\n".join([  # a train job 0-10 s, an eval job 5-20 s, the target rule `all` at 20 s
        "[Mon Nov 30 10:00:00 2026]", "rule train:", "    jobid: 3", "[Mon Nov 30 10:00:05 2026]",
        "localrule eval:", "    jobid: 4", "[Mon Nov 30 10:00:10 2026]", "Finished jobid: 3 (Rule: train)",
        "[Mon Nov 30 10:00:20 2026]", "Finished jobid: 4 (Rule: eval)", "localrule all:", "    jobid: 0",
        "[Mon Nov 30 10:00:20 2026]", "Finished jobid: 0 (Rule: all)"])
    assert sweep_breakdown.running_jobs_timeline(log) == {1: 15, 2: 5}
    assert sweep_breakdown.running_jobs_timeline("no jobs") == {}
