"""Which shard a call is recorded under: the process's rank, and what to tell users when writers share one.

A shard is the part of a step's recordings one writer makes (``r<RANK>``, ``f<fingerprint>`` per input, or
``val_r0`` for validation calls); calls within a shard are matched by call order, across writers of one shard by
their inputs only (see docs/architecture.md and docs/ray.md).
"""

from __future__ import annotations

import os

from skipweave.config.errors import ConfigError
from skipweave.config.schema import RoleConfig, ShardKind

RANK_VARIABLES = ("RANK", "LOCAL_RANK")
"""Environment variables that give a process its writer identity, first set wins: ``RANK`` (torchrun, verl's
worker groups) and ``LOCAL_RANK`` (single-node launchers that set only it)."""

VALIDATION_SHARD = "val_"
"""Prefix of the shard label validation calls are recorded under (``val_r0``): apart from training calls."""


def rank_of_process() -> tuple[str, str] | None:
    """The ``(variable, value)`` that names this process as a writer, or ``None`` when no rank is set."""
    for name in RANK_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value:
            return name, value
    return None


def shard_label(kind: ShardKind) -> str:
    """Return this process's shard label: ``r<RANK>`` for ``auto``/``rank``, ``r0`` for ``none``.

    The rank is ``RANK``, else ``LOCAL_RANK``, else 0 (see :data:`RANK_VARIABLES`). (``fingerprint`` shards are
    labelled from the call's inputs by the proxy itself.)

    Raises:
        ConfigError: the rank is set to something other than ASCII digits (the label becomes a file name in
            the dump dir; ``"../x"`` or ``"²"`` must never reach it).
    """
    if kind is ShardKind.NONE:
        return "r0"
    found = rank_of_process()
    if found is None:
        return "r0"
    name, rank = found
    if not (rank.isascii() and rank.isdigit() and len(rank) <= 9):
        raise ConfigError(name, rank, "a whole number of at most 9 digits (the writer's rank, as torchrun and "
                                      "verl set it), or unset")
    return f"r{int(rank)}"


def shared_shard_advice(role: RoleConfig) -> tuple[str, str]:
    """Why several writers share a shard of ``role`` and how to give each its own: ``(who, fix)``, for the WARNING
    that calls are then matched by their inputs only."""
    if rank_of_process() is None and role.shard in (ShardKind.AUTO, ShardKind.RANK):
        return ("this process has no RANK, so skipweave guesses its identity: Ray actors, processes or threads "
                "without a RANK of their own share shard r0",
                "give each writer its own RANK (e.g. .options(runtime_env={'env_vars': {'RANK': str(i)}}) for "
                "Ray actor i) so its calls match by call order")
    return ("threads (or processes with one RANK) call this target at the same step",
            "give each process its own RANK, and call the target from one thread per process, to match by call "
            "order")


__all__ = ["RANK_VARIABLES", "VALIDATION_SHARD", "rank_of_process", "shard_label", "shared_shard_advice"]
