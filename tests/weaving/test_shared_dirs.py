"""A process handed the driver's marks checks each dump dir once, at its first eligible call: a WARNING, or with
``require_shared`` a :class:`DumpDirNotShared` from every call before the target runs (sync and async targets)."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import skipweave
from skipweave.store.identity import run_id
from skipweave.weaving import shared_dirs

HOST = """
calls = []

def gen(step):
    calls.append(step)
    return {"step": step}

async def agen(step):
    calls.append(step)
    return {"step": step}
"""


@pytest.fixture(autouse=True)
def _no_marks_after() -> Iterator[None]:
    yield
    shared_dirs.expect_marks("", {}, where="")


def _weave(host_module: Callable[..., tuple[str, Path]], dump: Path, **role: Any) -> Any:
    name, _ = host_module(HOST)
    step = {"source": "arg", "arg": 0, "path": ""}
    skipweave.weave({"skip": {"rollout": {"enable": True, "dump_dir": str(dump), "step": step,
                                          "targets": {"gen": f"{name}:gen", "agen": f"{name}:agen"}, **role}}})
    return sys.modules[name]


def _ours(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "is not the folder the driver uses" in r.getMessage()]


def test_the_driver_s_own_folder_passes_and_an_unchecked_process_pays_nothing(
        host_module: Callable[..., tuple[str, Path]], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    host = _weave(host_module, tmp_path / "dump", require_shared=True)
    assert host.gen(1) == {"step": 1}  # no marks handed to this process: nothing checked
    marked, failed = shared_dirs.leave_marks([str(tmp_path / "dump")])
    assert failed == {} and list(marked) == [str(tmp_path / "dump")]
    shared_dirs.expect_marks(run_id(), marked, where="here")
    assert [host.gen(2), asyncio.run(host.agen(3))] == [{"step": 2}, {"step": 3}]
    assert host.calls == [1, 2, 3] and _ours(caplog) == []


def test_another_folder_warns_once_per_dump_dir_naming_it_the_process_and_what_to_set(
        host_module: Callable[..., tuple[str, Path]], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    host = _weave(host_module, tmp_path / "dump")
    marked, _ = shared_dirs.leave_marks([str(tmp_path / "driver_side")])  # the driver's folder is another one
    shared_dirs.expect_marks(run_id(), {str(tmp_path / "dump"): marked[str(tmp_path / "driver_side")]},
                             where="pid=1 node=10.0.0.2 (abc)")
    with caplog.at_level(logging.WARNING, logger="skipweave"):
        assert [host.gen(1), host.gen(2), asyncio.run(host.agen(1))] == [{"step": 1}, {"step": 2}, {"step": 1}]
    [line] = _ours(caplog)  # two targets, three calls, one dump dir: one line
    for part in (f"dump_dir {tmp_path / 'dump'} ", "pid=1 node=10.0.0.2 (abc)", "skip.rollout.dump_dir",
                 "skip.rollout.require_shared: true", "the folder does not exist here"):
        assert part in line, (part, line)
    assert host.calls == [1, 2, 1]
    skipweave.flush()
    assert os.path.isdir(tmp_path / "dump" / "default" / "rollout" / "2")  # it still records, where it was told


def test_require_shared_refuses_every_call_before_the_target_runs_and_takes_no_call_index(
        host_module: Callable[..., tuple[str, Path]], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    host = _weave(host_module, tmp_path / "dump", require_shared=True)
    (tmp_path / "dump").mkdir()
    shared_dirs.expect_marks(run_id(), {str(tmp_path / "dump"): "e" * 32}, where="pid=2 node=n2")
    for _ in range(2):
        with pytest.raises(skipweave.DumpDirNotShared, match="require_shared is true, so the call did not run") as e:
            host.gen(1)
        assert (e.value.role, e.value.dump_dir, e.value.where) == ("rollout", str(tmp_path / "dump"), "pid=2 node=n2")
    with pytest.raises(skipweave.DumpDirNotShared, match=r"mark \.runs/.*/\.shared\.json is not in it"):
        asyncio.run(host.agen(1))
    assert host.calls == [] and _ours(caplog) == []  # an error, not a warning
    shared_dirs.expect_marks(run_id(), {}, where="")  # (the check off) the step's first call index is still free
    host.gen(1)
    skipweave.flush()
    names = os.listdir(tmp_path / "dump" / "default" / "rollout" / "1" / "gen")
    assert [n for n in names if n.endswith(".manifest.json")] == ["r0-0000.manifest.json"]
