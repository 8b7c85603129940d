"""What interrupted writes leave (``.tmp-`` and orphan payload files) is removed by the next run, not only by gc: at
once when its writer ended on this host, after an hour when its writer cannot be asked; never while its writer runs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from skipweave.cli.main import main
from skipweave.store import upkeep
from skipweave.store.atomic import tmp_name, tmp_writer
from skipweave.store.identity import place, process_start
from skipweave.store.leftovers import LeftoverKind, role_leftovers
from tests.store.crafting import manifests, rewrite

pytestmark = pytest.mark.slow  # starts processes: left out of the fast tier (README)

NS, ROLE = "default", "rollout"
MB = 48  # a payload big enough that its write takes a while: the kill lands in it

_HOST = f"""
import torch
CALLS = []
def gen(step):
    CALLS.append(step)
    return {{"ids": torch.full(({MB} << 18,), step, dtype=torch.int32)}}
"""

_RUN = '''
import logging, sys, threading
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
sys.path.insert(0, {host!r})
import skipweave, {name} as host
skipweave.weave({{"skip": {{"rollout": {{"enable": True, "dump_dir": {dump!r}, "targets": {{"gen": "{name}.gen"}}}}}}}})
for step in {steps!r}:
    skipweave.set_step(step)
    host.gen(step)
for t in threading.enumerate():  # (the test looks at what the upkeep did: it waits for it to finish)
    if t.name == "skipweave-upkeep" and {wait!r}:
        t.join()
'''


def _script(host: tuple[str, Path], dump: Path, steps: Any, *, wait: bool = True) -> list[str]:
    name, folder = host
    return [sys.executable, "-c", _RUN.format(host=str(folder), name=name, dump=str(dump), steps=steps, wait=wait)]


def _temporaries(dump: Path) -> set[Path]:
    return {p for p in dump.rglob(".tmp-*") if "_set_aside" not in p.parts}


def _killed_mid_write(host: tuple[str, Path], dump: Path, sig: signal.Signals, rank: int) -> tuple[
        subprocess.Popen[bytes], set[Path]]:
    """Start a recording process (shard ``r{rank}``) and send it ``sig`` as soon as it has a payload file under a
    temporary name with data in it; return the process and the temporary files it left (retried until some are)."""
    for _ in range(10):
        before = _temporaries(dump)
        proc = subprocess.Popen(_script(host, dump, range(1, 10_000), wait=False), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env={**os.environ, "RANK": str(rank)})
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            mine = {p for p in _temporaries(dump) - before if (w := tmp_writer(p.name)) and w.pid == proc.pid}
            if any(p.name.endswith(".safetensors") and p.stat().st_size > 0 for p in mine if p.exists()):
                break
            time.sleep(0.001)
        proc.send_signal(sig)
        if sig is signal.SIGKILL:
            proc.wait()
        left = {p for p in _temporaries(dump) - before if (w := tmp_writer(p.name)) and w.pid == proc.pid}
        if left:
            return proc, left
        proc.kill()
        proc.wait()
    raise AssertionError("no kill landed in a write")


def _old(path: Path, seconds: float = 2 * 3600) -> Path:
    t = time.time() - seconds
    os.utime(path, (t, t))
    return path


def _craft(dump: Path) -> dict[str, Path]:
    """Leftovers whose writer cannot be asked (another host, an older name) and orphans, young and old; a part of a
    foreign format version with an old orphan and an old temporary file in it."""
    step = manifests(dump)[0].parent  # a target folder holding a committed entry (step 1)
    payload = next(p for p in step.iterdir() if p.name.endswith(".tensors.safetensors"))
    foreign_step = dump / NS / ROLE / "9000"
    shutil.copytree(step.parent, foreign_step, ignore=shutil.ignore_patterns(".tmp-*"))
    for m in manifests(foreign_step):
        rewrite(m, fields={"format_version": 99, "step": 9000})
    elsewhere = "0" * 12 if place() != "0" * 12 else "1" * 12
    out = {
        "remote_young": step / f".tmp-0badc0de.4242.77.{elsewhere}-r0-0005.manifest.json",
        "remote_old": step / f".tmp-0badc0df.4242.77.{elsewhere}-r0-0006.manifest.json",
        "unnamed_young": step / ".tmp-0123456789ab-r0-0007.manifest.json",
        "unnamed_old": step / ".tmp-0123456789ac-r0-0008.manifest.json",
        "orphan_young": step / "r0-0009.0badc0de.tensors.safetensors",
        "orphan_old": step / "r0-0010.0badc0de.tensors.safetensors",
    }
    for key, path in out.items():
        shutil.copyfile(payload, path)
        if key.endswith("_old"):
            _old(path)
    target = manifests(foreign_step)[0].parent
    out["foreign_orphan"] = target / "r0-0011.0badc0de.tensors.safetensors"
    shutil.copyfile(payload, out["foreign_orphan"])
    _old(out["foreign_orphan"])
    out["foreign_temporary"] = target / ".tmp-0123456789ad-r0-0011.manifest.json"
    out["foreign_temporary"].write_text("{")
    _old(out["foreign_temporary"])
    return out


def _files(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and not p.name.endswith(".lock")}


def test_the_next_run_removes_what_killed_writers_left_and_keeps_a_running_writers(tmp_path: Path,
                                                                                  host_module: Any) -> None:
    host = host_module(_HOST, import_now=False)
    dump = tmp_path / "dump"
    assert subprocess.run(_script(host, dump, [1, 2]), capture_output=True, timeout=300).returncode == 0
    stopped, live_left = _killed_mid_write(host, dump, signal.SIGSTOP, 0)  # a writer that still runs, halfway
    try:
        # another rank's writer, killed: its own upkeep kept what the running writer is writing
        dead, dead_left = _killed_mid_write(host, dump, signal.SIGKILL, 1)
        assert dead.returncode == -signal.SIGKILL and all(p.exists() for p in live_left)
        crafted = _craft(dump)
        foreign = {p: b for p, b in _files(dump / NS / ROLE / "9000").items() if "/.tmp-" not in p
                   and not p.endswith("r0-0011.0badc0de.tensors.safetensors")}

        # the next run: a fresh process replaying the role
        out = subprocess.run(_script(host, dump, [1, 2]), capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        assert "terminate called" not in out.stderr
        gone = dead_left | {crafted[k] for k in ("remote_old", "unnamed_old", "orphan_old", "foreign_temporary")}
        kept = live_left | {crafted[k] for k in ("remote_young", "unnamed_young", "orphan_young", "foreign_orphan")}
        assert not [p for p in gone if p.exists()]
        assert all(p.exists() for p in kept)
        assert {p: b for p, b in _files(dump / NS / ROLE / "9000").items() if p in foreign} == foreign
        freed = sum(1 for _ in gone)
        line = next(x for x in out.stderr.splitlines() if "interrupted writes left" in x)
        assert line.startswith("INFO skipweave: role rollout: removed ") and f"{freed} file(s)" in line, line
        assert f"({len(dead_left) + 3} temporary, 1 orphan payload;" in line and "bytes)" in line

        # gc makes the same judgement: a running writer's temporary files stay at any --min-age
        shutil.rmtree(dump / NS / ROLE / "9000")  # (done with: gc's view of foreign entries is tested with gc)
        assert main(["gc", str(dump), "--yes", "--min-age", "0"]) == 0
        assert all(p.exists() for p in live_left)
    finally:
        stopped.kill()
        stopped.wait()
    # once that writer is gone, the next run removes what it left, whatever its age
    out = subprocess.run(_script(host, dump, [2]), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "terminate called" not in out.stderr, out.stderr
    assert not [p for p in live_left if p.exists()]


def test_one_judgement_for_runs_and_gc(tmp_path: Path, capsys: Any) -> None:
    folder = tmp_path / "dump" / NS / ROLE / "1" / "gen"
    folder.mkdir(parents=True)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                               text=True, check=True)
        dead_pid = int(ended.stdout)
        start = process_start(sleeper.pid)
        live = folder / f".tmp-00000001.{sleeper.pid}.{start or 0}.{place()}-r0-0000.manifest.json"
        dead = folder / f".tmp-00000002.{dead_pid}.0.{place()}-r0-0001.manifest.json"
        reused = folder / f".tmp-00000003.{sleeper.pid}.{(start or 0) + 1}.{place()}-r0-0002.manifest.json"
        mine = Path(tmp_name(str(folder), "r0-0003.manifest.json"))
        for p in (live, dead, reused, mine):
            p.write_bytes(b"x" * 10)
            _old(p, 10 * 24 * 3600)  # age is no proof here: the writer's process is asked
        assert tmp_writer(mine.name) is not None and tmp_writer(mine.name).running() is True  # type: ignore[union-attr]
        now = time.time()
        for p, why in ((live, "is still running"), (mine, "is still running"), (dead, None), (reused, None)):
            got = upkeep.leftover_kept(LeftoverKind.TEMPORARY, str(p), p.stat().st_mtime, min_age=0, now=now)
            assert (got is None) if why is None else (why in (got or "")), (p.name, got)
        dead.write_bytes(b"y")  # a young one of a writer that ended: removed at any age
        assert main(["gc", str(tmp_path / "dump"), "--yes"]) == 0
        out = capsys.readouterr().out
        assert not dead.exists() and not reused.exists() and live.exists() and mine.exists()
        assert f"its writer (pid {sleeper.pid} on this host) is still running" in out
        done = upkeep.clean_role(str(tmp_path / "dump"), NS, ROLE)
        assert (done.temporary, done.orphan, done.finished) == (0, 0, True) and len(done.kept) == 2
    finally:
        sleeper.kill()
        sleeper.wait()
    done = upkeep.clean_role(str(tmp_path / "dump"), NS, ROLE)
    assert done.temporary == 1 and done.bytes == 10 and not live.exists() and mine.exists()


def test_names_and_walk(tmp_path: Path) -> None:
    name = os.path.basename(tmp_name(str(tmp_path), "r0-0000.abcd1234.tensors.safetensors"))
    assert name.startswith(".tmp-") and name.endswith("-r0-0000.abcd1234.tensors.safetensors")
    writer = tmp_writer(name)
    assert writer is not None and writer.pid == os.getpid() and writer.place == place()
    for odd in (".tmp-0123456789ab-r0-0000.manifest.json", ".tmp-0badc0de.0.0.000000000000-x",
                ".tmp-0badc0de.12.0.00000000000-x", "r0-0000.manifest.json"):
        assert tmp_writer(odd) is None, odd
    folder = tmp_path / NS / ROLE / "3" / "gen"
    folder.mkdir(parents=True)
    names = ["r0-0000.manifest.json", "r0-0000.aa.tree.json", "r0-0000.aa.tensors.safetensors",  # an entry
             "r0-0001.bb.tree.json",  # its manifest never came
             "r0-0002-0005.pack.json", "r0-0002-0005.cc.pack.safetensors",  # a group
             "r0-0006-0007.dd.pack.safetensors",  # its group file never came
             ".tmp-0123456789ab-r0-0008.manifest.json", ".r0.part.lock", "r0.part.json"]
    for n in names:
        (folder / n).write_text("x")
    (tmp_path / NS / ROLE / "_set_aside" / "3-gen-r0-1").mkdir(parents=True)
    (tmp_path / NS / ROLE / "_set_aside" / "3-gen-r0-1" / ".tmp-0123456789ab-r0-0000.manifest.json").write_text("x")
    (tmp_path / NS / ROLE / "4").symlink_to(folder.parent)  # never followed
    found = {(x.kind, os.path.basename(x.path), x.stem) for x in role_leftovers(str(tmp_path), NS, ROLE)}
    assert found == {(LeftoverKind.ORPHAN, "r0-0001.bb.tree.json", "r0-0001"),
                     (LeftoverKind.ORPHAN, "r0-0006-0007.dd.pack.safetensors", "r0-0006-0007"),
                     (LeftoverKind.TEMPORARY, ".tmp-0123456789ab-r0-0008.manifest.json", None)}
    assert list(role_leftovers(str(tmp_path), NS, ROLE, stop=lambda: True)) == []


@pytest.mark.parametrize("foreign", [False, True])
def test_an_orphan_goes_only_under_its_parts_lock_and_never_from_a_foreign_part(tmp_path: Path,
                                                                                 foreign: bool) -> None:
    folder = tmp_path / "dump" / NS / ROLE / "1" / "gen"
    folder.mkdir(parents=True)
    orphan = folder / "r0-0001.0badc0de.tree.json"
    orphan.write_text("{}")
    _old(orphan)
    doc = {"format_version": 99 if foreign else 2, "role": ROLE, "target": "gen", "step": 1, "call_index": 0,
           "shard": "r0", "payload": [], "input_fingerprint": ""}
    (folder / "r0-0000.manifest.json").write_text(json.dumps(doc))
    from skipweave.store.parts import part_lock

    with part_lock(str(folder), "r0"):  # a writer commits into the part: the orphan waits
        assert "lock" in (upkeep.clean_role(str(tmp_path / "dump"), NS, ROLE).kept[0][1])
    assert orphan.exists()
    done = upkeep.clean_role(str(tmp_path / "dump"), NS, ROLE)
    assert orphan.exists() is foreign and done.orphan == (0 if foreign else 1)
    if foreign:
        assert "format version 99" in done.kept[0][1]


def test_a_process_ending_during_its_upkeep_exits_cleanly(tmp_path: Path, host_module: Any) -> None:
    # The upkeep thread is stopped and joined at the process's end (before the interpreter finalizes): fresh processes
    # that end right after weaving, in the middle of a long upkeep, exit with status 0; the next one finishes it.
    host = host_module("def gen(step):\n    return {'step': step}\n", import_now=False)
    dump = tmp_path / "dump"
    left = []
    for step in range(1500):
        folder = dump / NS / ROLE / str(step) / "gen"
        folder.mkdir(parents=True)
        left.append(folder / ".tmp-0123456789ab-r0-0000.manifest.json")
        left[-1].write_text("{")
        _old(left[-1])
    for _ in range(3):
        t0 = time.monotonic()
        out = subprocess.run(_script(host, dump, [], wait=False), capture_output=True, text=True, timeout=300)
        assert out.returncode == 0 and "terminate called" not in out.stderr, out.stderr
        assert time.monotonic() - t0 < 60
    out = subprocess.run(_script(host, dump, []), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert not [p for p in left if p.exists()]
