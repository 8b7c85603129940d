"""Shipped profiles (``conf/skip/<name>.yaml``) composed with Hydra, for programs with or without Hydra.

A Hydra app selects a profile with ``+skip=<name>`` on its command line. Everything else —
``skipweave.weave(profile=...)``, the ``skipweave run --skip <name>`` launcher, and the
``+skipweave=<name>`` route for dataclass-schema apps — calls :func:`compose_profile`, which runs
Hydra's own composition on ``+skip=<name>`` and the overrides, so a profile, its defaults list and
every override (``skip.rollout.steps=[1,2,3]``, ``+skip.rollout.targets.gen=pkg.mod.Gen.run``,
``~skip.rollout.targets.verl_agent_loop``) mean exactly what they mean on a Hydra command line.

Precedence is Hydra's: the base config (an app's own ``skip`` node) < the profile < the overrides.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from typing import Any

from skipweave.config.errors import ConfigError

PROFILE_GROUP = "skip"
"""The Hydra config group holding the profiles."""


def conf_dir() -> str:
    """Return the folder holding skipweave's config groups (``<package>/conf``, shipped in the wheel).

    Raises:
        FileNotFoundError: the folder is missing (a broken install).
    """
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf")
    if not os.path.isdir(os.path.join(here, PROFILE_GROUP)):
        raise FileNotFoundError(f"skipweave's config groups are missing: no folder {here}/{PROFILE_GROUP}")
    return here


def available_profiles() -> list[str]:
    """Return the names of the shipped profiles, sorted (e.g. ``['async_rollout_cache', 'off', …]``)."""
    folder = os.path.join(conf_dir(), PROFILE_GROUP)
    return sorted(name[:-5] for name in os.listdir(folder) if name.endswith(".yaml"))


def compose_profile(profile: str, *, overrides: Sequence[str] = (), base: Any = None) -> Any:
    """Compose ``+skip=<profile>`` and ``overrides`` onto ``base`` with Hydra's composition.

    No global Hydra state is touched, so this also works inside a running Hydra app.

    Args:
        profile: a profile name (see :func:`available_profiles`).
        overrides: overrides in Hydra's command-line syntax, e.g. ``["skip.rollout.dump_dir=/x"]``.
        base: the app's whole config (mapping, OmegaConf ``DictConfig`` or ``SkipConfig``), or
            ``None``; only its ``skip`` node and the legacy verl keys are read.

    Returns:
        An OmegaConf ``DictConfig`` holding ``skip`` (and legacy keys from ``base``), which
        :func:`skipweave.config.load_skip_config` accepts.

    Raises:
        ConfigError: an unknown profile (listing the shipped ones), or an override Hydra rejects
            (naming the override and Hydra's reason).
    """
    if not isinstance(profile, str) or profile not in available_profiles():
        raise ConfigError("profile", profile, "one of " + ", ".join(repr(p) for p in available_profiles()))
    for override in overrides:
        if not isinstance(override, str):
            raise ConfigError(
                "overrides",
                override,
                "strings in Hydra's command-line syntax, e.g. 'skip.rollout.steps=[1,2]'",
            )
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path
    from hydra.core.config_store import ConfigStore
    from hydra.errors import HydraException
    from hydra.types import RunMode
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import OmegaConfBaseException

    # The base becomes the primary config, so that Hydra merges it exactly as it merges an app's own.
    store = ConfigStore.instance()
    name = f"_skipweave_base_{uuid.uuid4().hex}"
    store.store(name=name, node=_base_container(base))
    try:
        search_path = create_config_search_path(None)
        if not any(entry.provider == "skipweave" for entry in search_path.get_path()):
            search_path.append(provider="skipweave", path=f"file://{conf_dir()}")  # plugin not installed
        loader = ConfigLoaderImpl(config_search_path=search_path)
        cfg = loader.load_configuration(
            config_name=name, overrides=[f"+{PROFILE_GROUP}={profile}", *overrides], run_mode=RunMode.RUN
        )
    except (HydraException, OmegaConfBaseException) as exc:
        parts = [str(exc)] + ([str(exc.__cause__)] if exc.__cause__ is not None else [])
        reason = " ".join(" ".join(p for p in parts if p).split())
        bad = _culprit(reason, overrides)
        if bad is None:
            raise ConfigError("overrides", list(overrides), reason) from None
        key, _, value = bad.partition("=")
        raise ConfigError(key, value, reason) from None
    finally:
        store.repo.pop(f"{name}.yaml", None)
    with open_dict(cfg):
        del cfg["hydra"]
    OmegaConf.set_struct(cfg, False)
    return cfg


def _culprit(reason: str, overrides: Sequence[str]) -> str | None:
    """Return the override Hydra's message is about, if it names one."""
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        if override in reason or (key and key in reason):
            return override
    return None


def _base_container(base: Any) -> dict[str, Any]:
    if base is None:
        return {}
    from skipweave.config.legacy import relevant_config
    from skipweave.config.schema import SkipConfig

    if isinstance(base, SkipConfig):
        return base.to_config()
    return relevant_config(base)
