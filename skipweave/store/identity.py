"""Who wrote an entry: the run and process of every writer, and which recordings belong to a concurrent one.

Several writers often share one shard: Ray actors, processes and threads that have no ``RANK`` of their own
all write ``r0``, and threads of one process share its ``RANK``. Call order tells such writers apart in
neither the recording run nor the next one, so every manifest names its writer and :func:`this_writer`
describes the process that reads it. Two rules follow (see :mod:`skipweave.policy.matching`):

- an entry a *concurrent* writer made (one of this run, or one made after this process started) is never
  served: each writer of a run records its own calls;
- when one shard holds entries of several writers, a call is served only the entry recorded for the same
  inputs (its fingerprint), never "the k-th entry".

A *run* is the tree of processes started from one process that wove first: its id travels in the
``SKIPWEAVE_RUN`` environment variable, which child processes inherit and which skipweave puts into the
runtime environment of Ray workers. Nothing here imports Ray.
"""

from __future__ import annotations

import hashlib
import math
import os
import platform
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from skipweave.env import RUN_ENV, RUN_STARTED_ENV
from skipweave.store.format.versions import SIGNATURE, fingerprint_rule

_lock = threading.Lock()
_started_unix = time.time()
_writer: Writer | None = None
_pid = os.getpid()  # this process's pid (set again in a forked child, see _forked)
_made_here: str | None = None  # the run id this process made (not inherited)
_made_pid = 0  # the pid of the process that made _made_here (a forked child inherits the variable, not the run)
_PID_MAX = 2**31  # os.kill raises OverflowError beyond a C int


@dataclass(frozen=True)
class Writer:
    """One writing process.

    Attributes:
        run: the run id (:data:`RUN_ENV`).
        host: the machine's network name.
        pid: the process id.
    """

    run: str
    host: str
    pid: int

    def as_manifest(self) -> dict[str, Any]:
        """The ``writer`` field of a manifest (``argv0`` is for people reading it)."""
        return {"run": self.run, "host": self.host, "pid": self.pid, "argv0": sys.argv[0] if sys.argv else ""}


@dataclass(frozen=True)
class Recorded:
    """What the matching needs of one committed entry of a part, read from its manifest.

    Attributes:
        call: the entry's call index (its slot in the part).
        fingerprint: the input fingerprint (``""`` when recorded without one, e.g. imported from verl).
        writer: ``(run, host, pid)``; ``None`` for entries of skipweave versions that did not record it.
        created_unix: when it was committed (seconds since the epoch; 0.0 when unknown).
        concurrent: the writer saw another thread call the target at the same step while this call ran.
        rule: how ``fingerprint`` was taken (:func:`~skipweave.store.format.versions.fingerprint_rule`): a call is
            compared with it by its fingerprint under the same rule.
    """

    call: int
    fingerprint: str
    writer: tuple[str, str, int] | None
    created_unix: float
    concurrent: bool
    rule: str = SIGNATURE


def run_id() -> str:
    """Return this run's id, making one (and exporting it to child processes) in the first process."""
    global _made_here, _made_pid
    with _lock:
        value = os.environ.get(RUN_ENV, "")
        if _valid_run(value):
            return value
        value = uuid.uuid4().hex[:16]
        os.environ[RUN_ENV] = value
        os.environ[RUN_STARTED_ENV] = repr(time.time())
        _made_here, _made_pid = value, _pid
        return value


def made_here() -> str | None:
    """The run id this very process made (:func:`run_id`) and has not ended (:func:`end_run`), else ``None``.

    ``None`` in a process that inherited its run id (a subprocess, a Ray worker) and in a forked child of the
    maker: only the maker may act for the whole run (its marks' owner, their cleanup at its exit).
    """
    made = _made_here
    return made if made is not None and _made_pid == _pid else None


def run_started() -> float:
    """When this run began: its first process's weave (inherited), else when this process imported skipweave.

    Marks a run left before a child started (the driver's calls, seen by a worker started later) count.
    """
    run_id()
    try:
        value = float(os.environ.get(RUN_STARTED_ENV, ""))
    except ValueError:
        return _started_unix
    return value if math.isfinite(value) and 0 < value <= time.time() + 60 else _started_unix


def end_run() -> None:
    """The weave that made this process's run id ended (unweave): processes started from now on are another run.

    Without this, a process that recorded, unwove and then started a replaying child (a notebook, a test
    harness) would hand the child its run id, and the child would take the parent's recordings for a
    concurrent writer's and never be served them. An inherited run id is kept: it belongs to the parent.
    """
    global _made_here
    with _lock:
        if _made_here is not None and os.environ.get(RUN_ENV) == _made_here:
            del os.environ[RUN_ENV]
            os.environ.pop(RUN_STARTED_ENV, None)
        _made_here = None


def this_writer() -> Writer:
    """The writer this process records as (kept; made afresh after a fork or a change of the run id).

    The run id is read from the environment on every call (a change of :data:`RUN_ENV` is seen at once); the pid is
    this process's as noted at import and after every fork (:func:`_forked`), not asked of the system each time.
    """
    global _writer
    run = os.environ.get(RUN_ENV, "")
    cached = _writer
    if cached is not None and cached.run == run and cached.pid == _pid:
        return cached
    _writer = Writer(run_id(), platform.node(), _pid)
    return _writer


def _forked() -> None:
    """In a forked child: note its own pid (its writer is made afresh at the next :func:`this_writer`)."""
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


def started_unix() -> float:
    """When this process imported skipweave (seconds since the epoch): entries of other writers made after it
    are concurrent ones, even when no run id connects the two processes."""
    return _started_unix


def recorded_of(manifest: dict[str, Any], call: int) -> Recorded:
    """Read the :class:`Recorded` summary of one manifest; odd or missing fields give the safe reading.

    A missing writer reads as ``None`` (an unknown writer of an older run), a malformed creation time as 0.0.
    """
    fp = manifest.get("input_fingerprint")
    raw = manifest.get("writer")
    writer: tuple[str, str, int] | None = None
    if isinstance(raw, dict):
        run, host, pid = raw.get("run"), raw.get("host"), raw.get("pid")
        if isinstance(run, str) and isinstance(host, str) and type(pid) is int:
            writer = (run, host, pid)
    created = manifest.get("created_unix")
    try:
        created_f = float(created) if isinstance(created, (int, float)) and not isinstance(created, bool) else 0.0
    except OverflowError:  # an int beyond a float's range: not a time a clock gives
        created_f = 0.0
    return Recorded(
        call=call,
        fingerprint=fp if isinstance(fp, str) else "",
        writer=writer,
        created_unix=created_f if math.isfinite(created_f) else 0.0,
        concurrent=manifest.get("concurrent") is True,
        rule=fingerprint_rule(manifest),
    )


def is_concurrent_other(rec: Recorded, me: Writer, started: float) -> bool:
    """True when ``rec`` was made by another writer that runs alongside this process.

    That is another process, still running, that belongs to this run or made the entry after this process
    started. Still running means: on this machine its pid is alive; on another machine it is assumed to be.
    Such an entry is another writer's result and is never served to this process. An entry of a process that
    has ended (the recording run before this one, also a child started and finished by this process) is
    servable.
    """
    if rec.writer is not None and rec.writer[1:] == (me.host, me.pid):
        return False  # this very process, under this run id or an earlier one (a weave/unweave cycle)
    same_run = rec.writer is not None and rec.writer[0] == me.run
    if not same_run and rec.created_unix < started:
        return False
    if rec.writer is None or rec.writer[1] != me.host:
        return True
    return _alive(rec.writer[2])


def writer_running(writer: tuple[str, str, int] | None) -> bool | None:
    """Whether the process that wrote an entry (its manifest's ``(run, host, pid)``) still runs: True or False on
    this machine (its pid is alive or free), ``None`` when that cannot be told (another machine, or no writer
    recorded). Retention (:mod:`skipweave.store.retention`) keeps what such a writer may still be adding to."""
    if writer is None or writer[1] != this_writer().host:
        return None
    return _alive(writer[2])


def is_other_of_run(rec: Recorded, me: Writer) -> bool:
    """True when ``rec`` was made by another process of this very run (ended or not): children of one launcher, Ray
    actors of one job. Such a writer's entries are matched by inputs only, never by position."""
    return rec.writer is not None and rec.writer[0] == me.run and rec.writer[1:] != (me.host, me.pid)


# ---------------------------------------------------------------------------------------------- processes
# Whether a process that left something in a dump dir still runs: one judgement for the owners of run marks
# (skipweave.store.runs), the writers of temporary files (skipweave.store.upkeep) and gc.

@dataclass(frozen=True)
class Process:
    """Where and which process: enough to tell, on the machine it ran on, whether it still runs.

    Attributes:
        host: the machine's network name.
        pid: the process id, meaningful only within ``pid_namespace``.
        pid_namespace: the pid namespace (``pid:[4026531836]`` on Linux, ``""`` where there is none): two containers
            may share a host name, never a namespace.
        start: when the process started, in clock ticks since boot (Linux), ``None`` when unknown: a pid taken by
            a later process has another start.
        boot: the kernel's boot id (Linux), ``None`` when unknown: two machines may share a host name and the initial
            pid namespace's name, never a boot id, and a pid of an earlier boot is no process of this one.
    """

    host: str
    pid: int
    pid_namespace: str
    start: int | None
    boot: str | None = None


_process: Process | None = None  # this process's (made again after a fork: its pid and start differ)
_place: tuple[Process, str] | None = None  # (the process it was made for, place())
PLACE_DIGITS = 12
"""Hex digits of a :func:`place` tag (48 bits): what a temporary file's name says of the machine that wrote it."""


def this_process() -> Process:
    """This process as :class:`Process` (kept; made afresh in a forked child)."""
    global _process
    cached = _process
    if cached is not None and cached.pid == _pid:
        return cached
    _process = Process(platform.node(), _pid, pid_namespace(), process_start(_pid), boot_id())
    return _process


def process_running(proc: Process) -> bool | None:
    """Whether ``proc`` still runs: True or False when it ran where this process runs (same host name, pid namespace
    and, when both are known, boot), ``None`` when that cannot be told here (another machine or container, or an
    earlier boot). A pid that is taken by a process of another start time counts as gone."""
    me = this_process()
    if proc.host != me.host or proc.pid_namespace != me.pid_namespace:
        return None
    if proc.boot is not None and me.boot is not None and proc.boot != me.boot:
        return None
    return _alive(proc.pid, proc.start)


def place() -> str:
    """A short tag of where this process runs (host name, boot id and pid namespace, hashed): with a pid and a start
    time, what a temporary file's name carries of its writer (:func:`skipweave.store.atomic.tmp_name`). Equal tags
    mean :func:`process_running` would ask this machine."""
    global _place
    me = this_process()
    cached = _place
    if cached is not None and cached[0] is me:
        return cached[1]
    text = "\0".join((me.host, me.boot or "", me.pid_namespace))
    tag = hashlib.blake2s(text.encode("utf-8", "surrogateescape"), digest_size=PLACE_DIGITS // 2).hexdigest()
    _place = (me, tag)
    return tag


def running_at(where: str, pid: int, start: int | None) -> bool | None:
    """:func:`process_running` for a process known by its :func:`place` tag: ``None`` when ``where`` is not this
    process's place (another machine, container or boot), else whether ``pid`` (of start ``start``) still runs.
    ``None`` too where this machine has no boot id (no ``/proc``): its place is then its host name alone, which two
    machines sharing a store may both have (``MacBook-Pro.local``), and a pid free here may be a live writer's there."""
    if where != place() or this_process().boot is None:
        return None
    return _alive(pid, start)


def pid_namespace() -> str:
    """This process's pid namespace (``pid:[4026531836]`` on Linux, ``""`` elsewhere)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def process_start(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (Linux ``/proc/{pid}/stat``), else ``None``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read(4096)
        return int(data[data.rindex(b")") + 2:].split()[19])  # field 22; the name before ")" may hold spaces
    except (OSError, ValueError, IndexError):
        return None


def boot_id() -> str | None:
    """The kernel's boot id (Linux ``/proc/sys/kernel/random/boot_id``), else ``None``."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as fh:
            value = fh.read(64).strip().decode("ascii")
    except (OSError, UnicodeDecodeError):
        return None
    return value or None


def _alive(pid: int, start: int | None = None) -> bool:
    """True while process ``pid`` (of this machine and pid namespace) runs and, when ``start`` is known, started
    then: a pid the system gave to a later process is the earlier one gone."""
    if pid <= 0 or pid >= _PID_MAX:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. PermissionError: the pid exists, owned by another user
        pass
    now_start = process_start(pid) if start is not None else None
    return now_start is None or now_start == start


def _valid_run(value: str) -> bool:
    return 1 <= len(value) <= 64 and value.isascii() and all(c.isalnum() or c in "-_" for c in value)


__all__ = ["PLACE_DIGITS", "RUN_ENV", "Process", "Recorded", "Writer", "boot_id", "end_run", "is_concurrent_other",
           "is_other_of_run", "made_here", "pid_namespace", "place", "process_running", "process_start", "recorded_of",
           "run_id", "run_started", "running_at", "started_unix", "this_process", "this_writer", "writer_running"]
