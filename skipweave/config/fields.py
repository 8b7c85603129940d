"""Keys declared once: each field of a config mapping carries its default, its parser and its config form.

A schema dataclass (:mod:`skipweave.config.schema`) declares each of its keys with :func:`key`. The rest is
derived from those declarations: the set of keys (:func:`keys_of`), the parsing of a mapping
(:func:`parse_fields`, :func:`mapping_parser`) and the canonical mapping a value converts back to
(:class:`Declared.to_config`). So adding a key is one line in one place (see docs/architecture.md).
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from skipweave.config.containers import MISSING
from skipweave.config.errors import ConfigError

Parser = Callable[[str, Any], Any]
"""``parse(key, value) -> parsed``: ``key`` the full dotted key (for messages); raises :class:`ConfigError`."""

_NO_DEFAULT: Any = dataclasses.MISSING


def key(default: Any = _NO_DEFAULT, *, parse: Parser, default_factory: Callable[[], Any] | None = None,
        raw_default: Any = _NO_DEFAULT, form: Callable[[Any], Any] | None = None) -> Any:
    """Declare one key of a config mapping (a dataclass field).

    Args:
        default: the parsed default (as :func:`dataclasses.field`); or ``default_factory``.
        parse: the key's :data:`Parser`, applied to the value given, or to ``raw_default`` when the key is absent.
        default_factory: as :func:`dataclasses.field`.
        raw_default: what an absent key reads as, in config form; a callable gets the whole (given) mapping,
            for a default that depends on another key. Unset: the config form of the default.
        form: ``form(value) -> config form`` for ``to_config``; unset: :func:`config_form`.

    Returns:
        The :func:`dataclasses.field`.
    """
    metadata = {"parse": parse, "raw_default": raw_default, "form": form or config_form}
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def config_form(value: Any) -> Any:
    """Return ``value`` as a config holds it: an enum's value, ``to_config()`` of a value that has one, a list
    for a tuple (items converted too), anything else as it is."""
    if isinstance(value, enum.Enum):
        return value.value
    if hasattr(value, "to_config"):
        return value.to_config()
    if isinstance(value, tuple):
        return [config_form(v) for v in value]
    return value


def declared(cls: type) -> tuple[dataclasses.Field[Any], ...]:
    """The fields of dataclass ``cls`` declared with :func:`key`, in declaration order."""
    return tuple(f for f in dataclasses.fields(cls) if "parse" in f.metadata)  # type: ignore[arg-type]


def keys_of(cls: type) -> tuple[str, ...]:
    """The keys of the mapping dataclass ``cls`` stands for, in declaration order."""
    return tuple(f.name for f in declared(cls))


class Declared:
    """Mixin of a schema dataclass whose keys are declared with :func:`key`: gives it ``to_config``."""

    def to_config(self) -> dict[str, Any]:
        """Return the canonical, JSON-serialisable mapping (parses back to an equal value)."""
        return {f.name: f.metadata["form"](getattr(self, f.name)) for f in declared(type(self))}


def raw_default(f: dataclasses.Field[Any], data: Mapping[str, Any]) -> Any:
    """What field ``f`` reads as when the mapping ``data`` leaves it out, in config form."""
    raw = f.metadata["raw_default"]
    if raw is not _NO_DEFAULT:
        return raw(data) if callable(raw) else raw
    default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    return f.metadata["form"](default)


def parse_fields(cls: type, prefix: str, data: Mapping[str, Any]) -> dict[str, Any]:
    """Parse each declared key of ``cls`` from ``data`` (keys already checked), in declaration order.

    Args:
        cls: the schema dataclass.
        prefix: the dotted key of the mapping, e.g. ``skip.rollout``.
        data: the mapping without its ``???`` values (see :func:`given`).

    Returns:
        ``{field name: parsed value}`` for every declared key.

    Raises:
        ConfigError: the first key whose value its parser refuses.
    """
    out = {}
    for f in declared(cls):
        value = data[f.name] if f.name in data else raw_default(f, data)
        out[f.name] = f.metadata["parse"](f"{prefix}.{f.name}", value)
    return out


def given(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` without its ``???`` values: a key a profile declares but leaves unset is read as absent (its
    default), never as ``null`` (which means something of its own for ``bypass``)."""
    return {k: v for k, v in data.items() if not (isinstance(v, str) and v == MISSING)}


def sub_mapping(key: str, value: Any, allowed_keys: Iterable[str]) -> Mapping[str, Any]:
    """Return the mapping at ``key`` (``{}`` for ``null``) after checking it holds only ``allowed_keys``.

    Raises:
        ConfigError: ``value`` is not a mapping, or holds a key not allowed (with a did-you-mean).
    """
    allowed = set(allowed_keys)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(key, value, f"a mapping with keys {sorted(allowed, key=str)}")
    unknown = set(value) - allowed
    if unknown:
        bad = sorted(unknown, key=str)[0]
        raise no_such_key(f"{key}.{bad}", value[bad], allowed)
    return value


def no_such_key(key: str, value: Any, allowed_keys: Iterable[str]) -> ConfigError:
    """Return the error of a key the schema does not have, with the closest allowed key as a did-you-mean.

    Args:
        key: the full dotted key, e.g. ``skip.rollout.dump_dri``; its last part is matched against ``allowed_keys``.
        value: the value found there.
        allowed_keys: the keys allowed beside it.
    """
    allowed = sorted(allowed_keys, key=str)
    close = difflib.get_close_matches(key.rpartition(".")[2], allowed, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return ConfigError(key, value, f"no such key; {hint}allowed keys are {allowed}")


class MappingParser:
    """The :data:`Parser` of a nested mapping whose keys a schema dataclass declares (:func:`mapping_parser`).

    Args:
        cls: the schema dataclass of the mapping.
        shorthand: turns a value written in short form (``step: counter``) into the mapping; applied first.
        check: ``check(key, parsed)`` refuses combinations of keys (raises :class:`ConfigError`).
    """

    def __init__(self, cls: type, shorthand: Callable[[Any], Any] | None,
                 check: Callable[[str, Any], None] | None) -> None:
        self.cls = cls
        self.names = keys_of(cls)
        self.shorthand = shorthand
        self.check = check

    def expand(self, value: Any) -> Any:
        """``value`` with its short form turned into the mapping (a role's convention fills the mapping's keys)."""
        return self.shorthand(value) if self.shorthand is not None else value

    def __call__(self, key: str, value: Any) -> Any:
        parsed = self.cls(**parse_fields(self.cls, key, given(sub_mapping(key, self.expand(value), self.names))))
        if self.check is not None:
            self.check(key, parsed)
        return parsed


def mapping_parser(cls: type, *, shorthand: Callable[[Any], Any] | None = None,
                   check: Callable[[str, Any], None] | None = None) -> MappingParser:
    """Return the :data:`Parser` of a nested mapping whose keys ``cls`` declares (see :class:`MappingParser`)."""
    return MappingParser(cls, shorthand, check)


def expanders(cls: type) -> dict[str, Callable[[Any], Any]]:
    """``{key: expand}`` for each key of ``cls`` that holds a nested mapping (:class:`MappingParser`)."""
    return {f.name: f.metadata["parse"].expand for f in declared(cls) if isinstance(f.metadata["parse"], MappingParser)}


__all__ = ["Declared", "MappingParser", "Parser", "config_form", "declared", "expanders", "given", "key", "keys_of",
           "mapping_parser",
           "no_such_key", "parse_fields", "raw_default", "sub_mapping"]
