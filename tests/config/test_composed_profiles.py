"""Every shipped profile composes to what it composed to before profiles shared a base (``base/rollout.yaml``).

``data/composed_profiles.json`` holds each profile as Hydra composed it from the self-contained files: with
``+skip=<name>`` and ``+skipweave=<name>`` in an app of its own, and through :func:`compose_profile`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from skipweave.config import load_skip_config
from skipweave.config.profiles import compose_profile, conf_dir

EXPECTED: dict[str, Any] = json.loads((Path(__file__).parent / "data" / "composed_profiles.json").read_text())


def _composed_in_app(group: str, name: str, tmp_path: Path) -> dict[str, Any]:
    (tmp_path / "config.yaml").write_text("{}\n")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(tmp_path), version_base=None):
            cfg = compose(config_name="config", overrides=[f"+{group}={name}"], return_hydra_config=True)
    finally:
        GlobalHydra.instance().clear()
    node = OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(node, dict)
    callbacks = node.pop("hydra").get("callbacks")
    return {"cfg": node, "callbacks": callbacks}


def test_every_shipped_profile_is_covered() -> None:
    shipped = {f"{group}/{n[:-5]}" for group in ("skip", "skipweave")
               for n in os.listdir(os.path.join(conf_dir(), group)) if n.endswith(".yaml")}
    assert shipped == {k for k in EXPECTED if not k.startswith("compose_profile/")}


@pytest.mark.parametrize("option", sorted(k for k in EXPECTED if not k.startswith("compose_profile/")))
def test_a_profile_composes_in_an_app_as_before(option: str, tmp_path: Path) -> None:
    group, name = option.split("/")
    assert _composed_in_app(group, name, tmp_path) == EXPECTED[option]


@pytest.mark.parametrize("name", sorted(k.split("/")[1] for k in EXPECTED if k.startswith("compose_profile/")))
def test_a_profile_composes_through_compose_profile_as_before(name: str) -> None:
    composed = compose_profile(name)
    assert OmegaConf.to_container(composed, resolve=False) == EXPECTED[f"compose_profile/{name}"]
    assert load_skip_config(composed) == load_skip_config(OmegaConf.create(EXPECTED[f"compose_profile/{name}"]))


def test_a_later_profile_still_wins_over_one_sharing_its_base() -> None:
    """The base is listed by both, and composed once: the later profile's own values still win."""
    for first, second, action in (("rollout_repeat", "rollout_cache", "cache"),
                                  ("rollout_cache", "rollout_repeat", "repeat"),
                                  ("rollout_replay", "rollout_repeat", "repeat")):
        composed = compose_profile([first, second])
        assert composed.skip.rollout.action == action, (first, second)
    replay_then_repeat = compose_profile(["rollout_replay", "rollout_repeat"])
    assert replay_then_repeat.skip.rollout.replay_only is True  # rollout_repeat sets no replay_only
