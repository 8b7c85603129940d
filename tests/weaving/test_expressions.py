"""Expressions in a profile: the step and the bypass read from ``self``, echoed live values, declared side effects.

The host is shaped like a ``transformers.Trainer``: the step is ``self.state.global_step`` (from 0), evaluation
calls the same generation method while ``self.model.training`` is False, and the method appends to
``self._metrics`` and adds to ``self.state.num_input_tokens_seen``. A replay must leave the trainer exactly as
the real call did.
"""

from __future__ import annotations

import logging
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

import skipweave
from skipweave.config.errors import ConfigError

HOST = '''
from collections import defaultdict
import torch

CALLS = []


class State:
    def __init__(self):
        self.global_step = 0
        self.num_input_tokens_seen = 0


class Model:
    training = True


class Trainer:
    def __init__(self):
        self.state = State()
        self.model = Model()
        self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}

    def generate(self, prompts):
        CALLS.append((self.state.global_step, self.model.training))
        out = {"tokens": torch.randint(0, 100, (2, 4)), "request": "filled by the host"}
        mode = "train" if self.model.training else "eval"
        self._metrics[mode]["length"].append(float(out["tokens"].float().mean()))
        self.state.num_input_tokens_seen += len(prompts["text"])
        return out
'''


def profile(name: str, dump: Path, **role: Any) -> dict[str, Any]:
    return {"skip": {"rollout": {
        "enable": True, "dump_dir": str(dump), "targets": {"gen": f"{name}:Trainer.generate"},
        "step": {"expr": "self.state.global_step"},
        "bypass": {"expr": "not self.model.training"},
        "effects": ["self._metrics['train']", "self.state.num_input_tokens_seen"],
        "echo": {"result['request']": "prompts['request']"},
        **role,
    }}}


def train(m: Any) -> tuple[Any, list[Any]]:
    trainer, outs = m.Trainer(), []
    keep = trainer._metrics["train"]  # the host holds references to its containers: they must stay the same
    for step in range(4):
        trainer.state.global_step = step
        outs.append(trainer.generate({"text": "abc" * (step + 1), "request": uuid.uuid4().hex}))
        if step == 2:
            trainer.model.training = False
            trainer.generate({"text": "eval", "request": "e"})
            trainer.model.training = True
    assert trainer._metrics["train"] is keep
    return trainer, outs


def test_a_trainer_shaped_host_replays_its_side_effects_and_runs_evaluation_live(host_module: Any,
                                                                               tmp_path: Path) -> None:
    name, _ = host_module(HOST)
    m = sys.modules[name]
    skipweave.weave(profile(name, tmp_path / "dump"))
    first, outs1 = train(m)
    skipweave.unweave()
    assert len(m.CALLS) == 5
    m.CALLS.clear()
    skipweave.weave(profile(name, tmp_path / "dump"))
    second, outs2 = train(m)
    skipweave.unweave()
    assert m.CALLS == [(2, False)]  # evaluation only: every training step was replayed
    assert second.state.num_input_tokens_seen == first.state.num_input_tokens_seen == 3 + 6 + 9 + 12 + len("eval")
    assert dict(second._metrics["train"]) == dict(first._metrics["train"])
    assert type(second._metrics["train"]).__name__ == "defaultdict"
    for a, b in zip(outs1, outs2, strict=True):
        assert a["tokens"].tolist() == b["tokens"].tolist()
        assert a["request"] != b["request"]  # echoed from the live call, not the recording
    assert sorted(p.name for p in (tmp_path / "dump" / "default" / "rollout").iterdir()) == ["0", "1", "2", "3"]


def test_a_failing_step_expression_warns_once_and_runs_live(host_module: Any, tmp_path: Path, caplog: Any) -> None:
    name, _ = host_module(HOST)
    m = sys.modules[name]
    caplog.set_level(logging.WARNING)
    skipweave.weave(profile(name, tmp_path / "dump", step={"expr": "self.stat.global_step"}))
    trainer = m.Trainer()
    for _ in range(3):
        trainer.generate({"text": "x", "request": "r"})
    skipweave.unweave()
    warned = [r.getMessage() for r in caplog.records if "step.expr" in r.getMessage()]
    assert len(warned) == 2, warned  # once at the first call, and named as the cause when the role's summary closes
    assert "skip.rollout.step.expr 'self.stat.global_step' failed on an instance of Trainer" in warned[0]
    assert "AttributeError" in warned[0] and "run live and are not recorded" in warned[0]
    assert warned[1].startswith("skipweave: role rollout: none of its calls was eligible, so nothing was recorded or "
                                "replayed: skip.rollout.step.expr 'self.stat.global_step' failed on an instance of "
                                "Trainer: AttributeError"), warned
    assert warned[1].endswith("(on 3 of its 3 calls); fix skip.rollout.step.expr"), warned
    assert len(m.CALLS) == 3 and not (tmp_path / "dump" / "default" / "rollout" / "0").exists()


@pytest.mark.parametrize(("role", "key"), [
    ({"step": {"expr": "self.state.global_step +"}}, "skip.rollout.step.expr"),
    ({"bypass": {"expr": "not"}}, "skip.rollout.bypass.expr"),
    ({"effects": ["len(self._metrics)"]}, "skip.rollout.effects[0]"),
    ({"echo": {"result": "prompts['request']"}}, "skip.rollout.echo['result']"),
    ({"step": {"source": "attr", "expr": "self.x"}}, "skip.rollout.step.expr"),
])
def test_a_bad_expression_is_a_config_error_naming_the_key(host_module: Any, tmp_path: Path, role: dict[str, Any],
                                                          key: str) -> None:
    name, _ = host_module(HOST)
    with pytest.raises(ConfigError) as info:
        skipweave.weave(profile(name, tmp_path / "dump", **role))
    assert str(info.value).startswith(key), info.value


def test_a_wrong_step_path_names_the_key_and_what_the_argument_holds(host_module: Any, tmp_path: Path,
                                                                    caplog: Any) -> None:
    name, _ = host_module(HOST)
    m = sys.modules[name]
    caplog.set_level(logging.WARNING)
    role = {"step": {"source": "arg", "arg": "prompts", "path": "meta.step"}, "bypass": None}
    cfg = profile(name, tmp_path / "dump", **role)
    del cfg["skip"]["rollout"]["effects"], cfg["skip"]["rollout"]["echo"]
    skipweave.weave(cfg)
    m.Trainer().generate({"text": "x", "request": "r"})
    skipweave.unweave()
    msg, closing = [r.getMessage() for r in caplog.records if "skip.rollout.step.path" in r.getMessage()]
    assert "'meta.step' (source arg) gave nothing (path missing)" in msg
    assert "argument 'prompts' is a dict with keys ['text', 'request']" in msg
    assert closing.startswith("skipweave: role rollout: none of its calls was eligible, so nothing was recorded or "
                              "replayed: skip.rollout.step.path 'meta.step' (source arg) gave nothing"), closing
    assert closing.endswith("(on 1 of its 1 calls); fix skip.rollout.step.path"), closing


def test_a_parameter_named_like_a_builtin_is_the_parameter_and_comprehension_names_stay_their_own(
        host_module: Any, tmp_path: Path) -> None:
    name, _ = host_module('''
def gen(batch, type="train"):
    return {"batch": batch, "type": type}
''')
    mod = sys.modules[name]
    skipweave.weave({"skip": {"rollout": {"enable": True, "dump_dir": str(tmp_path), "targets": {"g": f"{name}:gen"},
                                          "bypass": {"expr": "type == 'eval'"},
                                          "step": {"expr": "batch + sum(1 for batch in range(0))"}}}})
    before = skipweave.counters()
    mod.gen(1, "eval")  # `type` is the parameter, not the builtin: an evaluation call, bypassed
    mod.gen(2)
    after = skipweave.counters()
    assert (after["bypasses"] - before["bypasses"], after["misses"] - before["misses"]) == (1, 1)
    skipweave.flush()  # the background writer's entries on disk
    assert (tmp_path / "default" / "rollout" / "2").is_dir()  # the outer `batch` is the parameter: step 2
