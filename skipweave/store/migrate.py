"""``skipweave migrate``: rewrite the entries and group files of an older format version to the current one.

Never needed: every version this code ever wrote stays readable (:data:`~skipweave.store.format.versions.READABLE`),
so a run replays a format-1 store as it is. A user migrates to have one format on disk (the fields format 2 added,
what ``ls``/``show`` print), when every skipweave that reads the store reads the current format: to an older
skipweave, which reads format 1 only, a migrated entry is *foreign* (kept, never served).

What is rewritten: only a manifest (``{shard}-{call}.manifest.json``) or a group file (``{shard}-{first}-{last}
.pack.json``), replaced by its migrated form; payload files are never touched, so a reader that read the old
manifest still finds every file it names, and the migrated one names the same files. Migrating a format-1
manifest (:func:`migrated_manifest`) keeps every field and sets ``format_version`` to 2, ``skipweave_version`` to
the skipweave that wrote it (its ``versions.skipweave``; ``"unknown"`` when it gives none), ``fingerprint_rule`` to
``"arguments"`` (the input fingerprint was taken from the arguments as passed, and keeps being matched by that
rule) and adds ``migrated: {"from": 1, "by": <this skipweave's version>, "unix": <when>}``. A group file
(:func:`migrated_group`) gets ``format_version`` 2 and each of its manifests migrated the same way.

How, one file at a time (:func:`apply_migrate`): under the part's file lock
(:func:`~skipweave.store.parts.part_lock`, the one writers, set-aside and ``gc`` take), the file is read and judged
again; the migrated form is written under a ``.tmp-`` name with the old file's permissions and times, fsynced,
judged by the function a run uses (:func:`~skipweave.store.validity.check_entry` /
:func:`~skipweave.store.validity.check_group`), renamed over the old file (the commit) and the folder fsynced. A
SIGKILL at any instant leaves the file old or migrated, never neither (at most a ``.tmp-`` file, which ``gc``
removes), and a rerun migrates what is left. The old file's modification time is kept: migrating is not a write of
the recording, and ``gc --min-age`` and retention judge a part's age by its files' times.

What is not rewritten: a file already at the current version (``current``); a file of a version this code does
not read (``foreign``, :class:`~skipweave.store.errors.EntryForeign`: kept byte for byte); an entry or group that is
not valid before migration (``corrupt``: a run would not serve it either; ``skipweave gc`` deals with it); a part
whose lock a writer holds (``skipped``, :data:`LOCK_WAIT_S`). Set-aside folders and trash are never walked.
"""

from __future__ import annotations

import enum
import logging
import os
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import filelock

from skipweave.store.atomic import tmp_name_in
from skipweave.store.errors import EntryForeign, EntryInvalid, StoreMoved
from skipweave.store.format import jsonio
from skipweave.store.format.group import GROUP_MAX_BYTES
from skipweave.store.format.layout import (
    SET_ASIDE_DIR,
    EntryKey,
    parse_group_name,
    parse_manifest_name,
    role_dir,
)
from skipweave.store.format.manifest import MANIFEST_MAX_BYTES, read_json
from skipweave.store.format.versions import FORMAT_VERSION, fingerprint_rule, version_of, written_by
from skipweave.store.fs import is_step_name, name_problem, open_dir, open_new, remove_names, same_folder
from skipweave.store.parts import part_lock
from skipweave.store.validity import check_entry, check_group

logger = logging.getLogger(__name__)

__all__ = ["LOCK_WAIT_S", "MigrateItem", "MigratePlan", "Outcome", "apply_migrate", "migrated_group",
           "migrated_manifest", "plan_migrate"]

LOCK_WAIT_S = 10.0
"""Seconds ``migrate --yes`` waits for a writer's part lock before it leaves the file for a rerun (``skipped``). A
writer holds it while it commits one entry or group (a large payload: seconds), never for a whole step."""

UNKNOWN_WRITER = "unknown"
"""``skipweave_version`` of a migrated manifest whose format-1 ``versions`` name no skipweave."""


class Outcome(str, enum.Enum):
    """What became (or, in a dry run, would become) of one manifest or group file."""

    WOULD_MIGRATE = "would_migrate"
    MIGRATED = "migrated"
    CURRENT = "current"
    FOREIGN = "foreign"
    CORRUPT = "corrupt"
    SKIPPED = "skipped"
    FAILED = "failed"
    GONE = "gone"


NOT_MIGRATED = frozenset({Outcome.CORRUPT, Outcome.SKIPPED, Outcome.FAILED})
"""Outcomes of an old file left old: ``skipweave migrate`` exits 1 when any item has one."""


@dataclass
class MigrateItem:
    """One manifest or group file: what ``migrate`` found and did.

    Attributes:
        kind: ``"entry"`` (a manifest of its own) or ``"group"`` (a group file of small entries).
        path: the file.
        key: its entry (a group's: its first call).
        last: the last call it holds (an entry's own call).
        version: its ``format_version`` as found, ``None`` when it has none readable.
        writer: the skipweave version that wrote it, when it says.
        outcome: what became of it (``None`` until :func:`apply_migrate` ran).
        detail: why it is corrupt, foreign, skipped or failed, else ``None``.
    """

    kind: str
    path: str
    key: EntryKey
    last: int
    version: int | None = None
    writer: str | None = None
    outcome: Outcome | None = None
    detail: str | None = None

    @property
    def entries(self) -> int:
        """How many entries the file holds (a group: one per call of its range)."""
        return self.last - self.key.call + 1

    @property
    def where(self) -> str:
        """Short human label: ``v1/rollout gen step 1 shard r0 call 0``, ``... calls 0-15``."""
        k = self.key
        calls = f"call {k.call}" if self.kind == "entry" else f"calls {k.call}-{self.last}"
        return f"{k.namespace}/{k.role} {k.target} step {k.step} shard {k.shard} {calls}"


@dataclass
class MigratePlan:
    """Every manifest and group file of a dump dir, in the order they are migrated.

    Attributes:
        dump_dir: the absolute dump dir.
        items: by namespace, role, step, target and file name.
        ignored: symlinks found where folders of entries belong, each ``(path, why)``: never followed.
    """

    dump_dir: str
    items: list[MigrateItem] = field(default_factory=list)
    ignored: list[tuple[str, str]] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------- the rewrite
def migrated_manifest(manifest: Mapping[str, Any], *, by: str, unix: float) -> dict[str, Any]:
    """The current-version form of a readable older manifest (the module docstring says what changes).

    Every field is kept, in its order; the fields a version adds go where a writer of that version puts them
    (:func:`~skipweave.store.format.manifest.build_manifest`), ``migrated`` last.

    Args:
        manifest: a parsed manifest of a version below :data:`~skipweave.store.format.versions.FORMAT_VERSION`.
        by: this skipweave's version, for ``migrated.by``.
        unix: the time of the migration (seconds since the epoch), for ``migrated.unix``.

    Raises:
        ValueError: ``manifest`` is not of a version this code migrates (1).
    """
    version = manifest.get("format_version")
    if version not in _UPGRADES:
        raise ValueError(f"no migration from format version {version!r} (migrated: {sorted(_UPGRADES)})")
    out = dict(manifest)
    while out["format_version"] != FORMAT_VERSION:
        out = _UPGRADES[out["format_version"]](out)
    out.pop("migrated", None)  # (a field of that name in an old manifest is no record of this migration)
    out["migrated"] = {"from": version, "by": by, "unix": unix}
    return out


def _v1_to_v2(manifest: dict[str, Any]) -> dict[str, Any]:
    """Format 1 -> 2: ``skipweave_version`` after ``format_version``, ``fingerprint_rule: "arguments"`` after
    ``input_fingerprint`` (format 1 hashed the arguments as passed, see
    :func:`~skipweave.store.format.versions.fingerprint_rule`)."""
    writer = manifest.get("skipweave_version")
    if not isinstance(writer, str):
        versions = manifest.get("versions")
        writer = versions.get("skipweave") if isinstance(versions, dict) else None
    writer = writer if isinstance(writer, str) else UNKNOWN_WRITER
    out: dict[str, Any] = {}
    for name, value in manifest.items():
        if name in ("skipweave_version", "fingerprint_rule"):
            continue  # set below, where a format-2 writer puts them
        out[name] = value
        if name == "format_version":
            out.update(format_version=2, skipweave_version=writer)
        elif name == "input_fingerprint":
            out["fingerprint_rule"] = "arguments"
    out.setdefault("fingerprint_rule", "arguments")
    return out


_UPGRADES: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _v1_to_v2}
"""Version -> the step to the next version. Migrating applies them in turn up to the current version."""


def migrated_group(group: Mapping[str, Any], *, by: str, unix: float) -> dict[str, Any]:
    """The current-version form of a readable older group file: its ``format_version`` and each of its manifests
    of an older version migrated (:func:`migrated_manifest`); every other field kept.

    Raises:
        ValueError: a version this code does not migrate.
    """
    out = dict(group)
    out["format_version"] = FORMAT_VERSION
    out["entries"] = [e if e.get("format_version") == FORMAT_VERSION else migrated_manifest(e, by=by, unix=unix)
                      for e in group["entries"]]
    return out


# ---------------------------------------------------------------------------------------------- the walk
def plan_migrate(dump_dir: str) -> MigratePlan:
    """List every manifest and group file below ``dump_dir`` (``{namespace}/{role}/{step}/{target}/``); nothing is
    read but folder listings.

    Only the names a run reads are walked (:mod:`skipweave.store.format.layout`): no hidden name (``.runs``,
    ``.trash-*``, ``.tmp-*``, locks), no ``_set_aside`` folder, no symlink (listed in ``ignored``).

    Raises:
        FileNotFoundError: ``dump_dir`` does not exist.
        NotADirectoryError: ``dump_dir`` is not a folder.
        PermissionError: a folder cannot be listed.
    """
    dump_dir = os.path.abspath(dump_dir)
    if not os.path.exists(dump_dir):
        raise FileNotFoundError(f"{dump_dir} does not exist")
    if not os.path.isdir(dump_dir):
        raise NotADirectoryError(f"{dump_dir} is not a folder")
    plan = MigratePlan(dump_dir)
    for namespace in _folders(plan, dump_dir):
        for role in _folders(plan, os.path.join(dump_dir, namespace)):
            rdir = role_dir(dump_dir, namespace, role)
            steps = sorted(int(n) for n in _folders(plan, rdir) if is_step_name(n))
            for step in steps:
                step_dir = os.path.join(rdir, str(step))
                for target in _folders(plan, step_dir):
                    _list_target(plan, EntryKey(namespace, role, step, target, "", 0), os.path.join(step_dir, target))
    return plan


def _folders(plan: MigratePlan, folder: str) -> list[str]:
    """The real sub-folders of ``folder`` named as skipweave names them, sorted; symlinks go to ``plan.ignored``."""
    names = []
    try:
        it = os.scandir(folder)
    except (FileNotFoundError, NotADirectoryError):  # removed meanwhile (retention renamed a step away): nothing
        return []
    with it:
        for d in it:
            if d.name.startswith(".") or d.name == SET_ASIDE_DIR:
                continue
            if d.is_symlink():
                plan.ignored.append((d.path, "a symlink (never followed)"))
            elif d.is_dir(follow_symlinks=False) and name_problem(d.name) is None:
                names.append(d.name)
    return sorted(names)


def _list_target(plan: MigratePlan, base: EntryKey, folder: str) -> None:
    try:
        names = sorted(os.listdir(folder))
    except (FileNotFoundError, NotADirectoryError):  # removed meanwhile
        return
    for name in names:
        path = os.path.join(folder, name)
        if (parsed := parse_manifest_name(name)) is not None and name_problem(parsed[0]) is None:
            key = EntryKey(base.namespace, base.role, base.step, base.target, parsed[0], parsed[1])
            plan.items.append(MigrateItem("entry", path, key, key.call))
        elif (grouped := parse_group_name(name)) is not None and name_problem(grouped[0]) is None:
            key = EntryKey(base.namespace, base.role, base.step, base.target, grouped[0], grouped[1])
            plan.items.append(MigrateItem("group", path, key, grouped[2]))


# ---------------------------------------------------------------------------------------------- one file
def apply_migrate(item: MigrateItem, *, dry_run: bool, unix: float | None = None,
                  lock_wait: float = LOCK_WAIT_S) -> None:
    """Judge one file and, unless ``dry_run``, migrate it; set ``item``'s ``outcome``, ``detail``, ``version`` and
    ``writer``. Never raises for one file: what goes wrong is its ``failed`` outcome.

    Args:
        item: from :func:`plan_migrate`.
        dry_run: judge only (no lock taken, nothing written): ``would_migrate`` for a file ``--yes`` migrates.
        unix: the time recorded in ``migrated.unix`` (seconds since the epoch); now when ``None``.
        lock_wait: seconds to wait for the part's lock before ``skipped``.
    """
    try:
        if dry_run:
            if _judge(item) is not None:
                item.outcome = Outcome.WOULD_MIGRATE
            return
        with part_lock(os.path.dirname(item.path), item.key.shard, timeout=lock_wait):
            judged = _judge(item)  # again under the lock: a writer may have replaced the file since it was listed
            if judged is None:
                return
            data, st = judged
            note = _commit(item, data, st, time.time() if unix is None else unix)
        item.outcome, item.detail = Outcome.MIGRATED, note
        logger.debug("skipweave migrate: %s migrated from format %s", item.path, item.version)
    except filelock.Timeout:
        item.outcome = Outcome.SKIPPED
        item.detail = f"a writer held the part's lock for {lock_wait:g} s; a rerun migrates it"
    except Exception as exc:  # OSError, or what a crafted file provokes: this file fails, the others go on
        item.outcome, item.detail = Outcome.FAILED, f"{type(exc).__name__}: {exc}"
        logger.info("skipweave migrate: %s failed (%s)", item.path, item.detail)


def _judge(item: MigrateItem) -> tuple[dict[str, Any], os.stat_result] | None:
    """Read and judge ``item``'s file. Returns the parsed file and its ``lstat`` when it is to be migrated, else
    ``None`` with ``item.outcome`` set (current, foreign, corrupt, gone)."""
    group = item.kind == "group"
    what = "group" if group else "manifest"
    try:
        st = os.lstat(item.path)
        data = read_json(item.path, GROUP_MAX_BYTES if group else MANIFEST_MAX_BYTES, what)
        item.writer = _writer(data)
        item.version = version_of(data, item.path, what)
        versions = {item.version}
        if group and isinstance(data.get("entries"), list):  # a group's manifests carry their own version
            versions |= {version_of(e, f"{item.path} (call {item.key.call + i})")
                         for i, e in enumerate(data["entries"]) if isinstance(e, dict)}
    except FileNotFoundError:
        item.outcome, item.detail = Outcome.GONE, "removed since it was listed"
        return None
    except EntryForeign as exc:  # the file, or one manifest of a group: either way the file is kept as it is
        item.outcome, item.detail = Outcome.FOREIGN, str(exc)
        if exc.path == item.path:
            item.version, item.writer = exc.version, exc.writer or item.writer
        return None
    except EntryInvalid as exc:
        item.outcome, item.detail = Outcome.CORRUPT, f"{exc}; not migrated (skipweave gc removes it)"
        return None
    if versions == {FORMAT_VERSION}:
        item.outcome, item.detail = Outcome.CURRENT, None
        return None
    reason, data = _invalid(item, item.path, checksums=True, judged=data)
    if reason is not None:
        item.outcome, item.detail = Outcome.CORRUPT, f"{reason}; not migrated (skipweave gc removes it)"
        return None
    return data, st


def _writer(data: Any) -> str | None:
    """The skipweave that wrote a parsed manifest or group file (a group file's: its first manifest's)."""
    if not isinstance(data, dict):
        return None
    found = written_by(data)
    entries = data.get("entries")
    if found is None and isinstance(entries, list) and entries and isinstance(entries[0], dict):
        found = written_by(entries[0])
    return found


def _invalid(item: MigrateItem, path: str, *, checksums: bool, judged: Any) -> tuple[str | None, Any]:
    """Why the file at ``path`` (``item``'s, or its migrated form under a temporary name) would not be served for
    ``item``'s entries, by the judgement of runs; ``None`` when every entry would be. Also returns the parsed file
    that was judged (``judged`` when the judgement read none)."""
    try:
        if item.kind == "entry":
            validity = check_entry(path, checksums=checksums, allow_pickle=True, key=item.key)
            return validity.reason, validity.manifest if validity.manifest is not None else judged
        checked = check_group(path, item.key, item.key.call, item.last, checksums=checksums, allow_pickle=True)
    except FileNotFoundError:
        return f"{path} is gone", judged
    except EntryForeign as exc:  # (read before as readable: replaced meanwhile)
        return str(exc), judged
    if checked is None:
        return f"{path} is gone", judged
    group, by_call = checked
    reasons = [v.reason for _, v in sorted(by_call.items()) if v.reason is not None]
    return (reasons[0] if reasons else None), group if group is not None else judged


def _commit(item: MigrateItem, old: dict[str, Any], st: os.stat_result, unix: float) -> str | None:
    """Write ``old``'s migrated form under a temporary name (``old``'s permissions and times), fsync it, judge it,
    rename it over ``item.path`` and fsync the folder. The caller holds the part's lock.

    Returns:
        ``None``, or what went wrong after the commit (the folder's fsync): the file is migrated all the same.

    Raises:
        EntryInvalid: the migrated form would not be served (nothing was replaced).
        StoreMoved: the folder was moved or removed meanwhile (nothing was replaced).
        OSError: a write, fsync or rename failed (nothing was replaced, no temporary file is left).
    """
    from skipweave.version import __version__

    if item.kind == "group":
        new = migrated_group(old, by=__version__, unix=unix)
        data = jsonio.dumps(new)  # as the writer writes group files (commit.Committer)
        pairs = list(zip(old["entries"], new["entries"], strict=True))
    else:
        new = migrated_manifest(old, by=__version__, unix=unix)
        data = jsonio.dumps_spaced(new, indent=1)  # as the writer writes manifests, for people to read
        pairs = [(old, new)]
    if any(fingerprint_rule(a) != fingerprint_rule(b) or a.get("input_fingerprint") != b.get("input_fingerprint")
           for a, b in pairs):  # (by construction: a migrated entry is matched as it always was)
        raise EntryInvalid(f"the migrated form of {item.path} would match calls by another fingerprint rule")
    folder, name = os.path.split(item.path)
    dir_fd = open_dir(folder)
    tmp = tmp_name_in(folder, name)
    try:
        fd = open_new(tmp, dir_fd=dir_fd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, stat.S_IMODE(st.st_mode))
            os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))
            os.fsync(fd)
        finally:
            os.close(fd)
        reason, _ = _invalid(item, os.path.join(folder, tmp), checksums=False, judged=None)  # payload: checked above
        if reason is not None:
            raise EntryInvalid(f"its migrated form would not be served ({reason}); the file is left as it was")
        if not same_folder(folder, dir_fd):
            raise StoreMoved(f"{folder} was moved or removed while {item.path} was being migrated; nothing changed")
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)  # the commit
    except BaseException:
        remove_names(dir_fd, [tmp])
        os.close(dir_fd)
        raise
    try:
        os.fsync(dir_fd)
    except OSError as exc:
        return f"migrated, but the folder's fsync failed ({type(exc).__name__}: {exc})"
    finally:
        os.close(dir_fd)
    return None

