"""A Ray driver whose rollouts run in an actor: ``record`` records them, ``verify`` compares a changed actor's
rollouts with the recording (``on_diverge`` warn or error), each phase its own driver process and Ray.

Usage: ``python verify_driver.py {record|verify|verify_error} DUMP_DIR REPORT OUT_JSON``
"""

from __future__ import annotations

import json
import sys
from typing import Any


def plan(phase: str, dump_dir: str, report: str) -> dict[str, Any]:
    role: dict[str, Any] = {"enable": True, "dump_dir": dump_dir, "step": {"expr": "step"},
                            "targets": {"sampler": "rayapp.verifying:Sampler.generate"},
                            "action": "cache" if phase == "record" else "verify"}
    if phase != "record":
        role.update(report=report, on_diverge="error" if phase == "verify_error" else "warn")
    return {"skip": {"rollout": role}}


def main() -> None:
    phase, dump_dir, report, out = sys.argv[1:5]
    import ray

    import skipweave

    skipweave.weave(plan(phase, dump_dir, report))  # before ray.init: the workers get the plan
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=True)
    from rayapp.verifying import Sampler

    actor = ray.remote(Sampler).remote(0 if phase == "record" else 2)
    result: dict[str, Any] = {"worker_pid": ray.get(actor.pid.remote()), "errors": []}
    for step in (1, 2, 3):
        try:
            ray.get(actor.generate.remote(step))
        except Exception as exc:  # noqa: BLE001 - what the host sees of a Diverged raised in the worker
            result["errors"].append({"step": step, "type": type(exc).__name__, "message": str(exc),
                                     "cause": type(getattr(exc, "cause", None)).__name__})
            break
    ray.shutdown()
    with open(out, "w") as fh:
        json.dump(result, fh)


if __name__ == "__main__":
    main()
