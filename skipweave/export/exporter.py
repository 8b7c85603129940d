"""Export a dump dir's recorded results as one row per sample (``skipweave export``).

The store is read through :func:`skipweave.store.scan.scan` and the role stores it gives
(:meth:`~skipweave.store.scan.DumpScan.store`), the judgement ``skipweave ls`` and a run apply, with results decoded as
read-only views (no host class is rebuilt: :func:`skipweave.store.format.codec.decode_view`). Entries of every format
version this skipweave reads are exported; a foreign entry (a newer format) and a damaged one (corrupt, refused as
pickled, or failing its checksum or decoding when read) are skipped and named in :attr:`ExportReport.skipped`, and
the rest exported.

Each row holds, in order: where the call sits (:data:`WHERE_COLUMNS`), the sample's index (``None`` for a result
with no sample axis: one row per call), the per-sample fields of the result, ``prompt_text``/``response_text`` with a
tokenizer (:mod:`skipweave.export.text`), then the fields of the call (``meta_info.*``, scalars). A recorded field
whose name is taken by one of these is ``result.<name>``: the where columns first, then the call's fields keep
their names, and a per-sample field named like one of them is the one renamed (a host type may rename it first, by
where it sits: verl's ``non_tensor_batch.<name>``). :mod:`skipweave.export.samples` says where the samples are.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from skipweave.export.samples import split
from skipweave.export.sinks import JsonlSink, ParquetSink, Rows, SchemaChanged, require_pyarrow, unify
from skipweave.export.text import TEXT_COLUMNS, decode_texts
from skipweave.export.values import text

logger = logging.getLogger(__name__)

WHERE_COLUMNS = ("namespace", "role", "target", "step", "call", "shard", "validation")
"""The columns naming a row's call: its namespace, role, target, step, call index, shard, and whether it is a
validation call (recorded in a ``val_`` shard)."""
SAMPLE_COLUMN = "sample"
RESERVED = (*WHERE_COLUMNS, SAMPLE_COLUMN, *TEXT_COLUMNS)
FORMATS = ("parquet", "jsonl")
VALIDATION_PREFIX = "val_"


@dataclass(frozen=True)
class Selection:
    """Which entries to export: ``None`` selects all."""

    namespace: str | None = None
    role: str | None = None
    targets: tuple[str, ...] | None = None
    steps: Any = None
    """A :class:`~skipweave.config.values.StepSet` (``in`` tests a step), or None."""

    def takes(self, part: Any) -> bool:
        """Whether a part (:class:`~skipweave.store.scan.PartScan`) is selected."""
        return not ((self.namespace is not None and part.namespace != self.namespace)
                    or (self.role is not None and part.role != self.role)
                    or (self.targets and part.target not in self.targets)
                    or (self.steps is not None and part.step not in self.steps))


@dataclass
class Skipped:
    """An entry not exported: ``status`` is ``foreign``, ``corrupt``, ``refused`` or ``unreadable`` (it failed when
    read: a checksum, its decoding)."""

    status: str
    namespace: str
    role: str
    target: str
    step: int
    shard: str
    call: int
    path: str
    reason: str

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @property
    def damaged(self) -> bool:
        """A damaged entry (anything but foreign)."""
        return self.status != "foreign"


@dataclass
class ExportReport:
    """What an export wrote and skipped."""

    output: str
    format: str
    rows: int = 0
    calls: int = 0
    columns: list[str] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    seconds: float = 0.0
    passes: int = 1
    """Passes over the store: 2 when the calls' columns differed and the Parquet file was written again."""

    def to_json(self) -> dict[str, Any]:
        return {"output": self.output, "format": self.format, "rows": self.rows, "calls": self.calls,
                "columns": self.columns, "skipped": [s.to_json() for s in self.skipped],
                "seconds": round(self.seconds, 3), "passes": self.passes}


def selected_entries(result: Any, selection: Selection) -> list[tuple[Any, Any]]:
    """The ``(part, entry)`` pairs of a :class:`~skipweave.store.scan.DumpScan` an export reads, in scan order."""
    return [(p, e) for p in result.parts if selection.takes(p) for e in p.entries]


def export(result: Any, output: str, fmt: str, *, selection: Selection = Selection(), tokenizer: Any = None,
           progress: Callable[[int], Any] | None = None) -> ExportReport:
    """Write one row per recorded sample of the scanned dump dir ``result`` to ``output``.

    Args:
        result: a :class:`~skipweave.store.scan.DumpScan`.
        output: the file to write (replaced whole when the export succeeds, untouched when it fails).
        fmt: ``parquet`` or ``jsonl``.
        selection: which parts to export.
        tokenizer: a Hugging Face tokenizer for ``prompt_text``/``response_text``, or None.
        progress: ``total -> bar`` (a tqdm-like object with ``update(n)`` and ``close()``), or None for none.

    Returns:
        The :class:`ExportReport`.

    Raises:
        ValueError: ``fmt`` is not one of :data:`FORMATS`.
        PyarrowMissing: ``fmt`` is ``parquet`` and pyarrow is not installed.
        SchemaChanged: two calls' columns have no common Parquet type.
        OSError: the output cannot be written (nothing is left at ``output`` but what was there).
    """
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r} is not one of {', '.join(FORMATS)}")
    entries = selected_entries(result, selection)
    started = time.perf_counter()
    report = ExportReport(output, fmt)
    if fmt == "jsonl":
        _write(JsonlSink(output), result, entries, tokenizer, report, progress)
    else:
        require_pyarrow()
        try:
            _write(ParquetSink(output), result, entries, tokenizer, report, progress)
        except SchemaChanged as first:
            logger.info("export: the calls' columns differ (%s); reading the store again for one schema", first)
            schema = _one_schema(result, entries, tokenizer, output)
            report = ExportReport(output, fmt, passes=2)
            _write(ParquetSink(output, schema), result, entries, tokenizer, report, progress)
    report.seconds = time.perf_counter() - started
    return report


def _one_schema(result: Any, entries: list[tuple[Any, Any]], tokenizer: Any, output: str) -> Any:
    """The Parquet schema of every call's columns (a pass over the store that writes nothing), in the order of one
    call's: where, sample, the per-sample fields, the call's fields.

    Raises:
        SchemaChanged: two calls' types of one column have no common type.
    """
    pa = require_pyarrow()
    probe = ParquetSink(output)  # opens nothing: only builds tables
    scratch = ExportReport(output, "parquet")  # what this pass skips, the pass that writes reports
    schemas: list[Any] = []
    per_sample: set[str] = set()
    for rows in _rows(result, entries, tokenizer, scratch):
        schemas.append(probe.table(rows).schema)
        per_sample.update(name for name, sample, _ in rows.columns if sample)
    unified = unify(pa, schemas)
    leading = (*WHERE_COLUMNS, SAMPLE_COLUMN)
    order = sorted(range(len(unified.names)), key=lambda i: (
        0 if unified.names[i] in leading else 1 if unified.names[i] in per_sample else 2, i))
    return pa.schema([unified.field(i) for i in order])


def _write(sink: Any, result: Any, entries: list[tuple[Any, Any]], tokenizer: Any, report: ExportReport,
           progress: Callable[[int], Any] | None) -> None:
    bar = progress(len(entries)) if progress is not None else None
    try:
        for rows in _rows(result, entries, tokenizer, report, bar):
            sink.write(rows)
            report.calls += 1
            report.rows += rows.count
            for name, _, _ in rows.columns:
                if name not in report.columns:
                    report.columns.append(name)
        sink.close()
        names = getattr(getattr(sink, "schema", None), "names", None)
        if names is not None:  # Parquet: the file's columns, in the order of its schema (unified ones too)
            report.columns = list(names)
    except BaseException:
        sink.abort()
        raise
    finally:
        if bar is not None:
            bar.close()


def _rows(result: Any, entries: list[tuple[Any, Any]], tokenizer: Any, report: ExportReport,
          bar: Any = None) -> Iterator[Rows]:
    """Each selected entry's :class:`Rows`, in order; skipped entries go to ``report.skipped``."""
    from skipweave.store.scan import Status

    stores: dict[tuple[str, str], Any] = {}
    for part, entry in entries:
        if bar is not None:
            bar.update(1)
        if entry.status in (Status.FOREIGN, Status.CORRUPT, Status.REFUSED):
            reason = entry.reason or entry.status.value
            if entry.status is Status.REFUSED:
                reason += " (or pass --allow-pickle)"
            report.skipped.append(_skipped(entry.status.value, part, entry, reason))
            continue
        store = stores.get((part.namespace, part.role))
        if store is None:
            store = stores[(part.namespace, part.role)] = result.store(part.namespace, part.role, views=True)
        try:
            recorded = store.load(entry.key).result
        except Exception as exc:  # noqa: BLE001 - a damaged entry is named and skipped, the rest exported
            report.skipped.append(_skipped("unreadable", part, entry, f"{type(exc).__name__}: {exc}"))
            continue
        yield call_rows(part, entry.key.call, recorded, tokenizer)
        del recorded


def _skipped(status: str, part: Any, entry: Any, reason: str) -> Skipped:
    return Skipped(status, part.namespace, part.role, part.target, part.step, part.shard, entry.key.call,
                   entry.path, reason)


def call_rows(part: Any, call: int, recorded: Any, tokenizer: Any = None) -> Rows:
    """The rows of one recorded result (a view) of ``part`` (a :class:`~skipweave.store.scan.PartScan`)."""
    samples = split(recorded)
    count = samples.count if samples.count is not None else 1
    where = (text(part.namespace), text(part.role), text(part.target), part.step, call, text(part.shard),
             part.shard.startswith(VALIDATION_PREFIX))
    columns: list[tuple[str, bool, Any]] = [(n, False, v) for n, v in zip(WHERE_COLUMNS, where, strict=True)]
    columns.append((SAMPLE_COLUMN, samples.count is not None,
                    list(range(count)) if samples.count is not None else None))
    taken = set(RESERVED)

    def name_of(name: str) -> str:
        name = text(name)  # a recorded key may hold surrogates: the file's column names are UTF-8
        while name in taken:
            name = f"result.{name}"
        taken.add(name)
        return name

    # the call's fields are named first: they keep their names (meta_info.k is the call's meta_info["k"]), and a
    # per-sample field named like one is the one renamed
    per_call = [(name_of(n), False, v) for n, v in samples.per_call.items()]
    if samples.count is None:  # one row: the call's fields are its columns
        return Rows(1, columns + per_call)
    columns += [(name_of(n), True, v) for n, v in samples.columns.items()]
    if tokenizer is not None:
        texts = decode_texts(tokenizer, samples.columns, count)
        columns += [(n, True, texts[n]) for n in TEXT_COLUMNS if n in texts]
    return Rows(count, columns + per_call)


__all__ = ["FORMATS", "RESERVED", "SAMPLE_COLUMN", "WHERE_COLUMNS", "ExportReport", "Selection", "Skipped",
           "call_rows", "export", "selected_entries"]
