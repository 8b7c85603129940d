"""Blessing a marked test's fresh recording (``--skipweave-mode=record``): it takes the place of the committed one
(a dump dir renamed over, a bundle packed anew), and only a skipweave recording is ever replaced."""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from pathlib import Path

from skipweave.testing.errors import GoldenError

logger = logging.getLogger("skipweave.testing.golden")  # the records keep the logger they were written under


def bless(fresh: Path, recording: Path) -> None:
    """Put the ``fresh`` recording in the place of ``recording`` (a folder beside it): the old one is renamed aside
    first and removed last, so that an interruption leaves one of the two in place, never a mix. The run marks the
    recording run left (``.runs``: which process of that run called what, read by that run only) are not part of it:
    a committed recording holds its entries only.

    Raises:
        GoldenError: something that is not a skipweave dump dir (nor an empty folder) is at ``recording``: nothing
            is touched.
    """
    from skipweave.store.fs import RUNS

    problem = replace_problem(recording, "dump_dir")
    if problem is not None:
        raise GoldenError(f"skipweave: {problem}; {recording} left as it was")
    shutil.rmtree(fresh / RUNS, ignore_errors=True)
    old = None
    if recording.exists() or recording.is_symlink():
        old = recording.with_name(f".{recording.name}.old-{uuid.uuid4().hex[:12]}")
        os.rename(recording, old)
    os.rename(fresh, recording)
    if old is not None:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old)
        else:
            old.unlink()
    logger.info("skipweave: blessed %s", recording)


def bless_bundle(fresh: Path, bundle: Path) -> None:
    """Pack the ``fresh`` recording (a folder beside ``bundle``) into ``bundle``, then remove the folder. The pack is
    written under a temporary name and renamed over the old bundle once whole
    (:func:`skipweave.store.bundle.pack.pack`): an interruption leaves the old bundle.

    Raises:
        GoldenError: the fresh recording holds no complete step to pack, or something that is not a skipweave bundle
            is at ``bundle`` (the old file is left as it was).
    """
    from skipweave.store.bundle.pack import PackError, pack

    problem = replace_problem(bundle, "bundle")
    if problem is not None:
        raise GoldenError(f"skipweave: {problem}; {bundle} left as it was")
    try:
        result = pack(str(fresh), str(bundle))
    except PackError as exc:
        raise GoldenError(f"skipweave: {bundle} left as it was: the test's recording in {fresh} could not be packed: "
                          f"{exc}") from None
    shutil.rmtree(fresh, ignore_errors=True)
    logger.info("skipweave: blessed %s (%d entries, %d bytes)", bundle, result.entries, result.bytes)


def replace_problem(recording: Path, kind: str) -> str | None:
    """Why blessing must not replace what is at ``recording``, or ``None`` (nothing there, or a recording).

    Blessing renames the old recording aside and removes it, so only a skipweave recording may go: for ``dump_dir``,
    a folder the store's scan (:func:`skipweave.store.scan.scan`, what ``skipweave ls`` reads) finds entries or
    leftovers in, holding nothing skipweave never writes (no file beside its namespaces, nothing the scan ignores),
    or an empty folder; for ``bundle``, a file skipweave reads as a bundle.

    Args:
        recording: the marker's recording path.
        kind: ``dump_dir`` or ``bundle``.
    """
    if not recording.exists() and not recording.is_symlink():
        return None
    if kind == "bundle":
        from skipweave.store.bundle.archive import BundleArchive, BundleRefused

        try:
            with BundleArchive(str(recording)):
                return None
        except (BundleRefused, OSError) as exc:
            return f"{recording} is not a skipweave bundle, which is all blessing replaces ({exc})"
    if not recording.is_dir():
        return f"{recording} is not a folder, and blessing replaces a skipweave dump dir only"
    from skipweave.store.scan import scan

    try:
        names = sorted(os.listdir(recording))
        if not names:
            return None
        found = scan(str(recording))
    except OSError as exc:
        return f"{recording} cannot be read ({exc}), and blessing replaces a skipweave dump dir only"
    files = [n for n in names if not n.startswith(".") and not (recording / n).is_dir()]
    if not found.parts and not found.leftovers:
        return (f"{recording} is not a skipweave dump dir (the store's scan finds no entry in it: "
                f"`skipweave ls {recording}`), and blessing replaces nothing else")
    if files or found.ignored:
        what = files[0] if files else f"{found.ignored[0][0]} ({found.ignored[0][1]})"
        return f"{recording} holds what skipweave never writes ({what}), and blessing would remove it"
    return None
