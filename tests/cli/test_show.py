"""``skipweave show``: one entry's manifest and payload summary, from valid, corrupt and non-entry paths."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from skipweave.store.step_store import EntryMeta, StepStore
from skipweave.weaving.rng import capture_rng_state
from tests.cli.test_ls import NS, ROLE, cli, make_store


class Proto:
    """verl DataProto-shaped result."""

    def __init__(self) -> None:
        self.batch = {"input_ids": torch.zeros(4, 32, dtype=torch.int64),
                      "logp": torch.ones(4, 32, dtype=torch.bfloat16)}
        self.non_tensor_batch = {"uid": np.array(["a", "b", "c", "d"], dtype=object)}
        self.meta_info = {"global_steps": 3, "temperature": 0.7}


def _one_entry(dump: Path) -> Path:
    store = StepStore(str(dump), NS, ROLE)
    store.record(store.key(3, "gen", "r0", 0), Proto(), target_path="verl.trainer:Rollout.generate_sequences",
                 fingerprint="xxh3_128:abc", rng_state=capture_rng_state(), seconds=12.5)
    store.close_all()
    return dump / NS / ROLE / "3" / "gen" / "r0-0000.manifest.json"


def test_show_summarises_payload_without_loading_tensors(tmp_path: Path, capsys: Any,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    manifest = _one_entry(tmp_path / "dump")

    def no_load(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("show must not load tensors")

    monkeypatch.setattr("safetensors.torch.load_file", no_load)
    monkeypatch.setattr("safetensors.safe_open", no_load)
    status, out, err = cli(capsys, "show", str(manifest))
    assert status == 0 and not err
    assert "status    valid (sizes match; --verify checks checksums)" in out
    assert "role rollout  target gen  step 3  call 0  shard r0" in out
    assert "verl.trainer:Rollout.generate_sequences" in out and "duration  12.500 s of generation" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("  ")}
    assert rows["batch['input_ids']"][1:] == ["tensor", "torch.int64", "[4,", "32]", "1.0", "KiB"]
    assert rows["batch['logp']"][1:4] == ["tensor", "torch.bfloat16", "[4,"] and rows["batch['logp']"][-2:] == [
        "256", "B"]
    assert rows["non_tensor_batch['uid']"][1:3] == ["ndarray", "object"]
    assert rows["meta_info['temperature']"][1] == "float"
    assert "result: 5 leaves, 1.2 KiB in tensors" in out
    assert "rng state:" in out and "restored on replay" in out


def test_show_json_schema_and_path_forms(tmp_path: Path, capsys: Any) -> None:
    manifest = _one_entry(tmp_path / "dump")
    status, out, _ = cli(capsys, "show", str(manifest), "--json", "--verify")
    doc = json.loads(out)
    assert status == 0
    assert set(doc) == {"schema", "path", "status", "reason", "checksums_checked", "manifest", "payload", "result",
                        "rng", "summary_error", "environment", "format_version", "written_by"}
    assert doc["schema"] == "skipweave.show/1" and doc["status"] == "valid" and doc["checksums_checked"] is True
    assert doc["manifest"] == json.loads(manifest.read_text())
    assert [f["state"] for f in doc["payload"]] == ["ok", "ok"]
    assert set(doc["payload"][0]) == {"name", "bytes", "checksum", "on_disk_bytes", "state"}
    leaf = next(r for r in doc["result"] if r["path"] == "batch['input_ids']")
    assert leaf == {"path": "batch['input_ids']", "kind": "tensor", "dtype": "torch.int64", "shape": [4, 32],
                    "bytes": 1024}
    assert any(r["path"] == "['torch_cpu']" and r["kind"] == "tensor" for r in doc["rng"])
    # a payload file or the target folder designate the same entry
    payload = next(manifest.parent.glob("*.safetensors"))
    for path in (payload, manifest.parent):
        status, out, _ = cli(capsys, "show", str(path), "--json")
        assert status == 0 and json.loads(out)["path"] == str(manifest)


def test_show_corrupt_entries_exit_1_and_show_what_they_can(tmp_path: Path, capsys: Any) -> None:
    s = make_store(tmp_path / "dump")
    status, out, _ = cli(capsys, "show", str(s.corrupt["flipped"]))
    assert status == 0  # sizes match: only a checksum reveals a flipped byte
    status, out, _ = cli(capsys, "show", str(s.corrupt["flipped"]), "--verify", "--json")
    doc = json.loads(out)
    assert status == 1 and doc["status"] == "corrupt" and "does not match its checksum" in doc["reason"]
    assert [f["state"] for f in doc["payload"]] == ["ok", "checksum_mismatch"]
    assert doc["result"]  # the tree is intact: its summary is still shown

    status, out, _ = cli(capsys, "show", str(s.corrupt["deleted"]))
    assert status == 1 and "CORRUPT: payload" in out and "is missing" in out and " missing " in out
    assert "['ids']" in out

    status, out, _ = cli(capsys, "show", str(s.corrupt["truncated"]), "--json")
    doc = json.loads(out)
    assert status == 1 and doc["payload"][0]["state"] == "size_mismatch"
    assert doc["result"] == [] and doc["summary_error"].startswith("JSONDecodeError")

    status, out, _ = cli(capsys, "show", str(s.corrupt["garbage"]), "--json")
    doc = json.loads(out)
    assert status == 1 and doc["manifest"] is None and "is unreadable" in doc["reason"]


def test_show_refuses_paths_that_are_not_one_entry(tmp_path: Path, capsys: Any) -> None:
    s = make_store(tmp_path / "dump")
    cases = {
        str(tmp_path / "nope"): "does not exist",
        str(s.target(1)): "holds 4 entries; name one:",
        str(s.orphans[0]): "the entry was never committed",
        str(s.tmp_file): "temporary file of an unfinished write",
        str(s.target(1) / "r0.part.json"): "is not an entry's manifest or payload file",
        str(s.target(8)): "holds no entry",
    }
    for path, message in cases.items():
        status, out, err = cli(capsys, "show", path)
        assert status == 2 and not out, path
        assert err.startswith("skipweave show: ") and message in err, err


def test_show_of_a_dump_dir_or_a_folder_of_it_says_what_it_holds(tmp_path: Path, capsys: Any) -> None:
    dump = make_store(tmp_path / "dump", damage=False).dump
    first = dump / NS / ROLE / "1" / "gen" / "r0-0000.manifest.json"
    cases = {
        dump: f"{dump} is a dump dir holding role rollout (steps 1-2, 4-7, 16 entries) of namespace default; ",
        dump / NS: f"{dump / NS} is namespace default of dump dir {dump}, holding role rollout (steps 1-2, 4-7, 16 ",
        dump / NS / ROLE: f"is role rollout of namespace default of dump dir {dump}, holding steps 1-2, 4-7, 16 entr",
        dump / NS / ROLE / "1": "is step 1 of role rollout of namespace default of dump dir "
                                f"{dump}, holding targets gen, score (6 entries)",
        tmp_path: f"{tmp_path} is above the dump dir {dump}, holding role rollout (steps 1-2, 4-7, 16 entries)",
    }
    for path, message in cases.items():
        status, out, err = cli(capsys, "show", str(path))
        assert status == 2 and not out, path
        assert err.startswith("skipweave show: ") and message in err, err
        assert f"show one entry with `skipweave show {first}`, or list them with `skipweave ls {dump}`" in err, err
    assert cli(capsys, "show", str(first))[0] == 0  # the entry it points to


def test_show_starts_without_importing_torch(tmp_path: Path) -> None:
    import subprocess
    import sys

    manifest = _one_entry(tmp_path / "dump")
    code = ("import sys\nfrom skipweave.cli.main import main\nstatus = main(['show', sys.argv[1], '--verify'])\n"
            "assert 'torch' not in sys.modules, 'show imported torch'\nsys.exit(status)")
    proc = subprocess.run([sys.executable, "-c", code, str(manifest)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "batch['logp']" in proc.stdout and "256 B" in proc.stdout


def test_the_dtype_sizes_show_uses_match_torch() -> None:
    from skipweave.cli.show import TORCH_ITEMSIZE

    for name, size in TORCH_ITEMSIZE.items():
        dtype = getattr(torch, name, None)
        if isinstance(dtype, torch.dtype):
            assert dtype.itemsize == size, name


@pytest.mark.parametrize("size", ["Infinity", "NaN", "1e400", '"x"', '{"a": 1}', "-5", "2.5"])
def test_show_of_a_group_claiming_a_size_that_is_no_count_reports_it_corrupt(tmp_path: Path, capsys: Any,
                                                                               size: str) -> None:
    from tests.store.test_group import _group_file, _grouped

    _, folder = _grouped(tmp_path)
    group = _group_file(folder)
    doc = json.loads(group.read_text())
    doc["data"]["bytes"] = "@@"
    for entry in doc["entries"]:
        entry["payload"] = [dict(doc["data"])]
    group.write_text(json.dumps(doc).replace('"@@"', size))
    for path in (group, next(p for p in folder.iterdir() if p.name.endswith(".pack.safetensors"))):
        status, out, err = cli(capsys, "show", "--call", "0", str(path))
        assert status == 1 and "CORRUPT" in out and "Traceback" not in err, (path, err)


ENVIRONMENT = {"packages": {"torch": "2.13.0", "vllm": "0.8.5"}, "host": {"name": "verl", "version": "0.9.1"},
               "source": "xxh3_128:" + "ab" * 16, "config": {"actor_rollout_ref.rollout.temperature": 0.7}}


def test_show_prints_an_entrys_environment_and_says_when_it_has_none_or_an_invalid_one(tmp_path: Path,
                                                                                     capsys: Any) -> None:
    store = StepStore(str(tmp_path), NS, ROLE)
    for call, env in enumerate((ENVIRONMENT, None, {"packages": {"vllm": 8}})):
        store.commit(store.key(3, "gen", "r0", call), store.stage({"ids": torch.arange(4)}, rng_state=None),
                     EntryMeta("m:f", "fp", 0.1, environment=env))
    store.close_all()
    folder = tmp_path / NS / ROLE / "3" / "gen"
    status, out, _ = cli(capsys, "show", str(folder / "r0-0000.manifest.json"))
    assert status == 0
    rows = [line.split() for line in out.split("environment (compared on replay", 1)[1].splitlines()[1:6]]
    assert rows == [["package", "torch", "2.13.0"], ["package", "vllm", "0.8.5"], ["host", "package", "verl", "0.9.1"],
                    ["target", "source", "xxh3_128:" + "ab" * 16], ["config", "actor_rollout_ref.rollout.temperature",
                                                                     "0.7"]]
    status, out, _ = cli(capsys, "show", str(folder / "r0-0000.manifest.json"), "--json")
    doc = json.loads(out)
    assert doc["manifest"]["environment"] == ENVIRONMENT
    assert doc["environment"] == {"error": None, "fields": {
        "package torch": "2.13.0", "package vllm": "0.8.5", "host package": "verl 0.9.1",
        "target source": "xxh3_128:" + "ab" * 16, "config actor_rollout_ref.rollout.temperature": 0.7}}
    status, out, _ = cli(capsys, "show", str(folder / "r0-0001.manifest.json"))
    assert status == 0 and "environment none recorded" in out
    status, out, _ = cli(capsys, "show", str(folder / "r0-0002.manifest.json"), "--json")
    assert status == 0 and json.loads(out)["environment"] == {
        "fields": None, "error": "environment.packages['vllm'] is not a string of 1 to 256 characters"}
    status, out, _ = cli(capsys, "show", str(folder / "r0-0002.manifest.json"))
    assert "environment INVALID: environment.packages['vllm'] is not a string" in out
