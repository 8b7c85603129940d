"""Shared fixtures: a fresh host module on disk per test, and a clean weaver after each test."""

from __future__ import annotations

import importlib
import logging
import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

# The test process's own exit summary (totals over every test's weave) would print on stderr after pytest's
# result line, where it reads like a verdict; the handler makes the logger "configured", so it does not.
# Subprocesses the tests start are unaffected.
logging.getLogger("skipweave").addHandler(logging.NullHandler())

# The registries are passive (skipweave.hooks): the test session assembles skipweave as its entry points do, so that a
# test reading a config or a store in-process sees the integrations' adapters and host types, as a run would.
from skipweave.integrations.discovery import load_integrations  # noqa: E402

load_integrations()


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``slow`` marker: a module that starts processes (Hydra apps, Ray clusters, the main job)."""
    config.addinivalue_line(
        "markers", "slow: starts processes (Hydra apps, Ray clusters, the main job); `-m 'not slow'` is the fast tier")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the slow modules first (a stable sort keeps each module's own order).

    Under the README's ``-n 2`` (with pyproject's ``--dist loadfile --no-loadscope-reorder``) each file goes whole to
    one worker, in this order: the long files start while both workers are free and the many short ones fill the
    end, instead of one worker running the main job's test alone after the other has finished.
    """
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def _unweave_after() -> Iterator[None]:
    yield
    import skipweave

    skipweave.unweave()
    skipweave.set_step(None)


@pytest.fixture
def host_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., tuple[str, Path]]:
    """Write a uniquely named host module into ``tmp_path`` and put it on ``sys.path``.

    Returns a factory ``(source, import_now=True) -> (module name, folder)``.
    """
    monkeypatch.syspath_prepend(str(tmp_path))
    made: list[str] = []

    def make(source: str, *, import_now: bool = True) -> tuple[str, Path]:
        name = f"host_{uuid.uuid4().hex[:10]}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        made.append(name)
        if import_now:
            importlib.import_module(name)
        return name, tmp_path

    yield make  # type: ignore[misc]
    for name in made:
        sys.modules.pop(name, None)


def module(name: str) -> ModuleType:
    """Return an imported module by name."""
    return sys.modules[name]


HOST_SOURCE = '''
import random
import numpy as np
import torch


class Batch:
    """verl DataProto-shaped batch."""

    def __init__(self, step=None, validate=False, x=None):
        self.batch = {"x": torch.arange(4) if x is None else x}
        self.non_tensor_batch = {"uid": np.array([f"id{random.random()}"], dtype=object)}
        self.meta_info = {"validate": validate}
        if step is not None:
            self.meta_info["global_steps"] = step


CALLS = []


class Gen:
    def generate(self, b):
        CALLS.append(("generate", b.meta_info.get("global_steps")))
        torch.rand(2)
        random.random()
        out = Batch(b.meta_info.get("global_steps"))
        out.batch["y"] = torch.rand(4) + b.batch["x"]
        return out

    async def agenerate(self, b):
        CALLS.append(("agenerate", b.meta_info.get("global_steps")))
        out = Batch(b.meta_info.get("global_steps"))
        out.batch["y"] = torch.rand(4)
        return out

    @classmethod
    def cgen(cls, n):
        CALLS.append(("cgen", n))
        return {"n": n, "r": torch.rand(3)}

    @staticmethod
    def sgen(n):
        CALLS.append(("sgen", n))
        return [n, torch.rand(2)]


class SubGen(Gen):
    pass


def free(n):
    CALLS.append(("free", n))
    return torch.rand(2) + n
'''
