"""Capture and restore the global random number generator states (Python, numpy, torch CPU and CUDA).

Skipping a real call leaves the generators where they were, so everything after it (shuffles, dropout) would
diverge from the recorded run; so a record keeps the states the real call left behind and a replay restores them
(see docs/architecture.md). The captured state is a plain dict of ints, floats, strings, numpy arrays and tensors,
so the codec stores it without pickle.

A record keeps only what its call changed: :func:`rng_marks` is taken right before the real call and
:func:`rng_changes` right after, and only the generators the call changed go into the entry. A replay restores
those, to the state the call left them in, and leaves the others as the host has them, as the real call would have.
Most calls leave most generators alone; showing Python's and numpy's unchanged reads their states' bytes where the
generators keep them (:class:`_Probe`, about 1 µs each), because their public API (``random.getstate``,
``np.random.get_state``) costs a recorded call more than the ``small.record`` row of ``bench/run.py`` can pay
(numbers in :class:`_Probe`). Where a probe cannot be verified here, the public API is read before and after, with
the same outcome. The state recorded always comes from the public API (``random.getstate``,
``np.random.get_state``, ``torch.get_rng_state``).
"""

from __future__ import annotations

import array
import ctypes
import functools
import logging
import random
import struct
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

    Costs a few microseconds: Python's and numpy's states are read as bytes where the generators keep them, when
    that was verified here (see :class:`_Probe`); torch's state is read by ``torch.get_rng_state`` (about 5 KiB).

    Raises:
        RuntimeError: torch cannot read a CUDA generator state (e.g. a broken CUDA setup).
    """
    return RngMarks(_PYTHON.mark(), _NUMPY.mark(), _torch_bytes(torch.get_rng_state()),
                    [_torch_bytes(s) for s in torch.cuda.get_rng_state_all()] if _cuda() else None)


def rng_changes(before: RngMarks) -> dict[str, Any] | None:
    """The states of the generators a call changed, taken right after it (``before``: :func:`rng_marks` right
    before it), in :func:`capture_rng_state`'s form with the unchanged generators left out; ``None`` when the call
    changed none.

    A generator is left out only when it is as it was: torch's state compares equal byte for byte, and so do
    Python's and numpy's whole states (their Mersenne Twister and their cached gaussian, see :class:`_Probe`).

    Raises:
        RuntimeError: torch cannot read a CUDA generator state.
    """
    state: dict[str, Any] = {}
    if not _PYTHON.unchanged(before.python):
        state["python"] = _python_section(*random.getstate())
    if not _NUMPY.unchanged(before.numpy) and _numpy_legacy():
        state["numpy"] = _numpy_section(np.random.get_state(legacy=True))
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

_MT_STATE_BYTES = 624 * 4 + 4
"""A Mersenne Twister's state as both generators keep it: 624 ``uint32`` words and an ``int`` position."""


class _Probe:
    """Reads a generator's whole state as bytes where the generator keeps it (about 1 µs, against 15-95 µs for
    its public API), to compare before and after a call.

    Why it stays: every recorded call marks the generators before and after (:func:`rng_marks`,
    :func:`rng_changes`). Measured 2026-12-03 on the 2-core machine under load from other jobs, interleaved in one
    process: 15-30 µs per recorded call with the probes, 170-470 µs through ``random.getstate`` and
    ``np.random.get_state``. In ``python bench/run.py --only small`` (probe and public API alternating, two runs
    each), the ``small.record`` row (1 KB entries, target <= 0.3 ms per entry; 0.200 ms with the probes on an idle
    machine, docs/performance.md) gave 0.63 and 0.47 ms with the probes against 2.35 and 1.50 ms with the public
    API: the public API alone costs more than the target leaves.

    - Python's ``random``: CPython's ``Random`` object holds its Mersenne Twister (``int index``, ``uint32
      state[624]``) right after its object header; its cached gaussian is the public ``gauss_next`` attribute.
    - numpy's legacy global generator: its bit generator's twister (``uint32 key[624]``, ``int pos``) at the
      public ``ctypes.state_address``; its cached gaussian (``has_gauss``, ``gauss``), which numpy gives only
      through the slow ``get_state``, inside the ``RandomState`` object, at offsets found on a scratch one.

    A probe is used only once verified in this process: on a scratch generator, the bytes it reads equal the
    public API's state over several distinct states (draws, cached gaussians set with ``set_state``), and on the
    global generator they equal it once. Where that fails (another layout, another Python, a global generator
    that is not a Mersenne Twister), the public API is read before and after the call instead, with the same
    outcome. A probe follows the generator the public functions use (``random.getstate``'s instance, numpy's
    global bit generator): one replaced (``importlib.reload(random)``, ``np.random.set_bit_generator``) is bound
    and verified again.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        # what is read, as one tuple (replaced whole, so a thread reads one consistent binding): None while not
        # bound yet, () where unusable, else (generator object, address, numpy: gauss addresses, its RandomState)
        self.bound: tuple[Any, ...] | None = None

    @property
    def address(self) -> int:
        """The address read: 0 not bound yet, -1 unusable here."""
        bound = self.bound
        return 0 if bound is None else (bound[1] if bound else -1)

    @property
    def gauss_at(self) -> tuple[int, int]:
        bound = self.bound
        return bound[2] if bound else (0, 0)

    def _current(self, bound: tuple[Any, ...]) -> bool:
        """Whether the generator read is still the one the public functions use."""
        if self.kind == "python":
            return random.getstate.__self__ is bound[0]  # type: ignore[attr-defined]
        rs = np.random.get_state.__self__  # type: ignore[attr-defined]
        return rs is bound[3] and getattr(rs, "_bit_generator", None) is bound[0]

    def _bind(self) -> tuple[Any, ...]:
        try:
            if self.kind == "numpy":
                offsets = _gauss_offsets()
                rs = np.random.get_state.__self__  # type: ignore[attr-defined]
                if offsets is None or type(rs) is not np.random.RandomState:
                    raise TypeError("numpy's global generator is not a verified RandomState")
                owner = rs._bit_generator
                if type(owner) is not np.random.MT19937:
                    raise TypeError(f"numpy's global bit generator is a {type(owner).__name__}")
                address = int(owner.ctypes.state_address)
                gauss_at = (id(rs) + offsets[0], id(rs) + offsets[1])
                ok = _numpy_probe_bytes(address, gauss_at) == _numpy_bytes(np.random.get_state())
                bound: tuple[Any, ...] = (owner, address, gauss_at, rs)
            else:
                owner = random.getstate.__self__  # type: ignore[attr-defined]
                if sys.implementation.name != "cpython" or type(owner).__basicsize__ < 16 + _MT_STATE_BYTES:
                    raise TypeError("not CPython's Random")
                rnd = random.Random(12345)
                ok = ctypes.string_at(id(rnd) + 16, _MT_STATE_BYTES) == _python_bytes(rnd.getstate())
                rnd.random()
                ok = ok and ctypes.string_at(id(rnd) + 16, _MT_STATE_BYTES) == _python_bytes(rnd.getstate())
                address = id(owner) + 16
                ok = ok and ctypes.string_at(address, _MT_STATE_BYTES) == _python_bytes(owner.getstate())
                bound = (owner, address, (0, 0), None)
        except Exception as exc:  # noqa: BLE001 - any surprise: no probe, the public API every time
            logger.debug("skipweave: no fast RNG probe for %s here (%s: %s)", self.kind, type(exc).__name__, exc)
            ok = False
        if not ok:
            logger.debug("skipweave: no fast RNG probe for %s here: its state is read through the public API before "
                         "and after each recorded call", self.kind)
            bound = ()
        self.bound = bound
        return bound

    def _binding(self) -> tuple[Any, ...]:
        """The binding to read through now (bound again when another generator object is in use), ``()`` if none."""
        bound = self.bound
        if bound and not self._current(bound):
            bound = None  # another generator object is in use now: bind to it
        return self._bind() if bound is None else bound

    def mark(self) -> Any:
        """A token of the generator's state now; equal tokens are equal states (see :meth:`unchanged`)."""
        bound = self._binding()  # a local: the object read stays alive and its addresses consistent meanwhile
        if self.kind == "python":
            if bound:
                return ctypes.string_at(bound[1], _MT_STATE_BYTES), bound[0].gauss_next
            return random.getstate()
        if bound:
            return _numpy_probe_bytes(bound[1], bound[2])
        if not _numpy_legacy():
            return "not recorded"  # (a PCG64, say): never recorded, so never changed
        return _numpy_bytes(np.random.get_state(legacy=True))

    def unchanged(self, token: Any) -> bool:
        """Whether the generator is as :meth:`mark` saw it (``token``)."""
        return token is not None and bool(self.mark() == token)


def _numpy_probe_bytes(address: int, gauss_at: tuple[int, int]) -> bytes:
    return (ctypes.string_at(address, _MT_STATE_BYTES) + ctypes.string_at(gauss_at[0], 4)
            + ctypes.string_at(gauss_at[1], 8))


@functools.cache
def _gauss_offsets() -> tuple[int, int] | None:
    """Where a ``RandomState`` keeps ``has_gauss`` (a C ``int``) and ``gauss`` (a ``double``), as offsets into the
    object: the one pair of offsets that holds them over four distinct states of a scratch generator (and whose
    twister bytes, at ``ctypes.state_address``, match too); ``None`` when no single pair does. Found once per
    process."""
    found: tuple[int, int] | None = None
    try:
        rs: Any = np.random.RandomState(12345)
        size = type(rs).__basicsize__
        address = int(rs._bit_generator.ctypes.state_address)
        candidates: set[tuple[int, int]] | None = None
        for draws, has_gauss, gauss in ((0, 1, 0.123456789), (700, 0, -2.5), (5, 1, 3.75e10), (1, 0, 0.0)):
            rs.random_sample(draws)
            state = rs.get_state()
            rs.set_state((state[0], state[1], state[2], has_gauss, gauss))
            raw = ctypes.string_at(id(rs), size)
            if ctypes.string_at(address, _MT_STATE_BYTES) != _numpy_bytes(rs.get_state())[:_MT_STATE_BYTES]:
                raise TypeError("the twister bytes do not match")
            ints = {o for o in range(0, size - 3, 4) if struct.unpack_from("=i", raw, o)[0] == has_gauss}
            doubles = {o for o in range(0, size - 7, 4) if struct.unpack_from("=d", raw, o)[0] == gauss}
            pairs = {(i, d) for i in ints for d in doubles if 4 <= d - i <= 16}
            candidates = pairs if candidates is None else candidates & pairs
        if candidates is not None and len(candidates) == 1:
            found = candidates.pop()
    except Exception as exc:  # noqa: BLE001 - no probe: the public API
        logger.debug("skipweave: numpy's cached gaussian could not be located (%s: %s)", type(exc).__name__, exc)
    return found


def _numpy_bytes(state: Any) -> bytes:
    """The bytes :func:`_numpy_probe_bytes` reads, of a public legacy state ``(name, key, pos, has_gauss, gauss)``:
    numpy's ``mt19937_state`` (``uint32 key[624]``, ``int pos``), then ``int has_gauss`` and ``double gauss``, in
    native order."""
    return (np.asarray(state[1], dtype=np.uint32).tobytes() + np.int32(state[2]).tobytes()
            + np.int32(state[3]).tobytes() + np.float64(state[4]).tobytes())


def _python_bytes(state: tuple[Any, ...]) -> bytes:
    """CPython's ``RandomObject`` bytes after its header (``int index``, ``uint32 state[624]``) of a public state."""
    internal = state[1]
    return array.array("i", [internal[-1]]).tobytes() + array.array("I", internal[:-1]).tobytes()


_PYTHON = _Probe("python")
_NUMPY = _Probe("numpy")
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
