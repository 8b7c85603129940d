"""Run the test apps (``apps/``: they import nothing from skipweave) in subprocesses, from a command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

APPS = Path(__file__).resolve().parent / "apps"
REPO = Path(__file__).resolve().parents[3]


@dataclass(repr=False)
class Run:
    """One finished subprocess."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def task_started(self) -> bool:
        """Whether the app's task function began (it prints ``TASK STARTED`` first)."""
        return "TASK STARTED" in self.stdout

    @property
    def reports(self) -> list[dict[str, Any]]:
        """Every ``REPORT {json}`` line the app printed (one per job)."""
        return [
            json.loads(line[len("REPORT ") :])
            for line in self.stdout.splitlines()
            if line.startswith("REPORT ")
        ]

    @property
    def report(self) -> dict[str, Any]:
        """The single report of a single-job run; fails with the run's output when there is none."""
        reports = self.reports
        assert len(reports) == 1, f"expected one report, got {len(reports)}\n{self}"
        return reports[0]

    def __repr__(self) -> str:
        return (
            f"$ {' '.join(self.args)}\n-> exit {self.returncode} in {self.seconds:.1f} s\n"
            f"--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"
        )


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without variables that would change how the apps run."""
    env = {
        k: v
        for k, v in os.environ.items()
        # SKIPWEAVE_RUN: an in-process weave of an earlier test made a run id and exported it; an app inheriting it
        # would be a later process of that run (which judges no strict verdict), not a run of its own
        if k not in {"HYDRA_FULL_ERROR", "SKIPWEAVE_PLAN", "SKIPWEAVE_RUN", "PYTHONSTARTUP"}
    }
    env.update(extra)
    return env


def run(args: Sequence[str], *, cwd: Path, env: Mapping[str, str] | None = None, timeout: float = 120) -> Run:
    """Run ``args`` in ``cwd`` and capture everything."""
    start = time.perf_counter()
    proc = subprocess.run(
        list(args),
        cwd=cwd,
        env=dict(env) if env is not None else clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Run(list(args), proc.returncode, proc.stdout, proc.stderr, time.perf_counter() - start)


def run_all(*jobs: tuple[Sequence[str], Path] | tuple[Sequence[str], Path, Mapping[str, str]]) -> list[Run]:
    """Run independent ``(args, cwd[, env])`` jobs concurrently (each app start imports torch: seconds)."""
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = [
            pool.submit(run, job[0], cwd=job[1], env=job[2] if len(job) > 2 else None)  # type: ignore[misc]
            for job in jobs
        ]
        return [f.result() for f in futures]


def hydra_app(script: str, *overrides: str, out: Path, python: str = sys.executable) -> list[str]:
    """Command line of test app ``script`` with Hydra's output folders under ``out`` (flags first)."""
    flags = [o for o in overrides if o.startswith("-")]
    rest = [o for o in overrides if not o.startswith("-")]
    return [
        python,
        str(APPS / script),
        *flags,
        f"hydra.run.dir={out}/run",
        f"hydra.sweep.dir={out}/multirun",
        *rest,
    ]


def recorded_steps(dump_dir: Path, namespace: str = "default", role: str = "rollout") -> list[int]:
    """Steps holding at least one committed entry (a manifest, or a group file of small entries) under ``dump_dir``."""
    root = dump_dir / namespace / role
    if not root.is_dir():
        return []
    return sorted(
        int(p.name) for p in root.iterdir()
        if p.name.isdigit() and (any(p.glob("*/*.manifest.json")) or any(p.glob("*/*.pack.json")))
    )


class Scenarios:
    """Independent scenarios started together, so that their app start-ups (seconds each: torch) overlap.

    A scenario is a function ``(tmp folder) -> result`` that runs its commands in order; a test module
    registers one per test and its tests read the results. Only the scenarios of tests pytest selected
    are started.
    """

    def __init__(self, workers: int | None = None) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers or min(4, max(2, os.cpu_count() or 2)))
        self._futures: dict[str, Any] = {}

    def start(self, name: str, scenario: Any, tmp: Path) -> None:
        """Start ``scenario(tmp)`` in the background under ``name``."""
        self._futures[name] = self._pool.submit(scenario, tmp)

    def result(self, name: str) -> Any:
        """Wait for scenario ``name`` and return what it returned (re-raising what it raised)."""
        return self._futures[name].result()

    def close(self) -> None:
        """Wait for the scenarios still running (their subprocesses end by themselves)."""
        self._pool.shutdown(wait=True, cancel_futures=True)


def selected_tests(request: Any) -> list[str]:
    """Names of this module's test functions pytest will run (after ``-k`` / node-id selection), in order."""
    module = request.module
    return [
        item.function.__name__
        for item in request.session.items
        if getattr(item, "module", None) is module and hasattr(item, "function")
    ]
