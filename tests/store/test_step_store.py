"""StepStore bookkeeping: which steps count as recorded, and the memory of closed parts."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from skipweave.store import index
from skipweave.store.format.layout import target_dir
from skipweave.store.step_store import StepStore


def _record(store: StepStore, step: int, call: int = 0) -> None:
    store.prepare_part(step, "gen", "r0")
    store.record(store.key(step, "gen", "r0", call), {"step": step}, target_path="m:f", fingerprint="",
                 rng_state=None, seconds=0.0)


def _filled(dump: Path, steps: int) -> None:
    writer = StepStore(str(dump), "ns", "rollout")
    for s in range(1, steps + 1):
        _record(writer, s)
    writer.close_all()


def test_recorded_steps_lists_closed_parts_and_sees_later_changes(tmp_path: Path, monkeypatch: Any) -> None:
    _filled(tmp_path, 4)
    reader = StepStore(str(tmp_path), "ns", "rollout", calls_per_step=2)
    assert reader.recorded_steps("gen", "r0") == [1, 2, 3, 4]
    # remembered, not re-read next time
    assert set(reader._parts.closed_seen.keys()) == {(s, "gen", "r0") for s in (1, 2, 3, 4)}
    # A change made by hand (no skipweave writer bumps the role folder's stamp) is seen at the next rebuild
    # of the index, at most INDEX_REFRESH_S later; here at once. No part file: one call of the two expected.
    monkeypatch.setattr(index, "INDEX_REFRESH_S", 0.0)
    (Path(target_dir(str(tmp_path), reader.key(2, "gen", "r0", 0))) / "r0.part.json").unlink()
    assert reader.recorded_steps("gen", "r0") == [1, 3, 4]


def test_another_writer_completing_a_part_is_seen_at_once(tmp_path: Path) -> None:
    writer = StepStore(str(tmp_path), "ns", "rollout", calls_per_step=2)
    _record(writer, 1, 0)
    _record(writer, 1, 1)
    _record(writer, 2, 0)
    reader = StepStore(str(tmp_path), "ns", "rollout", calls_per_step=2)
    assert reader.recorded_steps("gen", "r0") == [1]  # step 2 holds 1 of 2 calls (and is open)
    _record(writer, 2, 1)  # inside an existing step folder: the writer bumps the role folder's stamp
    assert reader.recorded_steps("gen", "r0") == [1, 2]


def test_repeat_decisions_do_not_rescan_the_store(tmp_path: Path, monkeypatch: Any) -> None:
    """The index is reused: with nothing changed, no step folder is listed again."""
    _filled(tmp_path, 30)
    reader = StepStore(str(tmp_path), "ns", "rollout")
    first = reader.recorded_steps("gen", "r0")
    calls: list[str] = []
    real = index.list_steps
    monkeypatch.setattr(index, "list_steps", lambda *a: calls.append("scan") or real(*a))
    for _ in range(100):
        assert reader.recorded_steps("gen", "r0") is first
    assert calls == []
    _record(StepStore(str(tmp_path), "ns", "rollout"), 31)  # another writer: seen, by one rescan
    assert reader.recorded_steps("gen", "r0")[-1] == 31 and calls  # rescanned once the stamp moved


def test_a_step_re_recorded_by_another_process_is_judged_afresh(tmp_path: Path) -> None:
    _filled(tmp_path, 3)
    reader = StepStore(str(tmp_path), "ns", "rollout", calls_per_step=2)
    assert reader.recorded_steps("gen", "r0") == [1, 2, 3]
    shutil.rmtree(tmp_path / "ns" / "rollout" / "2")
    other = StepStore(str(tmp_path), "ns", "rollout", calls_per_step=2)
    _record(other, 2)  # one call of two, never closed: an interrupted re-record
    assert reader.recorded_steps("gen", "r0") == [1, 3]
    folder = Path(target_dir(str(tmp_path), reader.key(2, "gen", "r0", 0)))
    for f in folder.iterdir():  # what gc leaves of that incomplete part: an empty folder
        f.unlink()
    assert reader.recorded_steps("gen", "r0") == [1, 3]


def test_a_step_folder_removed_by_another_process_drops_out(tmp_path: Path) -> None:
    _filled(tmp_path, 3)
    reader = StepStore(str(tmp_path), "ns", "rollout")
    assert reader.recorded_steps("gen", "r0") == [1, 2, 3]
    shutil.rmtree(tmp_path / "ns" / "rollout" / "2")
    assert reader.recorded_steps("gen", "r0") == [1, 3]


def test_set_aside_and_discard_forget_the_closed_part(tmp_path: Path) -> None:
    _filled(tmp_path, 3)
    reader = StepStore(str(tmp_path), "ns", "rollout", calls_per_step=1)
    assert reader.recorded_steps("gen", "r0") == [1, 2, 3]
    assert reader.set_aside(2, "gen", "r0", reason="test") is not None
    assert reader.recorded_steps("gen", "r0") == [1, 3]
    reader.discard(reader.key(3, "gen", "r0", 0), reason="test")
    assert reader.recorded_steps("gen", "r0") == [1]


def test_a_leftover_part_another_writer_recorded_anew_meanwhile_is_not_set_aside(tmp_path: Path,
                                                                               monkeypatch: Any) -> None:
    """Two writers of a new run find the part an interrupted run left (1 of 3 calls). One sets it aside and records
    the step whole before the other takes the part's lock: the other must leave those entries alone."""
    _record(StepStore(str(tmp_path), "ns", "rollout", calls_per_step=3), 2)  # the interrupted run: 1 call of 3
    a, b = (StepStore(str(tmp_path), "ns", "rollout", calls_per_step=3) for _ in range(2))
    real = StepStore.set_aside
    raced: list[str] = []

    def racing(self: StepStore, *args: Any, **kwargs: Any) -> Any:
        if self is a and not raced:  # a has read the part and is about to set it aside; b is quicker
            raced.append("b")
            for call in range(3):
                _record(b, 2, call)  # b's first call sets the leftover aside
        return real(self, *args, **kwargs)

    monkeypatch.setattr(StepStore, "set_aside", racing)
    a.prepare_part(2, "gen", "r0")
    assert raced == ["b"]
    folder = Path(target_dir(str(tmp_path), a.key(2, "gen", "r0", 0)))
    assert sorted(p.name for p in folder.glob("*.manifest.json")) == [f"r0-000{c}.manifest.json" for c in range(3)]
    assert len(list((tmp_path / "ns" / "rollout" / "_set_aside").iterdir())) == 1  # only the interrupted run's part


def test_a_scan_lists_the_role_folder_once_not_once_per_part(tmp_path: Path, monkeypatch: Any) -> None:
    """How many calls a step makes is reckoned from the role's newest steps for every part a scan judges: listed once
    while the role folder is unchanged (a scan of 10,000 steps took 265 s listing it per part, 11 s after)."""
    from skipweave.store import parts
    from skipweave.store.scan import scan

    _filled(tmp_path, 60)
    listings: list[str] = []
    real = parts.list_steps
    monkeypatch.setattr(parts, "list_steps", lambda *a: listings.append("listed") or real(*a))
    result = scan(str(tmp_path))
    assert len(result.parts) == 60 and all(p.expected_calls == 1 for p in result.parts)
    assert len(listings) <= 2, len(listings)  # 60 before: one per part
    _record(StepStore(str(tmp_path), "ns", "rollout"), 61)  # a step added: the role folder changed, listed again
    assert len(scan(str(tmp_path)).parts) == 61
