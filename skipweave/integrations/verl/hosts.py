"""verl's ``DataProto`` as a codec host type (node kind ``dataproto``).

verl's rollouts return ``DataProto`` batches: ``batch`` (a ``TensorDict`` or None), ``non_tensor_batch`` (a
dict of numpy object arrays) and ``meta_info`` (a dict). The shape is what matters, not the class: any object
with these three attributes is stored as a ``dataproto`` node, so trainers with a batch class of their own
(the shape verl popularised) replay without configuration. A replay rebuilds verl's ``DataProto``, classes
registered with :func:`skipweave.store.classes.register`, trusted ones, and unregistered classes of the
host's own that are data only (outside the standard library, no ``__getattribute__``, no ``__del__``, the
three attributes plain) -- see docs/format.md's threat model for what remains possible.

Decoding builds the object with ``object.__new__`` and sets the three attributes, plus recorded extra
attributes only when their name is an identifier not starting with ``"__"`` (no ``__class__``/``__dict__``
swap) that the class does not define as a data descriptor (no property setter runs); encoding leaves such
attributes out, as it does extra values it cannot encode without pickle. The verl integration registers
:data:`DATAPROTO` when it is loaded, also where verl is not installed (the shape is what matters); registering
imports nothing of verl.
"""

from __future__ import annotations

import inspect
import logging
import types
from collections.abc import Iterable, Mapping
from typing import Any

from skipweave.store.classes import acting_problem, class_ref, library_problem
from skipweave.store.format.tree import CodecError, attr_label, path_text
from skipweave.store.hosts import FingerprintParts, HostType, NodeDecoder, NodeEncoder, Samples

logger = logging.getLogger(__name__)

DATAPROTO_ATTRS = ("batch", "non_tensor_batch", "meta_info")
"""The attributes that make an object DataProto-like, in the order they are stored and hashed."""


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
        return all(hasattr(obj, a) for a in DATAPROTO_ATTRS)
    except Exception:  # a property raising something other than AttributeError
        return False


def _extra_attr_problem(cls: type, name: Any) -> str | None:
    """Why a DataProto-like object's extra attribute ``name`` must not be set (or recorded), or None.

    Allowed: identifiers not starting with ``"__"`` (no ``__class__``/``__dict__`` swaps, no name-mangled
    attributes), other than the three DataProto attributes, that the class does not define as a data
    descriptor (a property setter would run class code on the recorded value; ``__slots__`` members are fine).
    """
    if type(name) is not str or not name.isidentifier():
        return "is not an identifier"
    if name.startswith("__"):
        return "is a dunder or name-mangled attribute"
    if name in DATAPROTO_ATTRS:
        return "is one of batch/non_tensor_batch/meta_info"
    attr = inspect.getattr_static(cls, name, None)
    if attr is not None and not isinstance(attr, types.MemberDescriptorType):
        kind = type(attr)
        if hasattr(kind, "__set__") or hasattr(kind, "__delete__"):
            return f"is a {kind.__name__} of the class"
    return None


def _encode(enc: NodeEncoder, obj: Any, path: Any) -> dict[str, Any]:
    cls = type(obj)
    ref = enc.class_ref(cls, path, "dataproto")
    node: dict[str, Any] = {"t": "dataproto", "cls": ref}
    for attr in DATAPROTO_ATTRS:
        node[attr] = enc.encode(getattr(obj, attr), (path, attr_label, attr))
    extra: dict[str, Any] = {}
    for name, value in getattr(obj, "__dict__", {}).items():
        if name in DATAPROTO_ATTRS:
            continue
        problem = _extra_attr_problem(cls, name)
        if problem:  # decoding would refuse the whole object: leave the attribute out, as unsupported ones
            logger.debug("not recording attribute %r of %s: it %s", name, path_text(path) or "<root>", problem)
            continue
        child = enc.encode_native(value, (path, attr_label, name))  # extras are kept only if natively supported
        if child is not None:
            extra[name] = child
    if extra:
        node["extra"] = extra
    return node


def _decode(dec: NodeDecoder, node: Mapping[str, Any], path: Any) -> Any:
    cls = dec.resolve(node.get("cls"), "dataproto", path)
    extra = node.get("extra", {})
    if not isinstance(extra, Mapping):
        raise CodecError(f"{path_text(path)}: 'extra' is a {class_ref(type(extra))}, not a mapping")
    for name in extra:
        problem = _extra_attr_problem(cls, name)
        if problem:
            raise CodecError(f"{path_text(path)}: recorded attribute {name!r:.100} {problem}; refusing to set it")
    obj: Any = object.__new__(cls)  # no __new__/__init__/__setattr__ of the class runs
    for attr in DATAPROTO_ATTRS:
        object.__setattr__(obj, attr, dec.decode(node[attr], (path, attr_label, attr)))
    for name, vn in extra.items():
        object.__setattr__(obj, name, dec.decode(vn, (path, attr_label, name)))
    return obj


def _children(node: Mapping[str, Any]) -> Iterable[tuple[str, Any]]:
    for attr in DATAPROTO_ATTRS:
        yield f".{attr}", node[attr]
    for k, v in node.get("extra", {}).items():
        yield f".{k}", v


def _class_problem(cls: type) -> str | None:
    """Why an unregistered class may not be rebuilt as a DataProto-like object, or None: a class of the host's
    own whose attribute access is the default one and on which the three attributes are plain."""
    return library_problem(cls) or acting_problem(cls, DATAPROTO_ATTRS)


def _leading(value: Any) -> int | None:
    """The length of ``value``'s first axis (a tensor's, an array's, a sequence's), or None when it has none."""
    shape = getattr(value, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) else None
    return len(value) if isinstance(value, (list, tuple)) else None


def dataproto_samples(view: Mapping[str, Any]) -> Samples | None:
    """The samples of a recorded DataProto-like object (its view, for ``skipweave export``): one per row of
    ``batch`` (its ``batch_size`` when it is a TensorDict, else its tensors' first axis) or, with no batch, of
    ``non_tensor_batch``; its ``batch`` and ``non_tensor_batch`` fields are the columns (a field of both: the
    ``non_tensor_batch`` one is ``non_tensor_batch.<name>``; a field named as one of the call's columns, e.g.
    ``meta_info.k``: ``batch.<name>`` or ``non_tensor_batch.<name>``), ``meta_info`` and recorded extra attributes
    the call's, under their own names. None when neither holds a row (an empty batch)."""
    batch = view.get("batch")
    non_tensor = view.get("non_tensor_batch")
    batch = batch if isinstance(batch, Mapping) else {}
    non_tensor = non_tensor if isinstance(non_tensor, Mapping) else {}
    size = getattr(batch, "batch_size", None)
    count = int(size[0]) if isinstance(size, list) and size else None
    for value in (*batch.values(), *non_tensor.values()):
        if count is not None:
            break
        count = _leading(value)
    if count is None:
        return None
    per_call = {"meta_info": view.get("meta_info")}
    per_call.update({str(k): v for k, v in view.items() if k not in DATAPROTO_ATTRS})
    # the call's fields keep their names (meta_info.k is the call's meta_info["k"]): a sample field named like one
    # is the one renamed, by where it sits
    taken = {name for k, v in per_call.items() for name in _flat_names(k, v)}
    columns: dict[str, Any] = {}
    for k, v in batch.items():
        columns[f"batch.{k}" if str(k) in taken else str(k)] = v
    for k, v in non_tensor.items():
        columns[f"non_tensor_batch.{k}" if str(k) in columns or str(k) in taken else str(k)] = v
    return Samples(count, columns, per_call)


def _flat_names(name: str, value: Any) -> list[str]:
    """The column names a field of the call is exported under (a mapping's keys joined with ``.``, at any depth), and
    every prefix of them (a sample field named ``meta_info`` would read as the mapping itself)."""
    names = [name]
    if isinstance(value, Mapping):
        for k, v in value.items():
            names += _flat_names(f"{name}.{k}", v)
    return names


def _fingerprint(obj: Any) -> FingerprintParts:
    return FingerprintParts(b"P", class_ref(type(obj)), ((a, getattr(obj, a)) for a in DATAPROTO_ATTRS), b"p")


DATAPROTO = HostType(
    kind="dataproto",
    label="DataProto-like object",
    matches=is_dataproto_like,
    encode=_encode,
    decode=_decode,
    children=_children,
    approved=("verl.protocol:DataProto",),
    approved_note="verl's DataProto",
    class_problem=_class_problem,
    shape_rule="DataProto-like classes of your own (already imported, outside the standard library, data only)",
    data_only=True,
    fingerprint=_fingerprint,
    samples=dataproto_samples,
)
"""Host type of DataProto-shaped objects (verl's ``DataProto`` and batch classes of the same shape)."""

__all__ = ["DATAPROTO", "DATAPROTO_ATTRS", "dataproto_samples", "is_dataproto_like"]
