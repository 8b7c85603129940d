"""Review 41: foreign judgement corners (a foreign manifest in a readable group, versions beyond 64 bits, places)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from skipweave.store.errors import EntryForeign
from skipweave.store.format import versions
from skipweave.store.retention import KeepRule, plan_retention
from skipweave.store.step_store import StepStore
from tests.store import test_foreign
from tests.store.test_foreign import GROUP_V2, NS, ROLE, SINGLE_V2, _cli, _digests, _folder


@pytest.fixture
def dump(tmp_path: Path) -> Path:
    """test_foreign's dump dir: steps of format 1, 2 and 99, single entries and groups."""
    return test_foreign.dump.__wrapped__(tmp_path)  # type: ignore[attr-defined, no-any-return]


def test_retention_keeps_a_readable_group_holding_a_foreign_entry(
        dump: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A format-2 group file with one format-99 manifest among its entries is foreign to runs, gc and verify (the
    group's check meets the entry); retention must judge it alike and keep its step."""
    [group] = [p for p in _folder(dump, GROUP_V2).iterdir() if p.name.endswith(".pack.json")]
    doc = json.loads(group.read_text())
    doc["entries"][1]["format_version"] = 99
    group.write_text(json.dumps(doc))
    before = _digests(dump, (GROUP_V2,))
    code, out = _cli(capsys, "verify", str(dump), "--json")
    assert ("foreign", GROUP_V2) in {(p["status"], p["step"]) for p in json.loads(out)["problems"]}
    plan = plan_retention(StepStore(str(dump), NS, ROLE), KeepRule(last=1))
    assert GROUP_V2 not in plan.remove
    code, _ = _cli(capsys, "gc", str(dump), "--keep-last", "1", "--yes", "--min-age", "0")
    assert code == 0 and _digests(dump, (GROUP_V2,)) == before


@pytest.mark.parametrize("literal", ["18446744073709551616", "100000000000000000000000000000", "-99999999999999999999"])
def test_an_integer_version_beyond_64_bits_is_foreign_not_corrupt(
        dump: Path, capsys: pytest.CaptureFixture[str], literal: str) -> None:
    """JSON integers beyond 64 bits read as floats (jsonio, orjson): still an integer version, so foreign and kept."""
    path = _folder(dump, SINGLE_V2) / "r0-0002.manifest.json"
    path.write_text(path.read_text().replace('"format_version": 2', f'"format_version": {literal}'))
    before = _digests(dump, (SINGLE_V2,))
    code, out = _cli(capsys, "gc", str(dump), "--yes", "--min-age", "0")
    assert code == 0 and _digests(dump, (SINGLE_V2,)) == before, out
    code, out = _cli(capsys, "verify", str(dump))
    assert code == 3 and "CORRUPT" not in out, out


def test_non_integral_or_small_float_versions_stay_invalid() -> None:
    from skipweave.store.errors import EntryInvalid

    for bad in (2.0, 1.5, 1.5e-3, 1e18, float("nan"), float("inf"), -float("inf")):
        with pytest.raises(EntryInvalid):
            versions.version_of({"format_version": bad}, "m.json")
    with pytest.raises(EntryForeign):
        versions.version_of({"format_version": 1e30}, "m.json")


def test_a_temporary_is_judged_by_age_where_no_boot_id_tells_machines_apart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a boot id (and a pid namespace) a place is the host name alone: another machine of that name writing
    to a shared store makes a temporary whose pid is free here, and it must not be taken for a dead writer's."""
    import time

    from skipweave.store import identity
    from skipweave.store.leftovers import LeftoverKind
    from skipweave.store.upkeep import leftover_kept

    monkeypatch.setattr(identity, "boot_id", lambda: None)
    monkeypatch.setattr(identity, "pid_namespace", lambda: "")
    monkeypatch.setattr(identity, "_process", None)
    monkeypatch.setattr(identity, "_place", None)
    me = identity.this_process()
    assert me.boot is None
    free_pid = 4_000_000 - 7  # (below the pid limit, never a live pid here)
    name = f".tmp-0000abcd.{free_pid}.0.{identity.place()}-r0-0000.manifest.json"  # the other machine's writer
    now = time.time()
    kept = leftover_kept(LeftoverKind.TEMPORARY, str(tmp_path / name), now - 5, min_age=3600, now=now)
    assert kept is not None and "less than" in kept
    assert leftover_kept(LeftoverKind.TEMPORARY, str(tmp_path / name), now - 7200, min_age=3600, now=now) is None
