"""Class kinds of the user's own: ``dataclass``, ``namedtuple`` and ``enum`` nodes.

Each node names its class as ``"module:qualname"`` (``cls``). A tree is untrusted input, so decoding looks
the class up with :func:`skipweave.store.classes.resolve` (no import unless trusted, static lookup, data-only
rules) and runs none of its code:

* dataclasses are built with ``object.__new__`` and ``object.__setattr__`` (no ``__new__``/``__init__``/
  ``__post_init__``/``__setattr__`` runs), and the node must list exactly the class's
  ``dataclasses.fields`` -- a renamed, missing or extra field is a :class:`CodecError`;
* namedtuples are built with ``tuple.__new__``; the node's keys must be the class's ``_fields``;
* enum members are looked up in the class's member map (a ``Flag`` combination goes through the enum's
  lookup, as at recording).
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from skipweave.store.classes import class_ref
from skipweave.store.format.tree import CodecError, NodePath, attr_label, path_text

if TYPE_CHECKING:
    from skipweave.store.format.codec.walk import DecodeWalk, EncodeWalk


def is_namedtuple(obj: Any) -> bool:
    """True for an instance of a namedtuple class (a ``tuple`` subclass with ``_fields``)."""
    return isinstance(obj, tuple) and type(obj) is not tuple and hasattr(type(obj), "_fields")


def encode_namedtuple(enc: EncodeWalk, obj: Any, path: NodePath) -> dict[str, Any]:
    """The ``namedtuple`` node of ``obj``: its class and each field's node."""
    tp = type(obj)
    ref = enc.class_ref(tp, path, "namedtuple")
    return {
        "t": "namedtuple",
        "cls": ref,
        "v": {f: enc.encode(getattr(obj, f), (path, attr_label, f)) for f in tp._fields},
    }


def encode_dataclass(enc: EncodeWalk, obj: Any, path: NodePath) -> dict[str, Any]:
    """The ``dataclass`` node of ``obj``: its class and each field's node."""
    ref = enc.class_ref(type(obj), path, "dataclass")
    fields = {
        f.name: enc.encode(getattr(obj, f.name), (path, attr_label, f.name)) for f in dataclasses.fields(obj)
    }
    return {"t": "dataclass", "cls": ref, "v": fields}


def encode_enum(enc: EncodeWalk, obj: enum.Enum, path: NodePath) -> dict[str, Any]:
    """The ``enum`` node of a member: by name, or by value for a ``Flag`` combination without one."""
    cls = type(obj)
    ref = enc.class_ref(cls, path, "enum")
    name = obj.name
    if name is not None and cls.__members__.get(name) is obj:
        return {"t": "enum", "cls": ref, "name": name}
    return {"t": "enum", "cls": ref, "value": enc.encode(obj.value, (path, str, ".value"))}


def decode_enum(dec: DecodeWalk, node: Mapping[str, Any], path: NodePath) -> Any:
    """The member an ``enum`` node names, looked up without calling the class (except a Flag combination)."""
    ref = node.get("cls")
    cls = dec.resolve(ref, "enum", path)
    if "name" in node:
        name = node["name"]
        members = inspect.getattr_static(cls, "_member_map_", None)  # what cls[name] reads, without a call
        if not isinstance(members, Mapping) or not isinstance(name, str) or name not in members:
            raise CodecError(f"{path_text(path)}: enum {ref!r} has no member {name!r:.100}")
        return members[name]
    value = dec.decode(node["value"], (path, str, ".value"))
    if not issubclass(cls, enum.Flag):  # only a Flag combination lacks a member of its own
        members = inspect.getattr_static(cls, "_value2member_map_", None)
        try:
            if isinstance(members, Mapping) and value in members:
                return members[value]
        except TypeError:  # an unhashable value
            pass
        raise CodecError(f"{path_text(path)}: enum {ref!r} has no member of value {value!r:.100}")
    # a Flag combination: the enum's lookup builds it, as at recording
    return cls(value)


def decode_namedtuple(dec: DecodeWalk, node: Mapping[str, Any], path: NodePath) -> Any:
    """The namedtuple of a ``namedtuple`` node, built with ``tuple.__new__``."""
    ref = node.get("cls")
    cls = dec.resolve(ref, "namedtuple", path)
    fields: tuple[str, ...] = inspect.getattr_static(cls, "_fields")
    recorded = _fields_node(node, path)
    _check_fields(recorded, fields, ref, path)
    values = {k: dec.decode(v, (path, attr_label, k)) for k, v in recorded.items()}
    return tuple.__new__(cls, tuple(values[f] for f in fields))


def decode_dataclass(dec: DecodeWalk, node: Mapping[str, Any], path: NodePath) -> Any:
    """The dataclass instance of a ``dataclass`` node, built without running the class's code."""
    ref = node.get("cls")
    cls = dec.resolve(ref, "dataclass", path)
    recorded = _fields_node(node, path)
    _check_fields(recorded, [f.name for f in dataclasses.fields(cls)], ref, path)
    obj: Any = object.__new__(cls)  # no __new__/__init__/__post_init__ of the class runs
    for name, vn in recorded.items():
        object.__setattr__(obj, name, dec.decode(vn, (path, attr_label, name)))
    return obj


def _fields_node(node: Mapping[str, Any], path: NodePath) -> Mapping[str, Any]:
    recorded = node["v"]
    if not isinstance(recorded, Mapping):
        raise CodecError(f"{path_text(path)}: fields are a {class_ref(type(recorded))}, not a mapping")
    return recorded


def _check_fields(recorded: Mapping[str, Any], fields: Sequence[str], ref: Any, path: NodePath) -> None:
    """Refuse a node whose field names are not exactly the class's: only declared fields are ever set."""
    if set(recorded) != set(fields) or len(recorded) != len(fields):
        raise CodecError(
            f"{path_text(path)}: recorded fields {list(recorded)} do not match the class's fields {list(fields)} of "
            f"{ref!r} (the class changed since recording, or the tree was edited)"
        )


DECODERS = {"enum": decode_enum, "namedtuple": decode_namedtuple, "dataclass": decode_dataclass}
"""Node tag -> decoder of this module's kinds."""
