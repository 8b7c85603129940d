"""Recorded values as plain Python values (JSON-ready): what a JSONL row holds and what Arrow infers types from.

Tensors and numeric arrays become (nested) lists of numbers (``bfloat16`` and ``float16`` as Python floats); object
arrays, lists, tuples and sets become lists of their items' plain values; mappings become dicts with string keys;
numpy scalars their Python value; bytes their base64 text; enum members (views) ``Class.member``; other values (a
``torch.dtype``, a complex number, a datetime) their ``str``. Non-finite floats stay ``nan``/``inf`` (the JSONL sink
writes them as null, :func:`skipweave.export.sinks.finite`). A string holding surrogates (the codec stores them, as
``surrogatepass``: a valid recording) has them escaped as text (``\\udcff``, :func:`text`): UTF-8 cannot hold them.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch


def text(value: str) -> str:
    """``value`` with any surrogate code point escaped (``"\\udcff"``, as ``backslashreplace`` writes it), so UTF-8
    (a JSONL line, an Arrow string, an HTML page) can hold it; any other string is returned as it is."""
    if value.isascii():
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


def plain(value: Any) -> Any:
    """``value`` as plain Python (see the module docstring)."""
    if isinstance(value, str):
        return text(value)
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, torch.Tensor):
        return _tensor_list(value)
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "biuf":  # numbers: tolist gives plain values already
            return value.tolist()
        if value.dtype.kind == "U":
            return plain(value.tolist())
        items = value.tolist()  # objects, datetimes, bytes: each item made plain
        return plain(items) if value.ndim else plain(value.item())
    if isinstance(value, np.generic):
        return plain(value.item())
    if isinstance(value, Mapping):
        return {text(str(k)): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(x) for x in value]
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, torch.Size):
        return list(value)
    return text(str(value))


def _tensor_list(tensor: torch.Tensor) -> Any:
    t = tensor.detach().cpu()
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.float()
    if t.is_nested:
        return [_tensor_list(x) for x in t.unbind()]
    return t.tolist()


def rows_of(value: Any, count: int) -> list[Any]:
    """The ``count`` items of a per-sample value (its first axis) as plain values."""
    if isinstance(value, torch.Tensor):
        out = _tensor_list(value)
    elif isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        out = value.tolist()
    else:
        out = [plain(x) for x in value]
    if len(out) != count:  # the splitter checked the first axis; a nested tensor's unbind is the one other path
        raise ValueError(f"a column of {len(out)} items in a call of {count} samples")
    return list(out)


def numeric_array(value: Any) -> np.ndarray | None:
    """``value`` as a numeric numpy array (bool, int, uint, float; half floats widened to float32), or None when it
    is not a strided tensor or numeric array."""
    if isinstance(value, torch.Tensor):
        if value.is_nested or value.layout is not torch.strided or value.is_complex():
            return None
        t = value.detach().cpu()
        if t.dtype in (torch.bfloat16, torch.float16):
            t = t.float()
        return t.numpy()
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        return value.astype(np.float32) if value.dtype == np.float16 else value
    return None


__all__ = ["numeric_array", "plain", "rows_of", "text"]
