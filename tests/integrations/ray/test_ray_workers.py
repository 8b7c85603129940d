"""Ray worker propagation (issue 4).

The first group starts a real local Ray (``num_cpus=2``) twice, in two separate driver processes
(``apps/driver.py``): run 1 records, run 2 replays from the same dump dir. Each run covers every
kind of Ray worker; a real call leaves a marker file, so run 2 must leave none. The second group
checks the driver-side pieces without starting Ray.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import pickle
import subprocess
import sys
import textwrap
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import wrapt

import skipweave
from skipweave.env import APP_HOOK_ENV, APP_HOOK_PICKLE_ENV, PLAN_ENV
from skipweave.integrations.ray import driver
from skipweave.integrations.ray.driver import SETUP_HOOK, merge_runtime_env, runtime_env_hook

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

APPS = Path(__file__).resolve().parent / "apps"
KINDS = ("plain0", "plain1", "decorated", "async", "main", "task")
ACTORS = ("plain0", "plain1", "decorated", "async", "main")
log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------- real Ray


def _run_driver(phase: str, base: Path) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(APPS), env.get("PYTHONPATH", "")) if p)
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    out = base / f"{phase}.json"
    before = set(os.listdir(base / "count"))
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(APPS / "driver.py"), phase, str(base / "dump"), str(base / "count"), str(out),
         str(base / "wd")],
        cwd=str(base), env=env, capture_output=True, text=True, timeout=280,
    )
    assert proc.returncode == 0, f"{phase} driver failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    report: dict[str, Any] = json.loads(out.read_text())
    report["live_calls"] = sorted(set(os.listdir(base / "count")) - before)
    report["wall_seconds"] = time.perf_counter() - t0
    log.info("%s run: %s", phase, report["seconds"])
    return report


def record_then_replay(base: Path) -> dict[str, Any]:
    """Record in one driver process, then replay in a second one; return both reports."""
    for sub in ("dump", "count", "wd"):
        (base / sub).mkdir()
    (base / "wd" / "wd_marker.txt").write_text("wd-ok\n")
    record = _run_driver("record", base)
    replay = _run_driver("replay", base)
    return {"record": record, "replay": replay, "dump": base / "dump" / "ray" / "rollout"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """This module's :func:`record_then_replay`, once for all its tests (under the README's ``-n 2`` the other Ray
    module's chain runs on the other worker meanwhile)."""
    return record_then_replay(tmp_path_factory.mktemp(__name__.rsplit(".", 1)[1]))


def test_every_kind_of_worker_records_in_run_1(runs: dict[str, Any]) -> None:
    record = runs["record"]
    live = record["live_calls"]
    for kind in KINDS:
        assert sorted(m.split("-")[1] for m in live if m.startswith(kind + "-")) == ["s1", "s2"], kind
    for actor in ACTORS:
        counters = record["stats"][actor]["counters"]
        assert (counters["misses"], counters["hits"], counters["record_failures"]) == (2, 0, 0), actor


def test_every_kind_of_worker_replays_in_run_2_without_calling_the_real_method(runs: dict[str, Any]) -> None:
    record, replay = runs["record"], runs["replay"]
    assert replay["live_calls"] == []
    assert replay["results"] == record["results"]  # random tensors and the recording workers' pids
    for actor in ACTORS:
        counters = replay["stats"][actor]["counters"]
        assert (counters["hits"], counters["misses"]) == (2, 0), actor
        assert replay["stats"][actor]["pid"] != record["stats"][actor]["pid"]  # fresh worker processes


def test_worker_entries_land_in_one_store_one_copy_per_entry_shards_apart(runs: dict[str, Any]) -> None:
    dump: Path = runs["dump"]
    targets = {"plain": ["r0-0000", "r1-0000"], "decorated": ["r0-0000"], "async_gen": ["r0-0000"],
               "main": ["r0-0000"], "task": ["r0-0000"]}
    for step in (1, 2):
        for target, stems in targets.items():
            folder = dump / str(step) / target
            names = os.listdir(folder)
            manifests = sorted(n[: -len(".manifest.json")] for n in names if n.endswith(".manifest.json"))
            assert manifests == stems, (step, target)
            assert not [n for n in names if n.startswith(".tmp-")]
            tensors = [n for n in names if n.endswith(".safetensors")]
            assert len(tensors) == len(stems), (step, target, tensors)  # no orphaned payload copies
    # The two ranks recorded their own results, which each replays.
    plain0, plain1 = runs["record"]["results"]["plain0"], runs["record"]["results"]["plain1"]
    assert [r["rank"] for r in plain0 + plain1] == ["0", "0", "1", "1"]
    assert plain0[0]["values"] != plain1[0]["values"]
    assert "helper" not in os.listdir(dump / "1")  # the driver-only target never ran in a worker


def test_targets_called_within_an_actor_method_write_behind_and_are_committed_when_it_returns(
    runs: dict[str, Any],
) -> None:
    loop = runs["record"]["loop"]
    assert loop["thread"] == 0  # a thread the method started is outside its scope: written through
    assert all(n >= 1 for n in loop["method"]), loop  # the writer (slowed) still had them after the call
    assert all(n >= 1 for n in loop["async"]), loop  # also on an async actor's event loop
    one = ["r0-0000.manifest.json"]
    assert loop["on_disk"] == [one] * 3 and loop["async_on_disk"] == [one] * 2, loop  # before ray.shutdown
    replay = runs["replay"]["loop"]
    assert replay["thread"] == 0 and replay["method"] == [0, 0] and replay["async"] == [0, 0]  # hits
    assert not [m for m in runs["replay"]["live_calls"] if m.startswith("inner-")]


def test_the_apps_runtime_env_is_preserved_and_its_setup_hook_chained(runs: dict[str, Any]) -> None:
    common = {"APP_VAR": "kept", "has_plan": True, "working_dir_marker": "wd-ok"}
    assert runs["record"]["env"] == {**common, "APP_HOOK_RAN": "dotted"}  # hook given as a dotted path
    assert runs["replay"]["env"] == {**common, "APP_HOOK_RAN": "callable"}  # a closure defined in __main__


def test_a_failed_worker_weave_stops_the_call_with_the_worker_and_the_target(runs: dict[str, Any]) -> None:
    failure = runs["record"]["failure"]
    assert failure["raised"] and "WorkerWeaveError" in failure["raised"], failure
    assert failure["target"] == "driver_only_mod:Helper.run"
    message = failure["message"]
    for part in ("refused to run rayapp.workers:Plain.generate", "pid=", "node=", "actor=",
                 "at target 'driver_only_mod:Helper.run'", "no module named 'driver_only_mod'",
                 "mark it optional"):
        assert part in message, (part, message)
    assert failure["env"]["APP_VAR"] == "kept"  # the worker itself stayed up: only targets refuse
    assert not [m for m in runs["record"]["live_calls"] if m.startswith("bad-")]


# ------------------------------------------------------------------------------------------- no Ray start

PLAN = json.dumps({"skip": {"rollout": {"enable": True}}})


def module_hook() -> None:
    """An importable app hook (chained by its path)."""


@pytest.mark.parametrize(
    ("hook", "expect_env"),
    [
        ("app.hooks.setup", {APP_HOOK_ENV: "app.hooks.setup"}),
        (module_hook, {APP_HOOK_ENV: f"{__name__}:module_hook"}),
        (lambda: None, APP_HOOK_PICKLE_ENV),
        (None, {}),
    ],
    ids=["dotted", "importable-callable", "lambda", "none"],
)
def test_merge_keeps_the_apps_fields_and_chains_its_hook(hook: Any, expect_env: Any) -> None:
    app: dict[str, Any] = {"env_vars": {"APP_VAR": "1"}, "working_dir": "/some/dir", "pip": ["x"]}
    if hook is not None:
        app["worker_process_setup_hook"] = hook
    snapshot = repr(app)
    merged = merge_runtime_env(app, PLAN)
    assert repr(app) == snapshot  # the app's own mapping is not changed
    assert merged["working_dir"] == "/some/dir" and merged["pip"] == ["x"]
    assert merged["worker_process_setup_hook"] == SETUP_HOOK
    env = merged["env_vars"]
    assert env["APP_VAR"] == "1" and env[PLAN_ENV] == PLAN
    if isinstance(expect_env, dict):
        assert {k: env[k] for k in (APP_HOOK_ENV, APP_HOOK_PICKLE_ENV) if k in env} == expect_env
    else:
        from ray import cloudpickle

        assert callable(cloudpickle.loads(base64.b64decode(env[expect_env])))


def test_merge_twice_changes_only_the_plan_and_reads_a_job_config() -> None:
    once = merge_runtime_env({"worker_process_setup_hook": "app.hook"}, PLAN)
    twice = merge_runtime_env(once, "{}")
    assert twice["env_vars"] == {**once["env_vars"], PLAN_ENV: "{}"}
    job_config = types.SimpleNamespace(runtime_env={"env_vars": {"FROM_JOB": "1"}, "working_dir": "/w"})
    merged = merge_runtime_env(None, PLAN, job_config=job_config)
    assert merged["env_vars"]["FROM_JOB"] == "1" and merged["working_dir"] == "/w"
    with pytest.raises(TypeError, match="dotted path or a callable"):
        merge_runtime_env({"worker_process_setup_hook": 3}, PLAN)


@pytest.fixture
def fake_ray(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """A stand-in ``ray`` module recording what ``ray.init`` received."""
    fake = types.ModuleType("ray")
    fake.calls = []  # type: ignore[attr-defined]
    fake.initialized = False  # type: ignore[attr-defined]

    def init(address: str | None = None, **kwargs: Any) -> None:
        fake.calls.append((address, kwargs))  # type: ignore[attr-defined]
        fake.initialized = True  # type: ignore[attr-defined]

    fake.init = init  # type: ignore[attr-defined]
    fake.is_initialized = lambda: fake.initialized  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ray", fake)
    return fake


def _weave_host(host_module: Callable[..., tuple[str, Path]], tmp_path: Path) -> types.ModuleType:
    name, _ = host_module("def free(n):\n    return n + 1\n")
    skipweave.weave({"skip": {"rollout": {"enable": True, "dump_dir": str(tmp_path / "d"),
                                          "targets": {"free": f"{name}:free"}}}})
    return sys.modules[name]


def test_weave_wraps_ray_init_which_merges_the_plan_and_unweave_restores_it(
    fake_ray: types.ModuleType, host_module: Callable[..., tuple[str, Path]], tmp_path: Path,
) -> None:
    original = fake_ray.init
    _weave_host(host_module, tmp_path)
    assert fake_ray.init is not original and fake_ray.init.__wrapped__ is original
    fake_ray.init("ray://head:10001", runtime_env={"env_vars": {"A": "1"}})
    address, kwargs = fake_ray.calls[-1]
    assert address == "ray://head:10001"
    assert kwargs["runtime_env"]["env_vars"]["A"] == "1"
    assert json.loads(kwargs["runtime_env"]["env_vars"][PLAN_ENV]) == skipweave.woven_plan().to_config()  # type: ignore[union-attr]
    assert kwargs["runtime_env"]["worker_process_setup_hook"] == SETUP_HOOK
    assert runtime_env_hook({"env_vars": {"B": "2"}})["env_vars"][PLAN_ENV]  # type: ignore[index]
    skipweave.unweave()
    assert fake_ray.init is original
    assert runtime_env_hook({"env_vars": {}}) == {"env_vars": {}}


def test_weaving_after_ray_init_warns_how_to_weave_the_workers(
    fake_ray: types.ModuleType, host_module: Callable[..., tuple[str, Path]], tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake_ray.init()
    with caplog.at_level(logging.WARNING, logger=driver.__name__):
        _weave_host(host_module, tmp_path)
    text = caplog.text
    assert "ray.init() ran before skipweave.weave()" in text
    for hint in ("skipweave run", "+skip=", "RAY_RUNTIME_ENV_HOOK=skipweave.integrations.ray.driver"):
        assert hint in text


def test_weave_imports_no_ray_and_wraps_ray_init_at_its_first_import(tmp_path: Path) -> None:
    (tmp_path / "lazyhost.py").write_text("def free(n):\n    return n\n")
    code = textwrap.dedent(f"""
        import sys, skipweave
        skipweave.weave({{"skip": {{"rollout": {{"enable": True, "dump_dir": {str(tmp_path / 'd')!r},
                                                "targets": {{"f": "lazyhost:free"}}}}}}}})
        assert "ray" not in sys.modules, "weave imported ray"
        import ray
        assert type(ray.init).__name__ == "FunctionWrapper", type(ray.init)
        skipweave.unweave()
        assert type(ray.init).__name__ == "function", type(ray.init)
        print("ok")
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_a_woven_function_pickles_by_reference_and_other_wrappers_still_refuse(
    host_module: Callable[..., tuple[str, Path]], tmp_path: Path,
) -> None:
    from ray import cloudpickle

    host = _weave_host(host_module, tmp_path)
    assert isinstance(host.free, wrapt.FunctionWrapper)
    assert pickle.loads(pickle.dumps(host.free)) is host.free
    assert cloudpickle.loads(cloudpickle.dumps(host.free)) is host.free
    foreign = wrapt.FunctionWrapper(module_hook, lambda wrapped, _i, args, kwargs: wrapped(*args, **kwargs))
    with pytest.raises(NotImplementedError):
        pickle.dumps(foreign)
