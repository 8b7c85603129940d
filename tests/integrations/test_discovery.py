"""Integrations as declarations: an ``Integration``'s checks, its ``load``/``unload`` pair, and what discovery decides
for each entry point (off switch, version range, a host that is not installed, a broken declaration).

In-process and fast; the real entry points of an installed third-party package are tests/integrations/
test_third_party.py's. Every test that changes what is loaded gives the session back the integrations it had.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import types
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from skipweave.config.adapters import CONFIG_ADAPTERS, ConfigAdapter
from skipweave.config.conventions import CONVENTIONS, Convention
from skipweave.config.profile_files import PROFILE_SOURCES
from skipweave.integrations import Integration, IntegrationError, discovery
from skipweave.integrations.base import PARTS, loaded_integrations
from skipweave.store.hosts import HOST_TYPES, HostType
from skipweave.weaving.environment import ENVIRONMENT_PACKAGES
from skipweave.weaving.notes import RESULT_NOTES, ResultNote
from skipweave.weaving.weave_hooks import WEAVE_HOOKS

ROOT = Path(__file__).resolve().parents[2]
HERE = __name__  # tests.integrations.test_discovery: the references below point into this module

HOST = HostType(kind="test_discovery_kind", label="test object", matches=lambda obj: False,
                encode=lambda enc, obj, path: {}, decode=lambda dec, node, path: None, children=lambda node: ())
ADAPTER = ConfigAdapter("test adapter", lambda cfg: {}, lambda container: container)
CONVENTION = Convention("test_discovery_convention", {"step": {"path": "info.step"}})
NOTE = ResultNote("test_discovery_attribute", "skipweave")


class Hook:
    def __init__(self) -> None:
        self.seen: list[Any] = []

    def on_weave(self, plan: Any) -> None:
        self.seen.append(("weave", sorted(plan.roles)))

    def on_unweave(self) -> None:
        self.seen.append(("unweave",))


HOOK = Hook()

FULL = Integration(
    name="test_full", host="packaging", versions=">=22",
    host_types=(f"{HERE}:HOST",), config_adapters=(f"{HERE}:ADAPTER",), conventions=(f"{HERE}:CONVENTION",),
    result_notes=(f"{HERE}:NOTE",),
    weave_hooks=(f"{HERE}:HOOK",), environment=("test_discovery_engine",),
)


@pytest.fixture
def fresh_session() -> Iterator[pytest.MonkeyPatch]:
    """Nothing loaded by discovery during the test; the session's integrations loaded again afterwards, once the
    patches the test made with the yielded ``MonkeyPatch`` (its entry points) are undone."""
    discovery.unload_integrations()
    try:
        with pytest.MonkeyPatch.context() as patch:
            yield patch
    finally:
        discovery.unload_integrations()
        discovery.load_integrations()
        assert {d.name for d in discovery.decisions()} >= set(discovery.SHIPPED)


def entry(name: str, value: str) -> metadata.EntryPoint:
    return metadata.EntryPoint(name, value, discovery.GROUP)


# ------------------------------------------------------------------------------------------- the declaration

def test_skipweaves_own_entry_points_are_the_shipped_table() -> None:
    """pyproject.toml declares skipweave's integrations as any package does; the fallback table (for an install whose
    metadata predates them) is the same, in the same (load) order."""
    text = (ROOT / "pyproject.toml").read_text()
    header = f'[project.entry-points."{discovery.GROUP}"]'
    assert header in text
    section = text.split(header, 1)[1].split("\n[", 1)[0]  # (read by hand: tomllib is Python 3.11+)
    lines = [line.split("#", 1)[0].strip() for line in section.splitlines()]
    table = [(k.strip(), v.strip().strip('"')) for k, _, v in (line.partition("=") for line in lines if line)]
    assert table == list(discovery.SHIPPED.items())


@pytest.mark.parametrize(("fields", "message"), [
    ({"name": "Verl"}, "name='Verl' is not allowed: a lower-case identifier"),
    ({"versions": "=>0.9"}, "versions='=>0.9' is not allowed: a PEP 440 specifier set"),
    ({"host_types": ("pkg.mod.NAME",)}, "host_types holds 'pkg.mod.NAME', which is not allowed: a reference"),
    ({"host_types": "pkg.mod:NAME"}, "host_types='pkg.mod:NAME' is not allowed: a tuple of strings"),
    ({"without_host": ("hosts",)}, "without_host=['hosts'] is not allowed: names of parts"),
    ({"profiles": "my pkg"}, "'my pkg' is not allowed as a package name"),
])
def test_a_bad_declaration_names_the_field_and_what_is_allowed(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        Integration(**{"name": "x", **fields})


def test_versions_are_a_specifier_set() -> None:
    spec = Integration(name="x", host="h", versions=">=0.9.1,<0.10")
    assert spec.supports("0.9.1") and spec.supports("0.9.5rc1") and not spec.supports("0.10.0")
    assert not spec.supports("0.8") and not spec.supports("not a version")
    assert Integration(name="y").supports("123") and Integration(name="y").parts() == ()


def test_load_registers_every_part_once_and_unload_removes_exactly_them() -> None:
    assert FULL.parts() == tuple(p for p in PARTS if p != "profiles")
    CONFIG_ADAPTERS.add(ADAPTER)  # registered by someone else already: load leaves it to them
    try:
        assert FULL.load() is True and FULL.loaded
        assert FULL.load() is False  # idempotent
        assert HOST in HOST_TYPES and NOTE in RESULT_NOTES and HOOK in WEAVE_HOOKS and CONVENTION in CONVENTIONS
        assert "test_discovery_engine" in ENVIRONMENT_PACKAGES and ("test_discovery_attribute", "skipweave") in \
            RESULT_NOTES.current()
        assert FULL in loaded_integrations()
        assert FULL.unload() is True and not FULL.loaded and FULL.unload() is False
        assert HOST not in HOST_TYPES and NOTE not in RESULT_NOTES and HOOK not in WEAVE_HOOKS
        assert CONVENTION not in CONVENTIONS
        assert "test_discovery_engine" not in ENVIRONMENT_PACKAGES
        assert ADAPTER in CONFIG_ADAPTERS  # not its to remove
    finally:
        FULL.unload()
        CONFIG_ADAPTERS.remove(ADAPTER)


def test_load_of_some_parts_and_a_second_declaration_of_one_name() -> None:
    try:
        assert FULL.load(["host_types"]) and HOST in HOST_TYPES and HOOK not in WEAVE_HOOKS
        twin = Integration(name="test_full")
        with pytest.raises(ValueError, match="another integration named 'test_full' is loaded already"):
            twin.load()
        with pytest.raises(ValueError, match="names of"):
            FULL.load(["host_type"])
    finally:
        FULL.unload()


def test_a_part_that_does_not_resolve_leaves_nothing_registered() -> None:
    broken = Integration(name="test_broken", host_types=(f"{HERE}:HOST", f"{HERE}:NO_SUCH_NAME"))
    with pytest.raises(IntegrationError, match=r"integration 'test_broken': host_types reference "
                                               r"'tests.integrations.test_discovery:NO_SUCH_NAME' does not resolve"):
        broken.load()
    assert HOST not in HOST_TYPES and not broken.loaded
    no_profiles = Integration(name="test_no_profiles", profiles="json")  # a package without a skip/ folder
    with pytest.raises(IntegrationError, match="profiles='json' names no importable package whose folder holds"):
        no_profiles.load()


def test_weave_hooks_loaded_or_unloaded_while_a_plan_is_woven_follow_it(tmp_path: Path) -> None:
    import skipweave

    HOOK.seen.clear()
    skipweave.weave({"skip": {"rollout": {"enable": True, "dump_dir": str(tmp_path), "step": "counter",
                                          "targets": {"gen": {"path": "json:dumps", "optional": True}}}}})
    hook_only = Integration(name="test_hook", weave_hooks=(f"{HERE}:HOOK",))
    try:
        hook_only.load()
        assert HOOK.seen == [("weave", ["rollout"])]
        hook_only.unload()
        assert HOOK.seen == [("weave", ["rollout"]), ("unweave",)]
    finally:
        hook_only.unload()
        skipweave.unweave()


# ------------------------------------------------------------------------------------------- discovery

def decisions_for(monkeypatch: pytest.MonkeyPatch, points: list[metadata.EntryPoint],
                  env: dict[str, str] | None = None) -> dict[str, discovery.Decision]:
    monkeypatch.setattr(discovery, "entry_points", lambda: [(ep, "the tests") for ep in points])
    return {d.name: d for d in discovery.decide(env or {})}


IN_RANGE = Integration(name="inrange", host="packaging", versions=">=22", host_types=(f"{HERE}:HOST",))
OUT = Integration(name="out", host="packaging", versions=">=999", host_types=(f"{HERE}:HOST",))
ABSENT = Integration(name="absent", host="skipweave-no-such-distribution", host_types=(f"{HERE}:HOST",),
                     result_notes=(f"{HERE}:NOTE",), without_host=("result_notes",))
ABSENT_ALL = Integration(name="absentall", host="skipweave-no-such-distribution", host_types=(f"{HERE}:HOST",))
NO_HOST_PACKAGE = Integration(name="nohostpackage", result_notes=(f"{HERE}:NOTE",))
MISNAMED = Integration(name="othername")
NOT_AN_INTEGRATION = object()
WITH_PROFILES = Integration(name="withprofiles", profiles="test_discovery_profiles")  # the package: made by the test


def test_discovery_decides_each_integration(monkeypatch: pytest.MonkeyPatch) -> None:
    points = [entry(n, f"{HERE}:{v}") for n, v in (
        ("inrange", "IN_RANGE"), ("out", "OUT"), ("absent", "ABSENT"), ("absentall", "ABSENT_ALL"),
        ("nohostpackage", "NO_HOST_PACKAGE"), ("misnamed", "MISNAMED"), ("notone", "NOT_AN_INTEGRATION"))]
    points.append(entry("missing", "skipweave_no_such_module:INTEGRATION"))
    got = decisions_for(monkeypatch, points)
    version = metadata.version("packaging")
    assert (got["inrange"].status, got["inrange"].parts, got["inrange"].host_version) == (
        discovery.ON, ("host_types",), version)
    assert got["out"].status == discovery.OUT_OF_RANGE and got["out"].parts == ()
    assert got["out"].reason == (f"packaging {version} is installed and the integration supports packaging >=999; it "
                                 "stays off (set SKIPWEAVE_FORCE_INTEGRATIONS=out to load it all the same)")
    assert (got["absent"].status, got["absent"].parts) == (discovery.PARTIAL, ("result_notes",))
    assert (got["absentall"].status, got["absentall"].parts) == (discovery.NO_HOST, ())
    assert (got["nohostpackage"].status, got["nohostpackage"].parts) == (discovery.ON, ("result_notes",))
    assert got["misnamed"].status == discovery.BROKEN and "names the integration 'othername'" in got["misnamed"].reason
    assert got["notone"].status == discovery.BROKEN and "names a object, not a skipweave Integration" in \
        got["notone"].reason
    assert got["missing"].status == discovery.BROKEN and "fails to load (ModuleNotFoundError" in got["missing"].reason


def test_a_declaration_that_exits_is_broken_not_the_end_of_the_process(monkeypatch: pytest.MonkeyPatch,
                                                                        tmp_path: Path) -> None:
    """``sys.exit()`` in a third party's declaration module raises SystemExit, no Exception: it is judged broken like
    any other failing declaration, and the process (a run, the CLI, a Hydra app) goes on."""
    (tmp_path / "skipweave_exiting_decl.py").write_text("import sys\nsys.exit('declaration exits')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    got = decisions_for(monkeypatch, [entry("exits", "skipweave_exiting_decl:INTEGRATION"),
                                      entry("inrange", f"{HERE}:IN_RANGE")])
    assert got["exits"].status == discovery.BROKEN and "SystemExit: declaration exits" in got["exits"].reason
    assert got["inrange"].status == discovery.ON


def test_the_switches_turn_off_and_force(monkeypatch: pytest.MonkeyPatch) -> None:
    points = [entry("inrange", f"{HERE}:IN_RANGE"), entry("out", f"{HERE}:OUT"),
              entry("missing", "skipweave_no_such_module:INTEGRATION")]
    got = decisions_for(monkeypatch, points, {"SKIPWEAVE_DISABLED_INTEGRATIONS": " InRange , missing",
                                              "SKIPWEAVE_FORCE_INTEGRATIONS": "out,inrange"})
    assert (got["inrange"].status, got["inrange"].parts) == (discovery.DISABLED, ())  # disabled wins over forced
    assert got["inrange"].integration is IN_RANGE  # (its declaration names its profiles, for the messages)
    assert got["missing"].status == discovery.DISABLED and got["missing"].integration is None  # broken, yet quiet
    assert (got["out"].status, got["out"].parts) == (discovery.FORCED, ("host_types",))
    assert "loaded all the same, as SKIPWEAVE_FORCE_INTEGRATIONS names it" in got["out"].reason


def hide_verl(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the installed metadata say verl is not installed (every other distribution as it is)."""
    real = metadata.version

    def version(name: str) -> str:
        if name == "verl":
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(metadata, "version", version)


def test_verl_without_verl_installed_keeps_what_works_on_the_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny_grpo example, the fixture store's host and the tests' verl-shaped batches run with no verl installed:
    verl's DataProto host type, convention, meta_info note, config adapters and engine packages load; the SkipManager
    hand-over (a weave hook) waits for verl."""
    hide_verl(monkeypatch)
    got = decisions_for(monkeypatch, [entry("verl", discovery.SHIPPED["verl"])])["verl"]
    assert got.status == discovery.PARTIAL
    assert got.parts == ("host_types", "config_adapters", "conventions", "result_notes", "environment")


def test_load_integrations_applies_the_decisions_once(
    fresh_session: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch = fresh_session
    points = [entry("inrange", f"{HERE}:IN_RANGE"), entry("out", f"{HERE}:OUT"),
              entry("absent", f"{HERE}:ABSENT"), entry("misnamed", f"{HERE}:MISNAMED")]
    monkeypatch.setattr(discovery, "entry_points", lambda: [(ep, "the tests") for ep in points])
    env = {"SKIPWEAVE_DISABLED_INTEGRATIONS": "nosuch"}
    with caplog.at_level(logging.DEBUG, logger="skipweave"):
        first = discovery.load_integrations(env)
        assert discovery.load_integrations(env) is first and discovery.decisions() is first
    assert IN_RANGE.loaded and not OUT.loaded and ABSENT.loaded and HOST in HOST_TYPES and NOTE in RESULT_NOTES
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len([w for w in warnings if "integration 'out'" in w]) == 1, warnings
    assert any("integration 'misnamed' of the tests is not loaded" in w for w in warnings), warnings
    assert any("SKIPWEAVE_DISABLED_INTEGRATIONS names 'nosuch', which is no integration of this environment" in w
               for w in warnings), warnings
    discovery.unload_integrations()
    assert not IN_RANGE.loaded and not ABSENT.loaded and HOST not in HOST_TYPES


def test_the_environment_packages_are_the_loaded_integrations_declarations(fresh_session: pytest.MonkeyPatch) -> None:
    """weaving/environment.py names no engine: what a recording's environment lists besides torch and transformers is
    what the loaded integrations declare (``Integration.environment``), in load order, and nothing while none is."""
    assert list(ENVIRONMENT_PACKAGES) == []
    decisions = discovery.load_integrations()
    declared = [p for d in decisions if d.integration is not None and "environment" in d.parts
                for p in d.integration.environment]
    assert "vllm" in declared and list(ENVIRONMENT_PACKAGES) == list(dict.fromkeys(declared))
    # an imported engine is recorded while verl (which declares it) is loaded, and not once verl is off
    from skipweave.config import load_skip_config
    from skipweave.weaving.environment import live_environment

    role = load_skip_config({"skip": {"rollout": {"targets": {"gen": "json:dumps"}}}}).roles["rollout"]
    fresh_session.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.0.test"))
    assert live_environment(role, role.targets[0], None)["packages"]["vllm"] == "0.0.test"
    discovery.unload_integrations()
    discovery.load_integrations({"SKIPWEAVE_DISABLED_INTEGRATIONS": "verl"})
    assert "vllm" not in ENVIRONMENT_PACKAGES and "sglang" not in ENVIRONMENT_PACKAGES
    assert "vllm" not in live_environment(role, role.targets[0], None).get("packages", {})


def test_a_process_whose_parent_warned_says_it_at_debug(
    fresh_session: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch = fresh_session
    monkeypatch.setattr(discovery, "entry_points", lambda: [(entry("out", f"{HERE}:OUT"), "the tests")])
    env = {"SKIPWEAVE_WARNED_INTEGRATIONS": f"other=1.0,out={metadata.version('packaging')}"}
    with caplog.at_level(logging.DEBUG, logger="skipweave"):
        discovery.load_integrations(env)
    said = [(r.levelno, r.getMessage()) for r in caplog.records if "integration 'out'" in r.getMessage()]
    assert said and all(level == logging.DEBUG for level, _ in said), said


def test_a_broken_integration_and_a_switchs_typo_warn_once_per_run(
    fresh_session: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The first process warns and marks its environment; a process it starts (a Ray worker, the program of
    ``skipweave run``) inherits the marks and says the same at DEBUG."""
    monkeypatch = fresh_session
    monkeypatch.setattr(discovery, "entry_points", lambda: [(entry("misnamed", f"{HERE}:MISNAMED"), "the tests")])
    monkeypatch.setenv("SKIPWEAVE_DISABLED_INTEGRATIONS", "vrel")
    monkeypatch.setenv("SKIPWEAVE_WARNED_INTEGRATIONS", "")  # restored after the test, marks and all
    for warned in (True, False):
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="skipweave"):
            discovery.load_integrations()
        said = {(r.levelno, r.getMessage().split(":")[1].strip()) for r in caplog.records
                if "misnamed" in r.getMessage() or "'vrel'" in r.getMessage()}
        level = logging.WARNING if warned else logging.DEBUG
        assert said == {(level, "integration 'misnamed' of the tests is not loaded"),
                        (level, "SKIPWEAVE_DISABLED_INTEGRATIONS names 'vrel', which is no integration of this "
                                "environment (there are")}, said
        discovery.unload_integrations()
    assert os.environ["SKIPWEAVE_WARNED_INTEGRATIONS"] == "misnamed=broken,SKIPWEAVE_DISABLED_INTEGRATIONS=vrel"


def test_an_off_integrations_profiles_are_named_as_off(fresh_session: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch = fresh_session
    from skipweave.config.errors import ConfigError
    from skipweave.config.profiles import resolve_profile

    package = tmp_path / "test_discovery_profiles"
    (package / "skip").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "skip" / "test_discovery_cache.yaml").write_text("skip: {}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(discovery, "entry_points",
                        lambda: [(entry("withprofiles", f"{HERE}:WITH_PROFILES"), "the tests")])
    discovery.load_integrations({})
    assert resolve_profile("test_discovery_cache").origin == "integration withprofiles"
    assert discovery.profile_dirs() == [("withprofiles", str(package))]
    discovery.unload_integrations()
    discovery.load_integrations({"SKIPWEAVE_DISABLED_INTEGRATIONS": "withprofiles"})
    assert discovery.profile_dirs() == []
    with pytest.raises(ConfigError, match="'test_discovery_cache' is a profile of integration 'withprofiles', which "
                                          "is off in this process: SKIPWEAVE_DISABLED_INTEGRATIONS names it"):
        resolve_profile("test_discovery_cache")
    discovery.unload_integrations()
    assert not [s for s in PROFILE_SOURCES if s.integration == "withprofiles"]



def test_without_verl_installed_a_verl_shaped_trainer_still_records_and_replays(
    fresh_session: pytest.MonkeyPatch, host_module: Any, tmp_path: Path
) -> None:
    """As the tiny_grpo example does where verl is not installed: the DataProto shape is stored as such and every
    result carries meta_info["skipweave"]; verl's SkipManager hand-over is not loaded (nothing of verl to hand over)."""
    import skipweave
    from skipweave.integrations.verl.coexist import COEXISTENCE
    from skipweave.integrations.verl.config import LEGACY_KEYS
    from skipweave.integrations.verl.hosts import DATAPROTO

    hide_verl(fresh_session)
    verl = {d.name: d for d in discovery.load_integrations()}["verl"]
    assert verl.status == discovery.PARTIAL
    assert DATAPROTO in HOST_TYPES and LEGACY_KEYS in CONFIG_ADAPTERS and COEXISTENCE not in WEAVE_HOOKS
    assert ("meta_info", "skipweave") in RESULT_NOTES.current() and "vllm" in ENVIRONMENT_PACKAGES

    name, _ = host_module('''
        import torch

        class Batch:
            def __init__(self, step):
                self.batch = {"x": torch.arange(3) * step}
                self.non_tensor_batch = {}
                self.meta_info = {"global_steps": step}

        CALLS = []

        def generate(batch):
            CALLS.append(batch.meta_info["global_steps"])
            return Batch(batch.meta_info["global_steps"] + 100)
    ''')
    import importlib

    host = importlib.import_module(name)
    # (the step: the default, meta_info["global_steps"] of the batch argument)
    plan = {"skip": {"rollout": {"enable": True, "dump_dir": str(tmp_path), "action": "cache",
                                 "targets": {"gen": f"{name}:generate"}}}}
    for _ in range(2):  # record, then replay
        skipweave.weave(plan)
        out = [host.generate(host.Batch(step)) for step in (1, 2)]
        skipweave.flush()
        skipweave.unweave()
    assert host.CALLS == [1, 2], "the second run generated again"
    assert [o.meta_info["skipweave"]["status"] for o in out] == ["hit", "hit"]
    assert type(out[0]) is host.Batch and out[1].batch["x"].tolist() == [0, 102, 204]
    trees = "".join(p.read_text() for p in tmp_path.rglob("*.tree.json"))
    assert '"t":"dataproto"' in trees.replace(" ", "")
