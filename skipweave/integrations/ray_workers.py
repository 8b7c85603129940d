"""The name earlier releases documented for Ray's runtime-env hook.

``RAY_RUNTIME_ENV_HOOK=skipweave.integrations.ray_workers.runtime_env_hook`` keeps working; the hook itself lives in
:mod:`skipweave.integrations.ray.driver` (see docs/ray.md).
"""

from skipweave.integrations.ray.driver import runtime_env_hook

__all__ = ["runtime_env_hook"]
