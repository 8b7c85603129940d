"""verl integration: replay verl's rollouts on every trainer path its own ``SkipManager`` covers.

Modules (each imports verl only when verl is already running, so importing this package is cheap):

- :mod:`~skipweave.integrations.verl.convention` — where a ``DataProto`` carries its step, validation flag and uid.
- :mod:`~skipweave.integrations.verl.namespace` — verl's run identity as the default namespace.
- :mod:`~skipweave.integrations.verl.coexist` — hands each role to exactly one of skipweave and
  verl's ``SkipManager``, and keeps verl's parsing of its ``skip`` section working.
- :mod:`~skipweave.integrations.verl.proxies` — proxies for the PPO trainer's agent loop and the
  fully-async rollouter (echo of per-run ids, ``timing``, sample-id steps).
- :mod:`~skipweave.integrations.verl.tq` — the TransferQueue (V1) trainer's submit / sample split.
- :mod:`~skipweave.integrations.verl.importer` — ``skipweave import-verl`` for caches verl wrote.

See docs/verl.md.

This module is the integration's declaration (see :mod:`skipweave.integrations.base`) and imports nothing else:
Hydra's search-path plugin reads it (in a Hydra app that looks
for a profile skipweave does not ship).
"""

from __future__ import annotations

from skipweave.integrations.base import Integration

INTEGRATION = Integration(
    name="verl",
    host="verl",
    # Mirrored key for key from verl 0.9.1: SkipManager's config (coexist), RolloutSkip's folder names (namespace).
    versions=">=0.9.1,<0.10",
    host_types=("skipweave.integrations.verl.hosts:DATAPROTO",),
    config_adapters=(
        "skipweave.integrations.verl.config:LEGACY_KEYS",
        "skipweave.integrations.verl.config:RUN_NAMESPACE",
    ),
    conventions=("skipweave.integrations.verl.convention:VERL",),
    result_notes=("skipweave.integrations.verl.meta_info:META_INFO",),
    weave_hooks=("skipweave.integrations.verl.coexist:COEXISTENCE",),
    environment=("vllm", "sglang"),  # the rollout engines verl runs (their versions belong in a recording)
    # DataProto is a shape trainers of their own copy (a batch with batch/non_tensor_batch/meta_info, read by
    # meta_info["skipweave"], its convention's step, validation flag and uid), and verl's config keys are keys: these
    # work with no verl installed (the tiny_grpo example, the fixture store's host, tests' verl-shaped batches). Only
    # the SkipManager hand-over needs verl.
    without_host=("host_types", "config_adapters", "conventions", "result_notes", "environment"),
)
"""skipweave's verl integration (entry point ``verl`` of ``skipweave.integrations``)."""

__all__ = ["INTEGRATION"]
