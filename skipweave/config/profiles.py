"""Profiles composed with Hydra, for programs with or without Hydra: shipped, on a search path, or files.

A profile is selected by a *spec*, one of (first match wins):

1. a **path** to a YAML file: a spec ending in ``.yaml``/``.yml`` or holding a path separator
   (``./my_profile.yaml``, ``~/profiles/mine.yml``, ``conf/mine``), relative to the working folder;
2. a **name on the profile search path**: ``<name>.yaml`` in the first folder of
   ``SKIPWEAVE_PROFILE_PATH`` (``os.pathsep``-separated) that holds one; so a folder of your own can
   shadow a shipped name;
3. a **shipped** name (``conf/skip/<name>.yaml``, see :func:`shipped_profiles`);
4. a name an **integration** ships (``<its conf dir>/skip/<name>.yaml``, registered in
   :data:`~skipweave.config.profile_files.PROFILE_SOURCES` when the integration is loaded: see
   docs/integrations.md), in the integrations' load order.

Several specs compose in order, later ones winning (a list, or one string ``"a,b"``); then come the
overrides. A profile file is read and checked by :func:`skipweave.config.profile_files.read_profile_file`.

A Hydra app selects a profile with ``+skip=<name>`` (``+skip=[a,b]`` for several) on its command line:
the search-path plugin puts the profile search path's folders, then the shipped profiles, then the integrations'
profile folders on every app's search path. Everything else — ``skipweave.weave(profile=...)`` and
``skipweave run --skip`` — calls :func:`compose_profile`, which runs Hydra's own composition on ``+skip=[...]`` and
the overrides, so a profile, its defaults list and every override (``skip.rollout.steps=[1,2,3]``,
``+skip.rollout.targets.gen=pkg.mod.Gen.run``, ``~skip.rollout.targets.verl_agent_loop``) mean exactly
what they mean on a Hydra command line.

Precedence is Hydra's: the base config (an app's own ``skip`` node) < the profiles, in order < the
overrides.

Overrides of a profile file (docs/own_trainer.md#overrides): a plain ``key=value`` sets any key of the role
schema, also one the file leaves out (the file's roles declare every such key ``???``, see
:func:`~skipweave.config.profile_files.declare_role_keys`); here a key inside ``step``, ``bypass`` or
``fingerprint`` of such a role is set as ``++key=value`` (its parent may be ``???`` or absent); a key the schema
does not have is refused with the schema's did-you-mean; ``+`` adds a key the schema leaves free (a new target).
"""

from __future__ import annotations

import difflib
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from skipweave.config.errors import ConfigError
from skipweave.config.parse import unknown_role_key
from skipweave.config.profile_files import (
    PROFILE_PATH_ENV,
    PROFILE_SOURCES,
    IntegrationProfiles,
    expand_path,
    folder_profiles,
    looks_like_path,
    profile_folders,
    read_profile_file,
)
from skipweave.config.schema import NESTED_ROLE_KEYS

PROFILE_GROUP = "skip"
"""The Hydra config group holding the profiles."""

INTEGRATIONS_PROVIDER = "skipweave-integrations"
"""The provider of the search-path plugin's source of the integrations' profiles
(``hydra_plugins/skipweave_searchpath``)."""

_FILE_OPTION = "_skipweave_profile_"
"""Prefix of the ConfigStore options a composition registers for profile files (removed afterwards)."""


@dataclass(frozen=True)
class ProfileRef:
    """Where a profile spec led.

    Attributes:
        spec: the spec as the user wrote it (``rollout_cache``, ``./mine.yaml``, ``mine``).
        origin: ``"file"`` (a path), ``"profile path"`` (found on ``SKIPWEAVE_PROFILE_PATH``), ``"shipped"`` or
            ``"integration <name>"`` (shipped by that integration).
        path: the profile file's absolute path (``None`` for a shipped or an integration's profile, composed by
            name).
    """

    spec: str
    origin: str
    path: str | None = None


def conf_dir() -> str:
    """Return the folder holding skipweave's config groups (``<package>/conf``, shipped in the wheel).

    Raises:
        FileNotFoundError: the folder is missing (a broken install).
    """
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf")
    if not os.path.isdir(os.path.join(here, PROFILE_GROUP)):
        raise FileNotFoundError(f"skipweave's config groups are missing: no folder {here}/{PROFILE_GROUP}")
    return here


def shipped_profiles() -> list[str]:
    """Return the names of the shipped profiles, sorted (e.g. ``['async_rollout_cache', 'off', …]``)."""
    folder = os.path.join(conf_dir(), PROFILE_GROUP)
    return sorted(name[:-5] for name in os.listdir(folder) if name.endswith(".yaml"))


def integration_sources(*, off: bool = False) -> list[IntegrationProfiles]:
    """The profile folders of the integrations loaded in this process (``off=True``: of those that are off), in load
    order (see :data:`~skipweave.config.profile_files.PROFILE_SOURCES`)."""
    return [source for source in PROFILE_SOURCES if bool(source.off) == off]


def available_profiles() -> list[str]:
    """Return every name a profile can be selected by, sorted: the shipped ones, those on ``SKIPWEAVE_PROFILE_PATH``
    and those of the loaded integrations. (Files are selected by path and are not listed.)
    """
    names = set(shipped_profiles())
    for folder in profile_folders():
        names.update(folder_profiles(folder))
    for source in integration_sources():
        names.update(source.names())
    return sorted(names)


def split_profiles(profile: str | Sequence[str]) -> list[str]:
    """Return the specs of ``profile`` in order: a string is split at commas, as is each item of a sequence.

    Raises:
        ConfigError: ``profile`` is neither a string nor a sequence of strings, or holds an empty spec.
    """
    items = [profile] if isinstance(profile, str) else profile
    if not isinstance(items, Sequence) or not items or not all(isinstance(i, str) for i in items):
        raise ConfigError(
            "profile", profile, "a profile name or path, or a non-empty list of them: ['rollout_cache', 'mine.yaml']"
        )
    specs = [part.strip() for item in items for part in item.split(",")]
    if not all(specs):
        raise ConfigError("profile", profile, "comma-separated profile names or paths, none of them empty")
    return specs


def resolve_profile(spec: str) -> ProfileRef:
    """Tell where profile ``spec`` comes from: an explicit path, then ``SKIPWEAVE_PROFILE_PATH``, then shipped, then
    the loaded integrations' profiles.

    Raises:
        ConfigError: key ``profile``: a path to no file, or a name found nowhere; the message lists the
            shipped profiles, the search-path folders searched and the integrations' profiles, and says so when the
            name is a profile of an integration that is off.
    """
    if looks_like_path(spec):
        path = expand_path(spec)
        if not os.path.isfile(path):
            raise ConfigError("profile", spec, _allowed(spec, missing_file=path))
        return ProfileRef(spec, "file", path)
    for folder in profile_folders():
        path = os.path.join(folder, f"{spec}.yaml")
        if os.path.isfile(path):
            return ProfileRef(spec, "profile path", path)
    if spec in shipped_profiles():
        return ProfileRef(spec, "shipped")
    for source in integration_sources():
        if spec in source.names():
            return ProfileRef(spec, f"integration {source.integration}")
    raise ConfigError("profile", spec, _allowed(spec))


def _allowed(spec: str, missing_file: str | None = None) -> str:
    """Word what a profile spec may be, for the message of a spec that led nowhere."""
    shipped = ", ".join(repr(p) for p in shipped_profiles())
    searched = []
    for folder in profile_folders():
        if not os.path.isdir(folder):
            searched.append(f"{folder}: no such folder")
        else:
            searched.append(f"{folder}: " + (", ".join(repr(n) for n in folder_profiles(folder)) or "none"))
    where = f"searched {'; '.join(searched)}" if searched else "unset"
    kinds = (
        f"one of the shipped profiles {shipped}, a <name>.yaml in a folder of {PROFILE_PATH_ENV} ({where}), "
        + "".join(f"a profile of integration {source.integration!r} ("
                  + (", ".join(repr(n) for n in source.names()) or "none") + "), " for source in integration_sources())
        + "or a path to a YAML file (ending in .yaml or .yml, or holding a '/'; relative to the working folder)"
    )
    if missing_file is not None:
        return f"an existing file (there is no file {missing_file}); a profile is {kinds}"
    for source in integration_sources(off=True):
        if spec in source.names():
            return (f"a profile of a loaded integration; {spec!r} is a profile of integration {source.integration!r}, "
                    f"which is off in this process: {source.off}. A profile is {kinds}")
    close = difflib.get_close_matches(spec, available_profiles(), n=1)
    return kinds + (f"; did you mean {close[0]!r}?" if close else "")


def compose_profile(
    profile: str | Sequence[str], *, overrides: Sequence[str] = (), base: Any = None
) -> Any:
    """Compose ``+skip=[<profile>, ...]`` and ``overrides`` onto ``base`` with Hydra's composition.

    No global Hydra state is touched (a profile file is registered in Hydra's ``ConfigStore`` under a
    unique name for the composition only), so this also works inside a running Hydra app.

    Args:
        profile: a profile spec — a shipped name, a name on ``SKIPWEAVE_PROFILE_PATH`` or a path to a
            YAML file (see the module docstring for which wins) — or several, as a sequence or as one
            comma-separated string; later ones win.
        overrides: overrides in Hydra's command-line syntax, e.g. ``["skip.rollout.dump_dir=/x"]``;
            they win over every profile.
        base: the app's whole config (mapping, OmegaConf ``DictConfig`` or ``SkipConfig``), or
            ``None``; only its ``skip`` node and the legacy verl keys are read. The profiles win over it.

    Returns:
        An OmegaConf ``DictConfig`` holding ``skip`` (and legacy keys from ``base``), which
        :func:`skipweave.config.load_skip_config` accepts.

    Raises:
        ConfigError: key ``profile``: a spec that leads nowhere (listing the shipped profiles and the
            search-path folders searched) or a profile file that is missing, not valid YAML, or holds a
            top-level key besides ``skip`` and ``defaults`` (naming file and key); or an override Hydra
            rejects (naming the override and Hydra's reason).
    """
    refs = [resolve_profile(spec) for spec in split_profiles(profile)]
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
    options: list[tuple[str, ProfileRef]] = []  # (Hydra option of group skip, where it comes from)
    roles: set[str] = set()  # the roles the profile files declare
    try:
        for ref in refs:
            if ref.path is None:
                options.append((ref.spec, ref))
                continue
            option = f"{_FILE_OPTION}{uuid.uuid4().hex}"
            node = read_profile_file(ref.path, ref.spec)
            roles.update(_file_roles(node))
            store.store(group=PROFILE_GROUP, name=option, node=node, package="_global_")
            options.append((option, ref))
        store.store(name=name, node=_base_container(base))
        chosen = [option for option, _ in options]
        selection = chosen[0] if len(chosen) == 1 else "[" + ",".join(chosen) + "]"
        search_path = create_config_search_path(None)
        if not any(entry.provider == "skipweave" for entry in search_path.get_path()):
            search_path.append(provider="skipweave", path=f"file://{conf_dir()}")  # plugin not installed
        if not any(entry.provider == INTEGRATIONS_PROVIDER for entry in search_path.get_path()):
            for source in integration_sources():  # (the plugin is not installed: its source would find them)
                search_path.append(provider=f"skipweave-{source.integration}", path=f"file://{source.conf_dir}")
        loader = ConfigLoaderImpl(config_search_path=search_path)
        cfg = loader.load_configuration(
            config_name=name,
            overrides=[f"+{PROFILE_GROUP}={selection}", *_opening_nested(overrides, roles)],
            run_mode=RunMode.RUN,
        )
    except (HydraException, OmegaConfBaseException) as exc:
        parts = [str(exc)] + ([str(exc.__cause__)] if exc.__cause__ is not None else [])
        reason = " ".join(" ".join(p for p in parts if p).split())
        for option, ref in options:
            if ref.path is not None and option in reason:  # e.g. a defaults entry of the file is missing
                raise ConfigError("profile", ref.spec, reason.replace(f"{PROFILE_GROUP}/{option}", ref.path)) from None
        for _, ref in options:  # an integration's option refused by the plugin's source (profile-file rules)
            said = f"skipweave: +{PROFILE_GROUP}={ref.spec!r} is not allowed: "
            if ref.path is None and said in reason:
                raise ConfigError("profile", ref.spec, reason.split(said, 1)[1]) from None
        bad = _culprit(reason, overrides)
        if bad is None:
            raise ConfigError("overrides", list(overrides), reason) from None
        key, _, value = bad.partition("=")
        # Hydra would advise `+key`, which the schema then refuses: name the keys it has instead.
        raise (unknown_role_key(key.lstrip("+~"), value) or ConfigError(key, value, reason)) from None
    finally:
        store.repo.pop(f"{name}.yaml", None)
        group = store.repo.get(PROFILE_GROUP)
        if isinstance(group, dict):
            for option, ref in options:
                if ref.path is not None:
                    group.pop(f"{option}.yaml", None)
            if not group:
                store.repo.pop(PROFILE_GROUP)
    with open_dict(cfg):
        del cfg["hydra"]
    OmegaConf.set_struct(cfg, False)
    return cfg


def _file_roles(node: Any) -> list[str]:
    """Return the roles a profile file's node (from ``read_profile_file``) holds under ``skip:`` as mappings."""
    from omegaconf import OmegaConf

    container = OmegaConf.to_container(node, resolve=False)
    skip = container.get("skip") if isinstance(container, dict) else None
    return [str(name) for name, role in skip.items() if isinstance(role, dict)] if isinstance(skip, dict) else []


def _opening_nested(overrides: Sequence[str], roles: set[str]) -> list[str]:
    """Return ``overrides`` with each plain one of a key inside ``step``, ``bypass`` or ``fingerprint`` of one of
    ``roles`` written ``++key=value``.

    Hydra sets a plain key only inside a mapping that holds it: ``skip.rollout.step.source=attr`` fails when the
    file leaves ``step`` out (declared ``???``, or absent). ``++`` is the same assignment, opening the mapping when
    needed; as with Hydra's own ``++``, a shorthand there (``step: counter``) gives way to the mapping.
    """
    out = []
    for override in overrides:
        key, eq, _ = override.partition("=")
        parts = key.split(".")
        if eq and len(parts) == 4 and parts[0] == PROFILE_GROUP and parts[1] in roles:
            if parts[3] in NESTED_ROLE_KEYS.get(parts[2], ()):
                override = f"++{override}"
        out.append(override)
    return out


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
    from skipweave.config.adapters import relevant_config
    from skipweave.config.schema import SkipConfig

    if isinstance(base, SkipConfig):
        return base.to_config()
    return relevant_config(base)
