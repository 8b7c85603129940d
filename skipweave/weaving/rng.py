"""Capture and restore the global random number generator states (Python, numpy, torch CPU and CUDA).

Skipping a real call leaves the generators where they were, so everything after it (shuffles, dropout) would
diverge from the recorded run; so a record keeps the states the real call left behind and a replay restores them
(see docs/architecture.md). The captured state is a plain dict of ints, floats, strings, numpy arrays and tensors,
so the codec stores it without pickle.

A record keeps only what its call changed: :func:`rng_marks` is taken right before the real call and
:func:`rng_changes` right after, and only the generators the call changed go into the entry. A replay restores
those, to the state the call left them in, and leaves the others as the host has them, as the real call would have.
Every state is read through the public API (``random.getstate``, ``np.random.get_state``,
``torch.get_rng_state``).
"""

from __future__ import annotations

import array
import functools
import logging
import random
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

logger = logging.getLogger(__name__)

__all__ = ["RNG_STATE_FORMAT", "RngMarks", "capture_rng_state", "restore_rng_state", "rng_changes", "rng_marks"]

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
        is stored compactly as a tensor rather than as 625 JSON nodes. ``numpy`` is left out when numpy's global
        generator is not a Mersenne Twister (``np.random.set_bit_generator(PCG64(...))``): numpy has no legacy
        state for it, and a WARNING says once that it is not recorded.

    Raises:
        RuntimeError: if torch cannot read a CUDA generator state (e.g. a broken CUDA setup).
    """
    py_version, py_internal, py_gauss = random.getstate()
    state: dict[str, Any] = {
        "format": RNG_STATE_FORMAT,
        "python": _python_section(py_version, py_internal, py_gauss),
        "torch_cpu": torch.get_rng_state(),
    }
    if _numpy_legacy():
        state["numpy"] = _numpy_section(np.random.get_state(legacy=True))
    if _cuda():
        state["torch_cuda"] = list(torch.cuda.get_rng_state_all())
    return state


class RngMarks:
    """What :func:`rng_marks` saw of each generator before a real call (opaque: only :func:`rng_changes` reads it)."""

    __slots__ = ("python", "numpy", "torch_cpu", "torch_cuda")

    def __init__(self, python: Any, numpy: Any, torch_cpu: bytes, torch_cuda: list[bytes] | None) -> None:
        self.python, self.numpy, self.torch_cpu, self.torch_cuda = python, numpy, torch_cpu, torch_cuda


def rng_marks() -> RngMarks:
    """Mark the global generators' states right before a real call, for :func:`rng_changes` right after it.

    Raises:
        RuntimeError: torch cannot read a CUDA generator state (e.g. a broken CUDA setup).
    """
    return RngMarks(random.getstate(), _numpy_mark(), _torch_bytes(torch.get_rng_state()),
                    [_torch_bytes(s) for s in torch.cuda.get_rng_state_all()] if _cuda() else None)


def rng_changes(before: RngMarks) -> dict[str, Any] | None:
    """The states of the generators a call changed, taken right after it (``before``: :func:`rng_marks` right
    before it), in :func:`capture_rng_state`'s form with the unchanged generators left out; ``None`` when the call
    changed none.

    A generator is left out only when it is as it was: its whole state compares equal (Python's and numpy's
    Mersenne Twister with their cached gaussian, torch's state byte for byte).

    Raises:
        RuntimeError: torch cannot read a CUDA generator state.
    """
    state: dict[str, Any] = {}
    python = random.getstate()
    if python != before.python:
        state["python"] = _python_section(*python)
    numpy = np.random.get_state(legacy=True) if _numpy_legacy() else None
    if numpy is not None and _numpy_token(numpy) != before.numpy:
        state["numpy"] = _numpy_section(numpy)
    cpu = torch.get_rng_state()
    if _torch_bytes(cpu) != before.torch_cpu:
        state["torch_cpu"] = cpu
    if before.torch_cuda is not None:
        cuda = list(torch.cuda.get_rng_state_all())
        if [_torch_bytes(s) for s in cuda] != before.torch_cuda:
            state["torch_cuda"] = cuda
    if not state:
        return None
    state["format"] = RNG_STATE_FORMAT
    return state


def _numpy_mark() -> Any:
    """A token of numpy's legacy state now (:func:`_numpy_token`), ``None`` when it has none to record."""
    return _numpy_token(np.random.get_state(legacy=True)) if _numpy_legacy() else None


def _numpy_token(np_state: Any) -> tuple[Any, ...]:
    """numpy's legacy state ``(name, key, pos, has_gauss, gauss)`` as a tuple that compares by value."""
    name, key, pos, has_gauss, gauss = np_state
    return name, key.tobytes(), pos, has_gauss, gauss


def _torch_bytes(state: torch.Tensor) -> bytes:
    """A generator state's bytes (torch hands CUDA ones over as CPU tensors too), read without a torch op: torch
    ops let go of the GIL, and taking it back while the background writer runs costs a recording call up to a
    thread switch interval (``torch.equal`` of two states took 140 µs there, against 5 µs alone)."""
    return bytes(state.numpy().data)


@functools.cache
def _cuda() -> bool:
    """``torch.cuda.is_available()``, asked once per process (it does not change while a process runs)."""
    return torch.cuda.is_available()


def _python_section(version: Any, internal: tuple[int, ...], gauss: Any) -> dict[str, Any]:
    return {"version": int(version), "state": _int64_array(internal),
            "gauss_next": None if gauss is None else float(gauss)}


def _numpy_legacy() -> bool:
    """Whether numpy's global generator has a legacy state to record (a Mersenne Twister); a WARNING once if not."""
    rs = getattr(np.random.get_state, "__self__", None)
    bit_generator = getattr(rs, "_bit_generator", None)
    if bit_generator is None or isinstance(bit_generator, np.random.MT19937):
        return True
    kind = type(bit_generator).__name__
    if kind not in _NOT_LEGACY:
        _NOT_LEGACY.add(kind)
        logger.warning("skipweave: numpy's global generator is a %s, not a Mersenne Twister: its state is not "
                       "recorded or restored (python random and torch still are)", kind)
    return False


_NOT_LEGACY: set[str] = set()


def _numpy_section(np_state: Any) -> dict[str, Any]:
    """numpy's section from ``np.random.get_state(legacy=True)``."""
    bit_generator, key, pos, has_gauss, cached_gaussian = np_state
    return {"bit_generator": str(bit_generator), "key": np.array(key, dtype=np.uint32, copy=True), "pos": int(pos),
            "has_gauss": int(has_gauss), "cached_gaussian": float(cached_gaussian)}


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


@functools.cache
def _torch_state_shape() -> torch.Size:
    """The shape of torch's CPU generator state in this process."""
    return torch.get_rng_state().shape


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
