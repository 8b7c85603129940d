"""What an integration is: one declaration per host package, and the pair that loads it into the generic layers.

An :class:`Integration` says, once, everything skipweave knows of one host package (see docs/integrations.md):

- its ``name`` (what ``SKIPWEAVE_DISABLED_INTEGRATIONS`` names), the ``host`` distribution and the ``versions`` of it
  the integration supports (a PEP 440 specifier set, ``packaging``'s ``SpecifierSet``);
- what it adds to the generic layers: ``host_types`` (the codec's :data:`~skipweave.store.hosts.HOST_TYPES`, with what
  verify compares), ``config_adapters`` (:data:`~skipweave.config.adapters.CONFIG_ADAPTERS`), ``conventions`` (the
  role defaults a host's calls follow, :data:`~skipweave.config.conventions.CONVENTIONS`), ``result_notes``
  (:data:`~skipweave.weaving.notes.RESULT_NOTES`), ``weave_hooks`` (:data:`~skipweave.weaving.weave_hooks.WEAVE_HOOKS`),
  ``profiles`` (a package holding ``skip/<name>.yaml`` option files,
  :data:`~skipweave.config.profile_files.PROFILE_SOURCES`) and ``environment`` (packages whose versions belong in a
  recording's environment, :data:`~skipweave.weaving.environment.ENVIRONMENT_PACKAGES`);
- ``without_host``: which of those parts still load when the host package is not installed. verl's ``DataProto`` is a
  shape that trainers of their own copy (the tiny_grpo example, the fixture store's host): its host type, result note
  and config adapters work on that shape with no verl installed, and so load without it.

:meth:`Integration.load` and :meth:`Integration.unload` are OpenTelemetry's ``instrument``/``uninstrument`` pair:
idempotent, and ``unload`` removes exactly what ``load`` added. Deciding *whether* to load one (entry points, the off
switch, the version range) is :mod:`skipweave.integrations.discovery`'s.

The parts are named by reference, ``"module:ATTRIBUTE"`` (entry-point syntax), and imported only by :meth:`load`: a
declaration imports nothing but this module, because Hydra's search-path plugin reads every declaration in every
Hydra app of the environment (for the profile folders). This module imports the generic layers' registries only
inside :meth:`load`/:meth:`unload`, for the same reason.

Layering: this module is the root of the integrations layer (docs/architecture.md: assembly -> integrations ->
engine -> store). It may import the generic layers, whose registries it fills; no generic layer imports it.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import re
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from packaging.specifiers import SpecifierSet

    from skipweave.hooks import Registry

logger = logging.getLogger(__name__)

PARTS = ("host_types", "config_adapters", "conventions", "result_notes", "weave_hooks", "profiles", "environment")
"""The parts an integration may add, in the order :meth:`Integration.load` registers them."""

_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")
_REF = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*\Z")
_PACKAGE = re.compile(r"[A-Za-z_][\w.]*\Z")


class IntegrationError(RuntimeError):
    """An integration's part could not be loaded (its module fails to import, it names no object, a profile package
    holds no ``skip/`` folder). The message names the integration, the part, the reference and the cause."""


@dataclass(frozen=True, eq=False)
class Integration:
    """One host package's declaration. Compared by identity (two declarations of one name are two integrations).

    Attributes:
        name: lower-case identifier (``"verl"``): the name ``SKIPWEAVE_DISABLED_INTEGRATIONS`` and
            ``SKIPWEAVE_FORCE_INTEGRATIONS`` use, and the entry point's name.
        host: the host's distribution name as pip knows it (``"verl"``), or ``None`` for an integration of no package
            (loaded whenever it is not disabled).
        versions: the host versions supported, a PEP 440 specifier set (``">=0.9.1,<0.10"``); ``""``: any.
        host_types: references (``"pkg.mod:NAME"``) to :class:`~skipweave.store.hosts.HostType` objects; tried in this
            order, after the host types of the integrations loaded before.
        config_adapters: references to :class:`~skipweave.config.adapters.ConfigAdapter` objects.
        conventions: references to :class:`~skipweave.config.conventions.Convention` objects (what a role naming
            one in ``skip.<role>.convention`` takes for the keys it leaves unset).
        result_notes: references to :class:`~skipweave.weaving.notes.ResultNote` objects.
        weave_hooks: references to :class:`~skipweave.weaving.weave_hooks.WeaveHook` objects.
        profiles: the importable name of a package whose folder holds ``skip/<name>.yaml`` option files (Hydra's
            layout, as skipweave's own ``conf/``), or ``None``.
        environment: top-level package names whose version, when imported, belongs to an entry's environment.
        without_host: the parts (names from :data:`PARTS`) that load when ``host`` is not installed; the others wait
            for it. An installed host outside ``versions`` loads nothing unless forced.

    Raises:
        ValueError: at construction, naming the field, the value and what is allowed.
    """

    name: str
    host: str | None = None
    versions: str = ""
    host_types: tuple[str, ...] = ()
    config_adapters: tuple[str, ...] = ()
    conventions: tuple[str, ...] = ()
    result_notes: tuple[str, ...] = ()
    weave_hooks: tuple[str, ...] = ()
    profiles: str | None = None
    environment: tuple[str, ...] = ()
    without_host: tuple[str, ...] = ()
    _spec: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ValueError(f"Integration name={self.name!r} is not allowed: a lower-case identifier ('verl')")
        for part in ("host_types", "config_adapters", "conventions", "result_notes", "weave_hooks", "environment",
                     "without_host"):
            value = getattr(self, part)
            if isinstance(value, str) or not isinstance(value, Iterable):
                raise ValueError(f"Integration {self.name!r}: {part}={value!r} is not allowed: a tuple of strings")
            object.__setattr__(self, part, tuple(value))
        for part in ("host_types", "config_adapters", "conventions", "result_notes", "weave_hooks"):
            for ref in getattr(self, part):
                if not isinstance(ref, str) or not _REF.match(ref):
                    raise ValueError(f"Integration {self.name!r}: {part} holds {ref!r}, which is not allowed: a "
                                     "reference 'package.module:NAME'")
        for package in (*self.environment, *([self.profiles] if self.profiles is not None else [])):
            if not isinstance(package, str) or not _PACKAGE.match(package):
                raise ValueError(f"Integration {self.name!r}: {package!r} is not allowed as a package name: a "
                                 "dotted Python name ('vllm', 'mypkg.conf')")
        unknown = [p for p in self.without_host if p not in PARTS]
        if unknown:
            raise ValueError(f"Integration {self.name!r}: without_host={list(self.without_host)!r} is not allowed: "
                             f"names of parts, of {list(PARTS)}")
        if self.host is not None and (not isinstance(self.host, str) or not self.host.strip()):
            raise ValueError(f"Integration {self.name!r}: host={self.host!r} is not allowed: a distribution name "
                             "or None")
        from packaging.specifiers import InvalidSpecifier, SpecifierSet

        try:
            spec = SpecifierSet(self.versions)
        except (InvalidSpecifier, TypeError):
            raise ValueError(f"Integration {self.name!r}: versions={self.versions!r} is not allowed: a PEP 440 "
                             "specifier set such as '>=0.9.1,<0.10'") from None
        object.__setattr__(self, "_spec", spec)

    @property
    def specifier(self) -> SpecifierSet:
        """:attr:`versions` as ``packaging``'s ``SpecifierSet``."""
        spec: SpecifierSet = self._spec
        return spec

    def supports(self, version: str) -> bool:
        """Whether host ``version`` is in :attr:`versions` (pre-releases included; a version ``packaging`` cannot
        parse is not supported)."""
        from packaging.version import InvalidVersion, Version

        try:
            return self.specifier.contains(Version(version), prereleases=True)
        except InvalidVersion:
            return False

    def parts(self) -> tuple[str, ...]:
        """The parts this integration declares (those of :data:`PARTS` it gives a value)."""
        return tuple(p for p in PARTS if getattr(self, p))

    @property
    def loaded(self) -> bool:
        """Whether :meth:`load` registered this integration (and :meth:`unload` has not undone it)."""
        with _lock:
            return _LOADED.get(self.name, (None,))[0] is self

    def load(self, parts: Iterable[str] | None = None) -> bool:
        """Register this integration's parts in the generic layers' registries, in :data:`PARTS` order.

        Idempotent: loading it again does nothing. Imports the referenced modules (never the host package itself:
        a part imports its host only when it meets one of its objects). When a plan is woven already, each weave
        hook is told it at once, as if it had been registered before the weave.

        Args:
            parts: the parts to load (names from :data:`PARTS`); ``None``: all that are declared.

        Returns:
            True when this call loaded it; False when it was loaded already.

        Raises:
            IntegrationError: a reference does not resolve, or the profile package has no ``skip/`` folder; nothing
                of the integration stays registered.
            ValueError: ``parts`` names an unknown part, or another integration of this name is loaded.
        """
        chosen = self.parts() if parts is None else tuple(parts)
        unknown = [p for p in chosen if p not in PARTS]
        if unknown:
            raise ValueError(f"Integration {self.name!r}: parts={list(chosen)!r} is not allowed: names of "
                             f"{list(PARTS)}")
        with _lock:
            current = _LOADED.get(self.name)
            if current is not None:
                if current[0] is not self:
                    raise ValueError(f"another integration named {self.name!r} is loaded already; unload it first")
                return False
            added: list[tuple[Registry[Any], Any]] = []
            try:
                for part in PARTS:
                    if part in chosen:
                        for registry, item in self._items(part):
                            if item not in registry:
                                registry.add(item)
                                added.append((registry, item))
            except Exception:
                for registry, item in reversed(added):
                    registry.remove(item)
                raise
            _LOADED[self.name] = (self, added)
        plan = _woven_plan()
        if plan is not None and "weave_hooks" in chosen:
            from skipweave.weaving.weave_hooks import WEAVE_HOOKS

            for registry, item in added:
                if registry is WEAVE_HOOKS:
                    item.on_weave(plan)
        logger.debug("skipweave: integration %s loaded (%s)", self.name, ", ".join(p for p in PARTS if p in chosen))
        return True

    def unload(self) -> bool:
        """Remove exactly what :meth:`load` registered; a weave hook is first told that nothing is woven (when a
        plan is), so that it undoes what it set up.

        Returns:
            True when this call unloaded it; False when it was not loaded.
        """
        with _lock:
            current = _LOADED.get(self.name)
            if current is None or current[0] is not self:
                return False
            del _LOADED[self.name]
        added = current[1]
        hooks: Any = None
        if _woven_plan() is not None:
            from skipweave.weaving.weave_hooks import WEAVE_HOOKS as hooks
        for registry, item in reversed(added):
            registry.remove(item)
            if registry is hooks:
                item.on_unweave()
        logger.debug("skipweave: integration %s unloaded", self.name)
        return True

    def _items(self, part: str) -> list[tuple[Registry[Any], Any]]:
        """``(registry, item)`` for each item of ``part``, references resolved."""
        if part == "host_types":
            from skipweave.store.hosts import HOST_TYPES

            return [(HOST_TYPES, self._resolve(part, ref)) for ref in self.host_types]
        if part == "config_adapters":
            from skipweave.config.adapters import CONFIG_ADAPTERS

            return [(CONFIG_ADAPTERS, self._resolve(part, ref)) for ref in self.config_adapters]
        if part == "conventions":
            from skipweave.config.conventions import CONVENTIONS

            return [(CONVENTIONS, self._resolve(part, ref)) for ref in self.conventions]
        if part == "result_notes":
            from skipweave.weaving.notes import RESULT_NOTES

            return [(RESULT_NOTES, self._resolve(part, ref)) for ref in self.result_notes]
        if part == "weave_hooks":
            from skipweave.weaving.weave_hooks import WEAVE_HOOKS

            return [(WEAVE_HOOKS, self._resolve(part, ref)) for ref in self.weave_hooks]
        if part == "environment":
            from skipweave.weaving.environment import ENVIRONMENT_PACKAGES

            return [(ENVIRONMENT_PACKAGES, name) for name in self.environment]
        from skipweave.config.profile_files import PROFILE_SOURCES, IntegrationProfiles

        if self.profiles is None:
            return []
        folder = profile_conf_dir(self.profiles)
        if folder is None:
            raise IntegrationError(f"integration {self.name!r}: profiles={self.profiles!r} names no importable "
                                   "package whose folder holds a 'skip' folder of <name>.yaml option files")
        return [(PROFILE_SOURCES, IntegrationProfiles(self.name, folder))]

    def _resolve(self, part: str, ref: str) -> Any:
        module, _, attribute = ref.partition(":")
        try:
            obj: Any = importlib.import_module(module)
            for name in attribute.split("."):
                obj = getattr(obj, name)
        except Exception as exc:
            raise IntegrationError(f"integration {self.name!r}: {part} reference {ref!r} does not resolve "
                                   f"({type(exc).__name__}: {exc})") from exc
        return obj


def profile_conf_dir(package: str) -> str | None:
    """The folder of importable package ``package`` when it holds a ``skip/`` folder, else ``None``.

    Found with ``importlib.util.find_spec``, which imports the package's parents (``mypkg`` for ``mypkg.conf``) but
    not the package itself; a namespace package's first folder holding ``skip/`` is taken.
    """
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    locations = list(spec.submodule_search_locations or [])
    for location in locations:
        if os.path.isdir(os.path.join(location, "skip")):
            return os.path.abspath(location)
    return None


def loaded_integrations() -> tuple[Integration, ...]:
    """The integrations loaded in this process, in load order."""
    with _lock:
        return tuple(entry[0] for entry in _LOADED.values())


def _woven_plan() -> Any:
    """The plan woven in this process, or ``None``; imports no weaver (none is woven when it is not imported)."""
    weaver = sys.modules.get("skipweave.weaving.weaver")
    return getattr(getattr(weaver, "WEAVER", None), "plan", None) if weaver is not None else None


_lock = threading.RLock()
_LOADED: dict[str, tuple[Integration, list[tuple[Registry[Any], Any]]]] = {}
"""name -> (the loaded declaration, what its load() registered), in load order."""


__all__ = ["PARTS", "Integration", "IntegrationError", "loaded_integrations", "profile_conf_dir"]
