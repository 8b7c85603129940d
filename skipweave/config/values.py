"""Parsers of single config values: each takes the full dotted key and the raw value, returns the value
in its checked form, or raises :class:`~skipweave.config.errors.ConfigError` naming the key, the value and
what is allowed. The schema (:mod:`skipweave.config.schema`) names one of them for each key it declares.
"""

from __future__ import annotations

import enum
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from skipweave.config.errors import ConfigError
from skipweave.config.grammar import check_expression
from skipweave.store.fs import NAME_RULE, name_problem

_RANGE_RE = re.compile(r"^\s*(-?\d+)\s*(?:-|\.\.|:)\s*(-?\d+)\s*$")
_CLASS_REF_RE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$", re.ASCII)
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_COMPRESS_RE = re.compile(r"^zstd(?::(\d+))?$")

MAX_BYTES = (1 << 63) - 1
"""The largest size a size key takes (8 EiB): what a 64-bit signed count of bytes holds; larger is no real size."""

_SIZE_ALLOWED = "a size in bytes from 0 to 2**63 - 1 (an integer, or e.g. '512MB', '2GiB')"


@dataclass(frozen=True)
class StepSet:
    """The steps eligible for record/replay: every step, or a union of inclusive ranges.

    Attributes:
        ranges: inclusive ``(first, last)`` pairs, sorted; ``None`` means every step.
    """

    ranges: tuple[tuple[int, int], ...] | None = None

    def __contains__(self, step: object) -> bool:
        if self.ranges is None:
            return True
        if not isinstance(step, int):
            return False
        for lo, hi in self.ranges:
            if lo <= step <= hi:
                return True
        return False

    def to_config(self) -> str | list[int | str]:
        """Return the canonical config form: ``"all"`` or a list of ints and ``"a-b"`` strings."""
        if self.ranges is None:
            return "all"
        return [lo if lo == hi else f"{lo}-{hi}" for lo, hi in self.ranges]


def parse_steps(key: str, value: Any) -> StepSet:
    """Parse ``steps``: ``"all"``/``null``, an int, ``"a-b"`` (inclusive), ``{start, end}`` or a list.

    Args:
        key: dotted key for error messages.
        value: the raw value.

    Returns:
        A :class:`StepSet` with merged, sorted inclusive ranges.

    Raises:
        ConfigError: on anything else, or a range whose end precedes its start.
    """
    allowed = "'all', a step (int), a list of steps, an inclusive range '3-7' or {start: 3, end: 7}"
    if value is None or (isinstance(value, str) and value.strip().lower() == "all"):
        return StepSet(None)
    items: Iterable[Any]
    if isinstance(value, (list, tuple)):
        items = value
        if not value:
            raise ConfigError(key, value, allowed + " (an empty list would select no step; use enable=false)")
    else:
        items = [value]
    ranges: list[tuple[int, int]] = []
    for item in items:
        if isinstance(item, bool):
            raise ConfigError(key, value, allowed)
        if isinstance(item, int):
            ranges.append((item, item))
        elif isinstance(item, str) and item.strip().lstrip("-").isdigit():
            ranges.append((int(item), int(item)))
        elif isinstance(item, str) and _RANGE_RE.match(item):
            m = _RANGE_RE.match(item)
            assert m is not None
            ranges.append((int(m.group(1)), int(m.group(2))))
        elif isinstance(item, Mapping) and set(item) == {"start", "end"}:
            ranges.append((parse_int(f"{key}.start", item["start"]), parse_int(f"{key}.end", item["end"])))
        else:
            raise ConfigError(key, value, allowed)
        if ranges[-1][1] < ranges[-1][0]:
            raise ConfigError(key, value, "ranges must end at or after their start, e.g. '3-7'")
        if ranges[-1][0] < 0:
            raise ConfigError(key, value, allowed + "; steps are 0 or more")
    ranges.sort()
    merged: list[tuple[int, int]] = []
    for lo, hi in ranges:
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    return StepSet(tuple(merged))


def optional_steps(key: str, value: Any) -> StepSet | None:
    """``None`` for ``null``, else :func:`parse_steps` (``record_steps``: unset means only the first)."""
    return None if value is None else parse_steps(key, value)


def enum_parser(cls: type[enum.Enum]) -> Callable[[str, Any], Any]:
    """Return the parser of a value of enum ``cls``: one of its values, else an error listing them."""

    def parse(key: str, value: Any) -> Any:
        try:
            return cls(value)
        except ValueError:
            allowed = ", ".join(repr(m.value) for m in cls)
            raise ConfigError(key, value, f"one of {allowed}") from None

    return parse


def parse_bool(key: str, value: Any) -> bool:
    """``true`` or ``false``, nothing else (no ``0``/``"yes"``)."""
    if isinstance(value, bool):
        return value
    raise ConfigError(key, value, "true or false")


def parse_int(key: str, value: Any, *, minimum: int | None = None) -> int:
    """An integer (not a bool), at least ``minimum`` when given."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(key, value, "an integer")
    if minimum is not None and value < minimum:
        raise ConfigError(key, value, f"an integer >= {minimum}")
    return value


def optional_count(key: str, value: Any) -> int | None:
    """``None`` for ``null``, else an integer >= 1 (``calls_per_step``)."""
    return None if value is None else parse_int(key, value, minimum=1)


def parse_bytes(key: str, value: Any) -> int:
    """A size in bytes: an integer from 0 to :data:`MAX_BYTES`, or a number with a unit (``512MB``, ``1.5GiB``; powers
    of 1000 or 1024) that comes to one.

    Raises:
        ConfigError: naming ``key``: another type, a negative size, a fraction of a byte (``0.5B``), or a size beyond
            :data:`MAX_BYTES`.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value <= MAX_BYTES:
            raise ConfigError(key, value, _SIZE_ALLOWED)
        return value
    m = _SIZE_RE.match(value) if isinstance(value, str) else None
    # exact arithmetic (a float of 400 digits is inf, and loses bytes past 2**53); the length is bounded first:
    # Fraction of a text of thousands of digits is slow or refused
    if m is None or len(m.group(1)) > 64:
        raise ConfigError(key, value, _SIZE_ALLOWED)
    size = Fraction(m.group(1)) * _SIZE_UNITS[(m.group(2) or "").lower()]
    if size.denominator != 1 or size > MAX_BYTES:  # '0.5B' is no number of bytes
        raise ConfigError(key, value, _SIZE_ALLOWED)
    return int(size)


def optional_bytes(key: str, value: Any) -> int | None:
    """``None`` for ``null``, else :func:`parse_bytes` (``keep.bytes``: unset means no size limit)."""
    return None if value is None else parse_bytes(key, value)


def parse_pin(key: str, value: Any) -> StepSet | None:
    """Steps never removed (``keep.pin``): ``None`` for ``null`` or an empty list (no step pinned), else as
    :func:`parse_steps` (a step, a list of steps and ranges, ``'all'``)."""
    if value is None or (isinstance(value, (list, tuple)) and not value):
        return None
    return parse_steps(key, value)


def parse_compress(key: str, value: Any) -> str:
    """``none`` (also false/off/null) or ``zstd:<level>`` (``zstd`` or true: level 1), canonical."""
    allowed = "none, zstd (level 1) or zstd:<level> with a level from 1 to 22"
    if value is None or value is False or (isinstance(value, str) and value.strip().lower() in ("none", "off",
                                                                                                 "false", "")):
        return "none"
    if value is True:
        return "zstd:1"
    m = _COMPRESS_RE.match(value.strip().lower()) if isinstance(value, str) else None
    if m is None:
        raise ConfigError(key, value, allowed)
    level = int(m.group(1) or 1)  # level 1: nearly level 3's size at about half its cost (bench: compress)
    if not 1 <= level <= 22:
        raise ConfigError(key, value, allowed)
    return f"zstd:{level}"


def parse_arg_ref(key: str, value: Any) -> int | str:
    """A positional argument index (>= 0) or a keyword argument name."""
    if isinstance(value, bool) or not isinstance(value, (int, str)) or value == "":
        raise ConfigError(key, value, "a positional argument index (0, 1, …) or a keyword argument name")
    if isinstance(value, int) and value < 0:
        raise ConfigError(key, value, "a positional argument index >= 0")
    return value


def parse_str(key: str, value: Any, *, optional: bool = False) -> str | None:
    """A non-empty string; ``None`` too when ``optional``."""
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(key, value, "a non-empty string")
    return value


def optional_str(key: str, value: Any) -> str | None:
    """``None`` or a non-empty string."""
    return parse_str(key, value, optional=True)


_NOTE_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_note_key(key: str, value: Any) -> str | None:
    """``None`` or a key for a result's note dict: letters, digits and ``_``, not starting with a digit (it is also a
    component of fingerprint ignore paths and compare paths, which split on dots)."""
    if value is None:
        return None
    if not isinstance(value, str) or not _NOTE_KEY_RE.match(value):
        raise ConfigError(key, value, "null or a key of letters, digits and '_' such as 'skipweave_reward'")
    return value


def parse_optional_path(key: str, value: Any) -> str | None:
    """A dotted path inside an argument or the bound instance; ``""`` means the argument itself, ``null`` none given
    (what that means is the step source's: the argument itself for ``arg``, no argument read for ``auto``)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigError(key, value, "a dotted path such as 'batch.step', or '' for the argument itself")
    return value


_CONVENTION_RE = re.compile(r"^[a-z][a-z0-9_]*$")


def parse_convention(key: str, value: Any) -> str | None:
    """``None`` or the name of a convention (a lower-case identifier; whether a loaded integration declares it is
    checked with the role, :func:`skipweave.config.conventions.convention_named`)."""
    if value is None:
        return None
    if not isinstance(value, str) or not _CONVENTION_RE.match(value):
        raise ConfigError(key, value, "the name of a convention of a loaded integration (a lower-case identifier), "
                          "or null for none")
    return value


def parse_paths(key: str, value: Any) -> tuple[str, ...]:
    """A list of dotted paths (a single string is a list of one), no empty parts."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(
        isinstance(v, str) and v and all(part for part in v.split(".")) for v in value
    ):
        raise ConfigError(key, value, "a list of dotted paths such as ['0.request_ids'] (no empty parts)")
    return tuple(value)


def or_default(default: Any, parse: Callable[[str, Any], Any]) -> Callable[[str, Any], Any]:
    """Return a parser reading ``null`` as ``default`` (a profile may leave a key null), else ``parse``."""
    return lambda key, value: parse(key, default if value is None else value)


def parse_dump_dir(key: str, value: Any) -> str:
    """A folder path, ``~`` and ``$VARS`` expanded, made absolute; every variable must be set."""
    raw = parse_str(key, value)
    assert raw is not None
    expanded = os.path.expanduser(os.path.expandvars(raw))
    unset = re.search(r"\$\{?[A-Za-z_]\w*", expanded)
    if unset:  # expandvars leaves an unset variable as it is: it would become a folder named "$VAR"
        raise ConfigError(key, value, f"a path whose variables are set ({unset.group(0).lstrip('${')} is not)")
    if expanded.startswith("~"):
        raise ConfigError(key, value, f"a path whose ~user exists ({expanded.split(os.sep)[0]} does not)")
    return os.path.abspath(expanded)


def parse_report_path(key: str, value: Any) -> str | None:
    """A file path as :func:`parse_dump_dir` reads one (``None`` stays ``None``), not an existing folder."""
    if value is None:
        return None
    path = parse_dump_dir(key, value)
    if os.path.isdir(path):
        raise ConfigError(key, value, "a file path (this is a folder): the JSON-lines report of the verify run")
    return path


_REPORT_NAME: list[str] = []


def default_report_path() -> str:
    """``skipweave-verify-<YYYYmmdd-HHMMSS>-<pid>.jsonl`` in the current folder, absolute; one name per process,
    so every verify role of a run (and, through the plan, its Ray workers) writes to one file."""
    if not _REPORT_NAME:
        _REPORT_NAME.append(f"skipweave-verify-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.jsonl")
    return os.path.abspath(_REPORT_NAME[0])


def parse_namespace(key: str, value: Any) -> str:
    """One folder name of the dump dir (a number reads as its text), not starting with ``_``."""
    text = parse_str(key, str(value) if isinstance(value, (int, float)) else value)
    assert text is not None
    if name_problem(text) is not None or text.startswith("_"):
        raise ConfigError(key, value, f"{NAME_RULE}, not starting with '_'")
    return text


def parse_class_refs(key: str, value: Any) -> tuple[str, ...]:
    """A list of ``module:qualname`` class paths (a single string is a list of one)."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise ConfigError(key, value, "a list of class paths like 'my_pkg.protocol:Batch'")
    out = []
    for i, ref in enumerate(value):
        if not isinstance(ref, str) or not _CLASS_REF_RE.match(ref.strip()):
            raise ConfigError(f"{key}[{i}]", ref, "a class path like 'my_pkg.protocol:Batch' (module:qualname)")
        out.append(ref.strip())
    return tuple(out)


def parse_expr(key: str, value: Any) -> str | None:
    """An expression (see :mod:`skipweave.config.grammar`), ``None`` when unset."""
    return check_expression(key, value)


def parse_echo(key: str, value: Any) -> tuple[tuple[str, str], ...]:
    """A mapping ``{destination: source}`` of expressions, the destination assignable."""
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise ConfigError(key, value, "a mapping {destination: source}, e.g. "
                                      "{\"result['request_id']\": \"prompts['request_id']\"}")
    out = []
    for dest, source in value.items():
        dest_text = check_expression(f"{key}[{dest!r}]", dest, assignable=True)
        source_text = check_expression(f"{key}[{dest!r}]", source)
        assert dest_text is not None and source_text is not None
        out.append((dest_text, source_text))
    return tuple(out)


def parse_effects(key: str, value: Any) -> tuple[str, ...]:
    """A list of assignable expressions (a single string is a list of one)."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise ConfigError(key, value, "a list of attributes or items the target changes, e.g. ['self._metrics']")
    out = []
    for i, item in enumerate(value):
        text = check_expression(f"{key}[{i}]", item, assignable=True)
        assert text is not None
        out.append(text)
    return tuple(out)


__all__ = ["MAX_BYTES", "StepSet", "enum_parser", "optional_count", "optional_steps", "optional_str", "or_default",
           "parse_arg_ref", "parse_bool", "parse_bytes", "parse_class_refs", "parse_compress", "parse_dump_dir",
           "parse_echo", "parse_effects", "parse_expr", "parse_int", "parse_namespace", "parse_optional_path",
           "parse_paths", "parse_report_path", "parse_steps", "parse_str", "default_report_path"]
