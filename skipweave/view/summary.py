"""The walk over a store for ``skipweave view``: per step the calls, bytes, samples, response lengths and rewards,
and the first samples of each step for the page's browser.

Entries are read one at a time (results decoded as views, no host class rebuilt) and dropped before the next: what
stays is the summary (a few numbers per step) and at most ``limit`` samples per step, each cut to
:data:`MAX_TOKENS` ids and :data:`MAX_CHARS` characters, so memory is one call's payload plus the summary, and the
page's size grows with the steps, not with their samples. A foreign or damaged entry is named in
:attr:`Summary.skipped` and left out of its step's figures.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from skipweave.export.exporter import VALIDATION_PREFIX, Selection, selected_entries
from skipweave.export.samples import split
from skipweave.view.fields import response_lengths, rewards

logger = logging.getLogger(__name__)

MAX_TOKENS = 512
"""Ids shown per prompt or response of a sample (the rest is counted, not shown)."""
MAX_CHARS = 4000
"""Characters shown per decoded text or field of a sample."""
MAX_FIELD_ITEMS = 16
"""Items shown of a per-sample field holding a sequence (log-probs, values)."""

StepKey = tuple[str, str, str, int, bool]
"""``(namespace, role, target, step, validation)``: one row of the steps table."""


@dataclass
class Stats:
    """Count, sum, min and max of a per-sample figure over a step's samples."""

    count: int = 0
    total: float = 0.0
    low: float = math.inf
    high: float = -math.inf

    def add(self, values: np.ndarray) -> None:
        values = values[np.isfinite(values)] if values.dtype.kind == "f" else values
        if values.size:
            self.count += int(values.size)
            self.total += float(values.sum())
            self.low = min(self.low, float(values.min()))
            self.high = max(self.high, float(values.max()))

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None


@dataclass
class StepRow:
    """What a step of one target recorded (every call and shard of it, validation calls in rows of their own)."""

    namespace: str
    role: str
    target: str
    step: int
    validation: bool
    calls: int = 0
    bytes: int = 0
    samples: int = 0
    lengths: Stats = field(default_factory=Stats)
    rewards: Stats = field(default_factory=Stats)
    reward_field: str | None = None
    skipped: int = 0

    @property
    def key(self) -> StepKey:
        return (self.namespace, self.role, self.target, self.step, self.validation)


@dataclass
class SampleView:
    """One sample as the browser shows it: its call and index, its ids (padding left out, cut to
    :data:`MAX_TOKENS`; the full counts beside them), its decoded texts, reward, and its other fields as short text."""

    shard: str
    call: int
    index: int
    prompt: list[int] | None = None
    response: list[int] | None = None
    prompt_len: int = 0
    response_len: int = 0
    prompt_text: str | None = None
    response_text: str | None = None
    reward: float | None = None
    fields: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class Skipped:
    """An entry left out: where it sits, its status and why."""

    where: str
    call: int
    status: str
    reason: str


@dataclass
class Summary:
    """What :func:`summarize` found."""

    dump_dir: str
    limit: int
    rows: dict[StepKey, StepRow] = field(default_factory=dict)
    samples: dict[StepKey, list[SampleView]] = field(default_factory=dict)
    skipped: list[Skipped] = field(default_factory=list)
    entries: int = 0
    seconds: float = 0.0
    decoded: bool = False
    """Whether a tokenizer decoded texts."""


def summarize(result: Any, *, selection: Selection | None = None, limit: int = 8, tokenizer: Any = None,
              progress: Callable[[int], Any] | None = None) -> Summary:
    """Walk the selected entries of ``result`` (a :class:`~skipweave.store.scan.DumpScan`) in scan order.

    Args:
        result: the scanned dump dir.
        selection: which parts to read (None: all).
        limit: samples kept per step for the browser (the first ones, in call order); 0 keeps none.
        tokenizer: a Hugging Face tokenizer to decode prompts and responses, or None (ids are shown).
        progress: ``total -> bar`` (``update(n)``, ``close()``), or None.

    Returns:
        The :class:`Summary`.
    """
    from skipweave.store.scan import Status

    started = time.perf_counter()
    out = Summary(result.dump_dir, limit, decoded=tokenizer is not None)
    entries = selected_entries(result, selection or Selection())
    bar = progress(len(entries)) if progress is not None else None
    stores: dict[tuple[str, str], Any] = {}
    try:
        for part, entry in entries:
            if bar is not None:
                bar.update(1)
            validation = part.shard.startswith(VALIDATION_PREFIX)
            key = (part.namespace, part.role, part.target, part.step, validation)
            row = out.rows.get(key)
            if row is None:
                row = out.rows[key] = StepRow(*key)
            if entry.status in (Status.FOREIGN, Status.CORRUPT, Status.REFUSED):
                row.skipped += 1
                out.skipped.append(Skipped(part.where, entry.key.call, entry.status.value,
                                           entry.reason or entry.status.value))
                continue
            store = stores.get((part.namespace, part.role))
            if store is None:
                store = stores[(part.namespace, part.role)] = result.store(part.namespace, part.role, views=True)
            try:
                recorded = store.load(entry.key).result
            except Exception as exc:  # noqa: BLE001 - a damaged entry is named and skipped, the rest shown
                row.skipped += 1
                out.skipped.append(Skipped(part.where, entry.key.call, "unreadable", f"{type(exc).__name__}: {exc}"))
                continue
            out.entries += 1
            row.calls += 1
            row.bytes += entry.bytes
            try:
                _add_call(out, row, part.shard, entry.key.call, recorded, tokenizer)
            except Exception as exc:  # noqa: BLE001 - a result of a shape no rule reads: named, the rest shown
                logger.debug("view: %s call %d not summarized", part.where, entry.key.call, exc_info=True)
                out.skipped.append(Skipped(part.where, entry.key.call, "unsummarized",
                                           f"{type(exc).__name__}: {exc}"))
            del recorded
    finally:
        if bar is not None:
            bar.close()
    out.seconds = time.perf_counter() - started
    return out


def _add_call(out: Summary, row: StepRow, shard: str, call: int, recorded: Any, tokenizer: Any) -> None:
    """Add one call's figures to ``row`` and its first samples to the browser's."""
    samples = split(recorded)
    if samples.count is None:
        return
    count = samples.count
    row.samples += count
    lengths = response_lengths(samples.columns, count)
    if lengths is not None:
        row.lengths.add(lengths.astype(np.float64))
    found = rewards(samples.columns, count)
    if found is not None:
        row.reward_field = row.reward_field or found[0]
        row.rewards.add(found[1])
    kept = out.samples.setdefault(row.key, [])
    take = min(out.limit - len(kept), count)
    if take <= 0:
        return
    kept.extend(sample_views(samples.columns, take, shard, call, tokenizer,
                             found[1] if found is not None else None))


def sample_views(columns: dict[str, Any], take: int, shard: str, call: int, tokenizer: Any = None,
                 reward: np.ndarray | None = None) -> list[SampleView]:
    """The first ``take`` samples of a call's per-sample ``columns`` as the browser shows them."""
    from skipweave.export.text import decode_texts, sample_ids, token_fields
    from skipweave.export.values import plain

    head = {name: value[:take] for name, value in columns.items()}
    ids = sample_ids(head, take)
    texts = decode_texts(tokenizer, head, take) if tokenizer is not None and ids else {}
    shown_as_tokens = {name for name, _ in token_fields(columns).values()}
    views = []
    for i in range(take):
        view = SampleView(shard, call, i)
        if "prompt" in ids:
            view.prompt_len = len(ids["prompt"][i])
            view.prompt = ids["prompt"][i][:MAX_TOKENS]
        if "response" in ids:
            view.response_len = len(ids["response"][i])
            view.response = ids["response"][i][:MAX_TOKENS]
        if "prompt_text" in texts:
            view.prompt_text = texts["prompt_text"][i][:MAX_CHARS]
        if "response_text" in texts:
            view.response_text = texts["response_text"][i][:MAX_CHARS]
        if reward is not None:
            view.reward = float(reward[i])
        for name, value in head.items():
            if name in shown_as_tokens:
                continue
            view.fields.append((name, short(plain(value[i]))))
        views.append(view)
    return views


def short(value: Any) -> str:
    """A plain value as short text: a sequence's length and first :data:`MAX_FIELD_ITEMS` items, at most
    :data:`MAX_CHARS` characters."""
    if isinstance(value, list):
        flat = value
        while flat and isinstance(flat[0], list) and len(flat) == 1:
            flat = flat[0]
        head = ", ".join(_number(x) for x in flat[:MAX_FIELD_ITEMS])
        more = f", … ({len(flat)} items)" if len(flat) > MAX_FIELD_ITEMS else ""
        text = f"[{head}{more}]"
    elif isinstance(value, float):
        text = _number(value)
    else:
        text = str(value)
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS] + "…"


def _number(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.4g}"
    if isinstance(x, list):
        return f"[{len(x)} items]"
    return str(x)


__all__ = ["MAX_CHARS", "MAX_FIELD_ITEMS", "MAX_TOKENS", "SampleView", "Skipped", "StepKey", "StepRow", "Stats",
           "Summary", "sample_views", "short", "summarize"]
