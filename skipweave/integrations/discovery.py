"""Which integrations a process loads: found by entry point, switched off by name, kept to their host's versions.

Every integration -- skipweave's own (tensordict, Ray, verl) and any other package's -- is an entry point of the
group :data:`GROUP` naming an :class:`~skipweave.integrations.base.Integration`::

    [project.entry-points."skipweave.integrations"]
    verl = "skipweave.integrations.verl:INTEGRATION"

For each one :func:`decide` says what loads (see docs/integrations.md):

- ``SKIPWEAVE_DISABLED_INTEGRATIONS=verl,ray`` names integrations that stay off, whatever else holds;
- a host package that is not installed: only the parts the integration declares ``without_host`` load (none, for most;
  a DEBUG line says so);
- an installed host outside the declared range: nothing loads, with one WARNING naming both versions, unless
  ``SKIPWEAVE_FORCE_INTEGRATIONS`` names it (then everything loads, and the WARNING says so); a process started by one
  that warned (its environment holds ``SKIPWEAVE_WARNED_INTEGRATIONS``) says it at DEBUG only, as it says a broken
  declaration or part and a switch naming no integration.

:func:`load_integrations` applies that once per process. The entry points that assemble the system call it -- the
``skipweave`` command, :func:`skipweave.weave`, the Hydra callback, the ``skipweave run`` bootstrap, a Ray worker's
set-up -- and the generic layers never do: their registries are passive (:mod:`skipweave.hooks`). Hydra's
search-path plugin asks :func:`profile_dirs` for the profile folders, which reads the declarations only.

skipweave's own integrations are also known from :data:`SHIPPED`, the same table as pyproject.toml's, for an install
whose metadata predates them (an editable install made from an older checkout lists the entry points of then): an
entry point of that name in the metadata wins, and a test keeps the two tables equal.

Imports nothing but the standard library, :mod:`skipweave.env` and :mod:`skipweave.integrations.base` at module level:
Hydra's plugin imports it in any Hydra app that looks for a profile skipweave does not ship. Deciding (the entry points,
the declarations, three host versions) costs 25-35 ms in a venv of 170 distributions (Dec 2026).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from skipweave.env import DISABLED_INTEGRATIONS_ENV, FORCE_INTEGRATIONS_ENV, WARNED_INTEGRATIONS_ENV
from skipweave.integrations.base import Integration, profile_conf_dir

logger = logging.getLogger(__name__)

GROUP = "skipweave.integrations"
"""The entry-point group an integration is declared in."""

SHIPPED: dict[str, str] = {
    "tensordict": "skipweave.integrations.tensordict:INTEGRATION",
    "ray": "skipweave.integrations.ray:INTEGRATION",
    "verl": "skipweave.integrations.verl:INTEGRATION",
    "trl": "skipweave.integrations.trl:INTEGRATION",
}
"""skipweave's own integrations, in load order (tensordict's host types before verl's ``DataProto`` shape: the first
matching host type encodes an object); pyproject.toml declares the same entry points."""

ON, PARTIAL, FORCED = "on", "partial", "forced"
"""Statuses of an integration that loads: all its parts, those it declares ``without_host``, all despite its range."""

DISABLED, OUT_OF_RANGE, NO_HOST, BROKEN = "disabled", "out of range", "no host", "broken"
"""Statuses of an integration that stays off."""


@dataclass(frozen=True)
class Decision:
    """What a process does with one integration.

    Attributes:
        name: the entry point's name.
        origin: the distribution declaring it (``"skipweave 0.2.0"``), for messages.
        integration: the declaration, or ``None`` when the entry point did not load one (:data:`BROKEN`).
        status: one of :data:`ON`, :data:`PARTIAL`, :data:`FORCED`, :data:`DISABLED`, :data:`OUT_OF_RANGE`,
            :data:`NO_HOST`, :data:`BROKEN`.
        parts: the parts that load (``()`` for an integration that stays off).
        reason: why, in words (``"verl 0.12.0 is installed; the integration supports >=0.9.1,<0.10"``).
        host_version: the installed host version, or ``None``.
    """

    name: str
    origin: str
    integration: Integration | None
    status: str
    parts: tuple[str, ...]
    reason: str
    host_version: str | None = None


def names_in(environ: Mapping[str, str], variable: str) -> list[str]:
    """The comma-separated names of ``variable`` in ``environ`` (blanks dropped, lower-cased)."""
    return [n.strip().lower() for n in environ.get(variable, "").split(",") if n.strip()]


def entry_points() -> list[tuple[Any, str]]:
    """``(entry point, origin)`` of every integration of this environment, in load order: skipweave's own in
    :data:`SHIPPED` order, then the others by name. A name declared twice keeps the first (skipweave's own for its
    names), with a WARNING naming both."""
    from importlib import metadata

    found: dict[str, tuple[Any, str]] = {}
    for ep in metadata.entry_points(group=GROUP):
        dist = getattr(ep, "dist", None)
        origin = f"{dist.name} {dist.version}" if dist is not None else "an unknown distribution"
        if ep.name in SHIPPED and ep.value != SHIPPED[ep.name]:
            logger.warning("skipweave: %s declares an integration named %r (%s), which is skipweave's own; it is "
                           "ignored", origin, ep.name, ep.value)
            continue
        if ep.name in found:
            if found[ep.name][0].value != ep.value:
                logger.warning("skipweave: two integrations named %r: %s (%s) and %s (%s); the first is used",
                               ep.name, found[ep.name][1], found[ep.name][0].value, origin, ep.value)
            continue
        found[ep.name] = (ep, origin)
    for name, value in SHIPPED.items():
        if name not in found:  # an install whose metadata predates the entry point (see the module docstring)
            logger.debug("skipweave: integration %r is not in the installed metadata; using skipweave's own table",
                         name)
            found[name] = (metadata.EntryPoint(name, value, GROUP), "skipweave")
    order = [*SHIPPED, *sorted(n for n in found if n not in SHIPPED)]
    return [found[name] for name in order]


def decide(environ: Mapping[str, str] | None = None) -> list[Decision]:
    """Decide for every integration of this environment what loads (see the module docstring); loads nothing.

    Imports each declaration (by contract a light module) and reads host versions from the installed metadata; imports
    no part and no host. Logs at DEBUG only (but for a name two distributions declare: a WARNING), and
    :func:`load_integrations` says what matters.

    Args:
        environ: the environment to read the switches from; ``os.environ`` by default.
    """
    env = os.environ if environ is None else environ
    disabled, forced = set(names_in(env, DISABLED_INTEGRATIONS_ENV)), set(names_in(env, FORCE_INTEGRATIONS_ENV))
    out = []
    for ep, origin in entry_points():
        out.append(_decide_one(ep, origin, disabled, forced))
    return out


def _decide_one(ep: Any, origin: str, disabled: set[str], forced: set[str]) -> Decision:
    from importlib import metadata

    name = ep.name
    problem = ""
    try:
        integration = ep.load()
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - a broken declaration (sys.exit too) must not stop the host
        integration, problem = None, f"its entry point {ep.value!r} fails to load ({type(exc).__name__}: {exc})"
    if integration is not None and not isinstance(integration, Integration):
        problem = f"its entry point {ep.value!r} names a {type(integration).__name__}, not a skipweave Integration"
    elif integration is not None and integration.name != name:
        problem = (f"its entry point {ep.value!r} names the integration {integration.name!r}; the two names must be "
                   "equal")
    if name.lower() in disabled:  # also a broken one: the off switch silences it (its declaration names its profiles)
        return Decision(name, origin, None if problem else integration, DISABLED, (),
                        f"{DISABLED_INTEGRATIONS_ENV} names it")
    if problem or integration is None:
        return Decision(name, origin, None, BROKEN, (), problem)
    if integration.host is None:
        return Decision(name, origin, integration, ON, integration.parts(), "it needs no host package")
    try:
        version = metadata.version(integration.host)
    except metadata.PackageNotFoundError:
        parts = tuple(p for p in integration.parts() if p in integration.without_host)
        if parts:
            return Decision(name, origin, integration, PARTIAL, parts,
                            f"{integration.host} is not installed; what works without it loads ({', '.join(parts)})")
        return Decision(name, origin, integration, NO_HOST, (), f"{integration.host} is not installed")
    supported = f"supports {integration.host} {integration.versions}"
    if integration.supports(version):
        return Decision(name, origin, integration, ON, integration.parts(),
                        f"{integration.host} {version} is installed; the integration {supported}", version)
    if name.lower() in forced:
        return Decision(name, origin, integration, FORCED, integration.parts(),
                        f"{integration.host} {version} is installed and the integration {supported}; loaded all the "
                        f"same, as {FORCE_INTEGRATIONS_ENV} names it", version)
    return Decision(name, origin, integration, OUT_OF_RANGE, (),
                    f"{integration.host} {version} is installed and the integration {supported}; it stays off "
                    f"(set {FORCE_INTEGRATIONS_ENV}={name} to load it all the same)", version)


# ------------------------------------------------------------------------------------------- once per process

@dataclass
class _State:
    decisions: tuple[Decision, ...] | None = None  # None: not loaded yet
    loading: bool = False
    off_profiles: tuple[Any, ...] = ()  # the IntegrationProfiles registered for integrations that are off


_STATE = _State()
_lock = threading.RLock()


def load_integrations(environ: Mapping[str, str] | None = None) -> tuple[Decision, ...]:
    """Load the integrations of this environment, once per process; later calls return the same decisions.

    What stays off is said once: an installed host outside an integration's range, or forced, gives one WARNING naming
    both versions (DEBUG in a process whose parent warned already), a broken declaration or part one WARNING, an off
    switch one INFO line, a host that is not installed a DEBUG line. Another thread calling meanwhile waits until every
    integration is loaded (it would else see half-filled registries).

    Args:
        environ: where the switches are read; ``os.environ`` by default.

    Returns:
        One :class:`Decision` per integration, in load order (a part that failed to load turns its decision to
        :data:`BROKEN`).
    """
    with _lock:
        if _STATE.decisions is not None or _STATE.loading:  # loading: a part's import called back (reads it as is)
            return _STATE.decisions or ()
        _STATE.loading = True
        try:
            env = os.environ if environ is None else environ
            decisions = [_apply(d, env) for d in decide(env)]
            _warn_unknown_names(env, [d.name for d in decisions])
            _STATE.decisions = tuple(decisions)
        finally:
            _STATE.loading = False
        return _STATE.decisions


def decisions() -> tuple[Decision, ...]:
    """What :func:`load_integrations` decided in this process (``()`` before it ran)."""
    with _lock:
        return _STATE.decisions or ()


def unload_integrations() -> None:
    """Unload every integration :func:`load_integrations` loaded, so that the next call decides again (tests)."""
    from skipweave.config.profile_files import PROFILE_SOURCES

    with _lock:
        for decision in reversed(_STATE.decisions or ()):
            if decision.integration is not None:
                decision.integration.unload()
        for source in _STATE.off_profiles:
            PROFILE_SOURCES.remove(source)
        _STATE.decisions, _STATE.off_profiles = None, ()
        _DECIDED.clear()


def _apply(decision: Decision, env: Mapping[str, str]) -> Decision:
    """Load what ``decision`` says and log it; returns it (:data:`BROKEN` when a part failed to load)."""
    integration = decision.integration
    if decision.status in (OUT_OF_RANGE, FORCED):
        _warn_once(env, f"{decision.name}={decision.host_version}", "skipweave: integration %r: %s", decision.name,
                   decision.reason)
    elif decision.status == BROKEN:
        _warn_once(env, f"{decision.name}=broken", "skipweave: integration %r of %s is not loaded: %s", decision.name,
                   decision.origin, decision.reason)
    elif decision.status == DISABLED:
        logger.info("skipweave: integration %r is off: %s", decision.name, decision.reason)
    else:
        logger.debug("skipweave: integration %r (%s): %s", decision.name, decision.status, decision.reason)
    if integration is None:
        return decision
    if decision.parts:
        try:
            integration.load(decision.parts)
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - one broken integration must not stop the host or the others
            _warn_once(env, f"{decision.name}=broken", "skipweave: integration %r of %s is not loaded: %s",
                       decision.name, decision.origin, exc)
            decision = Decision(decision.name, decision.origin, integration, BROKEN, (),
                                f"a part failed to load: {exc}", decision.host_version)
    if integration.profiles is not None and "profiles" not in decision.parts:
        _note_off_profiles(integration, decision.reason)
    return decision


def _note_off_profiles(integration: Integration, reason: str) -> None:
    """Register an off integration's profile folder as off, so that the error for one of its names says why."""
    from skipweave.config.profile_files import PROFILE_SOURCES, IntegrationProfiles

    folder = profile_conf_dir(integration.profiles or "")
    if folder is None:
        return
    source = IntegrationProfiles(integration.name, folder, off=reason)
    PROFILE_SOURCES.add(source)
    _STATE.off_profiles = (*_STATE.off_profiles, source)


def _warn_once(env: Mapping[str, str], mark: str, message: str, *args: Any) -> None:
    """One WARNING per run for what ``mark`` names (``verl=0.12.0``: a host version outside the range; ``x=broken``; a
    switch's unknown name): a process whose environment's :data:`WARNED_INTEGRATIONS_ENV` holds ``mark`` (its parent
    warned: the program of ``skipweave run``, a Ray worker, a sweep's job) says it at DEBUG. Marks are added to
    ``os.environ`` only, so that the processes this one starts inherit them."""
    warned = [m.strip() for m in env.get(WARNED_INTEGRATIONS_ENV, "").split(",") if m.strip()]
    if mark in warned:
        logger.debug(message, *args)
        return
    logger.warning(message, *args)
    if env is os.environ:
        os.environ[WARNED_INTEGRATIONS_ENV] = ",".join([*warned, mark])


def _warn_unknown_names(env: Mapping[str, str], known: list[str]) -> None:
    """A switch naming no integration of this environment is a typo until proven otherwise: one WARNING per run."""
    for variable in (DISABLED_INTEGRATIONS_ENV, FORCE_INTEGRATIONS_ENV):
        unknown = [n for n in names_in(env, variable) if n not in known]
        if unknown:
            _warn_once(env, f"{variable}={'+'.join(unknown)}",
                       "skipweave: %s names %s, which is no integration of this environment (there are: %s)",
                       variable, ", ".join(repr(n) for n in unknown), ", ".join(known))


# ------------------------------------------------------------------------------------------- Hydra's plugin

def profile_dirs(environ: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """``(integration, conf dir)`` of every integration whose profiles load in this process, in load order: what
    Hydra's search-path plugin appends. Imports the declarations, no part and no host; the answer is cached per
    value of the two switches (Hydra asks at each composition)."""
    out = []
    for decision in _chosen(environ):
        integration = decision.integration
        if integration is not None and integration.profiles is not None and "profiles" in decision.parts:
            folder = profile_conf_dir(integration.profiles)
            if folder is not None:
                out.append((decision.name, folder))
    return out


def off_profile_dirs(environ: Mapping[str, str] | None = None) -> list[tuple[str, str, str]]:
    """``(integration, conf dir, why it is off)`` of every integration that ships profiles this process does not load
    (switched off, host outside the range or absent, a broken declaration or part), in load order: Hydra's plugin
    names the reason when one of their names is selected. Decided as :func:`profile_dirs` decides."""
    out = []
    for decision in _chosen(environ):
        integration = decision.integration
        if integration is not None and integration.profiles is not None and "profiles" not in decision.parts:
            folder = profile_conf_dir(integration.profiles)
            if folder is not None:
                out.append((decision.name, folder, decision.reason))
    return out


def _chosen(environ: Mapping[str, str] | None) -> tuple[Decision, ...] | list[Decision]:
    """This process's decisions once loaded, else those :func:`decide` makes (cached per value of the switches)."""
    env = os.environ if environ is None else environ
    with _lock:
        if _STATE.decisions is not None:
            return _STATE.decisions
        key = (env.get(DISABLED_INTEGRATIONS_ENV, ""), env.get(FORCE_INTEGRATIONS_ENV, ""))
        if key not in _DECIDED:
            _DECIDED[key] = decide(env)
        return _DECIDED[key]


_DECIDED: dict[tuple[str, str], list[Decision]] = {}


__all__ = ["BROKEN", "DISABLED", "Decision", "FORCED", "GROUP", "NO_HOST", "ON", "OUT_OF_RANGE", "PARTIAL", "SHIPPED",
           "decide", "decisions", "entry_points", "load_integrations", "names_in", "off_profile_dirs", "profile_dirs",
           "unload_integrations"]
