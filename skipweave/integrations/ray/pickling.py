"""Pickling skipweave's wrappers by reference, so that a woven function can be handed to ``ray.remote``."""

from __future__ import annotations

import copyreg
import importlib
import sys
from typing import Any

import wrapt

from skipweave.integrations.ray.failures import Refusal
from skipweave.weaving.unpatch import wrapper_of

_pickle_installed = False


def import_by_path(module: str, qualname: str) -> Any:
    """Import ``module`` and walk ``qualname`` (``Class.attr`` allowed).

    Args:
        module: a dotted module name.
        qualname: a dotted attribute path inside it.

    Raises:
        ImportError: the module does not import.
        AttributeError: a part of ``qualname`` is missing.
    """
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def install_pickle_support() -> None:
    """Let skipweave's wrappers be pickled (by reference), e.g. a woven function handed to ``ray.remote``.

    wrapt's proxies refuse to pickle. A wrapper of skipweave pickles as "import ``module``, take
    ``qualname``", so the process that unpickles it gets its own object at that path: the woven one
    in a woven Ray worker. Other tools' wrappers keep wrapt's refusal. Registered once, through
    :mod:`copyreg` (cloudpickle and the standard pickler both consult it for this type).
    """
    global _pickle_installed
    if not _pickle_installed:
        copyreg.pickle(wrapt.FunctionWrapper, _reduce_function_wrapper)
        _pickle_installed = True


def _reduce_function_wrapper(obj: Any) -> tuple[Any, ...]:
    if not is_skipweave_wrapper(obj):
        raise NotImplementedError("object proxy must define __reduce__()")  # wrapt's own answer
    return (import_by_path, (obj.__module__, obj.__qualname__))


def is_skipweave_wrapper(obj: Any) -> bool:
    """True when ``obj`` (or a wrapt wrapper under it) is a skipweave proxy or refusal.

    Looks for the proxy module among the imported ones only: nothing is woven while it is not imported.
    """
    proxy_mod = sys.modules.get("skipweave.weaving.proxy")
    seen = 0
    while isinstance(obj, (wrapt.FunctionWrapper, wrapt.BoundFunctionWrapper)) and seen < 32:
        wrapper = wrapper_of(obj)
        if isinstance(wrapper, Refusal) or (proxy_mod is not None and proxy_mod.proxy_of(wrapper) is not None):
            return True
        obj, seen = getattr(obj, "__wrapped__", None), seen + 1
    return False


__all__ = ["import_by_path", "install_pickle_support", "is_skipweave_wrapper"]
