"""Run-time reporting: one log line per hit, miss and bypass, and counters readable from Python.

A host can put :func:`counters` into its own metrics; a summary is logged when the process ends.
"""

from __future__ import annotations

import atexit
import logging
import threading
from dataclasses import asdict, dataclass
from typing import Any

logger = logging.getLogger("skipweave")

HIT, MISS, BYPASS = "hit", "miss", "bypass"
BYPASS_LINE = "skipweave bypass role=%s target=%s step=%s"
"""The DEBUG line of a bypass (arguments: role, target, step), also written by the proxies' screened fronts."""


@dataclass
class Counters:
    """Totals of this process since weaving (or the last :func:`reset`).

    Attributes:
        hits, misses, bypasses: calls served from the store, called through and recorded, run live.
        bytes_read, bytes_written: payload bytes.
        seconds_saved: generation seconds recorded for the entries served (the live cost avoided).
        record_failures: records that failed and left the live result in place.
    """

    hits: int = 0
    misses: int = 0
    bypasses: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    seconds_saved: float = 0.0
    record_failures: int = 0


COUNTERS = Counters()
"""The process's counters; one object for the life of the process (:func:`reset` zeroes it in place), so hot
paths may hold a reference to it."""
_lock = threading.Lock()
_summary_registered = False


def counters() -> dict[str, Any]:
    """Return a snapshot of this process's counters as a plain dict."""
    with _lock:
        return asdict(COUNTERS)


def reset() -> None:
    """Zero the counters (in place: references to :data:`COUNTERS` stay valid)."""
    with _lock:
        for name, value in asdict(Counters()).items():
            setattr(COUNTERS, name, value)


def event(
    status: str,
    *,
    role: str,
    target: str,
    step: int | None,
    served: int | None = None,
    nbytes: int = 0,
    seconds: float = 0.0,
    saved: float = 0.0,
) -> None:
    """Count one decision and log it at INFO (bypasses at DEBUG: validation runs every few steps).

    Args:
        status: ``hit``, ``miss`` or ``bypass``.
        role, target: names from the config.
        step: the call's step (``None`` when not computed, e.g. validation).
        served: the recorded step that served a hit.
        nbytes: payload bytes read (hit) or written (miss).
        seconds: wall time of the read (hit) or of the live call (miss).
        saved: generation seconds the hit avoided (the recorded call's own duration).
    """
    if status == BYPASS:  # the hot path: no lock (a lost increment under a thread race is acceptable)
        COUNTERS.bypasses += 1
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(BYPASS_LINE, role, target, step)
        return
    _register_summary()
    with _lock:
        if status == HIT:
            COUNTERS.hits += 1
            COUNTERS.bytes_read += nbytes
            COUNTERS.seconds_saved += saved
        elif status == MISS:
            COUNTERS.misses += 1
            COUNTERS.bytes_written += nbytes
    if status == HIT:
        logger.info(
            "skipweave hit role=%s target=%s step=%s served_by=%s bytes=%d read_s=%.3f saved_s=%.3f",
            role, target, step, served, nbytes, seconds, saved,
        )
    else:
        logger.info(
            "skipweave miss role=%s target=%s step=%s recorded_bytes=%d call_s=%.3f",
            role, target, step, nbytes, seconds,
        )


def record_failed() -> None:
    """Count a record that failed (the warning itself is logged by the proxy)."""
    with _lock:
        COUNTERS.record_failures += 1


def _register_summary() -> None:
    global _summary_registered
    if not _summary_registered:
        _summary_registered = True
        atexit.register(log_summary)


def log_summary() -> None:
    """Log the totals of this process (called at interpreter exit)."""
    c = counters()
    if c["hits"] or c["misses"] or c["bypasses"]:
        logger.info(
            "skipweave summary: hits=%d misses=%d bypasses=%d bytes_read=%d bytes_written=%d "
            "generation_seconds_saved=%.1f record_failures=%d",
            c["hits"], c["misses"], c["bypasses"], c["bytes_read"], c["bytes_written"],
            c["seconds_saved"], c["record_failures"],
        )
