"""The TRL versions the shipped TRL profiles were written for, checked when a plan weaves a TRL target.

The profiles name private members of TRL's trainers (``_generate_and_score_completions``, ``self._metrics``,
``self._logs``), which TRL renames between releases without notice. A replay against another TRL may then miss
its target (named at exit) or, worse, leave an attribute the profile does not declare unrestored, and differ from
its recording with no error. After each weave whose enabled roles name a ``trl.`` target, :class:`TrlVersionCheck`
(a weave hook) reads the installed TRL's version from its distribution metadata, without importing TRL, and logs one
WARNING per process when it lies outside :data:`~skipweave.integrations.trl.SUPPORTED_VERSIONS`, naming both.
"""

from __future__ import annotations

import logging
import threading
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

from skipweave.integrations.trl import HOST_PACKAGE, SUPPORTED_VERSIONS, TESTED_VERSION
from skipweave.weaving.weave_hooks import WEAVE_HOOKS

if TYPE_CHECKING:
    from skipweave.config.schema import SkipConfig

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_warned: set[str] = set()


def trl_targets(plan: SkipConfig) -> list[str]:
    """``"<role> target <name> (<path>)"`` for every target of an enabled role that lives in TRL's package."""
    prefix = HOST_PACKAGE + "."
    return [f"role {role.role} target {t.name} ({t.path})"
            for role in plan.enabled_roles for t in role.targets
            if t.stub is None and t.path.split(":", 1)[0].startswith(prefix)]


def installed_version() -> str | None:
    """The installed TRL distribution's version, ``None`` when none is installed (nothing is imported)."""
    try:
        return version(HOST_PACKAGE)
    except PackageNotFoundError:
        return None


def unsupported(found: str, supported: str = SUPPORTED_VERSIONS) -> bool:
    """Whether TRL version ``found`` lies outside ``supported`` (a PEP 440 specifier set). A version string PEP 440
    cannot read counts as outside: nothing says the profiles fit it."""
    # (imported here: a plan without a TRL target, the common case, never needs packaging)
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        return Version(found) not in SpecifierSet(supported)
    except InvalidVersion:
        return True


def check(plan: SkipConfig, found: str | None = None) -> bool:
    """Log one WARNING per process and TRL version when ``plan`` weaves a TRL target and the installed TRL (or
    ``found``) lies outside the supported range. Returns whether it warned now."""
    targets = trl_targets(plan)
    if not targets:
        return False
    found = installed_version() if found is None else found
    if found is None or not unsupported(found):
        return False  # no TRL installed: the weaver reports the target's missing module itself
    with _lock:
        if found in _warned:
            return False
        _warned.add(found)
    logger.warning(
        "skipweave: %s: the shipped TRL profiles are written for trl%s (tested with %s), and this environment has "
        "trl %s, whose trainers may name their generation method or the attributes it changes otherwise: a replay "
        "may then differ from its recording without an error; compare a replay with its recording run once, or "
        "see docs/trl.md#other-trl-versions", "; ".join(targets), SUPPORTED_VERSIONS, TESTED_VERSION, found)
    return True


class TrlVersionCheck:
    """Weave hook: :func:`check` after each weave; nothing to undo on unweave."""

    def on_weave(self, plan: SkipConfig) -> None:
        """Check the TRL version when ``plan`` weaves a TRL target."""
        check(plan)

    def on_unweave(self) -> None:
        """Nothing was set up."""


VERSION_CHECK = WEAVE_HOOKS.add(TrlVersionCheck())
"""The registered :class:`TrlVersionCheck`."""

__all__ = ["VERSION_CHECK", "TrlVersionCheck", "check", "installed_version", "trl_targets", "unsupported"]

