"""skipweave: record and replay the rollouts of RL-for-LLM trainers with zero change to their source.

Public API (imported lazily, so that ``import skipweave`` — done by the Hydra plugin in every Hydra
app of the environment — costs no torch or ray import):

- :func:`weave` / :func:`unweave`: patch the configured targets / restore the originals.
- :func:`set_step`: tell skipweave the current training step (verl's ``SkipManager`` style).
- :func:`counters`: hits, misses, bypasses, bytes and seconds saved in this process.
- :func:`flush`: wait until the recordings still being written in the background are committed.
- :func:`load_integrations`: load the integrations of the environment (host types, config adapters, ...), once per
  process; :func:`weave`, the ``skipweave`` command, the Hydra callback and ``skipweave run`` do it themselves, a
  program that only reads a store through ``skipweave.store`` calls it first (see ``docs/integrations.md``).
- :class:`ConfigError`: a bad ``skip`` value, raised before anything is patched.
- :class:`TargetNotFound`: a target path that does not resolve (names the failing part).
- :class:`ReplayMissing`: a replay-only run met a call no recording serves (see ``docs/replay_only.md``).
- :class:`FingerprintMismatch`: a recording was made for other inputs and ``fingerprint.on_mismatch`` is ``error``.
- :class:`EnvironmentMismatch`: a recording was made in another environment (package versions, the target's source,
  named config keys) and ``fingerprint.on_env_mismatch`` is ``error`` (a :class:`FingerprintMismatch`).
- :class:`ForeignRecording`: a recording is of a format version this skipweave does not read (a newer one wrote it)
  and ``skip.<role>.on_foreign`` is ``error``.
- :class:`StubUnforeseen`: the host used a stand-in of a replay-only run in a way its profile did not declare.
- :class:`DumpDirNotShared`: a Ray worker's dump dir is not the driver's folder and the role has ``require_shared``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from skipweave.version import __version__

if TYPE_CHECKING:
    from skipweave.api import counters, set_step, unweave, weave, woven_plan
    from skipweave.config.errors import ConfigError
    from skipweave.integrations.discovery import load_integrations
    from skipweave.store.write_behind import flush
    from skipweave.weaving.proxy import ReplayMissing
    from skipweave.weaving.replay import EnvironmentMismatch, FingerprintMismatch, ForeignRecording
    from skipweave.weaving.resolve import TargetNotFound
    from skipweave.weaving.shared_dirs import DumpDirNotShared
    from skipweave.weaving.stubs import StubUnforeseen
    from skipweave.weaving.verifier import Diverged

_LAZY = {
    "weave": "skipweave.api",
    "unweave": "skipweave.api",
    "woven_plan": "skipweave.api",
    "set_step": "skipweave.api",
    "counters": "skipweave.api",
    "flush": "skipweave.store.write_behind",
    "load_integrations": "skipweave.integrations.discovery",
    "ConfigError": "skipweave.config.errors",
    "TargetNotFound": "skipweave.weaving.resolve",
    "ReplayMissing": "skipweave.weaving.proxy",
    "FingerprintMismatch": "skipweave.weaving.replay",
    "EnvironmentMismatch": "skipweave.weaving.replay",
    "ForeignRecording": "skipweave.weaving.replay",
    "StubUnforeseen": "skipweave.weaving.stubs",
    "Diverged": "skipweave.weaving.verifier",
    "DumpDirNotShared": "skipweave.weaving.shared_dirs",
}

__all__ = ["ConfigError", "Diverged", "DumpDirNotShared", "EnvironmentMismatch", "FingerprintMismatch",
           "ForeignRecording", "ReplayMissing",
           "StubUnforeseen", "TargetNotFound", "__version__", "counters", "flush", "load_integrations", "set_step",
           "unweave", "weave", "woven_plan"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'skipweave' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
