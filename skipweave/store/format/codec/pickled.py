"""The ``pickle`` kind: values the codec cannot hold natively, only with the user's consent.

Unpickling a recording can run arbitrary code, so both encoding and decoding refuse it with
:class:`PickleRefused` unless ``allow_pickle`` is set (``skip.<role>.allow_pickle``). The pickled bytes go to
the tensor dict as one ``uint8`` tensor.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from skipweave.store.classes import class_ref
from skipweave.store.format.tree import CodecError, NodePath, path_text

if TYPE_CHECKING:
    from skipweave.store.format.codec.walk import DecodeWalk, EncodeWalk


class PickleRefused(CodecError):
    """The value needs pickle (to encode or to decode) but ``allow_pickle`` is False."""


def encode_pickle(enc: EncodeWalk, obj: Any, path: NodePath, reason: str | None = None) -> dict[str, Any]:
    """The ``pickle`` node of ``obj``.

    Raises:
        PickleRefused: ``enc.allow_pickle`` is False; the message names the path, the type and ``reason``.
        CodecError: ``obj`` cannot be pickled.
    """
    tname = class_ref(type(obj))
    if not enc.allow_pickle:
        why = f" ({reason})" if reason else ""
        raise PickleRefused(
            f"cannot encode {path_text(path) or '<root>'} of type {tname} without pickle{why}; "
            "set skip.<role>.allow_pickle=true to allow pickling it"
        )
    try:
        data = pickle.dumps(obj, protocol=pickle.DEFAULT_PROTOCOL)
    except Exception as exc:
        raise CodecError(f"cannot pickle {path_text(path) or '<root>'} of type {tname}: {exc}") from exc
    key = enc.add(torch.from_numpy(np.frombuffer(data, dtype=np.uint8).copy()))
    enc.pickled = True
    return {"t": "pickle", "k": key, "type": tname, "nbytes": len(data)}


def decode_pickle(dec: DecodeWalk, node: Mapping[str, Any], path: NodePath) -> Any:
    """The object of a ``pickle`` node.

    Raises:
        PickleRefused: ``dec.allow_pickle`` is False.
    """
    if not dec.allow_pickle:
        raise PickleRefused(
            f"{path_text(path) or '<root>'} (type {node.get('type')}): this entry was recorded with "
            "allow_pickle=true; loading it would unpickle data, which can run arbitrary code. Set "
            "skip.<role>.allow_pickle=true (decode(..., allow_pickle=True)) if you trust this recording"
        )
    raw = dec.raw(node, path)
    return pickle.loads(raw.contiguous().numpy().tobytes())


DECODERS = {"pickle": decode_pickle}
"""Node tag -> decoder of this module's kind."""
