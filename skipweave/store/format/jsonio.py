"""JSON for the store's own files: trees, manifests, group files and safetensors headers.

A small entry's record and hit are mostly bookkeeping, and JSON was a large part of it: ``json.dumps`` of an entry's
tree took 10 µs and ``json.loads`` 9 µs, against 1 and 3 µs with ``orjson`` (a well-kept C library), and a
256-entry group file 7 µs per entry against 1. These two functions use ``orjson`` and fall back on the standard
library for anything it does not take, so what is accepted stays the standard library's, and what a value reads
back as too, but for one case (below):

- :func:`dumps`: ``orjson`` refuses ints beyond 64 bits, non-``str`` keys and strings with lone surrogates
  (``json`` writes them); it writes NaN and infinities as ``null``, so callers pass only values that hold none
  (the codec writes non-finite floats as strings). Its output is compact, like ``json.dumps(..., separators=(",",
  ":"))``, but writes non-ASCII text as UTF-8 instead of ``\\u`` escapes (any JSON reader, this module's included,
  reads both the same). Surrogates, which UTF-8 cannot hold, are written as ``surrogatepass`` bytes: as escapes,
  a high surrogate followed by a low one would read back as the single character the pair encodes. Only
  :func:`loads` (and ``json.loads`` of the bytes) reads such a file back; no file skipweave writes holds one
  unless the recorded values hold surrogates.
- :func:`loads`: ``orjson`` refuses what strict JSON does not allow but ``json`` takes (``NaN``, ``Infinity``, lone
  surrogate escapes, a byte-order mark, nesting over 1024); the fallback reads those as ``json`` does, and raises as
  ``json`` does for what neither takes. One value reads differently: an integer beyond 64 bits is a float to
  ``orjson`` and exact to ``json``. No file skipweave writes holds one (the codec writes such ints as strings, and
  manifests, group files and headers hold counts, sizes and offsets), so only a crafted file can, and it is read
  as the float; looking for long digit runs first to rule them out would cost more than ``orjson`` saves (13 µs
  per KB of digit-heavy text).
"""

from __future__ import annotations

import json
from typing import Any

import orjson

_PASSTHROUGH = orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_SUBCLASS
"""What ``orjson`` would write but ``json`` refuses or writes otherwise goes to ``json`` (dataclasses, datetimes,
subclasses of ``str``/``int``/``dict``/``list``)."""


def dumps(value: Any) -> bytes:
    """Compact JSON of ``value`` as UTF-8 bytes.

    Args:
        value: a JSON-shaped value without NaN or infinities (they would be written as ``null``).

    Raises:
        TypeError: ``value`` holds something neither ``orjson`` nor ``json`` serialises.
        ValueError: a circular reference (from ``json``).
    """
    try:
        return orjson.dumps(value, option=_PASSTHROUGH)
    except orjson.JSONEncodeError:
        # Text as it is, surrogates passed through (``\\u`` escapes would read a high and a low surrogate back as
        # the one character they make together: "\\ud83d\\ude00" came back as U+1F600); ``json.loads`` of bytes
        # decodes them with ``surrogatepass``, so every string round-trips exactly.
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")


def dumps_spaced(value: Any, *, indent: int | None = None) -> bytes:
    """The standard library's spaced JSON of ``value`` (ASCII, ``", "`` and ``": "`` separators, ``indent`` when
    given): files people read (an entry's manifest, a part's state) are written byte for byte as they always were.

    Raises:
        TypeError: ``value`` holds something ``json`` does not serialise.
        ValueError: a circular reference.
    """
    return json.dumps(value, indent=indent).encode()


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """Parse JSON as ``json.loads`` does (same refusals; the same values but for integers beyond 64 bits, see the
    module docstring), usually with ``orjson``.

    Raises:
        ValueError: not JSON (``json.JSONDecodeError``), or not UTF-8 (``UnicodeDecodeError``).
        RecursionError: nested too deeply for ``json``.
    """
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:  # (also a str holding lone surrogates: orjson takes UTF-8 only)
        return json.loads(bytes(data) if isinstance(data, memoryview) else data)


__all__ = ["dumps", "dumps_spaced", "loads"]
