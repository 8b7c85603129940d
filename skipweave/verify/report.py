"""The divergence report of a verify run: one JSON line per verified call, and the tally the exit summary gives.

Each line (schema ``skipweave.verify.call/1``) says where the call sits and how it compared::

    {"schema": "skipweave.verify.call/1", "role": "rollout", "target": "gen", "step": 2, "call": 0, "shard": "r0",
     "validation": false, "status": "diverged", "inputs": "same", "fields": 7, "diverged": 2, "close": 0,
     "token_match": 0.91, "max_abs_diff": 0.0,
     "first": {"path": "batch.responses", "kind": "value", "status": "diverged",
               "detail": {"first_index": [3, 5], "recorded": 17, "live": 4, "match_ratio": 0.91, "tokens": true}},
     "first_token": {...the same...},
     "environment": [["target source", "xxh3_128:<32 hex>", "xxh3_128:<32 hex>"]],
     "pid": 4711, "unix": 1796300000.0}

``status`` is ``identical``, ``close`` or ``diverged`` (see :mod:`skipweave.verify.compare`), or ``unrecorded``
when no recording serves the call (it ran live and nothing was compared; ``reason`` says why when a recording was
found but could not be used, e.g. a corrupt entry). ``inputs`` is ``same``, ``differ`` (the
recording was made for other inputs: its input fingerprint differs) or ``unknown`` (a recording without a
fingerprint). ``token_match`` and ``max_abs_diff`` are ``null`` when the result has no token field / no float field;
``first_token`` is the first token field that differs (``null`` when none does). ``environment``, present only when
they differ, lists the fields of the recording's environment the live one disagrees on (``[field, recorded, live]``,
:mod:`skipweave.store.format.environment`): :func:`describe` names them beside the first divergence as a likely cause.
Lines of every process of a run go to one file, appended whole (one ``write`` of one line).
"""

from __future__ import annotations

import json
import logging
import os
import stat
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from skipweave.store.format.environment import Change
from skipweave.store.format.environment import describe as describe_environment
from skipweave.verify.compare import CLOSE, DIVERGED, IDENTICAL, Comparison

logger = logging.getLogger(__name__)

SCHEMA = "skipweave.verify.call/1"
UNRECORDED = "unrecorded"
STATUSES = (IDENTICAL, CLOSE, DIVERGED, UNRECORDED)
"""Every status a line may carry, in the order summaries list them."""


def record(*, role: str, target: str, step: int, call: int, shard: str, validation: bool,
           comparison: Comparison | None, inputs: str = "unknown", reason: str = "",
           environment: tuple[Change, ...] = ()) -> dict[str, Any]:
    """One report line for a verified call (``comparison`` ``None``: no recording served it; ``reason``: why the
    recording found could not be used, e.g. a corrupt entry; ``environment``: the fields of the recorded environment
    the live one disagrees on, :func:`skipweave.store.format.environment.changes`)."""
    line: dict[str, Any] = {"schema": SCHEMA, "role": role, "target": target, "step": step, "call": call,
                            "shard": shard, "validation": validation}
    if comparison is None:
        line.update(status=UNRECORDED, inputs="unknown", fields=0, diverged=0, close=0, first=None,
                    **({"reason": reason} if reason else {}))
    else:
        line.update(comparison.to_json(), inputs=inputs)
        if environment:
            line["environment"] = [list(change) for change in environment]
    line.update(pid=os.getpid(), unix=round(time.time(), 3))
    return line


def describe(line: Mapping[str, Any]) -> str:
    """One line for people: where the call sits and, when it is not identical, its first differing field and what
    differs there (token position, recorded and live token, match ratio; or max |Δ|), e.g.
    ``role rollout target gen step 2 call 0: diverged at batch.responses [3, 5]: recorded 17, live 4
    (token match 0.910)``."""
    where = (f"role {line.get('role')} target {line.get('target')} step {line.get('step')} call {line.get('call')}"
             f"{' (validation)' if line.get('validation') else ''}")
    status = line.get("status")
    first = line.get("first")
    if status == UNRECORDED:
        why = line.get("reason")
        return f"{where}: " + (f"its recording cannot be used ({why}); ran live" if why else
                               "no recording to compare against (ran live)")
    if not isinstance(first, Mapping):
        return f"{where}: {status}"
    what = f"{status} at {_field(first)}"
    token = line.get("first_token")
    if isinstance(token, Mapping) and token.get("path") != first.get("path"):
        what += f"; tokens first differ at {_field(token)}"
    if line.get("inputs") == "differ":
        what += "; its inputs differ from the recording's too"
    changed = environment_changes(line)
    if changed and status in (DIVERGED, CLOSE):
        what += f"; environment changed: {changed} (a likely cause)"
    return f"{where}: {what}"


def environment_changes(line: Mapping[str, Any]) -> str:
    """The line's ``environment`` changes as one phrase (``target source 0123456789ab -> fedcba987654, package
    vllm 0.8.5 -> 0.9.0``), ``""`` when it has none or they are not shaped as :func:`record` writes them."""
    found = line.get("environment")
    if not isinstance(found, list):
        return ""
    changes = tuple((str(c[0]), c[1], c[2]) for c in found if isinstance(c, list | tuple) and len(c) == 3)
    return describe_environment(changes)


def _field(first: Mapping[str, Any]) -> str:
    """A differing field for people: its path, then where and how it differs (token position, recorded and live
    token, token match; or max |Δ|; or the kind of mismatch)."""
    detail = first.get("detail") if isinstance(first.get("detail"), Mapping) else {}
    assert isinstance(detail, Mapping)
    what = str(first.get("path") or "(the result)")
    kind = first.get("kind")
    tokens = detail.get("tokens", "first_index" in detail)  # a line of an older skipweave: integer fields as tokens
    if kind != "value":
        what += f": {kind} differs ({_short({k: v for k, v in detail.items() if k != 'tokens'})})"
    elif "first_index" in detail:
        what += f" {detail['first_index']}"
        if "recorded" in detail:
            if tokens:
                what += f": recorded {_token(detail['recorded'])}, live {_token(detail['live'])}"
            else:
                what += f": recorded {detail['recorded']!r}, live {detail['live']!r}"
        if isinstance(detail.get("match_ratio"), (int, float)):
            what += (f" (token match {detail['match_ratio']:.3f})" if tokens else
                     f" ({detail['match_ratio']:.3f} of elements equal)")
    elif "max_abs_diff" in detail:
        # a float number has no "at"; a 0-d tensor's is [], with its values beside it (an older line's without)
        at = (f" at {detail['at']}" if detail.get("at") else
              f" (recorded {detail.get('recorded')}, live {detail.get('live')})"
              if "recorded" in detail or "at" not in detail else "")
        delta = detail["max_abs_diff"]
        what += f": max |Δ| {delta:.3g}{at}" if isinstance(delta, float) else f": max |Δ| {delta}{at}"
        if isinstance(detail.get("beyond_fraction"), (int, float)):
            what += f", {detail['beyond_fraction']:.3f} of elements beyond tolerance"
    elif "recorded" in detail:
        what += f": recorded {detail['recorded']!r}, live {detail['live']!r}"
    else:
        what += f" ({_short(detail)})"
    return what


def _token(value: Any) -> str:
    """A token for people: ``(end)`` past the end of its sequence."""
    return "(end)" if value is None else repr(value)


def _short(detail: Any, limit: int = 160) -> str:
    text = json.dumps(detail, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ReportFile:
    """Appends report lines to a JSON-lines file (made with its folder at the first line).

    Args:
        path: the file; lines of several processes may go to one file (each line is one ``write`` in append mode).

    A line that cannot be written is logged once as a WARNING and dropped: a report never fails the host's call.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._warned = False

    def append(self, line: Mapping[str, Any]) -> None:
        """Append one line (strict JSON; a value JSON cannot hold is written as its text)."""
        with self._lock:
            try:
                data = (json.dumps(line, default=str, allow_nan=False) + "\n").encode()
                os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
                # O_NONBLOCK: a FIFO nobody reads fails here instead of blocking the host's call for good
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o644)
                try:
                    if not stat.S_ISREG(os.fstat(fd).st_mode):
                        raise OSError(f"{self.path} is not a regular file")
                    os.write(fd, data)
                finally:
                    os.close(fd)
            except (OSError, ValueError) as exc:  # ValueError: a value JSON cannot hold
                if not self._warned:
                    self._warned = True
                    logger.warning("skipweave verify: cannot write the report %s (%s); verified calls are still "
                                   "logged", self.path, exc)


def read_lines(path: str) -> Iterator[dict[str, Any]]:
    """The report lines of ``path`` (lines that are no JSON object of :data:`SCHEMA` are skipped: a line cut by a
    killed process, or another file).

    Raises:
        OSError: the file cannot be read.
    """
    with open(path, encoding="utf-8", errors="replace") as fh:
        for text in fh:
            try:
                line = json.loads(text)
            except ValueError:
                continue
            if isinstance(line, dict) and line.get("schema") == SCHEMA:
                yield line


CallKey = tuple[Any, ...]
"""Which call a report line is of: ``(role, target, step, shard, call)`` (the shard tells validation calls apart)."""


def call_key(line: Mapping[str, Any]) -> CallKey | None:
    """The :data:`CallKey` of ``line``, ``None`` when it lacks one of its parts (a line of another writer)."""
    key = tuple(line.get(k) for k in ("role", "target", "step", "shard", "call"))
    return None if any(part is None for part in key) else key


@dataclass
class Tally:
    """Counts of verified calls by status, and the earliest non-identical one (by step, then call).

    A call reported more than once counts once, by its latest line: a call that raised (``on_diverge: error``
    raises :class:`~skipweave.weaving.verifier.Diverged` in the host's call) gives its call index and its recording to
    the host's retry, which is compared and reported again under the same key; a second run appending to the same
    report replaces the first run's lines the same way.

    Attributes:
        counts: status -> calls.
        first: the line of the earliest diverging call (a ``close`` one when none diverged), ``None`` when every
            compared call was identical.
        latest: call key -> the status of its latest line (a line without a key counts apart).
        differing: call key -> the latest line of each call whose latest line is ``diverged`` or ``close``.
    """

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STATUSES, 0))
    first: dict[str, Any] | None = None
    latest: dict[CallKey, str] = field(default_factory=dict, repr=False)
    differing: dict[CallKey, dict[str, Any]] = field(default_factory=dict, repr=False)

    def add(self, line: Mapping[str, Any]) -> None:
        """Count one report line; a later line of a call already counted replaces it."""
        status = str(line.get("status"))
        key = call_key(line) or ("#line", len(self.latest))  # (no key: a key of its own, never met again)
        before = self.latest.get(key)
        if before is not None:
            self.counts[before] -= 1
            replaced = self.differing.pop(key, None)
            if replaced is not None and replaced is self.first:  # the earliest one goes: the next takes its place
                self.first = min(self.differing.values(), key=_rank, default=None)
        self.latest[key] = status
        self.counts[status] = self.counts.get(status, 0) + 1
        if status not in (DIVERGED, CLOSE):
            return
        copy = self.differing[key] = dict(line)
        if self.first is None or _rank(copy) < _rank(self.first):
            self.first = copy

    @property
    def calls(self) -> int:
        """Every verified call counted."""
        return sum(self.counts.values())

    def summary(self) -> str:
        """``calls=4 identical=3 close=0 diverged=1 unrecorded=0; first divergence: <describe(first)>``."""
        text = f"calls={self.calls} " + " ".join(f"{s}={self.counts.get(s, 0)}" for s in STATUSES)
        if self.first is not None:
            kind = "first divergence" if self.first.get("status") == DIVERGED else "first difference within tolerance"
            text += f"; {kind}: {describe(self.first)}"
        elif self.counts.get(IDENTICAL, 0) and self.counts.get(IDENTICAL) == self.calls:
            text += "; every verified call is identical to its recording"
        elif self.calls and self.counts.get(UNRECORDED) == self.calls:
            text += "; nothing was compared: no call had a recording (check the dump dir and namespace)"
        return text


def _rank(line: Mapping[str, Any]) -> tuple[int, int, int]:
    """Diverged before close, then by step and call."""
    def number(x: Any) -> int:
        return x if isinstance(x, int) and not isinstance(x, bool) else 1 << 62
    return (0 if line.get("status") == DIVERGED else 1, number(line.get("step")), number(line.get("call")))


def tally(lines: Iterator[Mapping[str, Any]] | list[Mapping[str, Any]]) -> Tally:
    """The :class:`Tally` of report lines."""
    out = Tally()
    for line in lines:
        out.add(line)
    return out


__all__ = ["CallKey", "ReportFile", "SCHEMA", "STATUSES", "Tally", "UNRECORDED", "call_key", "describe",
           "environment_changes", "read_lines",
           "record", "tally"]
