"""A bundle opened for reading: the one narrow, read-only interface every reader of a bundle goes through.

A bundle is untrusted input (a file mailed by a colleague, downloaded, copied from another cluster), so
:class:`BundleArchive` judges the whole archive before anything of it is used, and refuses it with
:class:`BundleRefused`, naming the member, when:

- the file is truncated or not a zip archive, or a member's data ends past the end of the file;
- a member's name is absolute, holds ``..`` or a backslash, or is not a file skipweave writes at its place of a dump
  dir (:func:`~skipweave.store.bundle.layout.member_problem`); a name appears twice; a member is a symlink, a device,
  a FIFO or a folder (the mode in its external attributes); a member is encrypted, or compressed by a method other
  than deflate;
- a member would grow more than :data:`~skipweave.store.bundle.layout.MAX_RATIO` times when read, or the members
  together would (a zip bomb), or a stored member's two sizes differ;
- the bundle manifest is missing, too large, not the one the archive comment's checksum names (a flipped byte), not
  a bundle manifest of a version this code reads, or does not list exactly the archive's members with their sizes.

Every member read (:meth:`BundleArchive.read`) is checked against the size and checksum the bundle manifest gives
before it is returned; :meth:`BundleArchive.verify` reads them all and checks the checksum of the whole. Stored members
are read in place with ``pread`` at their data's offset (no extraction, no temporary file); nothing is ever written.
"""

from __future__ import annotations

import logging
import mmap
import os
import stat
import struct
import sys
import threading
import weakref
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from skipweave.store.bundle.layout import (
    BUNDLE_KIND,
    BUNDLE_VERSION,
    COMMENT_PREFIX,
    MANIFEST_MAX_BYTES,
    MANIFEST_NAME,
    MAX_RATIO,
    member_problem,
)
from skipweave.store.format import jsonio
from skipweave.store.format.manifest import bytes_checksum, checksum_digest, new_hasher

logger = logging.getLogger(__name__)

CHUNK = 8 << 20
"""Bytes read at a time when a member is read whole into memory, or a deflated one streamed."""

HASH_CHUNK = 1 << 20
"""Bytes read at a time, into one reused buffer, when a stored member is streamed (hashed, copied): as a dump dir's
payload is hashed (:data:`skipweave.store.format.mapped.HASH_CHUNK`)."""

_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")  # a zip local file header (APPNOTE 4.3.7), 30 bytes
_LOCAL_SIGNATURE = b"PK\x03\x04"
_TYPES = {stat.S_IFLNK: "a symlink", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a folder"}


class BundleRefused(ValueError):
    """A bundle (or one of its members) is not one skipweave would read: the message names the bundle, the member and
    why. Nothing of a refused bundle is served or written."""


@dataclass(frozen=True)
class Member:
    """One member of a judged bundle.

    Attributes:
        name: its name (``{namespace}/{role}/{step}/{target}/{file}``).
        bytes: its size when read.
        checksum: ``xxh3_128:<hex>`` of its bytes, as the bundle manifest gives it.
        offset: where its data starts in the file when it is stored (read in place); ``None`` when deflated.
        stored_bytes: its size in the file.
    """

    name: str
    bytes: int
    checksum: str
    offset: int | None
    stored_bytes: int


class BundleArchive:
    """A bundle judged whole and opened read-only (see the module docstring for what is refused).

    Args:
        path: the bundle file.

    Attributes:
        path: the bundle's absolute path.
        manifest: the bundle manifest (checked: its members are the archive's).
        members: every member but the bundle manifest, by name, in the order the bundle manifest lists them.

    Raises:
        FileNotFoundError: no file at ``path``.
        BundleRefused: the bundle is not one skipweave reads, naming the member and why.
    """

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        st = os.stat(self.path)  # FileNotFoundError for people as it is
        if not stat.S_ISREG(st.st_mode):
            raise BundleRefused(f"bundle {self.path} is not a regular file")
        self.size = st.st_size
        self.mtime_ns = st.st_mtime_ns
        self._lock = threading.Lock()
        _OPEN.add(self)
        self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            self._zip = self._open_zip()
            infos = self._judge_members()
            self.manifest = self._read_manifest(infos)
            self.members = self._judge_listing(infos)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ opening
    def _refuse(self, member: str | None, why: str) -> BundleRefused:
        where = f"member {member!r} of bundle {self.path}" if member else f"bundle {self.path}"
        return BundleRefused(f"{where} {why}; nothing of it is served or written")

    def _open_zip(self) -> zipfile.ZipFile:
        self._zfile = os.fdopen(os.dup(self._fd), "rb")
        try:
            return zipfile.ZipFile(self._zfile)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError, EOFError) as exc:
            raise self._refuse(None, f"is truncated or not a zip archive ({exc})") from None

    def _judge_members(self) -> dict[str, tuple[zipfile.ZipInfo, int | None]]:
        """Every member judged by its name, type, compression and sizes; ``name -> (info, data offset if stored)``."""
        out: dict[str, tuple[zipfile.ZipInfo, int | None]] = {}
        total = 0
        for info in self._zip.infolist():
            name = info.filename
            if name in out:
                raise self._refuse(name, "appears twice in the archive (a reader would serve either)")
            if name.endswith("/"):
                raise self._refuse(name, "is a folder entry (a bundle holds files only)")
            problem = member_problem(name)
            if problem is not None:
                raise self._refuse(name, problem)
            mode = info.external_attr >> 16  # (no file type at all: a plain file, as Python's zipfile writes one)
            if info.create_system == 3 and stat.S_IFMT(mode) not in (0, stat.S_IFREG):
                raise self._refuse(name, f"is {_TYPES.get(stat.S_IFMT(mode), 'not a regular file')} (external "
                                         f"attributes {oct(mode)}); a bundle holds regular files only")
            if info.flag_bits & 0x1:
                raise self._refuse(name, "is encrypted")
            if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                raise self._refuse(name, f"is compressed by method {info.compress_type} (only stored or deflated "
                                         "members are read)")
            if info.compress_type == zipfile.ZIP_STORED and info.file_size != info.compress_size:
                raise self._refuse(name, f"is stored but claims {info.file_size} bytes in {info.compress_size}")
            if info.file_size > MAX_RATIO * max(info.compress_size, 1):
                raise self._refuse(name, f"would grow from {info.compress_size} to {info.file_size} bytes when read "
                                         f"(more than {MAX_RATIO} times: a zip bomb)")
            offset = self._data_offset(info)
            if offset + info.compress_size > self.size:
                raise self._refuse(name, f"is truncated: its data ends at byte {offset + info.compress_size}, past "
                                         f"the end of the file ({self.size} bytes)")
            total += info.file_size
            out[name] = (info, offset if info.compress_type == zipfile.ZIP_STORED else None)
        if total > MAX_RATIO * max(self.size, 1):
            worst = max(out.values(), key=lambda v: v[0].file_size)[0].filename
            raise self._refuse(worst, f"is one of members that would grow to {total} bytes from a file of {self.size} "
                                      f"(more than {MAX_RATIO} times: a zip bomb)")
        return out

    def _data_offset(self, info: zipfile.ZipInfo) -> int:
        """Where a member's data starts: after its local header, whose name must be the central directory's."""
        head = os.pread(self._fd, _LOCAL_HEADER.size, info.header_offset)
        if len(head) != _LOCAL_HEADER.size:
            raise self._refuse(info.filename, "is truncated: its local header lies past the end of the file")
        fields = _LOCAL_HEADER.unpack(head)
        if fields[0] != _LOCAL_SIGNATURE:
            raise self._refuse(info.filename, "has no local header where the central directory says")
        name_len, extra_len = fields[10], fields[11]
        raw = os.pread(self._fd, name_len, info.header_offset + _LOCAL_HEADER.size)
        encoding = "utf-8" if info.flag_bits & 0x800 else "cp437"
        if raw.decode(encoding, errors="replace") != info.orig_filename:
            raise self._refuse(info.filename, "has another name in its local header than in the central directory")
        return int(info.header_offset + _LOCAL_HEADER.size + name_len + extra_len)

    def _read_manifest(self, infos: dict[str, tuple[zipfile.ZipInfo, int | None]]) -> dict[str, Any]:
        if MANIFEST_NAME not in infos:
            raise self._refuse(MANIFEST_NAME, "is missing (no bundle manifest: not a skipweave bundle)")
        info, offset = infos[MANIFEST_NAME]
        if info.file_size > MANIFEST_MAX_BYTES:
            raise self._refuse(MANIFEST_NAME, f"has {info.file_size} bytes, more than {MANIFEST_MAX_BYTES}")
        data = self._raw(MANIFEST_NAME, info, offset)
        comment = self._zip.comment.decode("ascii", errors="replace")
        if not comment.startswith(COMMENT_PREFIX):
            raise self._refuse(MANIFEST_NAME, f"is not vouched for by the archive comment ({comment[:60]!r}; expected "
                                              f"{COMMENT_PREFIX}xxh3_128:<hex>)")
        if bytes_checksum(memoryview(data)) != comment[len(COMMENT_PREFIX):].strip():
            raise self._refuse(MANIFEST_NAME, "does not match the checksum the archive comment gives (damaged)")
        try:
            manifest = jsonio.loads(data)
        except (ValueError, RecursionError) as exc:
            raise self._refuse(MANIFEST_NAME, f"is not JSON ({exc})") from None
        if not isinstance(manifest, dict) or manifest.get("kind") != BUNDLE_KIND:
            raise self._refuse(MANIFEST_NAME, f"is not a bundle manifest (kind {BUNDLE_KIND!r} expected)")
        version = manifest.get("bundle_version")
        if version != BUNDLE_VERSION or type(version) is not int:
            raise self._refuse(MANIFEST_NAME, f"is of bundle version {version!r:.20}; this skipweave reads version "
                                              f"{BUNDLE_VERSION} (a newer skipweave wrote it: upgrade to read it)")
        return manifest

    def _judge_listing(self, infos: dict[str, tuple[zipfile.ZipInfo, int | None]]) -> dict[str, Member]:
        listed = self.manifest.get("members")
        if not isinstance(listed, list):
            raise self._refuse(MANIFEST_NAME, "lists no members")
        members: dict[str, Member] = {}
        for item in listed:
            name = item.get("name") if isinstance(item, dict) else None
            if not isinstance(name, str) or name == MANIFEST_NAME or member_problem(name) is not None:
                raise self._refuse(MANIFEST_NAME, f"lists a member {name!r:.200} that a bundle cannot hold")
            if name in members:
                raise self._refuse(name, "is listed twice in the bundle manifest")
            size, checksum = item.get("bytes"), item.get("checksum")
            if type(size) is not int or not isinstance(checksum, str):
                raise self._refuse(name, "is listed without a size and a checksum in the bundle manifest")
            if name not in infos:
                raise self._refuse(name, "is listed in the bundle manifest but missing from the archive")
            info, offset = infos[name]
            if info.file_size != size:
                raise self._refuse(name, f"has {info.file_size} bytes, the bundle manifest says {size}")
            members[name] = Member(name, size, checksum, offset, info.compress_size)
        extra = sorted(set(infos) - set(members) - {MANIFEST_NAME})
        if extra:
            raise self._refuse(extra[0], "is in the archive but not listed in the bundle manifest")
        return members

    # ------------------------------------------------------------------ reading
    def _raw(self, name: str, info: zipfile.ZipInfo, offset: int | None) -> bytearray:
        """A member's bytes, unverified (its size is checked)."""
        out = bytearray(info.file_size)
        got = 0
        if offset is not None:  # stored: read straight into the result
            view = memoryview(out)
            while got < len(out):
                n = os.preadv(self._fd, [view[got:got + CHUNK]], offset + got)
                if not n:
                    raise self._refuse(name, f"is truncated: {got} of its {info.file_size} bytes could be read")
                got += n
            return out
        for chunk in self._chunks(name, info, offset):
            if got + len(chunk) > len(out):
                raise self._refuse(name, f"holds more than its {info.file_size} bytes")
            out[got:got + len(chunk)] = chunk
            got += len(chunk)
        if got != len(out):
            raise self._refuse(name, f"is truncated: {got} of its {info.file_size} bytes could be read")
        return out

    def _chunks(self, name: str, info: zipfile.ZipInfo, offset: int | None) -> Iterator[bytes | memoryview]:
        if offset is not None:  # stored: read in place, into one reused buffer (each chunk is used before the next)
            buf = memoryview(bytearray(min(HASH_CHUNK, info.file_size)))
            done = 0
            while done < info.file_size:
                n = os.preadv(self._fd, [buf[:min(HASH_CHUNK, info.file_size - done)]], offset + done)
                if not n:
                    return
                done += n
                yield buf[:n]
            return
        with self._lock:  # zipfile's reader shares one file position
            try:
                with self._zip.open(info) as fh:
                    limit = info.file_size
                    while True:
                        chunk = fh.read(min(CHUNK, limit + 1))
                        if not chunk:
                            return
                        limit -= len(chunk)
                        if limit < 0:
                            raise self._refuse(name, f"holds more than its {info.file_size} bytes")
                        yield chunk
            except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:  # a bad CRC, a damaged stream
                raise self._refuse(name, f"cannot be read ({exc})") from None

    def read(self, name: str) -> bytearray:
        """A member's bytes, checked against the size and checksum the bundle manifest gives.

        Raises:
            KeyError: the bundle holds no such member.
            BundleRefused: the bytes are not those the bundle manifest lists (damaged, or changed since it was opened).
        """
        member = self.members[name]
        info = self._zip.getinfo(name)
        data = self._raw(name, info, member.offset)
        if bytes_checksum(memoryview(data)) != member.checksum:
            raise self._refuse(name, f"does not match its checksum {member.checksum} (damaged)")
        return data

    def copy_to(self, name: str, write: Callable[[memoryview | bytes], Any]) -> None:
        """Stream a member's bytes to ``write`` (in chunks of at most :data:`CHUNK` bytes), checking its size and
        checksum; the caller must drop what it wrote when this raises.

        Raises:
            BundleRefused: the bytes are not those the bundle manifest lists.
        """
        member = self.members[name]
        hasher = new_hasher()
        got = 0
        for chunk in self._chunks(name, self._zip.getinfo(name), member.offset):
            hasher.update(chunk)
            got += len(chunk)
            write(chunk)
        if got != member.bytes:
            raise self._refuse(name, f"is truncated: {got} of its {member.bytes} bytes could be read")
        if checksum_digest(hasher) != member.checksum:
            raise self._refuse(name, f"does not match its checksum {member.checksum} (damaged)")

    def read_range(self, name: str, start: int, length: int) -> bytes:
        """``length`` bytes of a stored member from ``start`` (within the member), unverified: a header the caller
        judges itself, read after :meth:`check` verified the member.

        Raises:
            BundleRefused: the member is not stored (deflated), or the range lies outside it or past the file's end.
        """
        member = self.members[name]
        if member.offset is None or start < 0 or length < 0 or start + length > member.bytes:
            raise self._refuse(name, f"has no stored bytes {start}..{start + length}")
        data = os.pread(self._fd, length, member.offset + start)
        if len(data) != length:
            raise self._refuse(name, "is truncated: the file ended while it was read")
        return data

    def check(self, name: str) -> None:
        """Read a member through and check its size and checksum, keeping nothing (a reused buffer per chunk).

        Raises:
            BundleRefused: the bytes are not those the bundle manifest lists.
        """
        self.copy_to(name, lambda chunk: None)

    def map_member(self, name: str) -> tuple[mmap.mmap, int]:
        """A private (copy-on-write) mapping of a stored member's bytes, made while the file still has the size it had
        when it was opened (checked with ``fstat`` once the mapping exists): ``(mapping, where the member starts in
        it)``. The caller verifies the member first (:meth:`check`): the mapping is made after, never hashed, so a
        file truncated meanwhile is refused here, before any page of it is touched (see
        :mod:`skipweave.store.format.mapped`).

        Raises:
            BundleRefused: the member is not stored, or the file changed size.
            OSError: the mapping could not be made (a limit of this process).
        """
        member = self.members[name]
        if member.offset is None:
            raise self._refuse(name, "is compressed: it cannot be mapped")
        base = member.offset - member.offset % mmap.ALLOCATIONGRANULARITY
        extra: dict[str, Any] = {"trackfd": False} if sys.version_info >= (3, 13) else {}
        try:
            mapping = mmap.mmap(self._fd, member.offset + member.bytes - base, access=mmap.ACCESS_COPY, offset=base,
                                **extra)
        except ValueError:  # the file shrank below the range
            mapping = None
        if mapping is None or os.fstat(self._fd).st_size != self.size:
            if mapping is not None:
                mapping.close()  # nothing was built on it yet
            raise self._refuse(name, "changed size while it was read")
        return mapping, member.offset - base

    def verify(self, progress: Callable[[int], Any] | None = None) -> None:
        """Read every member, check each against its size and checksum and all of them against the bundle's checksum.

        Args:
            progress: called with the bytes of each chunk read (a progress bar's ``update``).

        Raises:
            BundleRefused: naming the first member that fails, or the bundle when the whole does not match.
        """
        whole = new_hasher()
        for name in self.members:
            def write(chunk: memoryview | bytes) -> None:
                whole.update(chunk)
                if progress is not None:
                    progress(len(chunk))
            self.copy_to(name, write)
        if checksum_digest(whole) != self.manifest.get("checksum"):
            raise self._refuse(None, f"does not match its checksum {self.manifest.get('checksum')!r:.60} (its members "
                                     "are whole, but not those it was packed with, or not in that order)")

    def fileno(self) -> int:
        """The bundle's open descriptor (read-only), for :func:`os.fstat` and the like."""
        return self._fd

    @property
    def total_bytes(self) -> int:
        """Bytes of every member but the bundle manifest."""
        return sum(m.bytes for m in self.members.values())

    def close(self) -> None:
        """Release the file (idempotent)."""
        zf = getattr(self, "_zip", None)
        if zf is not None:
            zf.close()
        zfile = getattr(self, "_zfile", None)
        if zfile is not None:
            zfile.close()  # (a ZipFile never closes a file it was handed)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> BundleArchive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_OPEN: weakref.WeakSet[BundleArchive] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for archive in list(_OPEN):
        archive._lock = threading.Lock()  # another thread may have held the parent's (reading a deflated member)


os.register_at_fork(after_in_child=_after_fork_in_child)

__all__ = ["CHUNK", "HASH_CHUNK", "BundleArchive", "BundleRefused", "Member"]
