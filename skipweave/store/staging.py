"""An entry's payload encoded and ready to write, and the manifest fields that go with it.

A recorded result is staged first (encoded by the codec, its tree serialised), then committed by the caller's thread
or the background writer (:mod:`skipweave.store.write_behind`), which first makes the staged entry own its tensors
(:meth:`Staged.copied`) so the host may change its result in place at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from skipweave.store.format import jsonio
from skipweave.store.format.layout import EntryKey
from skipweave.store.format.versions import ARGUMENTS


@dataclass(frozen=True)
class Staged:
    """An entry's payload encoded and ready to write (:func:`stage`).

    Attributes:
        tree: the codec's JSON tree, serialised.
        tensors: flat ``name -> tensor`` mapping (contiguous CPU tensors; owned copies after :meth:`copied`).
        pickled: some value was pickled (``allow_pickle``).
        nbytes: bytes the entry's payload files take (the tree and the tensor file), about the memory a pending
            write holds.
    """

    tree: bytes
    tensors: dict[str, Any]
    pickled: bool
    nbytes: int
    buffers: tuple[Any, ...] = ()
    """The :data:`~skipweave.store.buffers.POOL` buffers the copies live in (see :meth:`copied`)."""
    buffer_spare: int = 0
    """Bytes of those buffers beyond the copies in them."""

    def copied(self) -> Staged:
        """The same entry owning its tensors (each copied), so the host may change its result in place right after
        (a background write still records the result as it was returned). Costs one copy of the tensors; a large
        one is made into a reused buffer (:mod:`skipweave.store.buffers`), which whoever writes the entry hands
        back once it is written (:meth:`release`)."""
        from skipweave.store.buffers import POOL

        tensors: dict[str, Any] = {}
        buffers: list[Any] = []
        spare = 0
        try:
            for name, tensor in self.tensors.items():
                tensors[name], buffer = POOL.copy(tensor)
                if buffer is not None:
                    buffers.append(buffer)
                    spare += buffer.numel() - tensor.numel() * tensor.element_size()
        except BaseException:  # (out of memory): the buffers taken so far go back
            POOL.give(buffers)
            raise
        return Staged(self.tree, tensors, self.pickled, self.nbytes, tuple(buffers), spare)


    @property
    def memory(self) -> int:
        """Bytes of memory the pending entry holds: its payload's, and what its reused buffers hold beyond it."""
        return self.nbytes + self.buffer_spare

    def release(self) -> None:
        """Hand this entry's reused buffers back (:meth:`copied`): call once nothing reads its tensors any more."""
        if self.buffers:
            from skipweave.store.buffers import POOL

            POOL.give(self.buffers)


@dataclass(frozen=True)
class EntryMeta:
    """What an entry's manifest says besides its payload (see :meth:`~skipweave.store.step_store.StepStore.record`
    for each field)."""

    target_path: str
    fingerprint: str
    seconds: float
    replace: bool = False
    concurrent: bool = False
    displace: bool = False
    """A slot another writer filled is kept and the entry goes to the next free call index: every writer's result is
    recorded, none is dropped."""
    background: bool = False
    """Written by the background writer: no progress bar of its own (``skipweave.flush()`` shows one)."""
    environment: Mapping[str, Any] | None = None
    """What the call ran with (the manifest's ``environment``, see :mod:`skipweave.store.format.environment`);
    ``None``: not
    recorded. One mapping shared by every entry of a target (computed once per process), never changed."""
    returned: str | None = None
    """:data:`~skipweave.store.format.manifest.RETURNED_AWAITABLE` when the result is the value of an awaitable a plain
    ``def`` target handed back (the manifest's ``returned``: replayed as an awaitable); ``None`` otherwise."""

    fingerprint_rule: str = ARGUMENTS
    """How ``fingerprint`` was taken (the manifest's ``fingerprint_rule``, one of :data:`~skipweave.store.format.
    versions.FINGERPRINT_RULES`): a recording call's own rule (:meth:`~skipweave.weaving.calls.CallLedger.digest`),
    an entry written again its manifest's. ``arguments`` by default: the rule of
    :func:`~skipweave.weaving.fingerprint.fingerprint`, and of an empty fingerprint any rule will do."""


def stage(result: Any, *, rng_state: dict[str, Any] | None, effects: dict[str, Any] | None = None,
          appended: dict[str, Any] | None = None, allow_pickle: bool = False,
          trusted: tuple[str, ...] = ()) -> Staged:
    """Encode a result (with its RNG state and effects) into what a commit writes (see
    :meth:`~skipweave.store.step_store.StepStore.stage`).

    Raises:
        codec.CodecError: the result cannot be encoded.
    """
    from skipweave.store.format import codec, tensorfile  # torch: imported on first use, not by the CLI

    payload: dict[str, Any] = {"result": result, "rng": rng_state}
    if effects is not None:
        payload["effects"] = effects
    if appended:
        payload["appended"] = appended
    encoded = codec.encode(payload, allow_pickle=allow_pickle, trusted=trusted)
    tree = jsonio.dumps(encoded.tree)  # now: the tree may hold host objects
    return Staged(tree, encoded.tensors, encoded.pickled, len(tree) + tensorfile.file_size(encoded.tensors))


Item = tuple[EntryKey, Staged, EntryMeta]
"""One entry to commit: its key, its staged payload and its manifest fields."""

__all__ = ["EntryMeta", "Item", "Staged", "stage"]
