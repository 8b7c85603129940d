"""``skipweave run``: weave a program that does not use Hydra, with no change to its source.

The parent (this module) composes the profiles (shipped names, names on ``SKIPWEAVE_PROFILE_PATH``,
YAML files) and overrides exactly as Hydra would, validates the plan, and replaces itself (``exec``)
with the command, adding two environment variables:

- ``SKIPWEAVE_PLAN``: the validated plan as JSON (``SkipConfig.to_config()``);
- ``PYTHONPATH``: :data:`BOOTSTRAP_DIR` first, whose ``sitecustomize`` makes every Python process of
  the program weave that plan (see :mod:`skipweave.integrations.launcher.bootstrap`) and then runs
  the user's own ``sitecustomize``, if any, instead of hiding it.

Both variables are inherited, so child processes (``torchrun`` ranks, multiprocessing workers, the
workers of a Ray cluster started by the program) are woven too. ``python -S``, ``-I`` and ``-E``
skip ``sitecustomize`` or ``PYTHONPATH`` and so are not woven.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from typing import NoReturn

from skipweave.config.schema import SkipConfig
from skipweave.env import PLAN_ENV, PROGRAM_PID_ENV
from skipweave.integrations.launcher.bootstrap import top_module
from skipweave.weaving.main_script import script_of_argv
from skipweave.weaving.resolve import TargetNotFound
from skipweave.weaving.script_check import command_script, undefined_in_file

BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap_site")
"""Folder holding the bootstrap ``sitecustomize.py``, put first on the child's ``PYTHONPATH``."""


def compose_plan(profile: str | Sequence[str], overrides: Sequence[str] = ()) -> SkipConfig:
    """Compose ``profile`` (one spec or several, in order) with ``overrides`` (Hydra command-line syntax)
    and validate it. Profile files are read here, in the parent: the children get the plan, not the files.

    Raises:
        skipweave.ConfigError: a profile found nowhere or a bad profile file, an override Hydra rejects,
            or a bad value.
    """
    from skipweave.config import load_skip_config
    from skipweave.config.profiles import compose_profile

    return load_skip_config(compose_profile(profile, overrides=overrides))


def child_env(plan: SkipConfig, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return the environment of the launched command: ``environ`` plus the plan and the bootstrap."""
    env = dict(os.environ if environ is None else environ)
    env[PLAN_ENV] = json.dumps(plan.to_config(), separators=(",", ":"))
    env[PROGRAM_PID_ENV] = str(os.getpid())  # the command is exec'd: its process keeps this pid
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != BOOTSTRAP_DIR]
    env["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP_DIR, *rest])
    return env


def preflight(plan: SkipConfig, command: Sequence[str], environ: Mapping[str, str] | None = None
              ) -> list[TargetNotFound]:
    """Check, before launching, each non-optional target: that its top-level module can be found, and for a
    target in the script itself (``__main__:Policy.generate``, ``train.Policy.generate``), that the script's
    source can define it.

    Only when the command runs this very interpreter on a script (``python script.py``) or a module
    (``python -m pkg``), whose import path is then known: the script's folder (or the working
    folder), ``PYTHONPATH``, and this interpreter's own path. Other commands (``python -c``,
    ``torchrun``, a shell) are checked by each process when it imports the target's package, and the script's
    targets at its start-up (the same judgement,
    :func:`~skipweave.weaving.script_check.undefined_in_script`); so is
    any command with ``skipweave run --no-preflight`` (for a script whose targets live only in the
    subprocesses it starts, with another import path).

    Returns:
        A :class:`~skipweave.TargetNotFound` per target that cannot resolve (empty when none): a top-level module
        that exists nowhere on that path, or a class or method the script's source proves it never defines.
    """
    first = _script_dir(command)
    if first is None:
        return []
    env = os.environ if environ is None else environ
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    problems: list[TargetNotFound] = []
    saved = list(sys.path)
    sys.path[:0] = [first, *extra]
    try:
        script = command_script(command[1:])
        source, names = script if script is not None else ("", ())
        for role in plan.enabled_roles:
            for target in role.targets:
                if target.optional:
                    continue
                in_script = _in_script(target.path, names)
                if in_script is not None:
                    missing = undefined_in_file(source, *in_script)
                    if missing is not None:
                        problems.append(TargetNotFound(target.path, *missing))
                    continue
                top = top_module(target.path)
                if top in sys.modules:
                    continue
                try:
                    found = importlib.util.find_spec(top) is not None
                except (ImportError, ValueError):
                    found = False
                if not found:
                    problems.append(TargetNotFound(
                        target.path, top, f"no module named '{top}' (searched {first} and PYTHONPATH too)"
                    ))
    finally:
        sys.path[:] = saved
        sys.path_importer_cache.pop(first, None)
    return problems


def _in_script(path: str, names: Sequence[str]) -> tuple[str, str] | None:
    """``(module, attr)`` of target ``path`` when its module is one of ``names`` (the script's), else ``None``."""
    module, colon, attr = path.partition(":")
    if colon:
        return (module, attr) if module in names else None
    for name in sorted(names, key=len, reverse=True):  # (pkg.train before pkg, were both names)
        if path.startswith(name + ".") and len(path) > len(name) + 1:
            return name, path[len(name) + 1:]
    return None


def _script_dir(command: Sequence[str]) -> str | None:
    """Return the folder Python will put first on ``sys.path`` for ``command``, if it runs this Python."""
    if len(command) < 2:
        return None
    exe = shutil.which(command[0])
    if exe is None or not _same_interpreter(exe, sys.executable):
        return None
    script = script_of_argv(command[1:])
    if script is None:
        return None
    kind, value = script
    return os.getcwd() if kind == "module" else os.path.dirname(os.path.realpath(value))


def _same_interpreter(a: str, b: str) -> bool:
    """``python`` and ``python3`` of one venv are one interpreter; the base Python they link to is not."""
    a, b = os.path.abspath(a), os.path.abspath(b)
    return os.path.dirname(a) == os.path.dirname(b) and os.path.realpath(a) == os.path.realpath(b)


def exec_command(command: Sequence[str], env: Mapping[str, str]) -> NoReturn:
    """Replace this process with ``command`` (searched on ``PATH``) in ``env``; signals and exit status
    are then the command's own.

    Raises:
        FileNotFoundError: the command does not exist.
        PermissionError: it is not executable.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(command[0], list(command), dict(env))
