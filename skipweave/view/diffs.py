"""A diff on the page: ``skipweave diff``'s rows (or a verify run's report lines) per step, and the first diverging
sample side by side.

The rows are computed by the caller (``skipweave view`` runs :func:`skipweave.cli.diff.diff_rows`, the comparison
``skipweave diff`` makes, or reads a verify run's report, :func:`skipweave.verify.report.read_lines`); this module only
groups them and reads the two entries of the first divergence again, to show the sample its first differing token
sits in: A's and B's ids of that sample side by side, the token at the first differing position marked. A verify
report holds no live result: B's side is then A's ids up to the position and the live token the report names there.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from skipweave.export.exporter import VALIDATION_PREFIX

logger = logging.getLogger(__name__)

WINDOW = 96
"""Ids shown either side of the first differing position."""


@dataclass
class DiffStep:
    """The diff's rows of one step of one target (validation calls apart)."""

    role: str
    target: str
    step: int
    validation: bool
    statuses: dict[str, int] = field(default_factory=dict)
    token_match: float | None = None
    """The lowest token match ratio of the step's compared entries."""
    max_abs_diff: float | str | None = None
    first_field: str = ""

    @property
    def failing(self) -> bool:
        return any(s not in ("identical", "close") for s in self.statuses)


def is_validation(row: Mapping[str, Any]) -> bool:
    """Whether a diff row or report line is of a validation call."""
    return bool(row.get("validation")) or str(row.get("shard", "")).startswith(VALIDATION_PREFIX)


def diff_steps(rows: Iterable[Mapping[str, Any]]) -> list[DiffStep]:
    """The rows grouped per role, target, validation and step, in that order."""
    steps: dict[tuple[str, str, bool, int], DiffStep] = {}
    for r in rows:
        key = (str(r["role"]), str(r["target"]), is_validation(r), int(r["step"]))
        s = steps.get(key)
        if s is None:
            s = steps[key] = DiffStep(key[0], key[1], key[3], key[2])
        status = str(r["status"])
        s.statuses[status] = s.statuses.get(status, 0) + 1
        match = r.get("token_match")
        if isinstance(match, (int, float)):
            s.token_match = match if s.token_match is None else min(s.token_match, match)
        delta = r.get("max_abs_diff")
        if isinstance(delta, str):
            s.max_abs_diff = delta  # inf / nan: nothing is larger
        elif isinstance(delta, (int, float)) and not isinstance(s.max_abs_diff, str):
            s.max_abs_diff = delta if s.max_abs_diff is None else max(s.max_abs_diff, delta)
        first = r.get("first")
        if not s.first_field and isinstance(first, Mapping):
            s.first_field = str(first.get("path", ""))
    return [steps[k] for k in sorted(steps)]


def first_divergence(rows: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The first diverging row (lowest step, then call), as ``skipweave diff`` names it; None when none diverged."""
    diverged = [r for r in rows if r.get("status") == "diverged"]
    return min(diverged, key=lambda r: (int(r["step"]), int(r["call"]))) if diverged else None


MAX_STEP = 2**63 - 1
"""The largest step or call index a report line may name (an int64, as the store's are)."""


def report_problem(line: Any) -> str | None:
    """Why a verify report's line (parsed JSON) is not a well-formed record of a call, or None when it is: an object
    of schema ``skipweave.verify.call/1`` whose ``role``, ``target``, ``shard`` and ``status`` are strings, whose
    ``step`` and ``call`` are whole numbers from 0 to :data:`MAX_STEP` (not ``true``, ``"1"``, ``1.5`` or ``NaN``),
    and whose ``namespace``, when there, is a string."""
    from skipweave.verify.report import SCHEMA

    if not isinstance(line, dict):
        return f"not a JSON object but {type(line).__name__}"
    if line.get("schema") != SCHEMA:
        return f"schema {line.get('schema')!r}, not {SCHEMA}"
    for key in ("role", "target", "shard", "status"):
        if not isinstance(line.get(key), str):
            return f"{key} {line.get(key)!r} is not a string" if key in line else f"no {key!r}"
    if "namespace" in line and not isinstance(line["namespace"], str):
        return f"namespace {line['namespace']!r} is not a string"
    for key in ("step", "call"):
        value = line.get(key)
        if key not in line:
            return f"no {key!r}"
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_STEP:
            return f"{key} {value!r} is not a whole number from 0 to {MAX_STEP}"
    return None


def read_report(path: str) -> tuple[list[dict[str, Any]], list[tuple[int, str]]]:
    """The well-formed lines of a verify run's report (:func:`report_problem`) and the others, named.

    Returns:
        ``(lines, skipped)``: ``skipped`` holds ``(line number from 1, why)`` for each non-blank line that is not a
        well-formed record (JSON that does not parse, a line of another schema, a field of the wrong type).

    Raises:
        OSError: the file cannot be read.
    """
    import json

    lines: list[dict[str, Any]] = []
    skipped: list[tuple[int, str]] = []
    with open(path, encoding="utf-8", errors="replace") as fh:
        for number, text in enumerate(fh, start=1):
            if not text.strip():
                continue
            try:
                line = json.loads(text)
            except ValueError as exc:
                skipped.append((number, f"not JSON ({exc})"))
                continue
            except RecursionError:
                skipped.append((number, "not JSON (nested too deep)"))
                continue
            why = report_problem(line)
            if why is None:
                lines.append(line)
            else:
                skipped.append((number, why))
    return lines, skipped


@dataclass
class Side:
    """One side of the first diverging sample: its ids around the first differing position."""

    label: str
    ids: list[int] | None
    start: int = 0
    """The position of ``ids[0]`` in the sample's sequence."""
    length: int = 0
    """The sequence's full length."""
    text: tuple[str, str, str] | None = None
    """Decoded text before, at and after the first differing position."""
    note: str = ""


@dataclass
class SideBySide:
    """The first diverging sample of a diff: where it is, and A's and B's ids."""

    row: Mapping[str, Any]
    path: str
    sample: int | None
    position: int | None
    recorded: Any = None
    live: Any = None
    sides: list[Side] = field(default_factory=list)
    note: str = ""


def value_at(result: Any, path: str) -> Any:
    """The value at a comparison's dotted ``path`` in a result (a view): mapping keys, list indices, attributes.

    Raises:
        KeyError: the path names nothing there.
    """
    value = result
    for part in path.split(".") if path else ():
        if isinstance(value, Mapping):
            hit = next((k for k in value.keys() if str(k) == part), None)
            if hit is None:
                raise KeyError(path)
            value = value[hit]
        elif isinstance(value, (list, tuple)) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        elif hasattr(value, part):
            value = getattr(value, part)
        else:
            raise KeyError(path)
    return value


def _row_of(value: Any, sample: int | None) -> list[int]:
    """The ids of ``sample`` in a token field (every id of a one-sequence field when ``sample`` is None)."""
    from skipweave.export.values import plain

    ids = plain(value if sample is None else value[sample])
    while isinstance(ids, list) and len(ids) == 1 and isinstance(ids[0], list):
        ids = ids[0]
    if not isinstance(ids, list):
        ids = [ids]
    return [int(x) for x in ids]


def _side(label: str, ids: list[int], position: int, tokenizer: Any) -> Side:
    start = max(0, position - WINDOW)
    shown = ids[start:position + WINDOW + 1]
    side = Side(label, shown, start, len(ids))
    if tokenizer is not None:
        at = [ids[position]] if position < len(ids) else []
        side.text = (tokenizer.decode(ids[start:position], skip_special_tokens=False),
                     tokenizer.decode(at, skip_special_tokens=False),
                     tokenizer.decode(ids[position + 1:position + WINDOW + 1], skip_special_tokens=False))
    return side


def side_by_side(row: Mapping[str, Any], load_a: Any, load_b: Any = None, tokenizer: Any = None) -> SideBySide | None:
    """A's and B's sample at the first differing token of ``row`` (a diverging diff row or report line).

    Args:
        row: the row; its ``first_token`` (else ``first``) names the path and ``detail.first_index`` the
            ``[sample, position]``.
        load_a: ``() -> A's result`` (a view), or None when A's entry cannot be found.
        load_b: ``() -> B's result``, or None (a verify report: B's side is built from the report's live token).
        tokenizer: decodes the ids around the position, or None.

    Returns:
        The :class:`SideBySide`, or None when the row names no token position (a float field diverged: the table
        says by how much).
    """
    token = row.get("first_token") if isinstance(row.get("first_token"), Mapping) else None
    first = token or (row.get("first") if isinstance(row.get("first"), Mapping) else None)
    if first is None:
        return None
    detail = first.get("detail") if isinstance(first.get("detail"), Mapping) else {}
    index = detail.get("first_index")
    if not isinstance(index, list) or not index or not all(isinstance(i, int) for i in index):
        return None
    sample, position = (index[0], index[-1]) if len(index) >= 2 else (None, index[0])
    out = SideBySide(row, str(first.get("path", "")), sample, position, detail.get("recorded"), detail.get("live"))
    results: list[tuple[str, list[int] | None, str]] = []
    for label, load in (("A (recorded)", load_a), ("B (live)", load_b)):
        if load is None:
            results.append((label, None, "not stored" if label.startswith("B") else "A's entry is not in the store"))
            continue
        try:
            results.append((label, _row_of(value_at(load(), out.path), sample), ""))
        except Exception as exc:  # noqa: BLE001 - the table and the figures stand without the side by side
            results.append((label, None, f"cannot be read: {type(exc).__name__}: {exc}"))
    (label_a, ids_a, why_a), (label_b, ids_b, why_b) = results
    if ids_a is not None:
        out.sides.append(_side(label_a, ids_a, position, tokenizer))
    else:
        out.sides.append(Side(label_a, None, note=why_a))
    if ids_b is not None:
        out.sides.append(_side(label_b, ids_b, position, tokenizer))
    elif load_b is None and ids_a is not None and isinstance(out.live, int) and position <= len(ids_a):
        # a verify report: the live side agrees with the recording up to the position, and holds the live token there
        known = [*ids_a[:position], int(out.live)]
        out.sides.append(_side(label_b, known, position, tokenizer))
        out.sides[-1].note = "from the verify report: the live result is not stored; ids after the position unknown"
    else:
        out.sides.append(Side(label_b, None, note=why_b))
    return out


__all__ = ["MAX_STEP", "WINDOW", "DiffStep", "Side", "SideBySide", "diff_steps", "first_divergence", "is_validation",
           "read_report", "report_problem", "side_by_side", "value_at"]
