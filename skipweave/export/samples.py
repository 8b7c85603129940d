"""Where a recorded result's samples are: its sample axis, its per-sample columns and the fields of the call.

A result is read as a view (:func:`skipweave.store.format.codec.decode_view`): host objects are
:class:`~skipweave.store.format.codec.view.RecordedObject` mappings of their recorded fields, never rebuilt. The
sample axis then comes from:

- a host object whose host type declares one (:attr:`skipweave.store.hosts.HostType.samples`: verl's ``DataProto``
  shape, a ``TensorDict``): asked through the registry, the exporter names no host. When the host type says the
  object has none (a ``TensorDict`` without batch dimensions), it is one row;
- a plain mapping (a dict, a dataclass or namedtuple view, a host object whose type declares no axis): the values
  with a first axis (tensors and arrays of one dimension or more, lists, tuples) are the columns when they all have
  the same length ``N`` (``N`` samples); its other values are the call's. Values of different lengths: no axis;
- a list or tuple of ``N`` mappings: ``N`` samples, their keys the columns (TRL-style records); a tuple of sequences
  of one length ``N``: ``N`` samples, columns ``0``, ``1``, ...; any other list or tuple, or a tensor or array of one
  dimension or more: ``N`` samples of one column, ``result``;
- anything else (a scalar, a string, an empty container): no axis.

A result with no axis is one row for its call, every field a column of that row.

Nested mappings become dotted column names (``meta_info.timing.gen``; a nested ``TensorDict`` of a batch,
``outer.inner``). A per-sample field whose first axis is not the call's sample count (a ``NonTensorData`` holding
one value for the whole batch) is a field of the call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from skipweave.store.hosts import host_for_kind

RESULT = "result"
"""The column of a result (or the part of it) that has no name of its own."""


@dataclass
class CallSamples:
    """One call's result split for export.

    Attributes:
        count: the number of samples, or ``None`` when the result has no sample axis (one row for the call).
        columns: per-sample values by column name, each with ``count`` items along its first axis (tensors,
            numpy arrays, lists); empty when ``count`` is None.
        per_call: the call's values by column name (plain values, tensors, arrays, lists), repeated on each row.
    """

    count: int | None
    columns: dict[str, Any] = field(default_factory=dict)
    per_call: dict[str, Any] = field(default_factory=dict)


def leading(value: Any) -> int | None:
    """The length of ``value``'s first axis: a tensor's or array's of one dimension or more, a list's or a tuple's;
    ``None`` for anything else (strings and mappings included)."""
    shape = getattr(value, "shape", None)
    if shape is not None and not isinstance(value, Mapping):
        try:
            return int(shape[0]) if len(shape) else None
        except (TypeError, IndexError):
            return None
    return len(value) if isinstance(value, (list, tuple)) else None


_NO_DECLARATION = object()


def _host_samples(value: Any) -> Any:
    """The host type's :class:`~skipweave.store.hosts.Samples` of a recorded host object (None: the host type says it
    has no sample axis), or ``_NO_DECLARATION`` when ``value`` is no host object or its type declares no axis."""
    kind = getattr(value, "kind", None)
    host = host_for_kind(kind) if isinstance(kind, str) and isinstance(value, Mapping) else None
    if host is None or host.samples is None:
        return _NO_DECLARATION
    return host.samples(value)


def split(result: Any) -> CallSamples:
    """Split a recorded result (a view) into its samples (see the module docstring)."""
    out = CallSamples(None)
    host = _host_samples(result)
    if host is None:  # its host type says it has no sample axis: one row, every field the call's
        for name, value in result.items():
            _add_call(out, str(name), value)
        return out
    if host is not _NO_DECLARATION:
        out.count = int(host.size)
        for name, value in host.columns.items():
            _add_column(out, str(name), value)
        for name, value in host.per_call.items():
            _add_call(out, str(name), value)
        return out
    if isinstance(result, Mapping):
        lengths = {leading(v) for v in result.values()} - {None}
        if len(lengths) == 1:
            out.count = lengths.pop()
            for name, value in result.items():
                (_add_column if leading(value) == out.count else _add_call)(out, str(name), value)
            return out
        for name, value in result.items():
            _add_call(out, str(name), value)
        return out
    n = leading(result)
    if n is None or n == 0:
        _add_call(out, RESULT, result)
        return out
    out.count = n
    if isinstance(result, (list, tuple)) and all(isinstance(item, Mapping) for item in result):
        keys = list(dict.fromkeys(str(k) for item in result for k in item))
        for key in keys:
            _add_column(out, key, [_get(item, key) for item in result])
    elif isinstance(result, tuple) and len(result) > 1 and {leading(item) for item in result} == {leading(result[0])} \
            and leading(result[0]) is not None:
        out.count = leading(result[0])
        for i, item in enumerate(result):
            _add_column(out, str(i), item)
    else:
        _add_column(out, RESULT, result)
    return out


def _get(item: Mapping[Any, Any], key: str) -> Any:
    """``item[key]`` where the mapping's key is ``key`` written as text (keys of records need not be strings)."""
    for k, v in item.items():
        if str(k) == key:
            return v
    return None


def _add_column(out: CallSamples, name: str, value: Any) -> None:
    """Add a per-sample value: a nested host object with the same sample count, or a mapping, by its fields (dotted
    names); a value with another first axis, as the call's."""
    assert out.count is not None
    host = _host_samples(value)
    if host is not None and host is not _NO_DECLARATION and int(host.size) == out.count:
        for k, v in host.columns.items():
            _add_column(out, f"{name}.{k}", v)
        for k, v in host.per_call.items():
            _add_call(out, f"{name}.{k}", v)
        return
    if isinstance(value, Mapping):
        for k, v in value.items():
            _add_column(out, f"{name}.{k}", v)
        return
    if leading(value) == out.count:
        out.columns[name] = value
    else:
        _add_call(out, name, value)


def _add_call(out: CallSamples, name: str, value: Any) -> None:
    """Add a value of the call; a mapping by its fields (dotted names)."""
    if isinstance(value, Mapping) and value:
        for k, v in value.items():
            _add_call(out, f"{name}.{k}", v)
        return
    if isinstance(value, Mapping):
        return  # an empty mapping (meta_info={}) adds no column
    out.per_call[name] = value


__all__ = ["RESULT", "CallSamples", "leading", "split"]
