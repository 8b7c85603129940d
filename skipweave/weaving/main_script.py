"""Targets in the program's main script: woven the moment the script defines them.

``python train.py`` runs ``train.py`` as the module ``__main__``. A class or function the script defines exists only
once its top-level code has run the definition, and no import announces it: a post-import hook for ``train`` waits
for an ``import train`` that never comes, and a weave made before the script runs (``skipweave run``) finds an
empty ``__main__``. So a target named ``__main__:Trainer.generate``, or by the script's own module name
(``train.Trainer.generate`` for ``python train.py``, ``pkg.train.Trainer.generate`` for ``python -m pkg.train``),
that the script has not defined yet is handed to :data:`WATCH`. While such targets wait, it follows the script's
top-level code statement by statement (:func:`sys.settrace` in the main thread, line events of the script's
top-level frame only; any tracer installed before, a debugger's or coverage's, keeps getting its events), weaves
each target as soon as its name is bound, before the next statement runs, and stands down once none waits.

What cannot work, and is reported at exit as never woven (see :mod:`skipweave.report`):

- a class or function defined inside a function (``main.<locals>.Trainer``): it is no attribute of the script;
- a definition the script never reaches (behind a condition that is false, or after a ``sys.exit``).

A reference to a function taken while the statement defining it runs (a decorator that registers the function
in a table) keeps the function unwoven, as a ``from module import name`` copy taken before a weave does.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType, ModuleType
from typing import Any

logger = logging.getLogger(__name__)

MAIN = "__main__"

TraceFunction = Callable[[FrameType, str, Any], Any]
"""What :func:`sys.settrace` takes, and a frame's ``f_trace``."""


def main_script_started() -> bool:
    """Whether the interpreter has begun running the main script (its ``__main__`` knows its file or spec).

    False at interpreter start-up (``sitecustomize``, where ``skipweave run`` weaves), True from the script's first
    statement on, and in an interactive session or ``python -c`` (which have no script to wait for)."""
    main = sys.modules.get(MAIN)
    if main is None:
        return False
    if getattr(main, "__file__", None) or getattr(main, "__spec__", None) is not None:
        return True
    return not _script_from_command_line()


def _script_from_command_line() -> str | None:
    """The module name the command line gives the main script (``train`` for ``python train.py``, ``pkg.train`` for
    ``python -m pkg.train``), or ``None`` (``-c``, interactive, no ``sys.orig_argv``)."""
    argv = list(getattr(sys, "orig_argv", []) or [])[1:]
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "-m" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("-m") and len(arg) > 2:
            return arg[2:]
        if arg in ("-c", "-") or arg.startswith("-c"):
            return None
        if arg in ("-W", "-X", "--check-hash-based-pycs"):
            i += 2
            continue
        if arg.startswith("-"):
            i += 1
            continue
        return _module_name_of_file(arg)
    return None


def _module_name_of_file(path: str) -> str | None:
    stem, ext = os.path.splitext(os.path.basename(path))
    # (a stem that is no identifier, my-train.py, can only be named __main__; it still tells a script runs)
    return stem if ext in (".py", ".pyw", "") and stem else None


def main_script_names() -> tuple[str, ...]:
    """Every module name the main script may be targeted by: ``__main__``, and the script's own name (from its
    ``__spec__`` or ``__file__`` once it runs; from the command line before)."""
    names = [MAIN]
    main = sys.modules.get(MAIN)
    spec = getattr(main, "__spec__", None)
    if spec is not None and getattr(spec, "name", None):
        names.append(spec.name)  # python -m pkg.train; pkg.__main__ for python -m pkg
    elif getattr(main, "__file__", None):
        name = _module_name_of_file(str(main.__file__))  # type: ignore[union-attr]
        if name:
            names.append(name)
    elif not main_script_started():
        name = _script_from_command_line()
        if name:
            names.append(name)
    return tuple(dict.fromkeys(names))


def names_main_script(module: str) -> bool | None:
    """Whether ``module`` names the main script: True, False, or ``None`` while it cannot be told yet (before the
    script starts, a name the command line gives it may still turn out to be another module: ``python -m pkg``
    runs ``pkg.__main__``).

    A module imported under the name besides the running script (``import train`` from ``python train.py``) is
    another module object: a target naming it is that module's, woven at its import as usual.
    """
    if module == MAIN:
        return True
    if module in sys.modules:
        return False
    if module not in main_script_names():
        return False
    return True if main_script_started() else None


@dataclass
class _Waiting:
    """A target waiting for the main script to define it."""

    module: str  # as written (``__main__``, ``train``, ``pkg.train``)
    attr: str  # ``Trainer.generate`` or ``generate``
    weave: Callable[[ModuleType], None]  # weaves it on the main module; raises TargetNotFound when it cannot
    undecided: bool  # the module may yet turn out not to be the main script (judged when the script starts)

    @property
    def name(self) -> str:
        return self.attr.split(".", 1)[0]


class MainScriptWatch:
    """Weaves targets of the main script the moment the script binds their name. Use :data:`WATCH`."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._waiting: list[_Waiting] = []
        self._previous: TraceFunction | None = None
        self._tracing = False
        self._main: dict[str, Any] | None = None

    def waiting(self) -> list[str]:
        """The targets still waiting, as ``module:attr``."""
        with self._lock:
            return [f"{w.module}:{w.attr}" for w in self._waiting]

    def wait_for(self, module: str, attr: str, weave: Callable[[ModuleType], None]) -> bool:
        """Weave ``attr`` of the main script now when it is defined, else as soon as the script defines it.

        Args:
            module: the module part of the target (a name :func:`names_main_script` does not deny).
            attr: ``Class.method`` or ``function``.
            weave: called with the main module once the name is bound, in the main thread; raises
                :class:`~skipweave.weaving.resolve.TargetNotFound` when the target does not resolve on it.

        Returns:
            True when the target waits (or was woven now); False when nothing can wait for it: the script is past
            its definitions (the weave runs inside a call the script made, e.g. a Hydra app's ``main()``), or this
            is not the main thread. The caller then resolves it now and reports what is missing.

        Raises:
            TargetNotFound: from ``weave``, when the name is bound but the rest of the path does not resolve.
        """
        undecided = names_main_script(module) is None
        main = sys.modules.get(MAIN)
        if not undecided and main is not None and attr.split(".", 1)[0] in vars(main):
            weave(main)
            return True
        if threading.current_thread() is not threading.main_thread() or not self._script_may_define_more():
            return False
        with self._lock:
            self._waiting.append(_Waiting(module, attr, weave, undecided))
            self._arm()
        return True

    def forget(self) -> None:
        """Stop waiting for every target (unweave); the tracer stands down at the script's next statement."""
        with self._lock:
            self._waiting.clear()
        if self._tracing and sys.gettrace() == self._global:  # (a bound method: compared by ==)
            sys.settrace(self._previous)
            self._tracing = False

    @staticmethod
    def _script_may_define_more() -> bool:
        """The script has not started yet, or its top-level code itself called the weave (not a function of it)."""
        if not main_script_started():
            return True
        main = sys.modules.get(MAIN)
        frame: FrameType | None = sys._getframe(1)
        while frame is not None and str(frame.f_globals.get("__name__", "")).startswith("skipweave"):
            frame = frame.f_back
        return frame is not None and main is not None and _is_top_level(frame, vars(main))

    def _arm(self) -> None:
        if self._tracing:
            return
        main = sys.modules.get(MAIN)
        self._main = vars(main) if main is not None else None
        self._previous = sys.gettrace()  # type: ignore[assignment]  # (typeshed: its own alias)
        self._tracing = True
        frame: FrameType | None = sys._getframe(1)
        while frame is not None and not (self._main is not None and _is_top_level(frame, self._main)):
            frame = frame.f_back
        if frame is not None:  # the script runs already: follow its top-level frame from here
            frame.f_trace = self._local_for(frame.f_trace)
        sys.settrace(self._global)
        from skipweave import lifecycle

        lifecycle.at_exit(lifecycle.STOP, self.forget)  # no tracer of ours while the interpreter finalizes
        logger.debug("skipweave: following the main script until it defines %s", ", ".join(self.waiting()))

    def _global(self, frame: FrameType, event: str, arg: Any) -> Any:
        """Every new frame of the main thread while targets wait: the script's top-level frame gets followed."""
        previous = self._previous
        local = previous(frame, event, arg) if previous is not None else None
        if not self._waiting:
            sys.settrace(previous)
            self._tracing = False
            return local
        if self._main is None:
            main = sys.modules.get(MAIN)
            self._main = vars(main) if main is not None else None
        if self._main is not None and _is_top_level(frame, self._main):
            self._script_starts()
            return self._local_for(local)
        return local

    def _script_starts(self) -> None:
        """The script's first statement: targets whose module was only a guess are judged now."""
        with self._lock:
            for w in list(self._waiting):
                if w.undecided:
                    if names_main_script(w.module):
                        w.undecided = False
                    else:
                        self._waiting.remove(w)  # another module after all: its post-import hook weaves it

    def _local_for(self, previous: TraceFunction | None) -> TraceFunction:
        """The line tracer of the script's top-level frame, passing every event on to ``previous`` too."""
        def local(frame: FrameType, event: str, arg: Any) -> Any:
            nonlocal previous
            if previous is not None:
                previous = previous(frame, event, arg)  # (a tracer returns the next local tracer, or None)
            if event in ("line", "return"):
                self._look(frame)
            if not self._waiting or event == "return":
                return previous
            return local

        return local

    def _look(self, frame: FrameType) -> None:
        """Weave every waiting target whose name the script has bound by now."""
        main = sys.modules.get(MAIN)
        if main is None:
            return
        bound = frame.f_globals
        with self._lock:
            ready = [w for w in self._waiting if not w.undecided and w.name in bound]
            for w in ready:
                self._waiting.remove(w)
            if not self._waiting and self._tracing:
                sys.settrace(self._previous)
                self._tracing = False
        for w in ready:
            w.weave(main)  # TargetNotFound surfaces at the script's statement, as a failed import hook's would


def _is_top_level(frame: FrameType, main_globals: dict[str, Any]) -> bool:
    return frame.f_globals is main_globals and frame.f_code.co_name == "<module>"


WATCH = MainScriptWatch()
"""The process's watch over the main script."""

__all__ = ["MAIN", "WATCH", "MainScriptWatch", "main_script_names", "main_script_started", "names_main_script"]
