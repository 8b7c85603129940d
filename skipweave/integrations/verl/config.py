"""verl's part in reading an app's config: two config adapters (see :mod:`skipweave.config.adapters`).

Two adapters, applied in this order:

- verl's legacy keys (``actor_rollout_ref.rollout.skip*``) remapped onto ``skip.rollout``, with a
  deprecation warning (:mod:`skipweave.integrations.verl.legacy`);
- verl's run identity as the namespace of a role that leaves it unset, and verl's shipped ``steps: []`` read as
  unset (:mod:`skipweave.integrations.verl.namespace`).

The verl integration registers them when it is loaded, also where verl is not installed (they read a config's
keys, not verl); this module imports no verl.
"""

from __future__ import annotations

from skipweave.config.adapters import ConfigAdapter
from skipweave.integrations.verl.legacy import legacy_keys, remap_legacy
from skipweave.integrations.verl.namespace import apply_verl_defaults, identity_keys

LEGACY_KEYS = ConfigAdapter("verl legacy keys", legacy_keys, remap_legacy)
"""The adapter of verl's legacy skip keys."""

RUN_NAMESPACE = ConfigAdapter("verl run namespace", identity_keys, apply_verl_defaults)
"""The adapter giving a verl app's roles verl's run identity as their default namespace."""

__all__ = ["LEGACY_KEYS", "RUN_NAMESPACE"]
