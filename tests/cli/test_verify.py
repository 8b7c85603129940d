"""``skipweave verify``: every manifest and checksum, on clean and damaged stores."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.cli.test_ls import cli, make_store


def test_verify_clean_store_exits_0(tmp_path: Path, capsys: Any) -> None:
    s = make_store(tmp_path / "dump", damage=False)
    status, out, err = cli(capsys, "verify", str(s.dump))
    assert status == 0 and not err
    assert out.splitlines()[0].startswith(f"verified {s.dump}: 16 entries in 8 parts")
    assert out.splitlines()[-1] == "OK: every entry is complete and matches its checksums"
    status, out, _ = cli(capsys, "verify", str(s.dump), "--json")
    doc = json.loads(out)
    assert status == 0 and doc["ok"] is True and doc["problems"] == [] and doc["leftovers"] == []


def test_verify_lists_each_corrupt_entry_and_incomplete_part(tmp_path: Path, capsys: Any) -> None:
    s = make_store(tmp_path / "dump")
    status, out, _ = cli(capsys, "verify", str(s.dump))
    assert status == 1
    lines = out.splitlines()
    assert "INCOMPLETE  default/rollout gen step 3 shard r0: 1 of 2 calls committed and never closed " \
           "(1 entry; not served as a whole step: a run resumes it by inputs or records it afresh)" in lines
    corrupt = [line for line in lines if line.startswith("CORRUPT")]
    assert [c.split(":")[0] for c in corrupt] == [
        "CORRUPT     default/rollout gen step 4 shard r0 call 1",
        "CORRUPT     default/rollout gen step 5 shard r0 call 0",
        "CORRUPT     default/rollout gen step 6 shard r0 call 1",
        "CORRUPT     default/rollout gen step 7 shard r0 call 0",
    ]
    assert "does not match its checksum" in corrupt[0] and "bytes, manifest says" in corrupt[1]
    assert "is missing" in corrupt[2] and "is unreadable" in corrupt[3]
    assert "leftovers (not errors): 1 temporary file, 2 orphan payload files, 1 set-aside folder" in out
    assert lines[-1].startswith("FAILED: 4 corrupt entries, 0 refused entries, 1 incomplete part.")


def test_verify_incomplete_parts_alone_are_a_note_not_a_failure(tmp_path: Path, capsys: Any) -> None:
    s = make_store(tmp_path / "dump", damage=False)
    (s.target(2) / "r0.part.json").unlink()  # step left open by an interrupted run
    (s.target(2) / "r0-0001.manifest.json").unlink()
    status, out, _ = cli(capsys, "verify", str(s.dump))
    assert status == 0, out
    assert any(line.startswith("INCOMPLETE") for line in out.splitlines())
    assert out.splitlines()[-1].startswith("OK: nothing would be served wrongly; 1 incomplete part")
    status, out, _ = cli(capsys, "verify", str(s.dump), "--json")
    doc = json.loads(out)
    assert status == 0 and doc["ok"] is True and [p["status"] for p in doc["problems"]] == ["incomplete"]


def test_verify_json_schema(tmp_path: Path, capsys: Any) -> None:
    s = make_store(tmp_path / "dump")
    status, out, _ = cli(capsys, "verify", str(s.dump), "--json")
    doc = json.loads(out)
    assert status == 1
    assert set(doc) == {"schema", "dump_dir", "ok", "checksums_checked", "totals", "problems", "leftovers", "ignored"}
    assert doc["schema"] == "skipweave.verify/1" and doc["ok"] is False and doc["checksums_checked"] is True
    none_foreign = {"refused": 0, "foreign": 0}
    assert doc["totals"]["parts_by_status"] == {"complete": 4, "incomplete": 1, **none_foreign, "corrupt": 4}
    assert doc["totals"]["entries_by_status"] == {"complete": 12, "incomplete": 1, **none_foreign, "corrupt": 4}
    by_path = {p["path"]: p for p in doc["problems"]}
    for manifest in s.corrupt.values():
        p = by_path[str(manifest)]
        assert set(p) == {"status", "namespace", "role", "target", "step", "shard", "call", "path", "reason",
                          "entries"}
        assert p["status"] == "corrupt" and p["entries"] == [str(manifest)]
        assert p["call"] == int(manifest.name[3:7]) and p["step"] == int(manifest.parent.parent.name)
    inc = by_path[str(s.incomplete)]
    assert inc["status"] == "incomplete" and inc["call"] is None and inc["step"] == 3
    assert inc["entries"] == [str(s.incomplete / "r0-0000.manifest.json")]
    assert len(doc["problems"]) == 5


def test_verify_errors_for_people(tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "file").write_text("x")
    status, out, err = cli(capsys, "verify", str(tmp_path / "file"))
    assert status == 2 and not out and err.strip() == f"skipweave verify: {tmp_path / 'file'} is not a folder"
    s = make_store(tmp_path / "dump", damage=False)
    status, out, err = cli(capsys, "verify", str(s.dump / "default" / "rollout"))
    assert status == 2 and not out and f"try `skipweave verify {s.dump}`" in err
    (tmp_path / "fresh").mkdir()
    status, out, _ = cli(capsys, "verify", str(tmp_path / "fresh"))
    assert status == 0 and out.splitlines()[-1] == "OK: nothing recorded yet"
