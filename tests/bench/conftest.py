"""The benchmark smoke run starts in the background when collection ends, and its test runs last.

``bench/run.py --quick`` runs for about a minute and its test only reads what it wrote. Started before the first
test and read at the end, the run overlaps the rest of the suite instead of adding its minute to it. (The test
checks the table's structure, none of its timings.)
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


@dataclass
class QuickRun:
    """``bench/run.py --quick --json out.json``, running in ``folder`` (its output goes to files there)."""

    folder: Path
    proc: subprocess.Popen[bytes]

    def output(self) -> tuple[str, str]:
        """What the run printed: (stdout, stderr)."""
        out, err = ((self.folder / name).read_text(encoding="utf-8", errors="replace")
                    for name in ("stdout.txt", "stderr.txt"))
        return out, err

    def stop(self) -> None:
        """Kill the run if it still runs, and remove its folder."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


QUICK_RUN = pytest.StashKey[QuickRun]()


def start_quick_run() -> QuickRun:
    folder = Path(tempfile.mkdtemp(prefix="bench_smoke_"))
    with open(folder / "stdout.txt", "wb") as out, open(folder / "stderr.txt", "wb") as err:
        proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "run.py"), "--quick", "--json", "out.json"],
                                cwd=folder, stdout=out, stderr=err)
    return QuickRun(folder, proc)


@pytest.hookimpl(trylast=True)  # after -k/-m deselection: start only for a test that will run
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mine = [item for item in items if HERE in item.path.resolve().parents]
    if not mine or config.option.collectonly:
        return
    items[:] = [item for item in items if item not in mine] + mine
    config.stash[QUICK_RUN] = start_quick_run()


@pytest.fixture
def quick_run(pytestconfig: pytest.Config) -> Iterator[QuickRun]:
    """The run started at the end of collection (or now, if none was), stopped and removed after the test."""
    started = pytestconfig.stash.get(QUICK_RUN, None) or start_quick_run()
    yield started
    started.stop()


def pytest_unconfigure(config: pytest.Config) -> None:
    """A run its test never waited for (the session stopped early) is stopped too."""
    started = config.stash.get(QUICK_RUN, None)
    if started is not None:
        started.stop()
