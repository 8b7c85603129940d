"""skipweave.store.format.mapped: large plain tensor files are read on a private mapping, verified first, never
aliasing the file, and a file truncated or changed under the reader is refused (never SIGBUS during the read)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from skipweave.store.format import mapped, tensorfile
from skipweave.store.format.manifest import EntryInvalid, file_checksum
from skipweave.store.step_store import StepStore

ROOT = Path(__file__).resolve().parents[2]


def _tensors() -> dict[str, torch.Tensor]:
    """One tensor of every dtype the tensor file stores, 0-d and empty ones included."""
    g = torch.Generator().manual_seed(1)
    out = {
        "i64": torch.randint(-(1 << 40), 1 << 40, (3, 7), generator=g),
        "f64": torch.tensor(2.5, dtype=torch.float64),  # 0-d
        "c64": torch.randn(3, dtype=torch.complex64, generator=g),
        "f32": torch.rand(5, generator=g),
        "i32": torch.arange(6, dtype=torch.int32).reshape(2, 3),
        "bf16": torch.rand(2, 3, generator=g).to(torch.bfloat16),
        "f16": torch.rand(4, generator=g).half(),
        "i16": torch.tensor([1, -2], dtype=torch.int16),
        "i8": torch.tensor([3, -4], dtype=torch.int8),
        "u8": torch.arange(9, dtype=torch.uint8),
        "bool": torch.tensor([[True, False, True], [False, False, True]]),
        "empty": torch.zeros(0, 4),
        "empty_bool": torch.zeros(2, 0, dtype=torch.bool),
    }
    for name in ("uint16", "uint32", "uint64"):
        dt = getattr(torch, name, None)
        if isinstance(dt, torch.dtype):
            out[name] = torch.arange(4).to(dt)
    for name in ("float8_e4m3fn", "float8_e5m2"):
        dt = getattr(torch, name, None)
        if isinstance(dt, torch.dtype):
            out[name] = torch.tensor([0.5, -1.0, 2.0]).to(dt)
    return out


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert set(a) == set(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert torch.equal(a[k].view(torch.uint8) if a[k].dtype.itemsize == 1 and a[k].numel() else a[k],
                           b[k].view(torch.uint8) if b[k].dtype.itemsize == 1 and b[k].numel() else b[k]), k


def _mapped(path: str | Path) -> bool:
    """Whether this process maps ``path`` (``/proc/self/maps`` names a removed file with `` (deleted)``)."""
    target = os.path.realpath(path)
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
        return any(line.rstrip("\n").removesuffix(" (deleted)").endswith(" " + target) for line in fh)


@pytest.fixture
def map_all(monkeypatch: pytest.MonkeyPatch) -> None:
    """Map every plain tensor file, however small (the tests' files are a few hundred bytes)."""
    monkeypatch.setattr(mapped, "MAP_MIN", 0)


@pytest.fixture(autouse=True)
def _local_disk(tmp_path: Path) -> None:
    kind = mapped.filesystem_of(os.stat(tmp_path).st_dev)
    assert kind in mapped.LOCAL_FILESYSTEMS, f"the tests' temporary folder is on {kind!r}: nothing would be mapped"


def _write(path: Path, tensors: dict[str, Any] | None = None) -> tuple[int, str]:
    return tensorfile.write(str(path), _tensors() if tensors is None else tensors)


def test_every_dtype_reads_back_equal_on_a_mapping(tmp_path: Path, map_all: None) -> None:
    path = tmp_path / "t.safetensors"
    size, checksum = _write(path)
    back = tensorfile.read(str(path), size=size, checksum=checksum)
    _same(back, _tensors())
    assert _mapped(path)
    for name, t in back.items():  # each its own storage at offset 0, exactly its bytes: no view of a shared buffer
        assert t.storage_offset() == 0, name
        assert t.untyped_storage().nbytes() == t.numel() * t.element_size(), name
    del back, t
    assert not _mapped(path)  # the last tensor freed unmaps the file


def test_a_large_file_is_mapped_without_patching_the_threshold(tmp_path: Path) -> None:
    path = tmp_path / "big.safetensors"
    big = {"ids": torch.arange(mapped.MAP_MIN // 8 + 1), "logp": torch.rand(1000).to(torch.bfloat16)}
    size, checksum = _write(path, big)
    assert size >= mapped.MAP_MIN
    back = tensorfile.read(str(path), size=size, checksum=checksum)
    assert _mapped(path) and torch.equal(back["ids"], big["ids"]) and torch.equal(back["logp"], big["logp"])
    small = tmp_path / "small.safetensors"
    size, checksum = _write(small)
    kept = tensorfile.read(str(small), size=size, checksum=checksum)
    assert not _mapped(small)  # below MAP_MIN: read into memory
    _same(kept, _tensors())


def test_writes_to_a_returned_tensor_never_reach_the_file(tmp_path: Path, map_all: None) -> None:
    path = tmp_path / "t.safetensors"
    size, checksum = _write(path)
    before = path.read_bytes()
    back = tensorfile.read(str(path), size=size, checksum=checksum)
    for t in back.values():
        if t.numel():
            t.reshape(-1).view(torch.uint8).bitwise_not_()  # every byte of every tensor changed in place
    again = tensorfile.read(str(path), size=size, checksum=checksum)
    assert path.read_bytes() == before and file_checksum(str(path)) == checksum
    _same(again, _tensors())
    assert not torch.equal(back["i64"], again["i64"])  # the host's change stayed in its own copy


def test_the_rng_state_read_from_a_mapping_restores_the_generator(tmp_path: Path, map_all: None) -> None:
    torch.manual_seed(5)
    state = torch.get_rng_state()
    path = tmp_path / "rng.safetensors"
    size, checksum = _write(path, {"pad": torch.zeros(3, dtype=torch.uint8), "rng": state})
    expected = torch.rand(3)
    rng = tensorfile.read(str(path), size=size, checksum=checksum)["rng"]
    assert _mapped(path)
    torch.set_rng_state(rng)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("damage", ["flipped byte", "truncated", "size mismatch", "grown"])
def test_damage_is_refused_before_anything_is_mapped(tmp_path: Path, map_all: None, damage: str) -> None:
    path = tmp_path / "t.safetensors"
    size, checksum = _write(path)
    data = bytearray(path.read_bytes())
    claimed = size
    if damage == "flipped byte":
        data[-3] ^= 0x01  # inside the last tensor's bytes
        match = "checksum"
    elif damage == "truncated":
        data = data[:-8]
        match = "manifest says"
    elif damage == "grown":
        data += b"\0" * 8
        match = "manifest says"
    else:
        claimed = size - 8  # the manifest names another size than the file has
        match = "manifest says"
    path.write_bytes(bytes(data))
    with pytest.raises(EntryInvalid, match=match):
        tensorfile.read(str(path), size=claimed, checksum=checksum)
    assert not _mapped(path)


def test_a_removed_file_leaves_the_tensors_valid(tmp_path: Path, map_all: None) -> None:
    path = tmp_path / "t.safetensors"
    size, checksum = _write(path)
    back = tensorfile.read(str(path), size=size, checksum=checksum)
    trash = tmp_path / ".trash"
    trash.mkdir()
    os.rename(path, trash / path.name)  # what gc and retention do: rename, then remove
    shutil.rmtree(trash)
    with open("/proc/self/maps", encoding="utf-8") as fh:  # the pages belong to the inode, alive while mapped
        assert any(line.rstrip("\n").endswith(f"/.trash/{path.name} (deleted)") for line in fh)
    _same(back, _tensors())
    back["f32"] += 1  # and still writable, privately
    assert torch.equal(back["f32"], _tensors()["f32"] + 1)


def test_compressed_unaligned_and_unmappable_files_are_read_into_memory(tmp_path: Path, map_all: None,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    comp = tmp_path / "c.safetensors.zst"
    size, checksum = tensorfile.write(str(comp), _tensors(), compress=3)
    _same(tensorfile.read(str(comp), size=size, checksum=checksum), _tensors())
    assert not _mapped(comp)

    import json
    import struct

    header = json.dumps({"x": {"dtype": "I64", "shape": [2], "data_offsets": [0, 16]}}).encode()
    assert len(header) % 8  # not padded: the int64 data starts at an unaligned offset
    odd = tmp_path / "odd.safetensors"
    odd.write_bytes(struct.pack("<Q", len(header)) + header + torch.tensor([7, -9]).numpy().tobytes())
    back = tensorfile.read(str(odd), size=odd.stat().st_size, checksum=file_checksum(str(odd)))
    assert back["x"].tolist() == [7, -9] and not _mapped(odd)

    path = tmp_path / "t.safetensors"
    size, checksum = _write(path)

    def no_map(*args: Any, **kwargs: Any) -> Any:
        raise OSError(12, "Cannot allocate memory")  # e.g. vm.max_map_count reached: the entry is still sound

    monkeypatch.setattr(mapped, "map_private", no_map)
    _same(tensorfile.read(str(path), size=size, checksum=checksum), _tensors())
    assert not _mapped(path)
    monkeypatch.undo()
    monkeypatch.setattr(mapped, "MAP_MIN", 0)
    monkeypatch.setattr(mapped, "LOCAL_FILESYSTEMS", frozenset())  # as on NFS: never mapped
    _same(tensorfile.read(str(path), size=size, checksum=checksum), _tensors())
    assert not _mapped(path)
    monkeypatch.undo()
    monkeypatch.setattr(mapped, "MAP_MIN", 0)
    monkeypatch.setenv("SKIPWEAVE_MAP_PAYLOADS", "0")  # the user's opt-out
    _same(tensorfile.read(str(path), size=size, checksum=checksum), _tensors())
    assert not _mapped(path)


CHILD = """
import os, sys
from skipweave.store.format import mapped, tensorfile
from skipweave.store.format.manifest import EntryInvalid

mapped.MAP_MIN = 0
path, size, checksum, when = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]


def truncate():
    os.truncate(path, size // 3)


if when == "after the size check":  # the file is open and its size checked; the checksum pass has not begun
    real_open = tensorfile.open_payload

    def open_payload(p, s):
        fh = real_open(p, s)
        truncate()
        return fh

    tensorfile.open_payload = open_payload
elif when == "after the checksum":  # verified, not yet mapped
    real_hash = mapped.hash_rest

    def hash_rest(*args, **kwargs):
        real_hash(*args, **kwargs)
        truncate()

    mapped.hash_rest = hash_rest
if when == "after the read":  # the documented hazard: an outside truncation while tensors live on the mapping
    tensors = tensorfile.read(path, size=size, checksum=checksum)
    truncate()
    print("touching", flush=True)
    print(float(tensors["big"].sum()))
    sys.exit(0)
try:
    tensorfile.read(path, size=size, checksum=checksum)
except EntryInvalid as exc:
    print("refused:", exc)
    sys.exit(0)
print("served")
sys.exit(3)
"""


def _child(tmp_path: Path, when: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "t.safetensors"
    size, checksum = _write(path, {"big": torch.arange(1 << 16, dtype=torch.float64)})  # 512 KiB: many pages
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD), str(path), str(size), checksum, when],
                          capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize("when", ["after the size check", "after the checksum"])
def test_a_file_truncated_under_the_reader_is_refused_and_the_process_lives(tmp_path: Path, when: str) -> None:
    proc = _child(tmp_path, when)
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    assert "refused:" in proc.stdout and ("ended early" if when == "after the size check" else "changed size") \
        in proc.stdout, proc.stdout


def test_an_outside_truncation_after_the_read_is_what_the_docs_say(tmp_path: Path) -> None:
    """docs/format.md "Reading without a copy": a committed file truncated in place by another program while the
    replayed tensors are still backed by it kills the process (SIGBUS) when a lost page is touched. skipweave never
    truncates a committed file; this pins the documented consequence of someone else doing it."""
    proc = _child(tmp_path, "after the read")
    assert "touching" in proc.stdout
    assert proc.returncode == -signal.SIGBUS, (proc.returncode, proc.stdout, proc.stderr[-2000:])


def test_a_replayed_batch_survives_its_step_being_removed(tmp_path: Path, map_all: None) -> None:
    """The store's read path: a dict-of-tensors result replayed on a mapping, its step folder then removed the way
    retention does (rename, remove): the result stays valid and writable, the file untouched until then."""
    store = StepStore(str(tmp_path / "dump"), "ns", "rollout")
    batch = {"input_ids": torch.randint(0, 1000, (4, 64)), "old_log_probs": torch.rand(4, 64),
             "ref_log_prob": torch.rand(4, 64).to(torch.bfloat16), "mask": torch.ones(4, 64, dtype=torch.bool),
             "meta": {"temperature": 1.0}}
    key = store.key(3, "gen", "r0", 0)
    store.record(key, batch, target_path="host:gen", fingerprint="", rng_state=None, seconds=0.0)
    tensor_file = next(p for p in (tmp_path / "dump").rglob("*.tensors.safetensors"))
    before = tensor_file.read_bytes()
    got = store.load(key).result
    assert _mapped(tensor_file)
    got["input_ids"][0, 0] = -1  # a host writing into its replayed batch
    assert tensor_file.read_bytes() == before
    step = tensor_file.parents[1]
    os.rename(step, step.parent / ".trash-3-x")
    shutil.rmtree(step.parent / ".trash-3-x")
    assert got["input_ids"][0, 0] == -1 and torch.equal(got["input_ids"][1:], batch["input_ids"][1:])
    for name in ("old_log_probs", "ref_log_prob", "mask"):
        assert torch.equal(got[name], batch[name]), name
    assert got["meta"] == {"temperature": 1.0}
