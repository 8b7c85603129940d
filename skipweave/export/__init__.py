"""Recorded results as tables: one row per sample, for pandas, ``datasets``, DuckDB (``skipweave export``).

A generic layer: it reads stores through :mod:`skipweave.store.scan`, finds each result's sample axis through the host
types integrations register (:data:`skipweave.store.hosts.HOST_TYPES`), and names no host. Its modules:
:mod:`~skipweave.export.samples` (where a result's samples are), :mod:`~skipweave.export.values` (values as plain
Python), :mod:`~skipweave.export.text` (decoded text), :mod:`~skipweave.export.sinks` (JSONL and Parquet files,
written atomically) and :mod:`~skipweave.export.exporter` (the walk over a store). See docs/export.md.
"""
