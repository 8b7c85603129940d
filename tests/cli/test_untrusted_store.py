"""``ls``/``verify``/``gc``/``import-verl`` on crafted dump dirs: the run's judgement, nothing outside the root."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.cli.test_ls import cli, make_store
from tests.store.crafting import manifests, outside_files, rewrite


def _verify(capsys: Any, dump: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    status, out, _ = cli(capsys, "verify", str(dump), "--json", *extra)
    return status, json.loads(out)


def test_manifest_claiming_another_place_fails_verify_as_a_run_refuses_it(tmp_path: Path, capsys: Any) -> None:
    s = make_store(tmp_path / "dump", damage=False)
    rewrite(s.manifest(2, 0), fields={"step": 1})
    rewrite(s.manifest(4, 1), fields={"call_index": 0})
    status, doc = _verify(capsys, s.dump)
    assert status == 1 and doc["ok"] is False
    reasons = {p["path"]: p["reason"] for p in doc["problems"] if p["status"] == "corrupt"}
    assert "belongs to another entry: step=1, expected 2" in reasons[str(s.manifest(2, 0))]
    assert "call_index=0, expected 1" in reasons[str(s.manifest(4, 1))]


def test_pickled_claim_is_refused_kept_by_gc_and_accepted_with_allow_pickle(tmp_path: Path, capsys: Any) -> None:
    s = make_store(tmp_path / "dump", damage=False)
    rewrite(s.manifest(2, 0), fields={"pickled": True})
    status, doc = _verify(capsys, s.dump)
    assert status == 1 and [p["status"] for p in doc["problems"]] == ["refused"]
    assert "allow_pickle" in doc["problems"][0]["reason"]
    status, out, _ = cli(capsys, "verify", str(s.dump))
    assert status == 1 and "REFUSED" in out and "--allow-pickle" in out
    status, out, _ = cli(capsys, "gc", str(s.dump), "--yes", "--min-age", "0")
    assert status == 0 and s.manifest(2, 0).exists()  # a policy question, not garbage: never deleted
    status, doc = _verify(capsys, s.dump, "--allow-pickle")
    assert status == 0 and doc["ok"] is True


def test_payload_replaced_by_a_folder_is_corrupt_and_gc_removes_it(tmp_path: Path, capsys: Any) -> None:
    s = make_store(tmp_path / "dump", damage=False)
    payload = s.payload_file(2, 1, ".safetensors")
    payload.unlink()
    payload.mkdir()
    (payload / "inner").write_text("x")
    status, doc = _verify(capsys, s.dump)
    assert status == 1 and "is not a file skipweave wrote" in doc["problems"][0]["reason"]
    status, out, err = cli(capsys, "gc", str(s.dump), "--yes", "--min-age", "0")
    assert status == 0, out + err
    assert not payload.exists()
    status, doc = _verify(capsys, s.dump)
    assert status == 0 and doc["problems"] == [], doc["problems"]


def test_one_gc_leaves_a_store_verify_passes(tmp_path: Path, capsys: Any) -> None:
    s = make_store(tmp_path / "dump")
    status, out, err = cli(capsys, "gc", str(s.dump), "--yes", "--min-age", "0")
    assert status == 0, out + err
    status, doc = _verify(capsys, s.dump)
    assert status == 0 and doc["problems"] == [] and doc["leftovers"] == [], doc


def test_only_corrupt_call_of_a_part_removed_leaves_no_empty_part(tmp_path: Path, capsys: Any) -> None:
    s = make_store(tmp_path / "dump", damage=False)
    for call in (0, 1):
        s.manifest(5, call).write_text("{ garbage")
    status, _, _ = cli(capsys, "gc", str(s.dump), "--yes", "--min-age", "0")
    assert status == 0
    assert not s.target(5).exists()  # its part file and the emptied folder went with the entries
    status, doc = _verify(capsys, s.dump)
    assert status == 0 and doc["problems"] == []


def test_gc_never_follows_a_symlinked_set_aside_or_step(tmp_path: Path, capsys: Any) -> None:
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "precious.txt").write_text("keep")
    (outside / "sub" / "r0-0000.manifest.json").write_text("{")
    s = make_store(tmp_path / "dump", damage=False)
    role = s.dump / "default" / "rollout"
    (role / "_set_aside").symlink_to(outside, target_is_directory=True)
    (role / "9").symlink_to(outside, target_is_directory=True)
    (role / "3").mkdir()
    (role / "3" / "gen").symlink_to(outside / "sub", target_is_directory=True)
    before = outside_files(outside)
    status, out, err = cli(capsys, "gc", str(s.dump), "--yes", "--min-age", "0")
    assert status == 0, out + err
    assert outside_files(outside) == before
    status, out, _ = cli(capsys, "ls", str(s.dump), "--json")
    ignored = {Path(i["path"]).name: i["why"] for i in json.loads(out)["ignored"]}
    assert ignored == {"_set_aside": "a symlink (never followed)", "9": "a symlink (never followed)",
                       "gen": "a symlink (never followed)"}


def test_stray_names_are_ignored_by_every_command(tmp_path: Path, capsys: Any) -> None:
    s = make_store(tmp_path / "dump", damage=False)
    role = s.dump / "default" / "rollout"
    (role / "4x").write_text("")
    (role / "12").write_text("a file where a step folder belongs")
    (role / "²").mkdir()
    (role / "007").mkdir()
    (s.dump / "default" / "rol e").mkdir()
    for command in ("ls", "verify", "gc"):
        status, out, err = cli(capsys, command, str(s.dump))
        assert status == 0 and "Traceback" not in err, (command, out, err)
        assert "ignored (never followed, read or removed): 5 name(s)" in out, (command, out)
    status, out, _ = cli(capsys, "gc", str(s.dump), "--yes", "--min-age", "0")
    assert (role / "12").exists() and (role / "²").exists()  # not ours: never removed


@pytest.mark.parametrize("option", ["--target", "--role", "--namespace"])
@pytest.mark.parametrize("value", ["../x", "/abs/x", "a/b", ".."])
def test_import_verl_names_stay_inside_the_store(tmp_path: Path, capsys: Any, option: str, value: str) -> None:
    verl = tmp_path / "verl" / "exp_proj" / "GBS8_N2_in16_out32" / "1"
    verl.mkdir(parents=True)
    (verl / "gen_batch.dp").write_bytes(b"not loaded")
    store = tmp_path / "store" / "inner"
    status, out, err = cli(capsys, "import-verl", str(tmp_path / "verl"), str(store), "--trust-pickle",
                           option, value)
    assert status == 2 and option in err and value in err
    assert manifests(tmp_path) == [] and not (tmp_path / "store" / "x").exists()


def test_names_skipweave_never_writes_inside_a_target_folder_are_ignored(tmp_path: Path, capsys: Any) -> None:
    s = make_store(tmp_path / "dump", damage=False)
    folder = s.target(2)
    for name in ("-x-0000.manifest.json", "a b.part.json", "s" * 201 + ".part.json", "r0-0000.manifest.json\n"):
        (folder / name).write_text("{}")
    for command in ("ls", "verify", "gc"):
        status, out, err = cli(capsys, command, str(s.dump))
        assert status == 0 and "Traceback" not in err, (command, out, err)
    status, doc = _verify(capsys, s.dump)
    assert status == 0 and len(doc["ignored"]) == 3  # the newline name is neither a manifest nor a part file


def test_a_symlink_inside_set_aside_is_never_walked(tmp_path: Path, capsys: Any) -> None:
    s = make_store(tmp_path / "dump", damage=False)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big.bin").write_bytes(b"x" * 100_000)
    aside = s.dump / "default" / "rollout" / "_set_aside"
    aside.mkdir()
    (aside / "evil").symlink_to(outside, target_is_directory=True)
    status, out, _ = cli(capsys, "ls", str(s.dump), "--json")
    [left] = json.loads(out)["leftovers"]
    assert left["bytes"] < 1000  # the link itself, not what it points at
    status, _, _ = cli(capsys, "gc", str(s.dump), "--yes", "--min-age", "0")
    assert status == 0 and (outside / "big.bin").exists() and not (aside / "evil").exists()


@pytest.mark.parametrize("kind", ["folder", "dangling symlink"])
def test_anything_planted_at_a_lock_name_does_not_block_healing(tmp_path: Path, capsys: Any, kind: str) -> None:
    s = make_store(tmp_path / "dump", damage=False)
    s.manifest(2, 1).write_text("{ garbage")
    lock = s.target(2) / ".r0.part.lock"
    lock.unlink()  # the writer's own lock file, replaced by something else
    if kind == "folder":
        lock.mkdir()
        (lock / "x").write_text("")
    else:
        lock.symlink_to(tmp_path / "nowhere")
    status, out, err = cli(capsys, "gc", str(s.dump), "--yes", "--min-age", "0")
    assert status == 0, out + err
    status, doc = _verify(capsys, s.dump)
    assert status == 0 and doc["problems"] == [], doc
    assert not (tmp_path / "nowhere").exists()


def test_crafted_times_and_writer_fields_do_not_break_ls_or_show(tmp_path: Path, capsys: Any) -> None:
    s = make_store(tmp_path / "dump", damage=False)
    rewrite(s.manifest(2, 0), fields={"created_unix": 1e300, "writer": [1], "versions": "x"})
    status, out, err = cli(capsys, "ls", str(s.dump))
    assert status == 0 and "Traceback" not in err
    status, out, err = cli(capsys, "show", str(s.manifest(2, 0)))
    assert status == 1 and "CORRUPT" in out and "Traceback" not in err


def test_a_very_deep_folder_at_a_lock_name_does_not_stop_gc(tmp_path: Path, capsys: Any) -> None:
    s = make_store(tmp_path / "dump", damage=False)
    s.manifest(2, 1).write_text("{ garbage")
    lock = s.target(2) / ".r0.part.lock"
    lock.unlink()
    lock.mkdir()
    fd = os.open(lock, os.O_RDONLY)
    for _ in range(1500):  # deeper than shutil.rmtree's recursion allows on Python 3.11 (made through fds)
        os.mkdir("d", dir_fd=fd)
        inner = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.close(fd)
    status, out, err = cli(capsys, "gc", str(s.dump), "--yes", "--min-age", "0")
    assert status == 0 and "Traceback" not in err, out + err
    status, doc = _verify(capsys, s.dump)
    assert status == 0 and doc["problems"] == []
