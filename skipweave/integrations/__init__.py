"""Integrations: the hosts skipweave knows by name (tensordict, Ray, verl, TRL), and the assembling entry points that
live beside them (the Hydra callback, the ``skipweave run`` launcher, a Ray worker's set-up).

Each host package has one declaration, an :class:`~skipweave.integrations.base.Integration` (name, host package and
supported versions, what it adds to the generic layers), found through the entry-point group
``skipweave.integrations`` and loaded once per process by :func:`~skipweave.integrations.discovery.load_integrations`
(see docs/integrations.md and docs/architecture.md). Importing this package imports no host library and no part of
an integration.
"""

from __future__ import annotations

from skipweave.integrations.base import Integration, IntegrationError

__all__ = ["Integration", "IntegrationError"]
