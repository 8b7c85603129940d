"""skipweave.store.migrate: format-1 manifests and group files rewritten to format 2, one file at a time, under the
part's lock, judged by the runs' own function before the rename; payload files, foreign and corrupt files untouched.

Every test works on a copy of the format-1 fixture tests/fixtures/store_v1 (6 manifests, 3 group files holding 33
small entries).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest

import skipweave
from skipweave.store import migrate
from skipweave.store.format.group import read_group
from skipweave.store.format.layout import EntryKey, parse_group_name
from skipweave.store.format.manifest import check_fields, check_structure, read_manifest, verify_payload
from skipweave.store.format.versions import fingerprint_rule, version_of
from skipweave.store.migrate import Outcome, apply_migrate, migrated_group, migrated_manifest, plan_migrate
from skipweave.store.parts import part_lock
from skipweave.store.validity import check_entry, check_group

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "store_v1"
SINGLE = Path("v1/rollout/1/gen/r0-0000.manifest.json")
GROUP = Path("v1/samples/1/score/r0-0000-0015.pack.json")


@pytest.fixture
def store(tmp_path: Path) -> Path:
    copy = tmp_path / "store_v1"
    shutil.copytree(FIXTURE, copy, symlinks=True)
    return copy


def snapshot(root: Path) -> dict[str, tuple[bytes, int, int]]:
    """Every file below ``root`` with its bytes, inode and modification time (ns)."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            st = p.stat()
            out[str(p.relative_to(root))] = (p.read_bytes(), st.st_ino, st.st_mtime_ns)
    return out


def committed(root: Path) -> list[Path]:
    """The manifests and group files below ``root`` (no temporary file)."""
    return sorted(p for p in [*root.rglob("*.manifest.json"), *root.rglob("*.pack.json")]
                  if not p.name.startswith(".tmp-"))


def run_all(dump: Path, *, dry_run: bool) -> list[migrate.MigrateItem]:
    plan = plan_migrate(str(dump))
    for item in plan.items:
        apply_migrate(item, dry_run=dry_run, unix=1234.5)
    return plan.items


def assert_valid(item: migrate.MigrateItem) -> None:
    """The file's every entry passes the runs' judgement, every payload byte read."""
    if item.kind == "entry":
        assert check_entry(item.path, checksums=True, key=item.key).reason is None
        return
    checked = check_group(item.path, item.key, item.key.call, item.last, checksums=True)
    assert checked is not None
    assert {c: v.reason for c, v in checked[1].items()} == dict.fromkeys(range(item.key.call, item.last + 1))


# ---------------------------------------------------------------------------------------------- the rewrite
def test_a_migrated_manifest_keeps_every_field_and_adds_what_format_2_names(store: Path) -> None:
    old = json.loads((store / SINGLE).read_text())
    new = migrated_manifest(old, by="9.1", unix=1234.5)
    assert old["format_version"] == 1 and new["format_version"] == 2
    assert {k: v for k, v in new.items() if k in old and k != "format_version"} == \
        {k: v for k, v in old.items() if k != "format_version"}
    assert set(new) - set(old) == {"skipweave_version", "fingerprint_rule", "migrated"}
    assert new["skipweave_version"] == old["versions"]["skipweave"] == "0.1.0"
    assert new["fingerprint_rule"] == "arguments" and fingerprint_rule(new) == fingerprint_rule(old) == "arguments"
    assert new["migrated"] == {"from": 1, "by": "9.1", "unix": 1234.5}
    keys = list(new)  # where a format-2 writer puts them; "migrated" last
    assert keys[:2] == ["format_version", "skipweave_version"]
    assert keys[keys.index("input_fingerprint") + 1] == "fingerprint_rule" and keys[-1] == "migrated"
    assert old == json.loads((store / SINGLE).read_text())  # the argument is not changed
    key = EntryKey("v1", "rollout", 1, "gen", "r0", 0)
    check_fields(check_structure(new, "new"), "new", key, allow_pickle=False)  # a sound format-2 manifest


def test_a_manifest_that_names_no_skipweave_is_migrated_as_written_by_an_unknown_one(store: Path) -> None:
    old = json.loads((store / SINGLE).read_text())
    for versions in (None, {"torch": "2.0"}, {"skipweave": 3}):
        crafted = dict(old)
        if versions is None:
            crafted.pop("versions")
        else:
            crafted["versions"] = versions
        assert migrated_manifest(crafted, by="x", unix=0.0)["skipweave_version"] == "unknown"
    crafted = {**old, "fingerprint_rule": "signature"}  # a field format 1 never had: format 1's rule holds
    assert migrated_manifest(crafted, by="x", unix=0.0)["fingerprint_rule"] == "arguments"


def test_only_older_readable_versions_are_migrated(store: Path) -> None:
    old = json.loads((store / SINGLE).read_text())
    for version in (2, 99, None, "1"):
        with pytest.raises(ValueError, match="no migration from format version"):
            migrated_manifest({**old, "format_version": version}, by="x", unix=0.0)


def test_a_migrated_group_is_format_2_with_each_manifest_migrated(store: Path) -> None:
    old = json.loads((store / GROUP).read_text())
    new = migrated_group(old, by="9.1", unix=7.0)
    assert new["format_version"] == 2 and len(new["entries"]) == len(old["entries"]) == 16
    assert {k: v for k, v in new.items() if k not in ("format_version", "entries")} == \
        {k: v for k, v in old.items() if k not in ("format_version", "entries")}
    assert new["entries"] == [migrated_manifest(e, by="9.1", unix=7.0) for e in old["entries"]]


# ---------------------------------------------------------------------------------------------- the walk and commit
def test_the_plan_lists_every_manifest_and_group_file_and_a_dry_run_changes_no_byte(store: Path) -> None:
    before = snapshot(store)
    items = run_all(store, dry_run=True)
    assert [(i.kind, i.entries) for i in items] == [("entry", 1)] * 6 + [("group", 16), ("group", 8), ("group", 9)]
    assert {(i.outcome, i.version, i.writer, i.detail) for i in items} == {(Outcome.WOULD_MIGRATE, 1, "0.1.0", None)}
    assert [i.where for i in items][-3] == "v1/samples score step 1 shard r0 calls 0-15"
    assert snapshot(store) == before
    assert not list(store.rglob(".tmp-*"))


def test_yes_migrates_every_file_keeping_payloads_times_and_permissions(store: Path) -> None:
    (store / SINGLE).chmod(0o640)
    before = snapshot(store)
    items = run_all(store, dry_run=False)
    assert {i.outcome for i in items} == {Outcome.MIGRATED} and {i.version for i in items} == {1}
    after = snapshot(store)
    assert set(after) == set(before)  # no file added (no temporary left), none removed
    changed = {name for name in before if after[name] != before[name]}
    assert changed == {str(p.relative_to(store)) for p in committed(store)}  # manifests and group files only
    for name in changed:
        assert after[name][2] == before[name][2]  # modification time kept: not a new recording
        assert after[name][1] != before[name][1]  # a new file renamed over the old one
        doc = json.loads(after[name][0])
        old = json.loads(before[name][0])
        if name.endswith(".pack.json"):
            assert doc == migrated_group(old, by=skipweave.__version__, unix=1234.5)
        else:
            assert doc == migrated_manifest(old, by=skipweave.__version__, unix=1234.5)
            assert after[name][0].startswith(b'{\n "format_version": 2,\n "skipweave_version": "0.1.0",')  # as written
    assert stat.S_IMODE((store / SINGLE).stat().st_mode) == 0o640
    for item in items:
        assert_valid(item)
        if item.kind == "entry":
            assert version_of(read_manifest(item.path), item.path) == 2
        else:
            group = read_group(item.path)
            assert {version_of(g, "") for g in [group, *group["entries"]]} == {2}

    again = run_all(store, dry_run=False)  # a rerun: nothing left to do
    assert {i.outcome for i in again} == {Outcome.CURRENT} and {i.version for i in again} == {2}
    assert snapshot(store) == after


def test_a_reader_holding_the_old_manifests_still_finds_every_payload_file(store: Path) -> None:
    # A replay that read a manifest or group file before the migration reads the payload files it names after it.
    old = {p: json.loads(p.read_text()) for p in committed(store)}
    run_all(store, dry_run=False)
    for path, doc in old.items():
        if path.name.endswith(".pack.json"):
            verify_payload(str(path.parent), {"payload": [doc["data"]]}, checksums=True)
        else:
            verify_payload(str(path.parent), doc, checksums=True)
        assert json.loads(path.read_text())["format_version"] == 2


def test_foreign_files_are_listed_and_kept_byte_for_byte(store: Path) -> None:
    manifest, group = store / SINGLE, store / GROUP
    doc = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**doc, "format_version": 99, "skipweave_version": "7.0"}, indent=1))
    gdoc = json.loads(group.read_text())
    group.write_text(json.dumps({**gdoc, "format_version": 99}))
    inner = store / "v1/samples/2/score/r0-0000-0008.pack.json"  # a format-1 group holding one foreign manifest
    idoc = json.loads(inner.read_text())
    idoc["entries"][3]["format_version"] = 99
    inner.write_text(json.dumps(idoc))
    kept = {p: (p.read_bytes(), p.stat().st_mtime_ns, p.stat().st_ino) for p in (manifest, group, inner)}
    for dry_run in (True, False):
        items = {Path(i.path): i for i in run_all(store, dry_run=dry_run)}
        assert (items[manifest].outcome, items[manifest].version, items[manifest].writer) == \
            (Outcome.FOREIGN, 99, "7.0")
        assert (items[group].outcome, items[group].version, items[group].writer) == (Outcome.FOREIGN, 99, "0.1.0")
        assert items[inner].outcome is Outcome.FOREIGN and "format version 99" in (items[inner].detail or "")
        assert "is of format version 99 (written by skipweave 7.0)" in (items[manifest].detail or "")
        assert {i.outcome for p, i in items.items() if p not in kept} == \
            {Outcome.WOULD_MIGRATE if dry_run else Outcome.MIGRATED}
        assert {p: (p.read_bytes(), p.stat().st_mtime_ns, p.stat().st_ino) for p in kept} == kept


def test_a_corrupt_entry_or_group_is_reported_and_left_as_it_is(store: Path) -> None:
    manifest = store / "v1/rollout/2/gen/r0-0000.manifest.json"
    payload = next(manifest.parent.glob("r0-0000.*.tensors.safetensors"))
    data = bytearray(payload.read_bytes())
    data[-1] ^= 0xFF  # same size, wrong checksum: only a read of every byte sees it
    payload.write_bytes(bytes(data))
    garbage = store / "v1/async_rollout/1/agen/r0-0000.manifest.json"
    garbage.write_bytes(b"{ not json")
    group = store / GROUP
    gdoc = json.loads(group.read_text())
    gdoc["entries"][2]["call_index"] = 5  # belongs to another call
    group.write_text(json.dumps(gdoc))
    bad = (manifest, garbage, group)
    kept = {p: p.read_bytes() for p in bad}
    items = {Path(i.path): i for i in run_all(store, dry_run=False)}
    assert {p: items[p].outcome for p in bad} == dict.fromkeys(bad, Outcome.CORRUPT)
    assert "does not match its checksum" in (items[manifest].detail or "")
    assert "unreadable" in (items[garbage].detail or "") and items[garbage].version is None
    assert "belongs to another entry: call_index=5" in (items[group].detail or "")
    assert all("not migrated (skipweave gc removes it)" in (items[p].detail or "") for p in bad)
    assert {p: p.read_bytes() for p in bad} == kept
    assert {i.outcome for p, i in items.items() if p not in bad} == {Outcome.MIGRATED}
    assert migrate.NOT_MIGRATED >= {Outcome.CORRUPT}


def test_a_part_whose_lock_a_writer_holds_is_skipped_and_a_rerun_migrates_it(store: Path) -> None:
    plan = plan_migrate(str(store))
    item = next(i for i in plan.items if Path(i.path) == store / SINGLE)
    before = (store / SINGLE).read_bytes()
    lock = part_lock(str((store / SINGLE).parent), "r0")
    fd = os.open(lock.lock_file, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # as a writer in another process holds it (flock: per open file)
        apply_migrate(item, dry_run=False, lock_wait=0.2)
    finally:
        os.close(fd)
    assert item.outcome is Outcome.SKIPPED and "held the part's lock" in (item.detail or "")
    assert (store / SINGLE).read_bytes() == before
    apply_migrate(item, dry_run=False)
    assert item.outcome is Outcome.MIGRATED


def test_a_migrated_form_the_runs_would_refuse_is_never_committed(store: Path, monkeypatch: Any) -> None:
    # The judgement before the rename is what guards the store: break the rewrite and it must catch it.
    real = migrate.migrated_manifest

    def wrong_step(manifest: Any, *, by: str, unix: float) -> dict[str, Any]:
        return {**real(manifest, by=by, unix=unix), "step": 7}

    monkeypatch.setattr(migrate, "migrated_manifest", wrong_step)
    before = snapshot(store)
    items = run_all(store, dry_run=False)
    assert {i.outcome for i in items} == {Outcome.FAILED}
    assert all("its migrated form would not be served" in (i.detail or "") and "step=7" in (i.detail or "")
               for i in items)
    assert snapshot(store) == before  # every file as it was; no temporary left behind


def test_the_walk_reads_only_what_runs_read(store: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    shutil.copytree(store / "v1", outside)
    (store / "v1" / "linked").symlink_to(outside / "rollout")
    aside = store / "v1/rollout/_set_aside/1-gen-r0-0"
    aside.mkdir(parents=True)
    shutil.copy(store / SINGLE, aside / "r0-0000.manifest.json")
    (store / SINGLE).parent.joinpath(".tmp-0123456789ab-r0-0001.manifest.json").write_bytes(b"{}")
    before = snapshot(outside)
    plan = plan_migrate(str(store))
    assert len(plan.items) == 9 and plan.ignored == [(str(store / "v1" / "linked"), "a symlink (never followed)")]
    assert all(parse_group_name(Path(i.path).name) or i.path.endswith(".manifest.json") for i in plan.items)
    run_all(store, dry_run=False)
    assert snapshot(outside) == before
    assert json.loads((aside / "r0-0000.manifest.json").read_text())["format_version"] == 1


def test_an_unreadable_dump_dir_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        plan_migrate(str(tmp_path / "missing"))
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError):
        plan_migrate(str(tmp_path / "file"))
