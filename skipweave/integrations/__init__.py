"""Integrations: the hosts skipweave knows by name (verl, TRL, tensordict, Ray, Hydra, the ``skipweave run`` launcher).

Each integration registers what it adds to the generic layers in their registries (:mod:`skipweave.hooks`);
:func:`register_builtin` is how the shipped ones do it, called once per process the first time a registry is
read. Importing this package imports no host library.
"""

from __future__ import annotations


def register_builtin() -> None:
    """Register every shipped integration's hooks (host types, config adapters, weave hooks). Imports no host
    library: each integration imports its host only when it meets one of its objects."""
    # Each integration adds its registration module here, e.g. ``from skipweave.integrations.verl import hooks``.
    # Host types: tensordict's before verl's DataProto shape (the first matching host type encodes an object).
    from skipweave.integrations import tensordict  # noqa: F401
    from skipweave.integrations.ray import driver  # noqa: F401  (weave hook: Ray workers weave the plan too)
    from skipweave.integrations.trl import versions  # noqa: F401  (weave hook: the TRL versions its profiles fit)
    from skipweave.integrations.verl import (
        coexist,  # noqa: F401  (weave hook: verl's SkipManager hands roles over)
        hosts,  # noqa: F401
        meta_info,  # noqa: F401 - verl's meta_info["skipweave"] result note
    )
    from skipweave.integrations.verl import config as _verl_config  # noqa: F401 - verl's legacy keys, namespace


__all__ = ["register_builtin"]
