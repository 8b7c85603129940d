"""The tensor payload of an entry: a safetensors file written and read in one streaming pass, checksum included.

The bytes on disk are plain safetensors (``safetensors.torch.load_file`` reads them). This module writes
and reads them itself, for reasons measured in docs/performance.md:

* **One pass on write.** Each tensor's memory is written in 1 MiB chunks and every chunk is hashed
  right after it was copied (still in the CPU cache); nothing is re-read from disk afterwards
  (``save_file`` + a checksum of the file read it all back) and no tensor is copied to ``bytes``.
* **Verified before served, without a copy where the file allows it.** A large plain file on a local disk is
  hashed through one small reused buffer, checked, then mapped privately and its tensors built on the mapping
  (:mod:`~skipweave.store.format.mapped`): the replay copies nothing, and the checksum pass never touches the
  mapping, so a file truncated under the reader is a miss, never SIGBUS. Other files (small, compressed, on a
  network file system) are read with ``readinto`` straight into each tensor's freshly allocated memory, hashing
  each chunk. Either way the checksum is checked before anything is returned.
* **Each tensor its own storage.** Offset 0, aligned, of exactly its bytes: some torch functions (e.g.
  ``torch.set_rng_state``) ignore a view's offset.

The layout follows safetensors' own writer: tensors by decreasing element size, header padded to a
multiple of 8 bytes, so the file is also aligned for readers that map it (this one included).
"""

from __future__ import annotations

import logging
import os
import struct
import sys
from collections.abc import Mapping
from typing import Any, Protocol

import torch

from skipweave.progress import bars_enabled
from skipweave.store.format import jsonio, mapped, safetensors_header
from skipweave.store.format.manifest import EntryInvalid, bytes_checksum, checksum_digest, new_hasher
from skipweave.store.format.safetensors_header import MAX_RATIO, header_length
from skipweave.store.fs import open_new, open_payload

logger = logging.getLogger(__name__)

CHUNK = 1 << 20
"""Bytes per ``write``/``readinto`` call, each hashed right after it is copied (while it is still in the
CPU cache: hashing 16 MiB chunks instead costs about twice as much memory traffic), and the unit of progress."""

RATIO_SLACK = 1 << 20
"""A compressed tensor file decompresses to at most :data:`MAX_RATIO` times its own size plus this many bytes: the
writer stores an entry that would shrink more plainly (:class:`TooCompressible`), and a reader refuses a file whose
header claims more, so a crafted file of a few KB cannot make a replay allocate gigabytes."""

COMPRESSED_SUFFIX = ".zst"
"""Ending of a tensor file written with ``compress`` (``r0-0003.<token>.tensors.safetensors.zst``)."""

SMALL_FILE = 4 << 20
"""A file of at most this many bytes is joined in memory and written with one ``write``."""

PROGRESS_MIN = 256 << 20
"""Payloads larger than this show a progress bar (see :func:`progress_enabled`)."""

_CODES: dict[torch.dtype, str] = {
    torch.bool: "BOOL",
    torch.uint8: "U8",
    torch.int8: "I8",
    torch.int16: "I16",
    torch.int32: "I32",
    torch.int64: "I64",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float32: "F32",
    torch.float64: "F64",
}
for _name, _code in (("uint16", "U16"), ("uint32", "U32"), ("uint64", "U64"), ("float8_e4m3fn", "F8_E4M3"),
                     ("float8_e5m2", "F8_E5M2"), ("complex64", "C64")):
    _dt = getattr(torch, _name, None)
    if isinstance(_dt, torch.dtype):
        _CODES[_dt] = _code
_DTYPES: dict[str, torch.dtype] = {code: dt for dt, code in _CODES.items()}
_ITEMSIZE: dict[str, int] = {code: dt.itemsize for code, dt in _DTYPES.items()}
"""The dtype codes this torch can make (a header naming another is refused)."""


class _Progress(Protocol):
    def update(self, n: int) -> Any: ...

    def close(self) -> Any: ...


class _NoProgress:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def progress_enabled(total: int) -> bool:
    """Whether a transfer of ``total`` bytes shows a progress bar on stderr.

    Only above :data:`PROGRESS_MIN`; ``SKIPWEAVE_PROGRESS=0`` turns bars off, ``=1`` on even when stderr
    is not a terminal; unset, bars show when stderr is a terminal.
    """
    return total > PROGRESS_MIN and bars_enabled()


def _progress(total: int, desc: str | None) -> _Progress:
    if not desc or not progress_enabled(total):
        return _NoProgress()
    bar: _Progress = byte_bar(total, desc)
    return bar


def byte_bar(total: int, desc: str) -> Any:
    """A tqdm bar on stderr counting ``total`` bytes (the caller decides whether bars show: :func:`bars_enabled`)."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, file=sys.stderr, leave=False,
                dynamic_ncols=True)


_NUMPY_NATIVE = frozenset({torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                           torch.float32, torch.float64})
"""dtypes whose numpy view has a one-letter buffer format, so its bytes are one cast away (no reshape or view)."""


def _byte_view(t: torch.Tensor | bytes) -> memoryview:
    """The bytes of a contiguous CPU tensor (or of a ``bytes`` value), without a copy."""
    if type(t) is bytes:
        return memoryview(t)
    assert isinstance(t, torch.Tensor)
    if t.numel() == 0:
        return memoryview(b"")
    if t.dtype in _NUMPY_NATIVE and t.dim():
        return t.numpy().data.cast("B")
    return t.reshape(-1).view(torch.uint8).numpy().data.cast("B")


class TooCompressible(ValueError):
    """The tensors compress more than :data:`MAX_RATIO` times (e.g. all zeros): written plainly instead."""


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _chunks(view: memoryview) -> list[memoryview]:
    return [view[i:i + CHUNK] for i in range(0, len(view), CHUNK)] or [view]


def _layout(tensors: Mapping[str, torch.Tensor | bytes],
            metadata: Mapping[str, str] | None) -> tuple[bytes, list[memoryview]]:
    """The 8-byte length and header of the file, and the tensors' bytes in file order."""
    prefix, order = _prefix(tensors, metadata)
    return prefix, [_byte_view(t) for _, t, _, _, _ in order]


def _dtype_code(name: str, t: torch.Tensor) -> str:
    """The safetensors dtype code of a tensor write() can store.

    Raises:
        ValueError: its dtype has no code, or it is not a contiguous CPU tensor.
    """
    code = _CODES.get(t.dtype)
    if code is None:
        raise ValueError(f"tensor {name!r} has dtype {t.dtype}, which safetensors cannot store")
    if t.layout != torch.strided or t.device.type != "cpu" or not t.is_contiguous():
        raise ValueError(f"tensor {name!r} must be a contiguous CPU tensor")
    return code


_Item = tuple[str, "torch.Tensor | bytes", str, list[int], int]
"""One tensor in file order: name, the value, its dtype code, shape and bytes."""


def _order(tensors: Mapping[str, torch.Tensor | bytes]) -> list[_Item]:
    """The tensors in file order (widest elements first, then by name, as safetensors writes them), each with its
    dtype code, shape and size. A ``bytes`` value is stored as a 1-D ``uint8`` tensor (a group's trees).

    Raises:
        ValueError: a tensor cannot be stored (:func:`_dtype_code`).
    """
    items: list[tuple[int, str, _Item]] = []
    for name, t in tensors.items():
        if type(t) is bytes:
            items.append((-1, name, (name, t, "U8", [len(t)], len(t))))
            continue
        assert isinstance(t, torch.Tensor)
        size = t.element_size()
        items.append((-size, name, (name, t, _dtype_code(name, t), list(t.shape), t.numel() * size)))
    items.sort(key=lambda x: (x[0], x[1]))
    return [item for _, _, item in items]


def _prefix(tensors: Mapping[str, torch.Tensor | bytes],
            metadata: Mapping[str, str] | None) -> tuple[bytes, list[_Item]]:
    order = _order(tensors)
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name, _, code, shape, nbytes in order:
        header[name] = {"dtype": code, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = jsonio.dumps(header)
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw, order


def file_size(tensors: Mapping[str, torch.Tensor | bytes], metadata: Mapping[str, str] | None = None) -> int:
    """Bytes :func:`write` writes for ``tensors`` (header included), exactly: the header :func:`write` would write is
    made (about 1 µs for a small entry, with ``orjson``) and measured, so the two can never disagree (a length summed
    from parts did, for names whose JSON escaping depends on the other names).

    Raises:
        ValueError: a tensor cannot be stored.
    """
    prefix, order = _prefix(tensors, metadata)
    return len(prefix) + sum(item[4] for item in order)


def write(
    path: str,
    tensors: Mapping[str, torch.Tensor | bytes],
    *,
    metadata: Mapping[str, str] | None = None,
    desc: str | None = None,
    dir_fd: int | None = None,
    sync: bool = True,
    compress: int | None = None,
) -> tuple[int, str]:
    """Write ``tensors`` to ``path`` as safetensors and fsync it (unless ``sync`` is off: the caller syncs it).

    The checksum of the file's bytes is computed on the tensors' memory, chunk by chunk as it is written.

    Args:
        path: the file to create or truncate (a temporary name: the caller renames it into place).
        tensors: contiguous CPU tensors of a dtype safetensors stores (what :func:`codec.encode` makes), or
            ``bytes`` values, stored as 1-D ``uint8`` tensors.
        metadata: optional string pairs for the header's ``__metadata__``.
        desc: label of the progress bar shown for large payloads (none when ``None``).
        dir_fd: open folder ``path`` is relative to (``os.open``'s ``dir_fd``); the file is then created new
            (``O_EXCL``) and never through a symlink.
        compress: a zstd level (1-22): the safetensors bytes are written as one zstd frame (``zstandard``), the
            checksum and size being the compressed file's; ``None`` writes them plain.

    Returns:
        ``(bytes written, checksum)`` with the checksum in the manifest's ``xxh3_128:<hex>`` form.

    Raises:
        ValueError: a tensor cannot be stored.
        TooCompressible: with ``compress``, the file would be more than :data:`MAX_RATIO` times smaller than its
            tensors (the file is left for the caller to remove and write plainly).
        OSError: the write or the fsync failed (the partial file is left for the caller to remove).
    """
    prefix, views = _layout(tensors, metadata)
    total = len(prefix) + sum(len(v) for v in views)
    hasher = new_hasher()
    bar = _progress(total, desc)
    fd = open_new(path, dir_fd=dir_fd, exclusive=dir_fd is not None)
    written = 0
    try:
        pieces = [memoryview(prefix)] + [c for v in views if len(v) for c in _chunks(v)]
        if len(pieces) > 2 and total <= SMALL_FILE:  # many small tensors (a group of entries): one write, one hash
            pieces = [memoryview(b"".join(pieces))]
        if compress is None:
            for piece in pieces:
                _write_all(fd, piece)
                hasher.update(piece)  # the chunk just copied is still in the CPU cache
                bar.update(len(piece))
            written = total
        else:
            import zstandard

            chunker = zstandard.ZstdCompressor(level=compress, write_content_size=False).chunker(
                size=total, chunk_size=CHUNK)
            for piece in pieces:
                for out in chunker.compress(piece):
                    _write_all(fd, memoryview(out))
                    hasher.update(out)
                    written += len(out)
                bar.update(len(piece))
            for out in chunker.finish():
                _write_all(fd, memoryview(out))
                hasher.update(out)
                written += len(out)
            if total > written * MAX_RATIO + RATIO_SLACK:
                raise TooCompressible(f"{total} bytes compress to {written}: more than {MAX_RATIO}x")
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
        bar.close()
    return written, checksum_digest(hasher)


def _readinto_exact(fh: Any, view: memoryview, path: str) -> None:
    got = 0
    while got < len(view):
        n = fh.readinto(view[got:])
        if not n:
            raise EntryInvalid(f"payload {path} ended early while being read")
        got += n


def read(path: str, *, size: int, checksum: str, desc: str | None = None) -> dict[str, torch.Tensor]:
    """Read a safetensors file, verify it against its manifest entry and return its tensors.

    The header is read and judged first (:func:`_spans`: nothing is allocated for a header that does not fit the
    file). Then, for a plain file that :func:`~skipweave.store.format.mapped.mappable` allows and whose tensors are
    aligned, the file is hashed through one reused buffer, checked, mapped privately and every tensor built on the
    mapping (:mod:`~skipweave.store.format.mapped`: no copy; writes to a tensor never reach the file). Otherwise
    (small, compressed, unaligned, on a network file system) each tensor is allocated once and the file is read
    straight into it (``readinto``), hashing each chunk. Either way the checksum is checked before anything is
    returned, and each tensor has a storage of its own (offset 0, aligned).

    Args:
        path: the file.
        size: its size in bytes according to the manifest.
        checksum: its checksum according to the manifest (``xxh3_128:<hex>``).
        desc: label of the progress bar shown for large payloads (none when ``None``).

    Raises:
        EntryInvalid: the file is missing, has another size (or gets one while it is read), does not match its
            checksum, or its header is malformed.
    """
    fh = open_payload(path, size)
    bar: _Progress = _NoProgress()
    try:
        if hasattr(os, "posix_fadvise"):
            try:
                os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
            except OSError:
                pass
        if path.endswith(COMPRESSED_SUFFIX):
            bar = _progress(size, desc)
            return _read_compressed(fh, path, size, checksum, bar)
        prefix = bytearray(8)
        _readinto_exact(fh, memoryview(prefix), path)
        n = header_length(prefix, path, room=size - 8)
        header = bytearray(n)
        _readinto_exact(fh, memoryview(header), path)
        spans = _spans(header, size - 8 - n, path)
        hasher = new_hasher()
        hasher.update(prefix)
        hasher.update(header)
        bar = _progress(size, desc)
        if mapped.mappable(fh.fileno(), size) and mapped.aligned(spans, 8 + n):
            mapped.hash_rest(fh, hasher, size, path, bar)
            _check(hasher, checksum, path)
            try:
                mapping = mapped.map_private(fh, size, path)
            except OSError as exc:  # a limit of this process (map count, address space): the entry is sound
                logger.debug("payload %s could not be mapped (%s): read into memory", path, exc)
            else:
                return mapped.tensors_on(mapping, 8 + n, spans)
            fh.seek(8 + n)  # read again into memory, hashed again: what is served is what is verified
            hasher = new_hasher()
            hasher.update(prefix)
            hasher.update(header)
            bar.close()
            bar = _progress(size, desc)
        tensors = {name: torch.empty(shape, dtype=dtype) for _lo, _hi, name, dtype, shape in spans}
        for t in tensors.values():
            for chunk in _chunks(_byte_view(t)) if t.numel() else ():
                _readinto_exact(fh, chunk, path)
                hasher.update(chunk)  # while the kernel's read-ahead fetches the next chunk
                bar.update(len(chunk))
        _check(hasher, checksum, path)
        return tensors
    except OSError as exc:
        raise EntryInvalid(f"payload {path} is unreadable: {exc}") from exc
    finally:
        fh.close()
        bar.close()


def _check(hasher: Any, checksum: str, path: str) -> None:
    """Compare a hasher's digest with the manifest's checksum (``EntryInvalid`` when they differ)."""
    if checksum_digest(hasher) != checksum:
        raise EntryInvalid(f"payload {path} does not match its checksum {checksum}")


def _read_compressed(fh: Any, path: str, size: int, checksum: str, bar: _Progress) -> dict[str, torch.Tensor]:
    """:func:`read` of a compressed file: decompressed into allocated tensors, the file's bytes hashed as the
    decompressor reads them (and whatever follows the frame).

    Raises:
        EntryInvalid: a damaged frame, a header that does not fit, more bytes than the tensors, another checksum.
        OSError: the file could not be read.
    """
    import zstandard

    hasher = new_hasher()
    try:
        source = zstandard.ZstdDecompressor().stream_reader(_Hashing(fh, hasher),  # type: ignore[arg-type]
                                                            read_size=CHUNK)
        prefix = bytearray(8)
        _readinto_exact(source, memoryview(prefix), path)
        n = header_length(prefix, path, room=None)
        header = bytearray(n)
        _readinto_exact(source, memoryview(header), path)
        tensors = _allocate(header, -(size * MAX_RATIO + RATIO_SLACK), path)
        for t in tensors.values():
            for chunk in _chunks(_byte_view(t)) if t.numel() else ():
                _readinto_exact(source, chunk, path)
                bar.update(len(chunk))
        if source.read(1):
            raise EntryInvalid(f"payload {path} holds more than its tensors")
        while block := fh.read(CHUNK):  # anything after the frame is hashed too
            hasher.update(block)
    except (EntryInvalid, OSError):
        raise
    except Exception as exc:  # zstandard.ZstdError: a damaged frame
        raise EntryInvalid(f"payload {path} is not a valid compressed file: {type(exc).__name__}: {exc}") from exc
    _check(hasher, checksum, path)
    return tensors


class _Hashing:
    """A raw file whose bytes are hashed as they are read (what the decompressor reads of it)."""

    def __init__(self, fh: Any, hasher: Any) -> None:
        self.fh, self.hasher = fh, hasher

    def read(self, n: int = -1) -> bytes:
        data = self.fh.read(n)
        self.hasher.update(data)
        return bytes(data)


Span = tuple[int, int, str, torch.dtype, list[int]]
"""One tensor of a safetensors file: ``(start, end)`` of its bytes in the data section, name, dtype, shape."""


def _spans(header_bytes: bytes | bytearray | memoryview, data_size: int, path: str) -> list[Span]:
    """A safetensors header's tensors' spans, in file order, with their torch dtypes
    (:func:`~skipweave.store.format.safetensors_header.parse` judges it).

    Raises:
        EntryInvalid: the header is malformed, names a dtype this torch lacks, or its spans do not tile the data
            section.
    """
    return [(lo, hi, name, _DTYPES[code], shape)
            for lo, hi, name, code, shape in safetensors_header.parse(header_bytes, data_size, path,
                                                                      itemsize=_ITEMSIZE)]


def header_spans(header_bytes: bytes | bytearray | memoryview, data_size: int, path: str) -> list[Span]:
    """The tensors' spans a safetensors header gives, judged against a data section of ``data_size`` bytes (what a
    reader of a file it does not open itself needs: a bundle's member).

    Raises:
        EntryInvalid: the header is malformed, names a dtype this torch lacks, or its spans do not tile the data
            section.
    """
    return _spans(header_bytes, data_size, path)


def _allocate(header_bytes: bytes | bytearray, data_size: int, path: str) -> dict[str, torch.Tensor]:
    """Allocate (uninitialised) the tensors a safetensors header lists, in file order (see :func:`_spans`); the
    file is then read into them in this order."""
    return {name: torch.empty(shape, dtype=dtype) for _lo, _hi, name, dtype, shape in _spans(header_bytes, data_size,
                                                                                                 path)}


def read_whole(path: str, *, size: int, checksum: str, limit: int) -> tuple[memoryview, dict[str, Span]]:
    """Read a small safetensors file (plain or compressed) whole into one buffer, verify it against its manifest
    item, and return the data section and its tensors' spans by name, without making any tensor (see
    :func:`tensor_at`): a group of small entries is read with one ``read``, and each hit makes only its own tensors.

    Args:
        limit: the most bytes the file, and its decompressed contents, may take; a manifest naming more is refused
            before anything is allocated.

    Raises:
        EntryInvalid: the file is missing, has another size, does not match its checksum, is not a valid
            (compressed) safetensors file, or it or its contents take more than ``limit`` bytes.
    """
    if not 0 <= size <= limit:
        raise EntryInvalid(f"payload {path}: a manifest size of {size} bytes is beyond the {limit} this file may have")
    try:
        with open_payload(path, size) as fh:  # its size checked before allocating: the manifest's is only a claim
            raw = bytearray(size)
            _readinto_exact(fh, memoryview(raw), path)
    except OSError as exc:
        raise EntryInvalid(f"payload {path} is unreadable: {exc}") from exc
    if bytes_checksum(memoryview(raw)) != checksum:
        raise EntryInvalid(f"payload {path} does not match its checksum {checksum}")
    return split_whole(raw, path=path, limit=limit)


def split_whole(raw: bytearray, *, path: str, limit: int) -> tuple[memoryview, dict[str, Span]]:
    """:func:`read_whole` of bytes already read and verified (a bundle's member): decompressed when ``path`` names a
    compressed file, the header judged, the data section and its spans returned.

    Raises:
        EntryInvalid: not a valid (compressed) safetensors file, or its contents take more than ``limit`` bytes.
    """
    data = raw
    if path.endswith(COMPRESSED_SUFFIX):
        import io

        import zstandard

        limit = min(limit, len(raw) * MAX_RATIO + RATIO_SLACK)
        out = bytearray()
        try:
            with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(raw)) as reader:
                while chunk := reader.read(CHUNK):
                    out += chunk
                    if len(out) > limit:
                        raise EntryInvalid(f"payload {path} decompresses to more than {limit} bytes")
        except zstandard.ZstdError as exc:
            raise EntryInvalid(f"payload {path} is not a valid compressed file: {exc}") from exc
        data = out
    if len(data) < 8:
        raise EntryInvalid(f"payload {path} is not a valid safetensors file: shorter than its header length")
    n = header_length(data, path, room=len(data) - 8)
    view = memoryview(data)
    spans = _spans(view[8:8 + n], len(data) - 8 - n, path)
    return view[8 + n:], {sp[2]: sp for sp in spans}


def tensor_at(data: memoryview, span: Span) -> torch.Tensor:
    """A tensor owning a copy of one span of :func:`read_whole`'s data section."""
    lo, hi, _name, dtype, shape = span
    if hi == lo:
        return torch.empty(shape, dtype=dtype)
    # one copy, into a buffer the tensor owns (cheaper than a view of the section cloned); frombuffer makes it 1-D
    # with as many elements as the span holds, which _spans checked against the shape: a 1-D shape needs no reshape
    flat = torch.frombuffer(bytearray(data[lo:hi]), dtype=dtype)
    return flat if len(shape) == 1 else flat.reshape(shape)


__all__ = ["CHUNK", "COMPRESSED_SUFFIX", "MAX_RATIO", "PROGRESS_MIN", "Span", "TooCompressible", "bars_enabled",
           "byte_bar", "file_size", "header_spans", "progress_enabled", "read", "read_whole", "split_whole",
           "tensor_at", "write"]
