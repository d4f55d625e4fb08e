"""Who can change a sweep's results folder: ``results/<sweep>`` (``Resolved.results_dir``) and the folders above it
are refused when a user other than you could put files or links there (issue #36 item 6; docs/cluster-security.md).

A planted folder or file there would be read as the sweep's own (Snakemake takes a planted ``data/`` or warm start
as done), and a planted link would be written through (a root dry run overwrote a root-only file through a
``sweep.yaml`` link). So, before a Snakemake parse or a ``harness`` command reads or writes the sweep folder
(``secure_sweep_folder``), every folder on the way to it is looked at, following symbolic links as the kernel does:

- the sweep folder itself (where a link ``results/<sweep>`` leads), the folder holding it and the configured
  ``results_dir`` must belong to you or root, and the sweep folder must be writable by you alone: a sticky bit does
  not stop others from creating the names the sweep has not written yet;
- no folder on the way, from ``/`` down, may be writable by group or others without the sticky bit (which stops them
  from renaming or removing your entries: ``/tmp``), or whoever can write it could swap what lies below. Their owners
  above ``results_dir`` (home, project and scratch roots) are not asked for: they are the site's.

A folder of your own private group (the group named like you, your primary group, with no other member) counts as
yours, so a umask of 002 is no problem. ``results_trusted_group: <group>`` (a group you belong to) accepts folders of
that group that belong to another user or are writable by the group: a lab's shared project folder. The setting is
part of the resolved sweep, so every run.json records it.

Missing folders are created one at a time with ``mkdir`` (mode 0755 less the umask), which fails on a link put
there meanwhile, and the whole way is looked at again afterwards. From then on the process creates files and folders
writable by you alone (the umask gains 022), so what the jobs create below the sweep folder stays as closed as the
folder (subfolders are not walked: a sweep folder made with a loose umask is refused as a whole).
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from pathlib import Path

from harness.config.paths import REPO_ROOT
from harness.config.schema import ConfigError, Resolved

MAX_LINKS = 40  # symbolic links followed on one walk, as the kernel's limit
MAX_CREATE_RETRIES = 100  # a name that keeps disappearing between mkdir and lstat


class UnsafeFolderError(ValueError):
    """A folder on the way to a sweep's results that another user could change; the message names it, its owner,
    group and mode, and the fix."""


def secure_sweep_folder(resolved: Resolved, create: bool = True) -> Path | None:
    """Check the sweep folder of ``resolved`` and the folders on the way to it (module docstring); with ``create``,
    create the missing ones and return the sweep folder's real path, else return it (None when it does not exist
    yet: only the existing folders were looked at). Raises UnsafeFolderError or ConfigError (an unusable
    ``results_trusted_group``). Tightens this process's umask (no group or other write) either way."""
    tighten_umask()
    trusted = trusted_group_id(resolved.sweep.results_trusted_group)
    configured = REPO_ROOT / resolved.sweep.results_dir  # an absolute results_dir stays as it is
    real = check_sweep_folder(configured, resolved.sweep.name, trusted, create=False)
    if real is None and create:
        real = check_sweep_folder(configured, resolved.sweep.name, trusted, create=True)
    return None if real is None else Path(real)


def tighten_umask() -> None:
    """Files and folders this process (and the jobs it starts) creates are writable by their owner alone."""
    os.umask(os.umask(0o022) | 0o022)


def trusted_group_id(name: str) -> int | None:
    """The gid of ``results_trusted_group`` (None when empty): a group that exists and that you belong to."""
    if not name:
        return None
    try:
        gid = grp.getgrnam(name).gr_gid
    except KeyError:
        raise ConfigError(f"key 'results_trusted_group': no group {name!r} on this machine") from None
    if gid != os.getegid() and gid not in os.getgroups():
        raise ConfigError(f"key 'results_trusted_group': you ({_user(os.geteuid())}) are not a member of group "
                          f"{name!r}: only the members of a group you belong to can be trusted with your results")
    return gid


def check_sweep_folder(results_dir: Path, name: str, trusted_gid: int | None, create: bool) -> str | None:
    """The real path of ``results_dir/name`` once every folder on the way passed (module docstring); None when a
    folder is missing and not ``create``d."""
    results_dir = Path(os.path.abspath(results_dir))  # '..' stays: the walk resolves it after any link before it
    above, real_results = _walk("/", str(results_dir).split("/"), create)
    for folder in above:
        _refuse(_writable_problem(folder, os.lstat(folder), trusted_gid, sticky_ok=True))
    if real_results is None:
        return None
    _refuse(_owner_problem(real_results, os.lstat(real_results), trusted_gid, "the results folder (results_dir)"))
    below, real_sweep = _walk(real_results, [name], create)
    for folder in below:
        _refuse(_writable_problem(folder, os.lstat(folder), trusted_gid, sticky_ok=True))
    if real_sweep is None:
        return None
    holder = os.path.dirname(real_sweep)
    _refuse(_owner_problem(holder, os.lstat(holder), trusted_gid, "the folder holding the sweep folder"))
    info = os.lstat(real_sweep)
    _refuse(_owner_problem(real_sweep, info, trusted_gid, "the sweep folder"))
    _refuse(_writable_problem(real_sweep, info, trusted_gid, sticky_ok=False))
    return real_sweep


def _walk(start: str, parts: list[str], create: bool) -> tuple[list[str], str | None]:
    """(every folder looked up on the way from folder ``start`` along ``parts``, where the way ends): symbolic links
    are followed (their targets walked from the folder holding them, or from ``/``); a missing folder is created
    with mkdir when ``create`` (it fails on a name taken meanwhile, which is then looked at), else the walk ends
    there (None)."""
    pending = list(reversed(parts))
    current, visited, links, retries = start, [start], 0, 0
    while pending:
        part = pending.pop()
        if part in ("", "."):
            continue
        if part == "..":
            current = os.path.dirname(current)  # a folder already on the way
            continue
        candidate = os.path.join(current, part)
        try:
            info = os.lstat(candidate)
        except FileNotFoundError:
            if not create:
                return visited, None
            retries += 1
            if retries > MAX_CREATE_RETRIES:
                raise UnsafeFolderError(f"{candidate}: created and gone again {MAX_CREATE_RETRIES} times") from None
            try:
                os.mkdir(candidate, 0o755)
            except FileExistsError:
                pass
            pending.append(part)
            continue
        if stat.S_ISLNK(info.st_mode):
            links += 1
            if links > MAX_LINKS:
                raise UnsafeFolderError(f"{candidate}: more than {MAX_LINKS} symbolic links on the way to it")
            target = os.readlink(candidate)
            if target.startswith("/"):
                current = "/"
            pending.extend(reversed(target.split("/")))
            continue
        if not stat.S_ISDIR(info.st_mode):
            raise UnsafeFolderError(f"{candidate} is not a folder, but a results folder's path leads through it")
        current = candidate
        if current not in visited:
            visited.append(current)
    return visited, current


def _refuse(problem: str | None) -> None:
    if problem:
        raise UnsafeFolderError(f"refusing results folder {problem}")


def _owner_problem(folder: str, info: os.stat_result, trusted_gid: int | None, role: str) -> str | None:
    """``folder`` belongs to another user than you or root (and not to the trusted group)."""
    me = os.geteuid()
    if info.st_uid in (me, 0) or (trusted_gid is not None and info.st_gid == trusted_gid):
        return None
    return (f"{folder} ({role}): it belongs to {_user(info.st_uid)} (group {_group(info.st_gid)}, mode "
            f"{_mode(info)}), not to you ({_user(me)}){' or root' if me else ''}: that user can put files and links "
            "in it that the sweep would take as its own results or write through. Use a results folder of your own "
            "(results_dir, or another sweep name), or have it handed to you (chown)" + _trust_hint(info, trusted_gid))


def _writable_problem(folder: str, info: os.stat_result, trusted_gid: int | None, sticky_ok: bool) -> str | None:
    """``folder`` is writable by others, or by a group that is neither your private group nor the trusted one,
    without the sticky bit (``sticky_ok``; the sweep folder gets no such leave)."""
    sticky = bool(info.st_mode & stat.S_ISVTX) and sticky_ok
    others = bool(info.st_mode & stat.S_IWOTH) and not sticky
    group = (bool(info.st_mode & stat.S_IWGRP) and not sticky and info.st_gid != trusted_gid
             and not _own_private_group(info.st_gid))
    if not (others or group):
        return None
    who = "others" if others else f"group {_group(info.st_gid)}"
    why = (": the sweep folder must be writable by you alone (a sticky bit would not stop others from creating "
           "the names the sweep has not written yet)" if not sticky_ok else
           " without the sticky bit, so they can rename what lies below and put their own folder in its place")
    fix = f"chmod {'o-w' if others and not group else 'go-w'} {folder}"
    return (f"{folder}: it is writable by {who} (owner {_user(info.st_uid)}, mode {_mode(info)}){why}. Fix: "
            f"{fix}" + ("" if others else _trust_hint(info, trusted_gid)))


def _trust_hint(info: os.stat_result, trusted_gid: int | None) -> str:
    if trusted_gid is not None:
        return ""
    return (f"; or, if it is a shared folder of your lab's group {_group(info.st_gid)} and you trust its members, "
            f"set results_trusted_group: {_group_name(info.st_gid)} in the sweep (--config "
            f"set=results_trusted_group={_group_name(info.st_gid)}; every run.json records it)")


def _own_private_group(gid: int) -> bool:
    """``gid`` is your user private group: your primary group, named like you, with no other member."""
    try:
        user = pwd.getpwuid(os.geteuid())
        group = grp.getgrgid(gid)
    except KeyError:
        return False
    return gid == user.pw_gid and group.gr_name == user.pw_name and set(group.gr_mem) <= {user.pw_name}


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _group(gid: int) -> str:
    return f"{_group_name(gid)} (gid {gid})"


def _mode(info: os.stat_result) -> str:
    return f"{stat.S_IMODE(info.st_mode):04o}"
