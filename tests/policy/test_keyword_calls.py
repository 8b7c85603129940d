"""A configured argument is the same parameter whether the host passes it by position or by keyword."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import skipweave
from skipweave.policy.access import MISSING, get_arg

HOST = '''
import torch

CALLS = []


class Batch:
    def __init__(self, step, validate=False):
        self.batch = {"x": torch.arange(3) + step}
        self.non_tensor_batch = {}
        self.meta_info = {"global_steps": step, "validate": validate}


class Manager:
    def generate_sequences(self, prompts, temperature=1.0):
        CALLS.append((prompts.meta_info["global_steps"], prompts.meta_info["validate"]))
        out = Batch(prompts.meta_info["global_steps"])
        out.batch["y"] = torch.rand(2)
        return out
'''


def test_get_arg_finds_a_positional_parameter_passed_by_keyword() -> None:
    positions = {"prompts": 0, "temperature": 1}
    assert get_arg((), {"prompts": "p"}, 0, positions) == "p"
    assert get_arg(("p",), {}, 0, positions) == "p"
    assert get_arg((), {"temperature": 2}, 1, positions) == 2
    assert get_arg((), {"other": 1}, 0, positions) is MISSING
    assert get_arg((), {"prompts": "p"}, 0, None) is MISSING  # no signature: nothing to map


def test_keyword_and_positional_calls_are_treated_alike(host_module: Any, tmp_path: Path) -> None:
    name, _ = host_module(HOST)
    m = sys.modules[name]
    cfg = {"skip": {"rollout": {"enable": True, "convention": "verl", "dump_dir": str(tmp_path),
                                "targets": {"gen": f"{name}:Manager.generate_sequences"}}}}
    skipweave.weave(cfg)
    mgr = m.Manager()
    val = mgr.generate_sequences(prompts=m.Batch(1, validate=True))  # keyword: still a validation call
    assert val.meta_info["skipweave"]["status"] == "bypass"
    kw = mgr.generate_sequences(prompts=m.Batch(2))  # keyword: step 2 from meta_info, recorded
    pos = mgr.generate_sequences(m.Batch(3))
    assert [kw.meta_info["skipweave"]["step"], pos.meta_info["skipweave"]["step"]] == [2, 3]
    skipweave.unweave()
    skipweave.weave(cfg)
    m.CALLS.clear()
    a = mgr.generate_sequences(m.Batch(2))  # recorded by keyword, replayed by position
    b = mgr.generate_sequences(prompts=m.Batch(3), temperature=0.5)  # and the other way round
    c = mgr.generate_sequences(prompts=m.Batch(1, validate=True))
    assert [a.meta_info["skipweave"]["status"], b.meta_info["skipweave"]["status"]] == ["hit", "hit"]
    assert c.meta_info["skipweave"]["status"] == "bypass" and m.CALLS == [(1, True)]
    assert not (tmp_path / "default" / "rollout" / "1").exists()  # the validation call was never recorded
