"""tensordict integration: ``TensorDict`` (plain and lazy stacks) and ``NonTensorData`` stored as nodes of their own.

verl's V1 trainer passes ``TensorDict`` batches to its rollout; :mod:`~skipweave.integrations.tensordict.hosts` holds
the host types. This module is the integration's declaration only (see :mod:`skipweave.integrations.base`): it imports
nothing else, because Hydra's search-path plugin reads it in a Hydra app that looks for a
profile skipweave does not ship.

The host types load also without tensordict installed: they match objects by their classes' module and name, so they
match nothing then, and a store holding tensordict nodes still lists and shows them (``skipweave show``) where
tensordict is missing; only decoding one needs tensordict.
"""

from __future__ import annotations

from skipweave.integrations.base import Integration

INTEGRATION = Integration(
    name="tensordict",
    host="tensordict",
    versions=">=0.8",  # the codec uses tensordict's public constructors only; tested with 0.10.0
    host_types=(
        "skipweave.integrations.tensordict.hosts:TENSORDICT",
        "skipweave.integrations.tensordict.hosts:NON_TENSOR_DATA",
    ),
    without_host=("host_types",),
)
"""skipweave's tensordict integration (entry point ``tensordict`` of ``skipweave.integrations``)."""

__all__ = ["INTEGRATION"]
