"""``skipweave migrate``: on a copy of the format-1 fixture tests/fixtures/store_v1, a dry run changes no byte,
``--yes`` migrates every entry and group file, the store then replays bit-identically and verifies, a rerun is a
no-op; a migration SIGKILLed at random instants leaves every entry old or migrated and valid, and a rerun finishes
it; a replay running beside a migration serves every call identically.

Replays run tests/fixtures/make_store_v1.py's ``drive`` (the fixture test's replay: ``replay_only`` with
``fingerprint.on_mismatch: error``, so a miss or a mismatch stops it) in a fresh process, several stores per process.
"""

from __future__ import annotations

import contextlib
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

import skipweave
from skipweave.store.migrate import migrated_group, migrated_manifest, plan_migrate
from tests.cli.test_ls import cli
from tests.store.test_migrate import FIXTURE, GROUP, SINGLE, assert_valid, committed, snapshot

pytestmark = pytest.mark.slow  # starts processes: left out of the fast tier (README)

ROOT = Path(__file__).resolve().parents[2]
DIGESTS = ROOT / "tests" / "fixtures" / "store_v1.digests.json"
ENTRIES = 39
"""Entries of the fixture: 6 with a manifest of their own, 33 in 3 group files."""

REPLAY = """
import json, sys
import make_store_v1
before = 0
for store in sys.argv[1:]:
    out = make_store_v1.drive(store, replay=True)
    hits = out["counters"]["hits"]
    print(json.dumps({"store": store, "hits": hits - before, "misses": out["counters"]["misses"],
                      "real_calls": out["real_calls"], "results": out["results"]}), flush=True)
    before = hits
"""
"""Replays each store given, one JSON line each (counters are the process's: hits are told apart by difference)."""

REPLAY_UNTIL = """
import json, os, sys, time
import make_store_v1
store, stop = sys.argv[1], sys.argv[2]
recorded = json.load(open(sys.argv[3]))["results"]
while True:
    last = os.path.exists(stop)
    start = time.time()
    try:
        out = make_store_v1.drive(store, replay=True)
        same = out["results"] == recorded and out["real_calls"] == []
        print(json.dumps({"start": start, "end": time.time(), "same": same}), flush=True)
    except Exception as exc:  # a miss (ReplayMissing) or a mismatch: the line says which
        print(json.dumps({"start": start, "end": time.time(), "error": repr(exc)}), flush=True)
    if last:
        break
"""
"""Replays the store again and again until the file ``stop`` exists (then once more), one JSON line per replay."""

SLOW = """
import os, time
import skipweave.cli.main, skipweave.store.migrate, skipweave.store.scan
import skipweave.store.format.tensorfile  # (a group's judgement reads its data file through it: torch)
pause = float(os.environ["SLOW_STORE_S"])
real_fsync, real_write = os.fsync, os.write

def slow_fsync(fd):  # a slow disk: every fsync (a file's before its rename, the folder's after) waits
    time.sleep(pause)
    real_fsync(fd)

def slow_write(fd, data):  # ... and every write (between a file's creation and its bytes)
    time.sleep(pause)
    return real_write(fd, data)

os.fsync, os.write = slow_fsync, slow_write
"""
"""A process with everything imported whose ``os.write`` and ``os.fsync`` calls take ``SLOW_STORE_S`` seconds
longer: a slow disk, so that kills at random instants land within a migration."""

SLOW_MIGRATE = SLOW + """
import sys
print("started", flush=True)
sys.exit(skipweave.cli.main.main(["migrate", sys.argv[1], "--yes"]))
"""
"""``skipweave migrate DUMP_DIR --yes`` on a slowed-down store, saying when it starts migrating."""

MIGRATE_FORKS = SLOW + """
import json, sys
null = os.open(os.devnull, os.O_WRONLY)
out = os.dup(1)
os.dup2(null, 1)
skipweave.cli.main.main(["migrate", sys.argv[1], "--yes"])  # warm: what a first run loads lazily, loaded once
os.dup2(out, 1)
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:  # one dump dir a line: a fresh process (forked, imports done) migrates it; the test kills it
    pid = os.fork()
    if pid == 0:
        os.dup2(null, 1)
        os._exit(skipweave.cli.main.main(["migrate", line.strip(), "--yes"]))
    print(json.dumps({"pid": pid}), flush=True)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"status": status}), flush=True)
"""
"""Forks a ``skipweave migrate DUMP_DIR --yes`` process per dump dir read on stdin, slowed down; prints each one's
pid as it starts, then its wait status (a first line says it is ready). Forked, so that no trial pays for the
imports (torch: 1.5 s) or what a first run loads lazily (a migration of the dump dir given as argument warms it)."""


def env() -> dict[str, str]:
    """This checkout first on the path (and the fixture's host and driver), no progress bars."""
    out = dict(os.environ)
    paths = [str(ROOT), str(ROOT / "tests" / "fixtures"),
             *[p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p]]
    out.update(PYTHONPATH=os.pathsep.join(paths), SKIPWEAVE_PROGRESS="0")
    return out


def recorded() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DIGESTS.read_text(encoding="utf-8"))["results"]
    return doc


def replay(*stores: Path) -> None:
    """Replay each store in one fresh process; each must serve every call, bit-identically (RNG draws included)."""
    proc = subprocess.run([sys.executable, "-c", REPLAY, *map(str, stores)], capture_output=True, text=True,
                          env=env(), cwd=str(ROOT), timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [line["store"] for line in lines] == [str(s) for s in stores]
    want = recorded()
    for line in lines:
        assert (line["hits"], line["misses"], line["real_calls"]) == (ENTRIES, 0, []), line["store"]
        assert line["results"] == want, line["store"]


@pytest.fixture
def store(tmp_path: Path) -> Path:
    copy = tmp_path / "store_v1"
    shutil.copytree(FIXTURE, copy, symlinks=True)
    return copy


def copy_fixture(dest: Path) -> Path:
    shutil.copytree(FIXTURE, dest, symlinks=True)
    return dest


# ---------------------------------------------------------------------------------------------- the command
def test_a_dry_run_lists_what_it_would_migrate_and_changes_no_byte(store: Path, capsys: Any) -> None:
    before = snapshot(store)
    status, out, err = cli(capsys, "migrate", str(store))
    assert status == 0 and not err
    assert snapshot(store) == before
    assert out.splitlines() == [
        f"migrate {store} (dry run: nothing is rewritten; pass --yes to rewrite)",
        "namespace/role    would migrate  at format 2  foreign  corrupt",
        "v1/async_rollout  2              0            0        0",
        "v1/rollout        4              0            0        0",
        "v1/samples        33 (3 groups)  0            0        0",
        "(entries; a group file of small entries counts the entries it holds)",
        "would migrate 39 entries (33 of them in 3 group files) from format 1 to format 2",
    ]


def test_yes_migrates_everything_then_the_store_replays_identically_verifies_and_a_rerun_is_a_no_op(
        store: Path, capsys: Any) -> None:
    before = snapshot(store)
    status, out, _ = cli(capsys, "migrate", str(store), "--yes")
    assert status == 0
    assert out.splitlines()[0] == f"migrate {store}"
    assert out.splitlines()[-1] == "migrated 39 entries (33 of them in 3 group files) from format 1 to format 2"
    for path in committed(store):
        doc = json.loads(path.read_text())
        assert doc["format_version"] == 2 and all(e["format_version"] == 2 for e in doc.get("entries", []))
    after = snapshot(store)
    assert {n for n in before if after[n] != before[n]} == {str(p.relative_to(store)) for p in committed(store)}

    status, out, _ = cli(capsys, "verify", str(store), "--json")
    doc = json.loads(out)
    assert status == 0 and doc["ok"] is True and doc["problems"] == [] and doc["totals"]["entries"] == ENTRIES

    status, out, _ = cli(capsys, "migrate", str(store), "--yes")
    assert status == 0 and snapshot(store) == after
    assert out.splitlines()[-1] == "nothing to migrate; 39 entries at format 2 already"
    replay(store)


def test_json_output(store: Path, capsys: Any) -> None:
    status, out, _ = cli(capsys, "migrate", str(store), "--json")
    doc = json.loads(out)
    assert status == 0
    assert set(doc) == {"schema", "dump_dir", "dry_run", "format_version", "items", "roles", "totals", "ignored"}
    assert (doc["schema"], doc["dump_dir"], doc["dry_run"], doc["format_version"]) == \
        ("skipweave.migrate/1", str(store), True, 2)
    outcomes = {"would_migrate", "migrated", "current", "foreign", "corrupt", "skipped", "failed", "gone"}
    assert set(doc["totals"]) == outcomes and all(set(c) == {"entries", "groups"} for c in doc["totals"].values())
    assert doc["totals"]["would_migrate"] == {"entries": ENTRIES, "groups": 3}
    assert sum(c["entries"] for c in doc["totals"].values()) == ENTRIES
    assert [(r["namespace"], r["role"], r["counts"]["would_migrate"]) for r in doc["roles"]] == [
        ("v1", "async_rollout", {"entries": 2, "groups": 0}), ("v1", "rollout", {"entries": 4, "groups": 0}),
        ("v1", "samples", {"entries": 33, "groups": 3})]
    assert len(doc["items"]) == 9 and doc["ignored"] == []
    group = next(i for i in doc["items"] if i["path"] == str(store / GROUP))
    assert group == {
        "kind": "group", "path": str(store / GROUP), "where": "v1/samples score step 1 shard r0 calls 0-15",
        "namespace": "v1", "role": "samples", "target": "score", "step": 1, "shard": "r0", "first": 0, "last": 15,
        "entries": 16, "version": 1, "written_by": "0.1.0", "outcome": "would_migrate", "detail": None}

    status, out, _ = cli(capsys, "migrate", str(store), "--json", "--yes")
    doc = json.loads(out)
    assert status == 0 and doc["dry_run"] is False
    assert doc["totals"]["migrated"] == {"entries": ENTRIES, "groups": 3}
    assert {i["outcome"] for i in doc["items"]} == {"migrated"} and {i["version"] for i in doc["items"]} == {1}


def test_foreign_files_are_listed_and_kept_and_a_corrupt_entry_is_reported_and_untouched(
        store: Path, capsys: Any) -> None:
    foreign, group = store / SINGLE, store / GROUP
    foreign.write_text(json.dumps({**json.loads(foreign.read_text()), "format_version": 99,
                                   "skipweave_version": "7.0"}, indent=1))
    group.write_text(json.dumps({**json.loads(group.read_text()), "format_version": 99}))
    corrupt = store / "v1/rollout/2/gen/r0-0000.manifest.json"
    tree = next(corrupt.parent.glob("r0-0000.*.tree.json"))
    tree.write_bytes(tree.read_bytes()[:-1])  # truncated
    kept = {p: p.read_bytes() for p in (foreign, group, corrupt, tree)}

    status, out, _ = cli(capsys, "migrate", str(store))
    assert status == 1  # the corrupt entry would not be migrated
    status, out, _ = cli(capsys, "migrate", str(store), "--yes")
    assert status == 1
    assert {p: p.read_bytes() for p in kept} == kept
    lines = out.splitlines()
    assert lines[1:6] == [
        "namespace/role    migrated       at format 2  foreign       corrupt",
        "v1/async_rollout  2              0            0             0",
        "v1/rollout        2              0            1             1",
        "v1/samples        17 (2 groups)  0            16 (1 group)  0",
        "(entries; a group file of small entries counts the entries it holds)",
    ]
    assert "foreign  v1/rollout gen step 1 shard r0 call 0 (manifest, format 99, written by skipweave 7.0)" in lines
    assert "foreign  v1/samples score step 1 shard r0 calls 0-15 (group, format 99, written by skipweave 0.1.0)" \
        in lines
    assert "corrupt  v1/rollout gen step 2 shard r0 call 0 (manifest, format 1, written by skipweave 0.1.0)" in lines
    assert f"         at {corrupt}" in lines
    assert any(line.startswith("         why: payload ") and "not migrated (skipweave gc removes it)" in line
               for line in lines)
    assert lines[-1] == ("migrated 21 entries (17 of them in 2 group files) from format 1 to format 2; "
                         "17 foreign entries kept as they are; 1 corrupt entry not migrated (skipweave gc removes it)")

    status, out, _ = cli(capsys, "migrate", str(store), "--json")
    doc = json.loads(out)
    assert status == 1 and {p: p.read_bytes() for p in kept} == kept
    assert doc["totals"]["foreign"] == {"entries": 17, "groups": 1}
    assert doc["totals"]["corrupt"] == {"entries": 1, "groups": 0}
    assert doc["totals"]["current"] == {"entries": 21, "groups": 2}
    item = next(i for i in doc["items"] if i["path"] == str(foreign))
    assert (item["outcome"], item["version"], item["written_by"]) == ("foreign", 99, "7.0")


def test_a_dump_dir_that_cannot_be_read_or_is_misplaced_exits_2(store: Path, tmp_path: Path, capsys: Any) -> None:
    status, _, err = cli(capsys, "migrate", str(tmp_path / "missing"))
    assert status == 2 and "does not exist" in err
    status, _, err = cli(capsys, "migrate", str(store / "v1"))
    assert status == 2 and f"try `skipweave migrate {store}`" in err


def test_the_command_is_registered_with_its_help(capsys: Any) -> None:
    with pytest.raises(SystemExit):
        cli(capsys, "migrate", "--help")
    out = capsys.readouterr().out
    assert "--yes" in out and "skipweave.migrate/1" in out and "Exits 0 when done" in out


# ---------------------------------------------------------------------------------------------- kills and readers
def _old_or_migrated(store: Path) -> tuple[int, int]:
    """Check that each manifest and group file is the fixture's, or exactly its migrated form, and that every entry
    is valid and every payload file is the fixture's; return (old files, migrated files)."""
    old = migrated = 0
    for path in committed(store):
        original = (FIXTURE / path.relative_to(store)).read_bytes()
        data = path.read_bytes()
        if data == original:
            old += 1
            continue
        try:
            doc = json.loads(data)
        except ValueError:
            pytest.fail(f"{path} is neither the fixture's file nor its migrated form: {data[:80]!r}")
        unix = (doc["entries"][0] if "entries" in doc else doc)["migrated"]["unix"]
        rewrite = migrated_group if path.name.endswith(".pack.json") else migrated_manifest
        assert doc == rewrite(json.loads(original), by=skipweave.__version__, unix=unix), path
        migrated += 1
    for item in plan_migrate(str(store)).items:
        assert_valid(item)
    for path in FIXTURE.rglob("*"):
        if path.is_file() and not path.name.endswith((".manifest.json", ".pack.json")):
            assert (store / path.relative_to(FIXTURE)).read_bytes() == path.read_bytes(), path
    return old, migrated


def test_migrate_killed_at_random_instants_leaves_each_file_old_or_new_and_a_rerun_finishes(
        tmp_path: Path, capsys: Any) -> None:
    import random

    rng = random.Random(41)
    stores: list[Path] = []
    states: list[tuple[int, int]] = []  # (old files, migrated files) after each kill
    temporaries = 0
    forks = subprocess.Popen([sys.executable, "-c", MIGRATE_FORKS, str(copy_fixture(tmp_path / "warm"))],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**env(), "SLOW_STORE_S": "0.02"}, cwd=str(ROOT))
    stdin, stdout = forks.stdin, forks.stdout
    assert stdin is not None and stdout is not None

    def start(store: Path) -> int:
        stdin.write(f"{store}\n")
        stdin.flush()
        return int(json.loads(stdout.readline())["pid"])

    def status() -> int:
        return int(json.loads(stdout.readline())["status"])

    try:
        assert json.loads(stdout.readline()) == {"ready": True}
        began = time.monotonic()  # a whole run first, unkilled: how long one takes here, now
        start(copy_fixture(tmp_path / "whole"))
        assert status() == 0
        window = time.monotonic() - began
        # At least 10 trials, more (up to 30) while fewer than 3 kills landed mid-run: a loaded machine stretches
        # a run unevenly, and a test whose kills all came before or after the migration would prove nothing.
        for trial in range(30):
            if trial >= 10 and sum(1 for old, new in states if old > 0 and new > 0) >= 3:
                break
            store = copy_fixture(tmp_path / f"trial{trial}")
            pid = start(store)
            time.sleep((trial % 10 + rng.random()) / 10 * window)  # spread over the run: early, middle, late
            with contextlib.suppress(ProcessLookupError):  # (it finished first: not reaped before status() reads)
                os.kill(pid, signal.SIGKILL)
            assert os.WIFSIGNALED(killed := status()) or os.WEXITSTATUS(killed) == 0
            states.append(_old_or_migrated(store))
            temporaries += len(list(store.rglob(".tmp-*")))
            code, _, _ = cli(capsys, "migrate", str(store), "--yes")  # the rerun
            assert code == 0
            assert _old_or_migrated(store) == (0, 9)
            stores.append(store)
    finally:
        forks.kill()
        forks.communicate()
    partial = sum(1 for old, new in states if old > 0 and new > 0)
    assert partial >= 3, f"too few kills landed mid-migration to test anything: (old, migrated) per trial {states}"
    replay(*stores)
    print(f"one run {window:.2f} s; (old, migrated) files after each kill: {states}; temporary files left: "
          f"{temporaries}")


def test_a_replay_running_beside_a_migration_serves_every_call_identically(store: Path, tmp_path: Path) -> None:
    stop = tmp_path / "stop"
    replayer = subprocess.Popen([sys.executable, "-c", REPLAY_UNTIL, str(store), str(stop), str(DIGESTS)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(), cwd=str(ROOT))
    try:
        assert replayer.stdout is not None
        first = replayer.stdout.readline()  # one whole replay before the migration starts
        assert json.loads(first).get("same") is True, first + (replayer.stderr.read() if replayer.stderr else "")
        migrator = subprocess.Popen([sys.executable, "-c", SLOW_MIGRATE, str(store)], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True,
                                    env={**env(), "SLOW_STORE_S": "0.05", "SKIPWEAVE_PROGRESS": "1"},
                                    cwd=str(ROOT))
        assert migrator.stdout is not None and migrator.stdout.readline().strip() == "started"
        began = time.time()
        out, err = migrator.communicate(timeout=120)
        ended = time.time()
        assert migrator.returncode == 0, err[-4000:]
        assert "skipweave: migrating" in err and "9/9" in err  # its progress bar: a run of over a second
        stop.touch()
        rest, err = replayer.communicate(timeout=120)
    finally:
        replayer.kill()
    runs = [json.loads(line) for line in [first, *rest.splitlines()] if line.startswith("{")]
    assert replayer.returncode == 0, err[-4000:]
    assert [r for r in runs if r.get("same") is not True] == []
    during = [r for r in runs if r["start"] < ended and r["end"] > began]
    assert len(during) >= 2, f"no replay ran during the migration ({began:.2f}-{ended:.2f}): {runs}"
    assert _old_or_migrated(store) == (0, 9)
