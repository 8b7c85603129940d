"""Remap verl's legacy skip keys onto ``skip.rollout``, with a deprecation warning users actually see.

Two generations of verl kept the rollout skip settings under ``actor_rollout_ref.rollout``:

============================================  ==============================================================
legacy key (verl)                             new-style equivalent
============================================  ==============================================================
``skip_rollout: true`` (2025)                 ``skip.rollout.enable: true``, ``action: repeat_last``,
                                              ``record_steps: 1`` (one dump serves every step)
``skip_dump_dir: D`` (2025)                   ``skip.rollout.dump_dir: D``
``skip.enable: true`` (2026)                  ``skip.rollout.enable: true``
``skip.dump_dir: D`` (2026)                   ``skip.rollout.dump_dir: D``
``skip.action: cache`` (2026)                 ``action: cache``, ``steps: 1-N``
``skip.action: repeat`` (2026, the default)   ``action: repeat_cycle``, ``record_steps: 1-N``
``skip.action: repeat_last`` (2026)           ``action: repeat_last``, ``record_steps: 1-N``
``skip.max_dump_step: N`` (2026, default 1)   the ``1-N`` above (``N = 0`` with ``cache``: ``steps: 0``, none)
============================================  ==============================================================

verl's current top-level ``skip.{rollout,async_rollout,rollout_tq}`` is skipweave's own schema: native,
not legacy.

Rules:

- **New-style wins.** A legacy value only fills a ``skip.rollout`` key that the new-style config leaves
  unset (absent, ``null`` or OmegaConf's missing ``???``); profiles leave ``steps``, ``record_steps``,
  ``dump_dir`` and ``namespace`` at ``???`` for exactly that reason (a ``???`` also keeps the app's own
  value when Hydra merges the profile over it), while the ``enable`` and ``action`` a profile sets
  count as set.
  ``max_dump_step`` follows the action finally in force: ``steps: 1-N`` for ``cache``,
  ``record_steps: 1-N`` for the ``repeat*`` actions.
- **Only an enabled legacy block is read.** verl ships ``skip_rollout: false`` and
  ``skip_dump_dir: /tmp/rollout_dump`` in every config; a block whose switch is off contributes
  nothing and warns nothing. The 2026 block wins over the 2025 one when both are enabled.
- **Every legacy key read warns** with :class:`SkipweaveDeprecationWarning` (a ``FutureWarning``, which
  Python shows by default), naming the replacement, or saying that a new-style key shadows it.
- A config with no ``skip`` anywhere means every role disabled, never an error.

Keys a role leaves unset (``null`` or ``???``: ``dump_dir``, ``namespace`` …) are dropped before the remap
(:func:`skipweave.config.loader.drop_unset`), so that what no legacy key fills falls back to the schema's default.
The remap is a config adapter (:mod:`skipweave.integrations.verl.config`): the config layer reads no verl key.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping
from typing import Any

from skipweave.config.containers import MISSING, is_dictconfig, node_at, plain
from skipweave.config.errors import ConfigError
from skipweave.integrations.verl.convention import NAME as CONVENTION

logger = logging.getLogger(__name__)

LEGACY_PARENT = "actor_rollout_ref.rollout"
"""Dotted path of the node holding verl's legacy keys."""

LEGACY_ROLE = "rollout"
"""The role legacy keys configure."""

_LEGACY_ACTIONS = {"cache": "cache", "repeat": "repeat_cycle", "repeat_last": "repeat_last"}
_LEGACY_2026_KEYS = {"enable", "dump_dir", "max_dump_step", "action"}


class SkipweaveDeprecationWarning(FutureWarning):
    """A legacy verl skip key was used; the message names its new-style replacement.

    A ``FutureWarning`` rather than a ``DeprecationWarning``: Python hides the latter when it is raised
    from library code, and these keys are written by users, who must see the message.
    """


def legacy_keys(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Return the legacy keys of an app's whole config (``actor_rollout_ref.rollout.{skip_rollout, skip_dump_dir,
    skip}``, those present) as plain containers, nested as in ``cfg``; ``{}`` when there are none.

    Args:
        cfg: a mapping or OmegaConf ``DictConfig``; nothing else of it is resolved.
    """
    parent = node_at(cfg, LEGACY_PARENT)
    if parent is None:
        return {}
    legacy = {k: plain(parent[k]) for k in ("skip_rollout", "skip_dump_dir", "skip") if k in parent}
    return {"actor_rollout_ref": {"rollout": legacy}} if legacy else {}


def remap_legacy(cfg: dict[str, Any]) -> dict[str, Any]:
    """Return ``cfg`` with legacy verl keys folded into ``skip.rollout``; new-style keys win.

    Args:
        cfg: an app's whole config as plain containers (see :func:`skipweave.config.to_container`), with the
            keys its roles leave unset already dropped (:func:`skipweave.config.loader.drop_unset`).

    Returns:
        A new mapping (``cfg`` is not modified) whose ``skip`` node holds the remapped values.

    Raises:
        ConfigError: a legacy value verl itself would reject (e.g. ``skip.action: bogus``), naming the
            legacy key.

    Warns:
        SkipweaveDeprecationWarning: once per legacy key read.
    """
    out = dict(cfg)
    skip = out.get("skip")
    if skip is not None and not isinstance(skip, Mapping):
        return out  # parse_skip reports the bad value with its key
    skip = dict(skip or {})
    legacy, max_dump_step, sources = _read_legacy(node_at(cfg, LEGACY_PARENT))
    if legacy:
        skip[LEGACY_ROLE] = _fill(skip.get(LEGACY_ROLE), legacy, max_dump_step, sources)
    if skip or "skip" in out:
        out["skip"] = skip
    return out


def _read_legacy(parent: Mapping[str, Any] | None) -> tuple[dict[str, Any], int | None, dict[str, str]]:
    """Return (new-style values, max_dump_step or None, new key -> legacy key it came from)."""
    if parent is None:
        return {}, None, {}
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    max_dump_step: int | None = None
    if parent.get("skip_rollout") is True:  # verl 2025
        key = f"{LEGACY_PARENT}.skip_rollout"
        values.update(enable=True, action="repeat_last", record_steps=[1])
        sources.update(enable=key, action=key, record_steps=key)
        if parent.get("skip_dump_dir") is not None:
            values["dump_dir"] = parent["skip_dump_dir"]
            sources["dump_dir"] = f"{LEGACY_PARENT}.skip_dump_dir"
    elif parent.get("skip_rollout") not in (None, False):
        raise ConfigError(f"{LEGACY_PARENT}.skip_rollout", parent.get("skip_rollout"), "true or false")
    block = parent.get("skip")
    if isinstance(block, Mapping) or is_dictconfig(block):
        assert block is not None
        prefix = f"{LEGACY_PARENT}.skip"
        enable = block.get("enable", False)
        if enable is None:  # `enable: null` (an unset OmegaConf value) means off, as a missing key does
            enable = False
        if enable not in (True, False):
            raise ConfigError(f"{prefix}.enable", enable, "true or false")
        if enable:  # verl 2026; wins over the 2025 block
            unknown = sorted(set(block) - _LEGACY_2026_KEYS)
            if unknown:
                logger.warning(
                    "skipweave: legacy keys %s are not verl's and are ignored",
                    ", ".join(f"{prefix}.{k}" for k in unknown),
                )
            action = block.get("action")
            action = "repeat" if action is None else action  # verl 2026's default
            if action not in _LEGACY_ACTIONS:
                raise ConfigError(f"{prefix}.action", action, "one of 'cache', 'repeat', 'repeat_last'")
            raw_max = block.get("max_dump_step")
            max_dump_step = 1 if raw_max is None else raw_max
            if isinstance(max_dump_step, bool) or not isinstance(max_dump_step, int) or max_dump_step < 0:
                raise ConfigError(f"{prefix}.max_dump_step", raw_max, "an integer >= 0")
            if max_dump_step == 0 and action != "cache":
                raise ConfigError(
                    f"{prefix}.max_dump_step", 0, "an integer >= 1 with action repeat/repeat_last"
                )
            if values:
                warnings.warn(
                    f"{LEGACY_PARENT}.skip_rollout is deprecated and ignored here: the enabled "
                    f"{prefix} block wins. Remove it and set skip.rollout.* instead.",
                    SkipweaveDeprecationWarning,
                    stacklevel=4,
                )
            # Defaults verl applied are reported against the block's switch, keys written against themselves.
            values = {"enable": True, "action": _LEGACY_ACTIONS[action]}
            sources = {
                "enable": f"{prefix}.enable",
                "action": f"{prefix}.action" if "action" in block else f"{prefix}.enable",
                "max_dump_step": f"{prefix}.max_dump_step"
                if "max_dump_step" in block
                else f"{prefix}.enable",
            }
            if block.get("dump_dir") is not None:
                values["dump_dir"] = block["dump_dir"]
                sources["dump_dir"] = f"{prefix}.dump_dir"
    elif block is not None:
        raise ConfigError(
            f"{LEGACY_PARENT}.skip", block, "a mapping with keys enable, dump_dir, max_dump_step, action"
        )
    return values, max_dump_step, sources


def _fill(
    new: Any, legacy: dict[str, Any], max_dump_step: int | None, sources: dict[str, str]
) -> dict[str, Any]:
    """Fill the keys ``new`` leaves unset from ``legacy``; warn once per legacy key read."""
    role: dict[str, Any] = {"enable": new} if isinstance(new, bool) else dict(new or {})
    used: dict[str, list[str]] = {}  # legacy key -> replacements it filled
    shadowed: dict[str, list[str]] = {}  # legacy key -> new-style keys that won over it
    for key, value in legacy.items():
        source = sources[key]
        if _unset(role.get(key)):
            role[key] = value
            used.setdefault(source, []).append(f"skip.{LEGACY_ROLE}.{key}={_show(value)}")
        else:
            shadowed.setdefault(source, []).append(f"skip.{LEGACY_ROLE}.{key}={_show(role[key])}")
    if _unset(role.get("convention")):  # the role verl's own keys configure follows verl's convention
        role["convention"] = CONVENTION
    if max_dump_step is not None:
        source = sources["max_dump_step"]
        action = "cache" if _unset(role.get("action")) else role["action"]
        key = "steps" if action == "cache" else "record_steps"
        steps: Any = [0] if max_dump_step == 0 else ([1] if max_dump_step == 1 else f"1-{max_dump_step}")
        if _unset(role.get(key)):
            role[key] = steps
            used.setdefault(source, []).append(f"skip.{LEGACY_ROLE}.{key}={_show(steps)}")
        else:
            shadowed.setdefault(source, []).append(f"skip.{LEGACY_ROLE}.{key}={_show(role[key])}")
    for source in dict.fromkeys(sources.values()):
        if source in used:
            message = f"{source} is deprecated; skipweave reads it as {', '.join(used[source])}"
            if source in shadowed:
                message += f" (while {', '.join(shadowed[source])} set in the new-style config wins)"
            message += ". Set those keys instead."
        else:
            message = (
                f"{source} is deprecated and ignored here: {', '.join(shadowed[source])} "
                "set in the new-style config wins. Remove the legacy key."
            )
        warnings.warn(message, SkipweaveDeprecationWarning, stacklevel=4)
    return role


def _unset(value: Any) -> bool:
    return value is None or value == MISSING


def _show(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ",".join(str(v) for v in value) + "]"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)
