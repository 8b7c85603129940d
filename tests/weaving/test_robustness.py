"""Regressions found by trying to break the proxy: recursion, failing calls, unusable stores, bad weaves."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import wrapt

import skipweave
from skipweave.config.errors import ConfigError


def _role(dump: Path, targets: dict[str, str], **kw: Any) -> dict[str, Any]:
    return {"skip": {"rollout": {"enable": True, "dump_dir": str(dump), "targets": targets, **kw}}}


def _rerun(cfg: dict[str, Any]) -> None:
    skipweave.unweave()
    skipweave.weave(cfg)


def test_recursive_target_counts_only_the_outer_call(host_module: Any, tmp_path: Path) -> None:
    name, _ = host_module(
        "CALLS = []\ndef fact(n):\n    CALLS.append(n)\n    return 1 if n <= 1 else n * fact(n - 1)\n"
    )
    m = sys.modules[name]
    cfg = _role(tmp_path, {"f": f"{name}.fact"}, step="counter")
    skipweave.weave(cfg)
    assert [m.fact(3), m.fact(4)] == [6, 24]
    _rerun(cfg)
    m.CALLS.clear()
    assert [m.fact(3), m.fact(4)] == [6, 24] and m.CALLS == []


def test_a_failing_call_gives_its_call_index_back(host_module: Any, tmp_path: Path) -> None:
    name, _ = host_module('''
FAIL = {"A": 1}
def ask(q):
    if FAIL.get(q):
        FAIL[q] -= 1
        raise RuntimeError("flaky")
    return {"answer_to": q}
''')
    m = sys.modules[name]
    cfg = _role(tmp_path, {"a": f"{name}.ask"}, step={"source": "set_step"})
    skipweave.weave(cfg)
    skipweave.set_step(1)
    with pytest.raises(RuntimeError, match="flaky"):
        m.ask("A")
    assert [m.ask("A"), m.ask("B")] == [{"answer_to": "A"}, {"answer_to": "B"}]
    _rerun(cfg)
    assert [m.ask("A"), m.ask("B")] == [{"answer_to": "A"}, {"answer_to": "B"}]


def test_dump_dir_that_is_a_file_is_refused_at_weave_and_runs_live_if_it_becomes_one(
    host_module: Any, tmp_path: Path, caplog: Any,
) -> None:
    name, _ = host_module("def gen(n):\n    return n * 2\n")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for dump in (blocker, blocker / "below"):
        with pytest.raises(ConfigError, match=r"skip\.rollout\.dump_dir=.*is a file"):
            skipweave.weave(_role(dump, {"g": f"{name}.gen"}, step="counter"))
    dump = tmp_path / "dump"
    skipweave.weave(_role(dump, {"g": f"{name}.gen"}, step="counter"))
    dump.write_text("x")  # replaced by a file while the run goes on
    with caplog.at_level(logging.WARNING):
        assert sys.modules[name].gen(4) == 8
    assert "running live without recording" in caplog.text


def test_inputs_too_deep_to_fingerprint_do_not_fail_the_call(host_module: Any, tmp_path: Path) -> None:
    name, _ = host_module("def gen(x):\n    return 1\n")
    skipweave.weave(_role(tmp_path, {"g": f"{name}.gen"}, step="counter"))
    deep: list[Any] = []
    for _ in range(5000):
        deep = [deep]
    assert sys.modules[name].gen(deep) == 1


def test_a_failed_weave_leaves_nothing_patched_and_can_be_retried(host_module: Any, tmp_path: Path) -> None:
    name, _ = host_module("def f(n):\n    return n\ndef g(n):\n    return n\n")
    m = sys.modules[name]
    cfg = {"skip": {
        "a": {"enable": True, "dump_dir": str(tmp_path), "targets": {"f": f"{name}.f"}},
        "b": {"enable": True, "dump_dir": str(tmp_path), "targets": {"g": f"{name}.g"},
              "bypass": {"when": "callable", "callable": f"{name}:missing"}},
    }}
    with pytest.raises(skipweave.TargetNotFound, match="missing"):
        skipweave.weave(cfg)
    assert not isinstance(m.f, wrapt.FunctionWrapper)
    cfg["skip"]["b"]["bypass"] = {"when": "never"}
    skipweave.weave(cfg)
    assert isinstance(m.f, wrapt.FunctionWrapper) and isinstance(m.g, wrapt.FunctionWrapper)


def test_step_argument_named_but_passed_positionally(host_module: Any, tmp_path: Path) -> None:
    name, _ = host_module("class R:\n    def generate(self, prompts, step):\n        return [prompts, step]\n")
    m = sys.modules[name]
    skipweave.weave(_role(tmp_path, {"g": f"{name}.R.generate"}, step={"source": "arg", "arg": "step", "path": ""}))
    m.R().generate("p", 10)
    m.R().generate("p", step=20)
    skipweave.flush()  # the background writer's entries on disk
    assert sorted(p.name for p in (tmp_path / "default" / "rollout").iterdir()) == ["10", "20"]


def test_counter_fallback_is_announced_once(host_module: Any, tmp_path: Path, caplog: Any) -> None:
    name, _ = host_module("def gen(prompts, step):\n    return step\n")
    skipweave.weave(_role(tmp_path, {"g": f"{name}.gen"}))
    with caplog.at_level(logging.WARNING):
        sys.modules[name].gen("p", 10)
        sys.modules[name].gen("p", 20)
    assert caplog.text.count("counting calls as steps") == 1


def test_target_named_after_the_running_script_resolves_to_main(tmp_path: Path) -> None:
    script = tmp_path / "app4.py"
    script.write_text(textwrap.dedent(f'''
        import skipweave
        CALLS = []
        class Gen:
            def generate(self, n):
                CALLS.append(n)
                return n * 3
        skipweave.weave({{"skip": {{"rollout": {{"enable": True, "dump_dir": {str(tmp_path / "d")!r},
                         "targets": {{"g": "app4:Gen.generate"}}, "step": "counter"}}}}}})
        print(Gen().generate(2), len(CALLS))
    '''))
    outs = [subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True, cwd=tmp_path)
            .stdout.split() for _ in range(2)]
    assert outs == [["6", "1"], ["6", "0"]]


@pytest.mark.parametrize("dump", ["$SKIPWEAVE_SURELY_UNSET_VAR/d", "~no_such_user_skipweave/d", "dangling"])
def test_dump_dirs_that_cannot_be_what_was_meant_are_refused(host_module: Any, tmp_path: Path,
                                                             monkeypatch: Any, dump: str) -> None:
    name, _ = host_module("def gen(n):\n    return n\n")
    monkeypatch.chdir(tmp_path)
    if dump == "dangling":
        (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match=r"skip\.rollout\.dump_dir"):
        skipweave.weave(_role(dump, {"g": f"{name}.gen"}, step="counter"))  # type: ignore[arg-type]
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(("host_", "__"))) == (
        ["dangling"] if dump == "dangling" else [])
