"""Weaving with real wrapt patches: every kind of target, idempotence, exact unweave, deferred imports."""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch
import wrapt

import skipweave
from skipweave.weaving.resolve import TargetNotFound
from tests.conftest import HOST_SOURCE


def _cfg(dump: Path, targets: dict[str, object], **role: object) -> dict[str, object]:
    return {"skip": {"rollout": {"enable": True, "convention": "verl",
                                 "dump_dir": str(dump), "targets": targets, **role}}}


def test_every_kind_of_target_records_then_replays(host_module, tmp_path: Path) -> None:
    name, _ = host_module(HOST_SOURCE)
    mod = sys.modules[name]
    targets = {
        "gen": f"{name}.Gen.generate",
        "agen": f"{name}:Gen.agenerate",
        "cgen": f"{name}.Gen.cgen",
        "sgen": f"{name}:Gen.sgen",
        "free": f"{name}.free",
    }
    skipweave.weave(_cfg(tmp_path / "d", targets, step={"source": "set_step"}))
    g = mod.Gen()
    for step in (1, 2):
        skipweave.set_step(step)
        first = (g.generate(mod.Batch()), asyncio.run(g.agenerate(mod.Batch())), mod.Gen.cgen(step),
                 g.sgen(step), mod.free(step))
    assert len(mod.CALLS) == 10
    skipweave.unweave()
    mod.CALLS.clear()
    skipweave.weave(_cfg(tmp_path / "d", targets, step={"source": "set_step"}))
    skipweave.set_step(2)
    again = (g.generate(mod.Batch()), asyncio.run(g.agenerate(mod.Batch())), mod.Gen.cgen(2), g.sgen(2),
             mod.free(2))
    assert mod.CALLS == []
    assert torch.equal(again[0].batch["y"], first[0].batch["y"])
    assert torch.equal(again[1].batch["y"], first[1].batch["y"])
    assert torch.equal(again[2]["r"], first[2]["r"]) and again[2]["n"] == 2
    assert again[3][0] == 2 and torch.equal(again[3][1], first[3][1])
    assert torch.equal(again[4], first[4])
    assert again[0].meta_info["skipweave"]["status"] == "hit"


def test_async_target_stays_a_coroutine_function_and_replays_awaitable(host_module, tmp_path: Path) -> None:
    name, _ = host_module(HOST_SOURCE)
    mod = sys.modules[name]
    skipweave.weave(_cfg(tmp_path / "d", {"agen": f"{name}.Gen.agenerate"}))
    g = mod.Gen()
    assert inspect.iscoroutinefunction(mod.Gen.agenerate)

    async def run() -> list[object]:
        return await asyncio.gather(*(g.agenerate(mod.Batch(step=s)) for s in (1, 2, 3)))

    live = asyncio.run(run())
    assert len(mod.CALLS) == 3
    skipweave.unweave()  # a second run: fresh proxies, same store
    skipweave.weave(_cfg(tmp_path / "d", {"agen": f"{name}.Gen.agenerate"}))
    replayed = asyncio.run(run())
    assert len(mod.CALLS) == 3
    for a, b in zip(live, replayed, strict=False):
        assert torch.equal(a.batch["y"], b.batch["y"])
        assert b.meta_info["skipweave"]["status"] == "hit"


def test_weave_twice_is_a_noop_and_unweave_restores_exactly(host_module, tmp_path: Path) -> None:
    name, _ = host_module(HOST_SOURCE)
    mod = sys.modules[name]
    originals = {k: mod.Gen.__dict__[k] for k in ("generate", "agenerate", "cgen", "sgen")}
    free = mod.free
    cfg = _cfg(tmp_path / "d", {"gen": f"{name}.Gen.generate", "agen": f"{name}.Gen.agenerate",
                                "c": f"{name}.Gen.cgen", "s": f"{name}.Gen.sgen", "f": f"{name}.free"})
    skipweave.weave(cfg)
    first = mod.Gen.__dict__["generate"]
    skipweave.weave(cfg)
    assert mod.Gen.__dict__["generate"] is first
    assert not isinstance(first.__wrapped__, wrapt.FunctionWrapper)  # never a double wrap
    skipweave.unweave()
    for k, v in originals.items():
        assert mod.Gen.__dict__[k] is v
    assert mod.free is free


def test_inherited_method_through_subclass_path_and_base_path(host_module, tmp_path: Path) -> None:
    name, _ = host_module(HOST_SOURCE)
    mod = sys.modules[name]
    skipweave.weave(_cfg(tmp_path / "d", {"g": f"{name}.SubGen.generate"}))
    assert "generate" in mod.SubGen.__dict__  # patched where the path points
    mod.SubGen().generate(mod.Batch(step=1))
    mod.SubGen().generate(mod.Batch(step=2))
    mod.SubGen().generate(mod.Batch(step=2, validate=True))
    assert len(mod.CALLS) == 3
    skipweave.unweave()
    skipweave.weave(_cfg(tmp_path / "d", {"g": f"{name}.SubGen.generate"}))
    mod.SubGen().generate(mod.Batch(step=1))
    mod.SubGen().generate(mod.Batch(step=2))
    assert len(mod.CALLS) == 3
    skipweave.unweave()
    assert "generate" not in mod.SubGen.__dict__  # no shadowing copy left behind
    skipweave.weave(_cfg(tmp_path / "e", {"g": f"{name}.Gen.generate"}))
    mod.SubGen().generate(mod.Batch(step=5))
    skipweave.unweave()
    skipweave.weave(_cfg(tmp_path / "e", {"g": f"{name}.Gen.generate"}))
    mod.SubGen().generate(mod.Batch(step=5))
    assert len(mod.CALLS) == 4  # subclasses inherit the patch made on the base


def test_unweave_removes_only_ours_under_another_wrapt_wrapper(host_module, tmp_path: Path) -> None:
    name, _ = host_module(HOST_SOURCE)
    mod = sys.modules[name]
    original = mod.Gen.__dict__["generate"]
    skipweave.weave(_cfg(tmp_path / "d", {"g": f"{name}.Gen.generate"}))
    seen: list[int] = []

    def other(wrapped, instance, args, kwargs):  # type: ignore[no-untyped-def]
        seen.append(1)
        return wrapped(*args, **kwargs)

    wrapt.wrap_function_wrapper(mod.Gen, "generate", other)
    skipweave.unweave()
    top = mod.Gen.__dict__["generate"]
    assert isinstance(top, wrapt.FunctionWrapper) and top.__wrapped__ is original
    mod.Gen().generate(mod.Batch(step=1))
    mod.Gen().generate(mod.Batch(step=1))
    assert seen == [1, 1] and len(mod.CALLS) == 2  # the other tool still runs; we do not


def test_unweave_under_a_plain_closure_passes_through(host_module, tmp_path: Path) -> None:
    name, _ = host_module(HOST_SOURCE)
    mod = sys.modules[name]
    skipweave.weave(_cfg(tmp_path / "d", {"g": f"{name}.Gen.generate"}))
    ours = mod.Gen.__dict__["generate"]

    @functools.wraps(ours)
    def closure(*a, **k):  # type: ignore[no-untyped-def]
        return ours(*a, **k)

    mod.Gen.generate = closure
    skipweave.unweave()
    mod.Gen().generate(mod.Batch(step=1))
    mod.Gen().generate(mod.Batch(step=1))
    assert len(mod.CALLS) == 2  # our proxy is inert: nothing replayed
    assert not (tmp_path / "d").exists()


def test_target_in_module_not_yet_imported_is_patched_on_first_import(host_module, tmp_path: Path) -> None:
    name, _ = host_module(HOST_SOURCE, import_now=False)
    assert name not in sys.modules
    patches = skipweave.weave(_cfg(tmp_path / "d", {"f": f"{name}.free"}))
    assert name not in sys.modules and patches[0].pending
    copied = importlib.import_module(name).free  # like `from mod import free`
    assert isinstance(copied, wrapt.FunctionWrapper)
    mod = sys.modules[name]
    skipweave.set_step(1)
    copied(1)
    assert mod.CALLS == [("free", 1)]
    skipweave.flush()  # the background writer's entries on disk
    assert list((tmp_path / "d" / "default" / "rollout" / "1" / "f").glob("r0-0000.manifest.json"))


def test_unresolvable_path_names_the_failing_part(host_module, tmp_path: Path) -> None:
    name, _ = host_module(HOST_SOURCE)
    with pytest.raises(TargetNotFound, match=rf"{name}\.Gen\.nope"):
        skipweave.weave(_cfg(tmp_path / "d", {"g": f"{name}.Gen.nope", "ok": f"{name}.free"}))
    assert not isinstance(sys.modules[name].free, wrapt.FunctionWrapper)  # nothing patched
    with pytest.raises(TargetNotFound, match="no module named 'no_such_pkg'"):
        skipweave.weave(_cfg(tmp_path / "d", {"g": "no_such_pkg.mod:Thing.run"}))
    # a misspelt class names the module it was looked up in (not Python's "'module' object"), and the class
    with pytest.raises(TargetNotFound, match=rf"module '{name}' has no attribute 'Gne'; did you mean 'Gen'\?"):
        skipweave.weave(_cfg(tmp_path / "d", {"g": f"{name}:Gne.generate"}))
    with pytest.raises(TargetNotFound, match=r"class 'Gen' has no attribute 'generat'; did you mean 'generate'\?"):
        skipweave.weave(_cfg(tmp_path / "d", {"g": f"{name}:Gen.generat"}))


def test_an_attribute_instances_set_or_a_none_is_named_as_such(host_module, tmp_path: Path) -> None:
    name, _ = host_module(
        "class Base:\n"
        "    def __init__(self):\n"
        "        self.generate = self._run\n"
        "    def _run(self, x):\n"
        "        return x\n"
        "class Policy(Base):\n"
        "    hook = None\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.hook: object = print\n"
    )
    # set on instances (in a base class's __init__): a class attribute cannot be woven for it
    with pytest.raises(TargetNotFound, match=r"class 'Policy' has no attribute 'generate': its instances set it "
                                             r"\(self\.generate = \.\.\. in the class's source\)"):
        skipweave.weave(_cfg(tmp_path / "d", {"g": f"{name}:Policy.generate"}))
    # None on the class: woven, it would wrap nothing the program calls
    with pytest.raises(TargetNotFound, match=r"class 'Policy' attribute 'hook' is None, not a function or method "
                                             r"\(its instances set it: self\.hook = \.\.\."):
        skipweave.weave(_cfg(tmp_path / "d", {"g": f"{name}:Policy.hook.run"}))
    with pytest.raises(TargetNotFound, match=r"attribute 'hook' is None"):
        skipweave.weave(_cfg(tmp_path / "d", {"g": f"{name}:Policy.hook"}))


def test_optional_target_that_does_not_resolve_is_skipped(host_module, tmp_path: Path) -> None:
    name, _ = host_module(HOST_SOURCE)
    patches = skipweave.weave(_cfg(tmp_path / "d", {
        "verl": {"path": "verl_not_here.agent_loop:AgentLoopManager.generate_sequences", "optional": True},
        "g": f"{name}.Gen.generate",
    }))
    assert [p.target.name for p in patches] == ["g"]


def test_sync_or_await_helper_keeps_its_choice(host_module, tmp_path: Path) -> None:
    """verl's ``auto_await``: plain call runs the coroutine, awaited call returns it."""
    name, _ = host_module(HOST_SOURCE + '''
import asyncio, functools, inspect

def auto_await(func):
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        coro = func(*args, **kwargs)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(coro)
        if inspect.currentframe().f_back.f_code.co_flags & inspect.CO_COROUTINE:
            return coro
        raise RuntimeError("sync call inside a running loop")
    return wrapper


class Manager:
    @auto_await
    async def generate_sequences(self, b):
        CALLS.append(("gs", b.meta_info.get("global_steps")))
        out = Batch(b.meta_info.get("global_steps"))
        out.batch["y"] = torch.rand(3)
        return out
''')
    mod = sys.modules[name]
    skipweave.weave(_cfg(tmp_path / "d", {"gs": f"{name}.Manager.generate_sequences"}))
    m = mod.Manager()
    plain = m.generate_sequences(mod.Batch(step=1))

    async def awaited() -> object:
        return await m.generate_sequences(mod.Batch(step=1))

    skipweave.unweave()
    skipweave.weave(_cfg(tmp_path / "d", {"gs": f"{name}.Manager.generate_sequences"}))
    again = asyncio.run(awaited())
    assert torch.equal(plain.batch["y"], again.batch["y"]) and len(mod.CALLS) == 1

    async def awaited2() -> object:
        return await m.generate_sequences(mod.Batch(step=2))

    live = asyncio.run(awaited2())
    skipweave.unweave()
    skipweave.weave(_cfg(tmp_path / "d", {"gs": f"{name}.Manager.generate_sequences"}))
    replay = m.generate_sequences(mod.Batch(step=2))
    assert torch.equal(live.batch["y"], replay.batch["y"]) and len(mod.CALLS) == 2


def test_sync_target_called_from_async_code_returns_a_value(host_module, tmp_path: Path) -> None:
    name, _ = host_module(HOST_SOURCE)
    mod = sys.modules[name]
    skipweave.weave(_cfg(tmp_path / "d", {"g": f"{name}.Gen.generate"}))

    async def caller() -> object:
        return mod.Gen().generate(mod.Batch(step=3))

    out = asyncio.run(caller())
    assert isinstance(out, mod.Batch)


def test_weave_reentered_from_an_import_during_weave_wraps_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A parent package whose import calls weave() again (the launcher's deferred weave) makes no double wrap."""
    pkg = tmp_path / "reentry_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "import os, json, skipweave\nskipweave.weave(json.loads(os.environ['REENTRY_CFG']))\n"
    )
    (pkg / "mod.py").write_text("def f(n):\n    return n\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = _cfg(tmp_path / "d", {"f": "reentry_pkg.mod.f"}, step={"source": "counter"})
    import json

    monkeypatch.setenv("REENTRY_CFG", json.dumps(cfg))
    try:
        skipweave.weave(cfg)
        mod = importlib.import_module("reentry_pkg.mod")
        assert isinstance(mod.f, wrapt.FunctionWrapper)
        assert not isinstance(mod.f.__wrapped__, wrapt.FunctionWrapper)
        skipweave.unweave()
        assert not isinstance(mod.f, wrapt.FunctionWrapper)
    finally:
        for name in ("reentry_pkg.mod", "reentry_pkg"):
            sys.modules.pop(name, None)


def _heavy_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A package whose __init__ leaves a mark when run (verl's imports torch, transformers and ray)."""
    name = f"heavy_{uuid.uuid4().hex[:8]}"
    pkg = tmp_path / name / "experimental"
    pkg.mkdir(parents=True)
    (tmp_path / name / "__init__.py").write_text("import os\nos.environ['SKIPWEAVE_TEST_HEAVY'] = 'imported'\n")
    (pkg / "__init__.py").write_text("")
    (pkg / "loop.py").write_text("class Manager:\n    def generate(self, n):\n        return [n]\n")
    (tmp_path / name / "portion").mkdir()  # a folder without __init__.py: a namespace portion
    (tmp_path / name / "portion" / "gen.py").write_text("def generate(n):\n    return [n]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("SKIPWEAVE_TEST_HEAVY", raising=False)
    return name


def _role(tmp_path: Path, **targets: Any) -> dict[str, Any]:
    return {"skip": {"rollout": {"enable": True, "convention": "verl",
                                 "dump_dir": str(tmp_path / "dump"), "step": "counter",
                                 "targets": targets}}}


@pytest.mark.parametrize(("target", "module"), [
    ("experimental.loop.Manager.generate", "experimental.loop"),
    ("experimental.loop:Manager.generate", "experimental.loop"),
    ("portion.gen.generate", "portion.gen"),
])
def test_weaving_a_target_deep_in_a_package_imports_none_of_it(target: str, module: str, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # Finding the target's module must not run any package __init__: a profile's verl targets would
    # otherwise cost seconds of imports in every process that weaves it, also where verl is never used.
    name = _heavy_package(tmp_path, monkeypatch)
    path = f"{name}.{target}"
    missing = f"{name}.experimental.absent.Manager.generate"
    for _ in range(2):  # the second weave finds wrapt's hook finder waiting on the module: still no import
        skipweave.unweave()
        skipweave.weave(_role(tmp_path, g=path, opt={"path": missing, "optional": True}))
        assert name not in sys.modules and "SKIPWEAVE_TEST_HEAVY" not in os.environ
    host = importlib.import_module(f"{name}.{module}")  # the host imports it: patched then
    before = skipweave.counters()["misses"]
    call = host.Manager().generate if hasattr(host, "Manager") else host.generate
    assert call(3) == [3]
    assert skipweave.counters()["misses"] == before + 1
    for mod in [m for m in sys.modules if m.startswith(name)]:
        sys.modules.pop(mod)


def test_a_package_extending_its_path_at_import_is_still_found(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"split_{uuid.uuid4().hex[:8]}"
    for part, body in (("a", "from pkgutil import extend_path\n__path__ = extend_path(__path__, __name__)\n"),
                       ("b", None)):
        (tmp_path / part / name).mkdir(parents=True)
        if body is not None:
            (tmp_path / part / name / "__init__.py").write_text(body)
        monkeypatch.syspath_prepend(str(tmp_path / part))
    (tmp_path / "b" / name / "gen.py").write_text("def generate(n):\n    return [n]\n")
    skipweave.weave({"skip": {"rollout": {"enable": True, "convention": "verl",
                                          "dump_dir": str(tmp_path / "dump"), "step": "counter",
                                          "targets": {"g": f"{name}.gen.generate"}}}})
    gen = importlib.import_module(f"{name}.gen")
    before = skipweave.counters()["misses"]
    assert gen.generate(2) == [2] and skipweave.counters()["misses"] == before + 1
    for mod in [m for m in sys.modules if m.startswith(name)]:
        sys.modules.pop(mod)
