"""Hub models by revision (harness/model/hub.py) and `harness prefetch` (harness/ops/prefetch.py), offline: a model
repository laid out as the hub cache holds it (models--<owner>--<name>/blobs, snapshots/<commit>/<file> links,
refs/main) under tmp_path, read through huggingface_hub's own snapshot_download with the hub offline, as a compute
node reads what prefetch put there; where prefetch would download, snapshot_download is replaced by a stand-in
that fills the same layout and records what it was asked for. No request leaves the machine."""

import hashlib
import json
import os
import re
from pathlib import Path

import pytest
import yaml

from harness.cli import main as harness_main
from harness.config.loading import resolve
from harness.config.paths import CONFIG_DIR, SweepPaths
from harness.config.schema import ConfigError
from harness.model.checkpoints import ModelDirError, load_policy
from harness.model.hub import MODEL_PATTERNS, HubCacheMiss, offline_jobs
from harness.ops.prefetch import hub_sources, prefetch, reads_hub

# commits of the fake repositories below: test fixtures, not commits of any real repository
COMMIT = "c0ffee" + "0" * 34
OTHER = "beef" + "1" * 36
REPO = "someorg/tiny-llama"


def cache_repo(cache: Path, files: dict[str, bytes], commit: str = COMMIT, repo: str = REPO,
               repo_type: str = "model") -> Path:
    """``repo`` at ``commit`` in the hub cache layout, ``main`` pointing at it; its snapshot folder."""
    storage = cache / f"{repo_type}s--{repo.replace('/', '--')}"
    for name, content in files.items():
        blob = storage / "blobs" / hashlib.sha256(content).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(content)
        link = storage / "snapshots" / commit / name
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            link.symlink_to(os.path.relpath(blob, link.parent))
    (storage / "refs").mkdir(exist_ok=True)
    (storage / "refs" / "main").write_text(commit)
    return storage / "snapshots" / commit


def model_files(model_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(model_dir.iterdir()) if p.is_file()}


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty hub cache under tmp_path; HF_HUB_OFFLINE unset, so the harness decides (and restores) it."""
    from huggingface_hub import constants

    cache = tmp_path / "hub-cache"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # whatever a test does, nothing reaches the network
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return cache


def hub_sweep(tmp_path: Path, revision: str = COMMIT, **model) -> Path:
    """The tiny preset started from hub model REPO (a char Llama laid out as a hub model) at ``revision``."""
    sweep = {"name": "hubmodel", "preset": "tiny", "methods": ["uniform"], "seeds": [0],
             "results_dir": str(tmp_path / "results"),
             "model": {"kind": "pretrained", "name_or_path": REPO, "revision": revision, **model},
             "data": {"synthetic": {"n_train": 50, "n_eval": 4, "n_ood": 4}},
             "eval": {"k": 1, "max_gen_toks": 8, "greedy": False}}
    path = tmp_path / "hubmodel.yaml"
    path.write_text(yaml.safe_dump(sweep))
    return path


# --- 1. models by revision: the config check -----------------------------------------------------------------------


def test_an_unpinned_hub_model_is_refused_at_resolve_naming_the_key_and_file(tmp_path):
    preset_file = CONFIG_DIR / "preset" / "paper-ktae.yaml"
    with pytest.raises(ConfigError, match=rf"{re.escape(str(preset_file))}.*: key 'model.revision': 'main' is not a "
                                          r"commit sha .* model.allow_unpinned=true"):
        resolve(CONFIG_DIR / "sweeps" / "paper-ktae.yaml", ["model.allow_unpinned=false"])
    sweep = hub_sweep(tmp_path, revision="")
    with pytest.raises(ConfigError, match=rf"{re.escape(str(sweep))}: key 'model.revision': '' \(the default "
                                          r"branch\) is not a commit sha .* 'someorg/tiny-llama'"):
        resolve(sweep)
    with pytest.raises(ConfigError, match=r"key 'model.revision': 'c0ffee' is not a commit sha"):
        resolve(hub_sweep(tmp_path, revision="c0ffee"))  # an abbreviated sha is no pin either
    assert resolve(hub_sweep(tmp_path)).preset.model.revision == COMMIT
    assert resolve(hub_sweep(tmp_path, revision="main", allow_unpinned=True)).preset.model.allow_unpinned
    # a local directory has no revision; a model not of kind pretrained reads no hub
    assert resolve(hub_sweep(tmp_path, revision="", name_or_path=str(tmp_path))).preset.model.revision == ""
    assert resolve(CONFIG_DIR / "sweeps" / "default.yaml").preset.model.kind == "char_llama"


def test_every_shipped_hub_model_is_pinned_or_explicitly_unpinned():
    """No preset names a hub model at a moving branch without saying so (none ships a commit: none is recorded in
    this checkout, so each says allow_unpinned until `harness prefetch` prints the commit to pin)."""
    for path in sorted((CONFIG_DIR / "sweeps").glob("*.yaml")):
        model = resolve(path).preset.model
        if model.kind == "pretrained":
            assert re.fullmatch(r"[0-9a-f]{40}", model.revision) or model.allow_unpinned, path
            if model.allow_unpinned:
                text = (CONFIG_DIR / "preset" / f"{resolve(path).sweep.preset}.yaml").read_text()
                assert "harness prefetch" in text, path


def test_the_fidelity_table_shows_whether_the_model_is_pinned():
    from harness.report.fidelity import load_fidelity

    resolved = resolve(CONFIG_DIR / "sweeps" / "paper-ktae.yaml")
    row = next(r for r in load_fidelity(CONFIG_DIR / "fidelity" / "paper-ktae.yaml", resolved).rows
               if r.element == "model")
    assert "derived.model_revision=unpinned: main (model.allow_unpinned" in row.ours and row.status == "match"
    pinned = resolve(CONFIG_DIR / "sweeps" / "paper-ktae.yaml", [f"model.revision={COMMIT}",
                                                                 "model.allow_unpinned=false"])
    row = next(r for r in load_fidelity(CONFIG_DIR / "fidelity" / "paper-ktae.yaml", pinned).rows
               if r.element == "model")
    assert f"derived.model_revision={COMMIT}" in row.ours


# --- 1. the warm start records the commit and digests; later loads check them --------------------------------------


def test_the_warm_start_loads_the_pinned_commit_and_records_its_files(tmp_path, hub_cache, tiny_model_dir):
    files = model_files(tiny_model_dir)
    cache_repo(hub_cache, files, OTHER)  # another commit, which main does not point at
    cache_repo(hub_cache, files)
    sweep = hub_sweep(tmp_path)
    assert harness_main(["data", "--sweep", str(sweep)]) == 0
    assert harness_main(["warmstart", "--sweep", str(sweep)]) == 0
    assert "HF_HUB_OFFLINE" not in os.environ  # set for the job, restored after the in-process call
    paths = SweepPaths(resolve(sweep).results_dir)
    record = json.loads(paths.warmstart_file.read_text())
    source = record["source"]
    assert (source["repo"], source["revision"], source["commit"], source["pinned"]) == (REPO, COMMIT, COMMIT, True)
    assert source["files_sha256"] == {name: hashlib.sha256(content).hexdigest() for name, content in files.items()}
    written = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in paths.warmstart_dir.iterdir()
               if p.name != "warmstart.json"}
    assert record["files_sha256"] == written and "model.safetensors" in written
    load_policy(paths.warmstart_dir)  # the record matches: loads

    # a branch, allowed: main resolves through refs/main, and the record says it was not a pin
    unpinned = hub_sweep(tmp_path, revision="main", allow_unpinned=True)
    assert harness_main(["warmstart", "--sweep", str(unpinned)]) == 0
    source = json.loads(paths.warmstart_file.read_text())["source"]
    assert (source["revision"], source["commit"], source["pinned"], source["allow_unpinned"]) == (
        "main", COMMIT, False, True)


def test_a_changed_model_file_is_refused_naming_the_file_and_both_digests(tmp_path, hub_cache, tiny_model_dir,
                                                                          capsys):
    cache_repo(hub_cache, model_files(tiny_model_dir))
    sweep = hub_sweep(tmp_path)
    assert harness_main(["data", "--sweep", str(sweep)]) == 0
    assert harness_main(["warmstart", "--sweep", str(sweep)]) == 0
    paths = SweepPaths(resolve(sweep).results_dir)
    config = paths.warmstart_dir / "config.json"
    recorded = hashlib.sha256(config.read_bytes()).hexdigest()
    config.write_text(config.read_text() + "\n")  # still a valid config: only the digest tells
    changed = hashlib.sha256(config.read_bytes()).hexdigest()
    # what a train job loads (harness/train/run.py: load_policy of the warm start)
    with pytest.raises(ModelDirError, match=rf"{re.escape(str(config))} changed .*sha256 {changed}, recorded "
                                            rf"{recorded}"):
        load_policy(paths.warmstart_dir)
    # the evaluation of the warm start (the base model's row)
    assert harness_main(["eval", "--sweep", str(sweep), "--label", "warmstart", "--seed", "0", "--ckpt",
                         "ckpt-000"]) == 2
    err = capsys.readouterr().err
    assert "config.json changed" in err and changed in err and recorded in err
    config.write_bytes(config.read_bytes()[:-1])
    load_policy(paths.warmstart_dir)  # restored: loads again
    (paths.warmstart_dir / "added_tokens.json").write_bytes(b"x")  # a file transformers would read too
    with pytest.raises(ModelDirError, match=r"files its record .* does not list: added_tokens.json \(sha256 "
                                            rf"{hashlib.sha256(b'x').hexdigest()}, recorded: none\)"):
        load_policy(paths.warmstart_dir)


# --- 4. offline jobs and prefetch -----------------------------------------------------------------------------------


def test_an_offline_job_without_the_model_names_the_prefetch_to_run(tmp_path, hub_cache, capsys, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # the job itself must take the hub offline
    sweep = hub_sweep(tmp_path)
    assert harness_main(["data", "--sweep", str(sweep)]) == 0
    assert harness_main(["warmstart", "--sweep", str(sweep)]) == 2
    err = capsys.readouterr().err
    assert f"model {REPO}@{COMMIT} is not in the hub cache ({hub_cache})" in err
    assert "HF_HUB_OFFLINE=1" in err and f"`harness prefetch --sweep {sweep}`" in err
    assert constants.HF_HUB_OFFLINE is False and "HF_HUB_OFFLINE" not in os.environ  # restored


def test_an_offline_data_job_without_the_dataset_names_the_prefetch_to_run(tmp_path, hub_cache, capsys):
    sweep = tmp_path / "hubdata.yaml"
    sweep.write_text(yaml.safe_dump({"name": "hubdata", "preset": "paper-8020", "methods": ["uniform"], "seeds": [0],
                                     "results_dir": str(tmp_path / "results")}))
    hub = resolve(sweep).preset.data.hub
    assert harness_main(["data", "--sweep", str(sweep)]) == 2
    err = capsys.readouterr().err
    assert f"dataset {hub.repo}@{hub.revision}, files {list(hub.files)}" in err and f"({hub_cache})" in err
    assert f"`harness prefetch --sweep {sweep}`" in err


def test_an_incomplete_cached_model_names_the_prefetch_too(tmp_path, hub_cache, tiny_model_dir):
    from harness.model.hub import hub_model

    cache_repo(hub_cache, {k: v for k, v in model_files(tiny_model_dir).items() if k != "model.safetensors"})
    with pytest.raises(HubCacheMiss, match=r"the cached snapshot is incomplete .*no weights") as caught:
        hub_model(REPO, COMMIT)
    assert "harness prefetch --sweep configs/sweeps/x.yaml" in caught.value.for_sweep("configs/sweeps/x.yaml")


def test_jobs_go_offline_only_for_sweeps_that_read_the_hub_and_an_explicit_setting_wins(tmp_path):
    assert not reads_hub(resolve(CONFIG_DIR / "sweeps" / "default.yaml"))
    assert not reads_hub(resolve(CONFIG_DIR / "sweeps" / "smol.yaml"))  # a GGUF from a PyPI wheel
    assert reads_hub(resolve(CONFIG_DIR / "sweeps" / "paper-ktae.yaml"))
    environ = {}
    assert offline_jobs(environ) and environ == {"HF_HUB_OFFLINE": "1"}
    environ = {"HF_HUB_OFFLINE": "0"}  # a node with hub access, told to download itself
    assert not offline_jobs(environ) and environ == {"HF_HUB_OFFLINE": "0"}


def fake_download(cache: Path, model_dir: Path, calls: list):
    """A stand-in for snapshot_download: records the call and fills the cache as a download would (a branch
    resolves to COMMIT); the model repositories hold ``model_dir``'s files plus weights that are not asked for."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def download(repo_id, repo_type=None, revision=None, allow_patterns=None):
        calls.append((repo_type, repo_id, revision, allow_patterns))
        commit = revision if revision and re.fullmatch(r"[0-9a-f]{40}", revision) else COMMIT
        if repo_type == "dataset":
            table = cache / "rows.parquet"
            pq.write_table(pa.Table.from_pylist([{"prompt": [{"content": "1+1?"}]}]), table)
            files = {name: table.read_bytes() for name in allow_patterns}
        else:
            files = {name: content for name, content in model_files(model_dir).items()
                     if any(Path(name).match(p) for p in allow_patterns)}
        return str(cache_repo(cache, files, commit, repo_id, repo_type or "model"))

    return download


def test_prefetch_fetches_every_model_dataset_and_checkpoint_at_its_revision(tmp_path, hub_cache, tiny_model_dir,
                                                                             monkeypatch, capsys):
    import huggingface_hub

    methods = tmp_path / "methods"
    methods.mkdir()
    (methods / "released-pinned.yaml").write_text(f"method: ktae\ncheckpoint: otherorg/released@{OTHER}\n")
    (methods / "released-main.yaml").write_text("method: ktae\ncheckpoint: otherorg/released-b\n")
    sweep = tmp_path / "h2h.yaml"
    sweep.write_text(yaml.safe_dump({"name": "prefetched", "preset": "head-to-head", "seeds": [0],
                                     "methods": ["released-pinned", "released-main"],
                                     "method_config_dirs": [str(methods)], "results_dir": str(tmp_path / "r"),
                                     "train": {"budget": {"checkpoint_fractions": [1.0]}}}))
    resolved = resolve(sweep)
    hub = resolved.preset.data.hub
    assert [(s.role, s.repo) for s in hub_sources(resolved)] == [
        ("model", "Qwen/Qwen2.5-Math-1.5B"), ("dataset", hub.repo), ("checkpoint", "otherorg/released"),
        ("checkpoint", "otherorg/released-b")]
    calls = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download(hub_cache, tiny_model_dir, calls))
    assert harness_main(["prefetch", "--sweep", str(sweep)]) == 0
    assert calls == [("model", "Qwen/Qwen2.5-Math-1.5B", "main", list(MODEL_PATTERNS)),
                     ("dataset", hub.repo, hub.revision, list(hub.files)),
                     ("model", "otherorg/released", OTHER, list(MODEL_PATTERNS)),
                     ("model", "otherorg/released-b", None, list(MODEL_PATTERNS))]
    out = capsys.readouterr().out
    assert f"model (weights, config, tokenizer) Qwen/Qwen2.5-Math-1.5B @ main: commit {COMMIT}" in out
    assert f"dataset {hub.repo} @ {hub.revision}: commit {hub.revision}, 1 files" in out
    # the unpinned ones get the exact line that pins them; the pinned ones none
    pins = re.findall(r"^    (\S.*)$", out, flags=re.M)
    assert pins == [f"revision: {COMMIT}    # model.revision, in `model:` of configs/preset/head-to-head.yaml (or "
                    "the sweep file's override); then delete `allow_unpinned: true` there",
                    f"checkpoint: otherorg/released-b@{COMMIT}    # in {methods / 'released-main.yaml'}"]
    # what prefetch put there is what an offline job reads
    from harness.model.hub import hub_model

    folder, record = hub_model("otherorg/released", OTHER)
    assert record["commit"] == OTHER and "model.safetensors" in record["files_sha256"]


def test_prefetch_reports_what_failed_and_fetches_the_rest(tmp_path, hub_cache, tiny_model_dir):
    calls = []
    good = fake_download(hub_cache, tiny_model_dir, calls)

    def flaky(repo_id, **kwargs):
        if kwargs.get("repo_type") == "dataset":
            raise OSError("connection refused")
        return good(repo_id, **kwargs)

    said = []
    with pytest.raises(ValueError, match=r"1 of 2 hub repositories were not fetched: dataset .*connection refused"):
        prefetch(resolve(CONFIG_DIR / "sweeps" / "paper-8020.yaml"), download=flaky, say=said.append)
    assert any(line.startswith("model (weights, config, tokenizer) Qwen/Qwen3-8B-Base @ main") for line in said)


def test_a_released_checkpoint_is_fetched_from_the_cache_at_its_commit(tmp_path, hub_cache, tiny_model_dir):
    from harness.config.loading import load_method
    from harness.ops.fetch import fetch_checkpoint

    files = model_files(tiny_model_dir)
    cache_repo(hub_cache, files, OTHER, "otherorg/released")
    methods = tmp_path / "methods"
    methods.mkdir()
    (methods / "released.yaml").write_text(f"method: ktae\ncheckpoint: otherorg/released@{OTHER}\n")
    resolved = resolve({"name": "rel", "preset": "tiny", "methods": ["released"], "seeds": [0],
                        "results_dir": str(tmp_path / "results"), "method_config_dirs": [str(methods)],
                        "train": {"budget": {"checkpoint_fractions": [1.0]}}})
    record = fetch_checkpoint(resolved, load_method("released", search_dirs=[str(methods)]), 0,
                              SweepPaths(resolved.results_dir))
    external = record["external"]
    assert (external["revision"], external["commit"]) == (OTHER, OTHER)
    assert external["source_files_sha256"] == {n: hashlib.sha256(c).hexdigest() for n, c in files.items()}
