"""verl's part in reading an app's config, registered as config adapters (see :mod:`skipweave.config.adapters`).

Two adapters, applied in this order:

- verl's legacy keys (``actor_rollout_ref.rollout.skip*``) remapped onto ``skip.rollout``, with a
  deprecation warning (:mod:`skipweave.integrations.verl.legacy`);
- verl's run identity as the namespace of a role that leaves it unset, and verl's shipped ``steps: []`` read as
  unset (:mod:`skipweave.integrations.verl.namespace`).

Importing this module registers them; it imports no verl.
"""

from __future__ import annotations

from skipweave.config.adapters import CONFIG_ADAPTERS, ConfigAdapter
from skipweave.integrations.verl.legacy import legacy_keys, remap_legacy
from skipweave.integrations.verl.namespace import apply_verl_defaults, identity_keys

LEGACY_KEYS = CONFIG_ADAPTERS.add(ConfigAdapter("verl legacy keys", legacy_keys, remap_legacy))
"""The adapter of verl's legacy skip keys."""

RUN_NAMESPACE = CONFIG_ADAPTERS.add(ConfigAdapter("verl run namespace", identity_keys, apply_verl_defaults))
"""The adapter giving a verl app's roles verl's run identity as their default namespace."""

__all__ = ["LEGACY_KEYS", "RUN_NAMESPACE"]
