"""Capture and restore the global random number generator states (Python, numpy, torch CPU and CUDA).

The captured state is a plain dict of ints, floats, strings, numpy arrays and tensors, so
``skipweave.store.codec.encode`` can store it without pickle.
"""

from __future__ import annotations

import array
import logging
import random
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

logger = logging.getLogger(__name__)

__all__ = ["RNG_STATE_FORMAT", "capture_rng_state", "restore_rng_state"]

RNG_STATE_FORMAT = 1


def capture_rng_state() -> dict[str, Any]:
    """Capture the global RNG states of Python's ``random``, numpy's legacy ``np.random`` and torch.

    Returns:
        A dict::

            {
              "format": 1,
              "python": {"version": int, "state": np.ndarray int64 (625,), "gauss_next": float | None},
              "numpy": {"bit_generator": str, "key": np.ndarray uint32 (624,), "pos": int,
                        "has_gauss": int, "cached_gaussian": float},
              "torch_cpu": torch.Tensor uint8 (CPU, ~5 KiB),
              "torch_cuda": [torch.Tensor uint8, one per visible CUDA device],  # only if CUDA is available
            }

        Python's internal state tuple of 625 ints is kept as an int64 array (all values are < 2**32) so it
        is stored compactly as a tensor rather than as 625 JSON nodes.

    Raises:
        RuntimeError: if torch cannot read a CUDA generator state (e.g. a broken CUDA setup).
    """
    py_version, py_internal, py_gauss = random.getstate()
    np_state = np.random.get_state(legacy=True)
    assert isinstance(np_state, tuple)  # legacy=True always gives the 5-tuple
    bit_generator, key, pos, has_gauss, cached_gaussian = np_state
    state: dict[str, Any] = {
        "format": RNG_STATE_FORMAT,
        "python": {
            "version": int(py_version),
            "state": _int64_array(py_internal),
            "gauss_next": None if py_gauss is None else float(py_gauss),
        },
        "numpy": {
            "bit_generator": str(bit_generator),
            "key": np.array(key, dtype=np.uint32, copy=True),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "torch_cpu": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["torch_cuda"] = list(torch.cuda.get_rng_state_all())
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Restore RNG states captured by :func:`capture_rng_state` (possibly after an encode/decode round trip).

    Missing sections are left untouched. CUDA states are skipped (debug log) when CUDA is not available; if
    fewer CUDA devices are visible than were recorded, only the visible ones are restored (warning).

    Args:
        state: the captured dict.

    Raises:
        ValueError: unknown ``format`` or a malformed section (nothing was restored).
    """
    prepare_rng_state(state)()


def prepare_rng_state(state: Mapping[str, Any]) -> Callable[[], None]:
    """Check a captured state whole and return the function that restores it (:func:`restore_rng_state` in two
    halves): a replay checks the recorded state before it changes anything of the host, and restores it last.

    Raises:
        ValueError: unknown ``format`` or a malformed section.
    """
    fmt = state.get("format", RNG_STATE_FORMAT)
    if fmt != RNG_STATE_FORMAT:
        raise ValueError(f"unknown RNG state format {fmt!r}; expected {RNG_STATE_FORMAT}")
    steps: list[Callable[[], None]] = []
    try:
        py = state.get("python")
        if py is not None:
            gauss = py.get("gauss_next")
            internal = tuple(np.asarray(py["state"], dtype=np.int64).tolist())  # Python ints
            py_state = (int(py["version"]), internal, None if gauss is None else float(gauss))
            _SCRATCH.setstate(py_state)  # a malformed state fails here, on a scratch generator
            steps.append(lambda: random.setstate(py_state))
        nps = state.get("numpy")
        if nps is not None:
            key = np.asarray(nps["key"], dtype=np.uint32)
            np_state = (str(nps["bit_generator"]), key, int(nps["pos"]), int(nps["has_gauss"]),
                        float(nps["cached_gaussian"]))
            if np_state[0] != "MT19937" or key.shape != (624,) or not 0 <= np_state[2] <= 624:
                raise ValueError(f"malformed numpy RNG state ({np_state[0]!r}, key of shape {key.shape}, "
                                 f"pos {np_state[2]})")
            # the key as Python ints: numpy's MT19937 state setter copies it item by item, and indexing a list is
            # several times cheaper than indexing an array (the same 624 uint32 values, checked above)
            np_state = (np_state[0], key.tolist(), *np_state[2:])
            steps.append(lambda: np.random.set_state(np_state))
    except (KeyError, TypeError, OverflowError) as exc:
        raise ValueError(f"malformed RNG state: {type(exc).__name__}: {exc}") from exc
    cpu = state.get("torch_cpu")
    if cpu is not None:
        cpu_state = torch.as_tensor(cpu, dtype=torch.uint8).cpu()
        if cpu_state.shape != _torch_state_shape():
            raise ValueError(f"malformed torch RNG state: shape {tuple(cpu_state.shape)}, expected "
                             f"{tuple(_torch_state_shape())}")
        steps.append(lambda: torch.set_rng_state(cpu_state))
    cuda = state.get("torch_cuda")
    if cuda is not None:
        steps.append(lambda: _restore_cuda(cuda))

    def restore() -> None:
        for step in steps:
            step()

    return restore


def _int64_array(values: tuple[int, ...]) -> np.ndarray:
    """``np.asarray(values, dtype=np.int64)`` for Python's generator state (625 ints in ``[0, 2**32)``) at about
    half the cost: filled as unsigned 64-bit (``array``'s fast path; a non-negative int64 has the same bytes)."""
    try:
        return np.frombuffer(array.array("Q", values), dtype=np.int64)
    except (OverflowError, TypeError):  # not what CPython's Mersenne Twister gives: the general conversion
        return np.asarray(values, dtype=np.int64)


_SCRATCH = random.Random(0)
_TORCH_STATE_SHAPE: list[torch.Size] = []


def _torch_state_shape() -> torch.Size:
    if not _TORCH_STATE_SHAPE:
        _TORCH_STATE_SHAPE.append(torch.get_rng_state().shape)
    return _TORCH_STATE_SHAPE[0]


def _restore_cuda(cuda: Any) -> None:
    if not torch.cuda.is_available():
        logger.debug("RNG state has %d CUDA generator states but CUDA is not available; skipped", len(cuda))
        return
    n = torch.cuda.device_count()
    if n < len(cuda):
        logger.warning(
            "RNG state has %d CUDA generator states but only %d devices are visible; restoring %d",
            len(cuda),
            n,
            n,
        )
    for i, s in enumerate(list(cuda)[:n]):
        torch.cuda.set_rng_state(torch.as_tensor(s, dtype=torch.uint8).cpu(), device=i)
