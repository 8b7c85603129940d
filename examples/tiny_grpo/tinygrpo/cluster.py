"""Ray, started when the first worker group needs it.

A run whose worker groups are all stand-ins (skipweave's replay-only profiles: ``rollout_replay`` with a replayed
reference, ``update_only``) never needs a Ray cluster; starting one would cost it ~6 s for nothing, which in this toy
is a third of such a run. verl starts Ray before anything else; a real job's steps take minutes, not seconds, so there
the difference is noise.
"""

from __future__ import annotations

from typing import Any

import ray

_INIT_KWARGS: dict[str, Any] | None = None


def configure(**init_kwargs: Any) -> None:
    """Remember the ``ray.init`` arguments of this run (``num_cpus``, ``runtime_env``, ...); starts nothing."""
    global _INIT_KWARGS
    _INIT_KWARGS = dict(init_kwargs)


def ensure_started() -> None:
    """Start Ray with the configured arguments unless it runs already (a test may have started it).

    Raises:
        RuntimeError: :func:`configure` was not called and Ray is not running.
    """
    if ray.is_initialized():
        return
    if _INIT_KWARGS is None:
        raise RuntimeError("tinygrpo.cluster.configure(...) must be called before a worker group is built")
    ray.init(**_INIT_KWARGS)


def shutdown() -> None:
    """Stop Ray if this run started it."""
    if ray.is_initialized():
        ray.shutdown()
