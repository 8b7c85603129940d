"""Conventions: the defaults of a host's calls, declared by its integration and named by a role (``convention``).

A host puts a call's step, its validation flag and its per-run ids in places of its own: verl passes a ``DataProto``
whose ``meta_info["global_steps"]`` is the step, whose ``meta_info["validate"]`` marks a validation call and whose
``non_tensor_batch["uid"]`` changes from run to run. The schema's defaults name no host (a trainer of one's own sees
none of verl's keys in its resolved config or its errors). A role whose calls follow a host's convention says so,
``skip.<role>.convention: verl`` (verl's profiles and its config adapter set it), and the convention's values fill the
keys the role leaves unset: below the role's own values, above the schema's defaults.

An integration declares its conventions (``Integration.conventions``); loading it registers them in
:data:`CONVENTIONS`, which :func:`skipweave.config.parse.parse_role` reads. The registry is passive: reading it loads
nothing, and a name no loaded integration declares is a :class:`~skipweave.config.errors.ConfigError` naming those
that are.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from skipweave import hooks
from skipweave.config.errors import ConfigError

_NAME_RE = re.compile(r"[a-z][a-z0-9_]*\Z")


@dataclass(frozen=True, eq=False)
class Convention:
    """The defaults a host's calls follow, as role keys in config form.

    Attributes:
        name: what ``skip.<role>.convention`` names (``"verl"``), a lower-case identifier.
        defaults: role keys and their values as a config writes them; a nested mapping (``step``, ``bypass``,
            ``fingerprint``, ``keep``) gives the keys of that mapping a role leaves unset, e.g.
            ``{"step": {"path": "meta_info.global_steps"}}``. Checked against the schema when the role is parsed.
        about: one line for people: what follows the convention (``"verl's DataProto batches"``).

    Raises:
        ValueError: at construction, a name that is not a lower-case identifier, or defaults that are no mapping.
    """

    name: str
    defaults: Mapping[str, Any]
    about: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name):
            raise ValueError(f"Convention name={self.name!r} is not allowed: a lower-case identifier ('verl')")
        if not isinstance(self.defaults, Mapping) or not all(isinstance(k, str) for k in self.defaults):
            raise ValueError(f"Convention {self.name!r}: defaults={self.defaults!r} is not allowed: a mapping of role "
                             "keys to values in config form")


CONVENTIONS: hooks.Registry[Convention] = hooks.Registry("convention")
"""The conventions of the loaded integrations, by registration order (a name is looked up first to last)."""


def convention_named(key: str, name: Any) -> Convention:
    """The registered convention named ``name``.

    Args:
        key: the config key naming it, for the message (``skip.rollout.convention``).
        name: the value given.

    Raises:
        ConfigError: naming ``key`` and ``name``: no loaded integration declares a convention of that name (the
            message lists those that do, or says none is loaded).
    """
    for convention in CONVENTIONS:
        if convention.name == name:
            return convention
    names = [c.name for c in CONVENTIONS]
    loaded = (f"one of {names}" if names else "none is declared in this process: call skipweave.load_integrations() "
              "before reading a config, as skipweave.weave() does") + (
        " (an integration declares its conventions, known while it is loaded: see docs/integrations.md)")
    raise ConfigError(key, name, f"the name of a convention of a loaded integration; {loaded}")


def with_convention(data: Mapping[str, Any], convention: Convention,
                    expand: Mapping[str, Any]) -> dict[str, Any]:
    """Return a role's given keys ``data`` with the keys it leaves unset taken from ``convention``.

    A nested mapping of the convention fills the keys of the role's own mapping that it leaves unset (absent or
    ``???``), after the role's short form is expanded (``step: counter`` is ``{source: counter}``; ``bypass: null`` is
    ``{when: never}``), so a role's ``step: counter`` keeps its source and takes the convention's path, as it took the
    schema's default path before conventions existed.

    Args:
        data: the role's keys, ``???`` values already left out (:func:`skipweave.config.fields.given`).
        convention: the convention the role names.
        expand: role key -> ``expand(value) -> value`` turning a nested key's short form into its mapping.

    Returns:
        A new mapping; ``data`` is not modified. A value of the role that is neither a mapping nor a short form of
        one is kept as it is, for its parser to report.
    """
    from skipweave.config.fields import given

    out = dict(data)
    for name, default in convention.defaults.items():
        if name not in out:
            out[name] = default
            continue
        if not isinstance(default, Mapping):
            continue
        own = out[name]
        expander = expand.get(name)
        own = expander(own) if expander is not None else own
        if own is None:
            own = {}
        if isinstance(own, Mapping):
            mine = given(own)
            out[name] = {**{k: v for k, v in default.items() if k not in mine}, **mine}
    return out


__all__ = ["CONVENTIONS", "Convention", "convention_named", "with_convention"]
