"""Review 41: a decorated target's wrapper may give a parameter another default than the inner function's, so a
value passed equal to the inner default is not the call that left it out (two inputs, one fingerprint, one entry
served for both, was the finding)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

import skipweave
from skipweave.weaving.binding import binding_of

HOST = '''
import functools

import torch
import wrapt

CALLS = []


def with_temperature(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        kwargs.setdefault("temperature", 0.7)  # the wrapper's own default
        return fn(*args, **kwargs)
    return wrapper


@wrapt.decorator
def with_n(wrapped, instance, args, kwargs):
    kwargs.setdefault("n", 5)
    return wrapped(*args, **kwargs)


@with_temperature
def gen(batch, step, temperature=1.0):
    CALLS.append(("gen", temperature))
    return {"v": torch.tensor([float(batch) * temperature * 10, float(step)])}


@with_n
def gen_n(batch, step, n=1):
    CALLS.append(("gen_n", n))
    return {"v": torch.tensor([float(batch) * n, float(step)])}


def plain(batch, step, n=1):
    return {"v": torch.tensor([float(batch) * n, float(step)])}
'''


def test_a_decorated_target_leaves_no_explicit_value_out_as_its_inner_default(host_module: Any) -> None:
    name, _ = host_module(HOST)
    m = sys.modules[name]
    for attr, param, value in (("gen", "temperature", 1.0), ("gen_n", "n", 1)):
        binding = binding_of(getattr(m, attr), m)
        assert binding is not None
        assert binding.bind((3, 1), {}) == {"batch": 3, "step": 1}
        assert binding.bind((3, 1), {param: value}) == {"batch": 3, "step": 1, param: value}
        assert binding.bind((3,), {"step": 1}) == binding.bind((), {"batch": 3, "step": 1})  # forms still unified
    binding = binding_of(m.plain, m)  # an undecorated target keeps leaving its own defaults out
    assert binding is not None and binding.bind((3, 1), {"n": 1}) == {"batch": 3, "step": 1}


def test_a_decorated_target_replays_each_input_its_own_entry(host_module: Any, tmp_path: Path) -> None:
    name, _ = host_module(HOST)
    m = sys.modules[name]
    dump = tmp_path / "dump"
    plan = {"skip": {"rollout": {"enable": True, "dump_dir": str(dump),
                                 "step": {"source": "arg", "arg": "step", "path": ""},
                                 "fingerprint": {"on_mismatch": "error"},
                                 "targets": {"gen": f"{name}:gen", "gen_n": f"{name}:gen_n"}}}}
    skipweave.weave(plan)
    try:
        recorded = [m.gen(3, 1), m.gen(3, 1, temperature=1.0), m.gen_n(3, 1), m.gen_n(3, 1, n=1)]
    finally:
        skipweave.unweave()
    assert [r["v"][0].item() for r in recorded] == [21.0, 30.0, 15.0, 3.0]
    m.CALLS.clear()
    plan["skip"]["rollout"]["replay_only"] = True
    skipweave.weave(plan)
    try:  # the other order: each call is served by its own input's entry
        served = [m.gen(3, 1, temperature=1.0), m.gen(3, 1), m.gen_n(3, 1, n=1), m.gen_n(3, 1)]
    finally:
        skipweave.unweave()
    assert m.CALLS == []
    assert [s["v"][0].item() for s in served] == [30.0, 21.0, 3.0, 15.0]
    assert torch.equal(served[1]["v"], recorded[0]["v"])
