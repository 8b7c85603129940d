"""The app config keys a role's environment fingerprint names (``skip.<role>.fingerprint.env``), read once.

A user names keys of the app's *whole* config (``actor_rollout_ref.model.path``,
``actor_rollout_ref.rollout.temperature``) whose values describe what a recorded call computed with. They are
resolved here, when the config is read, into a mapping ``{path: value}``; that mapping is what the role's plan holds
and what :meth:`~skipweave.config.schema.SkipConfig.to_config` hands Ray workers, whose own config has no such keys.
Long values (and lists or mappings) are kept as a short hash (:func:`env_value`), so a manifest stays small.

What a recorded environment may hold (:data:`MAX_ITEMS`, :data:`MAX_CHARS`, :func:`scalar_problem`) is defined here,
once: the store judges a manifest's ``environment`` by it (:mod:`skipweave.store.format.environment`), and every
value this
module keeps as it is passes that judgement (a value that would not is hashed, a path that would not is an error), so a
replay never finds this process's own environment refused.

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

MAX_ITEMS = 256
"""Keys one role's ``fingerprint.env`` may name; packages or config keys a recorded environment may list."""

MAX_CHARS = 256
"""Characters a named key's path may have; and a recorded environment's names, versions, source hash and text values."""

INT_LIMIT = 1 << 63
"""An integer is recorded as it is only while its magnitude is below this (64-bit signed: what every JSON reader holds
exactly); a larger one (a seed of ``2**64``) is hashed."""

VALUE_MAX_CHARS = 128
"""A named key's value is kept as it is up to this many characters of text (at most :data:`MAX_CHARS`); longer ones
as :func:`env_value`'s hash."""

HASH_PREFIX = "xxh3_64:"
"""What a hashed value starts with: ``xxh3_64:`` and 16 hex digits of the value's canonical JSON."""

_PATH_RE = re.compile(r"^[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)*$")

_ABSENT = object()


def scalar_problem(value: Any) -> str | None:
    """Why ``value`` cannot be a recorded environment's config value as it is (``"is an integer beyond 64 bits"``,
    said of it), or ``None`` when it can: ``None``, a ``bool``, an ``int`` of magnitude below :data:`INT_LIMIT`, a
    finite ``float`` or a string of at most :data:`MAX_CHARS` characters."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return "is an integer beyond 64 bits" if abs(value) >= INT_LIMIT else None
    if isinstance(value, float):
        return None if math.isfinite(value) else "is not a finite number"
    if isinstance(value, str) and len(value) <= MAX_CHARS:
        return None
    return f"is not a string of at most {MAX_CHARS} characters, a number, a bool or null"


def env_value(value: Any) -> Any:
    """The form in which a named key's value is recorded and compared: a value :func:`scalar_problem` accepts, a
    string only up to :data:`VALUE_MAX_CHARS` characters, as it is; anything else (a long string, an integer beyond 64
    bits, a list, a mapping, ``nan``) as ``xxh3_64:<16 hex>`` of its canonical JSON (keys sorted). Idempotent.

    Args:
        value: a plain value (OmegaConf nodes already converted by :func:`~skipweave.config.containers.plain`).
    """
    if scalar_problem(value) is None and not (isinstance(value, str) and len(value) > VALUE_MAX_CHARS):
        return value
    try:
        text = json.dumps(value, sort_keys=True, default=repr, allow_nan=True)
    except ValueError:  # an integer past Python's limit of digits for decimal text: such ints written in hex
        text = json.dumps(_hex_ints(value), sort_keys=True, default=repr, allow_nan=True)
    return HASH_PREFIX + xxhash.xxh3_64_hexdigest(text.encode("utf-8", "surrogatepass"))


def _hex_ints(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= INT_LIMIT:
        return {"int": hex(value)}
    if isinstance(value, Mapping):
        return {k: _hex_ints(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_hex_ints(v) for v in value]
    return value


def parse_env_keys(key: str, value: Any) -> tuple[tuple[str, Any], ...]:
    """Parse ``fingerprint.env`` in its resolved form, the mapping ``{dotted path: value}`` (what :func:`resolve_env`
    made of the list the user gave, and what a plan handed to a Ray worker holds); ``null`` or ``[]``: none.

    Raises:
        ConfigError: a list of paths (only the whole app config can resolve it: the config was read without it, e.g.
            ``parse_skip`` given the ``skip`` node alone), a path that is no dotted path or longer than
            :data:`MAX_CHARS`, more than :data:`MAX_ITEMS` paths, or another type.
    """
    if value is None or (isinstance(value, (list, tuple)) and not value):
        return ()
    if isinstance(value, (list, tuple, str)):  # (load_skip_config resolves them: it has the whole config)
        raise ConfigError(key, value, "dotted paths resolved against the app's whole config, which was not given "
                                      "here: pass the whole config to skipweave.weave() (the Hydra callback does)")
    if not isinstance(value, Mapping):
        raise ConfigError(key, value, "a list of dotted paths into the app's config, e.g. "
                                      "[actor_rollout_ref.model.path, actor_rollout_ref.rollout.temperature]")
    check_count(key, value)
    out = []
    for path, found in value.items():
        check_path(key, path)
        out.append((path, env_value(found)))
    return tuple(out)


def check_path(key: str, path: Any) -> str:
    """Return ``path`` if it is a dotted path of names or list indices (``a.b.0.c``) of at most :data:`MAX_CHARS`
    characters.

    Raises:
        ConfigError: naming ``key`` and the path.
    """
    if not isinstance(path, str) or not _PATH_RE.match(path):
        raise ConfigError(key, path, "dotted paths into the app's config such as 'actor_rollout_ref.model.path' "
                                     "(letters, digits, '_', '-'; no empty parts)")
    if len(path) > MAX_CHARS:  # a replay would refuse the environment recorded with it
        raise ConfigError(key, path, f"dotted paths of at most {MAX_CHARS} characters (this one has {len(path)})")
    return path


def check_count(key: str, paths: Any) -> None:
    """Check that ``paths`` (a list or mapping of paths) names at most :data:`MAX_ITEMS` keys.

    Raises:
        ConfigError: naming ``key`` and how many there are.
    """
    if len(paths) > MAX_ITEMS:  # a replay would refuse the environment recorded with them
        raise ConfigError(key, f"{len(paths)} paths", f"at most {MAX_ITEMS} keys per role")


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
        ConfigError: ``skip.<role>.fingerprint.env`` names a key the config does not have (or one left ``???``), an
            item that is no dotted path or longer than :data:`MAX_CHARS`, or more than :data:`MAX_ITEMS` keys.
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
        check_count(key, paths)
        values = {}
        for path in paths:
            value = lookup(container, check_path(key, path))
            if not found(value):
                raise ConfigError(key, path, "keys the app's config has, with a value (this one is missing or "
                                             "unset); remove it from the list or fix its spelling")
            values[path] = env_value(value)
        roles[name] = {**role, "fingerprint": {**fingerprint, "env": values}}
    return {**container, "skip": roles}


__all__ = ["HASH_PREFIX", "INT_LIMIT", "MAX_CHARS", "MAX_ITEMS", "VALUE_MAX_CHARS", "add_named_parts", "check_count",
           "check_path", "env_value", "found", "lookup", "named_paths", "parse_env_keys", "resolve_env",
           "scalar_problem"]
