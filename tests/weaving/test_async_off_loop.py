"""``async`` targets read and write the store off their event loop, and still record what the call left.

Real wrapt patches over a real host module and a real store. The store's ``record_own`` and ``load`` are wrapped
(calling through) only to note which thread ran them and whether an event loop was running there.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

import skipweave
from skipweave.store.step_store import StepStore

HOST = '''
import asyncio
import torch

TICKS = []


class Engine:
    def __init__(self):
        self.seen = 0

    async def generate(self, step, size):
        await asyncio.sleep(0)
        self.seen += 1
        torch.rand(1)  # the call moves the RNG; a replay must leave it where the call did
        return {"step": step, "tokens": torch.full((size,), step, dtype=torch.int64)}
'''


@pytest.fixture
def mod(host_module: Any) -> Any:
    name, _ = host_module(HOST)
    return sys.modules[name]


def _spy(monkeypatch: pytest.MonkeyPatch, name: str, seen: list[tuple[str, bool]]) -> None:
    real = getattr(StepStore, name)

    def spied(self: StepStore, *args: Any, **kwargs: Any) -> Any:
        try:
            asyncio.get_running_loop()
            on_loop = True
        except RuntimeError:
            on_loop = False
        seen.append((threading.current_thread().name, on_loop))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(StepStore, name, spied)


def test_records_and_replays_of_async_targets_run_off_the_event_loop(mod: Any, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, bool]] = []
    io: list[tuple[str, bool]] = []
    _spy(monkeypatch, "stage", seen)
    for name in ("commit", "commit_many", "prepare_part", "is_complete", "part_calls", "recorded_steps"):
        _spy(monkeypatch, name, io)
    _spy(monkeypatch, "load", seen)
    plan = {"skip": {"rollout": {"enable": True, "dump_dir": str(tmp_path), "step": {"source": "arg", "arg": 0,
                                                                                      "path": ""},
                                 "effects": ["self.seen"], "targets": {"g": f"{mod.__name__}:Engine.generate"}}}}
    engine = mod.Engine()

    async def steps(n: int) -> list[Any]:
        together = await asyncio.gather(*(engine.generate(s, 1 << 20) for s in range(1, n + 1)))
        one_by_one = [await engine.generate(s, 1 << 10) for s in range(n + 1, 2 * n + 1)]
        return [*together, *one_by_one]

    skipweave.weave(plan)
    torch.manual_seed(0)
    recorded = asyncio.run(steps(4))
    after_record = torch.rand(1)
    skipweave.unweave()
    assert seen and all(not on_loop for _, on_loop in seen), seen  # every record in a worker thread
    assert len(seen) == 8
    assert io and all(not on_loop for _, on_loop in io), io  # the step's choice and the writes too

    seen.clear()
    io.clear()
    engine.seen = 0
    hits = skipweave.counters()["hits"]
    skipweave.weave(plan)
    torch.manual_seed(0)
    replayed = asyncio.run(steps(4))
    assert torch.equal(torch.rand(1), after_record)  # the RNG left as the last real call left it
    assert len(seen) == 8 and all(not on_loop for _, on_loop in seen), seen  # every load in a worker thread
    assert all(not on_loop for _, on_loop in io), io
    for a, b in zip(recorded, replayed, strict=True):
        assert a["step"] == b["step"] and torch.equal(a["tokens"], b["tokens"])
    assert engine.seen == 8  # the effect put back (the recorded value after the last real call)
    assert skipweave.counters()["hits"] - hits == 8
