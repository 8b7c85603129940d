"""verl integration: replay verl's rollouts on every trainer path its own ``SkipManager`` covers.

Modules (each imports verl only when verl is already running, so importing this package is cheap):

- :mod:`~skipweave.integrations.verl.namespace` — verl's run identity as the default namespace.
- :mod:`~skipweave.integrations.verl.coexist` — hands each role to exactly one of skipweave and
  verl's ``SkipManager``, and keeps verl's parsing of its ``skip`` section working.
- :mod:`~skipweave.integrations.verl.proxies` — proxies for the PPO trainer's agent loop and the
  fully-async rollouter (echo of per-run ids, ``timing``, sample-id steps).
- :mod:`~skipweave.integrations.verl.tq` — the TransferQueue (V1) trainer's submit / sample split.
- :mod:`~skipweave.integrations.verl.importer` — ``skipweave import-verl`` for caches verl wrote.

See docs/verl.md.
"""
