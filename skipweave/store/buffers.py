"""Reused memory for the copies a background record makes of large results.

A recording handed to the background writer is copied first (the host may change its result in place as soon as
it has it). A large copy into fresh memory spends most of its time in the kernel, touching each new page: 250 MB
took 0.11-0.13 s into fresh memory and 0.025 s into memory touched before (measured here; `bench/run.py` section
`returns` shows both). So the writer hands each committed entry's copies back to :data:`POOL`, and the next
recording of a like size copies into them: a training that records a rollout of about the same size at every step
pays the page faults once.

Bounded: the pool keeps at most :data:`POOL_MAX_BYTES` of buffers (the newest), a buffer not taken again within
:data:`POOL_IDLE_S` goes, and the writer empties the pool once it has been idle that long; a forked child starts
with it empty. Tensors under :data:`POOL_MIN_BYTES` are plainly cloned: the allocator reuses small blocks
already.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

logger = logging.getLogger(__name__)

POOL_MIN_BYTES = 1 << 20
"""Smallest tensor (bytes) copied through the pool."""

POOL_MAX_BYTES = 1 << 30
"""Most bytes of buffers the pool keeps between recordings."""

POOL_IDLE_S = 10.0
"""Seconds a kept buffer waits to be taken again, and without a recording before the writer empties the pool."""

POOL_FIT = 1.25
"""A copy goes into a kept buffer at most this many times its size: the memory a pending copy holds over its
bytes (counted against ``write_buffer`` with them, see :attr:`~skipweave.store.staging.Staged.memory`)."""


class CopyPool:
    """Buffers (flat ``uint8`` CPU tensors) that copies of recorded tensors are made into and handed back to."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: list[tuple[float, Any]] = []  # (monotonic seconds when handed back, buffer), oldest first
        self._bytes = 0

    @property
    def kept_bytes(self) -> int:
        """Bytes of buffers kept now."""
        with self._lock:
            return self._bytes

    def copy(self, tensor: Any) -> tuple[Any, Any | None]:
        """A copy of ``tensor`` (a CPU tensor, as the codec stages them) and the buffer it lives in, to hand
        back with :meth:`give` once nothing reads the copy any more; ``None`` for a plain ``clone`` (small, not
        contiguous, or of a dtype a byte buffer cannot be viewed as)."""
        import torch

        nbytes = tensor.numel() * tensor.element_size()
        if nbytes < POOL_MIN_BYTES or tensor.device.type != "cpu" or not tensor.is_contiguous():
            return tensor.clone(), None
        buffer = self._take(nbytes)
        try:
            if buffer is None:
                buffer = torch.empty(nbytes, dtype=torch.uint8)
            copy = buffer[:nbytes].view(tensor.dtype).view(tensor.shape)
        except (RuntimeError, TypeError):  # a dtype a byte buffer cannot be viewed as: a plain clone
            if buffer is not None:
                self.give([buffer])
            return tensor.clone(), None
        copy.copy_(tensor)
        return copy, buffer

    def _take(self, nbytes: int) -> Any | None:
        """The smallest kept buffer of ``nbytes`` up to :data:`POOL_FIT` times as many (a much larger one stays
        for a larger copy)."""
        with self._lock:
            self._drop_stale_locked()
            fits = [i for i, (_, b) in enumerate(self._free) if nbytes <= b.numel() <= nbytes * POOL_FIT]
            if not fits:
                return None
            _, best = self._free.pop(min(fits, key=lambda i: self._free[i][1].numel()))
            self._bytes -= best.numel()
            return best

    def give(self, buffers: list[Any] | tuple[Any, ...]) -> None:
        """Hand back buffers :meth:`copy` returned, once nothing reads their copies. The newest are kept: the
        oldest go when the pool would hold over :data:`POOL_MAX_BYTES`, and a buffer not taken again within
        :data:`POOL_IDLE_S` goes (its size is no longer recorded: the rollouts got longer, say)."""
        now = time.monotonic()
        with self._lock:
            for buffer in buffers:
                if buffer.numel() > POOL_MAX_BYTES:
                    continue
                self._free.append((now, buffer))
                self._bytes += buffer.numel()
                while self._bytes > POOL_MAX_BYTES:
                    self._bytes -= self._free.pop(0)[1].numel()
            self._drop_stale_locked()

    def _drop_stale_locked(self) -> None:
        cutoff = time.monotonic() - POOL_IDLE_S
        while self._free and self._free[0][0] < cutoff:  # (kept oldest first)
            self._bytes -= self._free.pop(0)[1].numel()

    def after_fork(self) -> None:
        """In a forked child: start empty, with a lock of its own (another thread may have held the parent's)."""
        self.__init__()  # type: ignore[misc]

    def clear(self) -> None:
        """Let every kept buffer go."""
        with self._lock:
            if self._free:
                logger.debug("skipweave: releasing %d bytes of copy buffers", self._bytes)
            self._free, self._bytes = [], 0


POOL = CopyPool()
