"""What a script's source says of the names its top level binds, read without running a line of it.

A target in the main script (``__main__:Policy.generate``) names a class the script has not defined yet when
skipweave weaves (at start-up, or at a ``skipweave.weave()`` above the definitions). Its source says how the name
will be bound (:func:`how_binds`, which tells :mod:`~skipweave.weaving.main_script` whether to wait at ``class``
statements or follow the script's lines) and, for a misspelt target, that it never will be (:func:`undefined`):
then the run can stop before the script's first line, as it does for a misspelt target in a module.

:func:`undefined` refuses only what the source proves: a name no statement of the file binds (nor a ``from m
import *``, ``globals()``, ``exec``, ``sys.modules`` or a module ``__getattr__`` could), or a member that a class
defined by ``class`` statements alone lacks, whose bases are ``object`` or classes of the script proven the same
way, with no decorator, metaclass or ``__init_subclass__`` that could add it. A class deriving from an imported
class, a name bound by an assignment or an import, a class defined only inside a function: all are left to the
weave at the class statement (or to the exit summary). What no source can show (a call into another module that
writes the script's globals through a frame, a descriptor's ``__set_name__`` adding a method) is not guessed at.
"""

from __future__ import annotations

import ast
import difflib
import functools
import os
from collections.abc import Iterator

DYNAMIC_CALLS = frozenset({"globals", "exec", "eval"})
"""Calls through which code anywhere in the script may bind its names (``globals()["Policy"] = ...``)."""

DYNAMIC_ATTRIBUTES = frozenset({"f_globals", "f_locals"})
"""Attributes through which code may reach a scope's names (``sys._getframe().f_globals``)."""


def parse_script(path: str) -> ast.Module | None:
    """The parsed source of the script at ``path``, or ``None`` when it cannot be read or parsed (then nothing may
    be concluded from it). Parsed once per file version: every target of a plan asks."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return _parse(path, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=8)
def _parse(path: str, mtime_ns: int, size: int) -> ast.Module | None:
    try:
        with open(path, "rb") as f:
            return ast.parse(f.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return None


def how_binds(tree: ast.Module, name: str) -> str:
    """How the script binds ``name``: ``"class"`` (only ``class`` statements), ``"other"`` (a ``def``, an
    assignment, an import, ``global``, or a ``from m import *``), or ``"never"`` (no statement of the file)."""
    kinds = set(_bindings(tree.body, name))
    if not kinds:
        return "never"
    return "class" if kinds == {"class"} else "other"


def _bindings(body: list[ast.stmt], name: str) -> Iterator[str]:
    """``"class"`` or ``"other"`` for each statement under ``body`` that binds ``name``. Nested bodies count too (a
    function's local of that name says ``"other"``: the tracer then looks, which is never wrong, only slower; and no
    name is called never bound that some statement binds)."""
    for stmt in body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.ClassDef):
                if node.name == name:
                    yield "class"
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.name == name:
                    yield "other"
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                if any(a.name == "*" or (a.asname or a.name.split(".", 1)[0]) == name for a in node.names):
                    yield "other"
            elif isinstance(node, ast.Name):
                if node.id == name and isinstance(node.ctx, (ast.Store, ast.Del)):
                    yield "other"
            elif isinstance(node, (ast.Global, ast.Nonlocal)) and name in node.names:
                yield "other"
            elif isinstance(node, ast.ExceptHandler) and node.name == name:
                yield "other"
            elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name == name:
                yield "other"
            elif isinstance(node, ast.MatchMapping) and node.rest == name:
                yield "other"


def undefined(tree: ast.Module, attr: str, script: str, *, typos_only: bool = False) -> tuple[str, str] | None:
    """The first part of ``attr`` the script's source proves it will never define, and why; ``None`` when it may.

    Args:
        tree: the script's source (:func:`parse_script`).
        attr: the target's path inside the script: ``Class.method`` (deeper parts are not judged) or ``function``.
        script: the script's file name, for the message (``train.py``).
        typos_only: a name the script never binds is refused only when it binds a close one (a misspelling):
            for a target that may be meant for another process's script (``__main__:...`` in a launcher script
            that starts the trainer as a child).

    Returns:
        ``(failed, reason)``: the failing part of ``attr`` (``Polcy``, ``Policy.generat``) and a sentence with a
        did-you-mean over the names the script (or the class) defines, in the shape of
        :class:`~skipweave.weaving.resolve.TargetNotFound`'s reasons; or ``None``.
    """
    parts = attr.split(".")
    name = parts[0]
    if _dynamic(tree.body, nested=True) or "__getattr__" in _scope_names(tree.body):
        return None  # names bound no statement shows, or a module __getattr__ answering any name
    binds = how_binds(tree, name)
    if binds == "never":
        suggestion = _did_you_mean(name, _scope_names(tree.body))
        if typos_only and not suggestion:
            return None
        return name, f"the main script {script} never defines '{name}'{suggestion}"
    if binds != "class" or len(parts) < 2:
        return None
    classes = _module_classes(tree, name)
    if not classes or any(_may_have(tree, cls, parts[1], frozenset()) for cls in classes):
        return None  # (no class at the top level: defined inside a function, which the exit summary names)
    members = set().union(*(_class_members(tree, cls, frozenset()) for cls in classes))
    return f"{name}.{parts[1]}", (f"class '{name}' ({script} line {classes[0].lineno}) has no attribute "
                                  f"'{parts[1]}'{_did_you_mean(parts[1], members)}")


def _did_you_mean(name: str, names: set[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest of ``names`` (dunder names left out), or ``""``; as
    :mod:`~skipweave.weaving.resolve` words it."""
    close = difflib.get_close_matches(name, sorted(n for n in names if not n.startswith("__")), n=1)
    return f"; did you mean '{close[0]}'?" if close else ""


def _module_classes(tree: ast.Module, name: str) -> list[ast.ClassDef]:
    """The ``class name`` statements of the module's own scope (inside ``if``/``try``/``for``/``with`` too, not
    inside a function or class: those build ``f.<locals>.name``, which is not the module's attribute)."""
    return [node for node in _scope_nodes(tree.body) if isinstance(node, ast.ClassDef) and node.name == name]


def _scope_nodes(body: list[ast.stmt]) -> Iterator[ast.AST]:
    """Every node of one scope: the statements of ``body`` and what they hold, without descending into a nested
    function, lambda or class body (a nested ``def`` or ``class`` statement itself is yielded)."""
    stack: list[ast.AST] = list(reversed(body))
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            children: list[ast.AST] = [*node.decorator_list]
            if isinstance(node, ast.ClassDef):
                children += [*node.bases, *node.keywords]
            else:
                children += [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]
            stack.extend(reversed(children))
        elif isinstance(node, ast.Lambda):
            stack.extend(reversed(node.args.defaults))
        else:
            stack.extend(reversed(list(ast.iter_child_nodes(node))))


def _scope_names(body: list[ast.stmt]) -> set[str]:
    """The names one scope's statements bind: a module's globals, a class's attributes (a method's locals are not
    the class's). For suggestions, to find a module ``__getattr__``, and to tell whether a class body binds a name."""
    names: set[str] = set()
    for node in _scope_nodes(body):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(a.asname or a.name.split(".", 1)[0] for a in node.names if a.name != "*")
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
            names.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            names.update(node.names)
    return names


def _dynamic(body: list[ast.stmt], *, nested: bool) -> bool:
    """Whether code may bind a name of this scope that no statement shows: ``vars()``, ``locals()``, ``exec``,
    ``eval`` or ``globals()`` in the scope's own statements; with ``nested`` (the module's scope, whose names any
    function of it may reach), also ``globals()``, ``exec``/``eval``, ``sys.modules``, a frame's ``f_globals``,
    ``import __main__`` (its attributes are the script's names) or a ``from m import *`` anywhere in the file."""
    for node in _scope_nodes(body):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and (
            node.func.id in ("exec", "eval", "globals")
            or (node.func.id in ("vars", "locals") and not node.args and not node.keywords)
        ):
            return True
    if not nested:
        return False
    for stmt in body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in DYNAMIC_CALLS:
                return True
            if isinstance(node, ast.Attribute) and (
                node.attr in DYNAMIC_ATTRIBUTES
                or (node.attr == "modules" and isinstance(node.value, ast.Name) and node.value.id == "sys")
            ):
                return True
            if isinstance(node, (ast.Import, ast.ImportFrom)) and any(a.name in ("*", "__main__") for a in node.names):
                return True
            if isinstance(node, ast.ImportFrom) and node.module == "__main__":
                return True
    return False


def _may_have(tree: ast.Module, cls: ast.ClassDef, member: str, seen: frozenset[str]) -> bool:
    """Whether the class built by ``cls`` may have ``member`` right after its ``class`` statement (when skipweave
    weaves it): unless its own body, its decorators, metaclass, bases and their ``__init_subclass__`` are all seen
    in the script and none can supply it."""
    if hasattr(type, member) or member.startswith("__"):
        return True  # every class has it (object's and type's members), or Python may make it (__dict__, ...)
    if cls.decorator_list or cls.keywords or member in _scope_names(cls.body):
        return True  # (a decorator or a metaclass may add anything; keywords go to a base's __init_subclass__)
    if _dynamic(cls.body, nested=False):
        return True
    for base in cls.bases:
        if isinstance(base, ast.Name) and base.id == "object" and how_binds(tree, "object") == "never":
            continue
        if not isinstance(base, ast.Name) or base.id in seen or how_binds(tree, base.id) != "class":
            return True  # an imported class, an expression, an alias: known only at the class statement
        defined = _module_classes(tree, base.id)
        if not defined:
            return True
        for base_cls in defined:
            if "__init_subclass__" in _scope_names(base_cls.body):
                return True  # it may set attributes on every subclass
            if _may_have(tree, base_cls, member, seen | {cls.name}):
                return True
    return False


def _class_members(tree: ast.Module, cls: ast.ClassDef, seen: frozenset[str]) -> set[str]:
    """The names ``cls``'s body binds, with those of the script's classes it derives from (for suggestions)."""
    names = _scope_names(cls.body)
    for base in cls.bases:
        if isinstance(base, ast.Name) and base.id not in seen and base.id != cls.name:
            for base_cls in _module_classes(tree, base.id):
                names |= _class_members(tree, base_cls, seen | {cls.name})
    return names


__all__ = ["how_binds", "parse_script", "undefined"]
