"""Where exported rows go: a JSONL or a Parquet file, written under a temporary name and renamed into place.

Both sinks take one call's rows at a time (:class:`Rows`), so memory holds one call's payload and at most one row
group being gathered. The output appears whole or not at all: rows go to ``.{name}.tmp-{token}`` beside it, which is
synced and renamed over ``PATH`` when the export ends, and removed when it fails; an earlier file at ``PATH`` is left
as it was until that rename.

Parquet needs one schema for the file: the first call's. A later call missing a column gets nulls in it; a value of
a wider type is cast (an int column meeting floats); a call bringing a new column, or a type the schema cannot take,
raises :class:`SchemaChanged`, and the exporter writes the file again with a schema unifying every call's
(:func:`unify`). Arrow infers the types of non-numeric columns from their values; a column whose values have no
common type (a mix of strings and lists) or hold an int beyond int64 is written as JSON text (:func:`json_text`), in
both sinks. JSONL writes non-finite floats as null (JSON has no ``NaN``); Parquet keeps them.
"""

from __future__ import annotations

import json
import math
import os
import secrets
from dataclasses import dataclass
from typing import Any

import numpy as np

from skipweave.export.values import numeric_array, plain, rows_of

PARQUET_EXTRA = "export"
"""The extra that installs pyarrow (``pip install 'skipweave[export]'``)."""
ROW_GROUP_ROWS = 4096
"""Rows a Parquet row group gathers from small calls before it is written; a call of more rows is one group."""


class PyarrowMissing(Exception):
    """``--format parquet`` without pyarrow installed; the message names the extra."""


class SchemaChanged(Exception):
    """A call's columns do not fit the Parquet schema taken from the first call (a new column, another type)."""


def require_pyarrow() -> Any:
    """Import and return pyarrow.

    Raises:
        PyarrowMissing: it is not installed (the message names the ``export`` extra).
    """
    try:
        import pyarrow
    except ImportError:
        raise PyarrowMissing(f"--format parquet needs pyarrow: pip install 'skipweave[{PARQUET_EXTRA}]' (or pyarrow); "
                             "--format jsonl needs nothing more") from None
    return pyarrow


@dataclass
class Rows:
    """One call's rows: ``count`` rows of ``columns`` in order; each column either per-sample (``sample=True``: a
    value of ``count`` items along its first axis, or a list of them) or the call's (one value for every row)."""

    count: int
    columns: list[tuple[str, bool, Any]]


class AtomicFile:
    """A temporary file beside ``path`` that :meth:`commit` syncs and renames to ``path``, :meth:`discard` removes."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        folder, name = os.path.split(self.path)
        self.temporary = os.path.join(folder, f".{name}.tmp-{secrets.token_hex(4)}")

    def commit(self) -> None:
        """Sync the temporary file and rename it over ``path``, then sync the folder."""
        fd = os.open(self.temporary, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(self.temporary, self.path)
        try:
            dfd = os.open(os.path.dirname(self.path), os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(dfd)
        except OSError:
            pass  # a folder some file systems cannot sync: the rename is done
        finally:
            os.close(dfd)

    def discard(self) -> None:
        """Remove the temporary file, if it is there."""
        try:
            os.unlink(self.temporary)
        except FileNotFoundError:
            pass


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
"""The ints a column holds as numbers; a value holding another (a Python int of more bits) makes its column JSON text,
in both sinks (Arrow has no wider int; a JSON reader may hold none)."""

_MIXED = "mixed"


def _kind(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int" if INT64_MIN <= value <= INT64_MAX else _MIXED
    if isinstance(value, float):
        return "int"  # ints and floats share a column (as float)
    if isinstance(value, str):
        return "str"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "dict"
    return _MIXED


def typed(values: list[Any]) -> bool:
    """Whether plain values (:func:`~skipweave.export.values.plain`) share one type, as Arrow infers a column's: no
    mix of bools, numbers, strings, lists and mappings (nulls aside), at any depth (a list's items, a mapping's field
    across the values), and no int beyond int64. A column whose values do not is written as JSON text."""
    kinds = {_kind(v) for v in values} - {None}
    if len(kinds) > 1 or _MIXED in kinds:
        return False
    kind = kinds.pop() if kinds else None
    if kind == "list":
        return typed([x for v in values if v is not None for x in v])
    if kind == "dict":
        keys = dict.fromkeys(k for v in values if v is not None for k in v)
        return all(typed([None if v is None else v.get(k) for v in values]) for k in keys)
    return True


def finite(value: Any) -> Any:
    """A plain value with its non-finite floats (``nan``, ``inf``) as None: JSON has no such number."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, list):
        return [finite(x) for x in value]
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    return value


def json_text(value: Any) -> str | None:
    """A plain value as JSON text (what a column of values of no common type holds); None stays None."""
    return None if value is None else json.dumps(finite(value), ensure_ascii=False)


class JsonlSink:
    """One JSON object per row, one line each, keys in column order: portable JSON (no ``NaN``/``Infinity``: non-finite
    floats are null; a column of values of no common type, or holding an int beyond int64, is JSON text, as in
    Parquet)."""

    def __init__(self, path: str) -> None:
        self.file = AtomicFile(path)
        # backslashreplace: every store string is escaped already (values.text); a surrogate that slipped by is
        # escaped rather than failing the export
        self._fh = open(self.file.temporary, "w", encoding="utf-8", errors="backslashreplace")  # noqa: SIM115

    def write(self, rows: Rows) -> None:
        """Write one call's rows."""
        values = [(name, _jsonl_items(v, rows.count) if sample else None,
                   None if sample else _jsonl_items([v], 1)[0]) for name, sample, v in rows.columns]
        lines = []
        for i in range(rows.count):
            doc = {name: (items[i] if items is not None else const) for name, items, const in values}
            lines.append(json.dumps(doc, ensure_ascii=False, allow_nan=False))
        if lines:
            self._fh.write("\n".join(lines) + "\n")

    def close(self) -> None:
        """Finish the file and rename it into place."""
        self._fh.close()
        self.file.commit()

    def abort(self) -> None:
        """Drop what was written; ``PATH`` is left as it was."""
        self._fh.close()
        self.file.discard()


def _jsonl_items(value: Any, count: int) -> list[Any]:
    """The ``count`` items of a per-sample value as JSONL writes them (see :class:`JsonlSink`)."""
    array = numeric_array(value)
    if array is not None:  # numbers of a dtype: typed; only floats may need nulls
        items = array.tolist()
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            items = finite(items)
        return list(items)
    items = rows_of(value, count)
    if not typed(items):
        return [json_text(v) for v in items]
    return [finite(v) for v in items]


def arrow_column(pa: Any, value: Any, count: int, sample: bool) -> Any:
    """The Arrow array of one column of one call's rows (see the module docstring)."""
    if not sample:
        one = _infer(pa, [plain(value)])
        return one.take(pa.array(np.zeros(count, dtype=np.int32)))
    array = numeric_array(value)
    if array is not None:
        return _nested(pa, array)
    return _infer(pa, rows_of(value, count))


def _nested(pa: Any, array: np.ndarray) -> Any:
    """A numeric array of shape ``(n, d1, d2, ...)`` as ``n`` nested lists (variable-size list types, so calls with
    other widths share the schema)."""
    flat = pa.array(np.ascontiguousarray(array).reshape(-1))
    for depth in range(array.ndim - 1, 0, -1):
        width = array.shape[depth]
        outer = int(np.prod(array.shape[:depth]))
        offsets = pa.array(np.arange(0, outer * width + 1, width, dtype=np.int32))
        flat = pa.ListArray.from_arrays(offsets, flat)
    return flat


def _infer(pa: Any, values: list[Any]) -> Any:
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        return pa.array([json_text(v) for v in values], type=pa.string())


class ParquetSink:
    """Rows as Parquet row groups (pyarrow's ``ParquetWriter``), with the schema of the first call or ``schema``."""

    def __init__(self, path: str, schema: Any = None) -> None:
        self.pa = require_pyarrow()
        import pyarrow.parquet as pq

        self._pq = pq
        self.file = AtomicFile(path)
        self.schema = schema
        self._writer: Any = None
        self._pending: list[Any] = []
        self._pending_rows = 0

    def table(self, rows: Rows) -> Any:
        """The Arrow table of one call's rows (as this sink would write it, before fitting the schema)."""
        pa = self.pa
        arrays = [arrow_column(pa, v, rows.count, sample) for _, sample, v in rows.columns]
        return pa.Table.from_arrays(arrays, names=[name for name, _, _ in rows.columns])

    def write(self, rows: Rows) -> None:
        """Write one call's rows (gathered into row groups of about :data:`ROW_GROUP_ROWS`).

        Raises:
            SchemaChanged: they do not fit the file's schema.
        """
        table = self.table(rows)
        if self.schema is None:
            self.schema = table.schema
        table = self._fit(table)
        self._pending.append(table)
        self._pending_rows += table.num_rows
        if self._pending_rows >= ROW_GROUP_ROWS:
            self._flush()

    def _fit(self, table: Any) -> Any:
        pa = self.pa
        extra = [n for n in table.column_names if self.schema.get_field_index(n) < 0]
        if extra:
            raise SchemaChanged(f"columns {extra} are not in the first call's")
        columns = []
        for f in self.schema:
            if f.name in table.column_names:
                column = table.column(f.name)
                if column.type != f.type:
                    try:
                        column = column.cast(f.type)
                    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                        raise SchemaChanged(f"column {f.name!r} is {column.type}, not {f.type}: {exc}") from None
                columns.append(column)
            else:
                columns.append(pa.nulls(table.num_rows, type=f.type))
        return pa.Table.from_arrays(columns, schema=self.schema)

    def _flush(self) -> None:
        if not self._pending:
            return
        if self._writer is None:
            self._writer = self._pq.ParquetWriter(self.file.temporary, self.schema)
        table = self._pending[0] if len(self._pending) == 1 else self.pa.concat_tables(self._pending)
        self._writer.write_table(table, row_group_size=max(table.num_rows, 1))
        self._pending, self._pending_rows = [], 0

    def close(self) -> None:
        """Write what is gathered, finish the file and rename it into place (an export of no row writes a file
        with no column)."""
        self._flush()
        if self._writer is None:
            self._writer = self._pq.ParquetWriter(self.file.temporary, self.schema or self.pa.schema([]))
        self._writer.close()
        self.file.commit()

    def abort(self) -> None:
        """Drop what was written; ``PATH`` is left as it was."""
        try:
            if self._writer is not None:
                self._writer.close()
        finally:
            self.file.discard()


def unify(pa: Any, schemas: list[Any]) -> Any:
    """One schema for every call's (columns in order of first appearance, types promoted: int and float to float,
    null to anything).

    Raises:
        SchemaChanged: two calls' types of one column have no common type (the message names the column).
    """
    try:
        return pa.unify_schemas(schemas, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise SchemaChanged(f"the calls' columns have no common type: {exc}") from None


__all__ = ["INT64_MAX", "INT64_MIN", "PARQUET_EXTRA", "AtomicFile", "JsonlSink", "ParquetSink", "PyarrowMissing",
           "Rows", "SchemaChanged", "arrow_column", "finite", "json_text", "require_pyarrow", "typed", "unify"]
