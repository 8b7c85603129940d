"""Stable fingerprints of a call's inputs, by one of two rules (the manifest's ``fingerprint_rule``).

- ``signature`` (:func:`signature_fingerprint`, what format 2 records): the call's arguments are first bound to the
  target's signature (:mod:`skipweave.weaving.binding`, built once per target at weave time), so ``gen(b, 3)``,
  ``gen(b, step=3)`` and ``gen(batch=b, step=3)`` are one fingerprint; a parameter left out, or passed equal to a
  plain default (``None``, bool, int, float, str), is not hashed. The bound arguments are hashed as a mapping from
  parameter name to value in sorted-name order, ``*args`` as the sequence of the extra positional arguments and
  ``**kwargs`` as the mapping of the extra keyword arguments (sorted by keyword), each under its own name.
- ``arguments`` (:func:`fingerprint`, format 1's, and the fallback for a target without a readable signature or a
  call that does not fit it): positional arguments by index and keyword arguments by name, as passed.

The two rules tag their streams apart and never give one digest; an entry is always compared with the live call's
fingerprint taken by the entry's own rule (:meth:`skipweave.weaving.calls.CallLedger.fingerprint`), so format-1
entries keep matching the call form they were recorded with.

Both hash values with xxh3-128 into a hex digest that is identical across processes and machines (no ``id()``, no
``hash()``, no memory addresses). They hash:

* tensors by dtype, shape and raw bytes (device and ``requires_grad`` are NOT part of the digest, so the
  same values on CPU and GPU match); contiguous CPU tensors are hashed in place without a copy;
* numpy arrays by dtype, shape and bytes; object arrays element-wise; numpy scalars by dtype and bytes;
* ``None``, ``bool``, ``int``, ``float`` (bit pattern: ``0.0 != -0.0``), ``complex``, ``str``, ``bytes``;
* dicts by their items regardless of insertion order (like ``==``); lists and tuples in order (a list and a
  tuple differ); sets regardless of order;
* dataclasses by class and fields; host objects (:mod:`skipweave.store.hosts`) as their host type says: a
  DataProto-like object by class, ``batch``, ``non_tensor_batch`` and ``meta_info``, a TensorDict by batch
  size and items; enum members by class and name;
* functions/classes/modules by qualified name; other objects with a ``__dict__`` by class name plus the
  attributes whose values the codec supports natively (others are skipped);
* anything else by type name plus ``repr`` when the repr carries no memory address (else type name only).

Parts of the inputs can be excluded with ``ignore`` paths (or only some hashed, ``include``), see :func:`fingerprint`.
A path's first component keeps its meaning under both rules: a positional index or a keyword name; under
``signature`` it names the parameter however the call passes it (:func:`signature_fingerprint`), so the paths of the
shipped profiles (``*.batch.input_ids``, ``0.meta_info.seed``) select the same parts.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import re
import struct
import types
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import xxhash

from skipweave.store.classes import class_ref
from skipweave.store.hosts import HOST_TYPES, FingerprintParts

if TYPE_CHECKING:
    from skipweave.weaving.binding import Binding

logger = logging.getLogger(__name__)

__all__ = ["fingerprint", "signature_fingerprint"]

_ADDRESS_RE = re.compile(r" at 0x[0-9a-fA-F]+")
_Pattern = tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class _Sel:
    """Which parts below a path are hashed: ``ignore`` patterns still alive there, and ``keep`` the ``include``
    patterns still alive (``None``: everything below is included). ``found`` is shared by every selection of one
    call: its one item turns True when an include pattern named a part of the inputs."""

    ignore: tuple[_Pattern, ...] = ()
    keep: tuple[_Pattern, ...] | None = None
    found: list[bool] = dataclasses.field(default_factory=lambda: [False], compare=False)


_ALL = _Sel()


class _Unsupported(Exception):
    """Raised in strict mode for values the codec could not encode without pickle."""


def _u64(n: int) -> bytes:
    return n.to_bytes(8, "little", signed=False)


class _Hasher:
    def __init__(self, h: Any) -> None:
        self.h = h
        self.stack: set[int] = set()

    # -- primitives of the byte stream: every item is tag + length + payload, so the stream is unambiguous --
    def put(self, tag: bytes, payload: bytes = b"") -> None:
        self.h.update(tag + _u64(len(payload)) + payload)

    def put_str(self, tag: bytes, s: str) -> None:
        self.put(tag, s.encode("utf-8", "surrogatepass"))

    def put_buffer(self, tag: bytes, buf: Any, nbytes: int) -> None:
        self.h.update(tag + _u64(nbytes))
        if nbytes:
            self.h.update(buf)

    # -- dispatch -------------------------------------------------------------------------------------------
    def feed(self, obj: Any, path: tuple[str, ...], pats: _Sel, strict: bool) -> None:
        """Hash ``obj``; ``pats`` are the ignore patterns whose prefix matches ``path`` so far."""
        if obj is None:
            self.put(b"N")
            return
        tp = type(obj)
        if tp is bool:
            self.put(b"b", b"\x01" if obj else b"\x00")
        elif tp is int:
            self.put_str(b"i", str(obj))
        elif tp is float:
            self.put(b"f", struct.pack("<d", obj))
        elif tp is complex:
            self.put(b"c", struct.pack("<dd", obj.real, obj.imag))
        elif tp is str:
            self.put_str(b"s", obj)
        elif tp is bytes or tp is bytearray:
            self.put(b"y", bytes(obj))
        elif isinstance(obj, torch.Tensor):
            self._tensor(obj, strict)
        elif tp is np.ndarray:
            self._ndarray(obj, path, pats, strict)
        elif isinstance(obj, np.generic):
            self.put_str(b"g", obj.dtype.str)
            self.put(b"G", np.asarray(obj).tobytes())
        elif isinstance(obj, enum.Enum):
            self.put_str(b"e", class_ref(type(obj)))
            self.put_str(b"E", str(obj.name))
        elif tp is torch.Size or tp is torch.dtype or tp is torch.device:
            self.put_str(b"T" + tp.__name__.encode(), str(obj))
        elif isinstance(obj, (dict, list, tuple, set, frozenset)) and not hasattr(obj, "__dataclass_fields__"):
            self._guard(obj, path, pats, strict, self._container)
        elif (parts := _host_parts(obj)) is not None:
            self._guard(parts, path, pats, strict, self._host, oid=id(obj))
        elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            self._guard(obj, path, pats, strict, self._dataclass)
        elif isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType, types.MethodType)):
            if strict:
                raise _Unsupported
            self.put_str(b"F", f"{getattr(obj, '__module__', '')}:{getattr(obj, '__qualname__', repr(obj))}")
        elif isinstance(obj, types.ModuleType):
            if strict:
                raise _Unsupported
            self.put_str(b"M", obj.__name__)
        elif hasattr(obj, "__dict__"):
            if strict:
                raise _Unsupported
            self._guard(obj, path, pats, strict, self._object)
        else:
            if strict:
                raise _Unsupported
            self._opaque(obj)

    def _guard(self, obj: Any, path: tuple[str, ...], pats: _Sel, strict: bool, fn: Any,
               oid: int | None = None) -> None:
        """``fn(obj, ...)`` unless the object (``oid``, default ``id(obj)``) is already being hashed."""
        if oid is None:
            oid = id(obj)
        if oid in self.stack:
            self.put(b"@")  # reference cycle: hash a marker, stays deterministic
            return
        self.stack.add(oid)
        try:
            fn(obj, path, pats, strict)
        finally:
            self.stack.discard(oid)

    def child(self, comp: str, value: Any, path: tuple[str, ...], pats: _Sel, strict: bool) -> bool:
        """Hash ``value`` at ``path + (comp,)`` unless ignored; return False if it was ignored."""
        sub = _advance(pats, len(path), comp)
        if sub is None:
            return False
        self.feed(value, path + (comp,), sub, strict)
        return True

    # -- leaves ----------------------------------------------------------------------------------------
    def _tensor(self, t: torch.Tensor, strict: bool) -> None:
        if t.layout != torch.strided or t.device.type == "meta":
            if strict:
                raise _Unsupported
            self.put_str(b"t?", f"{t.layout}:{t.dtype}:{list(t.shape)}:{t.device.type}")
            if t.device.type != "meta":
                self._tensor(t.to_dense(), strict)
            return
        x = t.detach()
        if x.device.type != "cpu":
            x = x.cpu()
        x = x.resolve_conj().resolve_neg()
        if not x.is_contiguous():
            x = x.contiguous()
        self.put_str(b"t", str(x.dtype))
        self.put_str(b"S", ",".join(str(d) for d in x.shape))
        raw = x.reshape(-1).view(torch.uint8).numpy()
        self.put_buffer(b"B", raw, raw.nbytes)

    def _ndarray(self, arr: np.ndarray, path: tuple[str, ...], pats: _Sel, strict: bool) -> None:
        self.put_str(b"a", arr.dtype.str)
        self.put_str(b"S", ",".join(str(d) for d in arr.shape))
        if arr.dtype.hasobject:
            if arr.dtype.kind != "O":
                self.put(b"A?", repr(arr.dtype.descr).encode())
                self.put_str(b"A", repr(arr.tolist()))
                return
            self.put(b"(")
            for el in arr.flat:
                self.feed(el, path, _ALL, strict)
            self.put(b")")
            return
        if arr.dtype.fields is not None:
            self.put_str(b"A?", repr(arr.dtype.descr))
        c = np.ascontiguousarray(arr)
        if c.dtype.itemsize == 0 or c.size == 0:
            self.put_buffer(b"B", b"", 0)
            return
        raw = c.reshape(-1).view(np.uint8)
        self.put_buffer(b"B", raw, raw.nbytes)

    def _opaque(self, obj: Any) -> None:
        name = class_ref(type(obj))
        try:
            r = repr(obj)
        except Exception:
            r = None
        if r is None or _ADDRESS_RE.search(r):
            self.put_str(b"o", name)
        else:
            self.put_str(b"O", name)
            self.put_str(b"R", r)

    # -- containers ------------------------------------------------------------------------------------
    def _container(self, obj: Any, path: tuple[str, ...], pats: _Sel, strict: bool) -> None:
        if isinstance(obj, dict):
            self.put_str(b"{", class_ref(type(obj)))
            entries = []
            for k, v in obj.items():
                entries.append((_digest_of(k), k, v))
            entries.sort(key=lambda e: e[0])
            for kd, k, v in entries:
                sub = _advance(pats, len(path), _comp(k))
                if sub is None:
                    continue
                self.put(b"k", kd)
                self.feed(v, path + (_comp(k),), sub, strict)
            self.put(b"}")
        elif isinstance(obj, (set, frozenset)):
            self.put_str(b"<", class_ref(type(obj)))
            for d in sorted(_digest_of(v) for v in obj):
                self.put(b"m", d)
            self.put(b">")
        else:
            self.put_str(b"[", class_ref(type(obj)))
            fields = getattr(type(obj), "_fields", None) if isinstance(obj, tuple) else None
            for i, v in enumerate(obj):
                comp = fields[i] if fields is not None and i < len(fields) else str(i)
                if self.child(comp, v, path, pats, strict):
                    self.put_str(b"#", comp)
            self.put(b"]")

    def _dataclass(self, obj: Any, path: tuple[str, ...], pats: _Sel, strict: bool) -> None:
        self.put_str(b"D", class_ref(type(obj)))
        for f in dataclasses.fields(obj):
            if self.child(f.name, getattr(obj, f.name), path, pats, strict):
                self.put_str(b"#", f.name)
        self.put(b"d")

    def _host(self, host: FingerprintParts, path: tuple[str, ...], pats: _Sel, strict: bool) -> None:
        self.put_str(host.opening, host.header)
        for name, value in host.parts:
            if self.child(name, value, path, pats, strict):
                self.put_str(b"#", name)
        self.put(host.closing)

    def _object(self, obj: Any, path: tuple[str, ...], pats: _Sel, strict: bool) -> None:
        self.put_str(b"J", class_ref(type(obj)))
        attrs = vars(obj)
        for name in sorted(a for a in attrs if isinstance(a, str)):
            sub = _advance(pats, len(path), name)
            if sub is None:
                continue
            h = _Hasher(xxhash.xxh3_128())
            h.stack = self.stack
            try:
                h.feed(attrs[name], path + (name,), sub, True)
            except _Unsupported:
                logger.debug("fingerprint: skipping attribute %s of %s", name, class_ref(type(obj)))
                continue
            self.put_str(b"#", name)
            self.put(b"v", h.h.digest())
        self.put(b"j")


def _host_parts(obj: Any) -> FingerprintParts | None:
    """How the first host type that hashes its objects and matches ``obj`` hashes it, or None."""
    for host in HOST_TYPES.items():
        if host.fingerprint is not None and host.matches(obj):
            return host.fingerprint(obj)
    return None


def _comp(key: Any) -> str:
    """The ignore-path component naming a dict key."""
    return key if isinstance(key, str) else str(key)


def _digest_of(obj: Any) -> bytes:
    h = _Hasher(xxhash.xxh3_128())
    h.feed(obj, (), _ALL, False)
    return bytes(h.h.digest())


def _advance(sel: _Sel, depth: int, comp: str, alias: str | None = None) -> _Sel | None:
    """What is hashed below ``comp`` at ``depth``; None if it is left out (an ignore pattern matches it completely,
    or include patterns exist and none leads into it). A pattern component matching ``alias`` matches too (a bound
    parameter is named by its name and by its position)."""
    if not sel.ignore and sel.keep is None:
        return sel
    ignore = []
    for p in sel.ignore:
        if _matches(p[depth], comp) or (alias is not None and _matches(p[depth], alias)):
            if len(p) == depth + 1:
                return None
            ignore.append(p)
    keep: tuple[_Pattern, ...] | None = None
    if sel.keep is not None:
        alive: list[_Pattern] = []
        for p in sel.keep:
            if _matches(p[depth], comp) or (alias is not None and _matches(p[depth], alias)):
                if len(p) == depth + 1:
                    alive = []
                    sel.found[0] = True
                    break  # included whole
                alive.append(p)
        else:
            if not alive:
                return None
        keep = tuple(alive) or None
    return _Sel(tuple(ignore), keep, sel.found)


def _matches(part: str, comp: str) -> bool:
    """An ignore/include path component against a path component: ``*`` any, ``prefix*`` any beginning so."""
    if part == comp or part == "*":
        return True
    return part[-1] == "*" and comp.startswith(part[:-1])


def _patterns(paths: Sequence[str], what: str) -> tuple[_Pattern, ...]:
    pats = []
    for p in paths:
        parts = tuple(p.split("."))
        if not p or any(not c for c in parts):
            raise ValueError(f"invalid {what} path {p!r}: expected dotted components like '0.meta_info.timing'")
        pats.append(parts)
    return tuple(pats)


def fingerprint(args: tuple[Any, ...], kwargs: Mapping[str, Any], *, ignore: Sequence[str] = (),
                include: Sequence[str] | None = None, on_unmatched: Callable[[], None] | None = None) -> str:
    """Return a stable hex digest (xxh3-128, 32 hex characters) of a call's inputs.

    The digest does not depend on the process (hash seed, memory addresses), on dict insertion order, on
    keyword order, or on the device of tensors; it does depend on dtypes, shapes and exact bit patterns.

    Args:
        args: positional arguments of the call.
        kwargs: keyword arguments of the call.
        ignore: dotted paths to leave out, relative to the call. The first component is an argument index
            (``"0"``) or a keyword name, later components are attribute names, dataclass fields,
            TensorDict keys, dict keys (non-str keys by ``str(key)``), sequence indices or namedtuple
            field names; ``"*"`` matches any single component and ``"prefix*"`` any that begins with ``prefix``
            (``"*.meta_info.skipweave*"``), e.g. ``"0.meta_info.timing"``,
            ``"*.meta_info.global_steps"``, ``"prompts.non_tensor_batch.uid"``. An ignored part contributes
            nothing (an ignored dict entry hashes as if the key were absent). Elements of object arrays
            and set members cannot be addressed. Components cannot contain dots.
        include: dotted paths (written as ``ignore``'s) of the only parts to hash, or None for all: a part is
            hashed when an include path names it or a part around it, and no ignore path names it or a part
            around it. For a phase that reads a few fields of a batch other phases add to (a reference
            log-prob reads the tokens, not the rewards unioned into the batch before it). When no include path
            names any part of this call's inputs, every part is hashed instead (a digest of nothing would match
            any inputs) and ``on_unmatched`` is called.
        on_unmatched: called (no arguments) when ``include`` named no part of the inputs.

    Returns:
        The lowercase hex digest.

    Raises:
        ValueError: an ignore or include path is empty or has an empty component.
    """
    return _selected(lambda sel: _call_digest(args, kwargs, sel), ignore, include, on_unmatched)


def _selected(digest: Callable[[_Sel], str], ignore: Sequence[str], include: Sequence[str] | None,
              on_unmatched: Callable[[], None] | None) -> str:
    """``digest`` of the parts ``ignore``/``include`` select; of everything but ``ignore`` when ``include`` named no
    part of the inputs (then ``on_unmatched`` is called): a digest of nothing would match any call."""
    pats = _Sel(_patterns(ignore, "ignore"), None if include is None else _patterns(include, "include"))
    out = digest(pats)
    if pats.keep is not None and not pats.found[0]:
        if on_unmatched is not None:
            on_unmatched()
        out = digest(_Sel(pats.ignore))
    return out


def signature_fingerprint(binding: Binding, args: tuple[Any, ...], kwargs: Mapping[str, Any], *,
                          ignore: Sequence[str] = (), include: Sequence[str] | None = None,
                          on_unmatched: Callable[[], None] | None = None) -> str | None:
    """Return the digest of a call's inputs under the ``signature`` rule: its arguments bound to the target's
    parameters (:meth:`Binding.bind <skipweave.weaving.binding.Binding.bind>`), so every form of one call (by
    position, by keyword, mixed; a parameter left out or passed equal to its plain default) has one digest.

    The bound arguments are hashed as a mapping from parameter name to value, in the order of their sorted names;
    ``*args`` under its name as the sequence of the extra positional arguments, ``**kwargs`` under its name as the
    mapping of the extra keyword arguments, sorted by keyword. The stream is tagged apart from the ``arguments``
    rule's (:func:`fingerprint`), so the two rules never give one digest.

    ``ignore`` and ``include`` paths mean what they mean under the ``arguments`` rule, whatever form the call takes:
    their first component names a parameter by its name or, for a positional parameter, by its position (``"0"``
    is the first parameter after ``self``, passed by position or by keyword); a position past the named ones names
    an extra positional argument (an element of ``*args``), and a name that is no parameter names an extra keyword
    argument (a key of ``**kwargs``).

    Args:
        binding: the target's binding (:func:`~skipweave.weaving.binding.binding_of`, built at weave time).
        args, kwargs, ignore, include, on_unmatched: as :func:`fingerprint`'s.

    Returns:
        The lowercase hex digest (xxh3-128, 32 hex characters), or ``None`` when the call does not bind to the
        signature (it will raise ``TypeError`` itself): the caller takes the ``arguments`` rule instead.

    Raises:
        ValueError: an ignore or include path is empty or has an empty component.
    """
    bound = binding.bind(args, kwargs)
    if bound is None:
        return None
    return _selected(lambda sel: _bound_digest(bound, binding, sel), ignore, include, on_unmatched)


def _bound_digest(bound: Mapping[str, Any], binding: Binding, pats: _Sel) -> str:
    h = _Hasher(xxhash.xxh3_128())
    h.put(b"call-v2")
    index = binding.index
    for name in binding.order:
        if name not in bound:
            continue
        value = bound[name]
        if name == binding.var_positional:  # extra positional arguments, named by their position in the call
            first = len(binding.positional)
            h.put_str(b"V", name)
            for j, v in enumerate(value):
                comp = str(first + j)
                sub = _advance(pats, 0, comp)
                if sub is not None:
                    h.feed(v, (comp,), sub, False)
                    h.put_str(b"#", str(j))
            h.put(b"]")
        elif name == binding.var_keyword:  # extra keyword arguments, named by their keyword
            h.put_str(b"W", name)
            for key in sorted(value):
                sub = _advance(pats, 0, key)
                if sub is not None:
                    h.feed(value[key], (key,), sub, False)
                    h.put_str(b"=", key)
            h.put(b"}")
        else:
            sub = _advance(pats, 0, name, index.get(name))
            if sub is not None:
                h.feed(value, (name,), sub, False)
                h.put_str(b"=", name)
    return str(h.h.hexdigest())


def _call_digest(args: tuple[Any, ...], kwargs: Mapping[str, Any], pats: _Sel) -> str:
    h = _Hasher(xxhash.xxh3_128())
    h.put(b"call-v1")
    for i, a in enumerate(args):
        if h.child(str(i), a, (), pats, False):
            h.put_str(b"#", str(i))
    h.put(b";")
    for name in sorted(kwargs):
        if h.child(name, kwargs[name], (), pats, False):
            h.put_str(b"=", name)
    return str(h.h.hexdigest())
