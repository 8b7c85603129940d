"""Reads without a copy: the tensors of a verified plain tensor file, built on a private mapping of it.

A replay used to read every byte of a payload into freshly allocated tensors and checksum that copy. Filling fresh
memory is most of its cost (page faults and zeroing: 0.12 s of a 256 MiB warm read here, the checksum 0.01-0.02 s).
A plain (uncompressed) tensor file skipweave wrote lays every tensor out aligned (header padded to 8 bytes, tensors
by decreasing element size), so its tensors can be the file's own pages instead:
:func:`~skipweave.store.format.tensorfile.read` checksums the file, maps it privately (``mmap.ACCESS_COPY``) and builds
each tensor on the mapping with ``torch.frombuffer``. Nothing is copied; the pages are the page cache's until the host
writes to one (then that page alone is copied, privately: the file never changes).

**The checksum pass never touches the mapping.** A mapped page beyond the end of a file that was truncated after
it was mapped raises SIGBUS on access, which Python cannot catch: it kills the process. So the file is hashed with
``readinto`` into one reused 1 MiB buffer (as fast as hashing the mapping, measured: 17-18 ms for 256 MiB warm,
both ways; equal cold), where a truncation shows as a short read: an :class:`EntryInvalid`, a miss. The mapping is
made only after the checksum matched, and the file's size is checked again (``fstat``) once it is made. From then
on the tensors' pages are the file's: docs/format.md "Reading without a copy" says what an *outside* truncation or
in-place write of a committed file would do to them, and why skipweave itself (commits, gc, retention, migrate)
never does either.

Only where that reasoning holds is a file mapped (:func:`mappable`): a local file system (the mapping of a file
removed by another process stays readable; on NFS another node's ``gc`` removing the file makes a later page fault
fail, SIGBUS), a file of at least :data:`MAP_MIN` bytes (each live mapping holds a file descriptor on Python < 3.13),
and a header whose every tensor is aligned to its element size (:func:`aligned`); ``SKIPWEAVE_MAP_PAYLOADS=0`` turns
mapping off. Anything else is read into memory as before (:func:`skipweave.store.format.tensorfile.read`).
"""

from __future__ import annotations

import functools
import mmap
import os
import sys
from collections.abc import Sequence
from typing import Any, BinaryIO, Protocol

import torch

from skipweave.env import MAP_ENV
from skipweave.store.errors import EntryInvalid

MAP_MIN = 16 << 20
"""Plain tensor files of at least this many bytes are mapped. Below it the copy costs little (under 10 ms), and a
host that keeps many small replayed results alive (a buffer of per-sample entries) would otherwise hold one mapping
and, on Python < 3.13, one open file descriptor for each."""

HASH_CHUNK = 1 << 20
"""Bytes per ``readinto`` of the checksum pass: the buffer is hashed right after the kernel filled it, still in the CPU
cache. 128 KiB to 4 MiB measured alike (within the noise of a shared machine: 1.05-1.15x hashing the mapped file for
a whole replay); 1 MiB makes few system calls."""

LOCAL_FILESYSTEMS = frozenset({
    "ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "zfs", "bcachefs", "jfs", "reiserfs", "tmpfs", "ramfs",
    "overlay",
})
"""File systems on which a mapped file stays readable whatever other processes do to its name (rename, unlink):
its pages belong to the inode, which lives while it is mapped. Network and user-space file systems (nfs, cifs,
fuse.*, lustre, ceph, 9p, ...) are left out: a page fault there may fail when another machine removed the file."""

Span = tuple[int, int, str, torch.dtype, list[int]]
"""One tensor of a safetensors file: ``(start, end)`` of its bytes in the data section, name, dtype, shape."""


class Hasher(Protocol):
    """What the checksum pass feeds (an ``xxhash.xxh3_128``)."""

    def update(self, data: Any) -> Any: ...


class Progress(Protocol):
    """What the checksum pass reports its bytes to (a tqdm bar, or nothing)."""

    def update(self, n: int) -> Any: ...


def mappable(fd: int, size: int) -> bool:
    """Whether the file open as ``fd`` (of ``size`` bytes, already checked against ``fstat``) may be read on a
    mapping: at least :data:`MAP_MIN` bytes, on a file system of :data:`LOCAL_FILESYSTEMS`, and
    ``SKIPWEAVE_MAP_PAYLOADS`` (:data:`~skipweave.env.MAP_ENV`) not ``0``."""
    if size < MAP_MIN or os.environ.get(MAP_ENV, "").strip() == "0":
        return False
    try:
        return filesystem_of(os.fstat(fd).st_dev) in LOCAL_FILESYSTEMS
    except OSError:
        return False


@functools.lru_cache(maxsize=64)
def filesystem_of(device: int) -> str | None:
    """The type of the file system of device ``device`` (an ``st_dev``) as ``/proc/self/mountinfo`` names it
    (``"ext4"``, ``"nfs4"``, ``"fuse.sshfs"``), ``None`` when it cannot be told (no ``/proc``, a device no line
    names). Cached per device: one small read per file system and process."""
    want = f"{os.major(device)}:{os.minor(device)}"
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                fields = line.split()
                if len(fields) > 2 and fields[2] == want and " - " in line:
                    return line.split(" - ", 1)[1].split()[0]
    except OSError:
        pass
    return None


def aligned(spans: Sequence[Span], data_start: int) -> bool:
    """Whether every tensor of a file starts at a multiple of its element size (``data_start``: the data section's
    offset in the file). Files skipweave and ``safetensors`` write are; a tensor built on an unaligned address
    would be one few kernels expect, so such a file is read into memory instead."""
    return all((data_start + lo) % dtype.itemsize == 0 for lo, _hi, _name, dtype, _shape in spans)


def hash_rest(fh: Any, hasher: Hasher, size: int, path: str, bar: Progress) -> None:
    """Feed ``hasher`` the bytes of ``fh`` from its position to ``size``, read into one reused buffer (never through
    a mapping: a file truncated meanwhile gives a short read, not SIGBUS).

    Args:
        fh: the unbuffered file :func:`~skipweave.store.fs.open_payload` opened.
        hasher: fed every byte read.
        size: the file's size according to its manifest (and ``fstat`` when it was opened).
        path: the file, for messages.
        bar: told every chunk's bytes.

    Raises:
        EntryInvalid: the file ended before ``size`` bytes (truncated under the reader).
        OSError: the read failed.
    """
    buf = bytearray(HASH_CHUNK)
    view = memoryview(buf)
    left = size - fh.tell()
    while left > 0:
        n = fh.readinto(view[:min(left, HASH_CHUNK)])
        if not n:
            raise EntryInvalid(f"payload {path} ended early while being read")
        hasher.update(view[:n])
        left -= n
        bar.update(n)


def map_private(fh: BinaryIO, size: int, path: str) -> mmap.mmap:
    """A private, writable (copy-on-write) mapping of the first ``size`` bytes of ``fh``, made only while the file
    still has exactly ``size`` bytes (checked with ``fstat`` once the mapping exists, so a truncation before it is
    seen before any page is touched).

    Raises:
        EntryInvalid: the file no longer has ``size`` bytes.
        OSError: the mapping could not be made.
    """
    extra: dict[str, Any] = {"trackfd": False} if sys.version_info >= (3, 13) else {}  # no descriptor kept open
    try:
        mapping = mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_COPY, **extra)
    except ValueError:  # "mmap length is greater than file size": Python's own fstat saw it shrink
        mapping = None
    actual = os.fstat(fh.fileno()).st_size
    if mapping is None or actual != size:
        if mapping is not None:
            mapping.close()  # nothing was built on it yet
        raise EntryInvalid(f"payload {path} changed size while being read ({actual} bytes, manifest says {size})")
    return mapping


def tensors_on(mapping: mmap.mmap, data_start: int, spans: Sequence[Span]) -> dict[str, torch.Tensor]:
    """The tensors ``spans`` list, each built on ``mapping`` without a copy (``torch.frombuffer``: its own storage,
    offset 0, of exactly its bytes; every tensor holds a reference to the mapping, which is unmapped when the last
    one is freed). Empty tensors are allocated (``frombuffer`` refuses a count of 0). Touches no page.

    Args:
        mapping: a private mapping of the whole, verified file (:func:`map_private`).
        data_start: the data section's offset in the file (8 + the header's length).
        spans: the header's spans (:func:`aligned` holds for them).
    """
    out: dict[str, torch.Tensor] = {}
    for lo, hi, name, dtype, shape in spans:
        if hi == lo:
            out[name] = torch.empty(shape, dtype=dtype)
            continue
        flat = torch.frombuffer(mapping, dtype=dtype, count=(hi - lo) // dtype.itemsize, offset=data_start + lo)
        out[name] = flat if len(shape) == 1 else flat.reshape(shape)
    return out


__all__ = ["HASH_CHUNK", "LOCAL_FILESYSTEMS", "MAP_MIN", "Span", "aligned", "filesystem_of", "hash_rest", "map_private",
           "mappable", "tensors_on"]
