"""Recording off the host's critical path: one background writer per process commits staged entries.

A recorded call hands its result over as a :class:`~skipweave.store.staging.Staged` entry -- encoded, its
tree serialised and every tensor copied, so the host may change the result in place the moment it has it --
and returns. The writer thread commits entries with the store's own commit (temporary names, the manifest's
rename last), so a process killed at any instant leaves whole entries or none: what it loses is the entries
not yet committed.

- **Bounded memory.** Each store (role) may hold at most ``skip.<role>.write_buffer`` bytes of pending
  entries; a recording that would go over waits until enough were written (logged at DEBUG). An entry larger
  than the whole buffer is not copied: the proxy records it in the caller's thread, as before.
- **Small entries in groups.** Whatever is queued when the writer wakes is committed together (up to
  :data:`BATCH_ENTRIES` entries, :data:`BATCH_BYTES` bytes) with one group sync
  (:meth:`~skipweave.store.step_store.StepStore.commit_many`), so thousands of per-sample entries do not pay
  three fsyncs each; the small entries of one part among them, with contiguous calls, become one group (two files
  for the lot, :mod:`skipweave.store.format.group`) instead of three files each. While small entries keep coming (within
  :data:`LINGER_GAP_S` of each other) the writer waits, up to :data:`LINGER_MAX_S`, so a group is what a
  burst of recordings made rather than what arrived during the last commit; never while anybody waits for it.
- **Flushed at the end, then stopped.** :func:`flush` (``skipweave.flush()``) waits for every entry pending when it
  is called, with a progress bar when that takes over :data:`BAR_AFTER_S`; it runs at unweave (so at Hydra's job
  end). At interpreter exit and at a ``multiprocessing`` child's exit :meth:`WriteBehind.close` flushes, then stops
  the writer thread and joins it (:mod:`skipweave.lifecycle` says why a thread still running then aborts the
  process); a recording made after that is written in the caller's thread. A replay in this process of an entry
  still pending waits for it (:meth:`~skipweave.store.step_store.StepStore.wait_pending`).
- **Where exit handlers do not run** (a Ray worker: Ray ends it with SIGTERM and then SIGKILL within a fraction
  of a second, running no ``atexit``), :func:`write_through` turns write-behind off for the process, except
  within a :func:`scope`: a Ray task or actor method runs in one (``skipweave.integrations.ray.actors``), its
  recordings are written behind it, and it returns to its caller only once they are committed. So a TaskRunner's
  ``run()`` writes behind for a whole training, and no recording is lost when Ray ends the worker.
- **fork.** A forked child starts with an empty writer: the parent's pending entries are the parent's.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import functools
import inspect
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from skipweave import lifecycle
from skipweave.store import write_scope
from skipweave.store.buffers import POOL, POOL_IDLE_S
from skipweave.store.format.group import ENTRY_MAX_BYTES
from skipweave.store.format.layout import EntryKey
from skipweave.store.staging import EntryMeta, Staged
from skipweave.store.step_store import StepStore

logger = logging.getLogger(__name__)

BATCH_ENTRIES = 256
"""Most entries the writer commits with one group sync."""

BATCH_BYTES = 64 << 20
"""Most bytes of entries the writer commits in one group (a larger entry goes alone)."""

LINGER_GAP_S = 0.002
"""While small entries keep coming within this many seconds of each other (per-sample recording), the writer holds off
its next group, so groups are large (fewer files, syncs and group opens per entry) and not whatever a few hundred
microseconds brought. It never holds off while anybody waits for it (:func:`flush`, a full write buffer), for an
entry over :data:`~skipweave.store.format.group.ENTRY_MAX_BYTES`, or once :data:`BATCH_ENTRIES` are queued."""

LINGER_MAX_S = 0.05
"""Seconds the writer holds off at most (:data:`LINGER_GAP_S`), counted from when it found entries queued: what a
SIGKILL may lose grows by at most this much."""

BAR_AFTER_S = 1.0
"""Seconds :func:`flush` waits before it shows a progress bar (where bars show, see ``SKIPWEAVE_PROGRESS``)."""

Outcome = tuple[int, EntryKey] | BaseException
"""What a background write ended with: ``(bytes written, key committed under)``, or the exception it failed with."""


class _Future(concurrent.futures.Future):  # type: ignore[type-arg]
    """A background write's future: whoever waits for its :meth:`result` (a replay of the entry, see
    :meth:`~skipweave.store.step_store.StepStore.wait_pending`) keeps the writer from holding off meanwhile."""

    def result(self, timeout: float | None = None) -> Any:
        if self.done():
            return super().result(timeout)
        with WRITER.waiting():
            return super().result(timeout)


@dataclass
class _Pending:
    store: StepStore
    key: EntryKey
    staged: Staged
    meta: EntryMeta
    on_done: Callable[[Outcome], None]
    future: concurrent.futures.Future[Outcome]


class WriteBehind:
    """The process's background writer. Use the module-level :data:`WRITER` and :func:`flush`."""

    def __init__(self) -> None:
        self._reset()
        self._through: str | None = None  # why this process writes through (a Ray worker), else None

    def _reset(self) -> None:
        self._closed = False  # close() began: no thread starts any more, recordings are written by their caller
        self._cond = threading.Condition()
        self._queue: collections.deque[_Pending] = collections.deque()
        self._busy: list[_Pending] = []
        self._queued_bytes: dict[int, int] = {}  # id(store) -> memory of its entries queued or being written
        self._thread: threading.Thread | None = None
        self._last_put = 0.0  # time.monotonic() of the last entry queued
        self._urgent = 0  # callers within waiting() now (flush, a full write buffer, a replay): no holding off

    @property
    def through(self) -> str | None:
        """Why this process records in the caller's thread (:func:`write_through`), or ``None``."""
        return self._through

    def behind(self) -> bool:
        """Whether a recording made here and now may be handed to the writer: always, unless this process writes
        through (:func:`write_through`) and the caller is not within an open :func:`scope`."""
        if self._through is None:
            return not self._closed
        current = write_scope.current()
        return current is not None and current.open and not self._closed

    def submit(self, store: StepStore, key: EntryKey, staged: Staged, meta: EntryMeta, *, budget: int,
               on_done: Callable[[Outcome], None]) -> concurrent.futures.Future[Outcome]:
        """Queue a staged entry for the writer thread; waits first while ``store`` holds more than ``budget``
        bytes of pending entries with this one (an entry alone over ``budget`` is queued once the others are
        written).

        Args:
            store: the entry's store.
            key: the entry.
            staged: its payload, owning its tensors (:meth:`Staged.copied`).
            meta: its manifest fields.
            budget: ``skip.<role>.write_buffer``, bytes.
            on_done: called in the writer thread with the :data:`Outcome` once the write ended, before the future
                is resolved and before a replay waiting for the entry reads it; its exceptions are logged.

        Returns:
            A future resolved with the :data:`Outcome`.
        """
        future: concurrent.futures.Future[Outcome] = _Future()
        item = _Pending(store, key, staged, meta, on_done, future)
        sid = id(store)
        current = write_scope.current()
        counted = current is not None and current.add(future)
        store.pending_add(key, future)  # first: a replay of it waits from now on, also while this call waits
        try:
            with self._cond:
                queued = self._queued_bytes.get(sid, 0)
                if queued and queued + staged.memory > budget:
                    t0 = time.perf_counter()
                    logger.debug("skipweave: role %s: write buffer full (%d bytes pending, %d more for %s, "
                                 "write_buffer=%d); waiting for the writer", store.role, queued, staged.nbytes, key,
                                 budget)
                    with self.waiting():
                        while (queued := self._queued_bytes.get(sid, 0)) and queued + staged.memory > budget:
                            self._cond.wait()
                    logger.debug("skipweave: role %s: waited %.3f s for write buffer room for %s", store.role,
                                 time.perf_counter() - t0, key)
                self._queued_bytes[sid] = self._queued_bytes.get(sid, 0) + staged.memory
                self._queue.append(item)
                self._last_put = time.monotonic()
        except BaseException as exc:  # interrupted while waiting (Ctrl-C): not queued, nothing waits for it
            store.pending_done(key)
            future.set_result(exc)
            raise
        while True:
            with self._cond:
                self._start_locked()
                self._cond.notify_all()
                if not (self._closed and self._thread is None and self._queue):
                    break
                # closed (the process is ending) and the writer gone: nobody else writes what is queued
                orphans = self._busy = self._take_locked()
            self._commit(orphans, retain=False)
            del orphans
        if self._through is not None and not counted:
            # The scope that let this recording go behind closed meanwhile (its unit of work returned while the
            # entry was being staged): nobody waits for it, so this call does, as writing through would.
            future.result()
        return future

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """Within this block somebody waits for the writer: it commits what it holds now instead of holding off for
        more (:data:`LINGER_GAP_S`). May be entered with the writer's condition held (its lock is reentrant)."""
        with self._cond:
            self._urgent += 1
        try:
            yield
        finally:
            with self._cond:
                self._urgent -= 1

    def pending(self) -> tuple[int, int]:
        """``(entries, bytes)`` queued or being written now."""
        with self._cond:
            items = [*self._queue, *self._busy]
        return len(items), sum(p.staged.nbytes for p in items)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every entry handed over before this call is written (see :func:`flush`); True when they all
        are. Entries handed over meanwhile (another thread that keeps recording) are not waited for, so a flush
        ends even while recordings go on."""
        if self._thread is threading.current_thread():
            return False  # the writer cannot wait for itself (an on_done hook that flushes)
        deadline = None if timeout is None else time.monotonic() + timeout
        t0 = time.monotonic()
        bar: Any = None
        with self.waiting():  # the writer commits what it holds now (no holding off)
            with self._cond:
                # (future, bytes) of each entry to wait for; not the entries, whose memory the writer lets go
                left = [(p.future, p.staged.nbytes) for p in [*self._queue, *self._busy]]
            total = sum(n for _, n in left)
            try:
                while left:
                    with self._cond:
                        if self._thread is None or not self._thread.is_alive():
                            self._start_locked()
                    wait = None if deadline is None else deadline - time.monotonic()
                    if wait is not None and wait <= 0:
                        return False
                    concurrent.futures.wait([f for f, _ in left], 0.2 if wait is None else min(0.2, wait),
                                            return_when=concurrent.futures.FIRST_COMPLETED)
                    left = [(f, n) for f, n in left if not f.done()]
                    if bar is None and time.monotonic() - t0 > BAR_AFTER_S:
                        bar = _bar(total, len(left))
                    if bar is not None:
                        bar.update(total - sum(n for _, n in left) - bar.n)
            finally:
                if bar is not None:
                    bar.close()
        if bar is not None:
            logger.info("skipweave: finished %d bytes of pending recordings in %.1f s", total, time.monotonic() - t0)
        return True

    def close(self) -> None:
        """Commit every pending entry, then stop the writer thread and join it; from now on this process records in
        the caller's thread (:meth:`behind` is False). Runs at interpreter exit and at a ``multiprocessing``
        child's exit (see :mod:`skipweave.lifecycle`), so no thread of the writer's is left when the interpreter
        finalizes; the copy buffers it kept go too. Waits as long as the pending writes take (a progress bar
        shows, see :func:`flush`): what the host recorded is on disk when its process ends."""
        with self._cond:
            self._closed = True
        self.flush()
        with self._cond:
            thread = self._thread
            self._cond.notify_all()  # an idle writer sees it is closed and ends
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        POOL.clear()

    def _start_locked(self) -> None:
        if self._closed or (self._thread is not None and self._thread.is_alive()):
            return
        self._thread = threading.Thread(target=self._run, name="skipweave-writer", daemon=True)
        self._thread.start()
        lifecycle.at_exit(lifecycle.FINISH, flush)
        lifecycle.at_exit(lifecycle.STOP, self.close)
        lifecycle.in_multiprocessing_children(self.close)

    def _take_locked(self) -> list[_Pending]:
        """The next group: queued entries of the first one's store, distinct entries, within the batch limits."""
        first = self._queue[0]
        batch: list[_Pending] = []
        seen: set[str] = set()
        size = 0
        rest: collections.deque[_Pending] = collections.deque()
        while self._queue:
            item = self._queue.popleft()
            name = str(item.key)
            fits = not batch or (len(batch) < BATCH_ENTRIES and size + item.staged.nbytes <= BATCH_BYTES)
            if item.store is first.store and name not in seen and fits:
                batch.append(item)
                seen.add(name)
                size += item.staged.nbytes
            else:
                rest.append(item)
                if not fits:
                    break
        rest.extend(self._queue)
        self._queue = rest
        return batch

    def _linger_locked(self) -> None:
        """Hold off while small entries keep coming (:data:`LINGER_GAP_S`, :data:`LINGER_MAX_S`); the lock is let go
        meanwhile. Sleeps instead of waiting on the condition, which every recording notifies."""
        start = time.monotonic()
        while not self._urgent and len(self._queue) < BATCH_ENTRIES \
                and all(p.staged.nbytes <= ENTRY_MAX_BYTES for p in self._queue):
            now = time.monotonic()
            if now - self._last_put >= LINGER_GAP_S or now - start >= LINGER_MAX_S:
                return
            self._cond.release()
            try:
                time.sleep(min(LINGER_GAP_S / 2, 0.001))  # (a look every millisecond at most)
            finally:
                self._cond.acquire()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    if self._closed:
                        self._thread = None
                        return
                    if not self._cond.wait(POOL_IDLE_S) and not self._queue:
                        POOL.clear()  # idle: the copy buffers kept for the next recordings go
                self._linger_locked()
                batch = self._take_locked()
                self._busy = batch
            self._commit(batch)
            del batch

    def _commit(self, batch: list[_Pending], *, retain: bool = True) -> None:
        """Write one batch taken off the queue and settle each entry: its hook, its store's pending set, the queued
        bytes, and last its future; then (``retain``: in the writer thread, not a recording caller's) the store's
        retention."""
        outcomes = _write(batch)
        store = batch[0].store  # (one store per batch, see _take_locked)
        for item, outcome in zip(batch, outcomes, strict=True):
            item.staged.release()  # written (or failed): its copies are read no more
            try:
                item.on_done(outcome)
            except Exception:  # noqa: BLE001 - a hook's bug must not stop the writer
                logger.exception("skipweave: after recording %s", item.key)
            item.store.pending_done(item.key)
        with self._cond:
            for item in batch:
                sid = id(item.store)
                self._queued_bytes[sid] = self._queued_bytes.get(sid, 0) - item.staged.memory
                if self._queued_bytes[sid] <= 0:
                    del self._queued_bytes[sid]
            self._busy = []
            self._cond.notify_all()
        # The entries' copies go before anybody learns they are written, not at the next batch: a flush at exit
        # then returns only once this thread is done with torch, and an idle writer keeps no large buffer that
        # POOL.clear() could not free.
        futures = [item.future for item in batch]
        batch.clear()
        del item
        # last: whoever waits for an entry (flush, a replay) finds the writer done with it, pending() included
        for future, outcome in zip(futures, outcomes, strict=True):
            future.set_result(outcome)
        # Retention after the commit, in this thread: nobody waits for it (the futures are set), and a round runs
        # once per new step only (the store's Retainer), not after each of thousands of per-sample commits. Not once
        # the process is ending (close() joins this thread: the host's exit would wait for the deletions); a round
        # under way stops after the step it is removing. The run's end applies the rule once more, bounded in time
        # (StepStore.final_round, from the weaver's close_parts), for the steps whose rounds were skipped or cut.
        steps = {o[1].step for o in outcomes if not isinstance(o, BaseException)}
        if retain and steps and not self._closed:
            store.after_commit(steps, stop=lambda: self._closed)

    def _after_fork(self) -> None:
        self._reset()
        POOL.after_fork()  # the parent's buffers are copies in this child: not kept


def _write(batch: list[_Pending]) -> list[Outcome]:
    """Commit a group of one store's entries; an entry whose slot another writer took is committed alone (to
    the next free slot)."""
    store = batch[0].store
    try:
        if len(batch) == 1:
            results: list[Any] = [None]
        else:
            results = list(store.commit_many([(p.key, p.staged, p.meta) for p in batch]))
    except Exception as exc:  # noqa: BLE001 - e.g. the dump dir cannot be made: every entry failed
        # without its traceback, whose frames hold this batch: a cycle that kept the entries' copies until a GC
        return [exc.with_traceback(None)] * len(batch)
    out: list[Outcome] = []
    for item, result in zip(batch, results, strict=True):
        if result is None:
            try:
                result = store.commit(item.key, item.staged, item.meta)
            except Exception as exc:  # noqa: BLE001 - reported by the item's on_done
                result = exc.with_traceback(None)  # (as above)
        out.append(result)
    return out


def _bar(total: int, entries: int) -> Any:
    from skipweave.store.format.tensorfile import bars_enabled, byte_bar

    return byte_bar(total, f"skipweave: finishing {entries} pending recording(s)") if bars_enabled() else None


WRITER = WriteBehind()
"""The process's background writer."""

os.register_at_fork(after_in_child=WRITER._after_fork)


def flush(timeout: float | None = None) -> bool:
    """Wait until every recording handed to the background writer before this call is committed (or failed, with
    its WARNING); a progress bar shows when that takes over :data:`BAR_AFTER_S` seconds. Recordings other threads
    hand over meanwhile are not waited for (so a flush ends while they go on).

    Runs by itself at unweave, at Hydra's job end and at interpreter exit; call it where a program needs its
    recordings on disk sooner (before copying the dump dir elsewhere, before ``os._exit``).

    Args:
        timeout: seconds to wait at most; ``None`` waits as long as it takes.

    Returns:
        True when every recording handed over before the call is committed or failed; False when ``timeout``
        passed first (or when called from the writer thread itself).
    """
    return WRITER.flush(timeout)


@contextmanager
def scope() -> Iterator[write_scope.Scope | None]:
    """Within this block (this thread, and the asyncio tasks and ``to_thread`` calls it starts, which copy the
    context), recordings are written behind even where the process writes through; leaving it waits until they
    are committed, so what the block recorded is on disk once it is left (a failed write was logged at WARNING
    and does not raise here).

    A block within another one adds nothing: the outermost waits. Yields the new
    :class:`~skipweave.store.write_scope.Scope`, or ``None`` when nested.
    """
    entered = write_scope.enter()
    try:
        yield None if entered is None else entered[0]
    finally:
        futures = write_scope.leave(entered)
        if futures:
            _wait(futures)


def _wait(futures: list[concurrent.futures.Future[Outcome]]) -> None:
    """Wait until every one of ``futures`` is done, the writer not holding off meanwhile."""
    with WRITER.waiting():
        concurrent.futures.wait(futures)


def scoped(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` run within a :func:`scope`: the returned function returns once what ``fn`` recorded is committed. For a
    coroutine function it is an ``async def`` one, whose wait runs in a worker thread while the event loop goes on.

    Returned unchanged: generator functions (a streaming Ray method, ended by its consumer) and bound methods
    (a classmethod: Ray tells those apart by their ``__self__``). Their recordings stay written through where the
    process writes through.
    """
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn) or hasattr(fn, "__self__"):
        return fn
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            entered = write_scope.enter()
            try:
                return await fn(*args, **kwargs)
            finally:
                futures = write_scope.leave(entered)
                if futures:
                    await asyncio.to_thread(_wait, futures)

        return run_async

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with scope():
            return fn(*args, **kwargs)

    return run


def write_through(reason: str) -> None:
    """Record in the caller's thread in this process from now on (each record commits before its call returns),
    because ``reason`` (e.g. "a Ray worker, which Ray ends without running exit handlers")."""
    WRITER._through = reason


__all__ = ["BAR_AFTER_S", "BATCH_BYTES", "BATCH_ENTRIES", "Outcome", "WRITER", "WriteBehind", "flush",
           "scope", "scoped", "write_through"]
