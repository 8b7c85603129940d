"""Entries of a format version this skipweave does not read are foreign: kept, listed, never served, never touched.

One dump dir holds, side by side, single entries and groups of format 1 (written before format 2), of format 2 (this
code's), and of an unknown format 99 (what a newer skipweave could write: another version number, a field renamed).
A run serves 1 and 2 and runs the calls of 99 live, leaving their files byte-identical; ``gc --yes --min-age 0``,
retention, ``verify``, ``ls`` and ``show`` leave them byte-identical and name them foreign; a reader that knows only
format 1 (an older skipweave, simulated) does the same to format-2 entries.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import skipweave
from skipweave.cli.main import main
from skipweave.store.format import versions
from skipweave.store.format.layout import parse_group_name
from skipweave.store.retention import KeepRule, plan_retention
from skipweave.store.scan import Status, scan
from skipweave.store.step_store import EntryMeta, StepStore

NS, ROLE, CALLS = "default", "rollout", 4
HOST = '''
import torch

CALLS = []


def gen(step, i):
    CALLS.append((step, i))
    return {"ids": torch.full((4,), step * 100 + i), "step": step}
'''
SINGLE_V1, GROUP_V1, SINGLE_V2, GROUP_V2, SINGLE_99, GROUP_99 = 1, 2, 3, 4, 5, 6


def _result(step: int, i: int) -> dict[str, Any]:
    return {"ids": torch.full((4,), step * 100 + i), "step": step}


def _write_single(store: StepStore, step: int) -> None:
    store.prepare_part(step, "gen", "r0")
    for i in range(CALLS):
        store.record(store.key(step, "gen", "r0", i), _result(step, i), target_path="fhost:gen", fingerprint="",
                     rng_state=None, seconds=0.5)
    store.close_part(step, "gen", "r0")


def _write_group(store: StepStore, step: int) -> None:
    items = [(store.key(step, "gen", "r0", i), store.stage(_result(step, i), rng_state=None).copied(),
              EntryMeta("fhost:gen", "", 0.5, background=True)) for i in range(CALLS)]
    assert all(isinstance(r, tuple) for r in store.commit_many(items))
    store.close_part(step, "gen", "r0")


def _as_v1(manifest: dict[str, Any]) -> None:
    """What format 1 wrote: no ``skipweave_version`` and no ``fingerprint_rule``."""
    manifest["format_version"] = 1
    manifest.pop("skipweave_version", None)
    manifest.pop("fingerprint_rule", None)


def _as_v99(manifest: dict[str, Any]) -> None:
    """What an unknown newer skipweave might write: another version, a field renamed (not judgeable here)."""
    manifest["format_version"] = 99
    manifest["skipweave_version"] = "9.9.0"
    if "payload" in manifest:  # (a group file names its data file under "data")
        manifest["payload_files"] = manifest.pop("payload")


def _rewrite(folder: Path, edit: Any) -> None:
    for path in folder.iterdir():
        if path.name.endswith(".manifest.json"):
            doc = json.loads(path.read_text())
            edit(doc)
            path.write_text(json.dumps(doc))
        elif parse_group_name(path.name) is not None:
            doc = json.loads(path.read_text())
            edit(doc)
            for entry in doc["entries"]:
                edit(entry)
            path.write_text(json.dumps(doc))


def _folder(dump: Path, step: int) -> Path:
    return dump / NS / ROLE / str(step) / "gen"


def _digests(dump: Path, steps: tuple[int, ...]) -> dict[str, str]:
    """Every file of those steps but lock files (taking a lock may create one), by path, with its sha256."""
    return {str(p.relative_to(dump)): hashlib.sha256(p.read_bytes()).hexdigest()
            for s in steps for p in sorted(_folder(dump, s).iterdir()) if not p.name.endswith(".lock")}


@pytest.fixture
def dump(tmp_path: Path) -> Path:
    """The dump dir of the module docstring: steps 1-6, one (single or group, format 1, 2 or 99) per step."""
    root = tmp_path / "dump"
    store = StepStore(str(root), NS, ROLE, calls_per_step=CALLS)
    for step in (SINGLE_V1, SINGLE_V2, SINGLE_99):
        _write_single(store, step)
    for step in (GROUP_V1, GROUP_V2, GROUP_99):
        _write_group(store, step)
    store.close_all()
    for step, edit in ((SINGLE_V1, _as_v1), (GROUP_V1, _as_v1), (SINGLE_99, _as_v99), (GROUP_99, _as_v99)):
        _rewrite(_folder(root, step), edit)
    assert [p.name for p in _folder(root, GROUP_V2).iterdir() if p.name.endswith(".pack.json")]
    return root


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    (tmp_path / "fhost.py").write_text(HOST)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("fhost", None)
    module = importlib.import_module("fhost")
    yield module
    skipweave.unweave()
    sys.modules.pop("fhost", None)


def _run(host: Any, dump: Path, steps: range, **role: Any) -> list[tuple[int, int]]:
    """One run of the host over ``steps`` (each with its calls), woven with a cache role; the real calls made."""
    host.CALLS.clear()
    skipweave.weave({"skip": {ROLE: {"enable": True, "dump_dir": str(dump), "targets": {"gen": "fhost:gen"},
                                     "step": {"source": "arg", "arg": "step", "path": ""},
                                     "calls_per_step": CALLS, **role}}})
    try:
        for step in steps:
            for i in range(CALLS):
                got = host.gen(step, i)
                assert torch.equal(got["ids"], torch.full((4,), step * 100 + i)) and got["step"] == step
    finally:
        skipweave.unweave()
    return list(host.CALLS)


def test_a_run_serves_formats_1_and_2_and_runs_format_99_live_leaving_it_untouched(
        dump: Path, host: Any, caplog: pytest.LogCaptureFixture) -> None:
    foreign = _digests(dump, (SINGLE_99, GROUP_99))
    known = _digests(dump, (SINGLE_V1, GROUP_V1, SINGLE_V2, GROUP_V2))
    with caplog.at_level(logging.WARNING, logger="skipweave"):
        live = _run(host, dump, range(1, 7))
    assert live == [(s, i) for s in (SINGLE_99, GROUP_99) for i in range(CALLS)]
    assert _digests(dump, (SINGLE_99, GROUP_99)) == foreign  # neither set aside nor recorded over
    assert _digests(dump, (SINGLE_V1, GROUP_V1, SINGLE_V2, GROUP_V2)) == known
    warned = [r.getMessage() for r in caplog.records if "format version 99" in r.getMessage()]
    assert len(warned) == 1, warned  # once per version and writer, not once per call
    assert "written by skipweave 9.9.0" in warned[0] and "Upgrade skipweave to at least 9.9.0" in warned[0]
    assert not list((dump / NS / ROLE).glob("_set_aside/*"))
    # a second run does the same: nothing of 99 was replaced by a recording of the first
    assert _run(host, dump, range(1, 7)) == live


def test_on_foreign_error_stops_the_call_and_changes_nothing(dump: Path, host: Any) -> None:
    before = _digests(dump, (SINGLE_99,))
    with pytest.raises(skipweave.ForeignRecording, match=r"step 5 call 0: .*format version 99.*on_foreign=warn"):
        _run(host, dump, range(SINGLE_99, SINGLE_99 + 1), on_foreign="error")
    assert host.CALLS == [] and _digests(dump, (SINGLE_99,)) == before


def test_a_replay_only_run_names_the_foreign_recording(dump: Path, host: Any) -> None:
    with pytest.raises(skipweave.ReplayMissing, match="format version 99"):
        _run(host, dump, range(GROUP_99, GROUP_99 + 1), replay_only=True)


def test_an_incomplete_part_holding_a_foreign_entry_is_neither_set_aside_nor_resumed(
        dump: Path, host: Any) -> None:
    folder = _folder(dump, SINGLE_99)
    (folder / "r0-0003.manifest.json").unlink()  # the part is short now, and was never closed by this code's rules
    (folder / "r0.part.json").unlink()
    before = _digests(dump, (SINGLE_99,))
    assert _run(host, dump, range(SINGLE_99, SINGLE_99 + 1)) == [(SINGLE_99, i) for i in range(CALLS)]
    after = _digests(dump, (SINGLE_99,))
    assert {k: v for k, v in after.items() if k in before} == before  # every old file as it was
    assert not list((dump / NS / ROLE).glob("_set_aside/*"))
    # Only call 3, whose position the foreign recording left free, was recorded, and at its own position: a call
    # whose position holds a foreign entry is recorded nowhere, so it never serves another call of a later run.
    assert sorted(p.name for p in folder.glob("*.manifest.json")) == [f"r0-000{i}.manifest.json" for i in range(CALLS)]
    assert _run(host, dump, range(SINGLE_99, SINGLE_99 + 1)) == [(SINGLE_99, i) for i in range(CALLS - 1)]


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(list(args))
    return code, capsys.readouterr().out


def test_gc_retention_verify_ls_and_show_keep_foreign_entries_and_name_them(
        dump: Path, capsys: pytest.CaptureFixture[str]) -> None:
    foreign = _digests(dump, (SINGLE_99, GROUP_99))
    (_folder(dump, GROUP_99) / ".tmp-left-by-a-writer").write_bytes(b"x")  # a temporary: gc's, whatever the format

    code, out = _cli(capsys, "verify", str(dump), "--json")
    doc = json.loads(out)
    assert code == 3 and doc["ok"] is False  # nothing damaged; foreign entries not checked
    assert {(p["status"], p["step"], p["format_version"], p["written_by"], len(p["calls"])) for p in doc["problems"]} \
        == {("foreign", SINGLE_99, 99, "9.9.0", CALLS), ("foreign", GROUP_99, 99, "9.9.0", CALLS)}
    code, out = _cli(capsys, "verify", str(dump))
    assert code == 3 and "FOREIGN" in out and "format version 99 (written by skipweave 9.9.0)" in out

    code, out = _cli(capsys, "ls", str(dump))
    assert code == 0 and out.count("foreign (format 99, skipweave 9.9.0)") == 2 and "2 foreign" in out
    code, out = _cli(capsys, "show", str(_folder(dump, SINGLE_99) / "r0-0000.manifest.json"))
    assert code == 3 and "FOREIGN: format version 99 (written by skipweave 9.9.0)" in out
    code, out = _cli(capsys, "show", str(_folder(dump, GROUP_V1) / "r0-0000.manifest.json"))
    assert code == 0 and "valid" in out  # a format-1 entry of a group, shown by its call

    code, out = _cli(capsys, "gc", str(dump), "--yes", "--min-age", "0", "--json")
    doc = json.loads(out)
    assert code == 0 and [(a["kind"], a["outcome"]) for a in doc["actions"]] == [
        ("foreign", "skipped"), ("foreign", "skipped"), ("temporary", "removed")]
    assert _digests(dump, (SINGLE_99, GROUP_99)) == foreign

    code, out = _cli(capsys, "gc", str(dump), "--keep-last", "1", "--yes", "--min-age", "0")
    assert code == 0 and "why: holds 1 file of format version 99" in out and "why: holds 4 files of format" in out
    assert sorted(int(p.name) for p in (dump / NS / ROLE).iterdir() if p.name.isdigit()) == [SINGLE_99, GROUP_99]
    assert _digests(dump, (SINGLE_99, GROUP_99)) == foreign
    plan = plan_retention(StepStore(str(dump), NS, ROLE), KeepRule(last=1))
    assert plan.remove == [] and [i.detail for i in plan.kept] == [
        "holds 4 files of format version 99 (written by skipweave 9.9.0), which this skipweave does not read"]


def test_an_older_reader_leaves_newer_entries_in_place(dump: Path, host: Any, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A skipweave that reads only format 1 (simulated): format-2 entries are foreign to it, and kept."""
    monkeypatch.setattr(versions, "READABLE", frozenset({1}))
    newer = _digests(dump, (SINGLE_V2, GROUP_V2))
    live = _run(host, dump, range(1, 7))
    assert {s for s, _ in live} == {SINGLE_V2, GROUP_V2, SINGLE_99, GROUP_99}
    assert _digests(dump, (SINGLE_V2, GROUP_V2)) == newer
    code, _ = _cli(capsys, "gc", str(dump), "--yes", "--min-age", "0")
    assert code == 0 and _digests(dump, (SINGLE_V2, GROUP_V2)) == newer
    found = scan(str(dump), checksums=True)
    assert {p.step: p.status for p in found.parts} == {
        SINGLE_V1: Status.COMPLETE, GROUP_V1: Status.COMPLETE, SINGLE_V2: Status.FOREIGN, GROUP_V2: Status.FOREIGN,
        SINGLE_99: Status.FOREIGN, GROUP_99: Status.FOREIGN}


def test_a_foreign_version_is_not_damage_but_a_missing_one_is(tmp_path: Path) -> None:
    from skipweave.store.errors import EntryForeign, EntryInvalid

    for bad in ({}, {"format_version": "2"}, {"format_version": True}, {"format_version": None}, []):
        with pytest.raises(EntryInvalid):
            versions.version_of(bad, "m.json")
    for version in (0, 3, 99, -1):
        with pytest.raises(EntryForeign) as err:
            versions.version_of({"format_version": version, "versions": {"skipweave": "0.2\x1b[31m"}}, "m.json")
        assert err.value.version == version and err.value.writer == "0.2\\x1b[31m"  # shown to people: escaped
    assert versions.version_of({"format_version": 1}, "m.json") == 1
    assert versions.fingerprint_rule({"format_version": 1, "fingerprint_rule": "signature"}) == "arguments"
