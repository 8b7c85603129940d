"""Profiles of one's own (``skipweave/config/profiles.py``, ``profile_files.py``): files, the profile search
path, several profiles in order, and the errors, composed in-process by Hydra's own composition.

The same routes end to end: ``skipweave run --skip FILE`` in tests/cli/test_run.py, ``+skip=<name>`` from
``SKIPWEAVE_PROFILE_PATH`` in a real Hydra app in tests/integrations/hydra/test_hydra_apps.py.
"""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

import skipweave
from skipweave.config import ConfigError, load_skip_config
from skipweave.config.parse import parse_role
from skipweave.config.profile_files import CALLBACK_DEFAULT, PROFILE_PATH_ENV, read_profile_file
from skipweave.config.profiles import available_profiles, compose_profile, resolve_profile, shipped_profiles
from skipweave.config.schema import ROLE_KEYS, Action, RoleConfig, StepSet

MINE = """\
skip:
  rollout:
    enable: true
    action: repeat
    steps: [1, 2]
    dump_dir: ???
    targets:
      gen: pkg.mod.Gen.run
"""


@pytest.fixture(autouse=True)
def _no_inherited_profile_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PROFILE_PATH_ENV, raising=False)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def rollout(profile: str | list[str], *overrides: str) -> RoleConfig:
    return load_skip_config(compose_profile(profile, overrides=overrides)).roles["rollout"]


# --- files ------------------------------------------------------------------------------------------


def test_a_file_composes_with_or_without_the_package_header(tmp_path: Path) -> None:
    bare = write(tmp_path / "bare.yaml", MINE)
    headed = write(tmp_path / "headed.yml", "# @package _global_\n" + MINE)
    plain = rollout(str(bare))
    assert (plain.enable, plain.action, plain.steps) == (True, Action.REPEAT, StepSet(((1, 2),)))
    assert [t.name for t in plain.targets] == ["gen"]
    assert rollout(str(headed)) == plain
    # What Hydra gets: the file as written, plus the callback entry the shipped profiles carry.
    node = read_profile_file(str(bare))
    assert list(node.defaults) == [CALLBACK_DEFAULT, "_self_"]
    assert OmegaConf.is_missing(node.skip.rollout, "dump_dir")


def test_a_path_is_relative_to_the_working_folder_and_expands_the_home_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path / "profiles" / "mine.yaml", MINE)
    write(tmp_path / "profiles" / "noext", MINE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    expected = rollout("profiles/mine.yaml")
    assert rollout("./profiles/mine.yaml") == rollout("~/profiles/mine.yaml") == expected
    assert rollout("profiles/noext") == expected  # a '/' makes it a path, whatever its suffix
    assert resolve_profile("profiles/mine.yaml").path == str(tmp_path / "profiles" / "mine.yaml")


def test_a_file_may_build_on_another_profile_with_a_defaults_list(tmp_path: Path) -> None:
    on_base = write(tmp_path / "on_base.yaml", "defaults:\n  - rollout_cache\n  - _self_\n" + MINE)
    role = rollout(str(on_base))
    assert role.action is Action.REPEAT and {"gen", "verl_agent_loop"} <= {t.name for t in role.targets}


# --- several profiles ----------------------------------------------------------------------------------


def test_profiles_compose_in_order_later_ones_winning_and_overrides_win_over_all(tmp_path: Path) -> None:
    first = write(tmp_path / "first.yaml", MINE)
    second = write(
        tmp_path / "second.yaml",
        """\
        skip:
          rollout:
            action: cache
            namespace: second
            targets: {other: pkg.mod.Other.run}
        """,
    )
    both = rollout([str(first), str(second)])
    assert (both.action, both.namespace, both.steps) == (Action.CACHE, "second", StepSet(((1, 2),)))
    assert [t.name for t in both.targets] == ["gen", "other"]  # mappings merge
    assert rollout([str(second), str(first)]).action is Action.REPEAT
    assert rollout(f"{first},{second}") == both  # one comma-separated string, as `--skip a,b`
    overridden = rollout([str(first), str(second)], "skip.rollout.action=repeat_last", "skip.rollout.steps=[5]")
    assert (overridden.action, overridden.steps, overridden.namespace) == (
        Action.REPEAT_LAST,
        StepSet(((5, 5),)),
        "second",
    )
    # A shipped profile and one's own: the shipped targets stay, the file's values win.
    shipped_first = rollout(["rollout_cache", str(first)])
    assert shipped_first.action is Action.REPEAT
    assert {"verl_agent_loop", "gen"} <= {t.name for t in shipped_first.targets}
    assert rollout([str(first), "rollout_cache"]).action is Action.CACHE


def test_shipped_profiles_compose_as_a_list_too() -> None:
    assert rollout(["rollout_cache", "rollout_repeat"]).action is Action.REPEAT
    assert rollout("rollout_repeat,rollout_cache").action is Action.CACHE
    assert not rollout("rollout_cache,off").enable


def test_the_base_config_stays_below_every_profile(tmp_path: Path) -> None:
    mine = write(tmp_path / "mine.yaml", MINE)
    base = {"skip": {"rollout": {"action": "cache", "namespace": "app", "targets": {"app": "app.mod.Gen.run"}}}}
    role = load_skip_config(compose_profile(["rollout_cache", str(mine)], base=base)).roles["rollout"]
    assert (role.action, role.namespace) == (Action.REPEAT, "app")
    assert {"app", "gen", "verl_agent_loop"} <= {t.name for t in role.targets}


# --- the profile search path -----------------------------------------------------------------------------


def test_names_on_the_profile_search_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    write(one / "mine.yaml", MINE)
    write(two / "mine.yaml", MINE.replace("action: repeat", "action: cache"))
    write(two / "theirs.yaml", MINE.replace("gen:", "theirs:"))
    write(two / "rollout_cache.yaml", MINE.replace("action: repeat", "action: repeat_cycle"))
    monkeypatch.setenv(PROFILE_PATH_ENV, os.pathsep.join([str(one), "", str(tmp_path / "missing"), str(two)]))
    assert rollout("mine").action is Action.REPEAT  # the first folder holding the name wins
    assert [t.name for t in rollout("theirs").targets] == ["theirs"]
    assert rollout("rollout_cache").action is Action.REPEAT_CYCLE  # the search path shadows a shipped name
    assert resolve_profile("rollout_cache").origin == "profile path"
    assert rollout("theirs,mine").action is Action.REPEAT
    assert set(available_profiles()) == set(shipped_profiles()) | {"mine", "theirs"}
    # An explicit path wins over a name: `mine.yaml` is the file in the working folder.
    write(tmp_path / "cwd" / "mine.yaml", MINE.replace("action: repeat", "action: repeat_last"))
    monkeypatch.chdir(tmp_path / "cwd")
    assert rollout("mine.yaml").action is Action.REPEAT_LAST
    assert rollout("mine").action is Action.REPEAT


# --- weave() -------------------------------------------------------------------------------------------


def test_weave_with_a_profile_file_and_with_a_name_on_the_search_path(
    host_module: Callable[..., tuple[str, Path]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, _ = host_module(
        "CALLS = []\nclass Gen:\n    def run(self, step):\n        CALLS.append(step)\n"
        "        return {'step': step}\n"
    )
    host = sys.modules[name]
    profile = write(
        tmp_path / "profiles" / "mine.yaml",
        f"""\
        skip:
          rollout:
            enable: true
            dump_dir: {tmp_path / "dump"}
            step: counter
            targets:
              gen: {name}.Gen.run
        """,
    )
    patches = skipweave.weave(profile=str(profile))
    assert [p.target.name for p in patches] == ["gen"]
    assert [host.Gen().run(s) for s in (7, 8)] == [{"step": 7}, {"step": 8}]
    assert host.CALLS == [7, 8]
    skipweave.unweave()
    # The same file by name, after a shipped profile: the replay makes no real call.
    monkeypatch.setenv(PROFILE_PATH_ENV, str(profile.parent))
    skipweave.weave(profile=("rollout_cache", "mine"), overrides=["~skip.rollout.targets.verl_agent_loop"])
    plan = skipweave.woven_plan()
    assert plan is not None and plan.roles["rollout"].action is Action.CACHE
    assert [host.Gen().run(s) for s in (7, 8)] == [{"step": 7}, {"step": 8}]
    assert host.CALLS == [7, 8]


# --- overrides of a profile file -------------------------------------------------------------------------


def _bare_profile(host_module: Callable[..., tuple[str, Path]], tmp_path: Path, extra: str = "") -> tuple[Path, str]:
    """A profile file that sets no dump_dir, steps, action or step: only its target (and ``extra`` role lines)."""
    name, _ = host_module("class Gen:\n    def run(self, step):\n        return {'step': step}\n")
    text = f"skip:\n  rollout:\n    enable: true\n{extra}    targets:\n      gen: {name}.Gen.run\n"
    return write(tmp_path / "bare.yaml", text), name


def test_a_plain_override_sets_a_role_key_the_file_leaves_out(
    host_module: Callable[..., tuple[str, Path]], tmp_path: Path
) -> None:
    profile, name = _bare_profile(host_module, tmp_path)
    skipweave.weave(profile=str(profile), overrides=[
        f"skip.rollout.dump_dir={tmp_path / 'x'}", "skip.rollout.steps=[1,2]", "skip.rollout.action=repeat",
        "skip.rollout.write_buffer=1MB", "skip.rollout.step.source=counter",  # a key inside a mapping left out too
    ])
    plan = skipweave.woven_plan()
    assert plan is not None
    role = plan.roles["rollout"]
    assert (role.dump_dir, role.steps, role.action) == (str(tmp_path / "x"), StepSet(((1, 2),)), Action.REPEAT)
    assert (role.write_buffer, role.step.source.value) == (10**6, "counter")
    skipweave.unweave()
    # Every role key is declared ??? for Hydra; left unset, each means what it meant absent.
    node = read_profile_file(str(profile))
    assert set(node.skip.rollout) == set(ROLE_KEYS) and OmegaConf.is_missing(node.skip.rollout, "write_buffer")
    assert rollout(str(profile)) == parse_role("rollout", {"enable": True, "targets": {"gen": f"{name}.Gen.run"}})
    app = {"skip": {"rollout": {"dump_dir": "/app", "step": "counter", "bypass": None}}}
    kept = load_skip_config(compose_profile(str(profile), base=app)).roles["rollout"]
    assert (kept.dump_dir, kept.step.source.value, kept.bypass.when.value) == ("/app", "counter", "never")
    legacy = {"actor_rollout_ref": {"rollout": {"skip_rollout": True, "skip_dump_dir": "/legacy"}}}
    with pytest.warns(FutureWarning):
        assert load_skip_config(compose_profile(str(profile), base=legacy)).roles["rollout"].dump_dir == "/legacy"
    # `+` and `++` keep working on a key the file leaves out.
    assert rollout(str(profile), "+skip.rollout.dump_dir=/plus").dump_dir == "/plus"
    assert rollout(str(profile), "++skip.rollout.dump_dir=/both").dump_dir == "/both"


def test_a_plain_override_replaces_a_key_the_file_sets(
    host_module: Callable[..., tuple[str, Path]], tmp_path: Path
) -> None:
    profile, _ = _bare_profile(host_module, tmp_path, extra=f"    dump_dir: {tmp_path / 'file'}\n    steps: [3]\n")
    assert rollout(str(profile)).dump_dir == str(tmp_path / "file")
    skipweave.weave(profile=str(profile), overrides=[f"skip.rollout.dump_dir={tmp_path / 'cli'}"])
    plan = skipweave.woven_plan()
    assert plan is not None
    assert (plan.roles["rollout"].dump_dir, plan.roles["rollout"].steps) == (str(tmp_path / "cli"), StepSet(((3, 3),)))


@pytest.mark.parametrize(
    ("override", "key", "hint"),
    [
        ("skip.rollout.dump_dri=/x", "skip.rollout.dump_dri", "did you mean 'dump_dir'?"),
        ("skip.rollout.step.sorce=attr", "skip.rollout.step.sorce", "did you mean 'source'?"),
    ],
)
def test_an_unknown_key_is_refused_with_the_keys_the_schema_has(
    host_module: Callable[..., tuple[str, Path]], tmp_path: Path, override: str, key: str, hint: str
) -> None:
    profile, _ = _bare_profile(host_module, tmp_path)
    with pytest.raises(ConfigError) as info:
        skipweave.weave(profile=str(profile), overrides=[override])
    assert info.value.key == key and f"no such key; {hint}" in str(info.value)
    assert "+skip" not in str(info.value)  # not Hydra's advice to add it
    assert skipweave.woven_plan() is None


# --- errors --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "fragments"),
    [
        (None, ["there is no file", "one of the shipped profiles 'async_rollout_cache'"]),
        ("skip:\n  rollout: [1\n", ["a valid YAML file", "bad.yaml, line 3"]),
        ("rollout:\n  enable: true\n", ["top-level key 'rollout'", "bad.yaml", "skip.rollout"]),
        (MINE + "hydra:\n  run: {dir: x}\n", ["top-level key 'hydra'"]),
        ("# @package skip\n" + MINE, ["'# @package skip'"]),
        ("- skip\n", ["holds a list"]),
        ("", ["holds nothing"]),
        ("skip: 3\n", ["skip: 3"]),
        ("defaults: {a: b}\n" + MINE, ["'defaults:' holding a list"]),
        ("defaults:\n  - /skipweave/nope\n  - _self_\n" + MINE, ["skipweave/nope", "bad.yaml"]),
    ],
    ids=["missing", "yaml", "foreign key", "hydra key", "header", "list", "empty", "skip scalar", "defaults",
         "bad default"],
)
def test_a_bad_profile_file_names_the_key_the_file_and_what_is_allowed(
    tmp_path: Path, content: str | None, fragments: list[str]
) -> None:
    path = tmp_path / "bad.yaml"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as info:
        compose_profile(["rollout_cache", str(path)])
    assert (info.value.key, info.value.value) == ("profile", str(path))
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)
    assert not any("_skipweave_" in name for name in _stored(ConfigStore.instance().repo)), "left in ConfigStore"


def test_an_unknown_name_lists_the_shipped_profiles_and_the_folders_searched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError) as info:
        compose_profile("rollout_cash")
    message = str(info.value)
    assert info.value.key == "profile" and "profile='rollout_cash' is not allowed" in message
    assert all(repr(p) in message for p in shipped_profiles())
    assert f"{PROFILE_PATH_ENV} (unset)" in message and "did you mean 'rollout_cache'?" in message
    write(tmp_path / "one" / "mine.yaml", MINE)
    monkeypatch.setenv(PROFILE_PATH_ENV, os.pathsep.join([str(tmp_path / "one"), str(tmp_path / "none")]))
    with pytest.raises(ConfigError) as info:
        compose_profile("rollout_cache,mien")
    message = str(info.value)
    assert info.value.value == "mien"
    assert f"searched {tmp_path / 'one'}: 'mine'; {tmp_path / 'none'}: no such folder" in message
    assert "did you mean 'mine'?" in message


@pytest.mark.parametrize("profile", ["", "rollout_cache,,off", [], [3], None])
def test_an_empty_or_odd_profile_spec_is_refused(profile: object) -> None:
    with pytest.raises(ConfigError) as info:
        compose_profile(profile)  # type: ignore[arg-type]
    assert info.value.key == "profile"


def test_the_hydra_plugin_reads_the_same_variable() -> None:
    from hydra_plugins.skipweave_searchpath import skipweave_searchpath as plugin

    assert plugin.PROFILE_PATH_ENV == PROFILE_PATH_ENV


def _stored(repo: dict[str, object]) -> list[str]:
    names = []
    for key, value in repo.items():
        names.append(key)
        if isinstance(value, dict):
            names.extend(_stored(value))
    return names
