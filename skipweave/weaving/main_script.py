"""Targets in the program's main script: woven the moment the script defines them.

``python train.py`` runs ``train.py`` as the module ``__main__``. A class or function the script defines exists only
once its top-level code has run the definition, and no import announces it: a post-import hook for ``train`` waits
for an ``import train`` that never comes, and a weave made before the script runs (``skipweave run``) finds an
empty ``__main__``. So a target named ``__main__:Trainer.generate``, or by the script's own module name
(``train.Trainer.generate`` for ``python train.py``, ``pkg.train.Trainer.generate`` for ``python -m pkg.train``),
that the script has not defined yet is handed to :data:`WATCH`, which first reads the script's source to learn how
its top level binds the name:

- a method of a class the script defines with a ``class`` statement (the usual case) is woven the moment the class
  is built, before any decorator sees it: :data:`builtins.__build_class__`, which every ``class`` statement calls,
  is wrapped while such targets wait (and until exit, to tell of a second definition of a woven class), which costs
  nothing to any other call;
- a name bound otherwise (a ``def``, an assignment, an import) is woven as soon as it is bound to a class or
  function that holds the target: the watch follows the script's top-level code statement by statement
  (:func:`sys.settrace` in the main thread, line events of the script's top-level frame only; any tracer installed
  before, a debugger's or coverage's, keeps getting its events) and stands down once none waits. Until then every
  Python call of the main thread pays for a tracer call;
- a name the script's top level never binds is not waited for at all: it is reported at exit as never defined.

Before any of this the weaver asks :mod:`~skipweave.weaving.script_check` whether the source proves the target can
never be defined (a misspelt class or method): that stops the weave, before the script's first line. A target the
source cannot judge and that fails where the script defines it (its class lacks the method, which only the built
class tells: it comes from an imported base) raises at that statement, after :meth:`MainScriptWatch.on_failure`'s
handler (``skipweave run``'s stops the program there, exit status 2).

What cannot work, and is reported at exit as never woven (see :mod:`skipweave.report`):

- a class or function defined inside a function (``main.<locals>.Trainer``): it is no attribute of the script;
- a definition the script never reaches (behind a condition that is false, or after a ``sys.exit``).

A reference to a function taken while the statement defining it runs (a decorator that registers the function
in a table) keeps the function unwoven, as a ``from module import name`` copy taken before a weave does. A class
the script defines a second time is not woven again: a WARNING names the line.
"""

from __future__ import annotations

import builtins
import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType, ModuleType
from typing import Any

from skipweave.weaving.script_source import how_binds, parse_script

logger = logging.getLogger(__name__)

MAIN = "__main__"

TraceFunction = Callable[[FrameType, str, Any], Any]
"""What :func:`sys.settrace` takes, and a frame's ``f_trace``."""

FailureHandler = Callable[[Exception, str], object]
"""Told of a target that failed to weave where the script defines it: the error, and where (see
:meth:`MainScriptWatch.on_failure`)."""


def main_script_started() -> bool:
    """Whether the interpreter has begun running the main script (its ``__main__`` knows its file or spec).

    False at interpreter start-up (``sitecustomize``, where ``skipweave run`` weaves), True from the script's first
    statement on, and in an interactive session or ``python -c`` (which have no script to wait for)."""
    main = sys.modules.get(MAIN)
    if main is None:
        return False
    if getattr(main, "__file__", None) or getattr(main, "__spec__", None) is not None:
        return True
    return not script_name_from_command_line()


def _command_line_script() -> tuple[str, str] | None:
    """What this interpreter's command line runs as the main script (see :func:`script_of_argv`)."""
    return script_of_argv(list(getattr(sys, "orig_argv", []) or [])[1:])


def script_of_argv(argv: Sequence[str]) -> tuple[str, str] | None:
    """What a Python command line runs as the main script: ``("file", "train.py")``, ``("module", "pkg.train")``,
    or ``None`` (``-c``, ``-``, interactive).

    Args:
        argv: the interpreter's arguments, without the interpreter itself (``sys.orig_argv[1:]``).
    """
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "-m" and i + 1 < len(argv):
            return "module", argv[i + 1]
        if arg.startswith("-m") and len(arg) > 2:
            return "module", arg[2:]
        if arg in ("-c", "-") or arg.startswith("-c"):
            return None
        if arg in ("-W", "-X", "--check-hash-based-pycs"):
            i += 2
            continue
        if arg.startswith("-"):
            i += 1
            continue
        return "file", arg
    return None


def script_name_from_command_line() -> str | None:
    """The module name the command line gives the main script (``train`` for ``python train.py``, ``pkg.train`` for
    ``python -m pkg.train``), or ``None``."""
    script = _command_line_script()
    if script is None:
        return None
    kind, value = script
    return value if kind == "module" else module_name_of_file(value)


def module_name_of_file(path: str) -> str | None:
    """The module name a script file runs under besides ``__main__`` (``train`` for ``train.py``), or ``None``."""
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
        name = module_name_of_file(str(main.__file__))  # type: ignore[union-attr]
        if name:
            names.append(name)
    elif not main_script_started():
        name = script_name_from_command_line()
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
    traced: bool = True  # the name is bound otherwise than by a class statement: the tracer looks for it

    @property
    def name(self) -> str:
        return self.attr.split(".", 1)[0]

    @property
    def of_class(self) -> bool:
        """A method (``Class.method``): the class statement that builds the class weaves it."""
        return "." in self.attr


def holds_target(value: Any, attr: str) -> bool:
    """Whether ``value``, bound to the first name of ``attr``, is what the target lives on: a class for
    ``Class.method``, a function for ``function`` (so ``Trainer = None`` before ``class Trainer`` is passed by)."""
    if "." in attr:
        return isinstance(value, type) or hasattr(value, "__ray_actor_class__")  # (a @ray.remote class)
    return callable(value) and not isinstance(value, type)


def how_script_binds(name: str) -> str | None:
    """How the main script's top level binds ``name``, read from its source: ``"class"`` (only ``class``
    statements), ``"other"`` (a ``def``, an assignment, an import, ``global``, or a ``from m import *``),
    ``"never"``; ``None`` when the source cannot be read or parsed (then nothing is assumed)."""
    path = script_path()
    tree = parse_script(path) if path is not None else None
    return how_binds(tree, name) if tree is not None else None


def script_path() -> str | None:
    """The main script's source file: ``__main__.__file__`` once it runs, the command line's before."""
    main = sys.modules.get(MAIN)
    path = getattr(main, "__file__", None)
    if path:
        return str(path)
    script = _command_line_script()
    if script is None:
        return None
    kind, value = script
    if kind == "module":
        return module_file(value)
    return value if value.endswith((".py", ".pyw")) else None


def module_file(name: str, path: Sequence[str] | None = None) -> str | None:
    """The source file ``python -m name`` runs, found on ``path`` (default ``sys.path``) without importing anything
    (its packages' ``__init__`` run only when the program starts): ``pkg/train.py``, or ``pkg/__main__.py`` for a
    package; ``None`` when there is none."""
    parts = name.split(".")
    for base in sys.path if path is None else path:
        folder = os.path.join(base or os.curdir, *parts)
        for candidate in (folder + ".py", os.path.join(folder, "__main__.py")):
            if os.path.isfile(candidate):
                return candidate
    return None


class MainScriptWatch:
    """Weaves targets of the main script the moment the script binds their name. Use :data:`WATCH`."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._waiting: list[_Waiting] = []
        self._previous: TraceFunction | None = None
        self._tracing = False
        self._main: dict[str, Any] | None = None
        self._build_class: Callable[..., Any] | None = None  # builtins' own, while ours is installed
        self._woven_classes: dict[str, type] = {}  # name -> the class the watch wove, to tell of a second one
        self._on_failure: FailureHandler | None = None

    def on_failure(self, handler: FailureHandler | None) -> None:
        """Have ``handler(error, where)`` called when a waiting target fails to weave where the script defines it
        (its class lacks the method: :class:`~skipweave.weaving.resolve.TargetNotFound`), with ``where`` saying
        where (``"the main script's class statement 'Policy' at line 7"``). The handler may end the process
        (``skipweave run`` does: its start-up message, exit 2); when it returns, the error is raised at the script's
        statement, as a failed import hook's is at the ``import``. ``None`` removes the handler."""
        self._on_failure = handler

    def _failed(self, exc: Exception, where: str) -> None:
        handler = self._on_failure
        if handler is not None:
            handler(exc, where)

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
        name = attr.split(".", 1)[0]
        if not undecided and main is not None and holds_target(vars(main).get(name), attr):
            weave(main)
            return True
        if threading.current_thread() is not threading.main_thread() or not self.script_may_define_more():
            return False
        binds = how_script_binds(name)
        w = _Waiting(module, attr, weave, undecided, traced=binds != "never" and not (binds == "class" and
                                                                                          "." in attr))
        with self._lock:
            self._waiting.append(w)
            if w.of_class:
                self._hook_class_statements()
            if w.traced:
                self._arm()
        if binds == "never":
            logger.debug("skipweave: the main script never binds %r at its top level: %s:%s waits for nothing",
                         name, module, attr)
        return True

    def forget(self) -> None:
        """Stop waiting for every target (unweave, exit): ``class`` statements are left alone again, and the
        tracer stands down at the script's next statement."""
        with self._lock:
            self._waiting.clear()
            self._woven_classes.clear()
            if self._build_class is not None:
                if builtins.__build_class__ == self._on_class_statement:  # (a bound method: compared by ==)
                    builtins.__build_class__ = self._build_class
                self._build_class = None
        if self._tracing and sys.gettrace() == self._global:
            sys.settrace(self._previous)
            self._tracing = False

    def _hook_class_statements(self) -> None:
        if self._build_class is not None:
            return
        self._build_class = builtins.__build_class__
        builtins.__build_class__ = self._on_class_statement  # type: ignore[assignment]  # (same call shape)
        from skipweave import lifecycle

        lifecycle.at_exit(lifecycle.STOP, self.forget)

    def _on_class_statement(self, func: Callable[..., Any], name: str, /, *bases: Any, **kwds: Any) -> Any:
        """``builtins.__build_class__`` while class targets of the main script wait: build the class, and when the
        script's top level defines one of them, weave it before any decorator or the name binding sees it.

        Raises:
            TargetNotFound: the class lacks the target's method (at the script's ``class`` statement).
        """
        build = self._build_class or _BUILD_CLASS
        cls = build(func, name, *bases, **kwds)
        main = sys.modules.get(MAIN)
        if (main is None or getattr(func, "__globals__", None) is not vars(main)
                or getattr(func, "__qualname__", name) != name):
            return cls  # another module's class, or one defined inside a function or class
        with self._lock:
            ready = []
            for w in list(self._waiting):
                if not w.of_class or w.name != name:
                    continue
                if w.undecided and not names_main_script(w.module):
                    self._waiting.remove(w)  # another module after all: its post-import hook weaves it
                    continue
                self._waiting.remove(w)
                ready.append(w)
            again = self._woven_classes.get(name)
            if ready:
                self._woven_classes[name] = cls
            self._stand_down_if_done()
        if again is not None and again is not cls and not ready:
            code = getattr(func, "__code__", None)
            logger.warning("skipweave: the main script defines class %r again (line %s) after skipweave wove the "
                           "first definition; the methods of this one are neither recorded nor replayed (define the "
                           "class once)", name, getattr(code, "co_firstlineno", "?"))
        for w in ready:
            try:
                w.weave(_Defined(name, cls))  # type: ignore[arg-type]  # (resolves the target as a module would)
            except Exception as exc:
                code = getattr(func, "__code__", None)
                self._failed(exc, f"the main script's class statement '{name}' at line "
                                  f"{getattr(code, 'co_firstlineno', '?')}")
                raise
        return cls

    def _any_traced(self) -> bool:
        return any(w.traced for w in self._waiting)

    def _stand_down_if_done(self) -> None:
        """No traced target waits any more: the tracer stands down (the class hook stays, see the class doc)."""
        if self._tracing and not self._any_traced():
            sys.settrace(self._previous)
            self._tracing = False

    @staticmethod
    def script_may_define_more() -> bool:
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
        if not self._any_traced():
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
            if event == "return" or not self._any_traced():
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
            ready = [w for w in self._waiting
                     if w.traced and not w.undecided and holds_target(bound.get(w.name), w.attr)]
            for w in ready:
                self._waiting.remove(w)
                if w.of_class:
                    self._woven_classes[w.name] = bound[w.name]
            self._stand_down_if_done()
        for w in ready:
            try:
                w.weave(main)
            except Exception as exc:
                self._failed(exc, f"the main script's line {frame.f_lineno}, once it had bound '{w.name}'")
                raise  # (at the script's statement, as a failed import hook's at the import)


_BUILD_CLASS = builtins.__build_class__


class _Defined:
    """What a class target is resolved on while its ``class`` statement runs: the class under its name."""

    def __init__(self, name: str, cls: type) -> None:
        setattr(self, name, cls)
        self.__name__ = MAIN


def _is_top_level(frame: FrameType, main_globals: dict[str, Any]) -> bool:
    return frame.f_globals is main_globals and frame.f_code.co_name == "<module>"


WATCH = MainScriptWatch()
"""The process's watch over the main script."""

__all__ = ["MAIN", "WATCH", "MainScriptWatch", "main_script_names", "main_script_started", "module_file",
           "module_name_of_file", "names_main_script", "script_name_from_command_line", "script_of_argv", "script_path"]
