"""Container kinds: ``dict`` (and ``OrderedDict``), ``list``, ``tuple``, ``set``, ``frozenset``.

A dict node keeps key types and order: ``"v"`` maps the keys when every key is exactly a ``str``, else
``"kv"`` lists ``[key node, value node]`` pairs; ``"ordered": true`` marks an ``OrderedDict``. Set members
are sorted by their node's JSON so a tree does not depend on the process's hash seed. A reference cycle
through a container cannot be encoded.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from skipweave.store.format.tree import NodePath, index_label, key_label

if TYPE_CHECKING:
    from skipweave.store.format.codec.walk import DecodeWalk, EncodeWalk


def _key_repr_label(k: Any) -> str:
    return f"<key {k!r}>"


def _item_repr_label(v: Any) -> str:
    return f"<item {v!r}>"


def encode_plain_dict(enc: EncodeWalk, obj: dict[Any, Any], path: NodePath) -> dict[str, Any]:
    """The node of an exact ``dict`` (the encoder's fast path: one call less per dict)."""
    oid = enc.push(obj, path)
    try:
        return encode_mapping(enc, obj, path, {"t": "dict"})
    finally:
        enc.stack.discard(oid)


def encode_plain_seq(enc: EncodeWalk, obj: list[Any] | tuple[Any, ...], path: NodePath) -> dict[str, Any]:
    """The node of an exact ``list`` or ``tuple`` (the encoder's fast path)."""
    oid = enc.push(obj, path)
    try:
        encode = enc.encode
        return {"t": type(obj).__name__, "v": [encode(v, (path, index_label, i)) for i, v in enumerate(obj)]}
    finally:
        enc.stack.discard(oid)


def encode_container(enc: EncodeWalk, obj: Any, path: NodePath) -> dict[str, Any]:
    """The node of a ``dict``, ``OrderedDict``, ``list``, ``tuple``, ``set`` or ``frozenset`` (exact types)."""
    tp = type(obj)
    if tp is dict or tp is collections.OrderedDict:
        node: dict[str, Any] = {"t": "dict"}
        if tp is collections.OrderedDict:
            node["ordered"] = True
        return encode_mapping(enc, obj, path, node)
    if tp is list or tp is tuple:
        return {
            "t": tp.__name__,
            "v": [enc.encode(v, (path, index_label, i)) for i, v in enumerate(obj)],
        }
    items = [enc.encode(v, (path, _item_repr_label, v)) for v in obj]
    items.sort(key=lambda n: json.dumps(n, sort_keys=True))  # deterministic trees across processes
    return {"t": tp.__name__, "v": items}


def encode_mapping(enc: EncodeWalk, obj: dict[Any, Any], path: NodePath, node: dict[str, Any]) -> dict[str, Any]:
    """Fill a ``dict`` node: ``"v"`` when every key is exactly a ``str``, else ``"kv"`` pairs."""
    encode = enc.encode
    for k in obj:
        if type(k) is not str:
            break
    else:
        node["v"] = {k: encode(v, (path, key_label, k)) for k, v in obj.items()}
        return node
    node["kv"] = [[encode(k, (path, _key_repr_label, k)), encode(v, (path, key_label, k))] for k, v in obj.items()]
    return node


def decode_dict(dec: DecodeWalk, node: Mapping[str, Any], path: NodePath) -> dict[Any, Any]:
    """The dict (or ``OrderedDict``) of a ``dict`` node."""
    out: dict[Any, Any] = collections.OrderedDict() if node.get("ordered") else {}
    decode = dec.decode
    if "v" in node:
        for k, v in node["v"].items():
            out[k] = decode(v, (path, key_label, k))
    else:
        for kn, vn in node["kv"]:
            k = decode(kn, (path, str, "<key>"))
            out[k] = decode(vn, (path, key_label, k))
    return out


def decode_seq(dec: DecodeWalk, node: Mapping[str, Any], path: NodePath) -> Any:
    """The list, tuple, set or frozenset of a node of that tag."""
    items = [dec.decode(v, (path, index_label, i)) for i, v in enumerate(node["v"])]
    return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[node["t"]](items)


DECODERS = {
    "dict": decode_dict,
    "list": decode_seq,
    "tuple": decode_seq,
    "set": decode_seq,
    "frozenset": decode_seq,
}
"""Node tag -> decoder of this module's kinds."""
