"""The step store of one role: record entries atomically, serve only complete and valid ones.

Guarantees (each has a test):

- A reader never sees a partial entry: payload files are written under temporary names, fsynced
  and renamed into place, the manifest last. Payload names carry a fresh token, so replacing an
  entry never touches the files an older manifest points at.
- An entry whose size or checksum does not match its manifest is never served.
- Concurrent writers of one entry (threads or processes) end with exactly one committed copy:
  writers serialise on a file lock (``filelock``) and the later one keeps the committed entry.
- A step left incomplete by an interrupted run (fewer calls committed than the step makes, and
  never closed) is moved to ``_set_aside/`` before anything is recorded for it again, so old and
  new data never mix.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import filelock
import safetensors  # noqa: F401 - its version goes into every manifest (library_versions)

from skipweave.store.atomic import fsync_dir, removing_on_error, tmp_name, write_bytes_atomic
from skipweave.store.layout import (
    MANIFEST_SUFFIX,
    SET_ASIDE_DIR,
    TMP_PREFIX,
    EntryKey,
    list_steps,
    manifest_path,
    parse_manifest_name,
    part_path,
    role_dir,
    target_dir,
)
from skipweave.store.manifest import (
    EntryInvalid,
    PayloadFile,
    build_manifest,
    bytes_checksum,
    check_identity,
    read_manifest,
    verify_payload,
)

logger = logging.getLogger(__name__)

LOCK_TIMEOUT_S = 600.0
"""Seconds a writer waits for another writer of the same entry before giving up."""


@dataclass(frozen=True)
class Loaded:
    """A served entry: its manifest, the recorded result and the RNG state the real call left."""

    manifest: dict[str, Any]
    result: Any
    rng_state: dict[str, Any] | None
    bytes: int


@dataclass(frozen=True)
class PartInfo:
    """What is committed for one (step, target, shard): call indices and whether it was closed."""

    calls: tuple[int, ...]
    closed: bool

    @property
    def contiguous(self) -> int:
        """Number of calls 0..n-1 committed without a gap."""
        n = 0
        for c in self.calls:
            if c != n:
                break
            n += 1
        return n


class StepStore:
    """Entries of one role under ``{dump_dir}/{namespace}/{role}``.

    Args:
        dump_dir: absolute store root.
        namespace: run identity folder.
        role: role name.
        allow_pickle: let results the safe codec cannot hold be pickled, and load such entries.
        calls_per_step: calls one shard makes per step when known (see :class:`RoleConfig`).
    """

    def __init__(
        self,
        dump_dir: str,
        namespace: str,
        role: str,
        *,
        allow_pickle: bool = False,
        calls_per_step: int | None = None,
    ) -> None:
        self.dump_dir = dump_dir
        self.namespace = namespace
        self.role = role
        self.allow_pickle = allow_pickle
        self.calls_per_step = calls_per_step
        self._lock = threading.RLock()
        self._writing: set[tuple[int, str, str]] = set()  # parts this process records into
        self._checked: set[tuple[int, str, str]] = set()  # parts checked for interrupted leftovers
        self._open: dict[tuple[str, str], int] = {}  # (target, shard) -> step of the part left open
        # Parts seen closed -> (inode, mtime in ns) of their folder then, so the repeat actions need not
        # re-read every part file on every call: one stat tells whether anything in the folder was added,
        # replaced or removed since (by any process: a re-record, gc, a deleted step), and then it is re-read.
        self._closed: dict[tuple[int, str, str], tuple[int, int]] = {}

    def key(self, step: int, target: str, shard: str, call: int) -> EntryKey:
        """Return the :class:`EntryKey` of a call of this role."""
        return EntryKey(self.namespace, self.role, step, target, shard, call)

    # ------------------------------------------------------------------ reading
    def part_info(self, step: int, target: str, shard: str) -> PartInfo:
        """Return the committed calls of a part and whether its writer closed it."""
        folder = target_dir(self.dump_dir, self.key(step, target, shard, 0))
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            return PartInfo((), False)
        calls = sorted(
            parsed[1] for n in names if (parsed := parse_manifest_name(n)) is not None and parsed[0] == shard
        )
        closed = False
        with contextlib.suppress(OSError, ValueError):
            with open(os.path.join(folder, shard + ".part.json"), encoding="utf-8") as fh:
                closed = json.load(fh).get("state") == "closed"
        return PartInfo(tuple(calls), closed)

    def expected_calls(self, target: str, shard: str) -> int:
        """Calls one shard makes per step: ``calls_per_step``, else the most seen in a closed part, else 1."""
        if self.calls_per_step is not None:
            return self.calls_per_step
        best = 0
        for step in list_steps(self.dump_dir, self.namespace, self.role)[-8:]:
            info = self.part_info(step, target, shard)
            if info.closed:
                best = max(best, info.contiguous)
        return best or 1

    def is_complete(self, step: int, target: str, shard: str) -> bool:
        """True when a part may be served: closed by its writer, or holding every expected call."""
        part = (step, target, shard)
        with self._lock:
            if part in self._writing:
                return True
            seen = self._closed.get(part)
        stamp = _folder_stamp(target_dir(self.dump_dir, self.key(step, target, shard, 0)))
        if seen is not None and seen == stamp:
            return True
        # stamp taken before reading: a change made while reading shows at the next call
        info = self.part_info(step, target, shard)
        with self._lock:
            self._closed.pop(part, None)
            if info.calls and info.closed and stamp is not None:
                self._closed[part] = stamp
        if not info.calls:
            return False
        return info.closed or info.contiguous >= self.expected_calls(target, shard)

    def recorded_steps(self, target: str, shard: str) -> list[int]:
        """Sorted steps holding a complete recording of ``target`` for ``shard``."""
        return [
            s
            for s in list_steps(self.dump_dir, self.namespace, self.role)
            if self.is_complete(s, target, shard)
        ]

    def load(self, key: EntryKey) -> Loaded:
        """Read, verify and decode one entry.

        Raises:
            FileNotFoundError: the entry was never committed.
            EntryInvalid: the manifest or a payload file is unreadable, truncated or corrupt.
            codec.PickleRefused: the entry holds pickled data and ``allow_pickle`` is off.
            codec.CodecError: the payload cannot be decoded here (e.g. a class no longer importable).
        """
        from skipweave.store import codec, tensorfile  # torch: imported on first use, not by the CLI

        folder = target_dir(self.dump_dir, key)
        where = manifest_path(self.dump_dir, key)
        manifest = read_manifest(where)
        check_identity(manifest, where, role=self.role, target=key.target, step=key.step, call=key.call,
                       shard=key.shard)
        if manifest.get("pickled") and not self.allow_pickle:
            raise codec.PickleRefused(
                f"entry {where} was recorded with allow_pickle=true; "
                f"loading it runs arbitrary code. Set skip.{self.role}.allow_pickle=true if you trust it"
            )
        tree_item = tensor_item = None
        others = []
        for item in manifest["payload"]:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                raise EntryInvalid(f"manifest {where} lists a malformed payload item {item!r:.200}")
            if item["name"].endswith(".tree.json") and tree_item is None:
                tree_item = item
            elif item["name"].endswith(".safetensors") and tensor_item is None:
                tensor_item = item
            else:
                others.append(item)
        if tree_item is None or tensor_item is None:
            raise EntryInvalid(f"manifest {where} lists no tree or tensor file")
        if others:
            verify_payload(folder, {"payload": others})
        # Each file is read once, into memory, and verified there: what is checked is what is served.
        tree_bytes = _read_verified(os.path.join(folder, tree_item["name"]), tree_item)
        label = f"skipweave: replaying {self.role} step {key.step}"
        tensors = tensorfile.read(os.path.join(folder, tensor_item["name"]), size=int(tensor_item["bytes"]),
                                  checksum=str(tensor_item["checksum"]), desc=label)
        try:
            tree = json.loads(tree_bytes)
        except ValueError as exc:
            raise EntryInvalid(f"payload of {where} is unreadable: {exc}") from exc
        payload = codec.decode(tree, tensors, allow_pickle=self.allow_pickle)
        size = sum(int(i["bytes"]) for i in manifest["payload"])
        return Loaded(manifest, payload["result"], payload.get("rng"), size)

    # ------------------------------------------------------------------ writing
    def prepare_part(self, step: int, target: str, shard: str) -> None:
        """Before recording into a part: close this shard's previous open part and set aside leftovers.

        A part holding calls from an interrupted run (not closed, fewer calls than expected, not
        written by this process) is moved to ``_set_aside/`` with a log line, once per process.
        """
        part = (step, target, shard)
        with self._lock:
            prev = self._open.get((target, shard))
            if prev is not None and prev != step:
                self.close_part(prev, target, shard)
            if part in self._writing or part in self._checked:
                return
            self._checked.add(part)
        info = self.part_info(step, target, shard)
        if info.calls and not self.is_complete(step, target, shard):
            self.set_aside(step, target, shard, reason=(
                f"{len(info.calls)} of {self.expected_calls(target, shard)} calls committed and never closed"
            ))

    def set_aside(self, step: int, target: str, shard: str, *, reason: str) -> str | None:
        """Move a part's files to ``_set_aside/{step}-{target}-{shard}-{stamp}/``; return that folder."""
        key = self.key(step, target, shard, 0)
        with self._lock:
            self._closed.pop((step, target, shard), None)
        folder = target_dir(self.dump_dir, key)
        stamp = time.strftime("%Y%m%dT%H%M%S") + f"-{uuid.uuid4().hex[:6]}"
        dest = os.path.join(role_dir(self.dump_dir, self.namespace, self.role), SET_ASIDE_DIR,
                            f"{step}-{target}-{shard}-{stamp}")
        with filelock.FileLock(os.path.join(folder, f".{shard}.part.lock"), timeout=LOCK_TIMEOUT_S):
            try:
                names = [n for n in os.listdir(folder) if n.startswith(shard + "-") or n == shard + ".part.json"]
            except FileNotFoundError:
                return None
            if not names:
                return None
            os.makedirs(dest, exist_ok=True)
            for n in names:
                with contextlib.suppress(FileNotFoundError):
                    os.replace(os.path.join(folder, n), os.path.join(dest, n))
            fsync_dir(folder)
        logger.warning(
            "skipweave: role %s target %s step %d shard %s was left incomplete by an interrupted run (%s); "
            "set aside to %s and recording it afresh",
            self.role, target, step, shard, reason, dest,
        )
        return dest

    def record(
        self,
        key: EntryKey,
        result: Any,
        *,
        target_path: str,
        fingerprint: str,
        rng_state: dict[str, Any] | None,
        seconds: float,
        replace: bool = False,
    ) -> int:
        """Commit one entry atomically.

        Args:
            key: the entry.
            result: the live result to store.
            target_path: the target's configured path (kept in the manifest).
            fingerprint: input fingerprint of the call.
            rng_state: RNG state after the real call (:func:`skipweave.store.rng.capture_rng_state`).
            seconds: wall time of the real call, in seconds.
            replace: overwrite an existing committed entry (corrupt entry, fingerprint regenerate).

        Returns:
            Bytes written, or 0 when another writer had already committed the entry.

        Raises:
            codec.CodecError: the result cannot be encoded (nothing is written).
            OSError: the disk refused a write (no partial entry is left; an older entry is intact).
        """
        folder = target_dir(self.dump_dir, key)
        os.makedirs(folder, exist_ok=True)
        with self._lock:
            self._writing.add((key.step, key.target, key.shard))
            self._open[(key.target, key.shard)] = key.step
        final_manifest = manifest_path(self.dump_dir, key)
        with filelock.FileLock(os.path.join(folder, f".{key.stem}.lock"), timeout=LOCK_TIMEOUT_S):
            old: dict[str, Any] | None = None
            if os.path.exists(final_manifest):
                try:
                    old = read_manifest(final_manifest)
                    if not replace:
                        verify_payload(folder, old, checksums=False)
                        return 0
                except (EntryInvalid, FileNotFoundError):
                    old = None
            from skipweave.store import codec, tensorfile

            encoded = codec.encode({"result": result, "rng": rng_state}, allow_pickle=self.allow_pickle)
            token = uuid.uuid4().hex[:8]
            tree_name = f"{key.stem}.{token}.tree.json"
            tensor_name = f"{key.stem}.{token}.tensors.safetensors"
            tree_bytes = json.dumps(encoded.tree, separators=(",", ":")).encode()
            tmp_tree, tmp_tensors = tmp_name(folder, tree_name), tmp_name(folder, tensor_name)
            final_tree, final_tensors = os.path.join(folder, tree_name), os.path.join(folder, tensor_name)
            with removing_on_error([tmp_tree, tmp_tensors, final_tree, final_tensors]):
                with open(tmp_tree, "wb") as fh:
                    fh.write(tree_bytes)
                    fh.flush()
                    os.fsync(fh.fileno())
                # safetensors bytes streamed from the tensors' memory, checksummed on that memory, fsynced
                tensor_bytes, tensor_sum = tensorfile.write(
                    tmp_tensors, encoded.tensors, desc=f"skipweave: recording {self.role} step {key.step}"
                )
                files = [
                    PayloadFile(tree_name, len(tree_bytes), bytes_checksum(tree_bytes)),
                    PayloadFile(tensor_name, tensor_bytes, tensor_sum),
                ]
                os.replace(tmp_tree, final_tree)
                os.replace(tmp_tensors, final_tensors)
                manifest = build_manifest(
                    role=self.role, target=key.target, target_path=target_path, step=key.step, call=key.call,
                    shard=key.shard, fingerprint=fingerprint, files=files, pickled=encoded.pickled,
                    seconds=seconds,
                )
                write_bytes_atomic(final_manifest, json.dumps(manifest, indent=1).encode())
            fsync_dir(folder)
            if old is not None:  # the replaced entry's payload is no longer referenced
                for item in old.get("payload", []):
                    if item.get("name") not in (tree_name, tensor_name):
                        with contextlib.suppress(OSError):
                            os.unlink(os.path.join(folder, item["name"]))
        self._write_part(key, "open")
        return sum(f.bytes for f in files)

    def discard(self, key: EntryKey, *, reason: str) -> None:
        """Move a corrupt entry's manifest and payload to ``_set_aside/`` so it is never served again."""
        with self._lock:
            self._closed.pop((key.step, key.target, key.shard), None)
        folder = target_dir(self.dump_dir, key)
        dest = os.path.join(role_dir(self.dump_dir, self.namespace, self.role), SET_ASIDE_DIR,
                            f"{key.step}-{key.target}-{key.stem}-corrupt-{uuid.uuid4().hex[:6]}")
        with filelock.FileLock(os.path.join(folder, f".{key.stem}.lock"), timeout=LOCK_TIMEOUT_S):
            os.makedirs(dest, exist_ok=True)
            for n in os.listdir(folder):
                if n.startswith(key.stem + ".") and not n.startswith(TMP_PREFIX):
                    with contextlib.suppress(FileNotFoundError):
                        os.replace(os.path.join(folder, n), os.path.join(dest, n))
        logger.error("skipweave: entry %s not served (%s); moved to %s and regenerating", key, reason, dest)

    def close_part(self, step: int, target: str, shard: str) -> None:
        """Mark a part this process recorded as complete (the process moved past its step or stops)."""
        with self._lock:
            if self._open.get((target, shard)) == step:
                del self._open[(target, shard)]
            self._writing.discard((step, target, shard))
        with contextlib.suppress(OSError):
            self._write_part(self.key(step, target, shard, 0), "closed")

    def close_all(self) -> None:
        """Close every part this process left open (called at unweave and interpreter exit)."""
        with self._lock:
            items = list(self._open.items())
        for (target, shard), step in items:
            self.close_part(step, target, shard)

    def _write_part(self, key: EntryKey, state: str) -> None:
        info = self.part_info(key.step, key.target, key.shard)
        data = {"state": state, "calls": info.contiguous, "updated_unix": time.time(), "pid": os.getpid()}
        write_bytes_atomic(part_path(self.dump_dir, key), json.dumps(data).encode())


def _folder_stamp(folder: str) -> tuple[int, int] | None:
    """(inode, mtime in ns) of a folder, or None when it does not exist; changes whenever an entry in it does."""
    try:
        st = os.stat(folder)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def _read_verified(path: str, item: dict[str, Any]) -> bytes:
    """Read a small payload file whole and check it against its manifest item (size, checksum)."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size != item.get("bytes"):
                raise EntryInvalid(f"payload {path} has {size} bytes, manifest says {item.get('bytes')}")
            data = fh.read()
    except OSError:
        raise EntryInvalid(f"payload {path} is missing") from None
    if len(data) != size:
        raise EntryInvalid(f"payload {path} changed size while being read")
    if bytes_checksum(data) != item.get("checksum"):
        raise EntryInvalid(f"payload {path} does not match its checksum {item.get('checksum')}")
    return data


__all__ = ["EntryInvalid", "Loaded", "MANIFEST_SUFFIX", "PartInfo", "StepStore"]
