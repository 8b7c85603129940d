"""Capture and restore the global random number generator states (Python, numpy, torch CPU and CUDA).

The captured state is a plain dict of ints, floats, strings, numpy arrays and tensors, so
``skipweave.store.codec.encode`` can store it without pickle.

A record keeps only what its call changed: :func:`rng_marks` is taken right before the real call and
:func:`rng_changes` right after, and only the generators the call changed go into the entry. A replay restores
those, to the state the call left them in, and leaves the others as the host has them, as the real call would have.
Most calls leave most generators alone, and showing one unchanged costs about a microsecond: its state's bytes are
compared where the generator keeps them (:class:`_Probe`; where that is not possible here, the public API is read
before and after, with the same outcome). The state recorded always comes from the public API
(``random.getstate``, ``np.random.get_state``, ``torch.get_rng_state``).
"""

from __future__ import annotations

import array
import ctypes
import logging
import random
import sys
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
        is stored compactly as a tensor rather than as 625 JSON nodes.

    Raises:
        RuntimeError: if torch cannot read a CUDA generator state (e.g. a broken CUDA setup).
    """
    py_version, py_internal, py_gauss = random.getstate()
    np_state = np.random.get_state(legacy=True)
    assert isinstance(np_state, tuple)  # legacy=True always gives the 5-tuple
    state: dict[str, Any] = {
        "format": RNG_STATE_FORMAT,
        "python": _python_section(py_version, py_internal, py_gauss),
        "numpy": _numpy_section(np_state),
        "torch_cpu": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["torch_cuda"] = list(torch.cuda.get_rng_state_all())
    return state


class RngMarks:
    """What :func:`rng_marks` saw of each generator before a real call (opaque: only :func:`rng_changes` reads it)."""

    __slots__ = ("python", "numpy", "torch_cpu", "torch_cuda")

    def __init__(self, python: Any, numpy: Any, torch_cpu: torch.Tensor, torch_cuda: list[Any] | None
                 ) -> None:
        self.python, self.numpy, self.torch_cpu, self.torch_cuda = python, numpy, torch_cpu, torch_cuda


def rng_marks() -> RngMarks:
    """Mark the global generators' states right before a real call, for :func:`rng_changes` right after it.

    Costs a few microseconds: Python's and numpy's states are read as bytes where the generators keep them, when
    that was verified here (see :class:`_Probe`); torch's state is read by ``torch.get_rng_state`` (about 5 KiB).

    Raises:
        RuntimeError: torch cannot read a CUDA generator state (e.g. a broken CUDA setup).
    """
    return RngMarks(_PYTHON.mark(), _NUMPY.mark(), torch.get_rng_state(),
                    list(torch.cuda.get_rng_state_all()) if _cuda() else None)


def rng_changes(before: RngMarks) -> dict[str, Any] | None:
    """The states of the generators a call changed, taken right after it (``before``: :func:`rng_marks` right
    before it), in :func:`capture_rng_state`'s form with the unchanged generators left out; ``None`` when the call
    changed none.

    A generator is left out only when it is as it was: torch's state compares equal byte for byte; Python's and
    numpy's Mersenne Twister states compare equal, and so does their cached gaussian (numpy's is read through the
    public API when one was cached before the call, since it can be handed out without a draw).

    Raises:
        RuntimeError: torch cannot read a CUDA generator state.
    """
    state: dict[str, Any] = {}
    if not _PYTHON.unchanged(before.python):
        state["python"] = _python_section(*random.getstate())
    if not _NUMPY.unchanged(before.numpy):
        np_state = np.random.get_state(legacy=True)
        assert isinstance(np_state, tuple)
        state["numpy"] = _numpy_section(np_state)
    cpu = torch.get_rng_state()
    if not torch.equal(cpu, before.torch_cpu):
        state["torch_cpu"] = cpu
    if before.torch_cuda is not None:
        cuda = list(torch.cuda.get_rng_state_all())
        if len(cuda) != len(before.torch_cuda) or any(
                not torch.equal(a, b) for a, b in zip(cuda, before.torch_cuda, strict=True)):
            state["torch_cuda"] = cuda
    if not state:
        return None
    state["format"] = RNG_STATE_FORMAT
    return state


def _cuda() -> bool:
    """``torch.cuda.is_available()``, asked once per process (it does not change while a process runs)."""
    if not _CUDA:
        _CUDA.append(torch.cuda.is_available())
    return _CUDA[0]


_CUDA: list[bool] = []


def _python_section(version: Any, internal: tuple[int, ...], gauss: Any) -> dict[str, Any]:
    return {"version": int(version), "state": _int64_array(internal),
            "gauss_next": None if gauss is None else float(gauss)}


def _numpy_section(np_state: tuple[Any, ...]) -> dict[str, Any]:
    """numpy's section from ``np.random.get_state(legacy=True)``; the probe learns the state read."""
    bit_generator, key, pos, has_gauss, cached_gaussian = np_state
    own_key = np.array(key, dtype=np.uint32, copy=True)
    _NUMPY.learn(own_key, int(pos), int(has_gauss), float(cached_gaussian))
    return {"bit_generator": str(bit_generator), "key": own_key, "pos": int(pos), "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian)}


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

            def restore_numpy() -> None:
                np.random.set_state(np_state)
                _NUMPY.learn(key, np_state[2], np_state[3], np_state[4])

            steps.append(restore_numpy)
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

_MT_STATE_BYTES = 624 * 4 + 4
"""A Mersenne Twister's state as both generators keep it: 624 ``uint32`` words and an ``int`` position."""


class _Probe:
    """Reads a generator's Mersenne Twister state as bytes where the generator keeps it (about 1 µs, against
    15-75 µs for its public API): numpy's through its bit generator's public ``ctypes.state_address``, Python's
    at the start of CPython's ``Random`` object, just after its object header.

    A probe only ever says "unchanged", and only once it was verified in this process: on a scratch generator, its
    bytes equal the public API's state before and after a draw, and, on the global generator, they equal it once.
    Where that fails (another layout, another Python), the public API is read before and after the call instead.

    numpy's legacy generator also caches a second gaussian (``has_gauss``), outside the bytes read; the probe
    knows it from the public API's last read (:meth:`learn`) while the twister bytes stay as they were then. One
    case escapes that: the host itself setting numpy's state (``np.random.set_state``) to the same twister words
    with another cached gaussian, just before a call that takes exactly that one gaussian and draws nothing else.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.address = 0  # 0: not bound yet; -1: unusable here
        self.owner: Any = None  # keeps the generator whose memory is read alive
        self.known: tuple[bytes, int, float] | None = None  # numpy: (bytes, has_gauss, gauss) last read publicly

    def _bind(self) -> None:
        try:
            if self.kind == "numpy":
                def locate(rs: Any) -> tuple[Any, int]:
                    bit_generator = rs._bit_generator
                    return bit_generator, int(bit_generator.ctypes.state_address)
                scratch: Any = np.random.RandomState(12345)
                owner, address = locate(scratch)
                ok = self._agrees(address, _numpy_bytes(scratch.get_state()))
                scratch.random_sample(700)  # over 624 draws: the words are regenerated and the position wraps
                ok = ok and self._agrees(address, _numpy_bytes(scratch.get_state()))
                owner, address = locate(np.random.get_state.__self__)  # type: ignore[attr-defined]
                ok = ok and self._agrees(address, _numpy_bytes(np.random.get_state()))
            else:
                inst = random.getstate.__self__  # type: ignore[attr-defined]
                if sys.implementation.name != "cpython" or type(inst).__basicsize__ < 16 + _MT_STATE_BYTES:
                    raise TypeError("not CPython's Random")
                rnd = random.Random(12345)
                ok = self._agrees(id(rnd) + 16, _python_bytes(rnd.getstate()))
                rnd.random()
                ok = ok and self._agrees(id(rnd) + 16, _python_bytes(rnd.getstate()))
                owner, address = inst, id(inst) + 16
                ok = ok and self._agrees(address, _python_bytes(inst.getstate()))
        except Exception as exc:  # noqa: BLE001 - any surprise: no probe, the public API every time
            logger.debug("skipweave: no fast RNG probe for %s here (%s: %s)", self.kind, type(exc).__name__, exc)
            ok = False
        if ok:
            self.owner, self.address = owner, address
        else:
            logger.debug("skipweave: no fast RNG probe for %s here; its state is recorded with every entry", self.kind)
            self.address = -1

    @staticmethod
    def _agrees(address: int, expected: bytes) -> bool:
        return ctypes.string_at(address, _MT_STATE_BYTES) == expected

    def _usable(self) -> bool:
        if self.address == 0:
            self._bind()
        return self.address > 0

    def _raw(self) -> bytes:
        return ctypes.string_at(self.address, _MT_STATE_BYTES)

    def mark(self) -> Any:
        """A token of the generator's state now, for :meth:`unchanged` after the call (``None``: not known, so it
        counts as changed)."""
        if self.kind == "python":
            return (self._raw(), self.owner.gauss_next) if self._usable() else random.getstate()
        if not self._usable():
            st = np.random.get_state(legacy=True)
            assert isinstance(st, tuple)
            return _numpy_bytes(st), int(st[3]), float(st[4])
        raw, known = self._raw(), self.known
        if known is None or known[0] != raw:  # drawn from since the public API last read it: read it now
            self._read_numpy()
            known = self.known
            if known is None or known[0] != raw:  # another thread drew meanwhile
                return None
        return known

    def unchanged(self, token: Any) -> bool:
        """Whether the generator is as :meth:`mark` saw it (``token``)."""
        if token is None:
            return False
        if self.kind == "python" or not self._usable():
            return bool(self.mark() == token)
        if self._raw() != token[0]:
            return False
        if token[1] == 0:  # no cached gaussian, and none can be cached without a draw from the twister
            return True
        self._read_numpy()  # one was cached: it may have been handed out without a draw
        return self.known == token

    def _read_numpy(self) -> tuple[Any, ...]:
        st = np.random.get_state(legacy=True)
        assert isinstance(st, tuple)
        self.learn(st[1], st[2], st[3], st[4])
        return st

    def learn(self, key: np.ndarray, pos: int, has_gauss: int, gauss: float) -> None:
        """numpy: the state just read or set through the public API (the bytes are taken from it, so a state
        another thread moved meanwhile is simply not known)."""
        if self.address > 0:
            raw = _numpy_bytes(("MT19937", key, pos))
            self.known = (raw, int(has_gauss), float(gauss)) if self._raw() == raw else None


def _numpy_bytes(state: Any) -> bytes:
    """numpy's ``mt19937_state`` bytes (``uint32 key[624]``, ``int pos``, native order) of a public state."""
    return np.asarray(state[1], dtype=np.uint32).tobytes() + np.int32(state[2]).tobytes()


def _python_bytes(state: tuple[Any, ...]) -> bytes:
    """CPython's ``RandomObject`` bytes after its header (``int index``, ``uint32 state[624]``) of a public state."""
    internal = state[1]
    return array.array("i", [internal[-1]]).tobytes() + array.array("I", internal[:-1]).tobytes()


_PYTHON = _Probe("python")
_NUMPY = _Probe("numpy")
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
