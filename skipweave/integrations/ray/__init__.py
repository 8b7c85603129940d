"""Ray: every Ray worker process of a job weaves the driver's plan at start-up (see docs/ray.md).

verl runs its trainer and its rollouts inside Ray actors, which live in worker processes of their own: a patch
made in the driver never reaches them. This package carries the woven plan to them.

- :mod:`~skipweave.integrations.ray.driver` -- driver side: after each weave (a hook in
  :data:`skipweave.weaving.weave_hooks.WEAVE_HOOKS`, registered by :data:`INTEGRATION`), ``ray.init`` merges into
  the application's own ``runtime_env`` the env var ``SKIPWEAVE_PLAN`` (the plan as JSON) and
  ``worker_process_setup_hook`` = the *dotted* path of :func:`~skipweave.integrations.ray.worker.worker_setup` (Ray
  kills every worker when given ``pkg.mod:fn``). The app's env vars and working_dir are kept; an app hook of its own
  is chained.
- :mod:`~skipweave.integrations.ray.worker` -- worker side: Ray runs ``worker_setup`` in every worker before any
  task; the plan is woven before user code runs.
- :mod:`~skipweave.integrations.ray.actors` -- actor classes Ray ships by value (``@ray.remote`` classes, classes
  of the driver's ``__main__``) are woven as Ray loads them; every task and actor method writes its recordings
  behind it, committed before it returns.
- :mod:`~skipweave.integrations.ray.pickling` -- a woven function handed to ``ray.remote`` pickles by reference.
- :mod:`~skipweave.integrations.ray.failures` -- a worker whose weave failed refuses every target call with
  :class:`~skipweave.integrations.ray.failures.WorkerWeaveError`, instead of silently running live.

This module is the integration's declaration (see :mod:`skipweave.integrations.base`); importing it imports neither
Ray nor torch, nor any other module of the package: Hydra's search-path plugin reads it in a Hydra app that looks for a
profile skipweave does not ship.
"""

from __future__ import annotations

from skipweave.integrations.base import Integration

INTEGRATION = Integration(
    name="ray",
    host="ray",
    versions=">=2.9",  # skipweave's own dependency range (pyproject.toml); tested with 2.60
    weave_hooks=("skipweave.integrations.ray.driver:RAY_PROPAGATION",),
)
"""skipweave's Ray integration (entry point ``ray`` of ``skipweave.integrations``): after each weave, the workers of a
later ``ray.init`` weave the plan too."""

__all__ = ["INTEGRATION"]
