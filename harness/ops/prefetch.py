"""``harness prefetch --sweep F``: every hub repository a sweep reads, downloaded into the hub cache at its pinned
revision on a node with hub access (a cluster's login node), so that the sweep's jobs can run with the hub offline.

A sweep reads the hub for its base model (``model.name_or_path`` a hub id, at ``model.revision``: weights, config
and tokenizer), a hub training set (``data.kind: hub``: ``data.hub.files`` at ``data.hub.revision``) and released
checkpoints (a label's ``checkpoint: <hub id>[@revision]``). Prefetch asks huggingface_hub's ``snapshot_download``
for each with the same revision and file patterns the jobs ask for (harness/model/hub.py, harness/data/hub.py),
into the cache huggingface_hub is set to (HF_HUB_CACHE / HF_HOME), and prints the commit each resolved to; an
unpinned one gets the exact YAML line that pins it. The jobs of such a sweep run with HF_HUB_OFFLINE=1 (the harness
CLI sets it, ``offline_jobs``): one whose files were not prefetched stops naming this command.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.config.paths import CONFIG_DIR, REPO_ROOT
from harness.config.schema import COMMIT_SHA, Resolved, is_local_model
from harness.model.hub import (
    MODEL_PATTERNS,
    hub_offline,
    matching_files,
    model_patterns,
    model_snapshot,
    repo_snapshot,
    split_checkpoint,
)


@dataclass(frozen=True)
class HubSource:
    """One hub repository a sweep reads: what it is for, at which revision, which files, and where it is set."""

    role: str  # model (the base model and its tokenizer) | dataset (data.kind: hub) | checkpoint (a released one)
    repo: str
    revision: str  # as configured; "" = the default branch
    repo_type: str  # model | dataset
    patterns: tuple[str, ...]
    where: str  # the file and key that name it

    @property
    def pinned(self) -> bool:
        return bool(COMMIT_SHA.fullmatch(self.revision))

    def pin_line(self, commit: str) -> str:
        """The YAML line that pins this source at ``commit``, and where it goes."""
        if self.role == "checkpoint":
            return f"checkpoint: {self.repo}@{commit}    # in {self.where}"
        unpinned = "; then delete `allow_unpinned: true` there" if self.role == "model" else ""
        return f"revision: {commit}    # {self.where}{unpinned}"


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def _method_file(resolved: Resolved, label: str) -> str:
    dirs = [REPO_ROOT / d if not Path(d).is_absolute() else Path(d) for d in resolved.sweep.method_config_dirs]
    found = next((d / f"{label}.yaml" for d in [*dirs, CONFIG_DIR / "method"] if (d / f"{label}.yaml").is_file()),
                 CONFIG_DIR / "method" / f"{label}.yaml")
    return _shown(found)


def hub_sources(resolved: Resolved) -> list[HubSource]:
    """The hub repositories the sweep's jobs read, in job order (base model, training set, released checkpoints),
    each once."""
    preset = resolved.preset
    preset_file = _shown(CONFIG_DIR / "preset" / f"{resolved.sweep.preset}.yaml")
    sources = []
    model = preset.model
    if model.kind == "pretrained" and model.name_or_path and not is_local_model(model.name_or_path):
        sources.append(HubSource("model", model.name_or_path, model.revision, "model", MODEL_PATTERNS,
                                 f"model.revision, in `model:` of {preset_file} (or the sweep file's override)"))
    if preset.data.kind == "hub":
        hub = preset.data.hub
        sources.append(HubSource("dataset", hub.repo, hub.revision, "dataset", tuple(hub.files),
                                 f"data.hub.revision, in `data: hub:` of {preset_file} (or the sweep file's override)"))
    for label in resolved.sweep.methods:
        spec = resolved.methods.get(label)
        if spec is None or not spec.checkpoint:
            continue
        name, revision = split_checkpoint(spec.checkpoint)
        if not is_local_model(name):
            sources.append(HubSource("checkpoint", name, revision or "", "model", MODEL_PATTERNS,
                                     _method_file(resolved, label)))
    unique: dict[tuple[str, str, str], HubSource] = {}
    for source in sources:
        unique.setdefault((source.repo_type, source.repo, source.revision), source)
    return list(unique.values())


def reads_hub(resolved: Resolved) -> bool:
    """Whether any job of the sweep reads the hub (then its jobs run with the hub offline)."""
    return bool(hub_sources(resolved))


def fetch_source(source: HubSource, download: Callable | None = None) -> dict:
    """Download (or find) ``source`` in the hub cache; what was fetched: folder, commit, files and bytes."""
    if source.repo_type == "model":
        folder = model_snapshot(source.repo, source.revision or None, download)
        files = matching_files(folder, model_patterns(folder))
    else:
        folder = repo_snapshot(source.repo, source.revision or None, source.repo_type, source.patterns, download)
        files = matching_files(folder, source.patterns)
    commit = folder.name if COMMIT_SHA.fullmatch(folder.name) else None
    if source.pinned and commit != source.revision:
        raise ValueError(f"{source.role} {source.repo}: revision {source.revision} was asked for, but the hub cache "
                         f"gave the folder {folder}")
    if not files:
        raise ValueError(f"{source.role} {source.repo}@{source.revision or 'main'}: no file of {list(source.patterns)} "
                         f"in {folder}")
    return {"role": source.role, "repo": source.repo, "revision": source.revision, "commit": commit,
            "pinned": source.pinned, "folder": str(folder), "files": sorted(files),
            "bytes": sum(path.stat().st_size for path in files.values())}


def prefetch(resolved: Resolved, download: Callable | None = None, say: Callable[[str], None] = print) -> list[dict]:
    """Fetch every hub source of the sweep (``hub_sources``), saying what was fetched with its commit and, for an
    unpinned one, the line that pins it. A source that fails is reported and the others still fetched; then a
    ValueError lists the failures."""
    from huggingface_hub import constants

    sources = hub_sources(resolved)
    if not sources:
        say(f"sweep {resolved.sweep.name!r} reads nothing from the hub (no hub model, hub dataset or released "
            "checkpoint): nothing to prefetch")
        return []
    say(f"prefetching {len(sources)} hub repositories of sweep {resolved.sweep.name!r} into {constants.HF_HUB_CACHE}"
        + (" (HF_HUB_OFFLINE is set: checking the cache only)" if hub_offline() else ""))
    fetched, failed = [], []
    for source in sources:
        asked = source.revision or "the default branch"
        try:
            got = fetch_source(source, download)
        except Exception as exc:  # noqa: BLE001  (any hub or network error: report it, fetch the others)
            failed.append(f"{source.role} {source.repo}@{asked}: {type(exc).__name__}: {str(exc).splitlines()[0]}")
            say(f"FAILED {failed[-1]}")
            continue
        fetched.append(got)
        what = "model (weights, config, tokenizer)" if source.role == "model" else source.role
        say(f"{what} {source.repo} @ {asked}: commit {got['commit']}, {len(got['files'])} files, "
            f"{got['bytes'] / 1e9:.2f} GB in {got['folder']}")
        if not source.pinned:
            say(f"  not pinned ({asked} can move): pin it with\n    {source.pin_line(got['commit'])}")
    if failed:
        raise ValueError(f"prefetch: {len(failed)} of {len(sources)} hub repositories were not fetched: "
                         + "; ".join(failed))
    say(f"done: the sweep's jobs can run with HF_HUB_OFFLINE=1 on nodes that see {constants.HF_HUB_CACHE}")
    return fetched
