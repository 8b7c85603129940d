"""Recording off the critical path (skipweave.store.write_behind): real woven calls, the real background writer,
real subprocesses killed mid-write. The writer is held at a gate where a test needs it still busy."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import skipweave
from skipweave.store.commit import Committer
from skipweave.store.step_store import StepStore
from skipweave.store.write_behind import WRITER

pytestmark = pytest.mark.slow  # starts processes: left out of the fast tier (README)

HOST = '''
import torch

CALLS = []


def gen(step, n=4, value=None):
    CALLS.append(step)
    return {"step": step, "ids": torch.full((n,), step if value is None else value, dtype=torch.int64)}
'''


def _plan(dump: Path, name: str, **role: Any) -> dict[str, Any]:
    return {"skip": {"rollout": {"enable": True, "dump_dir": str(dump), "step": {"source": "arg", "arg": 0, "path": ""},
                                 "targets": {"gen": f"{name}:gen"}, **role}}}


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Hold the background writer before it writes anything until the event is set (set again at teardown)."""
    opened = threading.Event()
    real = Committer._write

    def held(self: Committer, *args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name == "skipweave-writer":
            assert opened.wait(60), "the test never opened the writer's gate"
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Committer, "_write", held)
    yield opened
    opened.set()
    skipweave.flush()


def _manifests(dump: Path) -> list[Path]:
    """Where each committed entry's manifest is (its own, or the group file holding it), as a run and ``skipweave
    ls`` see them."""
    from skipweave.store.scan import scan

    return sorted(Path(e.path) for e in scan(str(dump)).entries()) if dump.exists() else []


def test_the_call_returns_before_its_entry_is_written_and_in_place_changes_after_return_are_not_recorded(
        host_module: Any, tmp_path: Path, gate: threading.Event) -> None:
    name, _ = host_module(HOST)
    m = sys.modules[name]
    skipweave.weave(_plan(tmp_path, name))
    out = m.gen(1, n=1 << 16)
    assert out["ids"].eq(1).all() and _manifests(tmp_path) == []  # returned; the writer has not written yet
    out["ids"].fill_(-7)  # the host reuses its buffer right away
    out["step"] = 99
    gate.set()
    skipweave.unweave()  # flushes
    assert len(_manifests(tmp_path)) == 1
    m.CALLS.clear()
    skipweave.weave(_plan(tmp_path, name))
    again = m.gen(1, n=1 << 16)
    assert m.CALLS == [] and again["step"] == 1 and again["ids"].eq(1).all()  # the result as returned


def test_a_full_write_buffer_makes_the_next_recording_call_wait(host_module: Any, tmp_path: Path,
                                                                gate: threading.Event,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    name, _ = host_module(HOST)
    m = sys.modules[name]
    entry = 1 << 20  # 1 MiB of token ids per entry (and ~13 KB of RNG state and tree)
    skipweave.weave(_plan(tmp_path, name, write_buffer=3 * entry + (entry >> 1)))
    caplog.set_level(logging.DEBUG, logger="skipweave")
    for step in (1, 2, 3):
        m.gen(step, n=entry // 8)  # three fit
    assert WRITER.pending()[0] == 3
    done = threading.Event()
    worker = threading.Thread(target=lambda: (m.gen(4, n=entry // 8), done.set()))
    worker.start()
    assert not done.wait(0.5)  # the fourth waits for room
    assert "write buffer full" in caplog.text
    gate.set()
    assert done.wait(30)
    worker.join()
    skipweave.unweave()
    assert len(_manifests(tmp_path)) == 4


def test_an_entry_larger_than_the_buffer_and_write_buffer_0_are_written_before_the_call_returns(
        host_module: Any, tmp_path: Path, gate: threading.Event) -> None:
    name, _ = host_module(HOST)
    m = sys.modules[name]
    skipweave.weave(_plan(tmp_path / "small", name, write_buffer=1024))
    m.gen(1, n=1 << 12)  # 32 KiB: over the buffer, so written in the caller's thread (the writer is held)
    assert len(_manifests(tmp_path / "small")) == 1 and WRITER.pending()[0] == 0
    skipweave.unweave()
    skipweave.weave(_plan(tmp_path / "zero", name, write_buffer=0))
    m.gen(1)
    assert len(_manifests(tmp_path / "zero")) == 1 and WRITER.pending()[0] == 0


def test_a_replay_in_this_process_of_an_entry_still_being_written_waits_for_it(
        host_module: Any, tmp_path: Path, gate: threading.Event) -> None:
    name, _ = host_module(HOST)
    m = sys.modules[name]
    skipweave.weave(_plan(tmp_path, name, action="repeat", single_flight=False))
    m.gen(1)  # recorded in the background; the writer is held
    got: list[Any] = []
    worker = threading.Thread(target=lambda: got.append(m.gen(2)))
    worker.start()
    worker.join(0.5)
    assert worker.is_alive() and m.CALLS == [1]  # step 2 waits for step 1's entry instead of generating
    gate.set()
    worker.join(30)
    assert m.CALLS == [1] and got[0]["step"] == 1 and got[0]["ids"].eq(1).all()
    assert got[0]["ids"].data_ptr() != 0 and skipweave.counters()["hits"] >= 1


def test_flush_writes_everything_pending_and_the_replay_serves_it(host_module: Any, tmp_path: Path) -> None:
    name, _ = host_module(HOST)
    m = sys.modules[name]
    plan = _plan(tmp_path, name, calls_per_step=50)
    skipweave.weave(plan)
    for step in (1, 2):
        for _ in range(50):
            m.gen(step, n=128)
    assert skipweave.flush() is True
    assert WRITER.pending() == (0, 0) and len(_manifests(tmp_path)) == 100
    skipweave.unweave()
    m.CALLS.clear()
    skipweave.weave(plan)
    for step in (1, 2):
        for _ in range(50):
            assert m.gen(step, n=128)["ids"].eq(step).all()
    assert m.CALLS == []


def test_flush_ends_while_another_thread_keeps_recording_and_commits_what_was_handed_over_before_it(
        host_module: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name, _ = host_module(HOST)
    m = sys.modules[name]
    real = Committer._write

    def slow(self: Committer, *args: Any, **kwargs: Any) -> Any:  # the writer slower than the recordings come
        time.sleep(0.002)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Committer, "_write", slow)
    skipweave.weave(_plan(tmp_path, name, calls_per_step=100_000, write_buffer=1 << 30))
    returned = [0]
    stop = threading.Event()

    def record() -> None:
        while not stop.is_set():
            m.gen(1, n=16)
            returned[0] += 1

    recorder = threading.Thread(target=record, daemon=True)
    recorder.start()
    try:
        while returned[0] < 200:
            time.sleep(0.01)
        flushed: list[bool] = []
        before = returned[0]  # recordings handed over before the flush (at least)
        flusher = threading.Thread(target=lambda: flushed.append(skipweave.flush()), daemon=True)
        flusher.start()
        flusher.join(60)
        assert not flusher.is_alive(), "flush() waited for recordings handed over after it was called"
        assert flushed == [True] and len(_manifests(tmp_path)) >= before
        assert WRITER.pending()[0] > 0  # (the recorder kept the writer busy: the flush did not wait for an idle one)
    finally:
        stop.set()
        recorder.join(30)
    skipweave.unweave()
    assert len(_manifests(tmp_path)) == returned[0]


def test_many_small_entries_are_committed_in_groups(host_module: Any, tmp_path: Path, gate: threading.Event,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    name, _ = host_module(HOST)
    m = sys.modules[name]
    groups: list[int] = []
    real = StepStore.commit_many

    def spied(self: StepStore, items: Any) -> Any:
        groups.append(len(items))
        return real(self, items)

    monkeypatch.setattr(StepStore, "commit_many", spied)
    skipweave.weave(_plan(tmp_path, name, calls_per_step=40))
    for _ in range(40):
        m.gen(3, n=128)
    gate.set()
    skipweave.unweave()
    assert groups and max(groups) > 1 and sum(groups) <= 40  # one group sync for many entries
    from skipweave.cli.main import main as cli

    assert cli(["verify", str(tmp_path)]) == 0  # each entry whole, judged as every run judges it
    assert len(_manifests(tmp_path)) == 40
    folder = _manifests(tmp_path)[0].parent
    assert sorted(p.name for p in folder.glob(".*.lock")) == [".r0.part.lock"]  # one lock for the part, none per entry


EXITS = '''
import sys
sys.path.insert(0, sys.argv[1])
import skipweave, {name} as host
skipweave.weave({{"skip": {{"rollout": {{"enable": True, "dump_dir": sys.argv[2], "calls_per_step": 8,
                          "step": {{"source": "arg", "arg": 0, "path": ""}}, "targets": {{"gen": "{name}:gen"}}}}}}}})
for step in range(1, 4):
    for _ in range(8):
        host.gen(step, n=1 << 17)  # 1 MiB each
print(skipweave.counters()["misses"], flush=True)
{end}
'''


def _child(name: str, folder: Path, dump: Path, end: str, *, wait: bool = True) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", EXITS.format(name=name, end=end), str(folder), str(dump)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if wait:
        proc.wait(120)
    return proc


def test_a_normal_exit_finishes_the_pending_writes(host_module: Any, tmp_path: Path) -> None:
    name, folder = host_module(HOST)
    proc = _child(name, folder, tmp_path, end="")  # no flush, no unweave: the interpreter's exit
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
    assert len(_manifests(tmp_path)) == 24
    m = sys.modules[name]
    skipweave.weave(_plan(tmp_path, name))
    for step in range(1, 4):
        for _ in range(8):
            m.gen(step, n=1 << 17)
    assert m.CALLS == []


def test_sigkill_during_background_writes_never_leaves_a_partial_entry(host_module: Any, tmp_path: Path) -> None:
    name, folder = host_module(HOST)
    proc = _child(name, folder, tmp_path, end="import os; os.kill(os.getpid(), 9)")  # right after the calls
    assert proc.returncode == -9
    committed = _manifests(tmp_path)
    assert len(committed) < 24  # the kill came while entries were pending (they are lost, none is partial)
    from skipweave.cli.main import main as cli

    assert cli(["verify", str(tmp_path)]) == 0
    m = sys.modules[name]
    skipweave.weave(_plan(tmp_path, name, calls_per_step=8))
    for step in range(1, 4):
        for _ in range(8):
            assert m.gen(step, n=1 << 17)["ids"].eq(step).all()
    skipweave.unweave()
    # a step whose 8 calls were not all committed is resumed: each committed entry serves one call with its inputs
    # (each entry once), only the calls beyond them run live
    kept = {s: sum(1 for p in committed if p.parent.parent.name == str(s)) for s in range(1, 4)}
    assert {s: m.CALLS.count(s) for s in range(1, 4)} == {s: 8 - kept[s] for s in range(1, 4)}


HYDRA_APP = '''
import os, sys
sys.path.insert(0, {folder!r})
import hydra
from omegaconf import DictConfig
import {name} as host


@hydra.main(version_base=None, config_path=None, config_name=None)
def main(cfg: DictConfig) -> None:
    for step in range(1, 4):
        for _ in range(4):
            host.gen(step, n=1 << 17)


if __name__ == "__main__":
    main()
    # the job has ended (Hydra's on_job_end ran); the interpreter's exit handlers have not
    dump = {dump!r}
    found = [f for base, _, names in os.walk(dump) for f in names if f.endswith(".manifest.json")]
    print("COMMITTED", len(found), flush=True)
    os._exit(0)  # no exit handler may write what the job's end did not
'''


def test_the_hydra_job_end_finishes_the_pending_writes(host_module: Any, tmp_path: Path) -> None:
    name, folder = host_module(HOST)
    app = tmp_path / "app.py"
    dump = tmp_path / "dump"
    app.write_text(textwrap.dedent(HYDRA_APP.format(folder=str(folder), name=name, dump=str(dump))))
    proc = subprocess.run(
        [sys.executable, str(app), "+skip=rollout_cache", f"skip.rollout.dump_dir={dump}",
         f"+skip.rollout.targets.gen={name}:gen", "++skip.rollout.step.source=arg", "++skip.rollout.step.arg=0",
         "++skip.rollout.step.path=", f"hydra.run.dir={tmp_path / 'out'}"],
        capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "COMMITTED 12" in proc.stdout, proc.stdout + proc.stderr


def test_a_forked_child_does_not_wait_for_the_parents_pending_writes(host_module: Any, tmp_path: Path,
                                                                     gate: threading.Event) -> None:
    name, _ = host_module(HOST)
    m = sys.modules[name]
    skipweave.weave(_plan(tmp_path, name, action="repeat", single_flight=False))
    m.gen(1)  # pending in the parent (the writer is held)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its writer is empty, and a replay of step 1 does not wait for the parent's entry
        try:
            ok = skipweave.flush(timeout=5) and WRITER.pending() == (0, 0)
            m.gen(2)  # nothing of the parent's is pending here: no wait (live, as the entry is not committed)
            os.write(write, json.dumps({"ok": bool(ok)}).encode())
        finally:
            os._exit(0)
    os.close(write)
    deadline = time.monotonic() + 60
    while (ended := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if ended[0] == 0:  # never hang the suite: the child is stuck (waiting for the parent's entry)
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child did not end within 60 s")
    answer = os.read(read, 1024)
    os.close(read)
    assert ended[1] == 0 and json.loads(answer) == {"ok": True}
    gate.set()
    skipweave.unweave()
    assert len(_manifests(tmp_path)) >= 1


def test_write_buffer_is_checked_and_named_in_errors() -> None:
    from skipweave.config.errors import ConfigError
    from skipweave.config.parse import parse_skip

    role = {"enable": True, "targets": {"g": "m:f"}}
    assert parse_skip({"rollout": {**role, "write_buffer": "512MiB"}}).roles["rollout"].write_buffer == 512 << 20
    assert parse_skip({"rollout": {**role, "write_buffer": "1.5GB"}}).roles["rollout"].write_buffer == 1_500_000_000
    for bad in (-1, "lots", True, [1], "0.5B", "1.7"):
        with pytest.raises(ConfigError, match=r"skip\.rollout\.write_buffer"):
            parse_skip({"rollout": {**role, "write_buffer": bad}})


def test_torch_tensors_staged_for_the_writer_own_their_memory(tmp_path: Path) -> None:
    store = StepStore(str(tmp_path), "default", "rollout")
    x = torch.arange(8)
    staged = store.stage({"x": x}, rng_state=None)
    owned = staged.copied()
    x.fill_(0)
    assert any(t.data_ptr() == x.data_ptr() for t in staged.tensors.values())  # staged alone shares the host's
    assert all(t.data_ptr() != x.data_ptr() for t in owned.tensors.values())
    assert sorted(t.tolist() for t in owned.tensors.values()) == [list(range(8))]


def test_a_flush_that_takes_over_a_second_shows_a_progress_bar(host_module: Any, tmp_path: Path,
                                                               gate: threading.Event,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    name, _ = host_module(HOST)
    m = sys.modules[name]
    monkeypatch.setenv("SKIPWEAVE_PROGRESS", "1")
    skipweave.weave(_plan(tmp_path, name))
    m.gen(1, n=1 << 16)
    threading.Timer(2.5, gate.set).start()  # the writer is held for longer than BAR_AFTER_S
    assert skipweave.flush() is True
    err = capsys.readouterr().err
    assert "finishing 1 pending recording" in err, err
    assert len(_manifests(tmp_path)) == 1


def test_a_write_through_process_writes_behind_within_a_scope_and_leaving_it_waits(
        host_module: Any, tmp_path: Path, gate: threading.Event, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a Ray worker does (skipweave.integrations.ray.actors wraps each task and actor method in scoped())."""
    import asyncio

    from skipweave.store import write_behind

    name, _ = host_module(HOST)
    m = sys.modules[name]
    monkeypatch.setattr(WRITER, "_through", "a test")
    skipweave.weave(_plan(tmp_path, name))
    m.gen(1)  # outside a scope: committed before it returns, though the writer is held
    assert len(_manifests(tmp_path)) == 1 and WRITER.pending()[0] == 0

    seen: dict[str, Any] = {}

    def method() -> None:  # a sync actor method calling the target twice, and once from a thread it starts
        with write_behind.scope() as inner:
            assert inner is None  # nested: the outermost waits
            m.gen(2)
        m.gen(3)
        seen["pending"] = WRITER.pending()[0]
        thread = threading.Thread(target=m.gen, args=(4,))
        thread.start()
        thread.join()
        seen["after_thread"] = WRITER.pending()[0]

    done = threading.Event()
    runner = threading.Thread(target=lambda: (write_behind.scoped(method)(), done.set()))
    runner.start()
    assert not done.wait(0.5)  # leaving the scope waits for the held writer
    assert seen == {"pending": 2, "after_thread": 2}  # steps 2, 3 behind; step 4 (the thread) written through
    gate.set()
    assert done.wait(30)
    runner.join()
    assert len(_manifests(tmp_path)) == 4

    async def coroutine_method() -> int:  # an async actor method
        m.gen(5)
        await asyncio.sleep(0)
        return WRITER.pending()[0]

    assert asyncio.iscoroutinefunction(write_behind.scoped(coroutine_method))
    gate.clear()

    async def drive() -> tuple[int, int]:
        ticks = 0
        task = asyncio.ensure_future(write_behind.scoped(coroutine_method)())
        while not task.done():  # the loop goes on while the method waits for its entry
            await asyncio.sleep(0.01)
            ticks += 1
            if ticks == 20:
                gate.set()
        return await task, ticks

    pending, ticks = asyncio.run(drive())
    assert pending == 1 and ticks >= 20 and len(_manifests(tmp_path)) == 5
    skipweave.unweave()

    def gen_fn() -> Iterator[int]:
        yield 1

    class Actor:
        @classmethod
        def build(cls) -> None: ...

    assert write_behind.scoped(gen_fn) is gen_fn and write_behind.scoped(Actor.build) == Actor.build


def test_a_recording_whose_scope_closed_while_it_was_staged_commits_before_its_call_returns(
        host_module: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread (or ``asyncio.to_thread``) carries the method's scope in its context; the method returns while the
    thread's recording copies its tensors. Nobody waits for that entry any more: the call must, in a process that
    writes through (a Ray worker, which may be killed as soon as its method returned)."""
    import contextvars

    from skipweave.store import write_behind
    from skipweave.store.step_store import Staged

    name, _ = host_module(HOST)
    m = sys.modules[name]
    monkeypatch.setattr(WRITER, "_through", "a test")
    skipweave.weave(_plan(tmp_path, name))
    staging, method_returned = threading.Event(), threading.Event()
    real = Staged.copied

    def held_copy(self: Staged) -> Staged:
        staging.set()
        assert method_returned.wait(30)
        return real(self)

    monkeypatch.setattr(Staged, "copied", held_copy)
    seen: dict[str, int] = {}

    def recording() -> None:
        m.gen(1)
        seen["on_disk"] = len(_manifests(tmp_path))

    def method() -> threading.Thread:
        thread = threading.Thread(target=contextvars.copy_context().run, args=(recording,))
        thread.start()
        assert staging.wait(30)  # the thread's recording is being staged: its scope was open when it chose
        return thread

    thread = write_behind.scoped(method)()
    method_returned.set()
    thread.join(30)
    assert seen == {"on_disk": 1}
    skipweave.unweave()


@pytest.fixture
def batches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the batches the background writer commits, in order."""
    from skipweave.store import write_behind

    sizes: list[int] = []
    real = write_behind._write

    def spied(batch: list[Any]) -> Any:
        sizes.append(len(batch))
        return real(batch)

    monkeypatch.setattr(write_behind, "_write", spied)
    return sizes


def test_while_small_entries_keep_coming_the_writer_holds_off_and_commits_them_as_one_group(
        host_module: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batches: list[int]) -> None:
    from skipweave.store import write_behind

    name, _ = host_module(HOST)
    m = sys.modules[name]
    monkeypatch.setattr(write_behind, "LINGER_GAP_S", 5.0)  # any pause of this loop is far shorter
    monkeypatch.setattr(write_behind, "LINGER_MAX_S", 120.0)
    skipweave.weave(_plan(tmp_path, name, calls_per_step=60))
    for _ in range(60):
        m.gen(1, n=128)
    assert WRITER.pending()[0] == 60 and batches == []  # nothing committed while they kept coming
    assert skipweave.flush() is True  # a flush is waited for: the writer commits what it holds at once
    assert batches == [60]
    skipweave.unweave()
    groups = list(tmp_path.rglob("*.pack.json"))
    assert len(groups) == 1 and len(_manifests(tmp_path)) == 60


def test_the_writer_does_not_hold_off_while_somebody_waits_for_it(
        host_module: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batches: list[int]) -> None:
    """Holding off would last an hour here: each wait below ends only because the writer saw it waited for."""
    from skipweave.store import write_behind

    name, _ = host_module(HOST)
    m = sys.modules[name]
    monkeypatch.setattr(write_behind, "LINGER_GAP_S", 3600.0)
    monkeypatch.setattr(write_behind, "LINGER_MAX_S", 3600.0)

    def ends(fn: Any) -> Any:
        out: list[Any] = []
        worker = threading.Thread(target=lambda: out.append(fn()), daemon=True)
        worker.start()
        worker.join(30)
        assert not worker.is_alive(), f"{fn} waited for a writer that held off"
        return out[0]

    # a flush
    skipweave.weave(_plan(tmp_path / "flush", name))
    m.gen(1)
    assert ends(skipweave.flush) is True
    skipweave.unweave()
    m.CALLS.clear()
    # a same-process replay of an entry still pending (repeat: step 2 is served step 1's entry)
    skipweave.weave(_plan(tmp_path / "replay", name, action="repeat", single_flight=False))
    m.gen(1)
    assert ends(lambda: m.gen(2))["step"] == 1 and m.CALLS == [1]
    skipweave.unweave()
    # a full write buffer: the second recording waits for room
    skipweave.weave(_plan(tmp_path / "full", name, write_buffer=6000))
    m.gen(1, n=512)
    ends(lambda: m.gen(2, n=512))
    # a unit of work (a Ray task) that returns once its recordings are committed
    skipweave.weave(_plan(tmp_path / "scope", name))
    monkeypatch.setattr(WRITER, "_through", "a test")
    ends(write_behind.scoped(lambda: m.gen(3)))
    monkeypatch.setattr(WRITER, "_through", None)
    assert WRITER.pending()[0] == 0
    # an entry over ENTRY_MAX_BYTES is committed as soon as the writer has it, nobody waiting
    skipweave.weave(_plan(tmp_path / "large", name))
    m.gen(1, n=(write_behind.ENTRY_MAX_BYTES // 8) + 1024)
    ends(lambda: [time.sleep(0.05) for _ in range(400) if WRITER.pending()[0]])
    assert WRITER.pending()[0] == 0
    skipweave.unweave()
    assert len(_manifests(tmp_path / "large")) == 1


@pytest.fixture
def staged(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Weak references to every staged entry the proxies hand to the writer (:meth:`Staged.copied`), in order."""
    import weakref

    from skipweave.store.step_store import Staged

    refs: list[weakref.ref[Staged]] = []
    real = Staged.copied

    def kept(self: Staged) -> Staged:
        out = real(self)
        refs.append(weakref.ref(out))
        return out

    monkeypatch.setattr(Staged, "copied", kept)
    return refs


def test_the_writer_lets_go_of_an_entry_once_it_is_written(host_module: Any, tmp_path: Path,
                                                          staged: list[Any]) -> None:
    """Not at its next batch: an idle writer would otherwise keep the last entry's copies (a large one's reused
    buffer too, which the pool's idle clear could then not free)."""
    import gc

    name, _ = host_module(HOST)
    m = sys.modules[name]
    skipweave.weave(_plan(tmp_path, name))
    m.gen(1, n=1 << 19)  # 4 MiB: copied into a pool buffer
    assert skipweave.flush() is True and len(staged) == 1
    for i in range(100):  # (flush returns as the writer ends its batch, a moment before it lets go of it)
        if i % 20 == 0:
            gc.collect()
        if staged[0]() is None:
            break
        time.sleep(0.05)
    assert staged[0]() is None, "the idle writer still holds the written entry"
    skipweave.unweave()


def test_a_failed_background_write_lets_go_of_its_entries_without_a_gc(host_module: Any, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       staged: list[Any]) -> None:
    """The failure's traceback held the writer's frames, which held the batch: a cycle only a GC collection broke."""
    import gc

    name, _ = host_module(HOST)
    m = sys.modules[name]
    def full(self: StepStore, *args: Any, **kwargs: Any) -> Any:
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(StepStore, "commit", full)
    monkeypatch.setattr(StepStore, "commit_many", full)
    skipweave.weave(_plan(tmp_path, name, calls_per_step=100))
    gc.disable()
    try:
        for _ in range(3):
            m.gen(1, n=1 << 14)
        assert skipweave.flush() is True
        for _ in range(100):
            if not any(r() is not None for r in staged):
                break
            time.sleep(0.05)
        assert len(staged) == 3 and not any(r() is not None for r in staged)
    finally:
        gc.enable()
    skipweave.unweave()
