"""The front of a proxy and its compiled gate decide exactly as the interpreted general path, only faster.

Every case is played twice on real wrapt patches and real stores: through the front and compiled gate that
``weave`` installs, and through a reference proxy that has neither (it overrides ``__call__``, so it is
installed itself, and sets ``compiled_gate = False``: the interpreted predicate and ``StepSource.step_for``).
Status annotations, counters and live calls must agree call by call, for every step-source/bypass shape.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import skipweave
from skipweave.weaving.proxy import SkipProxy, proxy_of

HOST = '''
from collections.abc import Mapping
from dataclasses import dataclass

from skipweave.weaving.proxy import SkipProxy

CALLS = []


class Batch:
    def __init__(self, meta):
        if meta is not None:
            self.meta_info = meta


class Meta(dict):
    pass


class MappingBatch(Mapping):
    """A Mapping that also has a meta_info attribute: its keys win in the general path."""

    def __init__(self, meta):
        self.meta_info = meta
        self._d = {"meta_info": {}}

    def __getitem__(self, k):
        return self._d[k]

    def __iter__(self):
        return iter(self._d)

    def __len__(self):
        return len(self._d)


@dataclass
class Out:
    meta_info: dict


class Unhashable(type):
    """A metaclass defining __eq__ without __hash__: its classes cannot sit in a set or an ABC cache."""

    def __eq__(cls, other):
        return cls is other


class OddBatch(metaclass=Unhashable):
    def __init__(self, meta):
        self.meta_info = meta


class FutureBatch:
    """Awaitable and carrying meta_info, like a host's own future of a batch."""

    def __init__(self, step):
        self.meta_info = {"step": step}

    def __await__(self):
        yield from ()
        return Out({"done": True})


def is_validation(args, kwargs):
    batch = args[0] if args else kwargs.get("batch")
    return bool(getattr(batch, "meta_info", {}).get("validate"))


def gen(batch, *, extra=None):
    meta = getattr(batch, "meta_info", None) or {}
    CALLS.append(meta.get("global_steps"))
    if meta.get("future"):
        return FutureBatch(meta.get("global_steps"))
    if meta.get("nested"):  # calls itself while its real call runs: the inner call must run bare
        inner = gen(Batch({"validate": True, "global_steps": meta["global_steps"]}))
        return Out({"step": meta.get("global_steps"), "inner": dict(inner.meta_info)})
    return Out({"step": meta.get("global_steps")})


class General(SkipProxy):
    compiled_gate = False

    def __call__(self, wrapped, instance, args, kwargs):
        return super().__call__(wrapped, instance, args, kwargs)


class State:
    pass


class Model:
    pass


class Trainer:
    """A transformers-style host: the step in ``self.state.global_step``, evaluation when not training."""

    def __init__(self):
        self.state = State()
        self.model = Model()

    def gen(self, batch=None, *, extra=None):
        return gen(batch, extra=extra)


TRAINER = Trainer()
'''


def _cases(mod: Any) -> list[tuple[str, tuple[Any, ...], dict[str, Any]]]:
    B = mod.Batch
    return [
        ("validation", (B({"validate": True, "global_steps": 2}),), {}),
        ("eligible step", (B({"global_steps": 3}),), {}),
        ("step not eligible", (B({"global_steps": 2}),), {}),
        ("validate False", (B({"validate": False, "global_steps": 2}),), {}),
        ("validate None", (B({"validate": None, "global_steps": 2}),), {}),
        ("validate 1", (B({"validate": 1, "global_steps": 2}),), {}),
        ("validate 0", (B({"validate": 0, "global_steps": 2}),), {}),
        ("validate np.bool_", (B({"validate": np.bool_(True), "global_steps": 3}),), {}),
        ("validate tensor", (B({"validate": torch.tensor([False, True]), "global_steps": 3}),), {}),
        ("validate empty list", (B({"validate": [], "global_steps": 2}),), {}),
        ("step as str", (B({"global_steps": "2"}),), {}),
        ("step as float", (B({"global_steps": 2.0}),), {}),
        ("step as np.int64", (B({"global_steps": np.int64(2)}),), {}),
        ("step as bool", (B({"global_steps": True}),), {}),
        ("step missing", (B({}),), {}),
        ("meta_info missing", (B(None),), {}),
        ("meta_info a dict subclass", (B(mod.Meta(global_steps=2)),), {}),
        ("batch by keyword", (), {"batch": B({"global_steps": 2})}),
        ("batch a Mapping", (mod.MappingBatch({"global_steps": 2}),), {}),
        ("keyword beside", (B({"global_steps": 2}),), {"extra": 1}),
        ("no arguments", (), {}),
        ("argument of an unhashable class", (mod.OddBatch({"global_steps": 2}),), {}),
        ("awaitable result with meta_info", (B({"global_steps": 2, "future": True}),), {}),
        ("nested call while recording", (B({"global_steps": 4, "nested": True}),), {}),
    ]


def _method_cases(mod: Any) -> list[tuple[str, dict[str, Any], tuple[Any, ...], dict[str, Any]]]:
    """(name, trainer state, args, kwargs): the step in ``self.state.global_step``, training in ``self.model``."""
    B = mod.Batch
    on = {"training": True}
    return [
        ("training step 3", {"global_step": 3, **on}, (B({}),), {}),
        ("training step 2", {"global_step": 2, **on}, (B({}),), {}),
        ("evaluation", {"global_step": 3, "training": False}, (B({}),), {}),
        ("training np.bool_", {"global_step": 4, "training": np.bool_(True)}, (B({}),), {}),
        ("training a tensor", {"global_step": 4, "training": torch.tensor([True, False])}, (B({}),), {}),
        ("training missing", {"global_step": 4}, (B({}),), {}),
        ("step as float", {"global_step": 3.0, **on}, (B({}),), {}),
        ("step as str", {"global_step": "4", **on}, (B({}),), {}),
        ("step as np.int64", {"global_step": np.int64(1), **on}, (B({}),), {}),
        ("step as bool", {"global_step": True, **on}, (B({}),), {}),
        ("step None", {"global_step": None, **on}, (B({}),), {}),
        ("step missing", dict(on), (B({}),), {}),
        ("batch by keyword", {"global_step": 4, **on}, (), {"batch": B({"global_steps": 4})}),
        ("no arguments", {"global_step": 1, **on}, (), {}),
        ("validate flag in the batch", {"global_step": 1, **on}, (B({"validate": True, "global_steps": 1}),), {}),
    ]


FUNCTION_SHAPES: dict[str, dict[str, Any]] = {
    "verl defaults": {},
    "bypass never": {"bypass": {"when": "never"}},
    "two flags, one deep": {"bypass": {"paths": ["meta_info.validate", "meta_info.flags.eval"]}},
    "named argument": {"bypass": {"arg": "batch"}, "step": {"source": "arg", "arg": "batch"}},
    "expressions over a parameter": {"bypass": {"expr": "batch.meta_info.get('validate')"},
                                     "step": {"expr": "batch.meta_info['global_steps']"}},
    "counter": {"step": {"source": "counter"}},
}
METHOD_SHAPES: dict[str, dict[str, Any]] = {
    "attr step, expr bypass": {"step": {"source": "attr", "path": "state.global_step"},
                               "bypass": {"expr": "not self.model.training"}},
    "expr step, never bypass": {"step": {"expr": "self.state.global_step"}, "bypass": {"when": "never"}},
    "expr step, verl bypass": {"step": {"expr": "self.state.global_step"}},
    "attr step, callable bypass": {"step": {"source": "attr", "path": "state.global_step"},
                                   "bypass": {"when": "callable", "callable": "{mod}:is_validation"}},
}


def _set_state(mod: Any, state: dict[str, Any]) -> None:
    trainer = mod.TRAINER
    trainer.state.__dict__.clear()
    trainer.model.__dict__.clear()
    if "global_step" in state:
        trainer.state.global_step = state["global_step"]
    if "training" in state:
        trainer.model.training = state["training"]


def _play(mod: Any, dump: Path, proxy: str | None, shape: dict[str, Any] | None = None,
          method: bool = False) -> list[tuple[str, Any, int]]:
    skipweave.unweave()
    path = f"{mod.__name__}:Trainer.gen" if method else f"{mod.__name__}:gen"
    target: Any = path if proxy is None else {"path": path, "proxy": proxy}
    role = {"enable": True, "convention": "verl", "dump_dir": str(dump), "steps": [1, "3-4"], "targets": {"g": target}}
    for key, value in (shape or {}).items():
        role[key] = {k: v.format(mod=mod.__name__) if isinstance(v, str) else v for k, v in value.items()}
    skipweave.weave({"skip": {"rollout": role}})
    if method:
        cases = _method_cases(mod)
        call: Any = mod.TRAINER.gen
    else:
        cases = [(name, {}, args, kwargs) for name, args, kwargs in _cases(mod)]
        call = mod.gen
    seen = []
    for name, state, args, kwargs in cases:
        if method:
            _set_state(mod, state)
        before = skipweave.counters()
        calls = len(mod.CALLS)
        try:
            out = call(*args, **kwargs)
            mark = out.meta_info.get("skipweave", {})
            status = (type(out).__name__, mark.get("status"), mark.get("step"), out.meta_info.get("inner"))
        except Exception as exc:  # the general path may refuse an input; the front must refuse it too
            status = (type(exc).__name__, None, None, None)
        after = skipweave.counters()
        delta = tuple(after[k] - before[k] for k in ("hits", "misses", "bypasses"))
        seen.append((name, (status, delta), len(mod.CALLS) - calls))
    return seen


@pytest.fixture
def mod(host_module: Any) -> Any:
    name, _ = host_module(HOST)
    return sys.modules[name]


def test_the_front_is_installed_for_plain_defs_and_the_reference_is_the_proxy_itself(mod: Any,
                                                                                      tmp_path: Path) -> None:
    skipweave.weave({"skip": {"rollout": {"enable": True, "convention": "verl", "dump_dir": str(tmp_path), "steps": [1],
                                          "targets": {"g": f"{mod.__name__}:gen"}}}})
    wrapper = mod.gen._self_wrapper
    assert not isinstance(wrapper, SkipProxy) and isinstance(proxy_of(wrapper), SkipProxy)
    skipweave.unweave()
    skipweave.weave({"skip": {"rollout": {"enable": True, "convention": "verl", "dump_dir": str(tmp_path), "steps": [1],
                                          "targets": {"g": {"path": f"{mod.__name__}:gen",
                                                            "proxy": f"{mod.__name__}:General"}}}}})
    assert type(mod.gen._self_wrapper).__name__ == "General"


def test_front_and_general_path_agree_call_by_call(mod: Any, tmp_path: Path) -> None:
    for _ in range(2):  # the second round replays what the first recorded
        screened = _play(mod, tmp_path / "front", None)
        general = _play(mod, tmp_path / "general", f"{mod.__name__}:General")
        assert screened == general
    by_name = {name: outcome for name, outcome, _ in screened}
    assert by_name["validation"] == (("Out", "bypass", None, None), (0, 0, 1))
    assert by_name["step not eligible"] == (("Out", "bypass", 2, None), (0, 0, 1))
    assert by_name["eligible step"] == (("Out", "hit", 3, None), (1, 0, 0))
    assert by_name["awaitable result with meta_info"] == (("FutureBatch", "bypass", 2, None), (0, 0, 1))
    # recorded in round one with the inner call bare (no annotation, no count), replayed in round two
    assert by_name["nested call while recording"] == (("Out", "hit", 4, {"step": 4}), (1, 0, 0))


@pytest.mark.parametrize("shape", list(FUNCTION_SHAPES))
def test_every_shape_of_a_function_target_agrees_with_the_interpreted_gate(mod: Any, tmp_path: Path,
                                                                           shape: str) -> None:
    for _ in range(2):
        fast = _play(mod, tmp_path / "front", None, FUNCTION_SHAPES[shape])
        general = _play(mod, tmp_path / "general", f"{mod.__name__}:General", FUNCTION_SHAPES[shape])
        assert fast == general
    outcomes = {outcome[0][1] for _, outcome, _ in fast}
    assert {"hit", "bypass"} <= outcomes  # the shape both served and bypassed calls


@pytest.mark.parametrize("shape", list(METHOD_SHAPES))
def test_every_shape_of_a_method_target_agrees_with_the_interpreted_gate(mod: Any, tmp_path: Path,
                                                                         shape: str) -> None:
    for _ in range(2):
        fast = _play(mod, tmp_path / "front", None, METHOD_SHAPES[shape], method=True)
        general = _play(mod, tmp_path / "general", f"{mod.__name__}:General", METHOD_SHAPES[shape], method=True)
        assert fast == general
    by_name = {name: outcome for name, outcome, _ in fast}
    assert by_name["training step 3"][0][1:3] == ("hit", 3)
    assert by_name["training step 2"][0][1:3] == ("bypass", 2)
    if "expr bypass" in shape:
        assert by_name["evaluation"][0][1:3] == ("bypass", None)


def test_an_inactive_front_passes_calls_through_untouched(mod: Any, tmp_path: Path) -> None:
    skipweave.weave({"skip": {"rollout": {"enable": True, "convention": "verl", "dump_dir": str(tmp_path), "steps": [1],
                                          "targets": {"g": f"{mod.__name__}:gen"}}}})
    proxy = proxy_of(mod.gen._self_wrapper)
    assert proxy is not None
    proxy.active = False
    before = skipweave.counters()["bypasses"]
    out = mod.gen(mod.Batch({"global_steps": 2}))
    assert "skipweave" not in out.meta_info and skipweave.counters()["bypasses"] == before


def test_a_plain_def_handing_back_an_awaitable_is_annotated_once_awaited(host_module: Any, tmp_path: Path) -> None:
    name, _ = host_module('''
class Batch:
    def __init__(self, meta):
        self.meta_info = meta

async def _work(b):
    return Batch({"step": b.meta_info["global_steps"]})

def gen(b):
    return _work(b)
''')
    mod = sys.modules[name]
    skipweave.weave({"skip": {"rollout": {"enable": True, "convention": "verl", "dump_dir": str(tmp_path), "steps": [1],
                                          "targets": {"g": f"{name}:gen"}}}})
    out = asyncio.run(mod.gen(mod.Batch({"global_steps": 2})))
    assert out.meta_info["skipweave"] == {"status": "bypass", "step": 2, "served_step": None}


def test_bypass_lines_follow_the_log_level_at_weave_time(mod: Any, tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    cfg = {"skip": {"rollout": {"enable": True, "convention": "verl", "dump_dir": str(tmp_path), "steps": [1],
                                "targets": {"g": f"{mod.__name__}:gen"}}}}
    with caplog.at_level(logging.INFO, logger="skipweave"):
        skipweave.weave(cfg)
        mod.gen(mod.Batch({"global_steps": 2}))
    assert not [r for r in caplog.records if "bypass role" in r.getMessage()]
    skipweave.unweave()
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="skipweave"):
        skipweave.weave(cfg)
        mod.gen(mod.Batch({"global_steps": 2}))
    assert [r.getMessage() for r in caplog.records if "bypass role" in r.getMessage()] == [
        "skipweave bypass role=rollout target=g step=2"]


def test_mapping_check_is_the_abc() -> None:
    assert not isinstance(object(), Mapping)  # the readers' per-class cache relies on the ABC answer


def test_subclasses_that_replace_what_the_gate_reads_get_a_gate_around_their_replacement(mod: Any,
                                                                                         tmp_path: Path) -> None:
    from skipweave.config.schema import StepSourceConfig, StepSourceKind
    from skipweave.policy.steps import StepSource

    class CounterSteps(SkipProxy):
        def __init__(self, *a: Any, **k: Any) -> None:
            super().__init__(*a, **k)
            self.step_source = StepSource(StepSourceConfig(source=StepSourceKind.COUNTER))

    class OddSteps(SkipProxy):
        def __init__(self, *a: Any, **k: Any) -> None:
            super().__init__(*a, **k)
            self.steps = {1, 3, 5}  # type: ignore[assignment]

    class EverythingValidates(SkipProxy):
        def __init__(self, *a: Any, **k: Any) -> None:
            super().__init__(*a, **k)
            self.bypass = lambda args, kwargs: True

    for cls, expect in ((CounterSteps, ("miss", 1)), (OddSteps, ("bypass", 2)), (EverythingValidates,
                                                                                  ("bypass", None))):
        setattr(mod, cls.__name__, cls)
        skipweave.unweave()
        skipweave.weave({"skip": {"rollout": {
            "enable": True, "convention": "verl", "dump_dir": str(tmp_path / cls.__name__), "steps": [1],
            "targets": {"g": {"path": f"{mod.__name__}:gen", "proxy": f"{mod.__name__}:{cls.__name__}"}}}}})
        assert isinstance(proxy_of(mod.gen._self_wrapper), cls)
        mark = mod.gen(mod.Batch({"global_steps": 2})).meta_info["skipweave"]
        assert (mark["status"], mark["step"]) == expect


def test_the_front_keeps_no_argument_class_alive(mod: Any, tmp_path: Path) -> None:
    import gc
    import weakref

    skipweave.weave({"skip": {"rollout": {"enable": True, "convention": "verl", "dump_dir": str(tmp_path), "steps": [1],
                                          "targets": {"g": f"{mod.__name__}:gen"}}}})
    refs = []
    for i in range(300):  # a host making a class per call
        cls = type(f"Batch{i}", (), {})
        b = cls()
        b.meta_info = {"global_steps": 2}
        assert mod.gen(b).meta_info["skipweave"]["status"] == "bypass"
        refs.append(weakref.ref(cls))
        del cls, b
    gc.collect()
    from skipweave.policy import access

    assert sum(r() is not None for r in refs) <= access.PLAIN.KEPT


def test_a_class_registered_as_a_mapping_later_is_seen(mod: Any, tmp_path: Path) -> None:
    class Late:
        def __init__(self) -> None:
            self.meta_info = {"global_steps": 2}

        def __getitem__(self, key: str) -> Any:
            return {"global_steps": 3}

        def __contains__(self, key: str) -> bool:
            return key == "meta_info"

    skipweave.weave({"skip": {"rollout": {"enable": True, "convention": "verl", "dump_dir": str(tmp_path), "steps": [3],
                                          "targets": {"g": f"{mod.__name__}:gen"}}}})
    assert mod.gen(Late()).meta_info["skipweave"]["status"] == "bypass"  # attribute: step 2, not eligible
    Mapping.register(Late)
    assert mod.gen(Late()).meta_info["skipweave"]["status"] != "bypass"  # now its keys win: step 3


def test_a_handle_to_running_work_is_handed_back_untouched_and_not_recorded(
        mod: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    skipweave.weave({"skip": {"rollout": {"enable": True, "convention": "verl", "dump_dir": str(tmp_path), "steps": [3],
                                          "targets": {"g": f"{mod.__name__}:gen"}}}})
    before = skipweave.counters()
    with caplog.at_level(logging.WARNING, logger="skipweave"):
        out = mod.gen(mod.Batch({"global_steps": 3, "future": True}))
    assert type(out).__name__ == "FutureBatch"  # not turned into a coroutine (a Ray ObjectRef must stay one)
    assert skipweave.counters()["bytes_written"] == before["bytes_written"]
    assert any("handle to a result still being computed" in r.getMessage() for r in caplog.records)


def test_a_call_whose_arguments_raise_when_read_runs_live_with_one_warning(mod: Any, tmp_path: Path,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    class Raising:
        @property
        def meta_info(self) -> Any:
            raise KeyError("meta_info")  # an addict/EasyDict-style object

    for proxy in (None, f"{mod.__name__}:General"):
        skipweave.unweave()
        target: Any = f"{mod.__name__}:gen" if proxy is None else {"path": f"{mod.__name__}:gen", "proxy": proxy}
        skipweave.weave({"skip": {"rollout": {"enable": True, "convention": "verl",
                                              "dump_dir": str(tmp_path), "targets": {"g": target}}}})
        calls = len(mod.CALLS)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="skipweave"):
            with pytest.raises(KeyError):  # the host's own call still reads it and fails as it would unwoven
                mod.gen(Raising())
        assert len(mod.CALLS) == calls  # gen itself raised before appending: it was called live, once
        assert [r for r in caplog.records if "raised KeyError" in r.getMessage()], proxy
