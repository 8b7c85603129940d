"""tensordict's ``TensorDict`` (plain and lazy stacks) and ``NonTensorData`` as codec host types.

verl's V1 trainer passes ``TensorDict`` batches to its rollout; their tensors go to the store's tensor file
and their structure to nodes of kinds ``tensordict`` and ``nontensordata`` (:mod:`skipweave.store.hosts`).
The integration (:data:`skipweave.integrations.tensordict.INTEGRATION`) registers :data:`TENSORDICT` and
:data:`NON_TENSOR_DATA` when it is loaded. Objects are recognised by their classes' module and name, so registering
imports nothing of tensordict;
decoding builds through tensordict's own constructors, from classes tensordict's package defines.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from skipweave.store.classes import class_ref
from skipweave.store.format.tree import CodecError, attr_label, key_label, path_text
from skipweave.store.hosts import Compared, FingerprintParts, HostType, NodeDecoder, NodeEncoder, Samples


def _in_tensordict(cls: type) -> bool:
    mod = getattr(cls, "__module__", "") or ""
    return mod == "tensordict" or mod.startswith("tensordict.")


def _mro_has(cls: type, name: str) -> bool:
    return any(c.__name__ == name and _in_tensordict(c) for c in cls.__mro__)


def is_tensordict(obj: Any) -> bool:
    """True if ``obj`` is a tensordict ``TensorDict`` (any ``TensorDictBase``), without importing tensordict.

    Args:
        obj: any object (a class is not a TensorDict).
    """
    return not isinstance(obj, type) and _mro_has(type(obj), "TensorDictBase")


def is_tensordict_class(cls: type) -> bool:
    """True for a class defined in the ``tensordict`` package whose MRO holds its ``TensorDictBase``."""
    return _in_tensordict(cls) and _mro_has(cls, "TensorDictBase")


def is_tensorclass(obj: Any) -> bool:
    """True for an instance of a ``@tensorclass`` class."""
    return not isinstance(obj, type) and getattr(type(obj), "_is_tensorclass", False) is True


def _is_non_tensor_data(obj: Any) -> bool:
    tp = type(obj)
    return is_tensorclass(obj) and tp.__name__ == "NonTensorData" and _in_tensordict(tp)


def _td_label(i: Any) -> str:
    return f".tensordicts[{i}]"


# --------------------------------------------------------------------------------------------------------
# TensorDict, LazyStackedTensorDict, NonTensorStack: node kind "tensordict"


def _encode_tensordict(enc: NodeEncoder, obj: Any, path: Any) -> dict[str, Any]:
    ref = enc.class_ref(type(obj), path, "tensordict")
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
        node["stack"] = [enc.encode(td, (path, _td_label, i)) for i, td in enumerate(parts)]
        return node
    items: dict[str, Any] = {}
    for k, v in obj.items():
        if type(k) is not str:
            raise CodecError(f"{path_text(path)}: TensorDict key {k!r} of type {class_ref(type(k))} is not supported")
        items[k] = enc.encode(v, (path, key_label, k))
    node["v"] = items
    return node


def _td_class(dec: NodeDecoder, ref: Any, kind: str, path: Any) -> Any:
    try:
        return dec.resolve(ref, kind, path)
    except CodecError as exc:
        raise CodecError(f"{exc}; this entry holds a {ref}, which needs the 'tensordict' package, imported") from None


def _decode_tensordict(dec: NodeDecoder, node: Mapping[str, Any], path: Any) -> Any:
    ref = node.get("cls") or "tensordict:TensorDict"
    cls = _td_class(dec, ref, "tensordict", path)
    device = dec.device(node.get("device"))
    if "stack" in node:
        if not _mro_has(cls, "LazyStackedTensorDict"):
            raise CodecError(
                f"{path_text(path)}: {ref!r} is not a lazy stack of tensordicts; refusing to stack into it")
        parts = [dec.decode(n, (path, _td_label, i)) for i, n in enumerate(node["stack"])]
        for i, part in enumerate(parts):
            if not (is_tensordict(part) or is_tensorclass(part)):
                raise CodecError(
                    f"{path_text(path)}.tensordicts[{i}]: a {class_ref(type(part))} cannot be stacked in a {ref}")
        return cls(*parts, stack_dim=int(node["stack_dim"]))
    if getattr(cls, "__name__", "") != "TensorDict":
        # other TensorDictBase subclasses cannot be rebuilt from items: return a plain TensorDict
        cls = _td_class(dec, "tensordict:TensorDict", "tensordict", path)
    items = {k: dec.decode(v, (path, key_label, k)) for k, v in node["v"].items()}
    return cls(items, batch_size=[int(x) for x in node["batch_size"]], device=device)


def _tensordict_children(node: Mapping[str, Any]) -> Iterable[tuple[str, Any]]:
    if "stack" in node:
        return ((f".tensordicts[{i}]", v) for i, v in enumerate(node["stack"]))
    return ((key_label(k), v) for k, v in node["v"].items())


def compared(obj: Any) -> Compared:
    """What verify compares of a ``TensorDict`` (a lazy stack, a ``NonTensorData``; or the view of a recorded one):
    its entries by key (``keys()``, not iteration: a ``TensorDict`` is a ``Mapping`` whose iteration walks its batch
    dimension) and its batch size beside them."""
    return Compared({k: obj[k] for k in obj.keys()}, getattr(obj, "batch_size", None))


def _tensordict_fingerprint(obj: Any) -> FingerprintParts:
    return FingerprintParts(b"X", ",".join(str(int(d)) for d in obj.batch_size),
                            ((str(k), obj[k]) for k in sorted(obj.keys(), key=str)), b"x")


def tensordict_samples(view: Mapping[str, Any]) -> Samples | None:
    """The samples of a recorded TensorDict (its view, for ``skipweave export``): one per index of its first batch
    dimension, every entry a column (a nested TensorDict's entries as ``outer.inner``). A lazy stack's parts are
    its samples when they are stacked along that dimension (as many parts as its first batch dimension). None
    for a TensorDict without batch dimensions (``batch_size`` ``[]``)."""
    size = getattr(view, "batch_size", None)
    if not isinstance(size, list) or not size:
        return None
    parts = view.get("tensordicts")
    if isinstance(parts, list) and len(view) == 1:  # a lazy stack: its parts are its rows when stacked on dim 0
        if len(parts) != size[0] or not all(isinstance(p, Mapping) for p in parts):
            return None
        keys = list(dict.fromkeys(k for p in parts for k in p))
        return Samples(int(size[0]), {str(k): [p.get(k) for p in parts] for k in keys}, {})
    return Samples(int(size[0]), {str(k): v for k, v in view.items()}, {})


TENSORDICT = HostType(
    kind="tensordict",
    label="TensorDict",
    matches=is_tensordict,
    encode=_encode_tensordict,
    decode=_decode_tensordict,
    children=_tensordict_children,
    approved=(
        "tensordict:TensorDict",
        "tensordict._td:TensorDict",
        "tensordict:LazyStackedTensorDict",
        "tensordict._lazy:LazyStackedTensorDict",
        "tensordict:NonTensorStack",
        "tensordict.tensorclass:NonTensorStack",
    ),
    approved_note="tensordict's classes",
    # the decoder builds only TensorDicts or lazy stacks from such nodes, so tensordict's own subclasses are fine
    class_problem=lambda cls: None if is_tensordict_class(cls) else "is not a tensordict class",
    fingerprint=_tensordict_fingerprint,
    samples=tensordict_samples,
    compared=compared,
)
"""Host type of tensordict's ``TensorDictBase`` instances (node kind ``tensordict``)."""


# --------------------------------------------------------------------------------------------------------
# NonTensorData: node kind "nontensordata"; other tensorclasses are not supported (pickle)


def _encode_tensorclass(enc: NodeEncoder, obj: Any, path: Any) -> dict[str, Any]:
    if not _is_non_tensor_data(obj):
        return enc.encode_pickle(obj, path, reason="tensorclass instances are not supported")
    device = getattr(obj, "device", None)
    return {
        "t": "nontensordata",
        "cls": enc.class_ref(type(obj), path, "nontensordata"),
        "batch_size": [int(x) for x in obj.batch_size],
        "device": None if device is None else str(device),
        "data": enc.encode(obj.data, (path, str, ".data")),
    }


def _decode_nontensordata(dec: NodeDecoder, node: Mapping[str, Any], path: Any) -> Any:
    cls = _td_class(dec, node.get("cls"), "nontensordata", path)
    data = dec.decode(node["data"], (path, str, ".data"))
    return cls(data=data, batch_size=[int(x) for x in node["batch_size"]], device=dec.device(node.get("device")))


NON_TENSOR_DATA = HostType(
    kind="nontensordata",
    label="tensordict NonTensorData",
    matches=is_tensorclass,
    encode=_encode_tensorclass,
    decode=_decode_nontensordata,
    children=lambda node: ((attr_label("data"), node["data"]),),
    approved=("tensordict:NonTensorData", "tensordict.tensorclass:NonTensorData"),
    compared=compared,
)
"""Host type of tensorclass instances: ``NonTensorData`` is stored, other tensorclasses need pickle."""

__all__ = ["NON_TENSOR_DATA", "TENSORDICT", "compared", "is_tensorclass", "is_tensordict", "is_tensordict_class",
           "tensordict_samples"]
