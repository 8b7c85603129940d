"""What "equal" means when a verify run compares a live result with its recording (``skip.<role>.compare``).

A :class:`CompareSpec` is a rule per path glob and a default for every other field::

    compare:
      default: exact                      # exact | ignore | {atol: .., rtol: ..}
      fields:
        non_tensor_batch.uid: ignore      # verl's random per-run ids
        meta_info.timing*: ignore
        batch.rollout_log_probs: {atol: 1.0e-3, rtol: 1.0e-2}

Paths are dotted (dict keys, attribute names, list indices: ``batch.responses``, ``non_tensor_batch.uid.3``); a
pattern's segments may hold ``fnmatch`` globs, each within one segment (``*`` never crosses a dot). The comparison
itself is :mod:`skipweave.verify.compare`; ``skipweave diff`` builds the same spec from its ``--atol/--rtol/--ignore``
options or a profile's ``compare``.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from skipweave.config.errors import ConfigError

EXACT, IGNORE = "exact", "ignore"


@dataclass(frozen=True)
class Tolerance:
    """Floats are close when ``|live - recorded| <= atol + rtol * |recorded|`` (``torch.isclose``'s rule).

    Attributes:
        atol: absolute tolerance, >= 0.
        rtol: relative tolerance, >= 0.
    """

    atol: float = 0.0
    rtol: float = 0.0


Rule = str | Tolerance
"""``"exact"``, ``"ignore"`` or a :class:`Tolerance`."""

RULES_ALLOWED = "exact, ignore or {atol: <number >= 0>, rtol: <number >= 0>}"


def parse_rule(key: str, value: Any) -> Rule:
    """Read one rule: ``exact``, ``ignore`` or a mapping with ``atol`` and/or ``rtol`` (finite numbers >= 0).

    Raises:
        ConfigError: any other value (the message names ``key``).
    """
    if isinstance(value, str) and value in (EXACT, IGNORE):
        return value
    if isinstance(value, Mapping):
        unknown = sorted(map(str, set(value) - {"atol", "rtol"}))
        if unknown or not value:
            raise ConfigError(key, dict(value), f"a tolerance with keys atol and rtol only (numbers >= 0)"
                                                f"{'; unknown: ' + ', '.join(unknown) if unknown else ''}")
        parts = {}
        for name in ("atol", "rtol"):
            raw = value.get(name, 0.0)
            try:
                number = float(raw) if isinstance(raw, (int, float)) and not isinstance(raw, bool) else math.nan
            except OverflowError:
                number = math.inf
            if not math.isfinite(number) or number < 0:
                raise ConfigError(f"{key}.{name}", raw, "a finite number >= 0")
            parts[name] = number
        return Tolerance(**parts)
    raise ConfigError(key, value, RULES_ALLOWED)


def rule_form(rule: Rule) -> Any:
    """A rule in config form (the inverse of :func:`parse_rule`)."""
    return rule if isinstance(rule, str) else {"atol": rule.atol, "rtol": rule.rtol}


@dataclass(frozen=True)
class CompareSpec:
    """What "equal" means for each field of a result.

    A pattern is a dotted path whose segments may hold ``fnmatch`` globs, each within one segment (``*`` never
    crosses a dot): ``meta_info.timing*``, ``batch.*_log_probs``, ``*`` (every top-level field). A pattern names the
    fields it matches and everything below them. The rule of a field is that of the deepest pattern naming it;
    at one depth a plain path beats a glob, else the first in order; no pattern: :attr:`default`.

    Attributes:
        default: the rule of every field no pattern names.
        fields: ``(pattern, rule)`` pairs, in order.
        always_ignore: patterns ignored whatever else names them (``skipweave diff --ignore``, skipweave's own
            result notes); not part of the config form.
    """

    default: Rule = EXACT
    fields: tuple[tuple[str, Rule], ...] = ()
    always_ignore: tuple[str, ...] = ()

    @classmethod
    def parse(cls, raw: Mapping[str, Any] | None, key: str = "compare") -> CompareSpec:
        """Read ``{default: exact | ignore | {atol, rtol}, fields: {<pattern>: <rule>}}`` (a role's ``compare``).

        Raises:
            ConfigError: an unknown key, or a rule that is none of the allowed ones (the message names the key).
        """
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise ConfigError(key, raw, "a mapping {default: <rule>, fields: {<path pattern>: <rule>}}")
        unknown = sorted(map(str, set(raw) - {"default", "fields"}))
        if unknown:
            raise ConfigError(f"{key}.{unknown[0]}", raw[unknown[0]], "only the keys default and fields")
        default = parse_rule(f"{key}.default", EXACT if raw.get("default") is None else raw["default"])
        fields_raw = raw.get("fields") or {}
        if not isinstance(fields_raw, Mapping):
            raise ConfigError(f"{key}.fields", fields_raw, "a mapping {<path pattern>: <rule>}")
        return cls(default, tuple(_flat_fields(f"{key}.fields", "", fields_raw)))

    def to_config(self) -> dict[str, Any]:
        """The canonical mapping (:meth:`parse` reads it back to an equal spec, :attr:`always_ignore` aside)."""
        return {"default": rule_form(self.default), "fields": {p: rule_form(r) for p, r in self.fields}}

    def ignoring(self, patterns: tuple[str, ...]) -> CompareSpec:
        """This spec with ``patterns`` ignored whatever its own rules say."""
        return CompareSpec(self.default, self.fields, self.always_ignore + patterns)

    def rule_for(self, path: str) -> Rule:
        """The rule of ``path``: :meth:`explicit_rule`, else :attr:`default`."""
        explicit = self.explicit_rule(path)
        return self.default if explicit is None else explicit

    def explicit_rule(self, path: str) -> Rule | None:
        """The rule a pattern gives ``path`` (see the class docstring), ``None`` when none names it or an ancestor.
        The result itself (``""``) is never named."""
        parts = path.split(".") if path else []
        if any(_names(pattern.split("."), parts) for pattern in self.always_ignore):
            return IGNORE
        best: tuple[int, int, int] | None = None  # (depth, plain, -order): the largest wins
        rule: Rule | None = None
        for order, (pattern, r) in enumerate(self.fields):
            segments = pattern.split(".")
            if _names(segments, parts):
                rank = (len(segments), 0 if _is_glob(pattern) else 1, -order)
                if best is None or rank > best:
                    best, rule = rank, r
        return rule

    def names_below(self, path: str) -> bool:
        """Whether a rule other than ``ignore`` names a field strictly below ``path`` (the fields an ignored container
        still holds for comparison: ``{"*": ignore, "batch.responses": exact}``)."""
        parts = path.split(".") if path else []
        if any(_names(p.split("."), parts) for p in self.always_ignore):
            return False
        return any(rule != IGNORE and len(segments) > len(parts)
                   and all(fnmatch.fnmatchcase(part, seg) for seg, part in zip(segments, parts, strict=False))
                   for pattern, rule in self.fields for segments in [pattern.split(".")])


def _names(segments: list[str], parts: list[str]) -> bool:
    """Whether the pattern ``segments`` names the path ``parts`` or one of its ancestors (segment by segment)."""
    return 0 < len(segments) <= len(parts) and all(
        fnmatch.fnmatchcase(part, seg) for seg, part in zip(segments, parts, strict=False))


def _is_glob(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def _flat_fields(key: str, prefix: str, raw: Mapping[Any, Any]) -> list[tuple[str, Rule]]:
    """``(path, rule)`` pairs of a ``fields`` mapping; a nested mapping that is no tolerance (keys other than
    ``atol``/``rtol``) is a deeper path, so ``{batch: {responses: ignore}}`` (what a Hydra override
    ``skip.rollout.compare.fields.batch.responses=ignore`` makes) reads as ``batch.responses: ignore``."""
    out: list[tuple[str, Rule]] = []
    for name, value in raw.items():
        path = f"{prefix}.{name}" if prefix else str(name)
        if isinstance(value, Mapping) and value and not set(map(str, value)) <= {"atol", "rtol"}:
            out.extend(_flat_fields(key, path, value))
        else:
            out.append((path, parse_rule(f"{key}.{path}", value)))
    return out


def parse_compare(key: str, value: Any) -> CompareSpec:
    """The :data:`~skipweave.config.fields.Parser` of ``skip.<role>.compare``."""
    return CompareSpec.parse(value, key=key)


__all__ = ["EXACT", "IGNORE", "RULES_ALLOWED", "CompareSpec", "Rule", "Tolerance", "parse_compare", "parse_rule",
           "rule_form"]
