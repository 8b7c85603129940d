"""Targets of the main script checked against its source, before the script defines them.

A misspelt target in a module stops a run before the host's code runs (its module is imported and resolved then); a
target in the script being run (``__main__:Policy.generate``, ``train.Policy.generate``) names what the script has not
defined yet. Its source, though, is there to read: :func:`undefined_in_script` (in the process, when it weaves) and
:func:`undefined_in_file` (``skipweave run``'s check before it starts the command, on the script
:func:`command_script` finds) tell a class or method the script
can never define, with a did-you-mean, by :func:`~skipweave.weaving.script_source.undefined`; anything the source
cannot prove is left to the weave where the script defines the name (:mod:`~skipweave.weaving.main_script`).
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
from collections.abc import Sequence

from skipweave.weaving.main_script import (
    MAIN,
    MainScriptWatch,
    main_script_names,
    module_file,
    module_name_of_file,
    script_name_from_command_line,
    script_of_argv,
    script_path,
)
from skipweave.weaving.script_source import parse_script, undefined


def undefined_in_script(module: str, attr: str) -> tuple[str, str] | None:
    """Why target ``module:attr`` of the main script can never resolve, told from the script's source before the
    script defines it; ``None`` when it may (see :func:`~skipweave.weaving.script_source.undefined`).

    Judged only while the script may still define the name (it has not started, or its top level is running this
    weave) and its module does not hold the name yet (a live name is resolved, not read), in the main thread, and
    when ``module`` certainly names the script's source (``pkg`` of ``python -m pkg`` is the package, not its
    ``__main__.py``).

    Returns:
        ``(failed, reason)``: the failing part, ``module.Class.method``, and a sentence for
        :class:`~skipweave.weaving.resolve.TargetNotFound`.
    """
    main = sys.modules.get(MAIN)
    name = attr.split(".", 1)[0]
    if main is not None and name in vars(main):
        return None
    if threading.current_thread() is not threading.main_thread() or not MainScriptWatch.script_may_define_more():
        return None
    path = script_path()
    if path is None or not _source_of(module, path):
        return None
    return undefined_in_file(path, module, attr)


def undefined_in_file(path: str, module: str, attr: str) -> tuple[str, str] | None:
    """:func:`undefined_in_script` for the script at ``path`` run as ``module`` (the launcher's check, before the
    program starts): ``None`` when the file cannot be read or parsed, or may define ``attr``.

    ``__main__`` is every process's main script, so a ``__main__:`` target may be meant for another process of the
    program than this one (a launcher script, ``python -m torch.distributed.run train.py``, starting the trainer as
    its child; a Ray worker): it is not judged in a script that an installed package or the standard library holds,
    and a name the script never binds is refused only when the script binds a close one (a misspelling). A target
    naming the script by its own name (``train.Policy.generate``) means this file, wherever it runs.
    """
    if module == MAIN and _installed(path):
        return None
    tree = parse_script(path)
    found = undefined(tree, attr, os.path.basename(path), typos_only=module == MAIN) if tree is not None else None
    return (f"{module}.{found[0]}", found[1]) if found is not None else None


def command_script(argv: Sequence[str], path: Sequence[str] | None = None) -> tuple[str, tuple[str, ...]] | None:
    """The source file a Python command line runs as its main script, and every module name a target may give it
    (as :func:`main_script_names` will once it runs): ``("train.py", ("__main__", "train"))`` for ``python
    train.py``, ``("pkg/train.py", ("__main__", "pkg.train"))`` for ``python -m pkg.train``, ``("pkg/__main__.py",
    ("__main__", "pkg.__main__"))`` for ``python -m pkg``; ``None`` for ``-c``, ``-`` or a script that is no
    ``.py`` file (a folder, a zip) or is not found.

    Args:
        argv: the interpreter's arguments, without the interpreter itself.
        path: where ``-m`` modules are looked for (default ``sys.path``).
    """
    script = script_of_argv(argv)
    if script is None:
        return None
    kind, value = script
    if kind == "module":
        source = module_file(value, path)
        if source is None:
            return None
        return source, (MAIN, f"{value}.__main__" if os.path.basename(source) == "__main__.py" else value)
    if not value.endswith((".py", ".pyw")) or not os.path.isfile(value):
        return None
    stem = module_name_of_file(value)
    return value, (MAIN, stem) if stem else (MAIN,)


def _installed(path: str) -> bool:
    """Whether ``path`` lies in the standard library or an installed package's folder (site-packages)."""
    here = os.path.realpath(path)
    paths = sysconfig.get_paths()
    folders = {os.path.join(os.path.realpath(paths[key]), "") for key in ("stdlib", "platstdlib", "purelib", "platlib")
               if paths.get(key)}
    return any(here.startswith(folder) for folder in folders)


def _source_of(module: str, path: str) -> bool:
    """Whether target module ``module`` is certainly the script at ``path``: ``__main__``, or the script's own name
    (``train`` of ``python train.py``, ``pkg.train`` of ``python -m pkg.train``, ``pkg.__main__`` of ``python -m
    pkg``; never ``pkg``, the package)."""
    if module == MAIN:
        return True
    if os.path.basename(path) == "__main__.py":  # python -m pkg: pkg is the package, pkg.__main__ the script
        return module == f"{script_name_from_command_line()}.__main__"
    return module in main_script_names()


__all__ = ["command_script", "undefined_in_file", "undefined_in_script"]
