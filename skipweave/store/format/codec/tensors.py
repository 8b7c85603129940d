"""The ``tensor`` kind, and torch's ``Size``, ``dtype`` and ``device`` values.

A ``tensor`` node names its bytes by key (``"k": "t0"``) in the flat tensor dict saved beside the tree, with
``dtype``, ``shape`` and ``device``. Dtypes every safetensors release stores natively are kept as they are;
others are stored as a raw ``uint8`` view (``"storage": "bytes"``) and reinterpreted on decode. Tensors that
were the same Python object are stored once and decode as one shared tensor; ``requires_grad`` and tensor
subclasses are not kept. Decoding copies no CPU data.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from skipweave.store.format.codec.devices import to_recorded_device
from skipweave.store.format.tree import CodecError, NodePath, path_text

if TYPE_CHECKING:
    from skipweave.store.format.codec.walk import DecodeWalk, EncodeWalk

SAFE_TORCH_DTYPES: frozenset[torch.dtype] = frozenset(
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
"""Tensor dtypes every safetensors release (>= 0.4) stores natively; others are stored as raw bytes."""

_TORCH_DTYPES: dict[str, torch.dtype] = {
    f"torch.{n}": dt for n, dt in vars(torch).items() if isinstance(dt, torch.dtype)
}
"""``"torch.<name>"`` -> the dtype, as :func:`torch_dtype` finds it in torch's namespace (looked up first)."""


def encode_tensor(enc: EncodeWalk, obj: torch.Tensor, path: NodePath) -> dict[str, Any]:
    """The ``tensor`` node of ``obj`` (a copy of an alias's node); sparse layouts go to pickle."""
    cached = enc.by_id.get(id(obj))
    if cached is not None:
        return dict(cached)
    if obj.layout != torch.strided:
        return enc.encode_pickle(obj, path, reason=f"tensor layout {obj.layout} is not supported")
    dev = obj.device
    device = str(dev)
    dev_type = dev.type
    if dev_type == "meta":
        raise CodecError(f"{path_text(path)}: meta tensors carry no data and cannot be encoded")
    t = obj.detach()
    if dev_type != "cpu":
        t = t.cpu()
    t = t.resolve_conj().resolve_neg()
    if not t.is_contiguous():
        t = t.contiguous()
    key, mode = enc.store_torch(t)
    node: dict[str, Any] = {
        "t": "tensor",
        "k": key,
        "dtype": str(obj.dtype),
        "shape": list(obj.shape),
        "device": device,
    }
    if mode != "native":
        node["storage"] = mode
    enc.by_id[id(obj)] = node
    enc.keep.append(obj)
    return node


def decode_tensor(dec: DecodeWalk, node: Mapping[str, Any], path: NodePath) -> torch.Tensor:
    """The tensor of a ``tensor`` node, on its recorded device when available; aliases decode as one tensor."""
    cache = dec.cache
    ck = ("tensor", str(node.get("k")))
    if ck in cache:
        return cache[ck]  # type: ignore[no-any-return]
    raw = dec.raw(node, path)
    dtype = torch_dtype(node["dtype"], path)
    shape = node_shape(node, path)
    # reshape/view only when they change something: each costs microseconds even as a no-op
    if node.get("storage", "native") == "bytes":
        t = flat_bytes(raw).view(dtype)
    else:
        if raw.dtype != dtype:
            raise CodecError(f"{path_text(path)}: stored tensor has dtype {raw.dtype}, expected {dtype}")
        t = raw
    if t.shape != shape:
        t = t.reshape(shape)
    device = node.get("device", "cpu")
    if device != "cpu":
        t = to_recorded_device(t, str(device))
    cache[ck] = t
    return t


def node_shape(node: Mapping[str, Any], path: NodePath) -> tuple[int, ...]:
    """The ``shape`` of a tensor or array node, checked to be a list of non-negative ints (``CodecError``)."""
    shape = node["shape"]
    if isinstance(shape, list):
        for x in shape:
            if type(x) is not int or x < 0:
                break
        else:
            return tuple(shape)
    raise CodecError(f"{path_text(path)}: shape {shape!r:.100} is not a list of non-negative ints")


def torch_dtype(name: Any, path: NodePath) -> torch.dtype:
    """The torch dtype a node names (``"torch.float32"``), found without torch's lazy submodule imports.

    Raises:
        CodecError: ``name`` is not a torch dtype.
    """
    dt = _TORCH_DTYPES.get(name) if type(name) is str else None
    if dt is not None:
        return dt
    # vars(), not getattr: torch's module __getattr__ imports submodules lazily, and the name comes from a file
    dt = vars(torch).get(name.removeprefix("torch.")) if isinstance(name, str) else None
    if not isinstance(dt, torch.dtype):
        raise CodecError(f"{path_text(path)}: unknown torch dtype {name!r}")
    return dt


def flat_bytes(raw: torch.Tensor) -> torch.Tensor:
    """``raw.reshape(-1).view(torch.uint8)``, without the no-op calls for an entry stored that way."""
    if raw.dtype == torch.uint8 and raw.dim() == 1:
        return raw
    return raw.reshape(-1).view(torch.uint8)


def from_numpy(arr: np.ndarray) -> torch.Tensor:
    """``torch.from_numpy``, quiet about a read-only array (the codec never writes to the tensor). The warning
    filter is changed only for those: ``warnings.catch_warnings`` is slow and changes every thread's filters."""
    if arr.flags.writeable:
        return torch.from_numpy(arr)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.from_numpy(arr)


DECODERS = {
    "tensor": decode_tensor,
    "torch_size": lambda d, n, p: torch.Size([int(x) for x in n["v"]]),
    "torch_dtype": lambda d, n, p: torch_dtype(n["v"], p),
    "torch_device": lambda d, n, p: torch.device(n["v"]),
}
"""Node tag -> decoder of this module's kinds."""
