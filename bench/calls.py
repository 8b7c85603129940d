"""Cost of one call through skipweave's proxy, beside a bare call, a ``functools.wraps`` closure and wrapt.

    python -m bench.calls [--repeats 7] [--loops 200000] [--decisions 100]

Prints one JSON line. Every fast case is timed as a tight loop of ``--loops`` calls, the cases taking turns
``--repeats`` times so that a noisy neighbour hits them all alike; the loop's own cost is in every number
and cancels in the "added" column. The decision path (a call that reaches the store) is timed as one call
per distinct step: ``--decisions`` misses that record a small result into an empty store, then as many
hits that replay it.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import shutil
import time
from collections.abc import Callable
from typing import Any

from bench.common import emit, write_host

HOST = '''
import torch


class Batch:
    """A DataProto-shaped argument: the step and the validation flag live in ``meta_info``."""

    def __init__(self, meta):
        self.meta_info = meta


def bare(batch):
    return batch


def disabled(batch):
    return batch


def not_eligible(batch):
    return batch


def validation(batch):
    return batch


def wrapped_target(batch):
    return batch


class Rollout:
    """Method targets, the shape of verl's (``AgentLoopManager.generate_sequences(self, prompts)``)."""

    def bare(self, batch):
        return batch

    def wrapped_target(self, batch):
        return batch

    def not_eligible(self, batch):
        return batch

    def validation(self, batch):
        return batch


class State:
    global_step = 5


class Model:
    training = True


class Trainer:
    """A transformers-shaped host: the step in ``self.state.global_step``, evaluation when not training.

    One method per step-source/bypass shape (each woven by its own role in ``_plan``)."""

    def __init__(self):
        self.state, self.model = State(), Model()

    def attr_step(self, batch):
        return batch

    def expr_step(self, batch):
        return batch

    def expr_bypass(self, batch):
        return batch

    def counter_step(self, batch):
        return batch

    def callable_bypass(self, batch):
        return batch

    def named_arg_step(self, batch):
        return batch


def is_validation(args, kwargs):
    return bool(args[0].meta_info.get("validate"))


SMALL = {"ids": torch.arange(256), "logp": torch.zeros(256), "text": ["a short response"] * 4}


def decide(batch):
    return SMALL
'''


SHAPES: dict[str, dict[str, Any]] = {
    "attr_step": {"step": {"source": "attr", "path": "state.global_step"}, "bypass": {"when": "never"}},
    "expr_step": {"step": {"expr": "self.state.global_step"}, "bypass": {"when": "never"}},
    "expr_bypass": {"step": {"source": "attr", "path": "state.global_step"}, "steps": "all",
                    "bypass": {"expr": "not self.model.training"}},
    "counter_step": {"step": {"source": "counter"}, "steps": [0], "bypass": {"when": "never"}},
    "callable_bypass": {"bypass": {"when": "callable", "callable": "skipweave_bench_host:is_validation"}},
    "named_arg_step": {"step": {"source": "arg", "arg": "batch"}, "bypass": {"arg": "batch"}},
}
"""Role settings per shape beside verl's (every call of each is a bypass: its step is not eligible, or it is an
evaluation call: ``model.training`` is set False for ``expr_bypass``)."""


def _loop(fn: Callable[[Any], Any], arg: Any, n: int) -> float:
    """Nanoseconds per call of ``fn(arg)`` over ``n`` calls."""
    rng = range(n)
    t0 = time.perf_counter_ns()
    for _ in rng:
        fn(arg)
    return (time.perf_counter_ns() - t0) / n


def _plan(host: str, dump: str) -> dict[str, Any]:
    # DataProto-shaped calls (meta_info.global_steps, meta_info.validate): every role follows verl's convention
    return {
        "skip": {
            # role disabled: nothing is patched, the call is the bare call
            "off": {"enable": False, "dump_dir": dump, "targets": {"t": f"{host}.disabled"}},
            # every step outside `steps`: the proxy runs, finds the step not eligible, calls through
            "late": {"enable": True, "convention": "verl", "dump_dir": dump, "steps": [1_000_000],
                     "targets": {"t": f"{host}.not_eligible", "v": f"{host}.validation",
                                 "mt": f"{host}.Rollout.not_eligible", "mv": f"{host}.Rollout.validation"}},
            # one role per step-source/bypass shape, every call a bypass (step not eligible, or evaluation)
            **{f"shape_{method}": {"enable": True, "convention": "verl", "dump_dir": dump, "steps": [1_000_000],
                                   **extra, "targets": {"t": f"{host}.Trainer.{method}"}}
               for method, extra in SHAPES.items()},
            # eligible at every step: reaches the store (record on a miss, replay on a hit)
            "rollout": {"enable": True, "convention": "verl", "dump_dir": dump, "targets": {"t": f"{host}.decide"}},
        }
    }


def _filled_store(dump: str, steps: int) -> None:
    """A store of ``steps`` recorded steps of target ``t`` (role ``rollout``), made fast: one real record,
    copied to every other step with its manifest's ``step`` rewritten (a real, valid entry each)."""
    import json

    from skipweave.store.step_store import StepStore

    store = StepStore(dump, "default", "rollout")
    store.record(store.key(1, "t", "r0", 0), {"tokens": list(range(8))}, target_path="bench", fingerprint="",
                 rng_state=None, seconds=1.0)
    store.close_all()
    first = os.path.join(dump, "default", "rollout", "1")
    manifest = os.path.join("t", "r0-0000.manifest.json")
    with open(os.path.join(first, manifest), encoding="utf-8") as fh:
        doc = json.load(fh)
    for step in range(2, steps + 1):
        folder = os.path.join(dump, "default", "rollout", str(step))
        shutil.copytree(first, folder)
        with open(os.path.join(folder, manifest), "w", encoding="utf-8") as fh:
            json.dump({**doc, "step": step}, fh)


def _repeat_hits(host: Any, name: str, dump: str, steps: int, calls: int, rounds: int) -> list[float]:
    """Nanoseconds per ``repeat`` hit (a step past the recorded ones, served by the last) with ``steps`` recorded."""
    import skipweave

    _filled_store(dump, steps)
    plan = {"skip": {"rollout": {"enable": True, "convention": "verl", "dump_dir": dump, "action": "repeat",
                                 "fingerprint": {"on_mismatch": "warn"}, "targets": {"t": f"{name}.decide"}}}}
    out = []
    batches = [host.Batch({"global_steps": steps + 1 + i}) for i in range(calls)]
    for _ in range(rounds):
        skipweave.unweave()
        skipweave.weave(plan)
        host.decide(batches[0])  # the first decision builds the index of recorded steps; the rest reuse it
        t0 = time.perf_counter_ns()
        for b in batches[1:]:
            assert host.decide(b) is not host.SMALL
        out.append((time.perf_counter_ns() - t0) / max(1, len(batches) - 1))
    skipweave.unweave()
    return out


def measure(repeats: int, loops: int, decisions: int, repeat_steps: int = 10_000) -> dict[str, Any]:
    """Run every case; returns ``{case: {"ns": [...], "note": str}}``."""
    import wrapt

    import skipweave

    logging.getLogger("skipweave").setLevel(logging.WARNING)
    name = "skipweave_bench_host"
    work, host = write_host("skipweave-bench-calls-", name, HOST)
    dump = os.path.join(work, "dump")
    skipweave.weave(_plan(name, dump))

    @functools.wraps(host.bare)
    def closure(*args: Any, **kwargs: Any) -> Any:
        return host.bare(*args, **kwargs)

    def through(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return wrapped(*args, **kwargs)

    passthrough = wrapt.FunctionWrapper(host.wrapped_target, through)
    wrapt.wrap_function_wrapper(host.Rollout, "wrapped_target", through)
    rollout = host.Rollout()
    step5, val = host.Batch({"global_steps": 5}), host.Batch({"validate": True, "global_steps": 5})
    # Methods are timed through the attribute access the host does (``self.rollout.generate(batch)``):
    # wrapt binds its wrapper on every access, which is part of what a woven method costs.
    fast: dict[str, tuple[Callable[[Any], Any], Any]] = {
        "bare": (host.bare, step5),
        "functools_wraps": (closure, step5),
        "wrapt_passthrough": (passthrough, step5),
        "role_disabled": (host.disabled, step5),
        "bypass_step_not_eligible": (host.not_eligible, step5),
        "bypass_validation": (host.validation, val),
        "method_bare": (lambda b: rollout.bare(b), step5),
        "method_wrapt_passthrough": (lambda b: rollout.wrapped_target(b), step5),
        "method_bypass_step_not_eligible": (lambda b: rollout.not_eligible(b), step5),
        "method_bypass_validation": (lambda b: rollout.validation(b), val),
    }
    trainer = host.Trainer()
    trainer.model.training = False  # evaluation: what expr_bypass bypasses
    shaped: dict[str, Callable[[Any], Any]] = {
        "attr_step": lambda b: trainer.attr_step(b),
        "expr_step": lambda b: trainer.expr_step(b),
        "expr_bypass": lambda b: trainer.expr_bypass(b),
        "counter_step": lambda b: trainer.counter_step(b),
        "callable_bypass": lambda b: trainer.callable_bypass(b),
        "named_arg_step": lambda b: trainer.named_arg_step(b),
    }
    assert set(shaped) == set(SHAPES)
    for method, fn in shaped.items():
        fast[f"method_shape_{method}"] = (fn, val if method == "callable_bypass" else step5)
    out: dict[str, list[float]] = {k: [] for k in fast}
    for fn, arg in fast.values():  # warm up
        _loop(fn, arg, max(1, loops // 10))
    for _ in range(repeats):
        for k, (fn, arg) in fast.items():
            out[k].append(_loop(fn, arg, loops))

    # decision path: a miss per distinct step (record a small result), then a hit per step (replay it)
    miss: list[float] = []
    hit: list[float] = []
    for r in range(max(1, min(repeats, 3))):
        steps = [host.Batch({"global_steps": 1 + i}) for i in range(decisions)]
        run_dump = os.path.join(work, f"dump{r}")  # a fresh store each time: its size changes the cost
        for kind, sink in (("miss", miss), ("hit", hit)):
            skipweave.unweave()  # fresh proxies: call counters start again, so the hits find the entries
            skipweave.weave(_plan(name, run_dump))
            t0 = time.perf_counter_ns()
            for b in steps:
                result = host.decide(b)
            sink.append((time.perf_counter_ns() - t0) / decisions)
            assert result is host.SMALL if kind == "miss" else result is not host.SMALL
    skipweave.unweave()
    repeat = {f"repeat_hit_{n}": _repeat_hits(host, name, os.path.join(work, f"repeat{n}"), n, decisions,
                                                max(1, min(repeats, 3)))
              for n in (10, repeat_steps)}
    counters = skipweave.counters()
    shutil.rmtree(work, ignore_errors=True)
    return {
        "cases": {**out, "decision_miss_record": miss, "decision_hit_replay": hit, **repeat},
        "repeat_steps": repeat_steps,
        "counters": counters,
        "loops": loops,
        "decisions": decisions,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--loops", type=int, default=200_000)
    parser.add_argument("--decisions", type=int, default=100)
    parser.add_argument("--repeat-steps", type=int, default=10_000,
                        help="recorded steps of the large store in the repeat-hit case (the small one has 10)")
    args = parser.parse_args()
    emit(measure(args.repeats, args.loops, args.decisions, args.repeat_steps))


if __name__ == "__main__":
    main()
