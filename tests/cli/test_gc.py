"""``skipweave gc``: dry run by default, removes broken, leftover and incomplete data, never a complete valid
entry."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import filelock
import pytest
import torch

from skipweave.cli.main import main
from skipweave.store import gc as store_gc
from skipweave.store import scan as store_scan
from skipweave.store.format.manifest import file_checksum
from skipweave.store.leftovers import LeftoverKind
from skipweave.store.step_store import StepStore
from tests.cli.test_ls import NS, ROLE, Store, cli, make_store, payload


def _snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` (lock files included) with its checksum."""
    return {str(p.relative_to(root)): file_checksum(str(p)) for p in sorted(root.rglob("*")) if p.is_file()}


def _valid_files(s: Store) -> dict[str, str]:
    """Checksums of the manifest and payload files of every complete, valid entry."""
    out: dict[str, str] = {}
    for step, target, shard, call in s.complete:
        manifest = s.manifest(step, call, shard, target)
        names = [manifest.name] + [p["name"] for p in json.loads(manifest.read_text())["payload"]]
        out.update({str(manifest.parent / n): file_checksum(str(manifest.parent / n)) for n in names})
    return out


def _assert_valid_entries_intact(s: Store, before: dict[str, str]) -> None:
    assert {p: file_checksum(p) for p in before} == before
    store = StepStore(str(s.dump), NS, ROLE)
    for step, target, shard, call in s.complete:
        loaded = store.load(store.key(step, target, shard, call))
        assert torch.equal(loaded.result["ids"], payload(step, call, shard)["ids"])


def test_dry_run_changes_nothing_and_keeps_young_leftovers(tmp_path: Path, capsys: Any) -> None:
    s = make_store(tmp_path / "dump")
    before = _snapshot(s.dump)
    status, out, _ = cli(capsys, "gc", str(s.dump))
    assert status == 0 and _snapshot(s.dump) == before
    assert out.splitlines()[0] == f"gc {s.dump} (dry run: nothing is removed; pass --yes to remove)"
    would = [line for line in out.splitlines() if line.startswith("would remove")]
    assert len(would) == 4 and all("corrupt entry" in line for line in would)  # corrupt: removable at any age
    kept = [line for line in out.splitlines() if line.startswith("kept")]
    assert len(kept) == 5  # incomplete part, temporary file, 2 orphans, set-aside folder: a writer may own them
    assert "less than --min-age 3600 s" in out and "pass --min-age 0 if no run is writing" in out

    status, out, _ = cli(capsys, "gc", str(s.dump), "--min-age", "0", "--json")
    doc = json.loads(out)
    assert status == 0 and _snapshot(s.dump) == before
    assert set(doc) == {"schema", "dump_dir", "dry_run", "min_age_seconds", "actions", "freed_bytes",
                        "complete_entries_kept", "ignored"}
    assert doc["schema"] == "skipweave.gc/1" and doc["dry_run"] is True and doc["min_age_seconds"] == 0
    assert {a["outcome"] for a in doc["actions"]} == {"would_remove"}
    assert sorted(a["kind"] for a in doc["actions"]) == [
        "corrupt_entry", "corrupt_entry", "corrupt_entry", "corrupt_entry", "incomplete_part", "orphan", "orphan",
        "set_aside", "temporary"]
    action = next(a for a in doc["actions"] if a["kind"] == "incomplete_part")
    assert set(action) == {"kind", "path", "where", "files", "bytes", "reason", "outcome", "detail"}
    assert action["where"] == "default/rollout gen step 3 shard r0" and action["path"] == str(s.incomplete)
    assert action["reason"] == ("1 of 2 calls committed and never closed; removing it loses what a resume would "
                                "serve: a run whose calls are matched by inputs resumes the part, its entry serving "
                                "the call with the same inputs")
    assert sorted(Path(f).name for f in action["files"])[-1] == "r0.part.json" and len(action["files"]) == 4
    assert doc["complete_entries_kept"] == 12
    assert doc["freed_bytes"] == sum(a["bytes"] for a in doc["actions"])


def test_gc_says_whether_removing_an_incomplete_part_loses_what_a_resume_would_serve(
        tmp_path: Path, capsys: Any) -> None:
    dump = tmp_path / "dump"
    store = StepStore(str(dump), NS, ROLE, calls_per_step=3)
    for step, fingerprint in ((1, "f" * 32), (2, "")):  # interrupted runs: 2 of 3 calls, never closed
        store.prepare_part(step, "gen", "r0")
        for call in range(2):
            store.record(store.key(step, "gen", "r0", call), payload(step, call, "r0"), target_path="m:f",
                         fingerprint=fingerprint, rng_state=None, seconds=0.0)
    status, out, _ = cli(capsys, "gc", str(dump), "--calls-per-step", "3", "--min-age", "0", "--json")
    why = {a["where"]: a["reason"] for a in json.loads(out)["actions"]}
    assert status == 0 and why == {
        f"{NS}/{ROLE} gen step 1 shard r0": "2 of 3 calls committed and never closed; removing it loses what a resume "
        "would serve: a run whose calls are matched by inputs resumes the part, its 2 entries serving the calls with "
        "the same inputs",
        f"{NS}/{ROLE} gen step 2 shard r0": "2 of 3 calls committed and never closed; no run resumes it (an entry has "
        "no input fingerprint or no readable manifest): a run sets it aside and records the step afresh"}


def test_gc_yes_removes_broken_items_and_never_a_valid_entry(tmp_path: Path, capsys: Any) -> None:
    s = make_store(tmp_path / "dump")
    valid = _valid_files(s)
    status, out, _ = cli(capsys, "gc", str(s.dump), "--yes", "--min-age", "0")
    assert status == 0 and out.count("\nremoved ") == 9 and "FAILED" not in out
    _assert_valid_entries_intact(s, valid)
    for manifest in s.corrupt.values():
        assert not manifest.exists() and not list(manifest.parent.glob(manifest.name[:7] + ".*"))
    assert not list(s.incomplete.glob("r0*"))  # entry, payload and part file of the incomplete step
    assert not s.tmp_file.exists() and not any(p.exists() for p in s.orphans) and not s.set_aside.exists()
    assert list(s.target(4).glob(".r0.part.lock"))  # lock files stay: removing one could let two writers in

    status, out, _ = cli(capsys, "verify", str(s.dump))
    assert status == 0, out
    status, out, _ = cli(capsys, "gc", str(s.dump), "--yes", "--min-age", "0")
    assert status == 0 and out.splitlines()[-1] == "nothing to remove; 12 complete entries kept"
    _assert_valid_entries_intact(s, valid)


def test_gc_yes_with_default_min_age_removes_only_corrupt_entries(tmp_path: Path, capsys: Any) -> None:
    s = make_store(tmp_path / "dump")
    valid = _valid_files(s)
    status, out, _ = cli(capsys, "gc", str(s.dump), "--yes")
    assert status == 0
    assert all(not m.exists() for m in s.corrupt.values())
    assert s.tmp_file.exists() and all(p.exists() for p in s.orphans) and s.set_aside.exists()
    assert (s.incomplete / "r0-0000.manifest.json").exists()
    _assert_valid_entries_intact(s, valid)


def test_gc_rechecks_under_the_writer_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = make_store(tmp_path / "dump")
    result = store_scan.scan(str(s.dump), checksums=True)
    actions = {(a.kind.value, a.path): a for a in store_gc.plan_gc(result)}
    store = StepStore(str(s.dump), NS, ROLE)

    # A writer replaced the corrupt entry after the scan: gc must keep the new, valid one.
    repaired = actions[("corrupt_entry", str(s.corrupt["flipped"]))]
    store.record(store.key(4, "gen", "r0", 1), payload(4, 1), target_path="m:f", fingerprint="fp", rng_state=None,
                 seconds=0.1, replace=True)
    store_gc.apply_gc(result, repaired, min_age=0, dry_run=False)
    assert repaired.outcome == "skipped" and repaired.detail == "valid again (a writer replaced it)"
    assert torch.equal(store.load(store.key(4, "gen", "r0", 1)).result["ids"], payload(4, 1)["ids"])

    # A writer finished the incomplete step after the scan: gc must keep it.
    part = actions[("incomplete_part", str(s.incomplete))]
    store.record(store.key(3, "gen", "r0", 1), payload(3, 1), target_path="m:f", fingerprint="fp", rng_state=None,
                 seconds=0.1)
    store_gc.apply_gc(result, part, min_age=0, dry_run=False)
    assert part.outcome == "skipped" and part.detail == "complete now (a writer finished it)"
    assert len(list(s.incomplete.glob("r0-*.manifest.json"))) == 2

    # A writer holds the entry's lock: gc leaves it alone rather than wait.
    monkeypatch.setattr(store_gc, "LOCK_WAIT_S", 0.05)
    busy = actions[("corrupt_entry", str(s.corrupt["garbage"]))]
    holder = filelock.FileLock(str(s.target(7) / ".r0.part.lock"))  # another open file: flock conflicts
    with holder:
        store_gc.apply_gc(result, busy, min_age=0, dry_run=False)
    assert busy.outcome == "skipped" and busy.detail == "a writer holds its lock" and s.corrupt["garbage"].exists()
    store_gc.apply_gc(result, busy, min_age=0, dry_run=False)
    assert busy.outcome == "removed" and not s.corrupt["garbage"].exists()


def test_gc_console_script_json(tmp_path: Path) -> None:
    s = make_store(tmp_path / "dump")
    valid = _valid_files(s)
    script = Path(sys.executable).parent / "skipweave"
    proc = subprocess.run([str(script), "gc", str(s.dump), "--yes", "--min-age", "0", "--json"],
                          capture_output=True, text=True, timeout=120, env={**os.environ})
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["dry_run"] is False and {a["outcome"] for a in doc["actions"]} == {"removed"}
    assert doc["freed_bytes"] > 0 and doc["complete_entries_kept"] == 12
    _assert_valid_entries_intact(s, valid)


# ---------------------------------------------------------------------------------------------- run marks
DAY = 86400.0


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _run_folder(dump: Path, run: str, *, owner: dict[str, Any] | None = None, age_days: float = 0.0) -> Path:
    """A run's marks as its processes leave them (an owner file unless ``owner`` is None), all ``age_days`` old."""
    folder = dump / ".runs" / run
    (folder / NS / ROLE).mkdir(parents=True)
    for kind in ("called", "eligible"):
        (folder / NS / ROLE / f"gen.{kind}").touch()
    if owner is not None:
        doc = {"host": platform.node(), "pid": os.getpid(), "pid_namespace": _pid_namespace(), "process_start": None,
               "ended_unix": None} | owner
        (folder / ".owner.json").write_text(json.dumps(doc))
    _age(folder, age_days)
    return folder


def _age(folder: Path, days: float) -> None:
    """Set the modification time of ``folder`` and of everything in it (symlinks themselves) ``days`` back."""
    when = time.time() - days * DAY
    for path in [*folder.rglob("*"), folder]:
        os.utime(path, (when, when), follow_symlinks=False)


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: its pid is free
    return child.pid


def test_gc_lists_and_removes_the_marks_of_ended_runs_and_keeps_live_ones(tmp_path: Path, capsys: Any) -> None:
    s = make_store(tmp_path / "dump", damage=False)
    valid = _valid_files(s)
    gone = _run_folder(s.dump, "gone", owner={"pid": _dead_pid()})  # fresh marks: kept for --min-age
    exited = _run_folder(s.dump, "exited", owner={"ended_unix": time.time() - 2 * DAY}, age_days=2)
    remote_old = _run_folder(s.dump, "remote-old", owner={"host": "elsewhere", "pid": 1}, age_days=8)
    orphan_old = _run_folder(s.dump, "no-owner-old", age_days=8)
    container = _run_folder(s.dump, "container-old", owner={"pid_namespace": "pid:[1]"}, age_days=8)
    reused = _run_folder(s.dump, "pid-reused", owner={"process_start": -1}, age_days=1)  # this pid, another start
    live = _run_folder(s.dump, "live", owner={}, age_days=30)  # its first process is this test: alive
    remote_young = _run_folder(s.dump, "remote-young", owner={"host": "elsewhere", "pid": 1}, age_days=6)
    orphan_young = _run_folder(s.dump, "no-owner-young", age_days=1)
    kept_always = [live, remote_young, orphan_young]
    ended = [gone, exited, remote_old, orphan_old, container, reused]
    size = sum(p.stat().st_size for f in ended for p in f.rglob("*") if p.is_file())

    status, out, _ = cli(capsys, "gc", str(s.dump))
    assert status == 0, out
    assert f"would remove run marks           {s.dump / '.runs'}  (5 run folders, " in out
    assert f"kept         run marks           {s.dump / '.runs'}  (1 run folder, " in out
    assert "less than --min-age 3600 s" in out

    status, out, _ = cli(capsys, "gc", str(s.dump), "--min-age", "0", "--json")
    doc = json.loads(out)
    marks = {a["where"]: a for a in doc["actions"] if a["kind"] == "run_marks"}
    assert set(marks) == {f"run {f.name}" for f in ended}
    assert {a["outcome"] for a in marks.values()} == {"would_remove"} and doc["freed_bytes"] == size
    assert marks["run gone"]["reason"].endswith("is gone") and "on this host" in marks["run gone"]["reason"]
    assert "wrote at its exit" in marks["run exited"]["reason"]
    assert "host 'elsewhere'" in marks["run remote-old"]["reason"] and "8.0 days" in marks["run remote-old"]["reason"]
    assert "names no first process" in marks["run no-owner-old"]["reason"]
    assert "another pid namespace" in marks["run container-old"]["reason"]
    assert marks["run pid-reused"]["path"] == str(reused) and marks["run pid-reused"]["files"] == [str(reused)]
    assert all(f.exists() for f in ended)  # a dry run

    status, out, _ = cli(capsys, "gc", str(s.dump), "--yes", "--min-age", "0")
    assert status == 0 and f"removed      run marks           {s.dump / '.runs'}  (6 run folders, " in out
    assert not any(f.exists() for f in ended) and all(f.exists() for f in kept_always)
    assert sorted(p.name for p in (s.dump / ".runs").iterdir()) == sorted(f.name for f in kept_always)
    _assert_valid_entries_intact(s, valid)
    status, out, _ = cli(capsys, "gc", str(s.dump), "--yes", "--min-age", "0")
    assert status == 0 and "nothing to remove" in out


def test_gc_judges_a_run_again_before_removing_its_marks(tmp_path: Path) -> None:
    s = make_store(tmp_path / "dump", damage=False)
    folder = _run_folder(s.dump, "back", owner={"pid": _dead_pid()}, age_days=1)
    result = store_scan.scan(str(s.dump), checksums=True)
    action = next(a for a in store_gc.plan_gc(result) if a.kind is store_gc.GcKind.RUN_MARKS)
    (folder / ".owner.json").write_text(json.dumps({  # meanwhile: named a live process as its first
        "host": platform.node(), "pid": os.getpid(), "pid_namespace": _pid_namespace(), "process_start": None}))
    store_gc.apply_gc(result, action, min_age=0, dry_run=False)
    assert action.outcome == "skipped" and "no longer known to have ended" in (action.detail or "")
    assert folder.exists()

    (folder / ".owner.json").write_text(json.dumps({"host": "elsewhere", "pid": 1, "pid_namespace": "",
                                                    "ended_unix": time.time()}))
    (folder / NS / ROLE / "gen.called").touch()  # a process of the run that outlived its first one marked
    store_gc.apply_gc(result, action, min_age=3600, dry_run=False)
    assert action.outcome == "skipped" and "less than --min-age 3600 s" in (action.detail or "")
    _age(folder, 1)
    store_gc.apply_gc(result, action, min_age=3600, dry_run=False)
    assert action.outcome == "removed" and not folder.exists()


def test_gc_survives_crafted_run_marks_and_never_acts_outside(tmp_path: Path, capsys: Any) -> None:
    s = make_store(tmp_path / "dump", damage=False)
    outside = tmp_path / "outside"
    (outside / "run" / NS).mkdir(parents=True)
    (outside / "precious").write_text("keep me")
    (outside / "owner.json").write_text(json.dumps({"host": "x", "pid": 1, "pid_namespace": "", "ended_unix": 1.0}))
    runs = s.dump / ".runs"
    runs.mkdir()
    (runs / "evil").symlink_to(outside)  # a run's folder that is a symlink out of the dump dir
    (runs / "a-file").write_text("not a folder")
    for odd in ("we ird", "-dash", "..x", "ü"):
        (runs / odd).mkdir()
    _age(outside, 30)
    crafted = _run_folder(s.dump, "crafted")
    (crafted / NS / "out").symlink_to(outside)  # a symlink inside a run's folder: removed itself, never followed
    (crafted / ".owner.json").symlink_to(outside / "owner.json")  # a planted owner: never read through a link
    deep = crafted / NS
    for _ in range(300):
        deep = deep / "d"
    deep.mkdir(parents=True)
    weird_owner = [_run_folder(s.dump, name, age_days=0) for name in ("owner-dir", "owner-junk", "owner-big",
                                                                      "owner-fifo", "owner-odd")]
    (weird_owner[0] / ".owner.json").mkdir()
    (weird_owner[1] / ".owner.json").write_bytes(b"\xff[[[" + b"[" * 3000)
    (weird_owner[2] / ".owner.json").write_text(json.dumps({"host": platform.node(), "pid": os.getpid(),
                                                            "pid_namespace": _pid_namespace(), "pad": "x" * 9000}))
    os.mkfifo(weird_owner[3] / ".owner.json")  # opening it to read would block until a writer came
    (weird_owner[4] / ".owner.json").write_text(json.dumps({"host": platform.node(), "pid": 2**80,
                                                            "pid_namespace": _pid_namespace()}))
    for folder in [crafted, *weird_owner]:
        _age(folder, 8)
    before = {p: p.read_bytes() for p in outside.rglob("*") if p.is_file()}

    status, out, _ = cli(capsys, "gc", str(s.dump), "--json", "--min-age", "0")
    doc = json.loads(out)
    assert status == 0
    ignored = {Path(i["path"]).name: i["why"] for i in doc["ignored"]}
    assert ignored["evil"] == "a symlink (never followed)"
    assert ignored["a-file"] == "a file where a run's folder belongs"
    assert {ignored[n] for n in ("we ird", "-dash", "..x", "ü")} == {"a folder name skipweave never writes"}
    marks = {a["where"]: a["reason"] for a in doc["actions"] if a["kind"] == "run_marks"}
    assert set(marks) == {"run crafted", *(f"run {f.name}" for f in weird_owner)}
    assert all("names no first process" in why for why in marks.values())  # no owner read: judged by age

    status, out, _ = cli(capsys, "gc", str(s.dump), "--yes", "--min-age", "0")
    assert status == 0 and "FAILED" not in out, out
    assert not crafted.exists() and not any(f.exists() for f in weird_owner)
    assert {p: p.read_bytes() for p in outside.rglob("*") if p.is_file()} == before
    assert (outside / "run" / NS).is_dir() and (runs / "evil").is_symlink() and (runs / "a-file").is_file()


def test_gc_never_takes_a_driver_s_mark_by_age_and_removes_it_once_its_run_ended(
        tmp_path: Path, capsys: Any, host_module: Any) -> None:
    # A Ray driver on another host marked the dump dir at ray.init; nothing in its run folder changed for 8 days
    # (its workers mark only their first calls); gc, here, must not take the mark a worker started now checks.
    import skipweave
    from skipweave.store.identity import run_id
    from skipweave.store.shared_mark import write_mark
    from skipweave.weaving import shared_dirs

    dump = tmp_path / "dump"
    dump.mkdir()
    name, _ = host_module("def gen(step):\n    return {'step': step}\n")
    skipweave.weave({"skip": {ROLE: {"enable": True, "dump_dir": str(dump), "require_shared": True,
                                     "step": {"source": "arg", "arg": 0, "path": ""},
                                     "targets": {"gen": f"{name}:gen"}}}})
    marks, failed = shared_dirs.leave_marks([str(dump)])
    assert failed == {}
    run = run_id()
    driver = dump / ".runs" / run
    remote = {"host": "head-node", "pid": 4242, "pid_namespace": "x", "process_start": 1, "ended_unix": None}
    (driver / ".owner.json").write_text(json.dumps(remote))
    _age(driver, 8)
    unmarked = _run_folder(dump, "remote-unmarked", owner={"host": "head-node", "pid": 1}, age_days=8)
    junk = _run_folder(dump, "remote-junk-mark", owner={"host": "head-node", "pid": 1})
    (junk / ".shared.json").write_text('{"token": "not one skipweave wrote"}')  # no worker accepts it: no mark
    no_owner = _run_folder(dump, "marked-no-owner")
    write_mark(str(dump), "marked-no-owner", "a" * 32)
    here_gone = _run_folder(dump, "marked-here-gone", owner={"pid": _dead_pid()})
    write_mark(str(dump), "marked-here-gone", "b" * 32)
    for folder in (junk, no_owner, here_gone):
        _age(folder, 8)

    status, out, _ = cli(capsys, "gc", str(dump), "--yes", "--min-age", "0", "--json")
    marks_doc = {a["where"]: a for a in json.loads(out)["actions"] if a["kind"] == "run_marks"}
    assert status == 0 and driver.is_dir() and no_owner.is_dir()
    assert {w: a["outcome"] for w, a in marks_doc.items()} == {
        f"run {run}": "skipped", "run marked-no-owner": "skipped", "run remote-unmarked": "removed",
        "run remote-junk-mark": "removed", "run marked-here-gone": "removed"}
    kept = marks_doc[f"run {run}"]
    assert "host 'head-node'" in kept["reason"] and "8.0 days" in kept["reason"]
    assert ".shared.json" in kept["detail"] and "gc on host 'head-node' removes it" in kept["detail"]
    assert "remove the folder by hand" in marks_doc["run marked-no-owner"]["detail"]
    assert not any(f.exists() for f in (unmarked, junk, here_gone))  # the age rule and the host rule still apply

    shared_dirs.expect_marks(run, marks, where="pid=1 node=restarted-actor")  # a worker started after that gc
    try:
        assert sys.modules[name].gen(1) == {"step": 1}  # no DumpDirNotShared: its dump dir is the driver's
    finally:
        shared_dirs.expect_marks("", {}, where="")

    _age(driver, 8)  # (the worker's call marked it afresh)
    status, out, _ = cli(capsys, "gc", str(dump), "--min-age", "0")
    assert status == 0 and "kept         run marks" in out and "their runs are not known to have ended" in out
    assert "gc on host 'head-node' removes it once the run's first process is gone (and 1 more)" in out
    (driver / ".owner.json").write_text(json.dumps(remote | {"ended_unix": time.time() - DAY}))  # the run ended
    _age(driver, 1)
    status, out, _ = cli(capsys, "gc", str(dump), "--yes", "--min-age", "0")
    assert status == 0 and f"removed      run marks           {dump / '.runs'}  (1 run folder, " in out
    assert not driver.exists() and no_owner.is_dir()


@pytest.mark.parametrize("kind", ["symlink", "file"])
def test_gc_leaves_a_runs_folder_that_is_a_symlink_or_a_file_alone(tmp_path: Path, capsys: Any, kind: str) -> None:
    s = make_store(tmp_path / "dump", damage=False)
    outside = tmp_path / "outside"
    _run_folder(outside, "old", age_days=30)
    if kind == "symlink":
        (s.dump / ".runs").symlink_to(outside / ".runs")
    else:
        (s.dump / ".runs").write_text("not a folder")
    status, out, _ = cli(capsys, "gc", str(s.dump), "--yes", "--min-age", "0")
    assert status == 0 and "run folder" not in out
    assert f"{s.dump / '.runs'}: a " in out  # listed as ignored
    assert (outside / ".runs" / "old" / NS / ROLE / "gen.called").exists()


# --- retention: --keep-last, --max-bytes, --pin ---------------------------------------------------------------


def _steps_store(dump: Path, steps: int, calls: int = 1, role: str = ROLE) -> StepStore:
    store = StepStore(str(dump), NS, role)
    for step in range(1, steps + 1):
        store.prepare_part(step, "gen", "r0")
        for call in range(calls):
            store.record(store.key(step, "gen", "r0", call), payload(step, call, "r0"), target_path="m:f",
                         fingerprint="", rng_state=None, seconds=0.0)
        store.close_part(step, "gen", "r0")
    return store


def _recorded(dump: Path, role: str = ROLE) -> list[int]:
    from skipweave.store.format.layout import list_steps

    return list_steps(str(dump), NS, role)


def test_gc_retention_dry_run_lists_what_the_real_run_removes(tmp_path: Path, capsys: Any) -> None:
    dump = tmp_path / "dump"
    _steps_store(dump, 6)
    _steps_store(dump, 3, role="ref")
    before = _snapshot(dump)
    status, out, _ = cli(capsys, "gc", str(dump), "--keep-last", "2", "--pin", "1", "--role", ROLE, "--json")
    doc = json.loads(out)
    assert status == 0 and _snapshot(dump) == before and doc["schema"] == "skipweave.gc/1"
    assert doc["retention"] == {"keep_last": 2, "max_bytes": None, "pin": ["1"], "namespace": None, "role": ROLE}
    planned = [(a["where"], a["outcome"]) for a in doc["actions"] if a["kind"] == "retention"]
    assert planned == [(f"{NS}/{ROLE} step 1", "skipped"), *((f"{NS}/{ROLE} step {s}", "would_remove")
                                                              for s in (2, 3, 4))]
    assert doc["freed_bytes"] == sum(a["bytes"] for a in doc["actions"] if a["outcome"] == "would_remove") > 0
    status, text, _ = cli(capsys, "gc", str(dump), "--keep-last", "2", "--pin", "1", "--role", ROLE)
    assert "would remove recorded step       default/rollout step 2" in text and "kept: pinned" in text

    status, out, _ = cli(capsys, "gc", str(dump), "--keep-last", "2", "--pin", "1", "--role", ROLE, "--json", "--yes")
    done = [(a["where"], a["outcome"]) for a in json.loads(out)["actions"] if a["kind"] == "retention"]
    assert status == 0 and done == [(w, o.replace("would_remove", "removed")) for w, o in planned]
    assert _recorded(dump) == [1, 5, 6] and _recorded(dump, "ref") == [1, 2, 3]  # --role: the other role kept
    status, out, _ = cli(capsys, "verify", str(dump))
    assert status == 0, out

    status, _, err = cli(capsys, "gc", str(dump), "--pin", "3")
    assert status == 2 and "needs --keep-last or --max-bytes" in err
    status, _, err = cli(capsys, "gc", str(dump), "--keep-last", "1", "--role", "../x")
    assert status == 2 and "--role" in err
    status, out, _ = cli(capsys, "gc", str(dump), "--max-bytes", "0", "--yes", "--min-age", "0")
    assert status == 0 and _recorded(dump) == [] and _recorded(dump, "ref") == []


@pytest.mark.parametrize("size", ["9" * 400, "9" * 400 + "GiB", "-1", "0.5B", "lots"])
def test_gc_max_bytes_that_is_no_size_is_a_usage_error_naming_it(tmp_path: Path, capsys: Any, size: str) -> None:
    dump = tmp_path / "dump"
    _steps_store(dump, 2)
    with pytest.raises(SystemExit) as exc:  # 400 digits were an OverflowError traceback (float infinity)
        main(["gc", str(dump), "--max-bytes", size, "--yes", "--min-age", "0"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "argument --max-bytes: expected a size in bytes from 0 to 2**63 - 1" in err, err
    assert _recorded(dump) == [1, 2]


def test_gc_retention_scoped_to_a_role_or_namespace_the_dump_dir_lacks_is_a_usage_error(
        tmp_path: Path, capsys: Any) -> None:
    dump = tmp_path / "dump"
    _steps_store(dump, 2)
    _steps_store(dump, 2, role="ref")
    before = _snapshot(dump)
    status, out, err = cli(capsys, "gc", str(dump), "--keep-last", "1", "--role", "rollotu", "--yes")
    assert status == 2 and out == "" and _snapshot(dump) == before
    assert err.strip() == (f"skipweave gc: --role 'rollotu' names no role with recorded steps in {dump}; "
                           "it has: ref, rollout")
    status, _, err = cli(capsys, "gc", str(dump), "--keep-last", "1", "--namespace", "defualt", "--yes")
    assert status == 2 and "--namespace 'defualt'" in err and err.strip().endswith("it has: default")
    status, _, err = cli(capsys, "gc", str(dump), "--keep-last", "1", "--namespace", NS, "--role", "rollotu")
    assert status == 2 and f"in namespace {NS} of {dump}; it has: ref, rollout" in err
    assert _snapshot(dump) == before
    status, _, _ = cli(capsys, "gc", str(dump), "--keep-last", "1", "--namespace", NS, "--role", "ref", "--yes")
    assert status == 0 and _recorded(dump, "ref") == [2] and _recorded(dump) == [1, 2]


def test_gc_keep_last_killed_mid_cleanup_leaves_no_partial_step(tmp_path: Path, host_module: Any) -> None:
    import signal

    dump = tmp_path / "dump"
    _steps_store(dump, 150, calls=2)
    role_dir = dump / NS / ROLE
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "skipweave.cli", "gc", str(dump), "--keep-last", "5", "--yes",
                             "--min-age", "0"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while proc.poll() is None and not any(n.startswith(".trash-") for n in os.listdir(role_dir)):
            time.sleep(0.0005)  # poll until the first step is set aside for removal
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, "gc ended before it was killed"
    left = _recorded(dump)
    assert set(range(146, 151)) <= set(left) and len(left) > 5  # killed in the middle

    # A replay serves every step left whole (both calls), and nothing of a step being removed.
    name, _ = host_module("CALLS = []\n\ndef gen(step, call):\n    CALLS.append(step)\n    return None\n")
    import skipweave

    skipweave.weave({"skip": {ROLE: {"enable": True, "dump_dir": str(dump), "replay_only": True,
                                     "calls_per_step": 2, "fingerprint": {"on_mismatch": "warn"},
                                     "targets": {"gen": f"{name}:gen"}}}})
    try:
        host = sys.modules[name]
        for step in left:
            skipweave.set_step(step)
            for call in range(2):
                assert torch.equal(host.gen(step, call)["ids"], payload(step, call, "r0")["ids"])
        assert host.CALLS == []
    finally:
        skipweave.unweave()
    result = store_scan.scan(str(dump), checksums=True)
    assert all(p.status is store_scan.Status.COMPLETE and len(p.entries) == 2 for p in result.parts)
    trash = [x for x in result.leftovers if x.kind is LeftoverKind.TRASH]

    status = subprocess.run([sys.executable, "-m", "skipweave.cli", "gc", str(dump), "--keep-last", "5", "--yes"],
                            env=env, capture_output=True, text=True)
    assert status.returncode == 0, status.stderr
    assert _recorded(dump) == list(range(146, 151)) and not [n for n in os.listdir(role_dir) if "trash" in n]
    assert len(trash) <= 1  # at most the one step whose deletion the kill interrupted
