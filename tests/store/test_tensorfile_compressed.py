"""Compressed tensor files (``skip.<role>.compress``): real zstd frames written and read back, crafted ones refused."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import zstandard

import skipweave
from skipweave.store.format import tensorfile
from skipweave.store.format.manifest import EntryInvalid, bytes_checksum, file_checksum
from skipweave.store.step_store import StepStore


def _tokens() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"ids": torch.randint(0, 151_000, (16, 512), generator=g), "mask": torch.ones(16, 512, dtype=torch.int64),
            "logp": torch.rand(16, 512, generator=g), "empty": torch.zeros(0)}


def test_a_compressed_file_is_a_zstd_frame_of_the_plain_bytes_and_reads_back(tmp_path: Path) -> None:
    t = _tokens()
    plain, comp = tmp_path / "a.safetensors", tmp_path / "a.safetensors.zst"
    n_plain, _ = tensorfile.write(str(plain), t)
    n_comp, checksum = tensorfile.write(str(comp), t, compress=1)
    assert n_comp == comp.stat().st_size and n_comp < n_plain / 2 and checksum == file_checksum(str(comp))
    assert zstandard.ZstdDecompressor().decompressobj().decompress(comp.read_bytes()) == plain.read_bytes()
    got = tensorfile.read(str(comp), size=n_comp, checksum=checksum)
    assert set(got) == set(t) and all(torch.equal(got[k], t[k]) for k in t)


def _frame(raw: bytes, path: Path) -> tuple[int, str]:
    data = zstandard.ZstdCompressor(level=1).compress(raw)
    path.write_bytes(data)
    return len(data), bytes_checksum(data)


def _header(tensors: dict[str, Any]) -> bytes:
    raw = json.dumps(tensors).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


@pytest.mark.parametrize("case", ["bomb", "truncated", "trailing", "not_safetensors", "short", "bad_checksum"])
def test_crafted_compressed_files_are_refused_without_allocating_what_they_claim(tmp_path: Path, case: str) -> None:
    path = tmp_path / "x.safetensors.zst"
    if case == "bomb":  # a few bytes that claim a 2**50-byte tensor
        size, checksum = _frame(_header({"t": {"dtype": "U8", "shape": [1 << 50], "data_offsets": [0, 1 << 50]}}),
                                path)
    elif case == "truncated":
        good = zstandard.ZstdCompressor(level=1).compress(_header(
            {"t": {"dtype": "I64", "shape": [4096], "data_offsets": [0, 32768]}}) + bytes(32768))
        path.write_bytes(good[: len(good) // 2])
        size, checksum = len(good) // 2, bytes_checksum(good[: len(good) // 2])
    elif case == "trailing":  # more decompressed bytes than the tensors take
        size, checksum = _frame(_header({"t": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}}) + bytes(9), path)
    elif case == "not_safetensors":
        size, checksum = _frame(b"this is not a safetensors file at all" * 10, path)
    elif case == "short":  # fewer bytes than the header's tensors
        size, checksum = _frame(_header({"t": {"dtype": "U8", "shape": [64], "data_offsets": [0, 64]}}) + bytes(8),
                                path)
    else:
        size, _ = _frame(_header({"t": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}}) + bytes(4), path)
        checksum = "xxh3_128:" + "0" * 32
    with pytest.raises(EntryInvalid):
        tensorfile.read(str(path), size=size, checksum=checksum)


HOST = '''
import torch

CALLS = []


def gen(step):
    CALLS.append(step)
    g = torch.Generator().manual_seed(step)
    return {"ids": torch.randint(0, 151_000, (8, 256), generator=g), "step": step}
'''


def test_a_role_with_compress_records_zst_files_and_replays_them_and_a_damaged_one_is_regenerated(
        host_module: Any, tmp_path: Path) -> None:
    name, _ = host_module(HOST)
    m = sys.modules[name]
    role = {"enable": True, "dump_dir": str(tmp_path), "compress": "zstd", "step": {"source": "arg", "arg": 0,
                                                                                     "path": ""},
            "targets": {"gen": f"{name}:gen"}}
    skipweave.weave({"skip": {"rollout": role}})
    first = [m.gen(s) for s in (1, 2)]
    skipweave.unweave()
    files = sorted(p.name for p in tmp_path.rglob("*.tensors.*"))
    assert len(files) == 2 and all(f.endswith(".tensors.safetensors.zst") for f in files), files
    from skipweave.cli.main import main as cli

    assert cli(["verify", str(tmp_path)]) == 0  # the CLI judges compressed entries as runs do
    # a run without compress serves them too
    skipweave.weave({"skip": {"rollout": {**role, "compress": "none"}}})
    m.CALLS.clear()
    again = [m.gen(s) for s in (1, 2)]
    skipweave.unweave()
    assert m.CALLS == [] and all(torch.equal(a["ids"], b["ids"]) for a, b in zip(first, again, strict=True))
    # a flipped byte in a compressed file: never served, set aside, regenerated
    victim = next(p for p in tmp_path.rglob("*.zst") if "/1/" in str(p))
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    skipweave.weave({"skip": {"rollout": role}})
    m.CALLS.clear()
    assert torch.equal(m.gen(1)["ids"], first[0]["ids"]) and m.CALLS == [1]
    skipweave.unweave()
    assert list((tmp_path / "default" / "rollout" / "_set_aside").iterdir())


def test_compress_is_checked_and_canonical() -> None:
    from skipweave.config.errors import ConfigError
    from skipweave.config.parse import parse_skip

    role = {"enable": True, "targets": {"g": "m:f"}}
    for value, canon, level in (("zstd", "zstd:1", 1), ("zstd:7", "zstd:7", 7), (True, "zstd:1", 1),
                                (False, "none", None), ("none", "none", None), (None, "none", None)):
        parsed = parse_skip({"rollout": {**role, "compress": value}}).roles["rollout"]
        assert (parsed.compress, parsed.compress_level) == (canon, level)
    for bad in ("gzip", "zstd:0", "zstd:23", 3, "zstd:x"):
        with pytest.raises(ConfigError, match=r"skip\.rollout\.compress"):
            parse_skip({"rollout": {**role, "compress": bad}})


def test_a_store_reads_plain_and_compressed_entries_alike(tmp_path: Path) -> None:
    for level in (None, 3):
        store = StepStore(str(tmp_path), "default", f"r{level}", compress=level)
        key = store.key(1, "g", "r0", 0)
        store.record(key, _tokens(), target_path="m:f", fingerprint="", rng_state=None, seconds=0.0)
        got = store.load(key).result
        assert all(torch.equal(got[k], v) for k, v in _tokens().items())
