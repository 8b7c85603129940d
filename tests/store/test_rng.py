"""Tests for skipweave.store.rng: capture -> encode (no pickle) -> file -> decode -> restore."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from skipweave.store.codec import decode, encode
from skipweave.store.rng import capture_rng_state, restore_rng_state


def _draw() -> tuple[list[float], list[float], list[float], list[float], list[float]]:
    return (
        [random.random() for _ in range(5)],
        [random.gauss(0, 1) for _ in range(3)],
        np.random.rand(5).tolist(),
        np.random.randn(3).tolist(),
        torch.rand(5).tolist(),
    )


def test_capture_encode_file_decode_restore(tmp_path: Path) -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    # leave cached gaussians behind so gauss_next / has_gauss are exercised
    random.gauss(0, 1)
    np.random.randn(1)
    state = capture_rng_state()
    assert state["python"]["gauss_next"] is not None and state["numpy"]["has_gauss"] == 1
    expected = _draw()

    enc = encode(state)  # must not need pickle
    assert not enc.pickled
    (tmp_path / "rng.json").write_text(json.dumps(enc.tree, allow_nan=False))
    save_file(enc.tensors, str(tmp_path / "rng.safetensors"))
    decoded = decode(json.loads((tmp_path / "rng.json").read_text()), load_file(str(tmp_path / "rng.safetensors")))

    _draw()  # advance everything
    restore_rng_state(decoded)
    assert _draw() == expected

    restore_rng_state(decode(enc.tree, enc.tensors))  # in-memory round trip too
    assert _draw() == expected


def test_restore_raw_capture() -> None:
    state = capture_rng_state()
    expected = _draw()
    restore_rng_state(state)
    assert _draw() == expected


def test_cuda_states_skipped_without_cuda(caplog: pytest.LogCaptureFixture) -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    state = capture_rng_state()
    assert "torch_cuda" not in state
    state["torch_cuda"] = [torch.zeros(16, dtype=torch.uint8)]
    expected = _draw()
    with caplog.at_level(logging.DEBUG, logger="skipweave.store.rng"):
        restore_rng_state(state)
    assert _draw() == expected
    assert any("CUDA is not available" in r.getMessage() for r in caplog.records)


def test_unknown_format() -> None:
    with pytest.raises(ValueError, match="format"):
        restore_rng_state({"format": 42})
