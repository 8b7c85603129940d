"""Put skipweave's config groups (``skip``, ``skipweave``) on every Hydra app's search path.

Hydra imports this module in every Hydra app of the environment, so it stays tiny: it imports no
torch, no ray, not even ``skipweave`` itself. The folder is located with ``find_spec``, which reads
the import system's metadata without running ``skipweave/__init__.py``; this works for a wheel
(``site-packages/skipweave/conf``) and an editable install (``skipweave/conf`` links to the
checkout's top-level ``conf/``) alike.
"""

from __future__ import annotations

import importlib.util
import os

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


def skipweave_conf_dir() -> str | None:
    """Return the folder holding skipweave's config groups, or ``None`` if skipweave is not importable."""
    spec = importlib.util.find_spec("skipweave")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = os.path.join(location, "conf")
        if os.path.isdir(os.path.join(candidate, "skip")):
            return os.path.abspath(candidate)
    return None


class SkipweaveSearchPathPlugin(SearchPathPlugin):
    """Append skipweave's ``conf/`` so that ``+skip=<profile>`` composes into any app.

    Appended, not prepended: an app that ships its own ``skip/<name>.yaml`` keeps it.
    """

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        conf_dir = skipweave_conf_dir()
        if conf_dir is not None:
            search_path.append(provider="skipweave", path=f"file://{conf_dir}")
