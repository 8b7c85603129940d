"""Many Ray actors writing one shard, on the second node of a two-node cluster; one run records, the next replays.

Usage: ``python many_writers_driver.py {record|replay} DUMP_DIR COUNT_DIR OUT_JSON``

The driver weaves before ``ray.init`` and starts a two-node cluster on this machine with
``ray.cluster_utils.Cluster``: a head node and a second node with the custom resource ``node2``. It joins
the cluster with ``ray.init(address=...)`` and pins eight actors to the second node:

- four ``rayapp.writers.NoRank`` actors (``Plain`` with a ``where`` method; ``generate`` is
  ``Plain.generate`` itself) without ``RANK``: all four write shard ``r0`` of the target ``norank``;
- four ``rayapp.writers.Ranked`` actors with ``RANK=i``: each writes its own shard ``r<i>`` of the target
  ``rank``.

The two groups are one role (namespace ``many``) with two targets, ``norank`` =
``rayapp.workers:Plain.generate`` and ``rank`` = ``rayapp.writers:Ranked.generate`` (``Ranked`` defines its
own ``generate``). Two targets rather than two roles because two roles cannot weave one method; and the groups
must be separate stores, or the ``RANK=0`` actor would share shard ``r0`` with the actors that have no
``RANK``. At steps 1 and 2 every actor is called at once, each with inputs of its own (prompt
``<name>-<step>``). OUT_JSON gets the results (tensors as lists), each actor's node, pid and run id, the
node ids of the cluster and the skipweave counters of each actor. Real calls leave marker files in
COUNT_DIR, which the test counts.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

NORANK = tuple(f"nr{i}" for i in range(4))
RANKED = tuple(f"rk{i}" for i in range(4))
STEPS = (1, 2)


def plan(dump_dir: str) -> dict[str, Any]:
    """One role, two targets: one per group of actors."""
    return {"skip": {"rollout": {
        "enable": True,
        "action": "cache",
        "dump_dir": dump_dir,
        "namespace": "many",
        "targets": {
            "norank": "rayapp.workers:Plain.generate",
            "rank": "rayapp.writers:Ranked.generate",
        },
    }}}


def jsonable(value: Any) -> Any:
    """Tensors to lists, recursively."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if hasattr(value, "tolist"):
        return value.tolist()
    return value


def main() -> None:
    phase, dump_dir, count_dir, out_path = sys.argv[1:5]
    assert phase in ("record", "replay"), phase
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("ray").setLevel(logging.WARNING)
    t0 = time.perf_counter()
    import skipweave

    skipweave.weave(plan(dump_dir))  # before ray.init (and before the cluster starts)
    import ray
    import rayapp.writers as writers
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    second = cluster.add_node(num_cpus=2, resources={"node2": 8})  # 2 CPUs: Ray starts 2 workers at a time
    cluster.wait_for_nodes()
    nodes = {"head": cluster.head_node.node_id, "second": second.node_id}
    t_cluster = time.perf_counter()
    worker_path = os.environ.get("PYTHONPATH", "")
    try:
        ray.init(address=cluster.address, logging_level=logging.WARNING,
                 runtime_env={"env_vars": {"PYTHONPATH": worker_path}})
        t_init = time.perf_counter()
        pin = {"num_cpus": 0, "resources": {"node2": 1}}
        actors: dict[str, Any] = {}
        for name in NORANK:
            actors[name] = ray.remote(writers.NoRank).options(**pin).remote(name, count_dir)
        for i, name in enumerate(RANKED):
            actors[name] = ray.remote(writers.Ranked).options(
                runtime_env={"env_vars": {"RANK": str(i)}}, **pin
            ).remote(name, count_dir)
        where = dict(zip(actors, ray.get([a.where.remote() for a in actors.values()]), strict=True))
        t_actors = time.perf_counter()
        results: dict[str, list[Any]] = {name: [] for name in actors}
        for step in STEPS:
            refs = {name: a.generate.remote({"meta_info": {"global_steps": step}, "prompt": f"{name}-{step}"})
                    for name, a in actors.items()}  # all submitted before any is awaited: the calls overlap
            for name, value in zip(refs, ray.get(list(refs.values())), strict=True):
                results[name].append(jsonable(value))
        stats = dict(zip(actors, ray.get([a.stats.remote() for a in actors.values()]), strict=True))
        t_calls = time.perf_counter()
        driver = {"node": ray.get_runtime_context().get_node_id(), "run": os.environ.get("SKIPWEAVE_RUN")}
    finally:
        ray.shutdown()
        t_shutdown = time.perf_counter()
        cluster.shutdown()
    report = {
        "results": results, "where": where, "stats": stats, "driver": driver,
        "nodes": nodes,
        "seconds": {"cluster": t_cluster - t0, "init": t_init - t_cluster, "actors": t_actors - t_init,
                    "calls": t_calls - t_actors,
                    "shutdown": time.perf_counter() - t_shutdown, "total": time.perf_counter() - t0},
    }
    with open(out_path, "w") as fh:
        json.dump(report, fh, indent=1)


if __name__ == "__main__":
    main()
