"""``skipweave run`` of a strict plan: start the program as a child, wait for it, and end with its verdict.

Without ``strict`` the launcher replaces itself with the program (``exec``): the program's exit status is the
launcher's. A strict run must end with :data:`~skipweave.failures.STRICT_EXIT` when the program ended with 0 while
skipweave failed at something (:mod:`skipweave.failures`); no process can do that for itself at interpreter exit,
where the status it ends with (``sys.exit(3)``, or 0 at the script's end) is out of reach. So the launcher stays, as
the program's parent:

- it makes a fresh temporary file and names it in :data:`~skipweave.env.STRICT_REPORT_ENV`; every woven process of
  the program (on this machine) appends to it, at exit, what failed in it;
- it forks; the child names its own pid in :data:`~skipweave.env.PROGRAM_PID_ENV` (the program's first process, as
  the ``exec`` path's) and ``exec``s the command;
- it passes on the signals a scheduler or ``kill`` sends to the launcher (:data:`FORWARDED`), and ignores the
  keyboard's (``SIGINT``, ``SIGQUIT``), which the terminal sends to the program itself;
- once the program ended: killed by a signal, the launcher ends by the same signal; a non-zero exit status is kept
  as it is; exit status 0 becomes :data:`~skipweave.failures.STRICT_EXIT` when a process wrote a finding, with one
  line on stderr naming each and its key.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import tempfile
from collections.abc import Mapping, Sequence
from types import FrameType

from skipweave import failures
from skipweave.env import PROGRAM_PID_ENV, STRICT_REPORT_ENV

FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
"""Signals the launcher passes on to the program (a job scheduler's stop, ``kill``)."""

KEYBOARD = (signal.SIGINT, signal.SIGQUIT)
"""Signals the launcher ignores while the program runs: a terminal sends them to the program too."""

EXEC_FAILED = 127
"""Exit status of the forked child when the command cannot be executed (the launcher reports the error itself)."""


def run_judged(command: Sequence[str], env: Mapping[str, str]) -> int:
    """Run ``command`` with ``env`` as a child of this process, wait for it and return the status to end with.

    Returns:
        The program's own non-zero exit status; else :data:`~skipweave.failures.STRICT_EXIT` when a woven process
        wrote a finding (a line on stderr names them), else 0. A program killed by a signal has this process end by
        the same signal (the return value, 128 + the signal, is a fallback).

    Raises:
        FileNotFoundError: the command does not exist.
        PermissionError: it is not executable.
    """
    fd, report = tempfile.mkstemp(prefix="skipweave-strict-", suffix=".jsonl")
    os.close(fd)
    try:
        status = _spawn_and_wait(command, {**env, STRICT_REPORT_ENV: report})
        found = failures.read_for_launcher(report)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(report)
    return verdict(status, found)


def verdict(status: int, found: list[failures.Finding]) -> int:
    """The status a strict ``skipweave run`` ends with, from the program's wait status and the findings its processes
    wrote (see :func:`run_judged`)."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        sys.stdout.flush()
        sys.stderr.flush()
        with contextlib.suppress(OSError, ValueError):
            signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)  # ends here for a signal whose default ends a process
        return 128 + sig
    code = os.waitstatus_to_exitcode(status)
    if code != 0 or not found:
        return code
    print(f"skipweave run --strict: the program ended with exit status 0, but skipweave failed at what it was asked: "
          f"{failures.describe(found)}. Exit status {failures.STRICT_EXIT}.", file=sys.stderr)
    return failures.STRICT_EXIT


def _spawn_and_wait(command: Sequence[str], env: Mapping[str, str]) -> int:
    """Fork, ``exec`` ``command`` in the child, pass on :data:`FORWARDED` signals while waiting; the wait status.

    The child reports a failed ``exec`` through a close-on-exec pipe (as :mod:`subprocess` does): an empty read means
    the command runs.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    read_end, write_end = os.pipe()  # both close-on-exec
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child, which becomes the program (tests see it from outside)
        try:
            os.close(read_end)
            os.execvpe(command[0], list(command), {**env, PROGRAM_PID_ENV: str(os.getpid())})
        except BaseException as exc:  # noqa: BLE001 - whatever stopped the exec goes to the launcher
            with contextlib.suppress(OSError):
                os.write(write_end, f"{getattr(exc, 'errno', None) or 0}:{getattr(exc, 'strerror', None) or exc}"
                         .encode())
        finally:
            os._exit(EXEC_FAILED)
    os.close(write_end)

    def forward(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    previous.update({sig: signal.signal(sig, signal.SIG_IGN) for sig in KEYBOARD})
    try:
        with os.fdopen(read_end, "rb") as pipe:
            failed = pipe.read()
        _, status = os.waitpid(pid, 0)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
    if failed:
        code, _, text = failed.decode(errors="replace").partition(":")
        raise OSError(int(code) if code.isdigit() else 0, text)  # ENOENT -> FileNotFoundError, EACCES -> Permission..
    return status


__all__ = ["EXEC_FAILED", "FORWARDED", "KEYBOARD", "run_judged", "verdict"]
