"""Training sets from the hub (data.kind: hub, harness/data/hub.py), offline: a dataset repository laid out as the
hub cache holds it (datasets--<owner>--<name>/blobs, snapshots/<commit>/<repo path> links, refs/main), read through
huggingface_hub's own snapshot_download with HF_HUB_OFFLINE on, as a cluster's data job reads it after downloading.
The parquet file has DAPO-Math-17k's columns (verl rows)."""

import hashlib
import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from harness.cli import main as harness_main
from harness.config.loading import resolve
from harness.config.paths import CONFIG_DIR, SweepPaths
from harness.config.schema import ConfigError, column_path_parts
from harness.data.files import DataFileError, read_checksums, read_json, read_jsonl, sha256_file
from harness.data.hub import source_checksums, strip_dapo_instruction
from harness.data.prepare import prepare_data, read_train_split

REPO = "BytedTsinghua-SIA/DAPO-Math-17k"
PRESET = resolve(CONFIG_DIR / "sweeps" / "paper-8020.yaml").preset.data.hub
COMMIT = PRESET.revision  # the preset's pin: the cache below holds that commit
FILE = "data/dapo-math-17k.parquet"
# DAPO-Math-17k's prompt as public preprocessing scripts of the dataset give it (written out here, independently of
# the constants in harness/data/hub.py)
INSTRUCTION = ("Solve the following math problem step by step. The last line of your response should be of the form "
               "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n")
REMINDER = '\n\nRemember to put your answer on its own line after "Answer:".'
PROBLEMS = [("What is $2+3$?", "5"), ("Find the least prime above $10$.", "11"), ("What is $2+3$?", "5"),
            ("Compute $1-4$.", "-3")]


def dapo_row(i: int, problem: str, answer: str, prompt: str | None = None) -> dict:
    return {"data_source": "math_dapo",
            "prompt": [{"content": INSTRUCTION + problem + REMINDER if prompt is None else prompt, "role": "user"}],
            "ability": "MATH", "reward_model": {"ground_truth": answer, "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": f"uuid-{i}"}}


def parquet_bytes(tmp_path: Path, rows: list[dict]) -> bytes:
    path = tmp_path / "build.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path.read_bytes()


def hub_cache(cache: Path, files: dict[str, bytes], commit: str = COMMIT, repo: str = REPO) -> Path:
    """A dataset repository at ``commit`` in the hub cache layout, ``main`` pointing at it; its snapshot folder."""
    storage = cache / f"datasets--{repo.replace('/', '--')}"
    for name, content in files.items():
        blob = storage / "blobs" / hashlib.sha256(content).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(content)
        link = storage / "snapshots" / commit / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (storage / "refs").mkdir(exist_ok=True)
    (storage / "refs" / "main").write_text(commit)
    return storage / "snapshots" / commit


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    """An empty hub cache under tmp_path, with huggingface_hub offline (no request leaves the machine)."""
    from huggingface_hub import constants

    cache = tmp_path / "hub-cache"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def sweep(tmp_path: Path, content: bytes | None = None, **hub) -> dict:
    """The paper-8020 sweep with its results under tmp_path and the preset's sha256 pin set to ``content``'s."""
    if content is not None:
        hub.setdefault("sha256", [f"{hashlib.sha256(content).hexdigest()}  {FILE}"])
    return {"name": "hubtest", "preset": "paper-8020", "methods": ["uniform"], "seeds": [0],
            "results_dir": str(tmp_path / "results"), "data": {"hub": hub}}


def prepare(config: dict, overrides: list[str] | None = None):
    resolved = resolve(config, overrides)
    paths = SweepPaths(resolved.results_dir)
    return prepare_data(resolved, paths), paths


def test_column_paths_parse_keys_and_positions():
    assert column_path_parts("prompt[0].content") == ["prompt", 0, "content"]
    assert column_path_parts("reward_model.ground_truth") == ["reward_model", "ground_truth"]
    assert column_path_parts("a[2][10].b-c") == ["a", 2, 10, "b-c"]
    for bad in ("", "a..b", "a[x]", "[0]", "a.0", "a b"):
        with pytest.raises(ValueError, match="not a column path"):
            column_path_parts(bad)


def test_strip_dapo_instruction_needs_the_exact_instruction():
    assert strip_dapo_instruction(INSTRUCTION + "What is $1+1$?" + REMINDER) == "What is $1+1$?"
    with pytest.raises(ValueError, match="does not start with DAPO's instruction"):
        strip_dapo_instruction("What is $1+1$?" + REMINDER)
    with pytest.raises(ValueError, match="does not end with DAPO's reminder"):
        strip_dapo_instruction(INSTRUCTION + "What is $1+1$?")


def test_the_preset_reads_dapo_math_17k_at_a_pinned_commit():
    resolved = resolve(CONFIG_DIR / "sweeps" / "paper-8020.yaml")
    data = resolved.preset.data
    assert data.kind == "hub" and data.hub.repo == REPO and len(data.hub.revision) == 40
    assert (data.hub.files, data.hub.problem, data.hub.answer) == ([FILE], "prompt[0].content",
                                                                  "reward_model.ground_truth")
    from harness.report.fidelity import load_fidelity

    row = next(r for r in load_fidelity(CONFIG_DIR / "fidelity" / "paper-8020.yaml", resolved).rows
               if r.element == "data")
    assert row.status == "match"
    jsonl = resolve(CONFIG_DIR / "sweeps" / "paper-8020.yaml", ["data.kind=jsonl"]).preset.data
    assert jsonl.train_file == "data/train/math_train.jsonl"  # the documented fallback still resolves


def test_harness_data_writes_the_training_rows_and_their_provenance(tmp_path, offline_hub):
    content = parquet_bytes(tmp_path, [dapo_row(i, p, a) for i, (p, a) in enumerate(PROBLEMS)])
    hub_cache(offline_hub, {FILE: content, "README.md": b"---\nlicense: apache-2.0\n---\n"})
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text(json.dumps(sweep(tmp_path, content)))
    assert harness_main(["data", "--sweep", str(sweep_file)]) == 0  # what the Snakefile's data rule runs
    paths = SweepPaths(resolve(sweep_file).results_dir)

    rows = read_train_split(paths)
    assert [(r["problem"], r["answer"]) for r in rows] == PROBLEMS  # instruction stripped, duplicates kept
    assert [r["id"] for r in rows] == [f"{FILE}:{i}" for i in range(4)] and {r["source"] for r in rows} == {REPO}
    record = read_json(paths.data_dir / "source.json")
    assert record["repo"] == REPO and record["revision"] == record["commit"] == COMMIT and record["pinned"]
    assert record["files"] == [{"path": FILE, "sha256": hashlib.sha256(content).hexdigest(), "bytes": len(content),
                                "rows_taken": 4}]  # the README is not selected by data.hub.files
    assert record["mapping"]["problem_transform"] == "strip_dapo_instruction"
    assert record["train"] == {"file": "train.jsonl", "rows": 4, "sha256": sha256_file(paths.data_dir / "train.jsonl")}
    sums = read_checksums(paths.data_dir / "SHA256SUMS")
    assert set(sums) == {"train.jsonl", "source.json"}
    # what run.json records beside the train.jsonl digest
    assert source_checksums(paths.data_dir) == {f"{REPO}@{COMMIT}:{FILE}": hashlib.sha256(content).hexdigest()}


def test_without_the_transform_and_with_a_row_limit(tmp_path, offline_hub):
    content = parquet_bytes(tmp_path, [dapo_row(i, p, a) for i, (p, a) in enumerate(PROBLEMS)])
    hub_cache(offline_hub, {FILE: content})
    _, paths = prepare(sweep(tmp_path, content, problem_transform="none"), ["data.max_train_rows=2"])
    rows = read_jsonl(paths.data_dir / "train.jsonl")
    assert [r["problem"] for r in rows] == [INSTRUCTION + p + REMINDER for p, _ in PROBLEMS[:2]]
    assert read_json(paths.data_dir / "source.json")["files"][0]["rows_taken"] == 2


def test_jsonl_files_and_globs_in_file_order(tmp_path, offline_hub):
    parts = {f"data/train-0000{i}-of-00002.jsonl": "".join(json.dumps({"q": f"{i}+{j}", "a": i + j}) + "\n"
                                                          for j in range(3)).encode() for i in range(2)}
    hub_cache(offline_hub, parts, repo="someone/arith")
    _, paths = prepare(sweep(tmp_path, repo="someone/arith", files=["data/train-*.jsonl"], problem="q", answer="a",
                             sha256=[], problem_transform="none"))
    rows = read_jsonl(paths.data_dir / "train.jsonl")
    assert [(r["problem"], r["answer"]) for r in rows] == [(f"{i}+{j}", str(i + j)) for i in range(2)
                                                           for j in range(3)]  # integer answers become text
    assert [f["path"] for f in read_json(paths.data_dir / "source.json")["files"]] == sorted(parts)


def test_mapping_errors_name_the_key_the_file_and_the_row(tmp_path, offline_hub):
    rows = [dapo_row(0, *PROBLEMS[0]), dapo_row(1, *PROBLEMS[1])]
    rows[1]["prompt"] = [{"content": "", "role": "user"}]
    content = parquet_bytes(tmp_path, rows)
    hub_cache(offline_hub, {FILE: content})
    with pytest.raises(DataFileError, match=rf"data.hub.answer='solution': {FILE} of {REPO}@{COMMIT}: no column "
                                            r"'solution'; its columns: \['data_source', 'prompt'"):
        prepare(sweep(tmp_path, content, answer="solution"))
    with pytest.raises(DataFileError, match=rf"data.hub.answer='reward_model.answer': {FILE} .* row 0: key 'answer' "
                                            r"is missing in reward_model \(keys: \['ground_truth', 'style'\]\)"):
        prepare(sweep(tmp_path, content, answer="reward_model.answer"))
    with pytest.raises(DataFileError, match=r"data.hub.problem='prompt\[1\].content': .* row 0: prompt has 1 items"):
        prepare(sweep(tmp_path, content, problem="prompt[1].content"))
    with pytest.raises(DataFileError, match=r"data.hub.problem='prompt\[0\].content': .* row 1: empty"):
        prepare(sweep(tmp_path, content))
    with pytest.raises(DataFileError, match=r"data.hub.problem='extra_info': .* row 0: a dict"):
        prepare(sweep(tmp_path, content, problem="extra_info"))


def test_a_row_without_dapo_instruction_stops_the_job(tmp_path, offline_hub):
    content = parquet_bytes(tmp_path, [dapo_row(0, *PROBLEMS[0]), dapo_row(1, "x", "1", prompt="Plain: 1+1?")])
    hub_cache(offline_hub, {FILE: content})
    with pytest.raises(DataFileError, match=rf"problem_transform=strip_dapo_instruction: {FILE} .* row 1: the "
                                            "problem does not start with DAPO's instruction"):
        prepare(sweep(tmp_path, content))


def test_files_and_digests_are_checked(tmp_path, offline_hub):
    content = parquet_bytes(tmp_path, [dapo_row(0, *PROBLEMS[0])])
    hub_cache(offline_hub, {FILE: content})
    with pytest.raises(DataFileError, match=rf"sha256 mismatch: expected {'0' * 64} \(data.hub.sha256\), actual "
                                            rf"{hashlib.sha256(content).hexdigest()}"):
        prepare(sweep(tmp_path, sha256=[f"{'0' * 64}  {FILE}"]))
    with pytest.raises(DataFileError, match=r"'data/other.parquet' matches no file of .*; its files: "
                                            r"\['data/dapo-math-17k.parquet'\]"):
        prepare(sweep(tmp_path, files=["data/other.parquet"]))


def test_a_revision_that_is_not_a_commit_is_refused_unless_allowed(tmp_path, offline_hub):
    with pytest.raises(ConfigError, match=r"key 'data.hub.revision': 'main' is not a commit sha .* "
                                          r"data.hub.allow_unpinned=true"):
        resolve(sweep(tmp_path, revision="main"))
    with pytest.raises(ConfigError, match=r"key 'data.hub.revision': '6587709' is not a commit sha"):
        resolve(sweep(tmp_path, revision="6587709"))  # an abbreviated sha is no pin either
    content = parquet_bytes(tmp_path, [dapo_row(0, *PROBLEMS[0])])
    hub_cache(offline_hub, {FILE: content})
    _, paths = prepare(sweep(tmp_path, content, revision="main", allow_unpinned=True))
    record = read_json(paths.data_dir / "source.json")  # main resolved through the cache's refs/main
    assert (record["revision"], record["commit"], record["pinned"]) == ("main", COMMIT, False)


def test_incomplete_hub_settings_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"key 'data.hub.repo' is empty .* key 'data.hub.files' is empty"):
        resolve(sweep(tmp_path, repo="", files=[]))
    with pytest.raises(ConfigError, match=r"key 'data.hub.problem': 'prompt\[x\]' is not a column path"):
        resolve(sweep(tmp_path, problem="prompt[x]"))
    with pytest.raises(ConfigError, match=r"key 'data.hub.sha256': .* not sha256sum lines"):
        resolve(sweep(tmp_path, sha256=[f"abc  {FILE}"]))
    with pytest.raises(ConfigError, match=r"'data.hub.problem_transform': 'lower' is not one of"):
        resolve(sweep(tmp_path, problem_transform="lower"))


def test_a_run_records_the_hub_checksums(tmp_path, offline_hub, tiny_sweep):
    """A tiny run on hub rows: run.json's data_sha256 holds train.jsonl and each source file of the hub."""
    from harness.config.loading import load_method
    from harness.train.run import run_training

    overrides, tiny_paths = tiny_sweep
    lines = "".join(json.dumps({"problem": f"{i}+{i + 1}", "answer": str(2 * i + 1)}) + "\n" for i in range(8))
    hub_cache(offline_hub, {"train.jsonl": lines.encode()}, repo="someone/arith")
    hub = {"kind": "hub", "hub": {"repo": "someone/arith", "revision": COMMIT, "files": ["train.jsonl"],
                                  "problem": "problem", "answer": "answer"}}
    config = {"name": "tiny", "preset": "tiny", "data": hub}
    resolved = resolve(config, [*overrides, f"results_dir={tmp_path / 'results'}", "train.budget.amount=1",
                                "train.budget.checkpoint_fractions=[1.0]"])
    paths = SweepPaths(resolved.results_dir)
    prepare_data(resolved, paths)
    shutil.copytree(tiny_paths.warmstart_dir, paths.warmstart_dir)  # the char Llama's warm start needs solutions
    record = run_training(resolved, load_method("uniform"), 0, paths)
    assert record["provenance"]["data_sha256"] == {
        "train": sha256_file(paths.data_dir / "train.jsonl"),
        f"someone/arith@{COMMIT}:train.jsonl": hashlib.sha256(lines.encode()).hexdigest()}


def test_every_transform_name_is_implemented():
    from harness.config import choices
    from harness.config.schema import HubDataConfig
    from harness.data.hub import PROBLEM_TRANSFORMS
    from methods.declaration import declared

    assert declared(HubDataConfig, "problem_transform").choices is choices.HUB_PROBLEM_TRANSFORMS
    assert tuple(PROBLEM_TRANSFORMS) == choices.HUB_PROBLEM_TRANSFORMS


def test_other_training_data_drops_an_earlier_hub_record(tmp_path, offline_hub):
    content = parquet_bytes(tmp_path, [dapo_row(0, *PROBLEMS[0])])
    hub_cache(offline_hub, {FILE: content})
    _, paths = prepare(sweep(tmp_path, content))
    assert source_checksums(paths.data_dir)
    prepare(sweep(tmp_path, content), ["data.kind=jsonl"])  # the same sweep, switched to MATH train
    assert source_checksums(paths.data_dir) == {} and len(read_train_split(paths)) == 7498
