"""The ``environment`` a manifest records: what a recorded call ran with, besides its inputs.

Shape (every part optional; see docs/format.md#environment)::

    {"packages": {"torch": "2.13.0", "vllm": "0.8.5"},    # imported in the recording process
     "host": {"name": "verl", "version": "0.9.1"},         # the distribution of the target's top-level package
     "source": "xxh3_128:<32 hex>",                        # of the target's source text
     "config": {"actor_rollout_ref.model.path": "/models/a", ...}}   # skip.<role>.fingerprint.env

A dump dir is untrusted: :func:`fields_of` checks a recorded environment's shape and sizes before anything reads it
and flattens it into comparable fields (``package vllm``, ``host package``, ``target source``, ``config <path>``);
:func:`changes` says which fields two environments both have and disagree on. Neither raises for a crafted value
other than :class:`EnvironmentInvalid`. Values compare by value and type, as JSON tells them apart: ``0`` is not
``false``, ``1`` is neither ``true`` nor ``1.0`` (Python's ``==`` finds each pair equal). :func:`identical` is the
cheap first look a replay takes before flattening anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from skipweave.config.env_keys import MAX_CHARS, MAX_ITEMS, scalar_problem

# The limits are the config layer's (skipweave.config.env_keys), which keeps or hashes what it records by them: one
# definition, so a replay never refuses the environment its own process records.

Field = str | int | float | bool | None
"""A flattened field's value (as JSON holds it)."""


class EnvironmentInvalid(ValueError):
    """A recorded ``environment`` is not shaped as skipweave writes it (wrong types, too large); the message says
    where."""


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_CHARS:
        raise EnvironmentInvalid(f"{where} is not a string of 1 to {MAX_CHARS} characters")
    return value


def _scalar(value: Any, where: str) -> Field:
    problem = scalar_problem(value)
    if problem is not None:
        raise EnvironmentInvalid(f"{where} {problem}")
    return value  # type: ignore[no-any-return]


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise EnvironmentInvalid(f"{where} is not a mapping")
    if len(value) > MAX_ITEMS:
        raise EnvironmentInvalid(f"{where} holds more than {MAX_ITEMS} items")
    return value


def fields_of(environment: Any) -> dict[str, Field]:
    """Check a recorded (or live) environment and flatten it into ``{field: value}``: ``package <name>`` per package,
    ``host package`` (``"<name> <version>"``), ``target source`` and ``config <path>`` per named key. Parts this
    skipweave does not know are ignored (a later version may add some).

    Args:
        environment: the manifest's ``environment`` value, as parsed from JSON.

    Raises:
        EnvironmentInvalid: it is not a mapping, a part has the wrong type, or it is larger than skipweave writes
            (:data:`~skipweave.config.env_keys.MAX_ITEMS`, :data:`~skipweave.config.env_keys.MAX_CHARS`,
            :func:`~skipweave.config.env_keys.scalar_problem`).
    """
    env = _mapping(environment, "environment")
    out: dict[str, Field] = {}
    if env.get("packages") is not None:
        for name, version in _mapping(env["packages"], "environment.packages").items():
            out[f"package {_text(name, 'a package name')}"] = _text(version, f"environment.packages[{name!r}]")
    if env.get("host") is not None:
        host = _mapping(env["host"], "environment.host")
        out["host package"] = f"{_text(host.get('name'), 'environment.host.name')} " \
                              f"{_text(host.get('version'), 'environment.host.version')}"
    if env.get("source") is not None:
        out["target source"] = _text(env["source"], "environment.source")
    if env.get("config") is not None:
        for path, value in _mapping(env["config"], "environment.config").items():
            out[f"config {_text(path, 'a config key')}"] = _scalar(value, f"environment.config[{path!r}]")
    return out


def identical(recorded: Any, live: Any) -> bool:
    """Whether two environments (as a manifest holds them, not flattened) are equal by value and type all the way down:
    the shortcut a replay takes before :func:`fields_of` and :func:`changes`, which run only when this is ``False``
    (measured Dec 2026: 0.7 µs for one package, a host and a source, 1.1 µs with three packages and three config
    keys; the full judgement 1.5 and 3.6 µs).

    Python's ``==`` alone is no such shortcut: it finds ``0 == False``, ``1 == True`` and ``1 == 1.0``, so a recorded
    ``0`` would pass for a live ``false``. Once ``==`` holds, both sides have the same keys and lengths everywhere and
    every leaf of one equals its counterpart; comparing the leaves' types then settles the rest (a ``str`` or ``None``
    equals only its own type, so only numbers and bools could differ). ``False`` is safe whenever in doubt (a mapping
    type other than ``dict``): :func:`changes` then judges. Never raises for JSON values; the walk goes no deeper
    than ``live`` (``==`` stops there).

    Args:
        recorded: the manifest's ``environment`` as parsed from JSON (untrusted).
        live: this process's environment (:func:`~skipweave.weaving.environment.live_environment`).
    """
    return recorded == live and _same_types(recorded, live)


def _same_types(a: Any, b: Any) -> bool:
    """``a == b`` holds already: whether every value in them has the same type as its counterpart (strings, nearly
    every leaf of an environment, are settled inline: a call per leaf doubled the cost)."""
    kind = type(a)
    if kind is not type(b):
        return False
    if kind is dict:
        for key, value in a.items():
            other = b[key]  # (equal dicts have the same keys)
            inner = type(value)
            if inner is str:
                if type(other) is not str:
                    return False
            elif inner is not type(other) or ((inner is dict or inner is list) and not _same_types(value, other)):
                return False
        return True
    if kind is list:
        return all(map(_same_types, a, b))
    return True


Change = tuple[str, Field, Field]
"""A field two environments disagree on: ``(field, recorded, live)``."""


def changes(recorded: Mapping[str, Field], live: Mapping[str, Field]) -> tuple[Change, ...]:
    """The fields both flattened environments have and disagree on (by value and type: ``1`` is not ``true``), in the
    recorded order. A field only one side has is no change: a package imported on one side only says nothing of what
    the call used (a replay need not load the engine at all), an unavailable source or an unknown host package
    version is unknown, and a config key named on one side only was not asked about on the other."""
    out = []
    for name, old in recorded.items():
        if name in live:
            new = live[name]
            if old != new or type(old) is not type(new):
                out.append((name, old, new))
    return tuple(out)


def changes_from(recorded: Any, live: Mapping[str, Field], live_name: str = "this process's") -> tuple[Change, ...]:
    """:func:`changes` of a recorded environment as a manifest holds it (untrusted, not flattened) against a flattened
    one: a recorded environment that is not shaped as skipweave writes it (crafted, damaged) is one change, named
    ``environment`` (``"invalid (why)" -> live_name``). ``()`` when the manifest holds none. Never raises.

    Args:
        recorded: the manifest's ``environment`` value, as parsed from JSON, or ``None``.
        live: the other side, flattened by :func:`fields_of` (this process's, or another entry's).
        live_name: how a message names the other side.
    """
    if recorded is None:
        return ()
    try:
        return changes(fields_of(recorded), live)
    except EnvironmentInvalid as exc:
        return (("environment", f"invalid ({exc})", live_name),)


def describe(found: tuple[Change, ...]) -> str:
    """``field old -> new, ...`` for a message (a source hash cut to its first 12 hex digits)."""
    def short(name: str, value: Field) -> str:
        if name == "target source" and isinstance(value, str):
            return value.split(":", 1)[-1][:12]
        return repr(value) if name.startswith("config ") else str(value)

    return ", ".join(f"{name} {short(name, old)} -> {short(name, new)}" for name, old, new in found)


__all__ = ["Change", "EnvironmentInvalid", "Field", "MAX_CHARS", "MAX_ITEMS", "changes", "changes_from", "describe",
           "fields_of", "identical"]
