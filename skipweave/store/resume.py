"""Resuming a part an interrupted run left short: its entries serve the calls they were recorded for, and only the
missing calls run live.

Part of :class:`~skipweave.store.step_store.StepStore` (through :class:`~skipweave.store.parts.PartStates`). A run
killed in the middle of a step of per-sample calls (verl's fully-async rollouter: hundreds of calls per step) leaves
a part that holds fewer calls than a step makes and was never closed. When the caller says the target's calls can be
matched by their inputs (:meth:`~skipweave.store.step_store.StepStore.prepare_part` ``resumable``) and every entry of
the part carries an input fingerprint, the part is *resumed* instead of set aside:

- the calls of this process at that step are matched to its entries by input fingerprint only, never by position
  (:func:`~skipweave.policy.matching.match_call` ``inputs_only``); each entry serves at most one call;
- the calls no entry matches run live and are recorded into the part's free slots (the caller picks them, see
  :meth:`~skipweave.weaving.calls.CallLedger.free_slot`);
- when this process closes the part, the interrupted run's entries that no call of this process was served are
  set aside (:func:`set_aside_calls`, one WARNING with their number): their inputs differed, and a closed part holds
  only what its step made.

Nothing of this is written to disk: a process that resumes a part and ends before closing it leaves it as the next
run finds it again (short and open, resumed again).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from skipweave.store.atomic import fsync_dir
from skipweave.store.folders import RoleFolders
from skipweave.store.format.layout import TMP_PREFIX, EntryKey, group_stem
from skipweave.store.format.manifest import seconds_of
from skipweave.store.format.versions import fingerprint_rule
from skipweave.store.identity import Recorded
from skipweave.store.index import calls_in
from skipweave.store.pending import Part
from skipweave.store.staging import EntryMeta

if TYPE_CHECKING:
    from skipweave.store.role_access import EntryRewriter
    from skipweave.store.staging import Item

logger = logging.getLogger(__name__)


class Resumes:
    """The parts this process resumes: which calls the interrupted run committed, and which of them served.

    Args:
        lock: the store's lock (reentrant), which guards this too.
    """

    def __init__(self, lock: threading.RLock) -> None:
        self.lock = lock
        self._calls: dict[Part, frozenset[int]] = {}  # part -> the calls the interrupted run committed
        self._served: dict[Part, set[int]] = {}  # part -> those of them that served a call of this process

    @staticmethod
    def matchable(recorded: Sequence[Recorded], committed: Collection[int]) -> bool:
        """True when every committed call of a part (``committed``) has a readable entry with an input fingerprint
        among ``recorded``: only then can each be matched to the call it was recorded for (an entry imported from
        verl has none)."""
        return bool(recorded) and len(recorded) == len(committed) and all(r.fingerprint for r in recorded)

    def adopt(self, part: Part, calls: Collection[int]) -> None:
        """Resume ``part``, whose entries (``calls``) an interrupted run committed."""
        with self.lock:
            self._calls[part] = frozenset(calls)
            self._served[part] = set()

    def holds(self, part: Part) -> bool:
        """True while this process resumes ``part`` (adopted and not closed)."""
        return part in self._calls

    def steps(self) -> set[int]:
        """The steps of the parts being resumed."""
        with self.lock:
            return {part[0] for part in self._calls}

    def calls(self, part: Part) -> frozenset[int]:
        """The calls the interrupted run committed into ``part`` (empty when it is not resumed)."""
        return self._calls.get(part, frozenset())

    def served(self, part: Part, call: int) -> None:
        """Entry ``call`` of the resumed ``part`` served a call of this process: it stays when the part closes."""
        with self.lock:
            served = self._served.get(part)
            if served is not None:
                served.add(call)

    def unclaimed(self, part: Part) -> frozenset[int]:
        """The interrupted run's calls of ``part`` that served no call of this process (so far)."""
        with self.lock:
            return self._calls.get(part, frozenset()) - self._served.get(part, set())

    def forget(self, part: Part) -> None:
        """``part`` was closed (or set aside): it is an ordinary part from now on."""
        with self.lock:
            self._calls.pop(part, None)
            self._served.pop(part, None)


def set_aside_calls(folders: RoleFolders, part: Part, calls: frozenset[int], *,
                    lock: Callable[[str, str], AbstractContextManager[Any]],
                    keep_grouped: Callable[[list[EntryKey]], bool]) -> str | None:
    """Move the entries of ``calls`` of one part to ``_set_aside/{step}-{target}-{shard}-unclaimed-{time}/``.

    A call committed in a group file shares its files with the group's other calls: the group's calls that stay are
    first written again as entries of their own (``keep_grouped``, which a call's own manifest then serves), and only
    then is the group moved.

    Args:
        folders: the role's folders.
        part: ``(step, target, shard)``.
        calls: the calls to move.
        lock: ``part_lock(folder, shard)``, held while files are moved.
        keep_grouped: writes the given grouped calls again as entries of their own; returns False when it could not
            (nothing is moved then).

    Returns:
        The folder the entries went to, or ``None`` when nothing was moved.

    Raises:
        UnsafePath: the part's folder or ``_set_aside`` is a symlink or a file (nothing is moved).
    """
    step, target, shard = part
    folder = folders.folder(step, target)
    own, groups = calls_in(os.listdir(folder), shard)
    touched = [g for g in groups if any(g[0] <= c <= g[1] for c in calls)]
    keep = sorted({c for first, last, _ in touched for c in range(first, last + 1)} - set(calls) - own)
    if keep and not keep_grouped([folders.key(step, target, shard, c) for c in keep]):
        return None
    stems = [folders.key(step, target, shard, c).stem for c in sorted(calls & own)]
    stems += [group_stem(shard, first, last) for first, last, _ in touched]
    if not stems:
        return None
    when = time.strftime("%Y%m%dT%H%M%S") + f"-{uuid.uuid4().hex[:6]}"
    dest = folders.set_aside_folder(f"{step}-{target}-{shard}-unclaimed-{when}")
    prefixes = tuple(stem + "." for stem in stems)
    with lock(folder, shard):
        for n in os.listdir(folder):
            if n.startswith(prefixes) and not n.startswith(TMP_PREFIX):
                with contextlib.suppress(FileNotFoundError):
                    os.replace(os.path.join(folder, n), os.path.join(dest, n))
        fsync_dir(folder)
    return dest


def write_apart(store: EntryRewriter, keys: list[EntryKey]) -> bool:
    """Write grouped entries of ``store`` again as entries of their own (same result, RNG state, effects,
    fingerprint, environment, ``returned``), so their group file may be set aside without them (a resumed part closing
    with a group that holds an unclaimed entry too); False when any could not be read or written (each failure logged
    as a WARNING)."""
    items: list[Item] = []
    for key in keys:
        try:
            loaded = store.load(key)
        except Exception as exc:  # unusable now: it is left where it is, the part stays open
            logger.warning("skipweave: %s could not be read to keep it (%s: %s)", key, type(exc).__name__, exc)
            return False
        m = loaded.manifest
        fp, path, env = m.get("input_fingerprint"), m.get("target_path"), m.get("environment")
        meta = EntryMeta(path if isinstance(path, str) else "", fp if isinstance(fp, str) else "",
                         seconds_of(m), replace=True, concurrent=m.get("concurrent") is True,
                         environment=env if isinstance(env, dict) else None,  # as recorded: judged on replay
                         returned=m.get("returned"),  # (checked when the entry was read)
                         fingerprint_rule=fingerprint_rule(m))  # the digest is kept, so is how it was taken
        items.append((key, store.stage(loaded.result, rng_state=loaded.rng_state, effects=loaded.effects,
                                      appended=loaded.appended), meta))
    results = store.commit_many(items)
    failed = [r for r in results if not isinstance(r, tuple)]
    if failed:
        logger.warning("skipweave: %d grouped entries could not be written again (%s)", len(failed), failed[0])
    return not failed


__all__ = ["Resumes", "set_aside_calls", "write_apart"]
