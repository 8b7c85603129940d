"""A dump dir is untrusted input: crafted or damaged entries never run code, never reach outside the store,
and never raise into the host -- the call runs live and re-records (real weaves, real files)."""

from __future__ import annotations

import json
import logging
import os
import random
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import skipweave
from skipweave.config.errors import ConfigError
from tests.store.crafting import manifests, outside_files, result_node, rewrite

HOST = '''
import dataclasses
import torch

CALLS = []


@dataclasses.dataclass
class Out:
    tokens: torch.Tensor
    text: str


def gen(n):
    CALLS.append(n)
    return {"tokens": torch.arange(4) + n, "noise": torch.rand(3)}


def gen_dc(n):
    CALLS.append(n)
    return Out(torch.arange(3) + n, f"answer {n}")
'''


def _cfg(dump: Path, target: str, **kw: Any) -> dict[str, Any]:
    role = {"enable": True, "dump_dir": str(dump), "targets": {"gen": target}, "step": {"source": "set_step"}}
    role.update(kw)
    return {"skip": {"rollout": role}}


def _run(cfg: dict[str, Any], mod: Any, fn: str, steps: list[int]) -> list[Any]:
    skipweave.unweave()
    skipweave.weave(cfg)
    out = []
    for s in steps:
        skipweave.set_step(s)
        out.append(getattr(mod, fn)(s))  # looked up after the weave: the patched function
    skipweave.unweave()
    return out


@pytest.fixture
def host(host_module: Any) -> Any:
    name, _ = host_module(HOST)
    return sys.modules[name]


def _recorded(dump: Path, host: Any, steps: list[int], fn: str = "gen") -> list[Any]:
    out = _run(_cfg(dump, f"{host.__name__}.{fn}"), host, fn, steps)
    assert len(manifests(dump)) == len(steps)
    host.CALLS.clear()
    return out


def _same(a: Any, b: Any) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ------------------------------------------------------------------------------------------- decoding names no code
def test_planted_module_named_by_a_crafted_entry_is_never_imported(host: Any, tmp_path: Path,
                                                                   monkeypatch: Any, caplog: Any) -> None:
    """The docs' layout: a relative dump dir beside the script; a module planted in it must not run."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path / "rollouts"))  # as if the script's folder were on sys.path
    dump = tmp_path / "rollouts"
    _recorded(dump, host, [1])
    marker = tmp_path / "planted-ran"
    (dump / "evil_planted.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\nclass Boom: pass\n")
    rewrite(manifests(dump)[0], tree=lambda t: t["root"]["v"].__setitem__(
        "result", {"t": "dataclass", "cls": "evil_planted:Boom", "v": {}}))
    caplog.set_level(logging.WARNING, logger="skipweave")
    [live] = _run(_cfg("rollouts", f"{host.__name__}.gen"), host, "gen", [1])  # type: ignore[arg-type]
    assert not marker.exists() and "evil_planted" not in sys.modules
    assert host.CALLS == [1] and torch.equal(live["tokens"], torch.arange(4) + 1)  # the live result
    assert "not served" in caplog.text and "evil_planted:Boom" in caplog.text
    host.CALLS.clear()
    [again] = _run(_cfg("rollouts", f"{host.__name__}.gen"), host, "gen", [1])  # type: ignore[arg-type]
    assert host.CALLS == [] and _same(again, live)  # re-recorded: the store healed


def test_finalizer_gadget_class_is_never_built(host: Any, tmp_path: Path) -> None:
    """A stdlib class whose finalizer deletes the file an attribute names must not be constructed."""
    import gc

    victim = tmp_path / "outside" / "precious.txt"
    victim.parent.mkdir()
    victim.write_text("keep me")
    dump = tmp_path / "dump"
    _recorded(dump, host, [1])
    gadget = {"t": "dataproto", "cls": "tempfile:_TemporaryFileCloser",
              "batch": {"t": "none"}, "non_tensor_batch": {"t": "none"}, "meta_info": {"t": "none"},
              "extra": {"name": {"t": "str", "v": str(victim)}, "delete": {"t": "bool", "v": True},
                        "close_called": {"t": "bool", "v": False}, "file": {"t": "none"}}}
    rewrite(manifests(dump)[0], tree=lambda t: t["root"]["v"].__setitem__("result", gadget))
    [out] = _run(_cfg(dump, f"{host.__name__}.gen"), host, "gen", [1])
    del out
    gc.collect()
    assert victim.read_text() == "keep me"
    assert host.CALLS == [1]


def test_renamed_or_changed_dataclass_is_a_miss_not_an_error(host: Any, tmp_path: Path, caplog: Any) -> None:
    dump = tmp_path / "dump"
    [rec] = _recorded(dump, host, [1], fn="gen_dc")

    def rename_field(tree: dict[str, Any]) -> None:
        node = result_node(tree)
        node["v"]["tokens_v0"] = node["v"].pop("tokens")

    rewrite(manifests(dump)[0], tree=rename_field)
    caplog.set_level(logging.WARNING, logger="skipweave")
    [live] = _run(_cfg(dump, f"{host.__name__}.gen_dc"), host, "gen_dc", [1])
    assert host.CALLS == [1] and live.text == "answer 1" and "not served" in caplog.text
    rewrite(manifests(dump)[0], tree=lambda t: result_node(t).__setitem__("cls", f"{host.__name__}:Gone"))
    host.CALLS.clear()
    [live] = _run(_cfg(dump, f"{host.__name__}.gen_dc"), host, "gen_dc", [1])
    assert host.CALLS == [1] and live.text == rec.text


# ------------------------------------------------------------------------------------------- unusable entries
def test_pickled_claim_without_opt_in_is_set_aside_and_the_store_heals(host: Any, tmp_path: Path,
                                                                      caplog: Any) -> None:
    dump = tmp_path / "dump"
    _recorded(dump, host, [1, 2])
    rewrite(manifests(dump)[0], fields={"pickled": True})
    caplog.set_level(logging.WARNING, logger="skipweave")
    _run(_cfg(dump, f"{host.__name__}.gen"), host, "gen", [1, 2])
    assert host.CALLS == [1]  # step 1 regenerated, step 2 replayed
    assert "allow_pickle" in caplog.text and "_set_aside" in caplog.text
    host.CALLS.clear()
    _run(_cfg(dump, f"{host.__name__}.gen"), host, "gen", [1, 2])
    assert host.CALLS == []  # healed: not refused on every run


def test_malformed_rng_state_is_a_miss_and_leaves_the_rng_alone(host: Any, tmp_path: Path) -> None:
    """The python section restores, the numpy one is broken: nothing of the recorded state may stay behind."""
    dump = tmp_path / "dump"
    _recorded(dump, host, [1])
    # (gen draws from python and torch: those two are recorded; a numpy section without its key is added)
    rewrite(manifests(dump)[0], tree=lambda t: t["root"]["v"]["rng"]["v"].update(
        numpy={"t": "dict", "v": {"bit_generator": {"t": "str", "v": "MT19937"}}}))
    random.seed(7)
    torch.manual_seed(7)
    host.gen(1)  # not woven: the reference
    expect = (random.random(), torch.rand(1))
    random.seed(7)
    torch.manual_seed(7)
    host.CALLS.clear()
    skipweave.weave(_cfg(dump, f"{host.__name__}.gen"))
    skipweave.set_step(1)
    host.gen(1)  # the entry is unusable: runs live, as if skipweave were not there
    got = (random.random(), torch.rand(1))
    skipweave.unweave()
    assert host.CALLS == [1]
    assert got[0] == expect[0] and torch.equal(got[1], expect[1])


def test_manifest_moved_to_another_place_is_never_served(host: Any, tmp_path: Path, caplog: Any) -> None:
    dump = tmp_path / "dump"
    [one, two] = _recorded(dump, host, [1, 2])
    m1, m2 = manifests(dump)
    # swap step 2's entry for step 1's, self-consistently: same bytes, manifest claims step 1
    for f in m2.parent.iterdir():
        f.unlink()
    for f in m1.parent.iterdir():
        (m2.parent / f.name).write_bytes(f.read_bytes())
    caplog.set_level(logging.WARNING, logger="skipweave")
    [a, b] = _run(_cfg(dump, f"{host.__name__}.gen"), host, "gen", [1, 2])
    assert host.CALLS == [2] and _same(a, one) and torch.equal(b["tokens"], two["tokens"])
    assert "belongs to another entry: step=1, expected 2" in caplog.text


# ------------------------------------------------------------------------------------------- never leaves the root
def test_symlinked_folders_are_never_followed_at_any_level(host: Any, tmp_path: Path, caplog: Any) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("x")
    dump = tmp_path / "dump"
    _recorded(dump, host, [1])
    role = dump / "default" / "rollout"
    (role / "2").symlink_to(outside, target_is_directory=True)  # a step folder
    (role / "1" / "gen").rename(role / "1" / "gen.real")
    (role / "1" / "gen").symlink_to(role / "1" / "gen.real", target_is_directory=True)  # a target folder
    before = outside_files(outside)
    caplog.set_level(logging.WARNING, logger="skipweave")
    _run(_cfg(dump, f"{host.__name__}.gen"), host, "gen", [1, 2, 3])
    assert host.CALLS == [1, 2, 3]  # nothing served through a symlink
    assert outside_files(outside) == before  # nothing written through one
    assert "is a symlink; skipweave never follows symlinks" in caplog.text
    assert (role / "3" / "gen").is_dir()  # a real folder still records


def test_symlinked_namespace_or_role_folder_is_refused(host: Any, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    dump = tmp_path / "dump"
    dump.mkdir()
    (dump / "default").symlink_to(outside, target_is_directory=True)
    _run(_cfg(dump, f"{host.__name__}.gen"), host, "gen", [1])
    assert host.CALLS == [1] and outside_files(outside) == {} and list(outside.iterdir()) == []


def test_symlinked_set_aside_receives_nothing(host: Any, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    dump = tmp_path / "dump"
    _recorded(dump, host, [1])
    role = dump / "default" / "rollout"
    (role / "_set_aside").symlink_to(outside, target_is_directory=True)
    rewrite(manifests(dump)[0], fields={"pickled": True})  # unusable: would be set aside
    _run(_cfg(dump, f"{host.__name__}.gen"), host, "gen", [1])
    assert host.CALLS == [1] and list(outside.iterdir()) == []


def test_symlinked_payload_and_lock_files_are_never_followed(host: Any, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    dump = tmp_path / "dump"
    _recorded(dump, host, [1])
    m = manifests(dump)[0]
    doc = json.loads(m.read_text())
    tensors = m.parent / next(i["name"] for i in doc["payload"] if i["name"].endswith(".safetensors"))
    moved = outside / "tensors.bin"
    tensors.rename(moved)
    tensors.symlink_to(moved)  # same bytes, same checksum: still refused
    victim = outside / "victim.txt"
    victim.write_text("do not truncate")
    (m.parent.parent.parent / "2" / "gen").mkdir(parents=True)
    (m.parent.parent.parent / "2" / "gen" / ".r0.part.lock").symlink_to(victim)
    _run(_cfg(dump, f"{host.__name__}.gen"), host, "gen", [1, 2])
    assert host.CALLS == [1, 2]
    assert victim.read_text() == "do not truncate" and moved.exists()


@pytest.mark.parametrize("name", ["../../../x", "/abs/x", "a/b", "..", "", ".hidden", "²"])
def test_target_names_that_are_not_one_folder_are_config_errors(host: Any, tmp_path: Path, name: str) -> None:
    cfg = {"skip": {"rollout": {"enable": True, "dump_dir": str(tmp_path / "d"),
                                "targets": {name: f"{host.__name__}.gen"}}}}
    with pytest.raises(ConfigError, match=r"skip\.rollout\.targets"):
        skipweave.weave(cfg)
    assert not (tmp_path / "x").exists() and not Path("/abs/x").exists()


@pytest.mark.parametrize("key,value", [("namespace", "../x"), ("namespace", "a/b"), ("namespace", "x y")])
def test_namespace_that_is_not_one_folder_is_a_config_error(host: Any, tmp_path: Path, key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=rf"skip\.rollout\.{key}"):
        skipweave.weave(_cfg(tmp_path / "d", f"{host.__name__}.gen", **{key: value}))


@pytest.mark.parametrize("rank", ["../x", "²", "1/2", "-1"])
def test_rank_that_is_not_digits_is_refused_at_weave(host: Any, tmp_path: Path, monkeypatch: Any,
                                                     rank: str) -> None:
    monkeypatch.setenv("RANK", rank)
    with pytest.raises(ConfigError, match="RANK"):
        skipweave.weave(_cfg(tmp_path / "d", f"{host.__name__}.gen"))
    assert not (tmp_path / "x").exists()


def test_rank_changed_after_weave_runs_live_without_recording(host: Any, tmp_path: Path, monkeypatch: Any,
                                                              caplog: Any) -> None:
    skipweave.weave(_cfg(tmp_path / "d", f"{host.__name__}.gen"))
    monkeypatch.setenv("RANK", "../../x")
    skipweave.set_step(1)
    caplog.set_level(logging.WARNING, logger="skipweave")
    assert torch.equal(host.gen(1)["tokens"], torch.arange(4) + 1)
    assert "RANK" in caplog.text and not (tmp_path / "x").exists() and manifests(tmp_path / "d") == []


# ------------------------------------------------------------------------------------------- messages
def test_commit_then_failed_bookkeeping_is_reported_as_a_commit(host: Any, tmp_path: Path, caplog: Any) -> None:
    dump = tmp_path / "dump"
    folder = dump / "default" / "rollout" / "1" / "gen"
    folder.mkdir(parents=True)
    (folder / "r0.part.json").mkdir()  # the part state cannot be written: after the commit
    (folder / "r0.part.json" / "x").write_text("")
    caplog.set_level(logging.WARNING, logger="skipweave")
    failures = skipweave.counters()["record_failures"]
    _run(_cfg(dump, f"{host.__name__}.gen"), host, "gen", [1])
    assert "recorded" in caplog.text and "committed and servable" in caplog.text
    assert "nothing partial was left" not in caplog.text
    assert skipweave.counters()["record_failures"] == failures
    assert len(manifests(dump)) == 1


def test_dump_dir_removed_between_steps_is_reported(host: Any, tmp_path: Path, caplog: Any) -> None:
    import shutil

    dump = tmp_path / "dump"
    skipweave.weave(_cfg(dump, f"{host.__name__}.gen"))
    skipweave.set_step(1)
    host.gen(1)
    skipweave.flush()  # step 1 committed; then the folder goes
    shutil.rmtree(dump)
    caplog.set_level(logging.WARNING, logger="skipweave")
    skipweave.set_step(2)
    host.gen(2)
    skipweave.flush()  # step 2's record (in the background writer) finds the folder gone
    assert f"the dump dir {dump} was removed" in caplog.text


@pytest.mark.parametrize("write_buffer", [0, 1 << 20])
def test_folder_moved_mid_write_leaves_no_temporary_file(host_module: Any, tmp_path: Path, caplog: Any,
                                                         monkeypatch: pytest.MonkeyPatch, write_buffer: int) -> None:
    """The dump dir is renamed while the entry's payload is written (in the caller's thread, or the background
    writer's), as another process might: nothing committed, nothing left."""
    from skipweave.store.format import tensorfile

    name, _ = host_module("def gen(n):\n    return {'n': n}\n")
    m = sys.modules[name]
    dump = tmp_path / "dump"
    (dump / "default" / "rollout" / "1" / "gen").mkdir(parents=True)
    real = tensorfile.write

    def moving(*args: Any, **kwargs: Any) -> Any:
        if dump.exists():
            os.rename(dump, tmp_path / "moved")
        return real(*args, **kwargs)

    monkeypatch.setattr(tensorfile, "write", moving)
    caplog.set_level(logging.WARNING, logger="skipweave")
    _run({"skip": {"rollout": {**_cfg(dump, f"{name}.gen")["skip"]["rollout"], "write_buffer": write_buffer}}},
         m, "gen", [1])
    moved = tmp_path / "moved" / "default" / "rollout" / "1" / "gen"
    assert moved.is_dir()
    leftovers = [p.name for p in moved.iterdir() if not p.name.startswith(".") or p.name.startswith(".tmp-")]
    assert leftovers == [], leftovers
    assert "was moved or removed while" in caplog.text and str(dump) in caplog.text
    assert not os.path.exists(dump / "default" / "rollout" / "1" / "gen" / "r0-0000.manifest.json")


# ------------------------------------------------------------------------------------------- second adversarial pass
@pytest.mark.parametrize("where", ["manifest", "part", "tree"])
def test_a_fifo_where_a_file_belongs_never_blocks_a_run(host: Any, tmp_path: Path, where: str) -> None:
    dump = tmp_path / "dump"
    [rec] = _recorded(dump, host, [1])
    m = manifests(dump)[0]
    doc = json.loads(m.read_text())
    path = {"manifest": m, "part": m.parent / "r0.part.json",
            "tree": m.parent / next(i["name"] for i in doc["payload"] if i["name"].endswith(".tree.json"))}[where]
    path.unlink()
    os.mkfifo(path)
    [out] = _run(_cfg(dump, f"{host.__name__}.gen"), host, "gen", [1])  # would block forever on open()
    assert torch.equal(out["tokens"], rec["tokens"])


@pytest.mark.parametrize("value", ["fast", [1], {"s": 1}, True, float("inf")])
def test_optional_manifest_fields_of_the_wrong_type_are_a_miss(host: Any, tmp_path: Path, value: Any) -> None:
    dump = tmp_path / "dump"
    _recorded(dump, host, [1])
    m = manifests(dump)[0]
    m.write_text(json.dumps({**json.loads(m.read_text()), "generation_seconds": value}))
    [out] = _run(_cfg(dump, f"{host.__name__}.gen"), host, "gen", [1])
    assert host.CALLS == [1] and torch.equal(out["tokens"], torch.arange(4) + 1)


def test_a_dataclass_with_a_property_at_a_field_is_never_built(host_module: Any, tmp_path: Path) -> None:
    name, _ = host_module('''
import dataclasses
SET = []


@dataclasses.dataclass
class Job:
    path: str = ""


def _set(self, value):
    SET.append(value)


Job.path = property(lambda self: "", _set)  # a setter at a field's name


def gen(n):
    return {"n": n}
''')
    m = sys.modules[name]
    dump = tmp_path / "dump"
    _run(_cfg(dump, f"{name}.gen"), m, "gen", [1])
    rewrite(manifests(dump)[0], tree=lambda t: t["root"]["v"].__setitem__(
        "result", {"t": "dataclass", "cls": f"{name}:Job", "v": {"path": {"t": "str", "v": "/etc"}}}))
    [out] = _run(_cfg(dump, f"{name}.gen"), m, "gen", [1])
    assert out == {"n": 1} and m.SET == []
