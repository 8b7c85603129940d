"""``skipweave gc``: dry run by default, removes only what no run serves, never a complete valid entry."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import filelock
import pytest
import torch

from skipweave.store import inspect
from skipweave.store.manifest import file_checksum
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
    assert action["reason"] == "1 of 2 calls committed and never closed"
    assert sorted(Path(f).name for f in action["files"])[-1] == "r0.part.json" and len(action["files"]) == 4
    assert doc["complete_entries_kept"] == 12
    assert doc["freed_bytes"] == sum(a["bytes"] for a in doc["actions"])


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
    result = inspect.scan(str(s.dump), checksums=True)
    actions = {(a.kind.value, a.path): a for a in inspect.plan_gc(result)}
    store = StepStore(str(s.dump), NS, ROLE)

    # A writer replaced the corrupt entry after the scan: gc must keep the new, valid one.
    repaired = actions[("corrupt_entry", str(s.corrupt["flipped"]))]
    store.record(store.key(4, "gen", "r0", 1), payload(4, 1), target_path="m:f", fingerprint="fp", rng_state=None,
                 seconds=0.1, replace=True)
    inspect.apply_gc(result, repaired, min_age=0, dry_run=False)
    assert repaired.outcome == "skipped" and repaired.detail == "valid again (a writer replaced it)"
    assert torch.equal(store.load(store.key(4, "gen", "r0", 1)).result["ids"], payload(4, 1)["ids"])

    # A writer finished the incomplete step after the scan: gc must keep it.
    part = actions[("incomplete_part", str(s.incomplete))]
    store.record(store.key(3, "gen", "r0", 1), payload(3, 1), target_path="m:f", fingerprint="fp", rng_state=None,
                 seconds=0.1)
    inspect.apply_gc(result, part, min_age=0, dry_run=False)
    assert part.outcome == "skipped" and part.detail == "complete now (a writer finished it)"
    assert len(list(s.incomplete.glob("r0-*.manifest.json"))) == 2

    # A writer holds the entry's lock: gc leaves it alone rather than wait.
    monkeypatch.setattr(inspect, "LOCK_WAIT_S", 0.05)
    busy = actions[("corrupt_entry", str(s.corrupt["garbage"]))]
    holder = filelock.FileLock(str(s.target(7) / ".r0.part.lock"))  # another open file: flock conflicts
    with holder:
        inspect.apply_gc(result, busy, min_age=0, dry_run=False)
    assert busy.outcome == "skipped" and busy.detail == "a writer holds its lock" and s.corrupt["garbage"].exists()
    inspect.apply_gc(result, busy, min_age=0, dry_run=False)
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
