"""Put skipweave's config groups (``skip``, ``skipweave``), the profile search path and the integrations' profile
folders on every Hydra app's search path.

Hydra imports this module in every Hydra app of the environment, so it stays tiny: it imports no
torch, no ray, no host. skipweave's folder is located with ``find_spec``, which reads
the import system's metadata without running ``skipweave/__init__.py``; this works for a wheel
(``site-packages/skipweave/conf``) and an editable install (``skipweave/conf`` links to the
checkout's top-level ``conf/``) alike. Only when ``SKIPWEAVE_PROFILE_PATH`` is set does it import
``skipweave.config.profile_files`` (pure Python, no torch) to read that variable as skipweave does.

The integrations' profile folders are one more source, :class:`IntegrationProfiles`, which asks
:func:`skipweave.integrations.discovery.profile_dirs` for them only when Hydra looks for an option of group ``skip``
that no source before it holds (``+skip=<a profile an integration ships>``, or the list of options in an error). That
reads the entry points of ``skipweave.integrations`` and each declaration (a light module by contract), with the same
off switch and version range as a loading process, and loads no part of an integration and no host; it costs 25-35 ms
(Dec 2026, a venv of 170 distributions), which an app that selects a shipped profile, or none, does not pay.
"""

from __future__ import annotations

import importlib.util
import logging
import os

from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.object_type import ObjectType
from hydra.errors import ConfigCompositionException
from hydra.plugins.config_source import ConfigLoadError, ConfigResult, ConfigSource
from hydra.plugins.search_path_plugin import SearchPathPlugin

PROFILE_PATH_ENV = "SKIPWEAVE_PROFILE_PATH"
"""Same as ``skipweave.config.profile_files.PROFILE_PATH_ENV`` (not imported: see the module docstring)."""

GROUP = "skip"

INTEGRATIONS_PROVIDER = "skipweave-integrations"
"""The provider of :class:`IntegrationProfiles` on the search path (``skipweave.config.profiles`` looks for it)."""


def skipweave_conf_dir() -> str | None:
    """Return the folder holding skipweave's config groups, or ``None`` if skipweave is not importable."""
    spec = importlib.util.find_spec("skipweave")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = os.path.join(location, "conf")
        if os.path.isdir(os.path.join(candidate, GROUP)):
            return os.path.abspath(candidate)
    return None


class SkipweaveSearchPathPlugin(SearchPathPlugin):
    """Append the folders of ``SKIPWEAVE_PROFILE_PATH``, then skipweave's ``conf/``, then the integrations' profile
    folders, so that ``+skip=<profile>`` composes into any app.

    Appended, not prepended: an app that ships its own ``skip/<name>.yaml`` keeps it. A name on the
    profile search path wins over a shipped one, as for ``skipweave run`` and ``skipweave.weave()``.
    """

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        if os.environ.get(PROFILE_PATH_ENV, "").strip():
            from skipweave.config.profile_files import profile_folders

            for folder in profile_folders():
                if os.path.isdir(folder):
                    search_path.append(provider="skipweave-profile-path", path=f"{ProfileFolder.scheme()}://{folder}")
        conf_dir = skipweave_conf_dir()
        if conf_dir is not None:
            search_path.append(provider="skipweave", path=f"file://{conf_dir}")
            # after the shipped profiles: a name skipweave ships cannot be taken over
            search_path.append(provider=INTEGRATIONS_PROVIDER, path=f"{IntegrationProfiles.scheme()}://{GROUP}")


def integration_profile_dirs() -> tuple[list[tuple[str, str]], list[tuple[str, str, str]]]:
    """``(integration, folder)`` of each integration whose profiles a process of this environment loads, and
    ``(integration, folder, why it is off)`` of each that ships profiles and is off; ``[], []`` when they cannot be read
    (a WARNING says why: a broken third-party declaration must not stop every Hydra app)."""
    try:
        from skipweave.integrations.discovery import off_profile_dirs, profile_dirs

        return profile_dirs(), off_profile_dirs()
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - see the docstring (a declaration calling sys.exit too)
        logging.getLogger("skipweave").warning("skipweave: the integrations' profile folders are not on Hydra's "
                                               "search path: %s: %s", type(exc).__name__, exc)
        return [], []


class ProfileFolder(ConfigSource):
    """A folder of ``SKIPWEAVE_PROFILE_PATH`` seen by Hydra as the one group ``skip``: ``<folder>/<name>.yaml``
    is option ``skip/<name>``, and nothing else of the folder is visible (its other files cannot shadow
    an app's configs).

    A file is read and checked by ``skipweave.config.profile_files.read_profile_file``, as
    ``skipweave run`` and ``skipweave.weave()`` read it: placed at the config's root with or without
    its ``# @package _global_`` header, and registering skipweave's callback by itself.
    """

    @staticmethod
    def scheme() -> str:
        return "skipweave-profiles"

    def available(self) -> bool:
        return os.path.isdir(self.path)

    def is_group(self, config_path: str) -> bool:
        return config_path.strip("/") in ("", GROUP) and self.available()

    def is_config(self, config_path: str) -> bool:
        file = self._file(config_path)
        return file is not None and os.path.isfile(file)

    def list(self, config_path: str, results_filter: ObjectType | None) -> list[str]:
        group = config_path.strip("/")
        if not self.available():
            return []
        if group == "":
            return [GROUP] if results_filter in (None, ObjectType.GROUP) else []
        if group != GROUP or results_filter == ObjectType.GROUP:
            return []
        names = os.listdir(self.path)
        return sorted(n[:-5] for n in names if n.endswith(".yaml") and os.path.isfile(os.path.join(self.path, n)))

    def load_config(self, config_path: str) -> ConfigResult:
        file = self._file(config_path)
        if file is None or not os.path.isfile(file):
            raise ConfigLoadError(f"Config not found: {config_path} in {self.path}")
        from skipweave.config.profile_files import read_profile_file  # only a profile selected from here

        try:
            cfg = read_profile_file(file, spec=config_path.strip("/").rpartition("/")[2], key="+skip")
        except ValueError as exc:  # skipweave.ConfigError; Hydra prints a composition error's message alone
            raise ConfigCompositionException(f"skipweave: {exc}") from None
        return ConfigResult(provider=self.provider, path=self.full_path(), config=cfg, header={"package": "_global_"})

    def _file(self, config_path: str) -> str | None:
        group, _, name = config_path.strip("/").rpartition("/")
        if group != GROUP or not name or name.startswith("."):
            return None
        return os.path.join(self.path, self._normalize_file_name(name))


class IntegrationProfiles(ConfigSource):
    """The profiles the integrations of the environment ship: the options (and sub-groups) of group ``skip`` in each
    one's profile folder, in the integrations' load order. An option (``skip/<name>.yaml``) is read and checked as a
    file of ``SKIPWEAVE_PROFILE_PATH`` is (``skipweave.config.profile_files.read_profile_file``); the files of its
    sub-groups (``skip/base/...``) as Hydra reads a ``file://`` source.

    The name of a profile of an integration that is off is found too, and loading it fails naming the integration and
    why it is off (Hydra's own message would only say that no such option exists).

    Only a path of group ``skip`` is ever looked up here, and the folders are asked for (see the module docstring) the
    first time one is.
    """

    def __init__(self, provider: str, path: str) -> None:
        super().__init__(provider=provider, path=path)
        self._dirs: tuple[list[tuple[str, str]], list[tuple[str, str, str]]] | None = None

    @staticmethod
    def scheme() -> str:
        return "skipweave-integrations"

    def folders(self) -> list[str]:
        """The integrations' profile folders (each holding ``skip/``), asked for once per source."""
        return [folder for _, folder in self._integration_dirs()[0]]

    def _integration_dirs(self) -> tuple[list[tuple[str, str]], list[tuple[str, str, str]]]:
        if self._dirs is None:
            self._dirs = integration_profile_dirs()
        return self._dirs

    def available(self) -> bool:
        return True

    def is_group(self, config_path: str) -> bool:
        path = config_path.strip("/")
        return _in_group(path) and any(os.path.isdir(os.path.join(f, path)) for f in self.folders())

    def is_config(self, config_path: str) -> bool:
        return self._file(config_path) is not None or self._off(config_path) is not None

    def list(self, config_path: str, results_filter: ObjectType | None) -> list[str]:
        path = config_path.strip("/")
        if not _in_group(path):
            return []
        found: set[str] = set()
        for folder in self.folders():
            where = os.path.join(folder, path)
            names = os.listdir(where) if os.path.isdir(where) else []
            for name in names:
                full = os.path.join(where, name)
                if results_filter in (None, ObjectType.GROUP) and os.path.isdir(full) and name[:1] not in "._":
                    found.add(name)
                if results_filter in (None, ObjectType.CONFIG) and name.endswith(".yaml") and os.path.isfile(full):
                    found.add(name[:-5])
        return sorted(found)

    def load_config(self, config_path: str) -> ConfigResult:
        """Load option or sub-group file ``config_path`` (``skip/<name>``, ``skip/base/<name>``).

        Raises:
            ConfigCompositionException: the option is a profile of an integration that is off (naming it and why), or
                its file is refused by the profile-file rules (not valid YAML, a top-level key besides ``skip`` and
                ``defaults``, ...), or a sub-group file is not valid YAML; each message names the file.
            ConfigLoadError: no integration holds ``config_path``.
        """
        file = self._file(config_path)
        path = config_path.strip("/")
        if file is None:
            off = self._off(config_path)
            if off is not None:
                name = path.rpartition("/")[2]
                raise ConfigCompositionException(
                    f"skipweave: +skip={name!r} is not allowed: {name!r} is a profile of integration {off[0]!r}, "
                    f"which is off in this process: {off[2]}")
            raise ConfigLoadError(f"Config not found: {config_path} in the integrations' profile folders")
        from omegaconf import OmegaConf

        if path.rpartition("/")[0] == GROUP:  # an option: judged as a profile file of one's own
            from skipweave.config.profile_files import read_profile_file

            try:
                cfg = read_profile_file(file, spec=path.rpartition("/")[2], key="+skip")
            except ValueError as exc:  # skipweave.ConfigError; Hydra prints a composition error's message alone
                raise ConfigCompositionException(f"skipweave: {exc}") from None
            return ConfigResult(provider=self.provider, path=f"file://{os.path.dirname(file)}", config=cfg,
                                header={"package": "_global_"})
        with open(file, encoding="utf-8") as fh:
            text = fh.read()
        try:
            cfg = OmegaConf.create(text) if text.strip() else OmegaConf.create({})
        except Exception as exc:  # noqa: BLE001 - yaml and OmegaConf errors alike: the file is no valid YAML
            raise ConfigCompositionException(f"skipweave: {file} (an integration's profile file) is not valid YAML: "
                                             + " ".join(str(exc).split())) from None
        return ConfigResult(provider=self.provider, path=f"file://{os.path.dirname(file)}", config=cfg,
                            header=ConfigSource._get_header_dict(text[:512]))

    def _off(self, config_path: str) -> tuple[str, str, str] | None:
        """``(integration, folder, why it is off)`` of the off integration holding option ``config_path``, if any."""
        path = config_path.strip("/")
        if path.rpartition("/")[0] != GROUP:
            return None
        name = self._normalize_file_name(path)
        for off in self._integration_dirs()[1]:
            if os.path.isfile(os.path.join(off[1], name)):
                return off
        return None

    def _file(self, config_path: str) -> str | None:
        path = config_path.strip("/")
        if not _in_group(path) or path == GROUP:
            return None
        name = self._normalize_file_name(path)
        for folder in self.folders():
            full = os.path.join(folder, name)
            if os.path.isfile(full):
                return full
        return None


def _in_group(path: str) -> bool:
    return path == GROUP or path.startswith(GROUP + "/")
