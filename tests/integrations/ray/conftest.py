"""The Ray modules' driver runs start together, when the first of them is needed.

Each module here runs its own record-then-replay chain of driver processes (two separate drivers, each
starting its own Ray). A chain is CPU-bound only in bursts (cluster and worker start-ups, waits on their
registration), so the chains of both modules run side by side and a module's ``runs`` fixture only waits for
its own. They cannot join each other's Ray: a bare ``ray.init()`` (``test_ray_workers``) records no address
for others to find, and ``test_many_writers``' ``Cluster`` records its own in a Ray temp dir of its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest


@pytest.fixture(scope="package")
def driver_chains(request: pytest.FixtureRequest,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Future[dict[str, Any]]]]:
    """Start ``record_then_replay(base)`` of every module of this package with a selected test using ``runs``.

    Returns the futures by module name; a module's ``runs`` fixture waits for its own.
    """
    modules: dict[str, Any] = {}
    for item in request.session.items:
        module = getattr(item, "module", None)
        if (module is not None and module.__name__.startswith(__package__ + ".")
                and "runs" in getattr(item, "fixturenames", ()) and hasattr(module, "record_then_replay")):
            modules.setdefault(module.__name__, module)
    with ThreadPoolExecutor(max_workers=max(1, len(modules))) as pool:
        yield {name: pool.submit(module.record_then_replay, tmp_path_factory.mktemp(name.rsplit(".", 1)[1]))
               for name, module in modules.items()}
