"""The live environment of one target: what a call of it runs with besides its inputs (see docs/format.md#environment).

Recorded in every new entry's manifest and compared with a replayed entry's (:mod:`skipweave.store.format.environment`):

- ``packages``: the versions of :data:`ENGINE_MODULES` and of the packages the loaded integrations name in
  :data:`ENVIRONMENT_PACKAGES` (what each loaded integration declares in ``Integration.environment``: the engines its
  host runs on), those *imported* in this process (read from ``sys.modules``: a package is never imported to ask);
- ``host``: the distribution and version of the target's top-level package (``importlib.metadata``), when one is
  installed;
- ``source``: ``xxh3_128`` of the source text of the unwrapped original function (``inspect.getsource``), when the
  source is available;
- ``config``: the values of the app config keys ``skip.<role>.fingerprint.env`` names (read once with the config).

:func:`live_environment` is computed once per (role, target) per process, at its first recorded or replayed call (by
then the host has imported its engine), not per call: per-sample targets record thousands of entries.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

import xxhash

from skipweave.config.schema import RoleConfig, TargetSpec
from skipweave.hooks import Registry

logger = logging.getLogger(__name__)

ENGINE_MODULES = ("torch", "transformers")
"""The packages whose version, when imported, belongs to every entry's environment, whatever the host."""

ENVIRONMENT_PACKAGES: Registry[str] = Registry("environment package")
"""Further top-level packages whose version, when imported, belongs to an entry's environment: the engines a host
runs its rollouts on. Filled only by :meth:`skipweave.integrations.base.Integration.load` from the integrations'
declarations (``Integration.environment``); this module names none."""


def live_environment(role: RoleConfig, target: TargetSpec, original: Callable[..., Any] | None) -> dict[str, Any]:
    """The environment of ``target``'s calls in this process (the manifest's ``environment`` mapping).

    Args:
        role: the role's config (``fingerprint.env`` holds the named keys' values).
        target: the target; its path names the module when ``original`` has none.
        original: the function the weaver patched (``None`` when unknown: no source, the host from the path).

    Returns:
        A new mapping; parts that are unknown are left out. Never raises (a host whose metadata or source cannot be
        read gets an environment without that part, with a DEBUG line).
    """
    env: dict[str, Any] = {}
    names = dict.fromkeys((*ENGINE_MODULES, *ENVIRONMENT_PACKAGES))
    packages = {name: version for name in names if (version := _imported_version(name)) is not None}
    if packages:
        env["packages"] = packages
    func = _unwrapped(original)
    module = getattr(func, "__module__", None) or target.path.partition(":")[0]
    host = host_package(module.split(".", 1)[0]) if isinstance(module, str) else None
    if host is not None:
        env["host"] = {"name": host[0], "version": host[1]}
    source = source_hash(func) if func is not None else None
    if source is not None:
        env["source"] = source
    if role.fingerprint.env:
        env["config"] = dict(role.fingerprint.env)
    return env


def _imported_version(name: str) -> str | None:
    module = sys.modules.get(name)
    version = getattr(module, "__version__", None) if module is not None else None
    return str(version) if isinstance(version, str) and 0 < len(version) <= 100 else None


def _unwrapped(original: Callable[..., Any] | None) -> Callable[..., Any] | None:
    """``original`` without the wrappers another tool put around it (``functools.wraps``' ``__wrapped__``)."""
    if original is None:
        return None
    func = original.__func__ if isinstance(original, (classmethod, staticmethod)) else original
    try:
        return inspect.unwrap(func)
    except ValueError:  # a cycle of __wrapped__
        return func


def source_hash(func: Callable[..., Any]) -> str | None:
    """``xxh3_128:<32 hex>`` of ``func``'s source text, or ``None`` when it has none to read (a builtin, a function
    defined in an interactive session, a module shipped without its ``.py``)."""
    try:
        text = inspect.getsource(func)
    except (OSError, TypeError):
        return None
    except Exception as exc:  # noqa: BLE001 - a host's odd object must not fail its call
        logger.debug("skipweave: no source of %r (%s: %s)", func, type(exc).__name__, exc)
        return None
    return "xxh3_128:" + xxhash.xxh3_128_hexdigest(text.encode("utf-8", "surrogatepass"))


@functools.lru_cache(maxsize=64)
def host_package(top: str) -> tuple[str, str] | None:
    """``(distribution, version)`` of the installed distribution that provides top-level package ``top``, or ``None``
    (no distribution provides it: a script, a folder on ``sys.path``, ``__main__``). Cached per process. The
    distribution named ``top`` is asked first (torch, most hosts: a few ms); only when it does not provide ``top`` and
    ``top`` was imported from a ``site-packages`` folder (``yaml`` of ``PyYAML``) is every installed distribution's
    metadata read (``packages_distributions``: 0.33 s in a venv with verl, Dec 2026). A package imported from elsewhere
    under another distribution's name (an editable install named otherwise) is then unknown: no version recorded."""
    from importlib import metadata

    if not top or top == "__main__":
        return None
    try:
        same = _same_named(top)
        if same is not None or not _in_site_packages(top):
            return same
        names = _distributions().get(top) or ()
        for name in names:
            return name, metadata.version(name)
    except Exception as exc:  # noqa: BLE001 - broken metadata of some distribution: the version is unknown
        logger.debug("skipweave: no version of %s (%s: %s)", top, type(exc).__name__, exc)
    return None


def _in_site_packages(top: str) -> bool:
    """Whether the imported top-level package ``top`` lives in a ``site-packages`` or ``dist-packages`` folder (where
    installed distributions put it; a script or a folder on ``sys.path`` is not installed)."""
    module = sys.modules.get(top)
    paths = [getattr(module, "__file__", None), *(getattr(module, "__path__", None) or ())]
    return any(isinstance(p, str) and any(part in ("site-packages", "dist-packages") for part in p.split(os.sep))
               for p in paths)


def _same_named(top: str) -> tuple[str, str] | None:
    """The distribution named ``top`` when it provides the top-level package ``top`` (its ``top_level.txt``, else its
    file list, says so; a distribution of that name that ships other packages is not the host's)."""
    from importlib import metadata

    try:
        dist = metadata.distribution(top)
    except metadata.PackageNotFoundError:
        return None
    provided = (dist.read_text("top_level.txt") or "").split()
    if top not in provided and not any(f.parts[:1] == (top,) for f in dist.files or ()):
        return None
    return dist.metadata["Name"] or top, dist.version


@functools.lru_cache(maxsize=1)
def _distributions() -> Mapping[str, list[str]]:
    from importlib import metadata

    return metadata.packages_distributions()


__all__ = ["ENGINE_MODULES", "ENVIRONMENT_PACKAGES", "host_package", "live_environment", "source_hash"]
