"""A Ray job on a two-node cluster whose second node sees another folder at the same dump dir path.

Usage: ``python shared_path_driver.py BASE OUT_JSON`` (run with the working folder ``BASE/head``)

A multi-node job with a node-local ``dump_dir`` (verl's ``~/.verl/rollout_dump``, ``/tmp/...``) has one path that
names a different disk on every node. This machine has one disk, so the driver makes one path name two folders the
way node-local disks do: a dump dir under ``/proc/self/cwd/`` is resolved by each process against its own working
folder, which a Ray worker takes from its node's raylet. The head node (and this driver) work in ``BASE/head``, the
second node's raylet is started from ``BASE/node2``: one ``dump_dir`` string, two folders.

``ray.cluster_utils.Cluster`` starts a head with one CPU and the resource ``head``, and a second node with one CPU
and the resource ``node2``. The job pins one ``sharedpath_app.Caller`` actor (with a ``RANK`` of its own) to each
node; each calls the target of each of three roles at steps 1 and 2:

- ``local``: dump_dir ``/proc/self/cwd/dump``, defaults;
- ``required``: dump_dir ``/proc/self/cwd/dump_strict`` with ``require_shared: true``;
- ``shared``: dump_dir ``BASE/shared``, one folder for every node.

OUT_JSON gets, per actor: its node id, pid and working folder, each call's result or error (its type, whether it
is a ``skipweave.DumpDirNotShared``, its message), and the WARNING lines skipweave logged in its worker; the marker
files of real calls; the driver's node id and run id; timings.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

ROLES = ("local", "required", "shared")
STEPS = (1, 2)


def plan(base: str) -> dict[str, Any]:
    dump_dirs = {"local": "/proc/self/cwd/dump", "required": "/proc/self/cwd/dump_strict",
                 "shared": os.path.join(base, "shared")}
    return {"skip": {role: {"enable": True, "action": "cache", "dump_dir": dump_dirs[role],
                            "require_shared": role == "required", "targets": {"gen": f"sharedpath_app:generate_{role}"}}
                     for role in ROLES}}


def main() -> None:
    base, out_path = sys.argv[1:3]
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    t0 = time.perf_counter()
    import ray
    import sharedpath_app
    from ray.cluster_utils import Cluster

    import skipweave

    head_dir, node2_dir = os.path.join(base, "head"), os.path.join(base, "node2")
    assert os.getcwd() == head_dir, os.getcwd()
    skipweave.weave(plan(base))  # before ray.init
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": 1, "resources": {"head": 4}, "include_dashboard": False})
    os.chdir(node2_dir)  # the second node's raylet, and so its workers, work in BASE/node2
    try:
        second = cluster.add_node(num_cpus=1, resources={"node2": 4})
    finally:
        os.chdir(head_dir)
    cluster.wait_for_nodes()
    report: dict[str, Any] = {"nodes": {"head": cluster.head_node.node_id, "node2": second.node_id},
                              "seconds": {"cluster": time.perf_counter() - t0}}
    marker_dir = os.path.join(base, "markers")
    try:
        ray.init(address=cluster.address, logging_level=logging.WARNING,
                 runtime_env={"env_vars": {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}})
        caller = ray.remote(sharedpath_app.Caller)
        actors = {name: caller.options(num_cpus=0, resources={name: 1},  # a RANK each: a shard each
                                       runtime_env={"env_vars": {"RANK": str(rank)}}).remote(name, marker_dir)
                  for rank, name in enumerate(("head", "node2"))}
        for name, actor in actors.items():
            calls: dict[str, list[dict[str, Any]]] = {role: [] for role in ROLES}
            for role in ROLES:
                for step in STEPS:
                    try:
                        calls[role].append({"result": ray.get(actor.call.remote(role, step), timeout=120)})
                    except Exception as exc:  # noqa: BLE001 - what the host's ray.get raises is the finding
                        calls[role].append({"error": type(exc).__name__, "message": str(exc),
                                            "not_shared": isinstance(exc, skipweave.DumpDirNotShared)})
            report[name] = {"calls": calls, **ray.get(actor.where.remote(), timeout=120)}
        report["markers"] = sorted(os.listdir(marker_dir))
        report["driver"] = {"node": ray.get_runtime_context().get_node_id(), "run": os.environ.get("SKIPWEAVE_RUN")}
        report["seconds"]["job"] = time.perf_counter() - t0 - report["seconds"]["cluster"]
    finally:
        ray.shutdown()
        cluster.shutdown()
    report["seconds"]["total"] = time.perf_counter() - t0
    with open(out_path, "w") as fh:
        json.dump(report, fh, indent=1)


if __name__ == "__main__":
    main()
