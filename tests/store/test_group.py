"""Groups of small entries (skipweave.store.format.group): written by the group commit, served per call, judged whole.

Every dump dir here is treated as untrusted: the crafted groups are what a copy, a hand edit or a damaged disk
leaves, and none of them may be served.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from skipweave.store.format.layout import parse_group_name
from skipweave.store.format.manifest import EntryInvalid
from skipweave.store.gc import apply_gc, plan_gc
from skipweave.store.scan import scan
from skipweave.store.step_store import EntryMeta, StepStore

CALLS = 10


def _items(store: StepStore, calls: range, step: int = 1, *, nbytes: int = 128) -> list[Any]:
    out = []
    for c in calls:
        staged = store.stage({"ids": torch.arange(nbytes // 8) + c, "call": c}, rng_state=None).copied()
        out.append((store.key(step, "gen", "r0", c), staged, EntryMeta("m:f", f"fp{c}", 0.1, background=True)))
    return out


def _grouped(tmp_path: Path, calls: range = range(CALLS)) -> tuple[StepStore, Path]:
    writer = StepStore(str(tmp_path), "ns", "rollout", calls_per_step=CALLS)
    results = writer.commit_many(_items(writer, calls))
    assert all(isinstance(r, tuple) and r[0] > 0 for r in results)
    writer.close_all()
    return writer, tmp_path / "ns" / "rollout" / "1" / "gen"


def _names(folder: Path) -> list[str]:
    return sorted(n.name for n in folder.iterdir() if not n.name.startswith("."))


def _group_file(folder: Path) -> Path:
    (group,) = [p for p in folder.iterdir() if parse_group_name(p.name) is not None]
    return group


def _reader(tmp_path: Path) -> StepStore:
    return StepStore(str(tmp_path), "ns", "rollout", calls_per_step=CALLS)


def test_a_group_commit_of_small_entries_writes_one_group_and_serves_each_call(tmp_path: Path) -> None:
    _, folder = _grouped(tmp_path)
    names = _names(folder)
    assert len(names) == 3 and "r0-0000-0009.pack.json" in names and "r0.part.json" in names  # + one data file
    reader = _reader(tmp_path)
    assert reader.part_info(1, "gen", "r0").calls == tuple(range(CALLS)) and reader.is_complete(1, "gen", "r0")
    assert [(r.call, r.fingerprint) for r in reader.part_calls(1, "gen", "r0")] == [(c, f"fp{c}") for c in range(10)]
    for c in range(CALLS):
        loaded = reader.load(reader.key(1, "gen", "r0", c))
        assert loaded.result["call"] == c and torch.equal(loaded.result["ids"], torch.arange(16) + c)
        assert loaded.manifest["call_index"] == c and loaded.manifest["input_fingerprint"] == f"fp{c}"
    loaded.result["ids"].add_(100)  # the host changes a replayed tensor in place: the kept group is not changed
    assert torch.equal(reader.load(reader.key(1, "gen", "r0", 9)).result["ids"], torch.arange(16) + 9)
    with pytest.raises(FileNotFoundError):
        reader.load(reader.key(1, "gen", "r0", CALLS))
    found = scan(str(tmp_path), checksums=True)
    assert [(e.key.call, e.status.value) for e in found.entries()] == [(c, "complete") for c in range(CALLS)]
    assert sum(e.bytes for e in found.entries()) == sum(os.path.getsize(folder / n) for n in names
                                                        if n != "r0.part.json")
    assert found.leftovers == []


def test_a_slot_a_group_holds_is_taken_and_a_displaced_entry_goes_past_the_group(tmp_path: Path) -> None:
    writer, folder = _grouped(tmp_path)
    (key, staged, meta), = _items(writer, range(4, 5))
    assert writer.commit(key, staged, meta) == (0, key)  # kept: the group's entry of call 4
    nbytes, moved = writer.commit(key, staged, EntryMeta("m:f", "other", 0.1, displace=True))
    assert nbytes > 0 and moved.call == CALLS  # the next free slot, past the group's range
    again = writer.commit_many(_items(writer, range(3, 6)))  # a group commit of taken slots groups nothing new
    assert again == [(0, writer.key(1, "gen", "r0", c)) for c in range(3, 6)]
    assert len([n for n in _names(folder) if n.endswith(".pack.json")]) == 1


def test_a_call_with_its_own_manifest_is_served_by_it_and_not_by_its_group(tmp_path: Path) -> None:
    writer, _ = _grouped(tmp_path)
    key = writer.key(1, "gen", "r0", 3)
    writer.record(key, {"ids": torch.zeros(2), "call": "re-recorded"}, target_path="m:f", fingerprint="new",
                  rng_state=None, seconds=0.0, replace=True)  # a re-record (or an older skipweave) of a grouped call
    reader = _reader(tmp_path)
    assert reader.load(key).result["call"] == "re-recorded"
    assert reader.load(reader.key(1, "gen", "r0", 2)).result["call"] == 2
    assert [r.fingerprint for r in reader.part_calls(1, "gen", "r0")][2:5] == ["fp2", "new", "fp4"]
    assert len(list(scan(str(tmp_path), checksums=True).entries())) == CALLS  # call 3 once, from its manifest


def _edit_group(folder: Path, change: Any) -> None:
    path = _group_file(folder)
    group = json.loads(path.read_text())
    change(group)
    path.write_text(json.dumps(group))


def _data_file(folder: Path) -> Path:
    (data,) = folder.glob("*.pack.safetensors*")
    return data


def _set_data_item(folder: Path, **fields: Any) -> None:
    """Give the group's data item (and each entry's copy of it) other fields, as a consistent crafter would."""
    def change(group: dict[str, Any]) -> None:
        group["data"].update(fields)
        for entry in group["entries"]:
            entry["payload"][0].update(fields)
    _edit_group(folder, change)


def _rewrite_data(folder: Path, old: bytes, new: bytes) -> None:
    """Change the data file's bytes and make the group's size and checksum match again (a self-consistent crafter:
    checksums detect damage, not tampering)."""
    from skipweave.store.format.manifest import bytes_checksum

    data = _data_file(folder)
    raw = data.read_bytes()
    assert old in raw
    raw = raw.replace(old, new, 1)
    data.write_bytes(raw)
    _set_data_item(folder, bytes=len(raw), checksum=bytes_checksum(raw))


def _flip_a_byte(folder: Path) -> None:
    data = _data_file(folder)
    raw = bytearray(data.read_bytes())
    raw[-3] ^= 0x40  # same size: only the checksum tells
    data.write_bytes(bytes(raw))


CRAFTED = {
    "data file truncated": lambda f: os.truncate(_data_file(f), _data_file(f).stat().st_size - 5),
    "data file byte flipped": _flip_a_byte,
    "data file missing": lambda f: _data_file(f).unlink(),
    "data file a symlink": lambda f: (_data_file(f).rename(f.parents[3] / "elsewhere"),
                                      os.symlink(f.parents[3] / "elsewhere", f / _group_data_name(f))),
    "group of another step": lambda f: _edit_group(f, lambda g: g.update(step=2)),
    "group of another range": lambda f: _edit_group(f, lambda g: g.update(last=8)),
    "an entry naming another call": lambda f: _edit_group(f, lambda g: g["entries"][4].update(call_index=5)),
    "an entry of another target": lambda f: _edit_group(f, lambda g: g["entries"][4].update(target="other")),
    "one manifest short": lambda f: _edit_group(f, lambda g: g["entries"].pop()),
    "data file of another group": lambda f: _edit_group(f, lambda g: g["data"].update(name="r0-0000-0008.x.pack."
                                                                                           "safetensors")),
    "data file outside the folder": lambda f: _edit_group(f, lambda g: g["data"].update(name="../x.pack.safetensors")),
    "an entry listing a foreign payload": lambda f: _edit_group(f, lambda g: g["entries"][4]["payload"][0].update(
        checksum="xxh3_128:" + "0" * 32)),
    "group file not JSON": lambda f: _group_file(f).write_text("{not json"),
    "group file without a version number": lambda f: _edit_group(f, lambda g: g.pop("format_version")),
    "group file whose version is a string": lambda f: _edit_group(f, lambda g: g.update(format_version="2")),
    "a fingerprint that is not a string": lambda f: _edit_group(
        f, lambda g: g["entries"][4].update(input_fingerprint=7)),
    "a data file claimed to take 4 GiB": lambda f: _set_data_item(f, bytes=4 << 30),  # refused before allocating
    "a data file claimed to take 10**30 bytes": lambda f: _set_data_item(f, bytes=10**30),
    "a generation time beyond a float": lambda f: _edit_group(
        f, lambda g: g["entries"][4].update(generation_seconds=10**400)),
    "a creation time beyond a float": lambda f: _edit_group(f, lambda g: g["entries"][4].update(created_unix=10**400)),
    "a data file whose tree of a call is misnamed": lambda f: _rewrite_data(f, b'"0004/tree"', b'"x004/tree"'),
    "a data file whose tree of a call is not uint8": lambda f: _rewrite_data(
        f, b'"0004/tree":{"dtype":"U8"', b'"0004/tree":{"dtype":"I8"'),
}


def _group_data_name(folder: Path) -> str:
    return str(json.loads(_group_file(folder).read_text())["data"]["name"])


@pytest.mark.parametrize("craft", sorted(CRAFTED))
def test_a_damaged_or_crafted_group_is_never_served_and_verify_and_gc_agree(tmp_path: Path, craft: str) -> None:
    _, folder = _grouped(tmp_path)
    CRAFTED[craft](folder)
    reader = _reader(tmp_path)
    with pytest.raises(EntryInvalid):
        reader.load(reader.key(1, "gen", "r0", 4))
    found = scan(str(tmp_path), checksums=True)
    statuses = {e.key.call: e.status.value for e in found.entries()}
    assert statuses.get(4) == "corrupt", statuses  # the judgement of the run, in the CLI
    from skipweave.cli.main import main as cli

    assert cli(["ls", str(tmp_path), "--json"]) == 0 and cli(["verify", str(tmp_path)]) == 1
    assert set(statuses.values()) == {"corrupt"} and len(statuses) == CALLS  # judged whole: every call of it
    actions = plan_gc(found)
    (whole,) = [a for a in actions if a.kind.value == "corrupt_entry"]  # one removal for the group, not ten
    assert whole.bytes == sum(os.lstat(p).st_size for p in whole.files if os.path.lexists(p))
    for action in actions:
        apply_gc(found, action, min_age=0, dry_run=False)
    assert all(a.outcome in ("removed", "skipped") for a in actions), [(a.path, a.outcome, a.detail) for a in actions]
    assert [e for e in scan(str(tmp_path), checksums=True).entries() if e.status.value == "corrupt"] == []
    assert (tmp_path / "elsewhere").exists() or craft != "data file a symlink"  # never removed through the link


def test_a_call_two_groups_claim_is_served_by_neither_and_the_others_are(tmp_path: Path) -> None:
    _, folder = _grouped(tmp_path, range(0, 6))
    second = StepStore(str(tmp_path), "ns", "rollout")
    second.commit_many(_items(second, range(6, 10)))
    # A sound group of 4..9 from another dump dir copied in: what merging two dump dirs by hand leaves.
    shutil.copy(_items_group(tmp_path, range(4, 10), folder), folder / "r0-0004-0009.pack.json")
    reader = _reader(tmp_path)
    with pytest.raises(EntryInvalid, match="claimed by 2 group files"):
        reader.load(reader.key(1, "gen", "r0", 7))
    assert reader.load(reader.key(1, "gen", "r0", 2)).result["call"] == 2
    assert {r.call for r in reader.part_calls(1, "gen", "r0")} == {0, 1, 2, 3}
    statuses = {(e.key.call, e.path.endswith("r0-0004-0009.pack.json")): e.status.value
                for e in scan(str(tmp_path), checksums=True).entries()}
    # call 2 is sound; its part was never closed and nothing says how many calls a step makes: incomplete, not corrupt
    assert statuses[(7, True)] == statuses[(7, False)] == "corrupt" and statuses[(2, False)] == "incomplete"
    from skipweave.cli.main import main as cli

    assert cli(["verify", str(tmp_path)]) == 1
    assert cli(["gc", str(tmp_path), "--yes", "--min-age", "0"]) == 0  # the judgement gc re-checks under the lock
    assert cli(["verify", str(tmp_path)]) == 0


def _items_group(tmp_path: Path, calls: range, folder: Path) -> Path:
    """A sound group of ``calls`` written elsewhere, its data file copied into ``folder``; returns its group file."""
    elsewhere = tmp_path / "elsewhere-dump"
    store = StepStore(str(elsewhere), "ns", "rollout")
    store.commit_many(_items(store, calls))
    source = elsewhere / "ns" / "rollout" / "1" / "gen"
    group = _group_file(source)
    shutil.copy(source / json.loads(group.read_text())["data"]["name"], folder)
    return group


def test_names_no_writer_makes_claim_no_call(tmp_path: Path) -> None:
    _, folder = _grouped(tmp_path)
    for name in ("r0-0000-9999.pack.json", "r0-0005-0001.pack.json", "r0-00000-0001.pack.json"):
        (folder / name).write_text("{}")  # a range of 10,000 calls, a reversed one, a number not as written
    reader = _reader(tmp_path)
    assert reader.part_info(1, "gen", "r0").calls == tuple(range(CALLS))
    assert reader.load(reader.key(1, "gen", "r0", 4)).result["call"] == 4
    found = scan(str(tmp_path))
    assert len(list(found.entries())) == CALLS and len(found.ignored) == 3


def test_discarding_a_grouped_entry_sets_its_whole_group_aside(tmp_path: Path) -> None:
    writer, folder = _grouped(tmp_path)
    writer.discard(writer.key(1, "gen", "r0", 4), reason="test")
    assert _names(folder) == ["r0.part.json"]
    (aside,) = (tmp_path / "ns" / "rollout" / "_set_aside").iterdir()
    assert len(list(aside.iterdir())) == 2  # the group file and its data file, kept, never served
    reader = _reader(tmp_path)
    with pytest.raises(FileNotFoundError):
        reader.load(reader.key(1, "gen", "r0", 2))


KILLED = textwrap.dedent('''
    import os, sys, torch
    from skipweave.store.step_store import EntryMeta, StepStore
    replaced = 0
    real = os.replace

    def dying(*args, **kwargs):  # the data file is renamed into place; the kill comes before the group file's rename
        global replaced
        replaced += 1
        if replaced == int(sys.argv[2]):
            os.kill(os.getpid(), 9)
        return real(*args, **kwargs)

    os.replace = dying
    store = StepStore(sys.argv[1], "ns", "rollout", calls_per_step=10)
    items = []
    for c in range(10):
        staged = store.stage({"ids": torch.arange(16) + c}, rng_state=None).copied()
        items.append((store.key(1, "gen", "r0", c), staged, EntryMeta("m:f", "", 0.0, background=True)))
    store.commit_many(items)
''')


@pytest.mark.parametrize("kill_at", [1, 2])
def test_a_kill_during_a_group_commit_leaves_no_entry_of_it(tmp_path: Path, kill_at: int) -> None:
    """SIGKILL before the data file's rename (1) or between it and the group file's rename (2): nothing of the
    group is served, verify passes, gc removes what is left, and the calls record afresh."""
    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    dump = tmp_path / "dump"
    proc = subprocess.run([sys.executable, str(script), str(dump), str(kill_at)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}, timeout=120)
    assert proc.returncode == -9, proc.stderr
    reader = StepStore(str(dump), "ns", "rollout", calls_per_step=10)
    assert reader.part_info(1, "gen", "r0").calls == ()
    found = scan(str(dump), checksums=True)
    assert list(found.entries()) == [] and found.leftovers
    assert {x.kind.value for x in found.leftovers} == ({"temporary"} if kill_at == 1 else {"temporary", "orphan"})
    for action in plan_gc(found):
        apply_gc(found, action, min_age=0, dry_run=False)
    folder = dump / "ns" / "rollout" / "1" / "gen"
    assert not folder.exists() or [n for n in _names(folder) if n != "r0.part.json"] == []
    writer = StepStore(str(dump), "ns", "rollout", calls_per_step=10)
    assert all(isinstance(r, tuple) and r[0] > 0 for r in writer.commit_many(_items(writer, range(10))))


def test_compressed_groups_round_trip_and_show_summarises_a_grouped_entry(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from skipweave.cli.main import main as cli

    writer = StepStore(str(tmp_path), "ns", "rollout", calls_per_step=CALLS, compress=3)
    writer.commit_many(_items(writer, range(CALLS), nbytes=4096))
    writer.close_all()
    folder = tmp_path / "ns" / "rollout" / "1" / "gen"
    data = _data_file(folder)
    assert data.name.endswith(".pack.safetensors.zst")
    reader = _reader(tmp_path)
    assert torch.equal(reader.load(reader.key(1, "gen", "r0", 7)).result["ids"], torch.arange(512) + 7)
    assert cli(["show", str(data), "--call", "7", "--verify", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["status"] == "valid" and doc["manifest"]["call_index"] == 7
    assert [(r["path"], r["kind"], r["shape"], r["bytes"]) for r in doc["result"]] == [
        ("['ids']", "tensor", [512], 4096), ("['call']", "int", [], None)]  # the tree read from the data file
    assert cli(["show", str(folder / "r0-0000-0009.pack.json")]) == 2  # which call: --call N
    assert "--call N" in capsys.readouterr().err
    # the manifest path a grouped entry would have, and the target folder with --call, name it too
    for args in ([str(folder / "r0-0003.manifest.json")], [str(folder), "--call", "3"]):
        assert cli(["show", *args, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["manifest"]["call_index"] == 3
    assert cli(["show", str(folder), "--call", str(CALLS)]) == 2 and "no entry of call" in capsys.readouterr().err
    assert cli(["verify", str(tmp_path)]) == 0


SURROGATES = {"pair": "a\ud83d\ude00b", "lone": "x\udc80", "strs": ["\ud83d\ude00", "ok"], "keys": {"\udbff\udfff": 1},
              "nested": [{"k": "\ud83d\ude00", "n": 1}], "text": "plain ünïcödé \U0001f600"}


def test_strings_holding_surrogates_replay_exactly_alone_and_in_a_group_and_show_reads_them(tmp_path: Path) -> None:
    """A high surrogate followed by a low one is two characters to Python; written as JSON escapes it read back
    as the one character the pair encodes."""
    from skipweave.cli.show import describe

    store = StepStore(str(tmp_path), "ns", "rollout", calls_per_step=3)
    alone = store.key(1, "gen", "r0", 0)
    store.record(alone, SURROGATES, target_path="m:f", fingerprint="", rng_state=None, seconds=0.1)
    items = [(store.key(2, "gen", "r0", c), store.stage(SURROGATES, rng_state=None).copied(),
              EntryMeta("m:f", "", 0.1, background=True)) for c in range(3)]
    assert all(isinstance(r, tuple) for r in store.commit_many(items))
    store.close_all()
    reader = StepStore(str(tmp_path), "ns", "rollout", calls_per_step=3)
    for key in (alone, *(k for k, _, _ in items)):
        assert reader.load(key).result == SURROGATES, key
    for entry in scan(str(tmp_path), checksums=True).entries():
        doc = describe(entry.path, checksums=True, call=entry.key.call if entry.key.step == 2 else None)
        assert doc["status"] == "valid" and doc["summary_error"] is None and doc["result"], entry.path


def test_a_group_whose_manifests_hold_a_surrogate_is_served_and_verified(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A program whose path holds a byte that is not UTF-8 has it in ``sys.argv[0]`` as a lone surrogate, and every
    manifest of its groups (``writer.argv0``) holds it."""
    monkeypatch.setattr(sys, "argv", [os.fsdecode(b"/tmp/train_\xff.py")])
    _, folder = _grouped(tmp_path)
    reader = _reader(tmp_path)
    assert [r.call for r in reader.part_calls(1, "gen", "r0")] == list(range(CALLS))
    for c in range(CALLS):
        loaded = reader.load(reader.key(1, "gen", "r0", c))
        assert loaded.result["call"] == c and loaded.manifest["writer"]["argv0"] == "/tmp/train_\udcff.py"
    found = scan(str(tmp_path), checksums=True)
    assert [e.status.value for e in found.entries()] == ["complete"] * CALLS
