"""Hostile and careless inputs (issue #26 items 6-11): each is refused before any job runs, with an error naming the
file, key or line, and a refused run writes nothing; what is accepted is handled as written (paths with spaces)."""

import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import methods
from harness.cli import main
from harness.config.loading import resolve
from harness.config.paths import CONFIG_DIR, REPO_ROOT
from harness.config.schema import ConfigError
from harness.model.checkpoints import ModelDirError, check_model_dir
from methods import registry

DEFAULT_SWEEP = CONFIG_DIR / "sweeps" / "default.yaml"
SNAKEMAKE = [str(Path(sys.executable).parent / "snakemake"), "-s", str(REPO_ROOT / "Snakefile")]


def refused(capsys, tmp_path, *overrides: str, sweep: Path = DEFAULT_SWEEP) -> str:
    """Run `harness data` (the first job of a sweep, which writes its data) with the overrides; assert it is refused
    and wrote nothing into its results folder; return the error message."""
    results = tmp_path / "results"
    args = ["data", "--sweep", str(sweep), "--set", f"results_dir={results}"]
    status = main([*args, *(a for o in overrides for a in ("--set", o))])
    message = capsys.readouterr().err
    assert status == 2, message
    assert "configuration error" in message and str(sweep) in message
    assert not results.exists() or not any(results.rglob("*")), list(results.rglob("*"))
    return message


@pytest.mark.parametrize(("override", "key"), [
    ("train.learning_rate=nan", "train.learning_rate"),
    ("train.budget.amount=inf", "train.budget.amount"),
    ("eval.scoring_timeout_s=.inf", "eval.scoring_timeout_s"),
    ("train.reward_values.correct=-.inf", "train.reward_values.correct"),
    ("warmstart.learning_rate=.nan", "warmstart.learning_rate"),
    ("train.budget.checkpoint_fractions=[0.5,.nan]", "train.budget.checkpoint_fractions[1]"),
])
def test_nan_and_infinity_are_refused_with_their_key(capsys, tmp_path, override, key):
    message = refused(capsys, tmp_path, override)
    assert f"'{key}'" in message and "NaN and infinity" in message


@pytest.mark.parametrize(("override", "expected"), [
    ("seeds=[0,1,0]", "key 'seeds': [0] listed more than once"),
    ("methods=[uniform,gmts,uniform]", "key 'methods': ['uniform'] listed more than once"),
    ("seeds=[-1,2]", "key 'seeds': [-1] are negative"),
    ("seeds=[]", "key 'seeds': at least one seed"),
    ("methods=[uniform.v2]", "key 'methods': labels ['uniform.v2'] may hold only"),
    ("methods=[warmstart]", "key 'methods': 'warmstart' is the warm start's own row"),
    ("name=../../outside", "key 'name': '../../outside' must be one folder name"),
    ("train.budget.checkpoint_fractions=[0.251,0.254,1.0]", "'train.budget.checkpoint_fractions': [0.251, 0.254, "
                                                            "1.0] name the same checkpoint folder ['ckpt-025']"),
    ("eval.benchmarks.arith.file=data/benchmarks/missing.jsonl",
     f"key 'eval.benchmarks.arith.file': no file {REPO_ROOT / 'data/benchmarks/missing.jsonl'}"),
    ("eval.benchmarks.extra={file: nowhere.jsonl}", "key 'eval.benchmarks.extra.file': no file"),
    ("train=5", "key 'train': Merge error"),
    ("eval.benchmarks.arith=3", "key 'eval.benchmarks.arith': "),
    ("seeds=3", "key 'seeds': expected a list"),
    ("seeds=[9223372036854775808]", "key 'seeds': seed 9223372036854775808 gives the run seeds"),
    ("seeds=[4294967295]", "{'uniform-aa': 4294967395}, but run seeds must be below 4294967296"),
    ("eval.seed=4294967296", "key 'eval.seed': 4294967296 is outside the allowed range [0, 4294967295]"),
])
def test_bad_sweep_values_are_refused_with_their_key(capsys, tmp_path, override, expected):
    assert expected in refused(capsys, tmp_path, override)


def _sweep_without(tmp_path, *keys: str) -> Path:
    raw = yaml.safe_load(DEFAULT_SWEEP.read_text())
    path = tmp_path / "partial.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in raw.items() if k not in keys}))
    return path


def test_a_sweep_without_methods_and_seeds_is_refused_by_harness(capsys, tmp_path):
    message = refused(capsys, tmp_path, sweep=_sweep_without(tmp_path, "methods", "seeds"))
    assert "['methods', 'seeds'] missing" in message


def test_a_sweep_without_methods_is_refused_by_snakemake_too(tmp_path):
    """Snakemake used to merge the default sweep's methods underneath a --configfile (8 x 2 runs where `harness plan`
    said 1 x 1); now it refuses, as harness does, before writing anything."""
    results = tmp_path / "results"
    done = subprocess.run([*SNAKEMAKE, "-n", "--cores", "1", "--configfile", str(_sweep_without(tmp_path, "methods")),
                           "--config", f"results_dir={results}"], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert done.returncode != 0
    assert "['methods'] missing" in done.stdout + done.stderr
    assert not results.exists()


def test_snakemake_refuses_a_label_its_wildcards_would_reject(tmp_path):
    results = tmp_path / "results"
    done = subprocess.run([*SNAKEMAKE, "-n", "--cores", "1", "--config", f"results_dir={results}",
                           "set=methods=[uniform.v2]"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode != 0
    assert "key 'methods': labels ['uniform.v2']" in done.stdout + done.stderr
    assert not results.exists()


def test_a_sweep_name_and_results_path_with_spaces_are_quoted_in_every_job_command(tmp_path):
    raw = yaml.safe_load(DEFAULT_SWEEP.read_text())
    sweep = tmp_path / "with space" / "sweep file.yaml"
    sweep.parent.mkdir()
    sweep.write_text(yaml.safe_dump({**raw, "name": "my sweep", "methods": ["uniform"], "seeds": [0],
                                     "results_dir": str(tmp_path / "results dir")}))
    done = subprocess.run([*SNAKEMAKE, "-n", "--printshellcmds", "--cores", "1", "--configfile", str(sweep)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    root = tmp_path / "results dir" / "my sweep"
    commands = [line.split("Shell command: ", 1)[1] for line in done.stdout.splitlines()
                if "Shell command: " in line and not line.endswith("Shell command: None")]  # rule all runs nothing
    assert {shlex.split(c)[1] for c in commands} == {"data", "warmstart", "train", "eval", "report"}
    for command in commands:
        words = shlex.split(command)
        sweep_file = Path(words[words.index("--sweep") + 1])
        assert sweep_file.is_relative_to(root), command
        log = Path(words[words.index(">") + 1])
        assert log.is_relative_to(root / "logs"), command


def _sweep_with(tmp_path, **sections) -> Path:
    """The default sweep with ``sections`` merged into it (one level deep), as a file."""
    raw = yaml.safe_load(DEFAULT_SWEEP.read_text())
    for key, value in sections.items():
        raw[key] = {**(raw.get(key) or {}), **value}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize("name", ["../../escape", "a/b", "with space", "dot.ted"])
def test_a_benchmark_name_that_is_not_a_label_name_is_refused(capsys, tmp_path, name):
    sweep = _sweep_with(tmp_path, eval={"benchmarks": {name: {"file": "data/benchmarks/amc23.jsonl"}}})
    message = refused(capsys, tmp_path, sweep=sweep)
    assert f"key 'eval.benchmarks': names [{name!r}] may hold only letters, digits, '_' and '-'" in message


ROW = {"id": "r1", "problem": "What is 1+1?", "answer": "2"}


@pytest.mark.parametrize(("content", "expected"), [
    (json.dumps({"id": "r1", "problem": "1+1"}) + "\n", ":1: required key 'answer' is missing"),
    (json.dumps(ROW) + "\n" + json.dumps({**ROW, "id": "r2", "answer": " "}) + "\n", ":2: required key 'answer' is "
                                                                                       "empty"),
    ("\ufeff" + json.dumps(ROW) + "\n", ":1: starts with a UTF-8 byte order mark (BOM)"),
    ("", ": has no rows (0 bytes)"),
    ("\n\n", ": has no rows (2 bytes)"),
    (json.dumps(ROW) + "\n{not json\n", ":2: malformed JSON"),
    (json.dumps(ROW) + "\n[1, 2]\n", ":2: expected a JSON object, got list"),
    (json.dumps(ROW) + "\n" + json.dumps({**ROW, "problem": "2+2"}) + "\n", ": ids ['r1'] repeat"),
])
def test_an_unusable_benchmark_file_is_refused_at_resolve_naming_file_key_and_line(capsys, tmp_path, content,
                                                                                    expected):
    bench = tmp_path / "mine.jsonl"
    bench.write_text(content, encoding="utf-8")
    sweep = _sweep_with(tmp_path, eval={"benchmarks": {"mine": {"file": str(bench)}}})
    message = refused(capsys, tmp_path, sweep=sweep)
    assert f"key 'eval.benchmarks.mine.file': {bench}{expected}" in message


def test_a_training_file_holding_benchmark_problems_is_refused_naming_both_files_and_the_count(capsys, tmp_path):
    bench = REPO_ROOT / "data" / "benchmarks" / "amc23.jsonl"
    rows = [json.loads(line) for line in bench.read_text().splitlines()]
    train = tmp_path / "train.jsonl"
    copied = [{**row, "problem": "  " + row["problem"].upper().replace(" ", "\n")} for row in rows[:3]]  # retyped
    train.write_text("".join(json.dumps(row) + "\n" for row in [*copied, {**ROW, "id": "own"}]))
    sweep = _sweep_with(tmp_path, data={"kind": "jsonl", "train_file": str(train)},
                        eval={"benchmarks": {"amc23": {"file": "data/benchmarks/amc23.jsonl"}}})
    message = refused(capsys, tmp_path, sweep=sweep)
    assert (f"key 'eval.benchmarks.amc23.file': 3 of the 40 problems of {bench} are also in the training file "
            f"{train} (key 'data.train_file'): the runs would train on the test set") in message


def test_a_benchmark_used_as_the_training_file_is_refused(capsys, tmp_path):
    message = refused(capsys, tmp_path, "data.kind=mixed", "data.train_file=data/benchmarks/gsm8k.jsonl",
                      "eval.benchmarks.gsm8k={file: data/benchmarks/gsm8k.jsonl, limit: 20}")
    assert "key 'eval.benchmarks.gsm8k.file': 20 of the 20 problems of" in message


def test_no_shipped_training_file_shares_a_problem_with_a_shipped_benchmark():
    """Every preset's local data passes the overlap check whatever the preset pairs (hub presets fall back to
    data/train/math_train.jsonl with data.kind=jsonl)."""
    from harness.config.inputs import rows_index

    trained = {p: {key for _, key in rows_index(p)} for p in (REPO_ROOT / "data" / "train").glob("*.jsonl")}
    for bench in (REPO_ROOT / "data" / "benchmarks").glob("*.jsonl"):
        for train, keys in trained.items():
            assert not [key for _, key in rows_index(bench) if key in keys], (bench.name, train.name)


def test_hub_presets_resolve_with_their_shipped_training_file():
    for sweep in ("head-to-head", "paper-8020"):
        resolved = resolve(CONFIG_DIR / "sweeps" / f"{sweep}.yaml", ["data.kind=jsonl"])
        assert resolved.preset.data.train_file == "data/train/math_train.jsonl"


def test_run_seeds_stay_below_the_colocated_vllm_engines_bound():
    from harness.config.rules import VLLM_ENGINE_SEEDS_PER_RUN
    from harness.train.trl.vllm import ENGINE_SEEDS_PER_RUN

    assert VLLM_ENGINE_SEEDS_PER_RUN == ENGINE_SEEDS_PER_RUN
    vllm = ["train.use_vllm=true", "train.vllm_device=cpu"]
    resolve(DEFAULT_SWEEP, ["seeds=[65435]", *vllm])  # uniform-aa (offset 100) runs seed 65535
    with pytest.raises(ConfigError, match=r"key 'seeds': .*\{'uniform-aa': 65536\}, but run seeds must be below "
                                          r"65536: .*colocated vLLM engine i is seeded with run seed x 2\*\*16 \+ i"):
        resolve(DEFAULT_SWEEP, ["seeds=[65436]", *vllm])


def test_an_edited_snapshot_is_written_again_by_the_next_parse(tmp_path):
    """The refusal of an edited snapshot says that running snakemake again fixes it: the next parse (the
    Snakefile's write_snapshot) restores the file."""
    from harness.config.snapshot import load_snapshot, write_snapshot

    resolved = resolve(DEFAULT_SWEEP)
    snapshot = write_snapshot(resolved, REPO_ROOT, tmp_path / "sweeps")
    snapshot.write_text(snapshot.read_text().replace('"learning_rate": ', '"learning_rate": 1', 1))
    with pytest.raises(ConfigError, match="run snakemake again"):
        load_snapshot(snapshot)
    assert write_snapshot(resolved, REPO_ROOT, tmp_path / "sweeps") == snapshot
    assert load_snapshot(snapshot) == resolved


def test_an_empty_benchmark_file_fails_its_eval_job_before_any_model_work(tmp_path):
    from harness.config.schema import BenchmarkConfig, EvalConfig
    from harness.data.files import DataFileError, write_sha256sums
    from harness.evaluation.driver import evaluate_benchmark

    data_file = tmp_path / "data" / "eval.jsonl"  # a generated file ({data_dir}) is not read at resolve
    data_file.parent.mkdir()
    data_file.write_text("")
    write_sha256sums(data_file.parent, [data_file])
    with pytest.raises(DataFileError, match="eval.jsonl: benchmark 'arith' has no rows"):
        evaluate_benchmark(tmp_path / "no-model-here", "arith", BenchmarkConfig(file="x", scorer="numeric"),
                           data_file, EvalConfig(), "tiny", tmp_path / "eval")


def _break_a_method_module(tmp_path, monkeypatch, source: str) -> Path:
    """A module `broken` among the package's method modules, and a registry that has imported none yet."""
    folder = tmp_path / "extra_methods"
    folder.mkdir()
    (folder / "broken.py").write_text(source)
    monkeypatch.setattr(methods, "__path__", [*methods.__path__, str(folder)])
    monkeypatch.setattr(registry, "_methods_loaded", False)
    monkeypatch.setattr(registry, "_import_failures", {})
    monkeypatch.delitem(sys.modules, "methods.broken", raising=False)
    return folder / "broken.py"


def test_a_method_module_with_a_syntax_error_breaks_only_the_lookups_that_need_it(tmp_path, monkeypatch):
    broken = _break_a_method_module(tmp_path, monkeypatch, "from methods.base import Method\n\ndef oops(:\n")
    resolved = resolve(DEFAULT_SWEEP)  # every label of the default sweep is another module's method
    assert "gmts" in resolved.sweep.methods
    with pytest.raises(KeyError) as info:
        registry.get_method_class("broken")
    assert f"{broken}, line 3: SyntaxError" in info.value.args[0]


def test_the_config_reference_refuses_to_leave_out_a_broken_method_module(tmp_path, monkeypatch):
    from harness.config.reference import builtin_methods

    broken = _break_a_method_module(tmp_path, monkeypatch, "from methods.base import Method\n\ndef oops(:\n")
    with pytest.raises(RuntimeError, match=rf"{re.escape(str(broken))}, line 3: SyntaxError"):
        builtin_methods()


def test_a_label_of_a_method_whose_module_fails_names_the_file_and_line(tmp_path, monkeypatch):
    broken = _break_a_method_module(tmp_path, monkeypatch, "import math\nraise RuntimeError('half-written')\n")
    labels = tmp_path / "labels"
    labels.mkdir()
    (labels / "mine.yaml").write_text("method: broken\n")
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({**yaml.safe_load(DEFAULT_SWEEP.read_text()), "methods": ["mine"],
                                     "method_config_dirs": [str(labels)]}))
    with pytest.raises(ConfigError) as info:
        resolve(sweep)
    message = str(info.value)
    assert str(labels / "mine.yaml") in message and "key 'method'" in message
    assert f"{broken}, line 2: RuntimeError: half-written" in message


def test_a_method_config_value_of_the_wrong_type_names_file_and_key(tmp_path):
    labels = tmp_path / "labels"
    labels.mkdir()
    shutil.copy(CONFIG_DIR / "method" / "gmts.yaml", labels / "typed.yaml")
    with open(labels / "typed.yaml", "a") as handle:
        handle.write("rho: [1, 2]\n")
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({**yaml.safe_load(DEFAULT_SWEEP.read_text()), "methods": ["typed"],
                                     "method_config_dirs": [str(labels)]}))
    with pytest.raises(ConfigError, match=rf"{labels / 'typed.yaml'}: key 'rho'"):
        resolve(sweep)


def _model_dir(folder: Path, weights: bytes | None) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "tokenizer.json").write_text("{}")
    if weights is not None:
        (folder / "model.safetensors").write_bytes(weights)
    return folder


def _safetensors_bytes() -> bytes:
    import torch
    from safetensors.torch import save

    return save({"w": torch.arange(64, dtype=torch.float32)})


def test_an_empty_checkpoint_folder_is_named_with_what_it_lacks(capsys, tmp_path):
    empty = tmp_path / "ckpt-100"
    empty.mkdir()
    out = tmp_path / "out"
    status = main(["eval", "--model-dir", str(empty), "--out", str(out)])
    message = capsys.readouterr().err
    assert status == 2
    assert f"model directory {empty} is incomplete: no config.json; no tokenizer" in message
    assert "no weights" in message and "sentencepiece" not in message
    assert not out.exists()


@pytest.mark.parametrize(("weights", "expected"), [
    (None, "no weights"),
    (b"", "model.safetensors is 0 bytes"),
    (b"\xff" * 16, "model.safetensors is truncated: 16 bytes, its header alone needs"),
    ("truncated", "model.safetensors is truncated: "),
    ("bad header", "the safetensors header is not valid JSON"),
])
def test_missing_or_truncated_weights_are_named(tmp_path, weights, expected):
    complete = _safetensors_bytes()
    if weights == "truncated":
        weights = complete[:-10]
    elif weights == "bad header":
        weights = complete[:8] + b"{" * (len(complete) - 8)
    folder = _model_dir(tmp_path / "model", weights)
    with pytest.raises(ModelDirError, match=f"model directory {folder} is incomplete: .*{expected}"):
        check_model_dir(folder)
    check_model_dir(_model_dir(tmp_path / "complete", complete))  # the whole file passes


def test_a_missing_run_checkpoint_is_named_before_evaluation(capsys, tmp_path):
    status = main(["eval", "--sweep", str(DEFAULT_SWEEP), "--set", f"results_dir={tmp_path}", "--label", "uniform",
                   "--seed", "0", "--ckpt", "ckpt-100"])
    message = capsys.readouterr().err
    assert status == 2
    run_checkpoint = tmp_path / "default" / "runs" / "uniform" / "seed0" / "ckpt-100"
    assert f"model directory {run_checkpoint} does not exist" in message
    assert not (tmp_path / "default" / "eval").exists()


def test_inspect_writes_nan_and_infinity_as_null_and_says_so(capsys, tmp_path):
    batch = {
        "completion_ids": [[5, 6], [5, 8], [9, 9], [4, 4]], "completion_mask": [[1, 1]] * 4,
        "rewards": [float("nan"), 0.0, 1.0, 1.0], "group_ids": [0, 0, 1, 1],
        "logp": [[-0.1, float("-inf")], [-1.0, -2.0], [-0.5, -0.5], [-0.4, -0.4]],
        "entropy": [[0.5, 1.5], [1.0, 2.0], [0.3, 0.3], [0.9, 0.1]],
    }
    source, out = tmp_path / "batch.json", tmp_path / "out.json"
    source.write_text(json.dumps(batch))  # Python writes NaN and -Infinity tokens, as a careless tool would
    assert main(["inspect", "uniform", "--batch", str(source), "--out", str(out)]) == 0
    note = capsys.readouterr().err
    text = out.read_text()
    written = json.loads(text, parse_constant=lambda token: pytest.fail(f"{token} is not JSON"))
    assert written["non_finite"] and "advantages[0][0]" in written["non_finite"]
    assert written["advantages"][0][0] is None
    assert "NaN or infinite values written as null" in note and "advantages[0][0]" in note


def _local_slurm(command: str, folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(REPO_ROOT / "scripts" / "local-slurm.sh"), command], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "LOCAL_SLURM_DIR": str(folder)})


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/sbin/slurmctld").exists(),
                    reason="scripts/local-slurm.sh runs as root with Debian's slurm-wlm")
@pytest.mark.parametrize("kind", ["another user's", "a link", "writable by all"])
def test_local_slurm_refuses_a_folder_another_user_controls(tmp_path, kind):
    folder = tmp_path / "local-slurm"
    bystander = subprocess.Popen(["sleep", "60"])  # a process whose pid a hostile user writes as slurmd's
    if kind == "a link":
        (tmp_path / "target").mkdir()
        folder.symlink_to(tmp_path / "target")
    else:
        folder.mkdir(mode=0o755)
        if kind == "writable by all":
            folder.chmod(0o777)
        else:
            os.chown(folder, 65534, 65534)  # nobody
        (folder / "run").mkdir()
        (folder / "run" / "slurmd.pid").write_text(f"{bystander.pid}\n")
    try:
        for command in ("start", "stop"):
            done = _local_slurm(command, folder)
            assert done.returncode == 1, done.stdout + done.stderr
            assert str(folder) in done.stderr and ("refusing" in done.stderr or "not killing" in done.stderr)
        assert bystander.poll() is None  # not killed
        assert sorted(p.name for p in folder.iterdir()) == ([] if kind == "a link" else ["run"])
    finally:
        bystander.kill()
        bystander.wait()


def test_files_are_staged_under_unpredictable_names_never_through_a_planted_link(tmp_path):
    # a link planted at the old predictable staging names (.<name>.tmp, .<name>.<pid>.tmp) is never written through
    from harness.config.paths import staging_file
    from harness.report.plots import save_png
    from harness.train.progress import PROGRESS_FILE, ProgressLog

    victim = tmp_path / "victim.txt"
    victim.write_text("untouched")
    target = tmp_path / "out" / "figure.png"
    target.parent.mkdir()
    for name in (f".{target.name}.tmp", f"{target.name}.tmp", f".{PROGRESS_FILE}.tmp"):
        (target.parent / name).symlink_to(victim)
    first, second = staging_file(target), staging_file(target)
    assert first != second and first.parent == target.parent and oct(first.stat().st_mode & 0o777) == "0o644"
    import matplotlib.pyplot as plt

    fig = plt.figure()
    save_png(fig, target)
    plt.close(fig)
    assert target.read_bytes().startswith(b"\x89PNG")
    ProgressLog(target.parent, "steps", 10.0, 0.0, stream=io.StringIO()).update(1, 1.0)
    assert victim.read_text() == "untouched"
