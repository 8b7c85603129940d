"""Turn a target path into (module name, attribute path) without importing the host's module.

Two spellings are accepted: ``pkg.mod:Class.method`` (module explicit) and the dotted form Hydra uses
for ``_target_`` (``pkg.mod.Class.method``), where the module is the longest prefix that is a module.
Finding that prefix asks the import finders where each part lives without importing anything, so a
target in a module not yet imported is patched when the host first imports it, and weaving a profile
never imports the host library (verl's package alone takes seconds). Only a path the finders cannot
place so (a package building its ``__path__`` at import time, ``pkgutil.extend_path``) is looked up by
importing its parent packages -- and, for an optional target, not at all.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.machinery
import importlib.util
import inspect
import os
import re
import sys
from dataclasses import dataclass
from typing import Any

from skipweave.weaving.main_script import names_main_script


class TargetNotFound(LookupError):
    """A target path does not resolve; the message names the path and the part that failed."""

    def __init__(self, path: str, failed: str, reason: str) -> None:
        self.path = path
        self.failed = failed
        super().__init__(f"target '{path}' does not resolve: {reason} (failed at '{failed}')")


@dataclass(frozen=True)
class ResolvedPath:
    """A target path split into its module and the attribute path inside it."""

    path: str
    module: str
    attr: str  # e.g. "Class.method" or "func"


def split_path(path: str, *, may_import: bool = True) -> ResolvedPath:
    """Split ``path`` into module and attribute path.

    Args:
        path: ``pkg.mod:Class.method`` or ``pkg.mod.Class.method``.
        may_import: when the finders cannot place a part without imports, import its parent packages
            to look again (False for optional targets: a part not found so counts as missing).

    Raises:
        TargetNotFound: no prefix of ``path`` is an importable module, or nothing is left for the attribute.
    """
    def find(name: str) -> Any:
        return _find_spec(name, may_import=may_import)

    if ":" in path:
        module, _, attr = path.partition(":")
        if not attr:
            raise TargetNotFound(path, path, "nothing after ':'")
        if module not in sys.modules and find(module) is None and names_main_script(module) is False:
            parts = module.split(".")
            failed = next(
                (".".join(parts[: i + 1]) for i in range(len(parts)) if find(".".join(parts[: i + 1])) is None),
                module,
            )
            raise TargetNotFound(path, failed, f"no module named '{failed}'")
        return ResolvedPath(path, module, attr)
    parts = path.split(".")
    module = ""
    for i in range(1, len(parts)):
        candidate = ".".join(parts[:i])
        if candidate in sys.modules:
            module = candidate
            mod = sys.modules[candidate]
            if not hasattr(mod, "__path__"):
                break  # a plain module: the rest are attributes
            continue
        spec = find(candidate)
        if spec is None:
            break
        module = candidate
        if spec.submodule_search_locations is None:
            break
    script = _main_script_prefix(parts)
    if len(script) > len(module):  # the running script, which no finder may place yet (skipweave run's start-up)
        module = script
    if not module:
        if len(parts) == 1:  # the config refuses it; a direct caller of this function gets the same words
            raise TargetNotFound(path, path, "the path names no module; write 'module:function' or "
                                             "'module:Class.method'")
        raise TargetNotFound(path, parts[0], f"no module named '{parts[0]}'")
    attr = path[len(module) + 1:]
    if not attr:
        raise TargetNotFound(path, path, "the path names a module; name a function or Class.method inside it")
    return ResolvedPath(path, module, attr)


def _main_script_prefix(parts: list[str]) -> str:
    """The longest leading part of a dotted path that may name the main script (``train`` of ``train.Gen.run`` for
    ``python train.py``, see :func:`~skipweave.weaving.main_script.names_main_script`), or ``""``."""
    for i in range(len(parts) - 1, 0, -1):
        candidate = ".".join(parts[:i])
        if names_main_script(candidate) is not False:
            return candidate
    return ""


def _find_spec(name: str, *, may_import: bool = True) -> Any:
    """The module spec of ``name``, or None; parents are not imported when the finders can do without.

    ``importlib.util.find_spec("a.b.c")`` imports ``a`` and ``a.b`` to learn where ``c`` lives: for a host
    library such as verl that is seconds of imports (torch, transformers, ray) in every process that weaves
    its profile, including processes that never touch it. The finders on ``sys.meta_path`` are asked
    directly instead, with the parent's search locations found the same way; a package that builds its
    ``__path__`` at import time (``pkgutil.extend_path``) is not found so, and is then looked up by
    importing its parents, as before.
    """
    spec = _find_spec_without_import(name)
    if spec is not None or not may_import:
        return spec
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None


def _find_spec_without_import(name: str) -> Any:
    if name in sys.modules:
        return getattr(sys.modules[name], "__spec__", None)
    parent, _, _ = name.rpartition(".")
    locations = None
    if parent:
        parent_spec = _find_spec_without_import(parent)
        locations = _plain_locations(getattr(parent_spec, "submodule_search_locations", None))
        if parent in sys.modules:
            locations = getattr(sys.modules[parent], "__path__", locations)
        if locations is None:
            return None
    for finder in sys.meta_path:
        if type(finder).__name__ == "ImportHookFinder" and type(finder).__module__.startswith("wrapt"):
            continue  # wrapt's post-import hook finder answers through importlib.util.find_spec: it imports
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        try:
            spec = find(name, locations)
        except Exception:  # noqa: BLE001 - a third-party finder failing is a "not found" here
            continue
        if spec is not None:
            return spec
    if parent and locations is not None:
        # A folder without __init__.py inside a package is a namespace portion; the path finder cannot
        # describe one while its parent is not imported (its _NamespacePath reads sys.modules[parent]).
        last = name.rpartition(".")[2]
        portions = [os.path.join(loc, last) for loc in locations if isinstance(loc, str)]
        portions = [p for p in portions if os.path.isdir(p)]
        if portions:
            spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
            spec.submodule_search_locations = portions
            return spec
    return None


def _plain_locations(locations: Any) -> list[str] | None:
    """A namespace package's search locations as a list, without its parent imported.

    Iterating a ``_NamespacePath`` recomputes it from ``sys.modules[parent].__path__``, which fails while the
    parent is not imported; the locations found with the spec are kept in its ``_path``.
    """
    if locations is None:
        return None
    try:
        return list(locations)
    except KeyError:
        return list(getattr(locations, "_path", None) or []) or None


def resolve_owner(module_obj: Any, rpath: ResolvedPath) -> tuple[Any, str]:
    """Walk ``rpath.attr`` inside an imported module; return ``(owner, final attribute name)``.

    Classes decorated ``@ray.remote`` resolve to Ray's ``ActorClass``; the walk continues through
    the user's class it holds, so ``pkg.mod.Worker.generate`` patches ``Worker.generate``.

    Raises:
        TargetNotFound: a part is missing.
    """
    owner = module_obj
    parts = rpath.attr.split(".")
    walked = rpath.module
    for part in parts[:-1]:
        walked += "." + part
        if not hasattr(owner, part):
            raise TargetNotFound(rpath.path, walked, _missing(owner, part))
        nxt = getattr(owner, part)
        if nxt is None:
            raise TargetNotFound(rpath.path, walked, _none(owner, part))
        owner = unwrap_actor_class(_unwrap_class_wrapper(nxt))
    final = parts[-1]
    if not hasattr(owner, final):
        raise TargetNotFound(rpath.path, f"{walked}.{final}", _missing(owner, final))
    if getattr(owner, final) is None:
        raise TargetNotFound(rpath.path, f"{walked}.{final}", _none(owner, final))
    return owner, final


def _missing(owner: Any, name: str) -> str:
    """Why ``name`` is not found on ``owner``: ``class 'Policy' has no attribute 'generate'``, and either that its
    instances set it (``self.generate = ...`` in the class's source: a class attribute cannot be woven for it) or the
    closest name it has."""
    said = f"{_describe(owner)} has no attribute '{name}'"
    if inspect.isclass(owner) and _instances_set(owner, name):
        return (f"{said}: its instances set it (self.{name} = ... in the class's source), which weaving a class "
                "cannot reach; name the function or method it is set from")
    return said + _did_you_mean(owner, name)


def _none(owner: Any, name: str) -> str:
    """Why ``name`` of ``owner`` cannot be woven although it exists: its value is ``None``."""
    said = f"{_describe(owner)} attribute '{name}' is None, not a function or method"
    if inspect.isclass(owner) and _instances_set(owner, name):
        said += f" (its instances set it: self.{name} = ...; name the function or method it is set from)"
    return said


def _instances_set(cls: type, name: str) -> bool:
    """Whether the source of ``cls`` or a class it derives from assigns ``self.<name>`` (read only when a target
    does not resolve; a class with no source, built-in or generated, says no)."""
    pattern = re.compile(rf"\bself\.{re.escape(name)}\s*(?::[^=\n]*)?=(?!=)")
    for klass in inspect.getmro(cls):
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        if pattern.search(source):
            return True
    return False


def _describe(owner: Any) -> str:
    """``"module 'pkg.mod'"``, ``"class 'Policy'"`` or ``"'Policy' object"``: what a missing name was looked up in."""
    if inspect.ismodule(owner):
        return f"module '{owner.__name__}'"
    if inspect.isclass(owner):
        return f"class '{owner.__qualname__}'"
    return f"'{type(owner).__name__}' object"


def _did_you_mean(owner: Any, name: str) -> str:
    """``"; did you mean 'x'?"`` for the closest public name of ``owner``, or ``""``."""
    try:
        names = [n for n in dir(owner) if not n.startswith("__")]
    except Exception:  # noqa: BLE001 - a host object whose dir() raises: no suggestion
        return ""
    close = difflib.get_close_matches(name, names, n=1)
    return f"; did you mean '{close[0]}'?" if close else ""


def _unwrap_class_wrapper(obj: Any) -> Any:
    """The class behind a wrapt wrapper of a class (a stub target of replay-only runs patches the class name
    itself): a method of that class is patched on the class, not looked up through the wrapper."""
    import wrapt

    if isinstance(obj, wrapt.BaseObjectProxy):
        inner = obj.__wrapped__
        if isinstance(inner, type):
            return inner
    return obj


def unwrap_actor_class(obj: Any) -> Any:
    """Return the user's class behind a Ray ``ActorClass``; any other object unchanged."""
    meta = getattr(type(obj), "__ray_metadata__", None) or getattr(obj, "__ray_metadata__", None)
    modified = getattr(meta, "modified_class", None)
    if modified is not None:  # Ray's generated subclass; the user's class is behind __ray_actor_class__
        return getattr(modified, "__ray_actor_class__", modified)
    return obj


def import_module(name: str) -> Any:
    """Import a module by name (thin wrapper kept for a single place of import)."""
    return importlib.import_module(name)
