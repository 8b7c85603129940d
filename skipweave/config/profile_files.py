"""Profile files of one's own: telling a path from a name, the profile search path, reading one file.

A profile file is what a shipped profile is (``conf/skip/<name>.yaml``): a YAML mapping holding a
``skip:`` section and optionally a Hydra ``defaults`` list, headed ``# @package _global_`` or not at
all (it is placed at the config's root either way). Nothing else may sit at its top level: a role
written there (``rollout:`` instead of ``skip: {rollout: ...}``) would otherwise be dropped silently.

:func:`read_profile_file` is the one judgement of a file, used by :func:`skipweave.config.profiles.compose_profile`
(``weave(profile=...)``, ``skipweave run --skip``) and by the Hydra plugin's profile-path source
(``+skip=<name>`` in a Hydra app), so the three routes accept and refuse the same files.

Every key of the role schema that a role of the file leaves out is declared ``???`` (see
:func:`declare_role_keys`), so that a plain override (``skip.rollout.dump_dir=/x``) sets it on any profile
file, as on a shipped profile, which declares its per-run keys ``???`` itself.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from skipweave.config.errors import ConfigError
from skipweave.env import PROFILE_PATH_ENV
from skipweave.hooks import Registry

CALLBACK_DEFAULT = "/skipweave/callback@_global_.hydra.callbacks.skipweave"
"""The defaults entry that registers skipweave's Hydra callback (every shipped profile lists it)."""

TOP_LEVEL_KEYS = ("skip", "defaults")
"""The keys a profile file may hold at its top level."""

PATH_SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True)
class IntegrationProfiles:
    """The profiles an integration ships: a config folder holding ``skip/<name>.yaml`` option files, composed by
    name as the shipped profiles are (after them: a shipped name cannot be taken over).

    Attributes:
        integration: the integration's name, for messages (``"thirdparty"``).
        conf_dir: the absolute folder holding ``skip/`` (Hydra's search path gets ``file://<conf_dir>``).
        off: ``""`` while the integration is loaded; else why it is not (``"SKIPWEAVE_DISABLED_INTEGRATIONS names
            it"``): its profiles are then not selectable, and the error for one of their names says why.
    """

    integration: str
    conf_dir: str
    off: str = ""

    def names(self) -> list[str]:
        """The profile names of :attr:`conf_dir`, sorted (``[]`` when its ``skip/`` folder is gone)."""
        return folder_profiles(os.path.join(self.conf_dir, "skip"))


PROFILE_SOURCES: Registry[IntegrationProfiles] = Registry("integration profiles")
"""The integrations' profile folders (and those of integrations that are off, for the messages); registered by
:meth:`skipweave.integrations.base.Integration.load` and the discovery."""


def looks_like_path(spec: str) -> bool:
    """Whether profile ``spec`` is a file path rather than a name: it ends in ``.yaml``/``.yml`` or holds a
    path separator (``./mine``, ``~/profiles/mine.yaml``).
    """
    separators = [sep for sep in (os.sep, os.altsep, "/") if sep]
    return spec.endswith(PATH_SUFFIXES) or any(sep in spec for sep in separators)


def expand_path(spec: str) -> str:
    """Return the absolute path of a path ``spec``: ``~`` expanded, relative to the working folder."""
    return os.path.abspath(os.path.expanduser(spec))


def profile_folders(environ: Mapping[str, str] | None = None) -> list[str]:
    """Return the folders of ``SKIPWEAVE_PROFILE_PATH`` in order (``~`` expanded, made absolute).

    Empty entries are dropped; folders that do not exist are kept (an error message lists them as such)
    and simply hold no profile.
    """
    raw = (os.environ if environ is None else environ).get(PROFILE_PATH_ENV, "")
    return [expand_path(entry) for entry in raw.split(os.pathsep) if entry.strip()]


def folder_profiles(folder: str) -> list[str]:
    """Return the profile names a profile-path folder holds (``<name>.yaml``), sorted; ``[]`` if it is no folder."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return sorted(n[: -len(".yaml")] for n in names if n.endswith(".yaml") and os.path.isfile(os.path.join(folder, n)))


def read_profile_file(path: str, spec: str | None = None, *, key: str = "profile") -> Any:
    """Read and check the profile file at ``path``; return its content as an OmegaConf ``DictConfig``.

    The content is returned as written (``???`` and ``${...}`` kept for Hydra), with the defaults entry
    of skipweave's Hydra callback (:data:`CALLBACK_DEFAULT`) added when the file does not list it, so
    that ``+skip=<name>`` weaves in a Hydra app exactly as a shipped profile does, and with the role keys
    each role leaves out declared ``???`` (:func:`declare_role_keys`).

    Args:
        path: the file's absolute path.
        spec: how the user named the profile (``./mine.yaml``, ``mine``), for the messages; ``path`` if ``None``.
        key: the key the messages name: ``profile`` (``weave(profile=...)``, ``skipweave run --skip``) or
            ``+skip`` (a Hydra command line).

    Raises:
        ConfigError: naming ``key``: the file does not exist or cannot be read, is not valid YAML, is not a
            mapping, holds a top-level key besides ``skip`` and ``defaults`` (naming file and key), has a
            ``skip`` that is not a mapping or a ``defaults`` that is not a list, holds neither, or carries a
            ``# @package`` header other than ``_global_``.
    """
    from omegaconf import DictConfig, OmegaConf

    shown = path if spec is None else spec
    text = _read_text(path, shown, key)
    package = _package_header(text, path, shown, key)
    if package not in (None, "_global_"):
        raise ConfigError(
            key,
            shown,
            f"a profile file headed '# @package _global_' or without a header; {path} says '# @package {package}'",
        )
    try:
        cfg = OmegaConf.create(text) if text.strip() else OmegaConf.create({})
    except Exception as exc:  # noqa: BLE001 - yaml.YAMLError, OmegaConf's own errors: all mean "not valid YAML"
        raise ConfigError(key, shown, f"a valid YAML file; {_yaml_problem(exc, path)}") from None
    if not isinstance(cfg, DictConfig):
        raise ConfigError(key, shown, f"a YAML mapping with a 'skip:' section; {path} holds a list")
    container = OmegaConf.to_container(cfg, resolve=False)  # ??? and ${...} stay as written
    assert isinstance(container, dict)
    raw = {str(name): value for name, value in container.items()}
    for top in raw:
        if top not in TOP_LEVEL_KEYS:
            hint = f" (a role goes under skip:, as skip.{top})" if isinstance(raw[top], dict) and top != "hydra" else ""
            raise ConfigError(
                key,
                shown,
                f"a file whose top level holds only 'skip' and a 'defaults' list; {path} has top-level key "
                f"{top!r}{hint}",
            )
    if not raw:
        raise ConfigError(key, shown, f"a file holding a 'skip:' section; {path} holds nothing")
    if "skip" in raw and not isinstance(raw["skip"], dict):
        raise ConfigError(key, shown, f"'skip:' holding a mapping of roles; {path} has skip: {raw['skip']!r}")
    if "defaults" in raw and not isinstance(raw["defaults"], list):
        raise ConfigError(key, shown, f"'defaults:' holding a list; {path} has defaults: {raw['defaults']!r}")
    defaults = raw.get("defaults", ["_self_"])
    if not any("skipweave/callback" in str(entry) for entry in defaults):
        raw["defaults"] = [CALLBACK_DEFAULT, *defaults]
    if "skip" in raw:
        raw["skip"] = declare_role_keys(raw["skip"])
    return OmegaConf.create(raw)


def declare_role_keys(skip: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``skip`` with every key of the role schema that a role leaves out declared as ``???``.

    Hydra overrides only a key the config holds: declared, ``skip.rollout.dump_dir=/x`` works without ``+``.
    ``???`` is OmegaConf's "missing", which changes nothing a key left out would mean: a merge keeps the
    value below it (the app's own, an earlier profile's), a legacy verl key fills it, and what stays missing
    reads as absent (its default; see :func:`skipweave.config.schema.parse_role`). Only the top level of a
    role is declared: a mapping of ``???`` under ``step`` would replace an app's ``step: counter``.

    Args:
        skip: the file's ``skip:`` mapping (plain containers).

    Returns:
        A new mapping; roles that are not mappings (``rollout: false``) and Hydra keys (``_target_``) as written.
    """
    from skipweave.config.schema import ROLE_KEYS

    out = dict(skip)
    for name, role in skip.items():
        if isinstance(role, dict):
            out[name] = {**role, **{key: "???" for key in ROLE_KEYS if key not in role}}
    return out


def _read_text(path: str, shown: str, key: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except FileNotFoundError:
        raise ConfigError(key, shown, f"an existing YAML file; there is no file {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(key, shown, f"a readable YAML file; {path}: {reason}") from None


def _package_header(text: str, path: str, shown: str, key: str) -> str | None:
    """Return the ``# @package`` of the file's header, read by Hydra's own rule (leading ``# @key value`` lines)."""
    from hydra.plugins.config_source import ConfigSource

    try:
        return ConfigSource._get_header_dict(text[:512]).get("package")
    except ValueError as exc:
        raise ConfigError(key, shown, f"a header of '# @key value' lines; {path}: {exc}") from None


def _yaml_problem(exc: BaseException, path: str) -> str:
    """Word a YAML error as ``PATH, line N: problem``, on one line."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if mark is not None and problem:
        return f"{path}, line {mark.line + 1}, column {mark.column + 1}: {problem}"
    return f"{path}: " + " ".join(str(exc).split())
