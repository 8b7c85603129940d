"""A safe codec turning rollout results into a JSON skeleton plus a flat dict of tensors.

``encode`` walks an object and produces an :class:`Encoded` value:

* ``tree`` -- a JSON-serialisable dict (``json.dumps`` works on it, no NaN/Infinity literals) of the form
  ``{"codec_version": 1 or 2, "root": <node>}`` (see *Versions* below). Every node is a dict with a short
  type tag ``"t"`` (``"tensor"``, ``"ndarray"``, ``"dict"``, ``"list"``, ``"dataproto"``, ...).
* ``tensors`` -- a flat ``name -> torch.Tensor`` dict (names ``"t0"``, ``"t1"``, ...), every tensor
  contiguous, on CPU and not sharing storage with another entry, so it can be handed to
  ``safetensors.torch.save_file`` directly.

``decode`` inverts it. The round trip is exact for the supported types (type, dtype, shape, values, dict key
order, tuple vs list). Nothing is pickled unless ``allow_pickle=True`` is passed to both functions, and
decoding constructs only the classes *Decoding constructs* below allows.

Supported values
----------------
* ``None``, ``bool``, ``int`` (any size), ``float`` (incl. nan, +-inf, -0.0), ``complex``, ``str``, ``bytes``,
  ``bytearray``;
* ``dict`` (keys of any supported hashable type, key types and order kept), ``collections.OrderedDict``,
  ``list``, ``tuple``, namedtuples, ``set``, ``frozenset``;
* ``torch.Tensor`` of any strided dtype (CPU or accelerator; the device string is recorded and restored when
  available, otherwise the tensor is restored on CPU with a warning logged once per device);
  ``requires_grad`` is NOT preserved, tensor subclasses (e.g. ``nn.Parameter``) decode as plain tensors,
  and tensors that were the same Python object decode as one shared tensor;
* ``torch.Size``, ``torch.dtype``, ``torch.device``;
* ``numpy.ndarray`` (exact type only) of numeric, bool, datetime, string (``U``/``S``) and object dtype,
  and numpy scalars (``np.float32(1.5)`` ...). Object arrays take one of three forms (see below);
* dataclass instances and enum members of module-level classes (see *Decoding constructs* for what a replay
  accepts);
* objects shaped like verl's ``DataProto`` (attributes ``batch``, ``non_tensor_batch``, ``meta_info``), with
  ``batch`` being ``None``, a dict or a ``tensordict.TensorDict``; a replay rebuilds them only for approved
  classes (verl's ``DataProto``, classes registered with :func:`skipweave.store.classes.register`, trusted
  refs). Encoding warns once per class it records that a replay in this process would refuse.

Anything else is pickled when ``allow_pickle=True`` (the bytes go into ``tensors`` as a uint8 tensor) and
refused with :class:`PickleRefused` otherwise.

Decoding does not copy tensor data: decoded tensors and numeric arrays may share memory with the entries of
``tensors`` passed in.

Decoding constructs
-------------------
A tree is untrusted input (a dump dir on shared storage, copied from another cluster): decoding imports no
module and runs no code a tree names. The ``cls`` of ``enum``, ``namedtuple``, ``dataclass``, ``dataproto``,
``tensordict`` and ``nontensordata`` nodes is looked up by :func:`skipweave.store.classes.resolve`: the module
must already be imported (refs listed in ``decode(..., trusted=...)``, the user's
``skip.<role>.trusted_classes``, are the only ones imported), the qualname is walked statically, and the class
must be of the node's kind -- a dataclass or namedtuple defining no ``__del__`` (data only), an Enum, or for
DataProto-like and tensordict nodes an approved class (registered in :mod:`skipweave.store.classes`: verl's
``DataProto`` and tensordict's classes are); a trusted ref is approved for any kind and skips the data-only
rule. Then:

* dataclasses are built with ``object.__new__`` and ``object.__setattr__`` (no ``__new__``/``__init__``/
  ``__post_init__``/``__setattr__`` runs), and the node must list exactly the class's
  ``dataclasses.fields`` -- a renamed, missing or extra field is a :class:`CodecError`;
* namedtuples are built with ``tuple.__new__``; the node's keys must be the class's ``_fields``;
* enum members are looked up in the class's member map (a ``Flag`` combination goes through the enum's
  lookup, as at recording);
* DataProto-like objects are built with ``object.__new__``; ``batch``/``non_tensor_batch``/``meta_info`` are
  set, and recorded extra attributes only when their name is an identifier not starting with ``"__"`` (no
  ``__class__``/``__dict__`` swap) that the class does not define as a data descriptor (no property setter
  runs); encoding leaves such attributes out, as it does values it cannot encode natively;
* TensorDicts are rebuilt through tensordict's own constructors (plain ``TensorDict``, or a lazy stack whose
  parts must be tensordicts), ``NonTensorData`` likewise.

Other crafted inputs are refused as :class:`CodecError` too: numpy dtypes holding Python objects in the
raw-bytes and numpy-scalar forms, shapes that are not lists of non-negative ints, an object or string array
whose item count does not match its shape (checked before allocating), a string dtype padded to an absurd
width, torch dtype names that are not dtypes (looked up without torch's lazy submodule imports) and nesting
beyond the recursion limit. Any other exception inside decoding surfaces as a :class:`CodecError` naming the
node's path.

Object arrays
-------------
verl's ``non_tensor_batch`` is a dict of object arrays whose elements are nearly always strings (``uid``,
``data_source``) or small JSON-like values (``reward_model``, ``extra_info`` dicts, ``raw_prompt`` lists of
chat messages). One node per element made the tree large and slow to parse and decode, so a non-empty
object array is stored in the first of these forms that holds it exactly:

* ``"strs": [...]`` -- every element is exactly a ``str`` (not a subclass): the strings as one JSON list;
* ``"json": [...]`` -- every element is a *plain JSON value*, one whose JSON round trip gives back the same
  types and values: ``None``, ``bool``, ``int`` within 64 bits, finite ``float``, ``str``, ``list`` and
  ``dict`` with ``str`` keys (exact types, no subclasses, nesting below ``_PLAIN_MAX_DEPTH``), stored as one
  JSON list (dict key order is kept by JSON);
* ``"items": [node, ...]`` -- anything else (tuples, NaN/inf, bytes, tensors, non-string keys, subclasses,
  ...), and empty arrays: one node per element, as in version 1.

The check is a tight recursion over exact types, several times cheaper than encoding element-wise; when
it fails the array falls back to ``items``. The compact forms do not copy: the tree's lists hold the
array's own strings, dicts and lists, and decoding puts the tree's objects in the new array (after a JSON
round trip those are fresh objects; ``decode(encode(x).tree, ...)`` in memory shares them with ``x``).

Versions
--------
A tree carries the lowest ``codec_version`` that describes it: ``2`` when it holds a compact object array
(``strs`` or ``json``, added in version 2), ``1`` otherwise. An older reader, which understands 1 only,
therefore refuses a tree using the new forms with an "unknown codec_version" error naming both versions
(instead of failing obscurely on the missing ``items``, or worse), while trees without them stay
readable by it. This module reads versions 1 and 2; :data:`CODEC_VERSION` is the newest it writes.
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import enum
import inspect
import json
import logging
import math
import pickle
import sys
import types
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import torch

from skipweave.store import classes
from skipweave.store.tree import CodecError, check_root, child_path, float_from_node, key_label, summarize

logger = logging.getLogger(__name__)

CODEC_VERSION = 2
"""The newest codec version this module writes; a tree records the lowest version able to describe it."""
_COMPACT_VERSION = 2  # version that introduced the "strs" / "json" object-array forms

__all__ = [
    "CODEC_VERSION",
    "CodecError",
    "Encoded",
    "PickleRefused",
    "decode",
    "encode",
    "is_dataproto_like",
    "is_tensordict",
    "summarize",
]


class PickleRefused(CodecError):
    """The value needs pickle (to encode or to decode) but ``allow_pickle`` is False."""


@dataclass
class Encoded:
    """The encoded form of an object.

    Attributes:
        tree: JSON-serialisable skeleton ``{"codec_version": v, "root": node}``, ``v`` being 1, or 2 when
            the tree holds a compact object array.
        tensors: flat ``name -> tensor`` mapping; each tensor is contiguous, on CPU and owns its storage
            relative to the other entries (ready for ``safetensors.torch.save_file``).
        pickled: True if any part of the object was pickled (only possible with ``allow_pickle=True``).
    """

    tree: dict[str, Any]
    tensors: dict[str, torch.Tensor]
    pickled: bool


# Tensor dtypes that every safetensors release (>= 0.4) stores natively. Others are stored as a raw
# uint8 view of their bytes and reinterpreted on decode.
_SAFE_TORCH_DTYPES: frozenset[torch.dtype] = frozenset(
    {
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
    }
)

# numpy dtypes stored through ``torch.from_numpy`` (zero copy) when in native byte order.
_NP_TO_TORCH: dict[np.dtype[Any], torch.dtype] = {
    np.dtype(np.bool_): torch.bool,
    np.dtype(np.uint8): torch.uint8,
    np.dtype(np.int8): torch.int8,
    np.dtype(np.int16): torch.int16,
    np.dtype(np.int32): torch.int32,
    np.dtype(np.int64): torch.int64,
    np.dtype(np.float16): torch.float16,
    np.dtype(np.float32): torch.float32,
    np.dtype(np.float64): torch.float64,
}

_INT_JSON_LIMIT = 2**63
_WARNED_DEVICES: set[str] = set()
_CHECKED_CLASSES: set[tuple[type, str]] = set()  # (class, kind) the encoder has checked for replayability

# --------------------------------------------------------------------------------------------------------
# paths in error messages, built only when one is raised
#
# Encoding and decoding pass each child the path naming it (``obj['rng']['python'].state``). Formatting it
# as text for every node (a ``repr`` of the key, a concatenation) was a large part of a small entry's cost,
# and it is read only when an error is raised. So a path is the root name (a ``str``) or a tuple
# ``(parent, label, value)``: the parent's path and the function making this level's suffix from ``value``
# (``key_label(k)``, ``"[3]"``, ``".name"``, ...). :func:`_ps` turns it into the text the eager version built.

_Path: TypeAlias = str | tuple[Any, Callable[[Any], str], Any]


def _idx_label(i: Any) -> str:
    return f"[{i}]"


def _attr_label(name: Any) -> str:
    return f".{name}"


def _td_label(i: Any) -> str:
    return f".tensordicts[{i}]"


def _key_repr_label(k: Any) -> str:
    return f"<key {k!r}>"


def _item_repr_label(v: Any) -> str:
    return f"<item {v!r}>"


def _ps(path: _Path) -> str:
    """The text of a path: ``child_path`` of the parent's text and each level's suffix (iteratively, so a
    path as deep as the recursion limit allows is formatted without recursing)."""
    suffixes: list[str] = []
    while type(path) is tuple:
        path, label, value = path
        suffixes.append(label(value))
    text = path if isinstance(path, str) else str(path)  # the root name, a str
    for suffix in reversed(suffixes):
        text = child_path(text, suffix)
    return text


# --------------------------------------------------------------------------------------------------------
# small helpers shared with fingerprint.py


def is_dataproto_like(obj: Any) -> bool:
    """Return True if ``obj`` is an instance shaped like verl's ``DataProto``.

    Args:
        obj: any object.

    Returns:
        True when ``obj`` is not a class and has the attributes ``batch``, ``non_tensor_batch`` and
        ``meta_info``.
    """
    if isinstance(obj, type):
        return False
    try:
        return all(hasattr(obj, a) for a in ("batch", "non_tensor_batch", "meta_info"))
    except Exception:  # a property raising something other than AttributeError
        return False


def is_tensordict(obj: Any) -> bool:
    """Return True if ``obj`` is a ``tensordict`` TensorDict (any ``TensorDictBase``), without importing it.

    Args:
        obj: any object.

    Returns:
        True when a class in the object's MRO is ``tensordict``'s ``TensorDictBase``.
    """
    if isinstance(obj, type):
        return False
    return any(
        c.__name__ == "TensorDictBase" and (getattr(c, "__module__", "") or "").startswith("tensordict")
        for c in type(obj).__mro__
    )


def _is_tensorclass(obj: Any) -> bool:
    return not isinstance(obj, type) and getattr(type(obj), "_is_tensorclass", False) is True


def _is_non_tensor_data(obj: Any) -> bool:
    tp = type(obj)
    return (
        _is_tensorclass(obj)
        and tp.__name__ == "NonTensorData"
        and (getattr(tp, "__module__", "") or "").startswith("tensordict")
    )


def class_ref(cls: type) -> str:
    """Return ``"module:qualname"`` for a class.

    Args:
        cls: the class.

    Returns:
        The reference string; decoding looks it up (without importing) under :mod:`skipweave.store.classes`' rules.
    """
    return f"{cls.__module__}:{cls.__qualname__}"


def _type_name(obj: Any) -> str:
    return class_ref(type(obj))


_DATAPROTO_ATTRS = ("batch", "non_tensor_batch", "meta_info")


def _extra_attr_problem(cls: type, name: Any) -> str | None:
    """Why a DataProto-like object's extra attribute ``name`` must not be set (or recorded), or None.

    Allowed: identifiers not starting with ``"__"`` (no ``__class__``/``__dict__`` swaps, no name-mangled
    attributes), other than ``batch``/``non_tensor_batch``/``meta_info``, that the class does not define as a
    data descriptor (a property setter would run class code on the recorded value; ``__slots__`` members are
    fine).
    """
    if type(name) is not str or not name.isidentifier():
        return "is not an identifier"
    if name.startswith("__"):
        return "is a dunder or name-mangled attribute"
    if name in _DATAPROTO_ATTRS:
        return "is one of batch/non_tensor_batch/meta_info"
    attr = inspect.getattr_static(cls, name, None)
    if attr is not None and not isinstance(attr, types.MemberDescriptorType):
        kind = type(attr)
        if hasattr(kind, "__set__") or hasattr(kind, "__delete__"):
            return f"is a {kind.__name__} of the class"
    return None


def _is_namedtuple(obj: Any) -> bool:
    return isinstance(obj, tuple) and type(obj) is not tuple and hasattr(type(obj), "_fields")


def _float_node(x: float) -> dict[str, Any]:
    if math.isnan(x):
        return {"t": "float", "s": "nan"}
    if math.isinf(x):
        return {"t": "float", "s": "inf" if x > 0 else "-inf"}
    return {"t": "float", "v": x}


def _device_available(device: str) -> bool:
    try:
        dev = torch.device(device)
    except Exception:
        return False
    if dev.type == "cpu":
        return True
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            return False
        return dev.index is None or dev.index < torch.cuda.device_count()
    backend = vars(torch).get(dev.type)  # no lazy submodule import for a device string read from a file
    if not isinstance(backend, types.ModuleType):
        return False
    is_available = getattr(backend, "is_available", None)
    if not callable(is_available):
        return False
    try:
        if not is_available():
            return False
        count = getattr(backend, "device_count", None)
        return dev.index is None or not callable(count) or dev.index < count()
    except Exception:
        return False


def _to_recorded_device(t: torch.Tensor, device: str) -> torch.Tensor:
    if device == "cpu":
        return t
    if _device_available(device):
        return t.to(device)
    if device not in _WARNED_DEVICES:
        _WARNED_DEVICES.add(device)
        logger.warning("recorded on %s, not available here, restored on CPU", device)
    return t


_TORCH_DTYPES: dict[str, torch.dtype] = {
    f"torch.{n}": dt for n, dt in vars(torch).items() if isinstance(dt, torch.dtype)
}
"""``"torch.<name>"`` -> the dtype, as :func:`_torch_dtype` finds it in torch's namespace (looked up first)."""

_NP_DTYPES: dict[str, np.dtype[Any]] = {
    s: d for s in {np.dtype(c).str for c in "?bBhHiIlLqQefdgFDGO"} if (d := np.dtype(s)) is np.dtype(s)
}
"""A node's dtype string -> the dtype, for numpy's builtin dtypes: ``np.dtype(s)`` returns that very object."""


def _flat_bytes(raw: torch.Tensor) -> torch.Tensor:
    """``raw.reshape(-1).view(torch.uint8)``, without the no-op calls for an entry stored that way."""
    if raw.dtype == torch.uint8 and raw.dim() == 1:
        return raw
    return raw.reshape(-1).view(torch.uint8)


def _torch_dtype(name: Any, path: _Path) -> torch.dtype:
    dt = _TORCH_DTYPES.get(name) if type(name) is str else None
    if dt is not None:
        return dt
    # vars(), not getattr: torch's module __getattr__ imports submodules lazily, and the name comes from a file
    dt = vars(torch).get(name.removeprefix("torch.")) if isinstance(name, str) else None
    if not isinstance(dt, torch.dtype):
        raise CodecError(f"{_ps(path)}: unknown torch dtype {name!r}")
    return dt


_PLAIN_TYPES = frozenset({str, bool, int, float, type(None), dict, list})
_PLAIN_MAX_DEPTH = 100
"""Containers nested deeper than this inside an object-array element are not checked: the element-wise
form takes the array (which also reports reference cycles, which would otherwise recurse forever)."""


def _is_plain(x: Any, depth: int) -> bool:
    """True if ``x`` is a plain JSON value: its ``json.dumps``/``json.loads`` round trip is exact.

    Exact types only: ``bool`` stays ``bool`` through JSON but a ``str``/``int``/``float``/``dict``/``list``
    subclass would come back as its base type, a tuple as a list, a non-string key as a string; NaN and
    infinities are not JSON, and ints beyond 64 bits are kept out of the JSON for other readers' sake.
    """
    tp = type(x)
    if tp is str or tp is bool or x is None:
        return True
    if tp is int:
        return -_INT_JSON_LIMIT <= x < _INT_JSON_LIMIT
    if tp is float:
        return x - x == 0.0  # False for nan and +-inf
    if depth >= _PLAIN_MAX_DEPTH:
        return False
    if tp is dict:
        for k, v in x.items():
            if type(k) is not str:
                return False
            t = type(v)
            if t is str or t is bool or v is None:  # the common leaves, without a call
                continue
            if not _is_plain(v, depth + 1):
                return False
        return True
    if tp is list:
        for v in x:
            t = type(v)
            if t is str or t is bool or v is None:
                continue
            if not _is_plain(v, depth + 1):
                return False
        return True
    return False


def _compact_object_items(arr: np.ndarray) -> tuple[str, list[Any]] | None:
    """The compact form of a non-empty object array, ``("strs" | "json", elements)``, or None if it has none.

    The elements are the array's own objects (flattened in C order), not copies.
    """
    if arr.size == 0:
        return None
    items: list[Any] = arr.reshape(-1).tolist()  # an object array's tolist() returns the elements themselves
    types = set(map(type, items))
    if types == {str}:
        return "strs", items
    if types <= _PLAIN_TYPES and all(_is_plain(x, 0) for x in items):
        return "json", items
    return None


# --------------------------------------------------------------------------------------------------------
# encoding


class _Encoder:
    def __init__(self, allow_pickle: bool, trusted: Collection[str] = ()) -> None:
        self.allow_pickle = allow_pickle
        self.trusted = frozenset((trusted,) if isinstance(trusted, str) else trusted)  # no replay warning for these
        self.tensors: dict[str, torch.Tensor] = {}
        self.pickled = False
        self._counter = 0
        self._storages: set[int] = set()  # untyped storage data_ptr of every stored tensor
        # id(original tensor/array) -> node, for aliasing; the originals are kept alive in _keep so that
        # an id can never be reused by another (temporary) object during one encode call.
        self._by_id: dict[int, dict[str, Any]] = {}
        self._keep: list[Any] = []
        self._stack: set[int] = set()  # ids of containers on the current path (cycle detection)
        self.version = 1  # lowest codec version describing the nodes made so far

    # -- state snapshots, so a failed optional sub-encoding leaves no trace -------------------------------
    def snapshot(self) -> tuple[int, int, set[int], dict[int, dict[str, Any]], bool, int]:
        return self._counter, len(self.tensors), set(self._storages), dict(self._by_id), self.pickled, self.version

    def rollback(self, snap: tuple[int, int, set[int], dict[int, dict[str, Any]], bool, int]) -> None:
        counter, n_tensors, storages, by_id, pickled, version = snap
        for key in list(self.tensors)[n_tensors:]:
            del self.tensors[key]
        self._counter, self._storages, self._by_id, self.pickled = counter, storages, by_id, pickled
        self.version = version

    # -- tensor storage --------------------------------------------------------------------------------
    def _add(self, t: torch.Tensor) -> str:
        """Store a contiguous CPU tensor, cloning it only if its storage is already used by another entry."""
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if storage.nbytes() > 0 and ptr != 0:
            if ptr in self._storages:
                t = t.clone()
                ptr = t.untyped_storage().data_ptr()
            self._storages.add(ptr)
        key = f"t{self._counter}"
        self._counter += 1
        self.tensors[key] = t
        return key

    def _store_torch(self, t: torch.Tensor) -> tuple[str, str]:
        """Return (key, storage mode) for a contiguous CPU tensor; mode is "native" or "bytes"."""
        if t.dtype in _SAFE_TORCH_DTYPES:
            return self._add(t), "native"
        return self._add(t.reshape(-1).view(torch.uint8)), "bytes"

    # -- dispatch ---------------------------------------------------------------------------------------
    def encode(self, obj: Any, path: _Path) -> dict[str, Any]:
        tp = type(obj)
        fast = _FAST_ENCODERS.get(tp)  # the common exact types, without the checks below
        if fast is not None:
            return fast(self, obj, path)
        if obj is None:
            return {"t": "none"}
        if tp is bool:
            return {"t": "bool", "v": obj}
        if tp is int:
            if -_INT_JSON_LIMIT <= obj < _INT_JSON_LIMIT:
                return {"t": "int", "v": obj}
            return {"t": "int", "s": str(obj)}
        if tp is float:
            return _float_node(obj)
        if tp is str:
            return {"t": "str", "v": obj}
        if tp is bytes or tp is bytearray:
            return {"t": tp.__name__, "b64": base64.b64encode(obj).decode("ascii")}
        if tp is complex:
            return {"t": "complex", "re": _float_node(obj.real), "im": _float_node(obj.imag)}
        if isinstance(obj, torch.Tensor):
            return self._encode_tensor(obj, path)
        if tp is np.ndarray:
            return self._encode_ndarray(obj, path)
        if isinstance(obj, np.generic) and obj.dtype.kind != "V":
            arr = np.asarray(obj)
            return {
                "t": "npscalar",
                "dtype": arr.dtype.str,
                "b64": base64.b64encode(arr.tobytes()).decode("ascii"),
            }
        if isinstance(obj, enum.Enum):
            return self._encode_enum(obj, path)
        if tp is torch.Size:
            return {"t": "torch_size", "v": [int(x) for x in obj]}
        if tp is torch.dtype:
            return {"t": "torch_dtype", "v": str(obj)}
        if tp is torch.device:
            return {"t": "torch_device", "v": str(obj)}
        if tp in (dict, collections.OrderedDict, list, tuple, set, frozenset) or _is_namedtuple(obj):
            return self._guarded(obj, path, self._encode_container)
        if is_tensordict(obj):
            return self._guarded(obj, path, self._encode_tensordict)
        if _is_non_tensor_data(obj):
            return self._guarded(obj, path, self._encode_non_tensor_data)
        if _is_tensorclass(obj):
            return self._encode_pickle(obj, path, reason="tensorclass instances are not supported")
        if is_dataproto_like(obj):
            return self._guarded(obj, path, self._encode_dataproto)
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            return self._guarded(obj, path, self._encode_dataclass)
        return self._encode_pickle(obj, path)

    def _encode_plain_dict(self, obj: dict[Any, Any], path: _Path) -> dict[str, Any]:
        """``_guarded(obj, path, self._encode_container)`` of an exact ``dict``, with one call less per dict."""
        oid = self._push(obj, path)
        try:
            return self._encode_mapping(obj, path, {"t": "dict"})
        finally:
            self._stack.discard(oid)

    def _encode_plain_seq(self, obj: list[Any] | tuple[Any, ...], path: _Path) -> dict[str, Any]:
        """``_guarded(obj, path, self._encode_container)`` of an exact ``list`` or ``tuple``."""
        oid = self._push(obj, path)
        try:
            encode = self.encode
            return {"t": type(obj).__name__, "v": [encode(v, (path, _idx_label, i)) for i, v in enumerate(obj)]}
        finally:
            self._stack.discard(oid)

    def _push(self, obj: Any, path: _Path) -> int:
        """Enter a container being encoded (its ``id``, to remove when done); a cycle through it raises CodecError."""
        oid = id(obj)
        if oid in self._stack:
            raise CodecError(f"{_ps(path)}: reference cycle through a {_type_name(obj)} cannot be encoded")
        self._stack.add(oid)
        return oid

    def _guarded(self, obj: Any, path: _Path, fn: Callable[[Any, _Path], dict[str, Any]]) -> dict[str, Any]:
        oid = self._push(obj, path)
        try:
            return fn(obj, path)
        finally:
            self._stack.discard(oid)

    # -- leaves -----------------------------------------------------------------------------------------
    def _encode_tensor(self, obj: torch.Tensor, path: _Path) -> dict[str, Any]:
        cached = self._by_id.get(id(obj))
        if cached is not None:
            return dict(cached)
        if obj.layout != torch.strided:
            return self._encode_pickle(obj, path, reason=f"tensor layout {obj.layout} is not supported")
        dev = obj.device
        device = str(dev)
        dev_type = dev.type
        if dev_type == "meta":
            raise CodecError(f"{_ps(path)}: meta tensors carry no data and cannot be encoded")
        t = obj.detach()
        if dev_type != "cpu":
            t = t.cpu()
        t = t.resolve_conj().resolve_neg()
        if not t.is_contiguous():
            t = t.contiguous()
        key, mode = self._store_torch(t)
        node: dict[str, Any] = {
            "t": "tensor",
            "k": key,
            "dtype": str(obj.dtype),
            "shape": list(obj.shape),
            "device": device,
        }
        if mode != "native":
            node["storage"] = mode
        self._by_id[id(obj)] = node
        self._keep.append(obj)
        return node

    def _encode_ndarray(self, arr: np.ndarray, path: _Path) -> dict[str, Any]:
        cached = self._by_id.get(id(arr))
        if cached is not None:
            return dict(cached)
        dt = arr.dtype
        node: dict[str, Any] = {"t": "ndarray", "dtype": dt.str, "shape": list(arr.shape)}
        if dt.kind == "O":
            compact = _compact_object_items(arr)
            if compact is not None:
                form, elements = compact
                node[form] = elements
                self.version = max(self.version, _COMPACT_VERSION)
            else:
                oid = id(arr)
                if oid in self._stack:
                    raise CodecError(f"{_ps(path)}: reference cycle through an object array cannot be encoded")
                self._stack.add(oid)
                try:
                    flat_path = path if arr.ndim == 1 else (path, str, ".flat")
                    node["items"] = [
                        self.encode(el, (flat_path, _idx_label, i)) for i, el in enumerate(arr.flat)
                    ]
                finally:
                    self._stack.discard(oid)
        elif dt.kind in ("U", "S"):
            items = arr.reshape(-1).tolist()
            if dt.kind == "S":
                node["items"] = [base64.b64encode(b).decode("ascii") for b in items]
            else:
                node["items"] = items
        elif dt.fields is not None or dt.kind == "V" or dt.hasobject:
            return self._encode_pickle(arr, path, reason=f"numpy dtype {dt!r} (structured/void) is not supported")
        else:
            c = np.ascontiguousarray(arr)
            if dt.isnative and dt in _NP_TO_TORCH:
                node["k"], _ = self._store_torch(_from_numpy(c))
            else:
                node["k"] = self._add(_from_numpy(c.reshape(-1).view(np.uint8)))
                node["storage"] = "bytes"
        self._by_id[id(arr)] = node
        self._keep.append(arr)
        return node

    def _encode_enum(self, obj: enum.Enum, path: _Path) -> dict[str, Any]:
        cls = type(obj)
        ref = self._class_ref_checked(cls, path, "enum")
        name = obj.name
        if name is not None and cls.__members__.get(name) is obj:
            return {"t": "enum", "cls": ref, "name": name}
        return {"t": "enum", "cls": ref, "value": self.encode(obj.value, (path, str, ".value"))}

    def _encode_pickle(self, obj: Any, path: _Path, reason: str | None = None) -> dict[str, Any]:
        tname = _type_name(obj)
        if not self.allow_pickle:
            why = f" ({reason})" if reason else ""
            raise PickleRefused(
                f"cannot encode {_ps(path) or '<root>'} of type {tname} without pickle{why}; "
                "set skip.<role>.allow_pickle=true to allow pickling it"
            )
        try:
            data = pickle.dumps(obj, protocol=pickle.DEFAULT_PROTOCOL)
        except Exception as exc:
            raise CodecError(f"cannot pickle {_ps(path) or '<root>'} of type {tname}: {exc}") from exc
        key = self._add(torch.from_numpy(np.frombuffer(data, dtype=np.uint8).copy()))
        self.pickled = True
        return {"t": "pickle", "k": key, "type": tname, "nbytes": len(data)}

    # -- containers -------------------------------------------------------------------------------------
    def _encode_container(self, obj: Any, path: _Path) -> dict[str, Any]:
        tp = type(obj)
        if tp is dict or tp is collections.OrderedDict:
            node: dict[str, Any] = {"t": "dict"}
            if tp is collections.OrderedDict:
                node["ordered"] = True
            return self._encode_mapping(obj, path, node)
        if tp is list or tp is tuple:
            return {
                "t": tp.__name__,
                "v": [self.encode(v, (path, _idx_label, i)) for i, v in enumerate(obj)],
            }
        if tp is set or tp is frozenset:
            items = [self.encode(v, (path, _item_repr_label, v)) for v in obj]
            items.sort(key=lambda n: json.dumps(n, sort_keys=True))  # deterministic trees across processes
            return {"t": tp.__name__, "v": items}
        # namedtuple
        ref = self._class_ref_checked(tp, path, "namedtuple")
        return {
            "t": "namedtuple",
            "cls": ref,
            "v": {f: self.encode(getattr(obj, f), (path, _attr_label, f)) for f in tp._fields},
        }

    def _encode_mapping(self, obj: dict[Any, Any], path: _Path, node: dict[str, Any]) -> dict[str, Any]:
        """Fill a ``dict`` node: ``"v"`` when every key is exactly a ``str``, else ``"kv"`` pairs."""
        encode = self.encode
        for k in obj:
            if type(k) is not str:
                break
        else:
            node["v"] = {k: encode(v, (path, key_label, k)) for k, v in obj.items()}
            return node
        node["kv"] = [[encode(k, (path, _key_repr_label, k)), encode(v, (path, key_label, k))] for k, v in obj.items()]
        return node

    def _encode_dataclass(self, obj: Any, path: _Path) -> dict[str, Any]:
        ref = self._class_ref_checked(type(obj), path, "dataclass")
        fields = {
            f.name: self.encode(getattr(obj, f.name), (path, _attr_label, f.name)) for f in dataclasses.fields(obj)
        }
        return {"t": "dataclass", "cls": ref, "v": fields}

    def _encode_tensordict(self, obj: Any, path: _Path) -> dict[str, Any]:
        ref = self._class_ref_checked(type(obj), path, "tensordict")
        device = getattr(obj, "device", None)
        node: dict[str, Any] = {
            "t": "tensordict",
            "cls": ref,
            "batch_size": [int(x) for x in obj.batch_size],
            "device": None if device is None else str(device),
        }
        parts = getattr(obj, "tensordicts", None)
        if isinstance(parts, (list, tuple)) and isinstance(getattr(obj, "stack_dim", None), int):
            # lazy stack (LazyStackedTensorDict / NonTensorStack): keep the stacked parts
            node["stack_dim"] = int(obj.stack_dim)
            node["stack"] = [self.encode(td, (path, _td_label, i)) for i, td in enumerate(parts)]
            return node
        items: dict[str, Any] = {}
        for k, v in obj.items():
            if type(k) is not str:
                raise CodecError(f"{_ps(path)}: TensorDict key {k!r} of type {_type_name(k)} is not supported")
            items[k] = self.encode(v, (path, key_label, k))
        node["v"] = items
        return node

    def _encode_non_tensor_data(self, obj: Any, path: _Path) -> dict[str, Any]:
        device = getattr(obj, "device", None)
        return {
            "t": "nontensordata",
            "cls": self._class_ref_checked(type(obj), path, "nontensordata"),
            "batch_size": [int(x) for x in obj.batch_size],
            "device": None if device is None else str(device),
            "data": self.encode(obj.data, (path, str, ".data")),
        }

    def _encode_dataproto(self, obj: Any, path: _Path) -> dict[str, Any]:
        cls = type(obj)
        ref = self._class_ref_checked(cls, path, "dataproto")
        node: dict[str, Any] = {"t": "dataproto", "cls": ref}
        for attr in _DATAPROTO_ATTRS:
            node[attr] = self.encode(getattr(obj, attr), (path, _attr_label, attr))
        extra: dict[str, Any] = {}
        for name, value in getattr(obj, "__dict__", {}).items():
            if name in _DATAPROTO_ATTRS:
                continue
            problem = _extra_attr_problem(cls, name)
            if problem:  # decoding would refuse the whole object: leave the attribute out, as unsupported ones
                logger.debug("not recording attribute %r of %s: it %s", name, _ps(path) or "<root>", problem)
                continue
            snap = self.snapshot()
            allow = self.allow_pickle
            self.allow_pickle = False  # extras are kept only if natively supported
            try:
                extra[name] = self.encode(value, (path, _attr_label, name))
            except CodecError as exc:
                self.rollback(snap)
                logger.debug("not recording attribute %s: %s", child_path(_ps(path), f".{name}"), exc)
            finally:
                self.allow_pickle = allow
        if extra:
            node["extra"] = extra
        return node

    def _class_ref_checked(self, cls: type, path: _Path, kind: str) -> str:
        """``class_ref(cls)``; refuses local classes, warns once per class that a replay would refuse it."""
        if "<locals>" in cls.__qualname__:
            raise CodecError(
                f"{_ps(path)}: class {class_ref(cls)} is defined inside a function and could not be found "
                "when decoding; define it at module level"
            )
        key = (cls, kind)
        if key not in _CHECKED_CLASSES and class_ref(cls) not in self.trusted:
            _CHECKED_CLASSES.add(key)
            problem = classes.replay_problem(cls, kind)
            if problem:
                logger.warning("skipweave: recording %s (%s) that a replay will refuse unless approved: %s",
                               _ps(path) or "<root>", class_ref(cls), problem)
        return class_ref(cls)


_FAST_ENCODERS: dict[type, Callable[[_Encoder, Any, _Path], dict[str, Any]]] = {
    dict: _Encoder._encode_plain_dict,
    list: _Encoder._encode_plain_seq,
    tuple: _Encoder._encode_plain_seq,
    torch.Tensor: _Encoder._encode_tensor,
    np.ndarray: _Encoder._encode_ndarray,
}
"""Exact type -> what :meth:`_Encoder.encode`'s checks would pick for it (looked up before them)."""


def _from_numpy(arr: np.ndarray) -> torch.Tensor:
    """``torch.from_numpy``, quiet about a read-only array (we never write to the tensor). The warning filter is
    changed only for those: ``warnings.catch_warnings`` is slow and changes the filters of every thread."""
    if arr.flags.writeable:
        return torch.from_numpy(arr)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.from_numpy(arr)


def encode(
    obj: Any, *, allow_pickle: bool = False, root_name: str = "obj", trusted: Collection[str] = ()
) -> Encoded:
    """Encode ``obj`` into a JSON skeleton and a flat dict of CPU tensors.

    Contiguous CPU tensors and native-endian numeric numpy arrays are not copied (the entries of
    ``Encoded.tensors`` share memory with them); non-contiguous or accelerator tensors are copied to
    contiguous CPU tensors, and a tensor whose storage is already used by another entry is cloned so the
    result can be saved with safetensors. Likewise the compact form of an object array holds the array's
    own elements: serialise the tree before mutating them.

    A class that a replay in this process would refuse (an unregistered DataProto-like class, a dataclass or
    namedtuple defining ``__del__``) is still recorded -- the replay may list it in
    ``skip.<role>.trusted_classes`` -- but unless it is in ``trusted``, a warning naming it and the fix is
    logged once per class, while there is time to register it.

    Args:
        obj: the value to encode (see the module docstring for the supported types).
        allow_pickle: pickle values the codec does not support instead of refusing them.
        root_name: name of ``obj`` used as the start of paths in error messages (e.g. ``"result"``).
        trusted: refs the replay will trust (``skip.<role>.trusted_classes``): no replay warning for them.

    Returns:
        An :class:`Encoded` with ``tree == {"codec_version": v, "root": node}``: ``v`` is 2 when an object
        array took a compact form (``strs``/``json``), else 1 (see the module docstring).

    Raises:
        PickleRefused: a value needs pickle and ``allow_pickle`` is False; the message names its path
            (e.g. ``result.batch['x']``) and type and says how to opt in.
        CodecError: a value cannot be encoded at all (reference cycle, meta tensor, class defined inside a
            function, unpicklable object).
    """
    enc = _Encoder(allow_pickle, trusted)
    root = enc.encode(obj, root_name)
    return Encoded(tree={"codec_version": enc.version, "root": root}, tensors=enc.tensors, pickled=enc.pickled)


# --------------------------------------------------------------------------------------------------------
# decoding

_PADDED_STR_BYTES_LIMIT = 1 << 28
"""A ``U``/``S`` array node wider than its longest string may decode to at most this many bytes (256 MiB), so a
crafted width (``"<U1000000000"``) cannot make a few bytes of JSON allocate gigabytes."""


def _is_lazy_stack_class(cls: type) -> bool:
    return any(
        c.__name__ == "LazyStackedTensorDict" and (getattr(c, "__module__", "") or "").startswith("tensordict")
        for c in cls.__mro__
    )


class _Decoder:
    def __init__(self, tensors: Mapping[str, torch.Tensor], allow_pickle: bool, trusted: Collection[str]) -> None:
        self.tensors = tensors
        self.allow_pickle = allow_pickle
        self.trusted = frozenset((trusted,) if isinstance(trusted, str) else trusted)  # a lone str is one ref
        self._cache: dict[tuple[str, str], Any] = {}  # (kind, key) -> decoded tensor/array (aliasing)

    def _raw(self, node: Mapping[str, Any], path: _Path) -> torch.Tensor:
        key = node.get("k")
        if not isinstance(key, str) or key not in self.tensors:
            raise CodecError(f"{_ps(path)}: tensor entry {key!r} is missing from the stored tensors")
        t = self.tensors[key]
        if not isinstance(t, torch.Tensor):
            raise CodecError(f"{_ps(path)}: stored entry {key!r} is a {_type_name(t)}, not a tensor")
        return t

    def _class(self, ref: Any, kind: str, path: _Path) -> type:
        """The class a node names, under :mod:`skipweave.store.classes`' rules (never imports unless trusted)."""
        try:
            return classes.resolve(ref, kind, trusted=self.trusted)
        except CodecError as exc:
            raise CodecError(f"{_ps(path) or '<root>'}: {exc}") from None

    def decode(self, node: Any, path: _Path) -> Any:
        if (type(node) is not dict and not isinstance(node, Mapping)) or "t" not in node:
            raise CodecError(f"{_ps(path)}: malformed codec node {node!r:.200}")
        tag = node["t"]
        try:
            fn = _DECODERS[tag]
        except (KeyError, TypeError):
            raise CodecError(f"{_ps(path)}: unknown codec node type {tag!r:.100}") from None
        try:
            return fn(self, node, path)
        except (CodecError, RecursionError):
            raise  # RecursionError: turned into a CodecError once, at the top (formatting here could recurse)
        except Exception as exc:
            raise CodecError(f"{_ps(path)}: cannot decode {tag!r} node: {type(exc).__name__}: {exc}") from exc

    # -- leaves -----------------------------------------------------------------------------------------
    def _tensor(self, node: Mapping[str, Any], path: _Path) -> torch.Tensor:
        cache = self._cache
        ck = ("tensor", str(node.get("k")))
        if ck in cache:
            return cache[ck]  # type: ignore[no-any-return]
        raw = self._raw(node, path)
        dtype = _torch_dtype(node["dtype"], path)
        shape = _shape(node, path)
        # reshape/view only when they change something: each costs microseconds even as a no-op
        if node.get("storage", "native") == "bytes":
            t = _flat_bytes(raw).view(dtype)
        else:
            if raw.dtype != dtype:
                raise CodecError(f"{_ps(path)}: stored tensor has dtype {raw.dtype}, expected {dtype}")
            t = raw
        if t.shape != shape:
            t = t.reshape(shape)
        device = node.get("device", "cpu")
        if device != "cpu":
            t = _to_recorded_device(t, str(device))
        cache[ck] = t
        return t

    def _ndarray(self, node: Mapping[str, Any], path: _Path) -> np.ndarray:
        dt = _np_dtype(node, path)
        shape = _shape(node, path)
        kind = dt.kind
        arr: np.ndarray
        if kind in ("O", "U", "S"):
            size = math.prod(shape)
        if kind == "O":
            for form in ("strs", "json"):
                if form in node:
                    return self._compact_object_array(node[form], shape, form, path)
            items = node["items"]
            if not isinstance(items, list) or len(items) != size:  # checked before allocating the array
                got = f"{len(items)} items" if isinstance(items, list) else f"a {_type_name(items)}"
                raise CodecError(f"{_ps(path)}: object array has {got}, expected {size}")
            arr = np.empty(shape, dtype=object)
            flat = arr.reshape(-1)
            flat_path = path if len(shape) == 1 else (path, str, ".flat")
            for i, item in enumerate(items):
                flat[i] = self.decode(item, (flat_path, _idx_label, i))
            return arr
        if dt.hasobject:
            raise CodecError(f"{_ps(path)}: numpy dtype {dt!r} holds Python objects; refusing to build it from bytes")
        if kind in ("U", "S"):
            items = node["items"]
            if not isinstance(items, list) or len(items) != size:
                got = f"{len(items)} items" if isinstance(items, list) else f"a {_type_name(items)}"
                raise CodecError(f"{_ps(path)}: string array has {got}, expected {size}")
            if dt.kind == "S":
                items = [base64.b64decode(s) for s in items]
            elif not all(type(s) is str for s in items):
                raise CodecError(f"{_ps(path)}: string array holds values that are not strings")
            longest = max(map(len, items), default=0)
            width = dt.itemsize // (4 if dt.kind == "U" else 1)
            if width > longest and dt.itemsize * size > _PADDED_STR_BYTES_LIMIT:
                raise CodecError(
                    f"{_ps(path)}: string array of dtype {dt.str} and {size} items would take "
                    f"{dt.itemsize * size} bytes, its longest string being {longest} long; refusing a crafted width"
                )
            arr = np.array(items, dtype=dt).reshape(shape)
            if arr.dtype != dt:
                arr = arr.astype(dt)
            return arr
        cache = self._cache
        ck = ("ndarray", str(node.get("k")))
        if ck in cache:
            return cache[ck]  # type: ignore[no-any-return]
        raw = self._raw(node, path)
        if node.get("storage", "native") == "bytes":
            arr = _flat_bytes(raw).numpy().view(dt)
            if arr.shape != shape:
                arr = arr.reshape(shape)
        else:
            arr = raw.numpy()
            if arr.shape != shape:
                arr = arr.reshape(shape)
            if arr.dtype != dt:
                raise CodecError(f"{_ps(path)}: stored array has dtype {arr.dtype}, expected {dt}")
        cache[ck] = arr
        return arr

    @staticmethod
    def _compact_object_array(elements: Any, shape: tuple[int, ...], form: str, path: _Path) -> np.ndarray:
        """An object array from the JSON list of a ``strs``/``json`` node; the elements are not copied."""
        size = math.prod(shape)
        if not isinstance(elements, list) or len(elements) != size:
            got = f"{len(elements)} elements" if isinstance(elements, list) else f"a {_type_name(elements)}"
            raise CodecError(f"{_ps(path)}: object array {form!r} holds {got}, expected a list of {size}")
        if form == "strs" and not set(map(type, elements)) <= {str}:
            raise CodecError(f"{_ps(path)}: object array 'strs' holds values that are not strings")
        # fromiter stores each element as it is; assigning a list to a slice would broadcast nested lists
        return np.fromiter(elements, dtype=object, count=size).reshape(shape)

    def _npscalar(self, node: Mapping[str, Any], path: _Path) -> Any:
        dt = _np_dtype(node, path)
        if dt.hasobject:
            raise CodecError(f"{_ps(path)}: numpy dtype {dt!r} holds Python objects; refusing to build it from bytes")
        return np.frombuffer(base64.b64decode(node["b64"]), dtype=dt)[0]

    def _pickle(self, node: Mapping[str, Any], path: _Path) -> Any:
        if not self.allow_pickle:
            raise PickleRefused(
                f"{_ps(path) or '<root>'} (type {node.get('type')}): this entry was recorded with "
                "allow_pickle=true; loading it would unpickle data, which can run arbitrary code. Set "
                "skip.<role>.allow_pickle=true (decode(..., allow_pickle=True)) if you trust this recording"
            )
        raw = self._raw(node, path)
        return pickle.loads(raw.contiguous().numpy().tobytes())

    def _enum(self, node: Mapping[str, Any], path: _Path) -> Any:
        ref = node.get("cls")
        cls = self._class(ref, "enum", path)
        if "name" in node:
            name = node["name"]
            members = inspect.getattr_static(cls, "_member_map_", None)  # what cls[name] reads, without a call
            if not isinstance(members, Mapping) or not isinstance(name, str) or name not in members:
                raise CodecError(f"{_ps(path)}: enum {ref!r} has no member {name!r:.100}")
            return members[name]
        value = self.decode(node["value"], (path, str, ".value"))
        if not issubclass(cls, enum.Flag):  # only a Flag combination lacks a member of its own
            members = inspect.getattr_static(cls, "_value2member_map_", None)
            try:
                if isinstance(members, Mapping) and value in members:
                    return members[value]
            except TypeError:  # an unhashable value
                pass
            raise CodecError(f"{_ps(path)}: enum {ref!r} has no member of value {value!r:.100}")
        # a Flag combination: the enum's lookup builds it, as at recording
        return cls(value)

    # -- containers -------------------------------------------------------------------------------------
    def _dict(self, node: Mapping[str, Any], path: _Path) -> dict[Any, Any]:
        out: dict[Any, Any] = collections.OrderedDict() if node.get("ordered") else {}
        decode = self.decode
        if "v" in node:
            for k, v in node["v"].items():
                out[k] = decode(v, (path, key_label, k))
        else:
            for kn, vn in node["kv"]:
                k = decode(kn, (path, str, "<key>"))
                out[k] = decode(vn, (path, key_label, k))
        return out

    def _seq(self, node: Mapping[str, Any], path: _Path) -> Any:
        items = [self.decode(v, (path, _idx_label, i)) for i, v in enumerate(node["v"])]
        return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[node["t"]](items)

    def _namedtuple(self, node: Mapping[str, Any], path: _Path) -> Any:
        ref = node.get("cls")
        cls = self._class(ref, "namedtuple", path)
        fields: tuple[str, ...] = inspect.getattr_static(cls, "_fields")
        recorded = _fields_node(node, path)
        _check_fields(recorded, fields, ref, path)
        values = {k: self.decode(v, (path, _attr_label, k)) for k, v in recorded.items()}
        return tuple.__new__(cls, tuple(values[f] for f in fields))

    def _dataclass(self, node: Mapping[str, Any], path: _Path) -> Any:
        ref = node.get("cls")
        cls = self._class(ref, "dataclass", path)
        recorded = _fields_node(node, path)
        _check_fields(recorded, [f.name for f in dataclasses.fields(cls)], ref, path)
        obj: Any = object.__new__(cls)  # no __new__/__init__/__post_init__ of the class runs
        for name, vn in recorded.items():
            object.__setattr__(obj, name, self.decode(vn, (path, _attr_label, name)))
        return obj

    def _tensordict_class(self, ref: Any, kind: str, path: _Path) -> type:
        try:
            return self._class(ref, kind, path)
        except CodecError as exc:
            raise CodecError(
                f"{exc}; this entry holds a {ref}, which needs the 'tensordict' package, imported"
            ) from None

    def _td_device(self, node: Mapping[str, Any]) -> str | None:
        device = node.get("device")
        if device is not None and not _device_available(device):
            _to_recorded_device(torch.empty(0), device)  # logs the once-per-device warning
            return "cpu"
        return None if device is None else str(device)

    def _tensordict(self, node: Mapping[str, Any], path: _Path) -> Any:
        ref = node.get("cls") or "tensordict:TensorDict"
        cls: Any = self._tensordict_class(ref, "tensordict", path)
        device = self._td_device(node)
        if "stack" in node:
            if not _is_lazy_stack_class(cls):
                raise CodecError(f"{_ps(path)}: {ref!r} is not a lazy stack of tensordicts; refusing to stack into it")
            parts = [self.decode(n, (path, _td_label, i)) for i, n in enumerate(node["stack"])]
            for i, part in enumerate(parts):
                if not (is_tensordict(part) or _is_tensorclass(part)):
                    raise CodecError(f"{_ps(path)}.tensordicts[{i}]: a {_type_name(part)} cannot be stacked in a {ref}")
            return cls(*parts, stack_dim=int(node["stack_dim"]))
        if getattr(cls, "__name__", "") != "TensorDict":
            # other TensorDictBase subclasses cannot be rebuilt from items: return a plain TensorDict
            cls = self._tensordict_class("tensordict:TensorDict", "tensordict", path)
        items = {k: self.decode(v, (path, key_label, k)) for k, v in node["v"].items()}
        return cls(items, batch_size=[int(x) for x in node["batch_size"]], device=device)

    def _nontensordata(self, node: Mapping[str, Any], path: _Path) -> Any:
        ref = node.get("cls")
        cls: Any = self._tensordict_class(ref, "nontensordata", path)
        data = self.decode(node["data"], (path, str, ".data"))
        return cls(data=data, batch_size=[int(x) for x in node["batch_size"]], device=self._td_device(node))

    def _dataproto(self, node: Mapping[str, Any], path: _Path) -> Any:
        cls = self._class(node.get("cls"), "dataproto", path)
        extra = node.get("extra", {})
        if not isinstance(extra, Mapping):
            raise CodecError(f"{_ps(path)}: 'extra' is a {_type_name(extra)}, not a mapping")
        for name in extra:
            problem = _extra_attr_problem(cls, name)
            if problem:
                raise CodecError(f"{_ps(path)}: recorded attribute {name!r:.100} {problem}; refusing to set it")
        obj: Any = object.__new__(cls)  # no __new__/__init__/__setattr__ of the class runs
        for attr in _DATAPROTO_ATTRS:
            object.__setattr__(obj, attr, self.decode(node[attr], (path, _attr_label, attr)))
        for name, vn in extra.items():
            object.__setattr__(obj, name, self.decode(vn, (path, _attr_label, name)))
        return obj


def _shape(node: Mapping[str, Any], path: _Path) -> tuple[int, ...]:
    shape = node["shape"]
    if isinstance(shape, list):
        for x in shape:
            if type(x) is not int or x < 0:
                break
        else:
            return tuple(shape)
    raise CodecError(f"{_ps(path)}: shape {shape!r:.100} is not a list of non-negative ints")


def _np_dtype(node: Mapping[str, Any], path: _Path) -> np.dtype[Any]:
    name = node["dtype"]
    if not isinstance(name, str):
        raise CodecError(f"{_ps(path)}: numpy dtype {name!r:.100} is not a string")
    dt = _NP_DTYPES.get(name) if type(name) is str else None
    return np.dtype(name) if dt is None else dt


def _fields_node(node: Mapping[str, Any], path: _Path) -> Mapping[str, Any]:
    recorded = node["v"]
    if not isinstance(recorded, Mapping):
        raise CodecError(f"{_ps(path)}: fields are a {_type_name(recorded)}, not a mapping")
    return recorded


def _check_fields(recorded: Mapping[str, Any], fields: Sequence[str], ref: Any, path: _Path) -> None:
    """Refuse a node whose field names are not exactly the class's: only declared fields are ever set."""
    if set(recorded) != set(fields) or len(recorded) != len(fields):
        raise CodecError(
            f"{_ps(path)}: recorded fields {list(recorded)} do not match the class's fields {list(fields)} of {ref!r} "
            "(the class changed since recording, or the tree was edited)"
        )


_DECODERS: dict[str, Callable[[_Decoder, Mapping[str, Any], _Path], Any]] = {
    "none": lambda d, n, p: None,
    "bool": lambda d, n, p: bool(n["v"]),
    "int": lambda d, n, p: int(n["s"]) if "s" in n else int(n["v"]),
    "float": lambda d, n, p: float_from_node(n),
    "complex": lambda d, n, p: complex(float_from_node(n["re"]), float_from_node(n["im"])),
    "str": lambda d, n, p: str(n["v"]),
    "bytes": lambda d, n, p: base64.b64decode(n["b64"]),
    "bytearray": lambda d, n, p: bytearray(base64.b64decode(n["b64"])),
    "torch_size": lambda d, n, p: torch.Size([int(x) for x in n["v"]]),
    "torch_dtype": lambda d, n, p: _torch_dtype(n["v"], p),
    "torch_device": lambda d, n, p: torch.device(n["v"]),
    "tensor": _Decoder._tensor,
    "ndarray": _Decoder._ndarray,
    "npscalar": _Decoder._npscalar,
    "pickle": _Decoder._pickle,
    "enum": _Decoder._enum,
    "dict": _Decoder._dict,
    "list": _Decoder._seq,
    "tuple": _Decoder._seq,
    "set": _Decoder._seq,
    "frozenset": _Decoder._seq,
    "namedtuple": _Decoder._namedtuple,
    "dataclass": _Decoder._dataclass,
    "tensordict": _Decoder._tensordict,
    "nontensordata": _Decoder._nontensordata,
    "dataproto": _Decoder._dataproto,
}


def decode(
    tree: dict[str, Any],
    tensors: Mapping[str, torch.Tensor],
    *,
    allow_pickle: bool = False,
    root_name: str = "obj",
    trusted: Collection[str] = (),
) -> Any:
    """Rebuild the object encoded by :func:`encode`.

    The tree is untrusted input: decoding imports no module and constructs only the classes
    :mod:`skipweave.store.classes` allows (see *Decoding constructs* in the module docstring). Tensors are
    moved to their recorded device when it exists here, otherwise they stay on CPU and a warning is logged
    once per device. Tensor data is not copied when the device is CPU.

    Args:
        tree: ``Encoded.tree`` (possibly after a JSON round trip).
        tensors: ``Encoded.tensors`` or the dict returned by ``safetensors.torch.load_file``.
        allow_pickle: allow unpickling entries that were recorded with ``allow_pickle=True``.
        root_name: name used as the start of paths in error messages.
        trusted: ``"module:qualname"`` refs the user approved (``skip.<role>.trusted_classes``): their modules
            may be imported and they skip the approval and data-only rules.

    Returns:
        The decoded object.

    Raises:
        PickleRefused: the tree contains a pickled entry and ``allow_pickle`` is False.
        CodecError: unknown ``codec_version``, malformed tree, missing tensor, nesting beyond the recursion
            limit, or a class (dataclass, enum, namedtuple, DataProto-like, TensorDict) that is not imported
            here, not approved, or whose fields differ from the recorded ones; the message names the path.
    """
    root = check_root(tree)
    try:
        return _Decoder(tensors, allow_pickle, trusted).decode(root, root_name)
    except RecursionError:
        raise CodecError(
            f"{root_name}: the tree is nested too deeply to decode (beyond Python's recursion limit of "
            f"{sys.getrecursionlimit()})"
        ) from None
