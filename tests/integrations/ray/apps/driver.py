"""A Ray driver woven before ``ray.init``: one run records, a second, separate run replays.

Usage: ``python driver.py {record|replay} DUMP_DIR COUNT_DIR OUT_JSON WORKING_DIR``

Covers every kind of Ray worker: a module class made an actor at run time (two of them, with
RANK 0 and 1), a class decorated ``@ray.remote``, a class defined in ``__main__``, an async actor
(whose target is a method of its base class) and a task from a module function. In the record run
one more actor runs without the driver-only folder on its path, so its weave fails; its calls must
raise ``WorkerWeaveError``. The app's runtime_env (env_vars, working_dir, its own setup hook) must
survive. Results go to OUT_JSON.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER_ONLY = os.path.join(HERE, "driver_only")
sys.path.insert(0, DRIVER_ONLY)  # a driver-only path hack: workers do not see this folder


class MainWorker:
    """An actor class defined in ``__main__`` (Ray ships it to workers by value)."""

    def __init__(self, name: str, count_dir: str) -> None:
        self.name, self.count_dir = name, count_dir

    def generate(self, batch: dict[str, Any]) -> dict[str, Any]:
        from rayapp.workers import mark_live_call, sample

        mark_live_call(self.count_dir, self.name, batch)
        return sample(self.name, batch)

    def stats(self) -> dict[str, Any]:
        import skipweave

        return {"counters": skipweave.counters(), "pid": os.getpid()}


def plan(dump_dir: str) -> dict[str, Any]:
    """The skip config of this app: one role, one target per kind of worker."""
    return {"skip": {"rollout": {
        "enable": True,
        "convention": "verl",  # the workers' batches carry their step in meta_info, as verl's do
        "action": "cache",
        "dump_dir": dump_dir,
        "namespace": "ray",
        "targets": {
            "plain": "rayapp.workers:Plain.generate",
            "decorated": "rayapp.workers.Decorated.generate",  # dotted: resolves through Ray's ActorClass
            "async_gen": "rayapp.workers:AsyncBase.generate",  # inherited by the actor's class
            "main": "__main__:MainWorker.generate",
            "task": "rayapp.workers:rollout_task",
            "inner": "rayapp.workers:inner_rollout",
            "helper": "driver_only_mod:Helper.run",
        },
    }}}


def jsonable(value: Any) -> Any:
    """Tensors to lists, recursively."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if hasattr(value, "tolist"):
        return value.tolist()
    return value


def on_disk(role_dir: str, steps: list[int]) -> list[list[str]]:
    """The manifests of target ``inner`` per step, right now."""
    out = []
    for step in steps:
        folder = os.path.join(role_dir, str(step), "inner")
        out.append(sorted(n for n in os.listdir(folder) if n.endswith(".manifest.json"))
                   if os.path.isdir(folder) else [])
    return out


def main() -> None:
    phase, dump_dir, count_dir, out_path, working_dir = sys.argv[1:6]
    logging.basicConfig(level=logging.WARNING)
    t0 = time.perf_counter()
    import skipweave

    skipweave.weave(plan(dump_dir))  # before ray.init, after MainWorker is defined
    import ray
    import rayapp.workers as workers

    from skipweave.integrations.ray.failures import WorkerWeaveError

    worker_path = os.environ.get("PYTHONPATH", "")
    if phase == "record":
        app_hook: Any = "rayapp.hooks.app_hook"
    else:
        label = "callable"

        def app_hook() -> None:  # a closure in __main__: Ray would pickle it; skipweave must chain it
            os.environ["APP_HOOK_RAN"] = label

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        logging_level=logging.WARNING,
        runtime_env={
            "env_vars": {"APP_VAR": "kept", "PYTHONPATH": os.pathsep.join([worker_path, DRIVER_ONLY])},
            "working_dir": working_dir,
            "worker_process_setup_hook": app_hook,
        },
    )
    t_init = time.perf_counter()
    try:
        rank = {i: {"env_vars": {"RANK": str(i)}} for i in (0, 1)}
        actors = {
            "plain0": ray.remote(workers.Plain).options(runtime_env=rank[0]).remote("plain0", count_dir),
            "plain1": ray.remote(workers.Plain).options(runtime_env=rank[1]).remote("plain1", count_dir),
            "decorated": workers.Decorated.remote("decorated", count_dir),
            "async": ray.remote(workers.AsyncWorker).remote("async", count_dir),
            "main": ray.remote(MainWorker).remote("main", count_dir),
        }
        ray.get([a.stats.remote() for a in actors.values()])
        t_actors = time.perf_counter()
        task = ray.remote(workers.rollout_task)  # the driver's woven function, pickled by reference
        results: dict[str, Any] = {name: [] for name in [*actors, "task"]}
        for step in (1, 2):
            refs = {name: a.generate.remote({"meta_info": {"global_steps": step}, "prompt": f"{name}-{step}"})
                    for name, a in actors.items()}
            task_batch = {"meta_info": {"global_steps": step}, "prompt": f"task-{step}"}
            refs["task"] = task.remote(task_batch, count_dir)
            for name, ref in refs.items():
                results[name].append(jsonable(ray.get(ref)))
        stats = {name: ray.get(a.stats.remote()) for name, a in actors.items()}
        env = ray.get(actors["plain0"].env.remote())
        t_calls = time.perf_counter()
        # Targets called within actor methods: written behind the calls, committed before the methods return.
        inner_dir = os.path.join(dump_dir, "ray", "rollout")
        loop = ray.get(actors["plain0"].loop.remote([11, 12, 13], count_dir))
        loop["on_disk"] = on_disk(inner_dir, [11, 12, 13])
        loop["async"] = ray.get(actors["async"].loop_async.remote([21, 22], count_dir))
        loop["async_on_disk"] = on_disk(inner_dir, [21, 22])

        failure: dict[str, Any] = {"raised": None}
        if phase == "record":  # a worker whose weave fails: the driver-only folder is not on its path
            bad = ray.remote(workers.Plain).options(
                runtime_env={"env_vars": {"PYTHONPATH": worker_path, "RANK": "7"}}
            ).remote("bad", count_dir)
            try:
                ray.get(bad.generate.remote({"meta_info": {"global_steps": 1}, "prompt": "bad"}))
            except WorkerWeaveError as exc:
                failure = {"raised": type(exc).__name__, "message": str(exc), "target": exc.target}
            failure["env"] = ray.get(bad.env.remote())  # the worker stays up: only targets refuse
    finally:
        ray.shutdown()
    report = {
        "results": results, "stats": stats, "env": env, "failure": failure, "loop": loop,
        "seconds": {"init": t_init - t0, "actors": t_actors - t_init, "calls": t_calls - t_actors,
                    "total": time.perf_counter() - t0},
    }
    with open(out_path, "w") as fh:
        json.dump(report, fh, indent=1)


if __name__ == "__main__":
    main()
