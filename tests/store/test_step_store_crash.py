"""The store under real failures: SIGKILL mid-write, concurrent writers, corruption, a full disk, interrupted steps."""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import random
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

from skipweave.store.format.manifest import EntryInvalid, read_manifest, verify_payload
from skipweave.store.step_store import StepStore

pytestmark = pytest.mark.slow  # starts processes: left out of the fast tier (README)

FORK = mp.get_context("fork")


def _payload(seed: int, mb: float = 2.0) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    n = int(mb * (1 << 20) / 4)
    return {
        "ids": torch.randint(0, 1000, (n // 2,), generator=g),
        "lp": torch.rand(n // 2, generator=g),
        "seed": seed,
    }


def _writer(dump: str, steps: int) -> None:
    store = StepStore(dump, "ns", "rollout")
    for step in range(1, steps + 1):
        store.prepare_part(step, "gen", "r0")
        store.record(
            store.key(step, "gen", "r0", 0),
            _payload(step),
            target_path="m:f",
            fingerprint="fp",
            rng_state=None,
            seconds=0.1,
        )
    store.close_all()


def _check_all_committed_entries(dump: str) -> int:
    """Every committed manifest must point at a complete, checksum-valid payload that decodes."""
    store = StepStore(dump, "ns", "rollout")
    n = 0
    for manifest in Path(dump).rglob("*.manifest.json"):
        if manifest.name.startswith(".tmp-") or "_set_aside" in manifest.parts:
            continue  # temporary files are never read; set-aside parts are never served
        data = read_manifest(str(manifest))
        verify_payload(str(manifest.parent), data)
        loaded = store.load(store.key(data["step"], data["target"], data["shard"], data["call_index"]))
        assert torch.equal(loaded.result["ids"], _payload(data["step"])["ids"])
        n += 1
    return n


def test_sigkill_at_random_moments_never_leaves_a_servable_partial_entry(tmp_path: Path) -> None:
    rnd = random.Random(1234)
    committed = 0
    for trial in range(50):
        dump = str(tmp_path / f"t{trial}")
        proc = FORK.Process(target=_writer, args=(dump, 4))
        proc.start()
        time.sleep(rnd.uniform(0.0, 0.25))
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        committed += _check_all_committed_entries(dump)
        # A fresh run over the same dump dir never serves partial data and records what is missing.
        _writer(dump, 4)
        assert _check_all_committed_entries(dump) == 4
    assert committed > 0  # some kills landed after a commit, some before


def _same_entry(dump: str, barrier: Any, results: Any, i: int) -> None:
    store = StepStore(dump, "ns", "rollout")
    barrier.wait()
    n = store.record(
        store.key(1, "gen", "r0", 0),
        _payload(i, 1.0),
        target_path="m:f",
        fingerprint="fp",
        rng_state=None,
        seconds=0.1,
    )
    results.put((i, n))


def test_concurrent_writer_processes_end_with_exactly_one_copy(tmp_path: Path) -> None:
    barrier, results = FORK.Barrier(4), FORK.Queue()
    procs = [FORK.Process(target=_same_entry, args=(str(tmp_path), barrier, results, i)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        assert p.exitcode == 0
    outcomes = [results.get() for _ in procs]
    assert sum(1 for _, n in outcomes if n > 0) == 1
    folder = tmp_path / "ns" / "rollout" / "1" / "gen"
    assert len(list(folder.glob("*.manifest.json"))) == 1
    assert len(list(folder.glob("*.safetensors"))) == 1 and not list(folder.glob(".tmp-*"))
    winner = next(i for i, n in outcomes if n > 0)
    store = StepStore(str(tmp_path), "ns", "rollout")
    assert store.load(store.key(1, "gen", "r0", 0)).result["seed"] == winner


def test_concurrent_writer_threads_and_readers(tmp_path: Path) -> None:
    store = StepStore(str(tmp_path), "ns", "rollout")
    key = store.key(1, "gen", "r0", 0)
    written: list[int] = []
    read: list[int] = []

    def write(i: int) -> None:
        written.append(
            store.record(
                key, _payload(i, 1.0), target_path="m:f", fingerprint="fp", rng_state=None, seconds=0.0
            )
        )

    def reader() -> None:
        for _ in range(50):
            try:
                read.append(store.load(key).result["seed"])
            except FileNotFoundError:
                time.sleep(0.001)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    threads += [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(1 for n in written if n) == 1
    assert len(set(read)) <= 1  # every reader got the one complete entry


def test_corrupt_payload_is_never_served_and_is_regenerated(tmp_path: Path, host_module: Any) -> None:
    import skipweave
    from tests.conftest import HOST_SOURCE

    name, _ = host_module(HOST_SOURCE)
    mod = sys.modules[name]
    cfg = {
        "skip": {
            "rollout": {"enable": True, "dump_dir": str(tmp_path), "targets": {"g": f"{name}.Gen.generate"}}
        }
    }
    skipweave.weave(cfg)
    live = mod.Gen().generate(mod.Batch(step=1))
    skipweave.flush()  # committed; then damaged on disk
    tensors = next(tmp_path.rglob("*.safetensors"))
    data = bytearray(tensors.read_bytes())
    data[-3] ^= 0xFF
    tensors.write_bytes(bytes(data))
    store = StepStore(str(tmp_path), "default", "rollout")
    with pytest.raises(EntryInvalid, match="checksum"):
        store.load(store.key(1, "g", "r0", 0))
    skipweave.unweave()
    skipweave.weave(cfg)
    again = mod.Gen().generate(mod.Batch(step=1))
    skipweave.flush()
    assert again.meta_info["skipweave"]["status"] == "miss" and len(mod.CALLS) == 2
    assert not torch.equal(again.batch["y"], live.batch["y"])
    assert store.load(store.key(1, "g", "r0", 0)).result.batch["y"].equal(again.batch["y"])
    assert list((tmp_path / "default" / "rollout" / "_set_aside").iterdir())


@pytest.fixture
def small_disk(tmp_path: Path) -> Any:
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mnt)], check=True)
    yield mnt
    subprocess.run(["umount", str(mnt)], check=False)


def test_full_disk_returns_live_result_and_keeps_the_previous_entry(
    small_disk: Path, host_module: Any, caplog: Any
) -> None:
    import skipweave

    name, _ = host_module("""
import torch
CALLS = []
def gen(step, mb):
    CALLS.append(step)
    return torch.ones(int(mb * 262144)) * step
""")
    mod = sys.modules[name]
    role = {
        "enable": True,
        "dump_dir": str(small_disk),
        "targets": {"g": f"{name}.gen"},
        "step": {"source": "arg", "arg": 0, "path": ""},
    }
    skipweave.weave({"skip": {"r": role}})
    mod.gen(1, 0.1)  # fits
    with caplog.at_level(logging.WARNING):
        big = mod.gen(2, 1.0)  # 1 MiB does not fit in 512 KiB
        skipweave.flush()  # (written in the background: the failure is logged there)
    assert big.numel() == 262144 and "recording" in caplog.text and "failed" in caplog.text
    assert not list(small_disk.rglob(".tmp-*"))
    assert not (small_disk / "default" / "r" / "2" / "g" / "r0-0000.manifest.json").exists()
    # A failed re-record (regenerate over the step-1 entry) leaves that entry intact.
    skipweave.unweave()
    skipweave.weave({"skip": {"r": {**role, "fingerprint": {"on_mismatch": "regenerate"}}}})
    with caplog.at_level(logging.WARNING):
        out = mod.gen(1, 1.0)
        skipweave.flush()
    assert out.numel() == 262144
    store = StepStore(str(small_disk), "default", "r")
    assert store.load(store.key(1, "g", "r0", 0)).result.numel() == 26214


def test_interrupted_step_is_set_aside_and_recorded_afresh(tmp_path: Path, caplog: Any) -> None:
    store = StepStore(str(tmp_path), "ns", "rollout", calls_per_step=2)
    store.record(
        store.key(1, "gen", "r0", 0),
        _payload(1, 0.1),
        target_path="m:f",
        fingerprint="fp",
        rng_state=None,
        seconds=0.0,
    )
    # the process "dies" here: call 1 of step 1 never came, the part was never closed
    fresh = StepStore(str(tmp_path), "ns", "rollout", calls_per_step=2)
    assert not fresh.is_complete(1, "gen", "r0")
    assert fresh.recorded_steps("gen", "r0") == []
    with caplog.at_level(logging.WARNING):
        fresh.prepare_part(1, "gen", "r0")
    assert "interrupted" in caplog.text
    assert not list((tmp_path / "ns" / "rollout" / "1" / "gen").glob("*.manifest.json"))
    aside = list((tmp_path / "ns" / "rollout" / "_set_aside").iterdir())
    assert len(aside) == 1 and list(aside[0].glob("*.manifest.json"))


def test_learned_calls_per_step_from_closed_steps(tmp_path: Path) -> None:
    store = StepStore(str(tmp_path), "ns", "rollout")
    for call in (0, 1):
        store.record(
            store.key(1, "gen", "r0", call),
            {"c": call},
            target_path="m:f",
            fingerprint="",
            rng_state=None,
            seconds=0.0,
        )
    store.prepare_part(2, "gen", "r0")  # moving to step 2 closes step 1
    store.record(
        store.key(2, "gen", "r0", 0), {"c": 0}, target_path="m:f", fingerprint="", rng_state=None, seconds=0.0
    )
    fresh = StepStore(str(tmp_path), "ns", "rollout")
    assert json.loads((tmp_path / "ns/rollout/1/gen/r0.part.json").read_text())["state"] == "closed"
    assert fresh.expected_calls("gen", "r0") == 2
    assert fresh.recorded_steps("gen", "r0") == [1]  # step 2 holds 1 of 2 calls: incomplete


def _shard_run(dump: str, host_dir: str, name: str, rank: str, scale: int) -> list[float]:
    code = f'''
import sys, json, torch
sys.path.insert(0, {host_dir!r})
import skipweave, {name} as m
skipweave.weave({{"skip": {{"rollout": {{"enable": True, "dump_dir": {dump!r}, "targets": {{"f": "{name}.free"}},
                 "fingerprint": {{"on_mismatch": "error"}}}}}}}})
skipweave.set_step(1)
print(json.dumps([float(v) for v in m.free({scale})] + [len(m.CALLS)]))
'''
    env = {**os.environ, "RANK": rank}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_processes_with_different_shards_each_get_their_own_back(tmp_path: Path, host_module: Any) -> None:
    from tests.conftest import HOST_SOURCE

    name, folder = host_module(HOST_SOURCE, import_now=False)
    dump = str(tmp_path / "dump")

    def both_ranks() -> dict[str, list[float]]:  # the two ranks' processes run side by side, as in a job
        with ThreadPoolExecutor(max_workers=2) as pool:
            futures = {r: pool.submit(_shard_run, dump, str(folder), name, r, 10 * (int(r) + 1)) for r in ("0", "1")}
            return {r: f.result() for r, f in futures.items()}

    first = both_ranks()
    again = both_ranks()
    for r in ("0", "1"):
        assert first[r][-1] == 1 and again[r][-1] == 0  # replayed: the real function did not run
        assert first[r][:-1] == again[r][:-1]
    assert first["0"][:-1] != first["1"][:-1]


def test_an_entry_copied_or_swapped_into_another_key_is_never_served(tmp_path: Path) -> None:
    import shutil

    store = StepStore(str(tmp_path), "ns", "rollout")
    for step in (1, 2):
        store.record(store.key(step, "gen", "r0", 0), {"step": step}, target_path="m:f", fingerprint="",
                     rng_state=None, seconds=0.0)
    root = tmp_path / "ns" / "rollout"
    shutil.rmtree(root / "2")
    shutil.copytree(root / "1", root / "2")
    with pytest.raises(EntryInvalid, match="belongs to another entry: step=1"):
        store.load(store.key(2, "gen", "r0", 0))
    manifest = root / "1" / "gen" / "r0-0000.manifest.json"
    data = json.loads(manifest.read_text())
    data["payload"][0]["bytes"] = "12x"
    manifest.write_text(json.dumps(data))
    with pytest.raises(EntryInvalid, match="malformed payload"):
        store.load(store.key(1, "gen", "r0", 0))
