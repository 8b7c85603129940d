"""StepStore bookkeeping: which steps count as recorded, and the memory of closed parts."""

from __future__ import annotations

import shutil
from pathlib import Path

from skipweave.store.layout import target_dir
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


def test_recorded_steps_lists_closed_parts_and_remembers_them(tmp_path: Path) -> None:
    _filled(tmp_path, 4)
    reader = StepStore(str(tmp_path), "ns", "rollout")
    assert reader.recorded_steps("gen", "r0") == [1, 2, 3, 4]
    # A remembered closed part is not re-read: its part file going away unseen does not change the answer...
    (Path(target_dir(str(tmp_path), reader.key(2, "gen", "r0", 0))) / "r0.part.json").unlink()
    assert reader.recorded_steps("gen", "r0") == [1, 2, 3, 4]
    # ...while a fresh reader re-reads it: no part file and one call of the two expected, so step 2 is incomplete.
    assert StepStore(str(tmp_path), "ns", "rollout", calls_per_step=2).recorded_steps("gen", "r0") == [1, 3, 4]


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
