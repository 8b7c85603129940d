"""Pytest configuration of the example tests.

The tiny GRPO job (:func:`tests.examples.test_tiny_grpo.run_job`: four training runs, Ray start-ups included)
starts in the background when collection ends and its test runs last: the job's waits (Ray and worker start-ups,
runs one after the other) overlap the rest of the suite instead of adding a minute to it.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

JOB = pytest.StashKey[tuple[Path, Future[Any]]]()


def pytest_configure(config: pytest.Config) -> None:
    """Register the markers used by the example tests."""
    config.addinivalue_line(
        "markers",
        "skipweave: needs skipweave installed with its Hydra plugin, so that `+skip=rollout_cache` resolves",
    )
    config.addinivalue_line("markers", "slow: end-to-end run of the example job (Ray + two training runs)")


def _start_job(config: pytest.Config) -> tuple[Path, Future[Any]]:
    from tests.examples.test_tiny_grpo import run_job

    tmp = Path(tempfile.mkdtemp(prefix="tiny_grpo_"))
    config.add_cleanup(lambda: shutil.rmtree(tmp, ignore_errors=True))
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tiny_grpo_job")
    config.add_cleanup(lambda: pool.shutdown(wait=True))  # cleanups run last-first: before the rmtree
    return tmp, pool.submit(run_job, tmp)


@pytest.hookimpl(trylast=True)  # after -k/-m deselection: start only for a test that will run
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mine = [item for item in items if "tiny_grpo_job" in getattr(item, "fixturenames", ())]
    if not mine or config.option.collectonly:
        return
    items[:] = [item for item in items if item not in mine] + mine
    config.stash[JOB] = _start_job(config)


@pytest.fixture
def tiny_grpo_job(pytestconfig: pytest.Config) -> Iterator[tuple[Path, Future[Any]]]:
    """``(tmp folder, future of run_job(tmp folder))``: the job started at the end of collection, or now."""
    if JOB not in pytestconfig.stash:
        pytestconfig.stash[JOB] = _start_job(pytestconfig)
    yield pytestconfig.stash[JOB]
