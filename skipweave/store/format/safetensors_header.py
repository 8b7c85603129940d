"""The one parser of safetensors headers, without torch: what a tensor file holds and where.

A safetensors file is an 8-byte little-endian header length, a JSON header (``name -> {dtype, shape,
data_offsets}``, plus an optional ``__metadata__``) and the data section. Replays
(:mod:`~skipweave.store.format.tensorfile`)
and ``skipweave show`` (:func:`~skipweave.store.format.group.read_tree`, which must not import torch) read headers
through
this module, so a header one of them accepts the other does too. The header is untrusted input: every count is
checked before anything is allocated for it.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping

from skipweave.store.errors import EntryInvalid
from skipweave.store.format import jsonio

MAX_HEADER = 100 << 20
"""Longest header accepted, in bytes (safetensors' own limit)."""

MAX_RATIO = 1024
"""A compressed tensor file decompresses to at most this many times its own size (plus a MiB, see
:mod:`~skipweave.store.format.tensorfile`): a header claiming more is refused."""

ITEMSIZE: dict[str, int] = {
    "BOOL": 1, "U8": 1, "I8": 1, "I16": 2, "I32": 4, "I64": 8, "F16": 2, "BF16": 2, "F32": 4, "F64": 8,
    "U16": 2, "U32": 4, "U64": 8, "F8_E4M3": 1, "F8_E5M2": 1, "C64": 8,
}
"""Bytes per element of every dtype code skipweave writes."""

Span = tuple[int, int, str, str, list[int]]
"""One tensor of a safetensors file: ``(start, end)`` of its bytes in the data section, name, dtype code, shape."""


def header_length(prefix: bytes | bytearray | memoryview, path: str, *, room: int | None) -> int:
    """The header length the first 8 bytes of a safetensors file give.

    Args:
        prefix: the file's first 8 bytes.
        path: the file, for messages.
        room: bytes the file holds after those 8 (``None`` when unknown: a compressed file).

    Raises:
        EntryInvalid: the length is over :data:`MAX_HEADER` or more than the file holds.
    """
    (n,) = struct.unpack_from("<Q", prefix)
    if n > MAX_HEADER or (room is not None and n > room):
        raise EntryInvalid(f"payload {path} is not a valid safetensors file: header length {n} does not fit")
    return int(n)


def parse(header: bytes | bytearray | memoryview, data_size: int | None, path: str, *,
          itemsize: Mapping[str, int] = ITEMSIZE) -> list[Span]:
    """Parse a safetensors header into its tensors' spans, in file order.

    The tensors' byte ranges must tile the data section from its start, as safetensors requires, and each must hold
    exactly its shape's elements.

    Args:
        header: the JSON header's bytes.
        data_size: bytes of the data section: exactly (``>= 0``), at most ``-data_size`` (negative: a compressed
            file, whose size does not tell its data section's), or unknown (``None``: only the tiling is checked).
        path: the file, for messages.
        itemsize: the dtype codes the reader can make, with their bytes per element.

    Raises:
        EntryInvalid: the header is malformed (not JSON, nested too deeply, an unknown dtype, a non-finite number
            where a count belongs, ...), or the spans do not tile the data section.
    """
    try:
        parsed = jsonio.loads(header)
        if not isinstance(parsed, dict):
            raise ValueError("the header is not a JSON object")
        spans: list[Span] = []
        for name, info in parsed.items():
            if name == "__metadata__":
                continue
            code = info["dtype"]
            size = itemsize.get(code) if isinstance(code, str) else None
            if size is None:
                raise ValueError(f"tensor {name!r} has unknown dtype {code!r}")
            shape = list(map(int, info["shape"]))
            lo, hi = map(int, info["data_offsets"])  # (exactly two: else ValueError)
            numel = 1
            for d in shape:
                if d < 0:
                    raise ValueError(f"tensor {name!r} has a negative dimension in {shape}")
                numel *= d
            if hi - lo != numel * size:
                raise ValueError(f"tensor {name!r} has offsets {lo}..{hi} that do not fit its shape {shape}")
            spans.append((lo, hi, name, code, shape))
        spans.sort(key=lambda sp: (sp[0], sp[1]))
        covered = 0
        for lo, hi, *_ in spans:
            if lo != covered:
                raise ValueError("the tensors' bytes do not tile the data section")
            covered = hi
        if data_size is None:
            pass
        elif data_size < 0:
            if covered > -data_size:
                raise ValueError(f"the tensors would take {covered} bytes, more than {MAX_RATIO}x the compressed "
                                 "file (skipweave never writes such a file)")
        elif covered != data_size:
            raise ValueError(f"the tensors' bytes end at {covered}, the data section at {data_size}")
    except (ValueError, KeyError, TypeError, OverflowError, RecursionError) as exc:  # (int(inf); nesting too deep)
        raise EntryInvalid(f"payload {path} is not a valid safetensors file: {type(exc).__name__}: {exc}") from exc
    return spans


__all__ = ["ITEMSIZE", "MAX_HEADER", "MAX_RATIO", "Span", "header_length", "parse"]
