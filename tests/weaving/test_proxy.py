"""Proxy decisions with real patches and a real store: actions, steps, bypass, RNG, fingerprints, failures."""

from __future__ import annotations

import logging
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import skipweave
from skipweave.weaving.proxy import FingerprintMismatch
from tests.conftest import HOST_SOURCE


def _run(mod: Any, steps: list[int], cfg: dict[str, Any], validate_at: int | None = None) -> list[Any]:
    skipweave.unweave()
    skipweave.weave(cfg)
    g = mod.Gen()
    outs = []
    for s in steps:
        if validate_at == s:
            g.generate(mod.Batch(step=s, validate=True))
        outs.append(g.generate(mod.Batch(step=s)))
    return outs


def _cfg(dump: Path, name: str, **role: Any) -> dict[str, Any]:
    return {"skip": {"rollout": {"enable": True, "convention": "verl", "dump_dir": str(dump),
                                 "targets": {"g": f"{name}.Gen.generate"}, **role}}}


def _served(outs: list[Any]) -> list[Any]:
    return [o.meta_info["skipweave"]["served_step"] for o in outs]


@pytest.fixture
def mod(host_module: Any) -> Any:
    name, _ = host_module(HOST_SOURCE)
    return sys.modules[name]


def test_cache_records_each_step_and_replays_it(mod: Any, tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, mod.__name__, steps=[1, "3-4"])
    live = _run(mod, [1, 2, 3, 4], cfg, validate_at=3)
    assert len(mod.CALLS) == 5
    assert [o.meta_info["skipweave"]["status"] for o in live] == ["miss", "bypass", "miss", "miss"]
    skipweave.flush()  # the background writer's entries on disk
    assert sorted(p.name for p in (tmp_path / "default" / "rollout").iterdir()) == ["1", "3", "4"]
    again = _run(mod, [1, 2, 3, 4], cfg, validate_at=3)
    assert len(mod.CALLS) == 5 + 2  # step 2 (not eligible) and the validation call ran live
    assert [o.meta_info["skipweave"]["status"] for o in again] == ["hit", "bypass", "hit", "hit"]
    for a, b in zip(live, again, strict=False):
        if b.meta_info["skipweave"]["status"] == "hit":
            assert torch.equal(a.batch["y"], b.batch["y"])


def test_repeat_serves_nearest_earlier_then_later(mod: Any, tmp_path: Path) -> None:
    name = mod.__name__
    _run(mod, [3, 5], _cfg(tmp_path, name, steps=[3, 5]))
    outs = _run(mod, [1, 3, 4, 5, 9], _cfg(tmp_path, name, action="repeat"))
    assert _served(outs) == [3, 3, 3, 5, 5]
    assert len(mod.CALLS) == 2


def test_repeat_records_only_when_nothing_is_recorded(mod: Any, tmp_path: Path) -> None:
    outs = _run(mod, [1, 2, 3], _cfg(tmp_path, mod.__name__, action="repeat"))
    assert [o.meta_info["skipweave"]["status"] for o in outs] == ["miss", "hit", "hit"]
    assert len(mod.CALLS) == 1


def test_repeat_cycle_and_repeat_last_over_record_steps(mod: Any, tmp_path: Path) -> None:
    name = mod.__name__
    outs = _run(mod, [1, 2, 3, 4, 5], _cfg(tmp_path / "c", name, action="repeat_cycle", record_steps="1-2"))
    assert _served(outs) == [None, None, 1, 2, 1]
    outs = _run(mod, [1, 2, 3, 4], _cfg(tmp_path / "l", name, action="repeat_last", record_steps="1-2"))
    assert _served(outs) == [None, None, 2, 2]


def test_bypassed_call_advances_no_counter(mod: Any, tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, mod.__name__, step={"source": "counter"})
    skipweave.weave(cfg)
    g = mod.Gen()
    g.generate(mod.Batch(validate=True))
    g.generate(mod.Batch())
    g.generate(mod.Batch(validate=True))
    g.generate(mod.Batch())
    skipweave.flush()  # the background writer's entries on disk
    assert sorted(p.name for p in (tmp_path / "default" / "rollout").iterdir()) == ["1", "2"]


def test_several_calls_per_step_replay_in_order(mod: Any, tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, mod.__name__)
    live = _run(mod, [1, 1, 1, 2], cfg)
    again = _run(mod, [1, 1, 1, 2], cfg)
    assert len(mod.CALLS) == 4
    for a, b in zip(live, again, strict=False):
        assert torch.equal(a.batch["y"], b.batch["y"])


@pytest.mark.parametrize("restore", [True, False])
def test_replay_restores_rng_state_the_real_call_left(mod: Any, tmp_path: Path, restore: bool) -> None:
    cfg = _cfg(tmp_path, mod.__name__, restore_rng=restore)

    def one_run() -> tuple[float, float, float]:
        random.seed(0)
        np.random.seed(0)
        torch.manual_seed(0)
        _run(mod, [1], cfg)
        return random.random(), float(np.random.rand()), float(torch.rand(1))

    live, replay = one_run(), one_run()
    assert (live == replay) is restore


def test_replay_leaves_the_generators_the_call_did_not_touch(mod: Any, tmp_path: Path) -> None:
    """Gen.generate draws from torch and Python's random, never from numpy: a hit restores those two and leaves
    numpy as the host has it, as the real call would have."""
    cfg = _cfg(tmp_path, mod.__name__)
    np.random.seed(0)
    torch.manual_seed(0)
    _run(mod, [1], cfg)
    live_torch = float(torch.rand(1))
    skipweave.flush()
    np.random.seed(1)
    expected = np.random.rand(3)
    np.random.seed(1)
    torch.manual_seed(5)  # torch differs before the call: the hit sets it to what the call left
    outs = _run(mod, [1], cfg)
    assert outs[0].meta_info["skipweave"]["status"] == "hit"
    assert np.array_equal(np.random.rand(3), expected) and float(torch.rand(1)) == live_torch


def test_rng_marks_that_fail_never_fail_the_call(mod: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """(a broken CUDA setup, say): the call returns, the next ones are still recorded, with the whole state."""
    from skipweave.weaving import record

    def broken() -> Any:
        raise RuntimeError("CUDA error: unspecified launch failure")

    monkeypatch.setattr(record, "rng_marks", broken)
    outs = _run(mod, [1, 2], _cfg(tmp_path, mod.__name__))
    assert [o.meta_info["skipweave"]["status"] for o in outs] == ["miss", "miss"]
    skipweave.flush()
    again = _run(mod, [1, 2], _cfg(tmp_path, mod.__name__))
    assert [o.meta_info["skipweave"]["status"] for o in again] == ["hit", "hit"]


def test_fingerprint_mismatch_warn_regenerate_error(mod: Any, tmp_path: Path, caplog: Any) -> None:
    name = mod.__name__
    skipweave.weave(_cfg(tmp_path, name))
    mod.Gen().generate(mod.Batch(step=1))

    def replay(policy: str) -> Any:
        skipweave.unweave()
        skipweave.weave(_cfg(tmp_path, name, fingerprint={"on_mismatch": policy}))
        return mod.Gen().generate(mod.Batch(step=1, x=torch.arange(4) * 7))

    with caplog.at_level(logging.WARNING):
        out = replay("warn")
    assert out.meta_info["skipweave"]["status"] == "hit" and "inputs differ" in caplog.text
    with pytest.raises(FingerprintMismatch, match="fingerprint.on_mismatch"):
        replay("error")
    out = replay("regenerate")
    assert out.meta_info["skipweave"]["status"] == "miss" and len(mod.CALLS) == 2
    out = replay("error")  # the regenerated entry matches the new inputs
    assert out.meta_info["skipweave"]["status"] == "hit"


def test_uid_is_ignored_by_default_fingerprint(mod: Any, tmp_path: Path, caplog: Any) -> None:
    cfg = _cfg(tmp_path, mod.__name__, fingerprint={"on_mismatch": "error"})
    _run(mod, [1], cfg)
    outs = _run(mod, [1], cfg)  # Batch() draws a fresh random uid each time
    assert outs[0].meta_info["skipweave"]["status"] == "hit"


def test_step_sources_attr_kwarg_regex(host_module: Any, tmp_path: Path) -> None:
    name, _ = host_module('''
import torch
CALLS = []
class State:
    global_step = 0
class Trainer:
    def __init__(self):
        self.state = State()
    def rollout(self, prompts):
        CALLS.append(self.state.global_step)
        return torch.rand(2)
def gen(prompts, *, step):
    CALLS.append(step)
    return torch.rand(2)
def sample(sample_id):
    CALLS.append(sample_id)
    return torch.rand(2)
''')
    m = sys.modules[name]
    cfg = {"skip": {
        "a": {"enable": True, "convention": "verl",
              "dump_dir": str(tmp_path), "targets": {"t": f"{name}.Trainer.rollout"},
              "step": {"source": "attr", "path": "state.global_step"}},
        "b": {"enable": True, "convention": "verl", "dump_dir": str(tmp_path), "targets": {"t": f"{name}.gen"},
              "step": {"source": "arg", "arg": "step", "path": ""}},
        "c": {"enable": True, "convention": "verl", "dump_dir": str(tmp_path), "targets": {"t": f"{name}.sample"},
              "step": {"source": "regex", "arg": 0, "path": "", "pattern": r"sample_\d+_(\d+)$"}},
    }}
    skipweave.weave(cfg)
    t = m.Trainer()
    t.state.global_step = 7
    t.rollout("p")
    m.gen("p", step=4)
    m.sample("sample_0_12")
    root = tmp_path / "default"
    skipweave.flush()  # the background writer's entries on disk
    assert [p.name for p in (root / "a").iterdir()] == ["7"]
    assert [p.name for p in (root / "b").iterdir()] == ["4"]
    assert [p.name for p in (root / "c").iterdir()] == ["12"]


def test_unencodable_result_is_returned_live_and_nothing_is_written(host_module: Any, tmp_path: Path,
                                                                    caplog: Any) -> None:
    name, _ = host_module('''
import threading
class Gen:
    def generate(self, b):
        return threading.Lock()
''')
    m = sys.modules[name]
    skipweave.weave({"skip": {"r": {"enable": True, "convention": "verl",
                                    "dump_dir": str(tmp_path), "targets": {"g": f"{name}.Gen.generate"},
                                    "step": "counter"}}})
    with caplog.at_level(logging.WARNING):
        out = m.Gen().generate(None)
    assert type(out).__name__ == "lock"
    assert "allow_pickle" in caplog.text
    assert not list(tmp_path.rglob("*.manifest.json")) and not list(tmp_path.rglob(".tmp-*"))
    assert skipweave.counters()["record_failures"] >= 1


def test_pickled_entry_is_refused_without_opt_in(host_module: Any, tmp_path: Path, caplog: Any) -> None:
    name, _ = host_module('''
import fractions
CALLS = []
class Gen:
    def generate(self, b):
        CALLS.append(1)
        return fractions.Fraction(1, 3)
''')
    m = sys.modules[name]
    role = {"enable": True, "convention": "verl",
            "dump_dir": str(tmp_path), "targets": {"g": f"{name}.Gen.generate"}, "step": "counter"}
    skipweave.weave({"skip": {"r": {**role, "allow_pickle": True}}})
    m.Gen().generate(None)
    skipweave.unweave()
    skipweave.weave({"skip": {"r": {**role, "allow_pickle": True}}})
    assert m.Gen().generate(None) == m.fractions.Fraction(1, 3) and m.CALLS == [1]
    skipweave.unweave()
    skipweave.weave({"skip": {"r": role}})
    with caplog.at_level(logging.WARNING, logger="skipweave"):
        assert m.Gen().generate(None) == m.fractions.Fraction(1, 3)  # refused: never unpickled, runs live
    assert m.CALLS == [1, 1] and "recorded with allow_pickle=true" in caplog.text
    assert list((tmp_path / "default" / "r" / "_set_aside").iterdir())  # kept for the user, never deleted


def test_fingerprint_shards_keep_different_inputs_apart(mod: Any, tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, mod.__name__, shard="fingerprint")
    a = _run(mod, [1], cfg)[0]
    skipweave.unweave()
    skipweave.weave(cfg)
    b = mod.Gen().generate(mod.Batch(step=1, x=torch.arange(4) * 3))
    assert b.meta_info["skipweave"]["status"] == "miss"
    skipweave.unweave()
    skipweave.weave(cfg)
    b2 = mod.Gen().generate(mod.Batch(step=1, x=torch.arange(4) * 3))
    a2 = mod.Gen().generate(mod.Batch(step=1))
    assert torch.equal(a2.batch["y"], a.batch["y"]) and torch.equal(b2.batch["y"], b.batch["y"])
    assert len(mod.CALLS) == 2


def test_threads_of_one_process_get_their_own_recording_with_fingerprint_shards(mod: Any, tmp_path: Path) -> None:
    import threading

    cfg = _cfg(tmp_path, mod.__name__, shard="fingerprint")
    inputs = {"a": torch.arange(4), "b": torch.arange(4) * 3}

    def play(order: list[str]) -> dict[str, Any]:
        skipweave.unweave()
        skipweave.weave(cfg)
        outs: dict[str, Any] = {}
        turn = {name: threading.Event() for name in order}

        def worker(name: str) -> None:
            turn[name].wait(10)
            outs[name] = mod.Gen().generate(mod.Batch(step=1, x=inputs[name]))
            nxt = order.index(name) + 1
            if nxt < len(order):
                turn[order[nxt]].set()

        threads = [threading.Thread(target=worker, args=(n,)) for n in inputs]
        for t in threads:
            t.start()
        turn[order[0]].set()
        for t in threads:
            t.join(10)
        return outs

    first = play(["a", "b"])
    again = play(["b", "a"])  # the other thread reaches the step first this time
    for name in inputs:
        assert again[name].meta_info["skipweave"]["status"] == "hit"
        assert torch.equal(again[name].batch["y"], first[name].batch["y"])
