"""Tests for skipweave.weaving.rng: capture -> encode (no pickle) -> file -> decode -> restore."""

from __future__ import annotations

import ctypes
import json
import logging
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from skipweave.store.format.codec import decode, encode
from skipweave.weaving.rng import capture_rng_state, restore_rng_state, rng_changes, rng_marks


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
    with caplog.at_level(logging.DEBUG, logger="skipweave.weaving.rng"):
        restore_rng_state(state)
    assert _draw() == expected
    assert any("CUDA is not available" in r.getMessage() for r in caplog.records)


def test_unknown_format() -> None:
    with pytest.raises(ValueError, match="format"):
        restore_rng_state({"format": 42})


# ---------------------------------------------------------------- what a call changed (rng_marks / rng_changes)
def _changed_by(call: Any) -> dict[str, Any] | None:
    before = rng_marks()
    call()
    return rng_changes(before)


def test_a_call_that_draws_nothing_changes_nothing() -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    assert _changed_by(lambda: None) is None  # (numpy, just seeded: read through its public API once)
    assert _changed_by(lambda: None) is None
    assert _changed_by(lambda: sum(range(10))) is None


@pytest.mark.parametrize(("draw", "section"), [
    (lambda: random.random(), "python"),
    (lambda: np.random.rand(), "numpy"),
    (lambda: torch.rand(1), "torch_cpu"),
    (lambda: np.random.seed(7), "numpy"),
    (lambda: torch.manual_seed(9), "torch_cpu"),
])
def test_exactly_the_generator_a_call_advanced_is_recorded(draw: Any, section: str) -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    _changed_by(lambda: None)
    changes = _changed_by(draw)
    assert changes is not None and set(changes) == {"format", section}
    expected = _draw()
    restore_rng_state(changes)  # the others are left as they are: as the real call leaves them
    assert _draw()[_SECTION_DRAWS[section]] == expected[_SECTION_DRAWS[section]]


_SECTION_DRAWS = {"python": 0, "numpy": 2, "torch_cpu": 4}


def test_a_cached_gaussian_taken_without_moving_the_twister_is_seen() -> None:
    """Both generators hand out a cached second gaussian without drawing: their twister state does not move."""
    random.seed(1)
    random.gauss(0, 1)  # one gaussian cached in gauss_next
    changes = _changed_by(lambda: random.gauss(0, 1))  # takes the cached one
    assert changes is not None and changes["python"]["gauss_next"] is None
    np.random.seed(2)
    np.random.standard_normal()  # numpy caches the pair's second value (has_gauss 1)
    assert np.random.get_state()[3] == 1
    _changed_by(lambda: None)  # the probe now knows this state (its twister bytes, and has_gauss 1)
    changes = _changed_by(lambda: np.random.standard_normal())  # takes it, no draw from the twister
    assert changes is not None and changes["numpy"]["has_gauss"] == 0
    assert _changed_by(lambda: None) is None  # now known again, with nothing cached


def test_without_probes_the_public_api_decides_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a probe is unusable (another Python, another numpy layout), the states are read and compared
    through the public API before and after the call: slower, the same outcome."""
    from skipweave.weaving import rng

    monkeypatch.setattr(rng._PYTHON, "bound", ())
    monkeypatch.setattr(rng._NUMPY, "bound", ())
    assert _changed_by(lambda: None) is None
    changes = _changed_by(lambda: (random.random(), np.random.rand()))
    assert changes is not None and set(changes) == {"format", "python", "numpy"}
    np.random.seed(3)
    np.random.standard_normal()
    changes = _changed_by(lambda: np.random.standard_normal())  # the cached gaussian, no draw
    assert changes is not None and set(changes) == {"format", "numpy"}


def test_probes_agree_with_the_public_state() -> None:
    """The probes read the very bytes the public API reports (this CPython and numpy: both are usable)."""
    from skipweave.weaving import rng

    rng_marks()
    assert rng._PYTHON.address > 0 and rng._NUMPY.address > 0
    np.random.seed(5)
    np.random.standard_normal()  # a gaussian cached: has_gauss 1
    assert rng._numpy_probe_bytes(rng._NUMPY.address, rng._NUMPY.gauss_at) == rng._numpy_bytes(np.random.get_state())
    random.seed(5)
    random.random()
    assert ctypes.string_at(rng._PYTHON.address, 2500) == rng._python_bytes(random.getstate())


def test_a_cached_gaussian_set_back_by_the_host_or_the_call_is_seen() -> None:
    """numpy's cached gaussian changes without its twister moving when a state is set: a host rewinding to a
    checkpoint, or a call setting one, is seen all the same."""
    np.random.seed(2)
    np.random.standard_normal()
    checkpoint = np.random.get_state()  # a gaussian cached
    np.random.standard_normal()  # handed out: the same twister words, none cached
    _changed_by(lambda: None)
    np.random.set_state(checkpoint)  # the host rewinds
    changes = _changed_by(lambda: np.random.standard_normal())  # the call takes the cached one, draws nothing
    assert changes is not None and changes["numpy"]["has_gauss"] == 0
    st = np.random.get_state()
    changes = _changed_by(lambda: np.random.set_state((st[0], st[1], st[2], 1, 0.5)))
    assert changes is not None and (changes["numpy"]["has_gauss"], changes["numpy"]["cached_gaussian"]) == (1, 0.5)


def test_a_generator_replaced_by_the_host_is_followed(monkeypatch: pytest.MonkeyPatch) -> None:
    """``importlib.reload(random)`` or ``np.random.set_bit_generator`` put another generator object behind the
    public functions: the probes read that one."""
    import copy

    rng_marks()
    other = random.Random(3)
    for name in ("getstate", "setstate", "random", "seed"):
        monkeypatch.setattr(random, name, getattr(other, name))
    assert _changed_by(lambda: None) is None
    changes = _changed_by(lambda: random.random())
    assert changes is not None and set(changes) == {"format", "python"}
    original = np.random.get_bit_generator()
    np.random.set_bit_generator(copy.deepcopy(original))
    try:
        assert _changed_by(lambda: None) is None
        changes = _changed_by(lambda: np.random.rand())
        assert changes is not None and set(changes) == {"format", "numpy"}
    finally:
        np.random.set_bit_generator(original)


def test_a_global_generator_that_is_not_a_mersenne_twister_is_left_out(caplog: pytest.LogCaptureFixture) -> None:
    """``np.random.set_bit_generator(PCG64(...))``: numpy has no legacy state for it; recording goes on without it
    (and without numpy's RuntimeWarning), the other generators still recorded."""
    import warnings

    original = np.random.get_bit_generator()
    np.random.set_bit_generator(np.random.PCG64(7))
    try:
        with warnings.catch_warnings(), caplog.at_level(logging.WARNING, logger="skipweave.weaving.rng"):
            warnings.simplefilter("error")
            changes = _changed_by(lambda: (np.random.rand(), torch.rand(1)))
            assert changes is not None and set(changes) == {"format", "torch_cpu"}
            assert "numpy" not in capture_rng_state()
        assert "not a Mersenne Twister" in caplog.text
    finally:
        np.random.set_bit_generator(original)
    assert _changed_by(lambda: np.random.rand()) is not None  # back to the twister: numpy recorded again
