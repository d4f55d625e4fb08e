"""Hub models at a pinned commit, read from the hub cache: the base model of a pretrained preset and released
checkpoints (``checkpoint: <hub id>[@revision]``).

A model named by a hub id is loaded at ``model.revision`` (a 40-hex commit; a branch only with
``model.allow_unpinned``, harness/config/rules.py) from the local folder huggingface_hub's ``snapshot_download``
gives for that revision in the hub cache (HF_HUB_CACHE / HF_HOME, as the site sets it), never by id through
transformers, so the files loaded are the files whose sha256 is recorded.

Login node vs compute nodes: ``harness prefetch --sweep F`` (harness/ops/prefetch.py) downloads every model,
tokenizer, dataset and released checkpoint of a sweep into the cache on a node with hub access; the jobs of a sweep
that reads the hub run with HF_HUB_OFFLINE=1 (``offline_jobs``, set by the harness CLI), so a job whose files are
not in the cache stops with ``HubCacheMiss``, which names the prefetch to run, instead of reaching the network.

The files a model is loaded from are those of ``MODEL_PATTERNS`` (weights, configs, tokenizer): prefetch and the
jobs ask for the same patterns, so huggingface_hub's offline check that a cached snapshot is complete applies.
"""

from __future__ import annotations

import fnmatch
import os
import sys
from collections.abc import Callable
from pathlib import Path

from harness.config.schema import COMMIT_SHA

# the files of a model repository a policy is loaded from: configs, safetensors weights (and their index),
# the tokenizer (tokenizer.json, vocab.json + merges.txt, a sentencepiece .model, tiktoken) and its chat template
MODEL_PATTERNS = ("*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja")
LEGACY_WEIGHTS = ("*.bin",)  # only for a repository without safetensors weights
OFFLINE_VARIABLE = "HF_HUB_OFFLINE"
SWEEP_PLACEHOLDER = "<the sweep file>"
TRUE_VALUES = ("1", "ON", "YES", "TRUE")  # huggingface_hub's reading of HF_HUB_OFFLINE


class HubCacheMiss(FileNotFoundError):
    """A hub repository (or some of its files) that is not in the hub cache while the hub is offline."""

    def __init__(self, what: str, detail: str, sweep: str | None = None):
        self.what, self.detail = what, detail
        super().__init__(self.for_sweep(sweep))

    def for_sweep(self, sweep: str | None) -> str:
        """The message, naming ``harness prefetch --sweep <sweep>`` (the job's own ``--sweep`` where known)."""
        from huggingface_hub import constants

        return (f"{self.what} is not in the hub cache ({constants.HF_HUB_CACHE}) and the hub is offline "
                f"({OFFLINE_VARIABLE}=1: the jobs of a sweep that reads the hub do not reach the network): "
                f"{self.detail}. Prefetch it on a node with hub access (the login node), into the same hub cache: "
                f"`harness prefetch --sweep {sweep or SWEEP_PLACEHOLDER}` (docs/cluster.md, 'Login node and "
                "compute nodes')")


def split_checkpoint(checkpoint: str) -> tuple[str, str | None]:
    """``"org/name@rev"`` -> ("org/name", "rev"); a local directory (or a name without @) has no revision."""
    if "@" in checkpoint and not Path(checkpoint).exists():
        name, revision = checkpoint.rsplit("@", 1)
        return name, revision or None
    return checkpoint, None


def cache_miss(exc: BaseException) -> HubCacheMiss | None:
    """``exc`` as a ``HubCacheMiss`` when it is huggingface_hub's "not in the local cache" while the hub is offline
    (e.g. from the data job's download of a hub dataset); None otherwise."""
    if isinstance(exc, HubCacheMiss):
        return exc
    errors = sys.modules.get("huggingface_hub.errors")
    if errors is None or not isinstance(exc, errors.LocalEntryNotFoundError) or not hub_offline():
        return None
    return HubCacheMiss("a hub repository of the sweep", str(exc).splitlines()[0])


def hub_offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def offline_jobs(environ: dict | None = None) -> bool:
    """Take the hub offline for this job: HF_HUB_OFFLINE=1 unless the environment sets it already (=0 lets a job
    on a node with hub access download by itself), in the environment (for the processes the job starts) and in
    huggingface_hub's constants when it is imported already (it reads the variable once). Returns whether the hub
    is offline now."""
    environ = os.environ if environ is None else environ
    environ.setdefault(OFFLINE_VARIABLE, "1")
    offline = environ[OFFLINE_VARIABLE].strip().upper() in TRUE_VALUES
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:
        constants.HF_HUB_OFFLINE = offline
    return offline


def hub_setting() -> tuple[str | None, bool | None]:
    """HF_HUB_OFFLINE in the environment and in huggingface_hub's constants (None: unset, not imported)."""
    constants = sys.modules.get("huggingface_hub.constants")
    return os.environ.get(OFFLINE_VARIABLE), None if constants is None else constants.HF_HUB_OFFLINE


def restore_hub_setting(setting: tuple[str | None, bool | None]) -> None:
    """Put back what ``hub_setting`` returned (``offline_jobs`` called in-process leaves no trace)."""
    variable, constant = setting
    if variable is None:
        os.environ.pop(OFFLINE_VARIABLE, None)
    else:
        os.environ[OFFLINE_VARIABLE] = variable
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:
        constants.HF_HUB_OFFLINE = (constant if constant is not None
                                    else variable is not None and variable.strip().upper() in TRUE_VALUES)


def repo_snapshot(repo: str, revision: str | None, repo_type: str = "model",
                  allow_patterns: list[str] | tuple[str, ...] | None = None,
                  download: Callable | None = None) -> Path:
    """The cache folder of ``repo`` at ``revision`` (None: the default branch) holding the files of
    ``allow_patterns``: ``snapshot_download`` (downloads online; the cache alone offline, ``HubCacheMiss`` when it
    lacks them). ``download``: a stand-in for ``snapshot_download`` (tests)."""
    from huggingface_hub.errors import LocalEntryNotFoundError

    if download is None:
        from huggingface_hub import snapshot_download as download
    try:
        return Path(download(repo_id=repo, repo_type=repo_type, revision=revision or None,
                             allow_patterns=list(allow_patterns) if allow_patterns is not None else None))
    except LocalEntryNotFoundError as exc:  # IncompleteSnapshotError is one
        if not hub_offline():
            raise
        kind = "dataset" if repo_type == "dataset" else "model"
        raise HubCacheMiss(f"{kind} {repo}@{revision or 'main'}", str(exc).splitlines()[0]) from None


def matching_files(folder: Path, patterns: list[str] | tuple[str, ...]) -> dict[str, Path]:
    """{repo path: local file} of the files under ``folder`` that ``patterns`` select (huggingface_hub's
    fnmatch rules), in path order; huggingface_hub's own ``.cache`` is left out."""
    files = {}
    for path in sorted(Path(folder).rglob("*")):
        name = path.relative_to(folder).as_posix()
        if ".cache" in Path(name).parts or not path.is_file():
            continue
        if any(fnmatch.fnmatch(name, pattern) for pattern in patterns):
            files[name] = path
    return files


def model_patterns(folder: Path) -> tuple[str, ...]:
    """The patterns a model's files were fetched with: ``MODEL_PATTERNS``, plus ``*.bin`` weights when the
    repository has no safetensors."""
    return MODEL_PATTERNS if any(Path(folder).glob("*.safetensors")) else MODEL_PATTERNS + LEGACY_WEIGHTS


def model_snapshot(repo: str, revision: str | None, download: Callable | None = None) -> Path:
    """The cache folder of model ``repo`` at ``revision`` with its weights, configs and tokenizer."""
    folder = repo_snapshot(repo, revision, "model", MODEL_PATTERNS, download)
    if model_patterns(folder) != MODEL_PATTERNS:  # no safetensors: the repository's .bin weights
        folder = repo_snapshot(repo, revision, "model", MODEL_PATTERNS + LEGACY_WEIGHTS, download)
    return folder


def hub_model(repo: str, revision: str | None, allow_unpinned: bool = False,
              download: Callable | None = None) -> tuple[Path, dict]:
    """(the local folder to load, its record): the hub model ``repo`` at ``revision`` from the hub cache, checked
    to be a complete model directory. The record: hub id, the revision asked for, the commit it resolved to (the
    snapshot folder's name), whether that was a pin, and the sha256 of every file loaded from."""
    from harness.data.files import sha256_file
    from harness.model.checkpoints import ModelDirError, check_model_dir

    folder = model_snapshot(repo, revision, download)
    commit = folder.name if COMMIT_SHA.fullmatch(folder.name) else None
    pinned = bool(revision and COMMIT_SHA.fullmatch(revision))
    if pinned and commit != revision:
        raise ValueError(f"hub model {repo}: revision {revision} was asked for, but the hub cache gave the folder "
                         f"{folder} (commit {commit})")
    try:
        check_model_dir(folder)
    except ModelDirError as exc:
        if hub_offline():
            raise HubCacheMiss(f"model {repo}@{revision or 'main'}", f"the cached snapshot is incomplete ({exc})"
                               ) from None
        raise
    files = matching_files(folder, model_patterns(folder))
    record = {"kind": "hub", "repo": repo, "revision": revision or "", "commit": commit, "pinned": pinned,
              "allow_unpinned": allow_unpinned,
              "files_sha256": {name: sha256_file(path) for name, path in files.items()}}
    return folder, record


def local_model(path: Path) -> dict:
    """The record of a model loaded from a local directory: its path and the sha256 of its files."""
    from harness.data.files import sha256_file

    files = {p.name: sha256_file(p) for p in sorted(Path(path).iterdir())
             if p.is_file() and not p.name.startswith(".")}
    return {"kind": "local", "path": str(path), "files_sha256": files}
