"""What skipweave failed at in a run while the host went on, and the verdict of a strict run.

None of these failures fails the host's call, by design: a record that could not be written leaves the live result
in place, a call whose step or bypass cannot be read runs live, a target never woven is simply not there, a role
none of whose calls reached the store records nothing. Each is logged where it happens (once: later ones of the
same kind at DEBUG) and noted here as a :class:`Finding` that names its config key; the exit summary
(:mod:`skipweave.report`) adds the ones it can only judge at the end (targets never woven, roles that did nothing).

A strict run (``skip.strict: true``, ``skipweave run --strict``) fails when there is any. The exit status of a
process cannot be changed from an ``atexit`` handler once the interpreter ends normally, and the status the host
was about to end with (``sys.exit(3)`` included) is not visible there; so the verdict is taken where the host's own
status is known:

- under ``skipweave run``, the launcher waits for the program (it does not replace itself with it): every woven
  process writes its findings, at exit, to the file :data:`~skipweave.env.STRICT_REPORT_ENV` names, and the
  launcher ends with :data:`STRICT_EXIT` when the program ended with 0 and a finding was written, else with the
  program's own status (:mod:`skipweave.integrations.launcher.waiting`);
- in a Hydra app, the callback ends the run with :data:`STRICT_EXIT` once Hydra's run (or sweep) completed;
- a program that calls ``skipweave.weave()`` itself keeps its exit status: :func:`close_at_exit` logs the verdict
  as an ERROR line.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import threading
from dataclasses import asdict, dataclass

from skipweave.env import STRICT_REPORT_ENV

logger = logging.getLogger("skipweave")

STRICT_EXIT = 4
"""The exit status of a strict run that failed while the program itself ended with 0 (skipweave's CLI uses 0-3
for its own outcomes, ``skipweave run`` 2 and 127 before the program starts)."""

NEVER_WOVEN, DID_NOTHING, RECORD_FAILED, UNREAD = "never_woven", "did_nothing", "record_failed", "unread"
"""The kinds of :class:`Finding`: a target never woven; a role that recorded and replayed nothing; records that
failed; calls whose step or bypass could not be read."""


@dataclass
class Finding:
    """One thing skipweave failed at, summed over the times it happened.

    Attributes:
        kind: :data:`NEVER_WOVEN`, :data:`DID_NOTHING`, :data:`RECORD_FAILED` or :data:`UNREAD`.
        role: the role it concerns.
        key: the config key to look at, e.g. ``skip.rollout.targets.gen``, ``skip.rollout.dump_dir``,
            ``skip.rollout.step.expr``.
        text: what happened, for people (the first occurrence's words).
        count: how many times (records, calls; 1 for a target or a role).
    """

    kind: str
    role: str
    key: str
    text: str
    count: int = 1

    def describe(self) -> str:
        """One clause naming what failed, how often and the key."""
        if self.kind == RECORD_FAILED:
            return f"{self.count} record(s) of role {self.role} failed ({self.key}; first: {self.text})"
        if self.kind == UNREAD:
            return f"the step or bypass of {self.count} call(s) of role {self.role} could not be read: {self.text} " \
                f"({self.key})"
        return f"{self.text} ({self.key})"


_lock = threading.Lock()
_findings: dict[tuple[str, str], Finding] = {}
_plan_unread: dict[tuple[str, str], Finding] = {}  # the UNREAD findings of the plan woven now (reset at its end)
_seen_kinds: set[tuple[str, ...]] = set()
_strict = False


def note(kind: str, role: str, key: str, text: str, count: int = 1) -> None:
    """Note a finding; one already noted of this kind and key only adds ``count`` (its first words stay)."""
    with _lock:
        found = _findings.get((kind, key))
        if found is None:
            _findings[(kind, key)] = Finding(kind, role, key, text, count)
        else:
            found.count += count


def record_failed(role: str, dump_dir: str, exc: BaseException) -> bool:
    """Note a record of ``role`` that failed with ``exc`` under ``dump_dir``.

    Returns:
        Whether it is the first failure of its kind in this process, which the caller logs as a WARNING (later
        ones at DEBUG): an ``OSError`` by dump dir and ``errno`` (a dump dir that cannot be written fails every
        record of every target the same way), anything else by role and exception type.
    """
    if isinstance(exc, OSError):
        kind: tuple[str, ...] = (dump_dir, "errno", str(exc.errno))
    else:
        kind = (dump_dir, role, type(exc).__name__)
    with _lock:
        first = kind not in _seen_kinds
        _seen_kinds.add(kind)
    note(RECORD_FAILED, role, f"skip.{role}.dump_dir={dump_dir}", error_text(exc))
    return first


def call_unread(role: str, key: str, text: str) -> None:
    """Note a call of ``role`` that ran live because ``key`` (its step or bypass) could not be read (``text``)."""
    note(UNREAD, role, key, text)
    with _lock:
        found = _plan_unread.get((role, key))
        if found is None:
            _plan_unread[(role, key)] = Finding(UNREAD, role, key, text)
        else:
            found.count += 1


def unread_of(role: str) -> list[Finding]:
    """The :data:`UNREAD` findings of ``role`` in the plan woven now, to name as the cause of a role none of whose
    calls was eligible."""
    with _lock:
        return [Finding(**asdict(f)) for f in _plan_unread.values() if f.role == role]


def plan_ended() -> None:
    """The woven plan ended (:func:`skipweave.report.end_plan`): the next one's calls are counted afresh for
    :func:`unread_of` (the findings themselves stay, for the verdict)."""
    with _lock:
        _plan_unread.clear()


def error_text(exc: BaseException) -> str:
    """An exception for people: its type, the ``errno`` symbol of an ``OSError`` (``PermissionError EACCES``) and
    its message (which names the path)."""
    code = exc.errno if isinstance(exc, OSError) else None
    symbol = f" {errno.errorcode[code]}" if code is not None and code in errno.errorcode else ""
    return f"{type(exc).__name__}{symbol}: {exc}"


def arm(strict: bool) -> None:
    """Remember whether the plan woven in this process is strict (:attr:`~skipweave.config.schema.SkipConfig.strict`);
    called by the weaver for each plan it weaves (one strict plan keeps the process strict)."""
    global _strict
    with _lock:
        _strict = _strict or strict


def armed() -> bool:
    """Whether a strict plan was woven in this process."""
    return _strict


def take() -> list[Finding]:
    """Return this process's findings, in the order they were first noted, and forget them (a Hydra sweep judges
    each job alone; what was taken is not reported again at exit)."""
    with _lock:
        found = list(_findings.values())
        _findings.clear()
        return found


def describe(findings: list[Finding]) -> str:
    """The findings in one line, each with its key."""
    return "; ".join(f.describe() for f in findings)


def close_at_exit() -> None:
    """The last of the exit summary (:mod:`skipweave.report` calls it after the per-role lines): hand this process's
    findings to the launcher waiting for the program (``skipweave run --strict``), or, in a strict process no
    launcher waits for, log the verdict as one ERROR line (the exit status stays the program's own)."""
    findings = take()
    if not findings:
        return
    path = os.environ.get(STRICT_REPORT_ENV)
    if path:
        write_for_launcher(path, findings)
    elif armed():
        logger.error("skipweave strict run failed: %s. The exit status is the program's own (a program that calls "
                     "skipweave.weave() itself; run it with `skipweave run --strict` to end with %d)",
                     describe(findings), STRICT_EXIT)


def write_for_launcher(path: str, findings: list[Finding]) -> None:
    """Append ``findings`` as JSON lines to the launcher's file ``path`` (made by the launcher: never created here,
    never followed through a symlink); a failure is logged at WARNING, the launcher then sees fewer findings."""
    data = "".join(json.dumps(asdict(f), sort_keys=True) + "\n" for f in findings).encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0))
        try:
            os.write(fd, data)  # one write of O_APPEND: the lines of processes ending together do not interleave
        finally:
            os.close(fd)
    except OSError as exc:
        logger.warning("skipweave: could not hand the strict run's findings to `skipweave run` (%s): %s; %s",
                       path, error_text(exc), describe(findings))


def read_for_launcher(path: str) -> list[Finding]:
    """The findings the program's processes wrote to ``path``, those of one kind and key summed; lines that are not
    findings are skipped (the file is the launcher's own, in a fresh temporary name)."""
    merged: dict[tuple[str, str], Finding] = {}
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            found = Finding(**json.loads(line))
        except (ValueError, TypeError):
            continue
        known = merged.get((found.kind, found.key))
        if known is None:
            merged[(found.kind, found.key)] = found
        else:
            known.count += found.count
    return list(merged.values())


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # another thread may have held the parent's
    _findings.clear()  # the parent reports its own: a forked child reports what failed in it
    _plan_unread.clear()
    _seen_kinds.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)

__all__ = ["DID_NOTHING", "NEVER_WOVEN", "RECORD_FAILED", "STRICT_EXIT", "UNREAD", "Finding", "arm", "armed",
           "call_unread", "close_at_exit", "describe", "error_text", "note", "plan_ended", "read_for_launcher",
           "record_failed", "take", "unread_of", "write_for_launcher"]
