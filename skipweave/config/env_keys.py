"""The app config keys a role's environment fingerprint names (``skip.<role>.fingerprint.env``), read once.

A user names keys of the app's *whole* config (``actor_rollout_ref.model.path``,
``actor_rollout_ref.rollout.temperature``) whose values describe what a recorded call computed with. They are
resolved here, when the config is read, into a mapping ``{path: value}``; that mapping is what the role's plan holds
and what :meth:`~skipweave.config.schema.SkipConfig.to_config` hands Ray workers, whose own config has no such keys.
Long values (and lists or mappings) are kept as a short hash (:func:`env_value`), so a manifest stays small.

A named key the config does not have is a :class:`~skipweave.config.errors.ConfigError` naming it, before anything
is patched, not a warning: the key exists to notice a change, and a typo would silently notice nothing, on every
replay of the run. See docs/format.md (the manifest's ``environment``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

import xxhash

from skipweave.config.containers import MISSING, is_dictconfig, plain
from skipweave.config.errors import ConfigError

VALUE_MAX_CHARS = 128
"""A named key's value is kept as it is up to this many characters of text; longer ones as :func:`env_value`'s hash."""

HASH_PREFIX = "xxh3_64:"
"""What a hashed value starts with: ``xxh3_64:`` and 16 hex digits of the value's canonical JSON."""

_PATH_RE = re.compile(r"^[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)*$")

_ABSENT = object()


def env_value(value: Any) -> Any:
    """The form in which a named key's value is recorded and compared: a string, ``int``, ``bool``, finite ``float``
    or ``None`` whose text is at most :data:`VALUE_MAX_CHARS` long as it is; anything else (a long string, a list, a
    mapping, ``nan``) as ``xxh3_64:<16 hex>`` of its canonical JSON (keys sorted). Idempotent.

    Args:
        value: a plain value (OmegaConf nodes already converted by :func:`~skipweave.config.containers.plain`).
    """
    if value is None or isinstance(value, (bool, int)) or (isinstance(value, float) and math.isfinite(value)):
        if len(str(value)) <= VALUE_MAX_CHARS:
            return value
    elif isinstance(value, str) and len(value) <= VALUE_MAX_CHARS:
        return value
    text = json.dumps(value, sort_keys=True, default=repr, allow_nan=True)
    return HASH_PREFIX + xxhash.xxh3_64_hexdigest(text.encode("utf-8", "surrogatepass"))


def parse_env_keys(key: str, value: Any) -> tuple[tuple[str, Any], ...]:
    """Parse ``fingerprint.env`` in its resolved form, the mapping ``{dotted path: value}`` (what :func:`resolve_env`
    made of the list the user gave, and what a plan handed to a Ray worker holds); ``null`` or ``[]``: none.

    Raises:
        ConfigError: a list of paths (only the whole app config can resolve it: the config was read without it, e.g.
            ``parse_skip`` given the ``skip`` node alone), a path that is no dotted path, or another type.
    """
    if value is None or (isinstance(value, (list, tuple)) and not value):
        return ()
    if isinstance(value, (list, tuple, str)):  # (load_skip_config resolves them: it has the whole config)
        raise ConfigError(key, value, "dotted paths resolved against the app's whole config, which was not given "
                                      "here: pass the whole config to skipweave.weave() (the Hydra callback does)")
    if not isinstance(value, Mapping):
        raise ConfigError(key, value, "a list of dotted paths into the app's config, e.g. "
                                      "[actor_rollout_ref.model.path, actor_rollout_ref.rollout.temperature]")
    out = []
    for path, found in value.items():
        check_path(key, path)
        out.append((path, env_value(found)))
    return tuple(out)


def check_path(key: str, path: Any) -> str:
    """Return ``path`` if it is a dotted path of names or list indices (``a.b.0.c``).

    Raises:
        ConfigError: naming ``key`` and the path.
    """
    if not isinstance(path, str) or not _PATH_RE.match(path):
        raise ConfigError(key, path, "dotted paths into the app's config such as 'actor_rollout_ref.model.path' "
                                     "(letters, digits, '_', '-'; no empty parts)")
    return path


def named_paths(skip: Any) -> list[str]:
    """The paths every role of a ``skip`` node (plain containers) names in ``fingerprint.env`` as a list (the form the
    user writes), those that are dotted paths; in order, without repeats."""
    out: list[str] = []
    if not isinstance(skip, Mapping):
        return out
    for role in skip.values():
        fingerprint = role.get("fingerprint") if isinstance(role, Mapping) else None
        paths = fingerprint.get("env") if isinstance(fingerprint, Mapping) else None
        if isinstance(paths, str):
            paths = [paths]
        if isinstance(paths, (list, tuple)):
            out.extend(p for p in paths if isinstance(p, str) and _PATH_RE.match(p) and p not in out)
    return out


def lookup(cfg: Any, path: str) -> Any:
    """The value at dotted ``path`` in ``cfg`` (plain containers or OmegaConf nodes; a digit part indexes a list), as
    plain containers, or a private "absent" mark (see :func:`found`). Only that key is resolved: the app's other keys
    may not resolve where this runs."""
    node = cfg
    try:
        for part in path.split("."):
            if isinstance(node, Mapping) or is_dictconfig(node):
                if part not in node:
                    return _ABSENT
                node = node[part]
            elif isinstance(node, (list, tuple)) or type(node).__name__ == "ListConfig":
                if not part.isdigit() or int(part) >= len(node):
                    return _ABSENT
                node = node[int(part)]
            else:
                return _ABSENT
        value = plain(node)
    except Exception:  # noqa: BLE001 - an interpolation that does not resolve, a ??? value: the key has no value
        return _ABSENT
    return _ABSENT if isinstance(value, str) and value == MISSING else value


def found(value: Any) -> bool:
    """Whether :func:`lookup` found a value."""
    return value is not _ABSENT


def add_named_parts(into: dict[str, Any], cfg: Any, skip: Any) -> dict[str, Any]:
    """Copy into ``into`` (nested as in ``cfg``) the values of the keys the roles of ``skip`` name in
    ``fingerprint.env``, those ``cfg`` has; return ``into``. For callers that hand :func:`resolve_env` only the parts
    of the app's config skipweave reads (:func:`~skipweave.config.adapters.relevant_config`)."""
    for path in named_paths(skip):
        value = lookup(cfg, path)
        if not found(value):
            continue  # resolve_env names it
        node = into
        parts = path.split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):  # (a value found below it means cfg has a mapping here)
                child = node[part] = {}
            node = child
        node[parts[-1]] = value
    return into


def resolve_env(container: dict[str, Any]) -> dict[str, Any]:
    """Return ``container`` (the app's config as plain containers) with each role's ``fingerprint.env`` list of paths
    replaced by the mapping ``{path: env_value(value)}`` of their values in ``container`` (``container`` is not
    modified; a mapping is kept: it is resolved already).

    Raises:
        ConfigError: ``skip.<role>.fingerprint.env`` names a key the config does not have (or one left ``???``), or an
            item that is no dotted path.
    """
    skip = container.get("skip")
    if not isinstance(skip, Mapping):
        return container
    roles = dict(skip)
    for name, role in skip.items():
        fingerprint = role.get("fingerprint") if isinstance(role, Mapping) else None
        paths = fingerprint.get("env") if isinstance(fingerprint, Mapping) else None
        if isinstance(paths, str):
            paths = [paths]  # a single path, as the other path lists take it
        if not isinstance(fingerprint, Mapping) or not isinstance(paths, (list, tuple)):
            continue  # null, a resolved mapping, or a bad value parse_env_keys reports
        key = f"skip.{name}.fingerprint.env"
        values = {}
        for path in paths:
            value = lookup(container, check_path(key, path))
            if not found(value):
                raise ConfigError(key, path, "keys the app's config has, with a value (this one is missing or "
                                             "unset); remove it from the list or fix its spelling")
            values[path] = env_value(value)
        roles[name] = {**role, "fingerprint": {**fingerprint, "env": values}}
    return {**container, "skip": roles}


__all__ = ["HASH_PREFIX", "VALUE_MAX_CHARS", "add_named_parts", "check_path", "env_value", "found", "lookup",
           "named_paths", "parse_env_keys", "resolve_env"]
