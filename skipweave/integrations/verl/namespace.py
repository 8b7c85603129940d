"""The run identity verl gives its rollout caches, as a skipweave namespace.

verl's ``RolloutSkip`` files a run's rollouts under ``{dump_dir}/{exp}_{proj}/GBS{gbs}_N{n}_in{p}_out{r}/``,
so that a run with another experiment, batch size, ``rollout.n`` or length limits never replays
rollouts that do not fit it. skipweave keeps that identity as one folder name,
``{exp}_{proj}.GBS{gbs}_N{n}_in{p}_out{r}``, and derives it from the same keys with the same
fallbacks: a missing experiment or project name becomes verl's ``default_experiment_name`` /
``default_project_name``, ``data.gen_batch_size: null`` falls back to ``data.train_batch_size``.

This module is pure (no verl, no OmegaConf): the config loader calls :func:`apply_verl_defaults` on
plain containers (through the config adapter of :mod:`skipweave.integrations.verl.config`), which also reads
verl's shipped ``steps: []`` as "unset".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from skipweave.config.containers import node_at, plain
from skipweave.integrations.verl.convention import NAME as CONVENTION
from skipweave.store.fs import NAME_MAX

NAMESPACE_KEYS: tuple[str, ...] = (
    "trainer.experiment_name",
    "trainer.project_name",
    "data.gen_batch_size",
    "data.train_batch_size",
    "data.max_prompt_length",
    "data.max_response_length",
    "actor_rollout_ref.rollout.n",
)
"""The dotted keys of a verl config the identity is made of (all the loader needs to keep)."""

REQUIRED_NODES = ("trainer", "data", "actor_rollout_ref.rollout")
"""The nodes that make a config verl's."""


def _get(cfg: Mapping[str, Any], dotted: str, default: Any = None) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return default if node is None else node


def is_verl_config(cfg: Mapping[str, Any]) -> bool:
    """True when ``cfg`` has verl's ``trainer``, ``data`` and ``actor_rollout_ref.rollout`` nodes."""
    return all(isinstance(_get(cfg, node), Mapping) for node in REQUIRED_NODES)


def verl_dirs(cfg: Mapping[str, Any]) -> tuple[str, str]:
    """Return verl's two folder names ``({exp}_{proj}, GBS{gbs}_N{n}_in{p}_out{r})`` for a verl config.

    Mirrors ``verl.utils.skip.rollout_skip.RolloutSkip.__init__`` (verl 0.9.1) key for key.

    Raises:
        ValueError: a batch size or ``rollout.n`` that is not a whole number.
    """
    exp = _get(cfg, "trainer.experiment_name", "default_experiment_name")
    proj = _get(cfg, "trainer.project_name", "default_project_name")
    gbs = _get(cfg, "data.gen_batch_size")
    if gbs is None:
        gbs = _get(cfg, "data.train_batch_size", 0)
    n = _get(cfg, "actor_rollout_ref.rollout.n", 0)
    prompt = _get(cfg, "data.max_prompt_length", 0)
    response = _get(cfg, "data.max_response_length", 0)
    return f"{exp}_{proj}", f"GBS{int(gbs)}_N{int(n)}_in{prompt}_out{response}"


def namespace_of(experiment_dir: str, shape_dir: str) -> str:
    """Join verl's two folder names into one namespace, a single folder name of the dump dir.

    Every character other than ASCII letters, digits, ``_``, ``-`` and ``.`` (``/``, ``\\``, spaces, non-ASCII)
    becomes ``_``; a name starting with ``_`` or ``.`` gets an ``x`` in front (see :mod:`skipweave.store.fs`).
    """
    name = re.sub(r"[^A-Za-z0-9_.\-]", "_", f"{experiment_dir}.{shape_dir}", flags=re.ASCII)[:NAME_MAX - 1]
    return "x" + name if name.startswith(("_", ".", "-")) else name


def derive_namespace(cfg: Mapping[str, Any]) -> str | None:
    """Return the namespace verl's identity gives ``cfg`` (plain containers), or ``None`` if not verl's."""
    if not is_verl_config(cfg):
        return None
    try:
        return namespace_of(*verl_dirs(cfg))
    except (TypeError, ValueError):
        return None


def identity_keys(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Return the keys of :data:`NAMESPACE_KEYS` that an app's whole config holds, as plain containers nested as in
    ``cfg``; ``{}`` for a config that is not verl's.

    Args:
        cfg: a mapping or OmegaConf ``DictConfig``; a key whose interpolation cannot resolve here is left out.
    """
    out: dict[str, Any] = {}
    if any(node_at(cfg, node) is None for node in REQUIRED_NODES):
        return out  # not a verl config
    for dotted in NAMESPACE_KEYS:
        parent_path, _, key = dotted.rpartition(".")
        parent = node_at(cfg, parent_path)
        if parent is None or key not in parent:
            continue
        try:
            value = plain(parent[key])
        except Exception:  # noqa: BLE001 - an interpolation that cannot resolve here: no identity from it
            continue
        node = out
        for part in parent_path.split("."):
            node = node.setdefault(part, {})
        node[key] = value
    return out


def apply_verl_defaults(container: dict[str, Any]) -> dict[str, Any]:
    """Read a verl config's ``skip`` roles the way a profile composed into it means them.

    ``container`` is an app config after the legacy remap (unset keys already dropped); one that is not
    verl's is returned unchanged. In a verl config, every role of ``skip``:

    - that leaves ``namespace`` unset gets verl's run identity (see the module docstring), unless it ``follows``
      another role of the config (it takes that role's namespace, see :func:`skipweave.config.loader.follow_roles`);
    - whose ``steps`` is verl's shipped default ``[]`` (in verl: no step selected, which a profile's
      ``steps: ???`` keeps) has it dropped, so that skipweave's default, every step, applies;
    - that names no ``convention`` follows verl's (:mod:`skipweave.integrations.verl.convention`): a verl app's
      calls pass ``DataProto`` batches.
    """
    skip = container.get("skip")
    if not isinstance(skip, Mapping):
        return container
    namespace = derive_namespace(container)
    if namespace is None:
        return container
    roles: dict[str, Any] = {}
    for name, role in skip.items():
        if isinstance(role, Mapping):
            role = {k: v for k, v in role.items() if not (k == "steps" and v == [])}
            if not (isinstance(role.get("follows"), str) and isinstance(skip.get(role["follows"]), Mapping)):
                role.setdefault("namespace", namespace)
            role.setdefault("convention", CONVENTION)
        roles[name] = role
    return {**container, "skip": roles}
