"""Bundles: pack a recorded dump dir, unpack it back byte for byte, replay straight from the bundle at another path
(bit-identical, no live call, nothing written beside it), and read it with ``ls``, ``verify``, ``show`` and ``diff``."""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import shutil
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import skipweave
from skipweave.cli.main import main
from skipweave.config.errors import ConfigError
from skipweave.store.bundle.archive import BundleArchive
from skipweave.store.bundle.layout import MANIFEST_NAME
from skipweave.store.bundle.pack import PackError, pack
from skipweave.store.bundle.store import BundleReadOnly, BundleStore
from skipweave.store.bundle.unpack import UnpackConflict, unpack
from skipweave.store.step_store import StepStore
from tests.store.bundle.bundling import CALLS, NS, ROLE, STEPS, identical, load_host, run


def _files(root: Path) -> dict[str, str]:
    """Every file below ``root`` but lock files, by relative path, with its sha256."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.name.endswith(".lock")}


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Any]:
    module = load_host(tmp_path)
    yield module
    skipweave.unweave()


@pytest.fixture
def recorded(tmp_path: Path, host: Any) -> tuple[Path, list[Any]]:
    """A dump dir recorded by a woven run of steps 1-3 (2 calls each), and what that run saw."""
    dump = tmp_path / "dump"
    seen, calls = run(host, str(dump))
    assert len(calls) == len(STEPS) * CALLS
    return dump, seen


def test_pack_then_unpack_gives_identical_files(recorded: tuple[Path, list[Any]], tmp_path: Path) -> None:
    dump, _ = recorded
    result = pack(str(dump), str(tmp_path / "out" / "rec.zip"))
    assert result.entries == len(STEPS) * CALLS and len(result.parts) == len(STEPS) and not result.left_out
    with zipfile.ZipFile(result.path) as zf:  # an ordinary zip: every payload stored, the manifest last
        infos = zf.infolist()
        assert all(i.compress_type == zipfile.ZIP_STORED for i in infos)
        assert infos[-1].filename == MANIFEST_NAME and zf.testzip() is None
    done = unpack(result.path, str(tmp_path / "back"))
    assert len(done.written) == len(STEPS) and not done.present
    assert _files(tmp_path / "back" / NS) == _files(dump / NS)  # (the .runs marks are not entries: never packed)
    assert [p.name for p in (tmp_path / "back").iterdir()] == [NS]
    again = unpack(result.path, str(tmp_path / "back"))  # the same bundle again: already there, nothing written
    assert not again.written and len(again.present) == len(STEPS)
    assert _files(tmp_path / "back" / NS) == _files(dump / NS)


def test_replay_from_a_bundle_at_another_path_is_bit_identical_with_no_live_call(
        recorded: tuple[Path, list[Any]], tmp_path: Path, host: Any) -> None:
    dump, seen = recorded
    bundle = Path(pack(str(dump), str(tmp_path / "a" / "rec.zip")).path)
    moved = tmp_path / "elsewhere" / "copy.zip"
    moved.parent.mkdir()
    shutil.move(str(bundle), moved)
    shutil.rmtree(dump)  # nothing of the recording is left but the bundle
    before = (sorted(p.name for p in moved.parent.iterdir()), hashlib.sha256(moved.read_bytes()).hexdigest())
    replayed, calls = run(host, str(moved))
    assert calls == [] and identical(replayed, seen)
    assert (sorted(p.name for p in moved.parent.iterdir()), hashlib.sha256(moved.read_bytes()).hexdigest()) == before
    assert not dump.exists()


def test_a_call_the_bundle_does_not_hold_stops_the_run_naming_what_it_holds(
        recorded: tuple[Path, list[Any]], tmp_path: Path, host: Any) -> None:
    dump, _ = recorded
    bundle = pack(str(dump), str(tmp_path / "rec.zip"), steps={2, 3}).path
    with pytest.raises(skipweave.ReplayMissing) as info:
        run(host, bundle, steps=(1,))
    assert "the bundle holds target gen steps 2-3 (shard r0)" in str(info.value)
    assert host.CALLS == []


def test_a_bundle_role_is_replay_only_and_asking_it_to_record_says_why(tmp_path: Path, host: Any,
                                                                       recorded: tuple[Path, list[Any]]) -> None:
    from skipweave.config.parse import parse_role
    from tests.store.bundle.bundling import role

    bundle = pack(str(recorded[0]), str(tmp_path / "rec.zip")).path
    assert parse_role(ROLE, role(bundle)).replay_only
    with pytest.raises(ConfigError, match=r"skip\.rollout\.replay_only.*names a bundle.*skipweave unpack"):
        parse_role(ROLE, role(bundle, replay_only=False))
    assert not parse_role(ROLE, role(bundle, action="verify")).replay_only  # (a verify run records nothing)
    with pytest.raises(ConfigError, match=r"skip\.rollout\.record_steps.*names a bundle"):
        parse_role(ROLE, role(bundle, action="repeat", record_steps=[4]))
    with pytest.raises(ConfigError, match=r"skip\.rollout\.dump_dir.*a bundle skipweave can read"):
        skipweave.weave({"skip": {ROLE: role(str(tmp_path / "missing.zip"))}})
    assert not (tmp_path / "missing.zip").exists()  # (no folder made at a bundle's name)


def test_the_bundle_store_writes_nothing_and_overrides_every_public_method(
        recorded: tuple[Path, list[Any]], tmp_path: Path) -> None:
    bundle = pack(str(recorded[0]), str(tmp_path / "rec.zip")).path
    store = BundleStore(bundle, NS, ROLE)
    public = {n for n, v in inspect.getmembers(StepStore) if not n.startswith("_") and callable(v)}
    left = sorted(n for n in public if getattr(BundleStore, n) is getattr(StepStore, n))
    assert left == [], f"BundleStore leaves these to the dump dir's code: {left}"
    key = store.key(1, "gen", "r0", 0)
    with pytest.raises(BundleReadOnly, match="replay-only"):
        store.record(key, {"x": 1}, target_path="bhost:gen", fingerprint="", rng_state=None, seconds=0.0)
    with pytest.raises(BundleReadOnly):
        store.discard(key, reason="test")
    assert store.recorded_steps("gen", "r0") == list(STEPS) and store.part_info(1, "gen", "r0").calls == (0, 1)
    assert store.load(key).result["ids"].tolist() == [100] * 4


def test_pack_leaves_out_incomplete_and_foreign_parts_with_a_note(recorded: tuple[Path, list[Any]],
                                                                  tmp_path: Path) -> None:
    dump, _ = recorded
    step1 = dump / NS / ROLE / "1" / "gen"
    heads = [*step1.glob("*.manifest.json"), *step1.glob("*.pack.json")]
    assert heads
    for head in heads:  # written by a newer skipweave: foreign here
        doc = json.loads(head.read_text())
        doc["format_version"] = 99
        head.write_text(json.dumps(doc))
    (dump / NS / ROLE / "2" / "gen" / "r0.part.json").unlink()  # never closed, but it holds every call: complete
    store = StepStore(str(dump), NS, ROLE)
    store.record(store.key(7, "gen", "r0", 0), {"x": 1}, target_path="bhost:gen", fingerprint="", rng_state=None,
                 seconds=0.0)  # 1 of 2 calls, never closed: an interrupted run's
    result = pack(str(dump), str(tmp_path / "rec.zip"))
    reasons = {item["step"]: item["reason"] for item in result.left_out}
    assert set(reasons) == {1, 7}
    assert reasons[1].startswith("foreign:") and "format version 99" in reasons[1]
    assert reasons[7].startswith("incomplete:") and "1 of 2 calls" in reasons[7]
    with BundleArchive(result.path) as archive:
        assert archive.manifest["left_out"] == result.left_out
        assert {p["step"] for p in archive.manifest["parts"]} == {2, 3}
        assert archive.manifest["roles"][0]["config"] is None and archive.manifest["roles"][0]["config_note"]
        part2 = json.loads(archive.read(f"{NS}/{ROLE}/2/gen/r0.part.json"))
        assert part2["state"] == "closed"  # judged complete: an unpacked copy must not read as interrupted
    with pytest.raises(PackError, match="no complete part"):
        pack(str(dump), str(tmp_path / "none.zip"), steps={1})
    assert not (tmp_path / "none.zip").exists() and not list(tmp_path.glob(".tmp-*"))


def test_unpack_refuses_to_overwrite_a_different_entry(recorded: tuple[Path, list[Any]], tmp_path: Path) -> None:
    dump, _ = recorded
    bundle = pack(str(dump), str(tmp_path / "rec.zip")).path
    target = tmp_path / "target"
    shutil.copytree(dump, target)
    payload = next((target / NS / ROLE / "3" / "gen").glob("*.safetensors"))
    data = payload.read_bytes()
    payload.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))  # another recording at the same place (a byte flipped)
    before = _files(target)
    with pytest.raises(UnpackConflict, match=rf"step 3 shard r0.*a different {payload.name}"):
        unpack(bundle, str(target))
    assert _files(target) == before


def test_ls_verify_show_and_diff_read_a_bundle(recorded: tuple[Path, list[Any]], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    dump, _ = recorded
    bundle = pack(str(dump), str(tmp_path / "rec.zip")).path
    assert main(["ls", bundle, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["dump_dir"] == bundle and listed["totals"]["entries"] == len(STEPS) * CALLS
    assert main(["verify", bundle]) == 0
    assert "OK: every entry is complete" in capsys.readouterr().out
    assert main(["show", f"{bundle}/{NS}/{ROLE}/1/gen/r0-0000.manifest.json", "--verify", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["status"] == "valid" and shown["path"].startswith(bundle + "/")
    assert main(["show", f"{bundle}/{NS}/{ROLE}/1/gen/r0.part.json"]) != 0  # no entry: named by the bundle's member
    said = capsys.readouterr()
    assert f"{bundle}/{NS}/{ROLE}/1/gen/r0.part.json" in said.out + said.err and "skipweave-show-" not in said.err
    assert main(["diff", str(dump), bundle, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["totals"]["failing"] == 0
    assert main(["gc", bundle, "--yes"]) == 2
    assert "never changes" in capsys.readouterr().err
    assert {p.name for p in tmp_path.iterdir()} - {"__pycache__"} == {"bhost.py", "dump", "rec.zip"}


def test_the_pack_and_unpack_commands(recorded: tuple[Path, list[Any]], tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    dump, _ = recorded
    out = tmp_path / "cli.zip"
    assert main(["pack", str(dump), "-o", str(out), "--steps", "2-3", "--role", ROLE, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["entries"] == 2 * CALLS and doc["bytes"] == out.stat().st_size
    assert main(["pack", str(dump), "-o", str(tmp_path / "x.tar")]) == 2
    assert "ends with .zip" in capsys.readouterr().err
    assert main(["unpack", str(out), str(tmp_path / "back")]) == 0
    assert "unpacked 2 parts" in capsys.readouterr().out
    assert set(_files(tmp_path / "back" / NS)) == {k for k in _files(dump / NS) if not k.startswith(f"{ROLE}/1/")}
    (tmp_path / "a_file").write_text("mine")
    assert main(["unpack", str(out), str(tmp_path / "a_file")]) == 2  # was a FileExistsError traceback
    assert "a_file is no folder (a file of that name is there)" in capsys.readouterr().err
    assert (tmp_path / "a_file").read_text() == "mine"


def _maps(path: str) -> bool:
    """Whether this process maps ``path`` (``/proc/self/maps``)."""
    target = os.path.realpath(path)
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
        return any(line.rstrip("\n").removesuffix(" (deleted)").endswith(" " + target) for line in fh)


def test_a_large_tensor_member_is_served_on_a_mapping_of_the_bundle_without_a_copy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from skipweave.store.format import mapped

    dump = tmp_path / "dump"
    writer = StepStore(str(dump), NS, ROLE)
    recorded = {"ids": torch.arange(1000), "logp": torch.rand(7, 3).to(torch.bfloat16), "text": ["a"]}
    key = writer.key(9, "gen", "r0", 0)
    writer.record(key, recorded, target_path="bhost:gen", fingerprint="", rng_state=None, seconds=0.0)
    writer.close_all()
    bundle = pack(str(dump), str(tmp_path / "rec.zip")).path
    with BundleArchive(bundle) as archive:  # every copied member starts aligned (padding in its local header)
        assert {m.offset % 64 for m in archive.members.values() if m.offset is not None} == {0}
    before = Path(bundle).read_bytes()
    monkeypatch.setattr(mapped, "MAP_MIN", 0)  # (the test's tensors are small)
    store = BundleStore(bundle, NS, ROLE)
    result = store.load(key).result
    assert _maps(bundle)
    assert torch.equal(result["ids"], recorded["ids"]) and torch.equal(result["logp"], recorded["logp"])
    for t in (result["ids"], result["logp"]):  # each its own storage at offset 0, exactly its bytes
        assert t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.numel() * t.element_size()
    result["ids"].fill_(-1)  # the host's write stays its own: the bundle never changes
    assert Path(bundle).read_bytes() == before
    assert torch.equal(store.load(key).result["ids"], recorded["ids"])
    del result, t
    monkeypatch.setenv("SKIPWEAVE_MAP_PAYLOADS", "0")  # read into memory instead: the same values
    copied = store.load(key).result
    assert not _maps(bundle) and torch.equal(copied["logp"], recorded["logp"])


def test_a_verify_run_compares_live_calls_with_a_bundle_and_writes_nothing_beside_it(
        recorded: tuple[Path, list[Any]], tmp_path: Path, host: Any) -> None:
    dump, seen = recorded
    shipped = tmp_path / "shipped"
    bundle = pack(str(dump), str(shipped / "rec.zip")).path
    report = tmp_path / "report.jsonl"
    live, calls = run(host, bundle, action="verify", report=str(report), compare={"fields": {"r": "ignore"}})
    assert len(calls) == len(STEPS) * CALLS  # every call ran live, compared with the bundle's recording
    lines = [json.loads(x) for x in report.read_text().splitlines()]
    assert [(x["step"], x["call"], x["status"]) for x in lines] == [
        (s, c, "identical") for s in STEPS for c in range(CALLS)], lines
    assert sorted(p.name for p in shipped.iterdir()) == ["rec.zip"]
