"""Validating a ``skip`` section: roles parsed key by key as the schema declares them, then the rules that
span keys (see :mod:`skipweave.config.schema` for the keys, :mod:`skipweave.config.fields` for how a declared
key is parsed).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from skipweave.config.containers import MISSING
from skipweave.config.conventions import convention_named, with_convention
from skipweave.config.errors import ConfigError
from skipweave.config.fields import expanders, given, no_such_key, parse_fields, sub_mapping
from skipweave.config.schema import (
    NESTED_ROLE_KEYS,
    ROLE_KEYS,
    STRICT_KEY,
    Action,
    OnDiverge,
    RoleConfig,
    Serve,
    SkipConfig,
)
from skipweave.config.values import default_report_path, parse_bool, parse_convention
from skipweave.store.bundle.layout import is_bundle_path
from skipweave.store.fs import name_problem

_ROLE_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$", re.ASCII)
_HYDRA_KEY_RE = re.compile(r"^_[a-z]+_$")  # Hydra's instantiate directives (_target_, _convert_ …), not roles
_EXPANDERS = expanders(RoleConfig)  # the short forms of the nested keys a convention fills (step: counter, ...)


def parse_role(role: str, raw: Any, *, prefix: str = "skip") -> RoleConfig:
    """Validate one ``skip.<role>`` mapping.

    A ``???`` value (OmegaConf's "missing": a key a profile declares but leaves unset) reads as absent, in the
    role and in its ``step``, ``bypass`` and ``fingerprint`` mappings: the key takes its default. A role that names a
    ``convention`` takes the convention's values for the keys it leaves unset (before the schema's defaults).

    Args:
        role: the role name.
        raw: the mapping (plain ``dict``; convert OmegaConf nodes first).
        prefix: key prefix used in error messages.

    Returns:
        The :class:`RoleConfig`.

    Raises:
        ConfigError: the first invalid key, naming it, its value and what is allowed; a ``convention`` no loaded
            integration declares.
    """
    key = f"{prefix}.{role}"
    if not _ROLE_NAME_RE.match(role) or name_problem(role) is not None:
        raise ConfigError(key, role, "a role name made of ASCII letters, digits, '_' and '-'")
    if raw is None:
        raw = {}
    if isinstance(raw, bool):  # `skip.rollout: false` reads as "off"
        raw = {"enable": raw}
    data = given(sub_mapping(key, raw, ROLE_KEYS))
    if data.get("convention") is not None:
        name = parse_convention(f"{key}.convention", data["convention"])
        data = with_convention(data, convention_named(f"{key}.convention", name), _EXPANDERS)
    parsed = RoleConfig(role=role, **parse_fields(RoleConfig, key, data))
    if parsed.enable and is_bundle_path(parsed.dump_dir):
        parsed = _from_bundle(parsed, key, data)
    return _checked(parsed, key, explicit_targets=isinstance(data.get("targets"), Mapping))


def _from_bundle(role: RoleConfig, key: str, data: Mapping[str, Any]) -> RoleConfig:
    """A role whose ``dump_dir`` names a bundle (a ``.zip`` file) only reads it: it is replay-only, whether or not it
    says so (``action: verify`` excepted: a verify run calls every call live, compares it with the bundle's recording
    and records nothing); asking it to record (``replay_only: false``, ``record_steps``) is a :class:`ConfigError`
    that says why."""
    why = (f"{key}.dump_dir={role.dump_dir} names a bundle (a .zip file), which a run only reads: the role replays "
           "from it and records nothing (to record, unpack it into a dump dir: skipweave unpack BUNDLE DUMP_DIR)")
    if role.action is Action.VERIFY:
        return role  # (records nothing, by its own rule; replay_only is refused with verify by _checked)
    if "replay_only" in data and not role.replay_only:
        raise ConfigError(f"{key}.replay_only", False, f"true or unset: {why}")
    if role.record_steps is not None:
        raise ConfigError(f"{key}.record_steps", role.record_steps.to_config(), f"unset: {why}")
    return dataclasses.replace(role, replay_only=True)


def _checked(role: RoleConfig, key: str, *, explicit_targets: bool) -> RoleConfig:
    """Refuse combinations that would silently do nothing (checked once the role's values are parsed)."""
    if role.record_steps is not None and role.action in (Action.CACHE, Action.VERIFY):
        raise ConfigError(f"{key}.record_steps", role.record_steps.to_config(),
                          "record_steps only with action repeat, repeat_cycle or repeat_last (cache records "
                          "every eligible step; verify records nothing)")
    if role.action is Action.VERIFY and role.replay_only:
        raise ConfigError(f"{key}.replay_only", True, "false with action verify (a verify run calls every "
                          "eligible call live to compare it with its recording)")
    if role.action is Action.VERIFY and role.report is None:  # `report: null` as unset: one file for the run
        role = dataclasses.replace(role, report=default_report_path())
    if role.action is not Action.VERIFY:
        for name, default in (("serve", Serve.LIVE), ("on_diverge", OnDiverge.WARN)):
            if getattr(role, name) is not default:
                raise ConfigError(f"{key}.{name}", getattr(role, name).value,
                                  f"{name} only with action verify (action is {role.action.value})")
    if role.enable and role.targets and all(t.stub is not None for t in role.targets):
        raise ConfigError(f"{key}.targets", [t.name for t in role.targets],
                          "at least one target the role replays besides its stubs (a stub only stands in for "
                          "the engine behind a replayed target)")
    if role.enable and explicit_targets and not role.targets:  # `targets: {}` (a missing key: filled elsewhere)
        raise ConfigError(f"{key}.targets", {}, "at least one target when the role is enabled, e.g. "
                          f"+{key}.targets.gen=my_pkg.rollout:Manager.generate_sequences")
    return role


def unknown_role_key(key: str, value: Any) -> ConfigError | None:
    """Return the :func:`~skipweave.config.fields.no_such_key` error of a dotted key under ``skip.<role>`` that the
    schema does not have.

    Args:
        key: a dotted key as an override names it, e.g. ``skip.rollout.dump_dri`` or ``skip.rollout.step.sorce``.
        value: the value given to it, for the message.

    Returns:
        The error, or ``None`` for a key the schema has, one inside a free-form mapping (``targets.<name>``,
        ``echo``) and anything not of the form ``skip.<role>.<key>``.
    """
    parts = key.split(".")
    if len(parts) < 3 or parts[0] != "skip":
        return None
    if parts[2] not in ROLE_KEYS:
        return no_such_key(".".join(parts[:3]), value, ROLE_KEYS)
    nested = NESTED_ROLE_KEYS.get(parts[2])
    if nested is not None and len(parts) > 3 and parts[3] not in nested:
        return no_such_key(".".join(parts[:4]), value, nested)
    return None


def parse_skip(skip: Any, *, prefix: str = "skip") -> SkipConfig:
    """Validate a whole ``skip`` section (``None`` or missing means every role disabled).

    Args:
        skip: mapping role name -> role mapping (plain containers), and the run's own keys (``strict``).
        prefix: key prefix used in error messages.

    Returns:
        The :class:`SkipConfig`.

    Raises:
        ConfigError: the first invalid key; two enabled roles with one ``note`` (a host merging their results,
            as verl's ``DataProto.union`` does, would meet two different values under one key).
    """
    if skip is None:
        return SkipConfig({})
    if not isinstance(skip, Mapping):
        raise ConfigError(prefix, skip, "a mapping of role name -> role settings, e.g. skip.rollout.enable=true")
    strict = skip.get(STRICT_KEY)
    if isinstance(strict, Mapping):  # a role of that name, from before the run setting took the key
        raise ConfigError(f"{prefix}.{STRICT_KEY}", "a role's settings",
                          "true or false: skip.strict is the run's strict setting (docs/configuration.md), so no role "
                          "can be named 'strict'; give that role another name")
    config = SkipConfig({
        str(name): parse_role(str(name), raw, prefix=prefix)
        for name, raw in skip.items()
        if not _HYDRA_KEY_RE.match(str(name))  # e.g. verl's `skip._target_: verl.utils.skip.SkipManagerConfig`
        and str(name) != STRICT_KEY
    }, strict=False if strict is None or strict == MISSING else parse_bool(f"{prefix}.{STRICT_KEY}", strict))
    noted: dict[str, str] = {}
    for role in config.enabled_roles:
        if role.note is not None:
            other = noted.setdefault(role.note, role.role)
            if other != role.role:
                raise ConfigError(f"{prefix}.{role.role}.note", role.note,
                                  f"a key no other enabled role uses (skip.{other}.note is {role.note!r})")
    return config


__all__ = ["parse_role", "parse_skip", "unknown_role_key"]
