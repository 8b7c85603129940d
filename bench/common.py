"""Helpers shared by the benchmark sections: medians, peak memory, page-cache eviction, child processes."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
"""The repository root (children run with it on ``sys.path`` so ``bench.*`` imports)."""


def median(values: Sequence[float]) -> float:
    """Median of a non-empty sequence."""
    return float(statistics.median(values))


def _status_kib(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def rss_bytes() -> int:
    """Resident set size of this process now."""
    return _status_kib("VmRSS") * 1024


def reset_peak() -> bool:
    """Reset this process's peak RSS (``VmHWM``) to its current RSS; False where Linux does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def peak_bytes() -> int:
    """Peak RSS since the last :func:`reset_peak` (or since the start of the process)."""
    return _status_kib("VmHWM") * 1024


def evict(paths: Sequence[str | os.PathLike[str]]) -> None:
    """Drop files' pages from the page cache (they are clean after fsync), so the next read hits the disk."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def files_under(folder: str | os.PathLike[str]) -> list[str]:
    """Every regular file below ``folder``."""
    out = []
    for base, _dirs, names in os.walk(folder):
        out += [os.path.join(base, n) for n in names]
    return out


def child_env() -> dict[str, str]:
    """Environment of a benchmark child: the repo root importable, progress bars off, one BLAS thread."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("SKIPWEAVE_PROGRESS", "0")
    return env


def run_child(module: str, args: Sequence[str], timeout: float = 1800.0, env: dict[str, str] | None = None) -> Any:
    """Run ``python -m <module> <args>`` and return the JSON its last stdout line holds.

    Raises:
        RuntimeError: the child failed; the message carries its stderr tail.
    """
    cmd = [sys.executable, "-m", module, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**child_env(), **(env or {})}, cwd=str(ROOT),
                          timeout=timeout)
    if proc.returncode != 0 or not proc.stdout.strip():
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def write_host(prefix: str, name: str, source: str) -> tuple[str, Any]:
    """Write ``source`` as module ``name`` into a fresh temporary folder (``prefix``), import it from there, and
    return ``(folder, module)``: a host for a benchmark to weave (the caller removes the folder)."""
    import importlib
    import tempfile
    import textwrap

    work = tempfile.mkdtemp(prefix=prefix)
    with open(os.path.join(work, f"{name}.py"), "w", encoding="utf-8") as fh:
        fh.write(textwrap.dedent(source))
    sys.path.insert(0, work)
    return work, importlib.import_module(name)


def sized_main(doc: str | None, measure: Any, mb: float) -> None:
    """The command line of a child measuring one batch size: ``--mb`` (default ``mb``), ``--rounds``, ``--dir``;
    prints ``measure(mb, rounds, dir)`` as the child's JSON line."""
    import argparse

    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=mb)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", required=True)
    args = parser.parse_args()
    emit(measure(args.mb, args.rounds, args.dir))


def emit(data: Any) -> None:
    """Print a child's result as one JSON line (the parent reads the last line)."""
    sys.stdout.write(json.dumps(data) + "\n")
    sys.stdout.flush()
