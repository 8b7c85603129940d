"""skipweave.store.format.tensorfile: streaming safetensors writer/reader with the checksum on the same bytes."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from skipweave.store.format import tensorfile
from skipweave.store.format.manifest import EntryInvalid, file_checksum


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "i64": torch.randint(-5, 5, (3, 7), generator=g),
        "f32": torch.rand(5, generator=g),
        "bf16": torch.rand(2, 3, generator=g).to(torch.bfloat16),
        "f16": torch.rand(4, generator=g).half(),
        "f64": torch.tensor(2.5, dtype=torch.float64),  # 0-d
        "i32": torch.arange(6, dtype=torch.int32).reshape(2, 3),
        "i16": torch.tensor([1, -2], dtype=torch.int16),
        "i8": torch.tensor([3], dtype=torch.int8),
        "u8": torch.arange(9, dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "empty": torch.zeros(0, 4),
    }


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert set(a) == set(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and torch.equal(a[k], b[k]), k


def test_round_trip_is_valid_safetensors_with_the_file_checksum(tmp_path: Path) -> None:
    path = str(tmp_path / "t.safetensors")
    size, checksum = tensorfile.write(path, _tensors())
    assert size == os.path.getsize(path) and checksum == file_checksum(path)
    _same(load_file(path), _tensors())  # the reference reader accepts the file
    back = tensorfile.read(path, size=size, checksum=checksum)
    _same(back, _tensors())
    for t in back.values():  # every tensor owns its memory: nothing pins a shared buffer
        assert t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.numel() * t.element_size()


def test_reads_files_written_by_safetensors_and_unaligned_ones(tmp_path: Path) -> None:
    path = str(tmp_path / "ref.safetensors")
    save_file(_tensors(), path)
    _same(tensorfile.read(path, size=os.path.getsize(path), checksum=file_checksum(path)), _tensors())
    header = json.dumps({"x": {"dtype": "I64", "shape": [2], "data_offsets": [0, 16]}}).encode()
    assert len(header) % 8  # not padded: the int64 data starts at an odd offset
    odd = tmp_path / "odd.safetensors"
    odd.write_bytes(struct.pack("<Q", len(header)) + header + torch.tensor([7, -9]).numpy().tobytes())
    back = tensorfile.read(str(odd), size=odd.stat().st_size, checksum=file_checksum(str(odd)))
    assert back["x"].tolist() == [7, -9]


def test_rng_state_tensor_read_back_restores_the_generator(tmp_path: Path) -> None:
    torch.manual_seed(3)
    state = torch.get_rng_state()
    path = str(tmp_path / "rng.safetensors")
    size, checksum = tensorfile.write(path, {"pad": torch.zeros(3, dtype=torch.uint8), "rng": state})
    expected = torch.rand(3)
    torch.set_rng_state(tensorfile.read(path, size=size, checksum=checksum)["rng"])
    assert torch.equal(torch.rand(3), expected)


def test_corrupt_truncated_or_missing_files_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.safetensors"
    size, checksum = tensorfile.write(str(path), _tensors())
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(EntryInvalid, match="checksum"):
        tensorfile.read(str(path), size=size, checksum=checksum)
    os.truncate(path, size - 8)
    with pytest.raises(EntryInvalid, match="bytes, manifest says"):
        tensorfile.read(str(path), size=size, checksum=checksum)
    with pytest.raises(EntryInvalid, match="missing"):
        tensorfile.read(str(tmp_path / "nope"), size=size, checksum=checksum)


@pytest.mark.parametrize(
    "header",
    [
        {"x": {"dtype": "I64", "shape": [1 << 40], "data_offsets": [0, 8 << 40]}},  # would allocate 8 TiB
        {"x": {"dtype": "I64", "shape": [2], "data_offsets": [0, 8]}},  # shape and offsets disagree
        {"x": {"dtype": "Q9", "shape": [2], "data_offsets": [0, 16]}},  # unknown dtype
        {"x": {"dtype": "I64", "shape": [1], "data_offsets": [8, 16]}},  # a hole before the data
        [1, 2],
        b'{"x": {"dtype": "I64", "shape": [1e400], "data_offsets": [0, 8]}}',  # int(inf): OverflowError
        b'{"x": {"dtype": "I64", "shape": [1], "data_offsets": [0, 1e400]}}',
        b"[" * 100_000 + b"]" * 100_000,  # nested beyond what json parses: RecursionError
    ],
)
def test_malformed_headers_are_refused_before_allocating(tmp_path: Path, header: object) -> None:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path = tmp_path / "bad.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(16))
    with pytest.raises(EntryInvalid, match="not a valid safetensors file"):
        tensorfile.read(str(path), size=path.stat().st_size, checksum=file_checksum(str(path)))


def test_progress_bars_only_for_large_payloads_and_never_when_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    big = tensorfile.PROGRESS_MIN + 1
    monkeypatch.setenv("SKIPWEAVE_PROGRESS", "1")
    assert tensorfile.progress_enabled(big) and not tensorfile.progress_enabled(tensorfile.PROGRESS_MIN)
    monkeypatch.setenv("SKIPWEAVE_PROGRESS", "0")
    assert not tensorfile.progress_enabled(big)
    monkeypatch.delenv("SKIPWEAVE_PROGRESS")
    assert tensorfile.progress_enabled(big) is False  # pytest's stderr is not a terminal


def test_progress_bar_shows_on_stderr_when_forced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capfd: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SKIPWEAVE_PROGRESS", "1")
    monkeypatch.setattr(tensorfile, "PROGRESS_MIN", 1 << 20)
    path = str(tmp_path / "p.safetensors")
    size, checksum = tensorfile.write(path, {"x": torch.zeros(3 << 20, dtype=torch.uint8)}, desc="recording")
    tensorfile.read(path, size=size, checksum=checksum, desc="replaying")
    err = capfd.readouterr().err
    assert "recording" in err and "replaying" in err


def test_file_size_is_the_written_size_for_any_names_dtypes_and_shapes(tmp_path: Path) -> None:
    """file_size sums the header's length from its parts (no header is serialised): it must match what write()
    writes, byte for byte, for names JSON escapes, empty and 0-d tensors, and every dtype's sort order."""
    import random

    rng = random.Random(0)
    dtypes = [torch.int64, torch.float32, torch.uint8, torch.bool, torch.float16, torch.bfloat16, torch.int8]
    names = ["t{}", "0005/t{}", "ü{}", 'q"{}', "\x00\n{}", "0001/tree{}"]
    for trial in range(200):
        tensors = {rng.choice(names).format(i): torch.zeros([rng.randint(0, 40) for _ in range(rng.randint(0, 3))],
                                                            dtype=rng.choice(dtypes)) for i in range(rng.randint(0, 7))}
        path = tmp_path / f"{trial}.safetensors"
        written, _ = tensorfile.write(str(path), tensors)
        assert tensorfile.file_size(tensors) == written == path.stat().st_size, {k: (t.dtype, t.shape)
                                                                                  for k, t in tensors.items()}


def test_read_whole_refuses_a_claimed_size_beyond_its_limit_before_allocating(tmp_path: Path) -> None:
    """A group file's data size is a claim: a crafted 1 TiB must be refused, not allocated (MemoryError, or the
    kernel's OOM killer for a size that fits the address space)."""
    path = tmp_path / "g.safetensors"
    written, checksum = tensorfile.write(str(path), {"0000/tree": torch.zeros(3, dtype=torch.uint8)})
    with pytest.raises(EntryInvalid, match="beyond"):
        tensorfile.read_whole(str(path), size=1 << 40, checksum=checksum, limit=1 << 20)
    with pytest.raises(EntryInvalid, match="manifest says"):  # a size within the limit but not the file's: refused too
        tensorfile.read_whole(str(path), size=written + 7, checksum=checksum, limit=1 << 20)
    section, spans = tensorfile.read_whole(str(path), size=written, checksum=checksum, limit=1 << 20)
    assert list(spans) == ["0000/tree"] and len(section) == 3


@pytest.mark.parametrize("names", [["é", "\ud800"], ["日本語", "sub"], ["\x7f", "\ud800", "a"], ["t0", "0001/tree"]])
def test_file_size_is_what_write_writes_whatever_the_names(tmp_path: Path, names: list[str]) -> None:
    """One name's escaping may change how the whole header is written (a lone surrogate sends it to ``json``)."""
    tensors: dict[str, Any] = {n: torch.arange(i + 3, dtype=torch.int64) for i, n in enumerate(names)}
    tensors["raw"] = b"tree bytes"
    written, _ = tensorfile.write(str(tmp_path / "f.safetensors"), tensors)
    assert tensorfile.file_size(tensors) == written == (tmp_path / "f.safetensors").stat().st_size
