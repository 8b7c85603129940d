"""``skipweave ls`` over a real store with complete, incomplete and corrupted entries and leftovers.

:func:`make_store` builds that store with the real ``StepStore`` API; the other CLI tests import it.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from skipweave.cli.main import main
from skipweave.store.step_store import StepStore

NS, ROLE, TARGET = "default", "rollout", "gen"


def payload(step: int, call: int, shard: str = "r0") -> dict[str, Any]:
    """The result recorded for one call (deterministic, so a test can compare what it loads)."""
    return {"ids": torch.arange(64).reshape(8, 8) + 100 * step + call, "lp": torch.rand(16), "tag": f"{shard}-{step}"}


def _record(store: StepStore, step: int, call: int, shard: str = "r0", target: str = TARGET) -> None:
    store.prepare_part(step, target, shard)
    store.record(store.key(step, target, shard, call), payload(step, call, shard), target_path="host.mod:Gen.generate",
                 fingerprint="fp", rng_state=None, seconds=0.25)


@dataclass
class Store:
    """A dump dir and where each kind of damage was done."""

    dump: Path
    complete: list[tuple[int, str, str, int]] = field(default_factory=list)  # (step, target, shard, call)
    corrupt: dict[str, Path] = field(default_factory=dict)  # damage -> manifest
    incomplete: Path = Path()  # target folder of the incomplete part (step 3)
    tmp_file: Path = Path()
    orphans: list[Path] = field(default_factory=list)
    set_aside: Path = Path()

    def target(self, step: int, target: str = TARGET) -> Path:
        return self.dump / NS / ROLE / str(step) / target

    def manifest(self, step: int, call: int, shard: str = "r0", target: str = TARGET) -> Path:
        return self.target(step, target) / f"{shard}-{call:04d}.manifest.json"

    def payload_file(self, step: int, call: int, suffix: str, shard: str = "r0") -> Path:
        return next(self.target(step).glob(f"{shard}-{call:04d}.*{suffix}"))


def make_store(dump: Path, *, damage: bool = True) -> Store:
    """Record complete parts (2 calls each, closed), then, with ``damage``, one of each kind of trouble.

    - steps 1, 2, 4, 5, 6, 7 of ``gen`` shard r0 and step 1 shard r1, step 1 of target ``score``: complete;
    - step 3: call 0 of 2, never closed (a run killed mid-step): incomplete;
    - step 4 call 1: one payload byte flipped; step 5 call 0: tree file truncated; step 6 call 1: tensor
      file deleted; step 7 call 0: manifest overwritten with garbage;
    - a ``.tmp-`` file in step 1, an orphan payload pair (stem r0-0002) in step 2, a set-aside folder.
    """
    s = Store(dump)
    writer = StepStore(str(dump), NS, ROLE, calls_per_step=2)
    for step in (1, 2, 4, 5, 6, 7):
        for call in (0, 1):
            _record(writer, step, call)
            s.complete.append((step, TARGET, "r0", call))
    for call in (0, 1):
        _record(writer, 1, call, shard="r1")
        _record(writer, 1, call, target="score")
        s.complete += [(1, TARGET, "r1", call), (1, "score", "r0", call)]
    writer.close_all()
    if not damage:
        return s

    killed = StepStore(str(dump), NS, ROLE, calls_per_step=2)
    _record(killed, 3, 0)  # never closed: the process "died" before call 1
    s.incomplete = s.target(3)

    flipped = s.payload_file(4, 1, ".safetensors")
    data = bytearray(flipped.read_bytes())
    data[-5] ^= 0xFF
    flipped.write_bytes(bytes(data))
    truncated = s.payload_file(5, 0, ".tree.json")
    truncated.write_bytes(truncated.read_bytes()[:-7])
    s.payload_file(6, 1, ".safetensors").unlink()
    s.manifest(7, 0).write_text("{ this is not json")
    s.corrupt = {"flipped": s.manifest(4, 1), "truncated": s.manifest(5, 0), "deleted": s.manifest(6, 1),
                 "garbage": s.manifest(7, 0)}
    s.complete = [c for c in s.complete if c not in {(4, TARGET, "r0", 1), (5, TARGET, "r0", 0),
                                                       (6, TARGET, "r0", 1), (7, TARGET, "r0", 0)}]

    s.tmp_file = s.target(1) / ".tmp-0123456789ab-r0-0001.manifest.json"
    s.tmp_file.write_text('{"half": ')
    for src in (s.payload_file(2, 1, ".tree.json"), s.payload_file(2, 1, ".safetensors")):
        orphan = s.target(2) / src.name.replace("r0-0001.", "r0-0002.").replace(src.name.split(".")[1], "feedbeef")
        orphan.write_bytes(src.read_bytes())
        s.orphans.append(orphan)

    crashed = StepStore(str(dump), NS, ROLE, calls_per_step=2)
    _record(crashed, 8, 0)
    folder = StepStore(str(dump), NS, ROLE, calls_per_step=2).set_aside(8, TARGET, "r0", reason="test")
    assert folder is not None
    s.set_aside = Path(folder)
    return s


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run the ``skipweave`` command in this process; return (status, stdout, stderr)."""
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def _parts(doc: dict[str, Any]) -> dict[tuple[str, int, str], dict[str, Any]]:
    return {
        (t["name"], p["step"], p["shard"]): p
        for ns in doc["namespaces"] for role in ns["roles"] for t in role["targets"] for p in t["parts"]
    }


def test_ls_text_lists_namespaces_roles_targets_and_steps(tmp_path: Path, capsys: Any) -> None:
    s = make_store(tmp_path / "the dump")  # a space: the `show` hint is quoted for a shell
    status, out, err = cli(capsys, "ls", str(s.dump))
    assert status == 0 and not err
    assert "default/rollout" in out and "  target gen" in out and "  target score" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("    ") and line.split()[0].isdigit()]
    by_key = {(r[0], r[1]): r[2] for r in rows}
    assert by_key[("3", "r0")] == "incomplete"
    assert by_key[("7", "r0")] == "corrupt"  # unreadable manifest: seen without reading checksums
    assert by_key[("1", "r1")] == "complete"
    assert "9 parts, 17 entries" in out  # the set-aside step 8 is not listed
    assert "1 temporary file, 2 orphan payload files, 1 set-aside folder" in out
    # where the entries are, and one path `show` takes as it is
    assert f"  target gen  ({Path('default', 'rollout', 'STEP', 'gen')}/)" in out, out
    (hint,) = [line for line in out.splitlines() if line.startswith("one entry: skipweave show ")]
    status, shown, _ = cli(capsys, "show", *shlex.split(hint.removeprefix("one entry: skipweave show ")))
    assert status == 0 and "status    valid" in shown, shown
    assert "`skipweave verify` checks checksums" in out


def test_ls_json_schema(tmp_path: Path, capsys: Any) -> None:
    s = make_store(tmp_path / "dump")
    status, out, _ = cli(capsys, "ls", str(s.dump), "--json")
    doc = json.loads(out)
    assert status == 0
    assert doc["schema"] == "skipweave.ls/1" and doc["dump_dir"] == str(s.dump)
    assert doc["checksums_checked"] is False
    assert set(doc) == {"schema", "dump_dir", "checksums_checked", "totals", "namespaces", "leftovers", "ignored"}
    parts = _parts(doc)
    one = parts[("gen", 1, "r0")]
    assert set(one) == {"step", "shard", "status", "closed", "expected_calls", "entries", "entries_by_status", "bytes",
                        "created", "created_unix", "modified_unix", "generation_seconds", "path", "reason",
                        "foreign"}
    assert one["status"] == "complete" and one["closed"] and one["entries"] == 2 and one["expected_calls"] == 2
    assert one["bytes"] == sum(f.stat().st_size for f in s.target(1).iterdir()
                               if f.name.startswith("r0-") and not f.name.startswith("."))
    assert one["generation_seconds"] == pytest.approx(0.5) and one["created_unix"] > 0
    inc = parts[("gen", 3, "r0")]
    assert inc["status"] == "incomplete" and not inc["closed"] and inc["reason"] == (
        "1 of 2 calls committed and never closed")
    # sizes only: a flipped byte is invisible to ls, a truncated file, a missing one or garbage are not
    assert parts[("gen", 4, "r0")]["status"] == "complete"
    for step in (5, 6, 7):
        assert parts[("gen", step, "r0")]["status"] == "corrupt"
        assert parts[("gen", step, "r0")]["entries_by_status"] == {"complete": 1, "incomplete": 0, "refused": 0,
                                                                    "foreign": 0, "corrupt": 1}
    totals = doc["totals"]
    assert totals["parts"] == 9 and totals["entries"] == 17
    assert totals["parts_by_status"] == {"complete": 5, "incomplete": 1, "refused": 0, "foreign": 0, "corrupt": 3}
    assert sorted(x["kind"] for x in doc["leftovers"]) == ["orphan", "orphan", "set_aside", "temporary"]
    assert {x["path"] for x in doc["leftovers"]} == {str(p) for p in (s.tmp_file, *s.orphans, s.set_aside)}


def test_ls_clean_store_and_empty_or_missing_dump_dir(tmp_path: Path, capsys: Any) -> None:
    s = make_store(tmp_path / "dump", damage=False)
    status, out, _ = cli(capsys, "ls", str(s.dump))
    assert status == 0 and "8 complete, 0 incomplete, 0 corrupt" in out and "leftovers" not in out
    status, out, err = cli(capsys, "ls", str(s.dump / NS))  # one level too deep: say where to look
    assert status == 2 and not out and err.strip() == (
        f"skipweave ls: {s.dump / NS} is not a dump dir, but entries sit below it: try `skipweave ls {s.dump}`")
    status, out, _ = cli(capsys, "ls", str(s.dump.parent))  # one level too high
    assert status == 2
    (tmp_path / "empty").mkdir()
    status, out, _ = cli(capsys, "ls", str(tmp_path / "empty"))
    assert status == 0 and out.splitlines()[-1] == "nothing recorded yet"
    status, out, _ = cli(capsys, "ls", str(tmp_path / "empty"), "--json")
    assert status == 0 and json.loads(out)["namespaces"] == [] and json.loads(out)["totals"]["entries"] == 0
    status, out, err = cli(capsys, "ls", str(tmp_path / "nope"))
    assert status == 2 and not out and err.strip() == f"skipweave ls: {tmp_path / 'nope'} does not exist"


def test_ls_calls_per_step_option_changes_completeness(tmp_path: Path, capsys: Any) -> None:
    dump = tmp_path / "dump"
    store = StepStore(str(dump), NS, ROLE)
    _record(store, 1, 0)  # one call, never closed: complete unless a step makes 2 calls
    status, out, _ = cli(capsys, "ls", str(dump), "--json")
    assert _parts(json.loads(out))[("gen", 1, "r0")]["status"] == "complete"
    status, out, _ = cli(capsys, "ls", str(dump), "--json", "--calls-per-step", "2")
    assert _parts(json.loads(out))[("gen", 1, "r0")]["status"] == "incomplete"
    with pytest.raises(SystemExit) as exc:
        main(["ls", str(dump), "--calls-per-step", "0"])
    assert exc.value.code == 2 and "expected 1 or more" in capsys.readouterr().err

