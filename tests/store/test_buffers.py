"""Reused copy buffers (skipweave.store.buffers): real tensors, the real pool, and the real background writer."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import skipweave
from skipweave.store import buffers, write_behind
from skipweave.store.buffers import POOL_MIN_BYTES, CopyPool
from skipweave.store.commit import Committer

MB = 1 << 20


def test_a_copy_owns_its_memory_and_reuses_a_buffer_handed_back() -> None:
    pool = CopyPool()
    x = torch.arange(MB // 8, dtype=torch.int64)
    copy, buffer = pool.copy(x)
    assert buffer is not None and torch.equal(copy, x) and copy.data_ptr() != x.data_ptr()
    x.fill_(0)
    assert copy[-1] == MB // 8 - 1  # the host's later change is not in the copy
    pool.give([buffer])
    assert pool.kept_bytes == MB
    y = torch.ones(MB // 4, dtype=torch.float32)  # same bytes, another dtype and shape
    again, reused = pool.copy(y)
    assert reused is buffer and again.data_ptr() == buffer.data_ptr() and torch.equal(again, y)
    assert pool.kept_bytes == 0


def test_small_odd_and_mismatched_tensors_are_plain_clones() -> None:
    pool = CopyPool()
    small = torch.arange(10)
    copy, buffer = pool.copy(small)
    assert buffer is None and torch.equal(copy, small)
    strided = torch.arange(2 * MB // 8, dtype=torch.int64)[::2]  # not contiguous
    copy, buffer = pool.copy(strided)
    assert buffer is None and torch.equal(copy, strided)
    _, big = pool.copy(torch.zeros(4 * MB, dtype=torch.uint8))
    assert big is not None
    pool.give([big])
    _, other = pool.copy(torch.zeros(POOL_MIN_BYTES, dtype=torch.uint8))  # a quarter of it: a buffer of its own
    assert other is not None and other is not big and pool.kept_bytes == 4 * MB


def test_the_best_fit_is_taken_wherever_it_is_kept() -> None:
    """Rollout lengths change from step to step: buffers of several sizes are kept, the best fit is taken."""
    pool = CopyPool()
    bufs = [pool.copy(torch.zeros(n * MB, dtype=torch.uint8))[1] for n in (4, 2, 3)]
    pool.give(bufs)
    _, two = pool.copy(torch.zeros(2 * MB, dtype=torch.uint8))
    _, three = pool.copy(torch.zeros(int(2.5 * MB), dtype=torch.uint8))  # 3 MB is within 1.25x, 4 MB is not
    assert two is bufs[1] and three is bufs[2] and pool.kept_bytes == 4 * MB


def test_the_pool_keeps_the_newest_buffers_within_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(buffers, "POOL_MAX_BYTES", 3 * MB)
    pool = CopyPool()
    old, new = (pool.copy(torch.zeros(2 * MB, dtype=torch.uint8))[1] for _ in range(2))
    pool.give([old])
    pool.give([new])  # the older one goes to make room
    assert pool.kept_bytes == 2 * MB and pool._take(2 * MB) is new
    pool.give([pool.copy(torch.zeros(4 * MB, dtype=torch.uint8))[1]])  # over the bound alone: not kept
    assert pool.kept_bytes == 0
    pool.give([old])
    pool.clear()
    assert pool.kept_bytes == 0


def test_a_buffer_not_taken_again_goes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A size no longer recorded (the rollouts got longer) is not kept for the rest of a run."""
    monkeypatch.setattr(buffers, "POOL_IDLE_S", 0.05)
    pool = CopyPool()
    stale, fresh = (pool.copy(torch.zeros(n * MB, dtype=torch.uint8))[1] for n in (2, 3))
    pool.give([stale])
    time.sleep(0.1)
    pool.give([fresh])
    assert pool.kept_bytes == 3 * MB and pool._take(2 * MB) is None


HOST = '''
import torch


def gen(step, value):
    return {"ids": torch.full((1 << 18,), value, dtype=torch.int64)}  # 2 MB
'''


def test_large_results_recorded_back_to_back_keep_their_own_bytes(host_module: Any, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Each entry's buffer goes back only once it is written: the next copies reuse it, never an entry still
    pending. The writer lets the buffers go once idle."""
    name, _ = host_module(HOST)
    m = sys.modules[name]
    plan = {"skip": {"rollout": {"enable": True, "dump_dir": str(tmp_path), "calls_per_step": 1,
                                 "step": {"source": "arg", "arg": 0, "path": ""}, "targets": {"g": f"{name}:gen"}}}}
    write_behind.POOL.clear()
    opened, entered = threading.Event(), threading.Event()
    real = Committer._write

    def held(self: Committer, *args: Any, **kwargs: Any) -> Any:  # the writer waits here until the gate opens
        if threading.current_thread().name == "skipweave-writer":
            entered.set()
            assert opened.wait(60)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Committer, "_write", held)
    skipweave.weave(plan)
    try:
        m.gen(1, 1)["ids"].fill_(-1)  # the host reuses its memory at once
        assert entered.wait(30)  # the writer holds step 1's entry, unwritten
        for step in range(2, 9):
            m.gen(step, step)["ids"].fill_(-1)
    finally:
        opened.set()
    skipweave.flush()
    assert write_behind.POOL.kept_bytes >= 2 * MB  # handed back after their writes
    monkeypatch.setattr(write_behind, "POOL_IDLE_S", 0.05)
    skipweave.unweave()
    skipweave.weave(plan)
    for step in range(1, 9):
        assert m.gen(step, 0)["ids"].eq(step).all()  # replayed: each step's own values
    skipweave.unweave()
    skipweave.weave(plan)
    m.gen(9, 9)  # wakes the writer, which then waits with the short idle time
    skipweave.flush()
    skipweave.unweave()
    deadline = time.monotonic() + 10
    while write_behind.POOL.kept_bytes and time.monotonic() < deadline:
        time.sleep(0.05)
    assert write_behind.POOL.kept_bytes == 0
