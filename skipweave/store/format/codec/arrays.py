"""The ``ndarray`` and ``npscalar`` kinds: numpy arrays (exact type only) and numpy scalars.

Numeric arrays in native byte order go to the tensor dict through ``torch.from_numpy`` without a copy; other
numeric dtypes are stored as raw bytes (``"storage": "bytes"``). String arrays (``U``/``S``) list their items
in the tree. Structured and void dtypes are not supported (pickle).

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
A tree holding a compact form has ``codec_version`` 2 (:data:`COMPACT_VERSION`).

Decoding refuses crafted nodes: dtypes holding Python objects in the raw-bytes and scalar forms, an object or
string array whose item count does not match its shape (checked before allocating), a string dtype padded to
an absurd width.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from skipweave.store.classes import class_ref
from skipweave.store.format.codec.scalars import INT_JSON_LIMIT
from skipweave.store.format.codec.tensors import flat_bytes, from_numpy, node_shape
from skipweave.store.format.tree import CodecError, NodePath, index_label, path_text

if TYPE_CHECKING:
    from skipweave.store.format.codec.walk import DecodeWalk, EncodeWalk

COMPACT_VERSION = 2
"""The codec version that introduced the ``strs`` / ``json`` object-array forms."""

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

_NP_DTYPES: dict[str, np.dtype[Any]] = {
    s: d for s in {np.dtype(c).str for c in "?bBhHiIlLqQefdgFDGO"} if (d := np.dtype(s)) is np.dtype(s)
}
"""A node's dtype string -> the dtype, for numpy's builtin dtypes: ``np.dtype(s)`` returns that very object."""

_PADDED_STR_BYTES_LIMIT = 1 << 28
"""A ``U``/``S`` array node wider than its longest string may decode to at most this many bytes (256 MiB), so a
crafted width (``"<U1000000000"``) cannot make a few bytes of JSON allocate gigabytes."""

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
        return -INT_JSON_LIMIT <= x < INT_JSON_LIMIT
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


def encode_ndarray(enc: EncodeWalk, arr: np.ndarray, path: NodePath) -> dict[str, Any]:
    """The ``ndarray`` node of ``arr`` (a copy of an alias's node); structured/void dtypes go to pickle."""
    cached = enc.by_id.get(id(arr))
    if cached is not None:
        return dict(cached)
    dt = arr.dtype
    node: dict[str, Any] = {"t": "ndarray", "dtype": dt.str, "shape": list(arr.shape)}
    if dt.kind == "O":
        compact = _compact_object_items(arr)
        if compact is not None:
            form, elements = compact
            node[form] = elements
            enc.version = max(enc.version, COMPACT_VERSION)
        else:
            oid = id(arr)
            if oid in enc.stack:
                raise CodecError(f"{path_text(path)}: reference cycle through an object array cannot be encoded")
            enc.stack.add(oid)
            try:
                flat_path = path if arr.ndim == 1 else (path, str, ".flat")
                node["items"] = [
                    enc.encode(el, (flat_path, index_label, i)) for i, el in enumerate(arr.flat)
                ]
            finally:
                enc.stack.discard(oid)
    elif dt.kind in ("U", "S"):
        items = arr.reshape(-1).tolist()
        if dt.kind == "S":
            node["items"] = [base64.b64encode(b).decode("ascii") for b in items]
        else:
            node["items"] = items
    elif dt.fields is not None or dt.kind == "V" or dt.hasobject:
        return enc.encode_pickle(arr, path, reason=f"numpy dtype {dt!r} (structured/void) is not supported")
    else:
        c = np.ascontiguousarray(arr)
        if dt.isnative and dt in _NP_TO_TORCH:
            node["k"], _ = enc.store_torch(from_numpy(c))
        else:
            node["k"] = enc.add(from_numpy(c.reshape(-1).view(np.uint8)))
            node["storage"] = "bytes"
    enc.by_id[id(arr)] = node
    enc.keep.append(arr)
    return node


def decode_ndarray(dec: DecodeWalk, node: Mapping[str, Any], path: NodePath) -> np.ndarray:
    """The array of an ``ndarray`` node; numeric arrays share memory with the stored tensor."""
    dt = np_dtype(node, path)
    shape = node_shape(node, path)
    kind = dt.kind
    arr: np.ndarray
    if kind in ("O", "U", "S"):
        size = math.prod(shape)
    if kind == "O":
        for form in ("strs", "json"):
            if form in node:
                return _compact_object_array(node[form], shape, form, path)
        items = node["items"]
        if not isinstance(items, list) or len(items) != size:  # checked before allocating the array
            got = f"{len(items)} items" if isinstance(items, list) else f"a {class_ref(type(items))}"
            raise CodecError(f"{path_text(path)}: object array has {got}, expected {size}")
        arr = np.empty(shape, dtype=object)
        flat = arr.reshape(-1)
        flat_path = path if len(shape) == 1 else (path, str, ".flat")
        for i, item in enumerate(items):
            flat[i] = dec.decode(item, (flat_path, index_label, i))
        return arr
    if dt.hasobject:
        raise CodecError(f"{path_text(path)}: numpy dtype {dt!r} holds Python objects; refusing to build it from bytes")
    if kind in ("U", "S"):
        items = node["items"]
        if not isinstance(items, list) or len(items) != size:
            got = f"{len(items)} items" if isinstance(items, list) else f"a {class_ref(type(items))}"
            raise CodecError(f"{path_text(path)}: string array has {got}, expected {size}")
        if dt.kind == "S":
            items = [base64.b64decode(s) for s in items]
        elif not all(type(s) is str for s in items):
            raise CodecError(f"{path_text(path)}: string array holds values that are not strings")
        longest = max(map(len, items), default=0)
        width = dt.itemsize // (4 if dt.kind == "U" else 1)
        if width > longest and dt.itemsize * size > _PADDED_STR_BYTES_LIMIT:
            raise CodecError(
                f"{path_text(path)}: string array of dtype {dt.str} and {size} items would take "
                f"{dt.itemsize * size} bytes, its longest string being {longest} long; refusing a crafted width"
            )
        arr = np.array(items, dtype=dt).reshape(shape)
        if arr.dtype != dt:
            arr = arr.astype(dt)
        return arr
    cache = dec.cache
    ck = ("ndarray", str(node.get("k")))
    if ck in cache:
        return cache[ck]  # type: ignore[no-any-return]
    raw = dec.raw(node, path)
    if node.get("storage", "native") == "bytes":
        arr = flat_bytes(raw).numpy().view(dt)
        if arr.shape != shape:
            arr = arr.reshape(shape)
    else:
        arr = raw.numpy()
        if arr.shape != shape:
            arr = arr.reshape(shape)
        if arr.dtype != dt:
            raise CodecError(f"{path_text(path)}: stored array has dtype {arr.dtype}, expected {dt}")
    cache[ck] = arr
    return arr


def _compact_object_array(elements: Any, shape: tuple[int, ...], form: str, path: NodePath) -> np.ndarray:
    """An object array from the JSON list of a ``strs``/``json`` node; the elements are not copied."""
    size = math.prod(shape)
    if not isinstance(elements, list) or len(elements) != size:
        got = f"{len(elements)} elements" if isinstance(elements, list) else f"a {class_ref(type(elements))}"
        raise CodecError(f"{path_text(path)}: object array {form!r} holds {got}, expected a list of {size}")
    if form == "strs" and not set(map(type, elements)) <= {str}:
        raise CodecError(f"{path_text(path)}: object array 'strs' holds values that are not strings")
    # fromiter stores each element as it is; assigning a list to a slice would broadcast nested lists
    return np.fromiter(elements, dtype=object, count=size).reshape(shape)


def encode_npscalar(obj: np.generic) -> dict[str, Any]:
    """The ``npscalar`` node of a numpy scalar (its dtype and bytes)."""
    arr = np.asarray(obj)
    return {
        "t": "npscalar",
        "dtype": arr.dtype.str,
        "b64": base64.b64encode(arr.tobytes()).decode("ascii"),
    }


def decode_npscalar(dec: DecodeWalk, node: Mapping[str, Any], path: NodePath) -> Any:
    """The numpy scalar of an ``npscalar`` node; dtypes holding objects are refused."""
    dt = np_dtype(node, path)
    if dt.hasobject:
        raise CodecError(f"{path_text(path)}: numpy dtype {dt!r} holds Python objects; refusing to build it from bytes")
    return np.frombuffer(base64.b64decode(node["b64"]), dtype=dt)[0]


def np_dtype(node: Mapping[str, Any], path: NodePath) -> np.dtype[Any]:
    """The numpy dtype of a node's ``dtype`` string (``CodecError`` if it is not a string)."""
    name = node["dtype"]
    if not isinstance(name, str):
        raise CodecError(f"{path_text(path)}: numpy dtype {name!r:.100} is not a string")
    dt = _NP_DTYPES.get(name) if type(name) is str else None
    return np.dtype(name) if dt is None else dt


DECODERS = {"ndarray": decode_ndarray, "npscalar": decode_npscalar}
"""Node tag -> decoder of this module's kinds."""
