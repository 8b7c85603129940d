"""``python drive.py MODE FIRST LAST [DUMP_DIR]``: one process of the exit-status tests.

Modes: ``unwoven`` (no skipweave: the reference, and the program ``skipweave run`` weaves); ``weave`` (``weave()``
first); ``threads`` (``weave()``, then steps in threads still running when the main thread returns); ``fork`` and
``spawn`` (``weave()``; the parent runs the first steps, a ``multiprocessing`` child the rest); ``daemons``
(``weave()``, then daemon threads that call the target without pause until the interpreter ends them, beside the
steps).
"""

from __future__ import annotations

import atexit
import multiprocessing
import sys

import dapo_host


def weave(dump_dir: str) -> None:
    import skipweave

    skipweave.weave({"skip": {"rollout": {"enable": True, "dump_dir": dump_dir, "convention": "verl",
                                          "targets": {"gen": "dapo_host:Rollout.generate_sequences"}}}})


def child(first: int, last: int, dump_dir: str, spawned: bool) -> None:
    if spawned:
        weave(dump_dir)  # a spawned child starts afresh: nothing of the parent's weave
    dapo_host.REAL.clear()  # a forked child's copy of what the parent did is the parent's to print
    dapo_host.DIGESTS.clear()
    dapo_host.train(first, last)
    dapo_host.result()


if __name__ == "__main__":
    mode, first, last = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    if mode != "unwoven":
        weave(sys.argv[4])
    if mode == "daemons":
        dapo_host.keep_generating(1000)
    if mode in ("unwoven", "weave", "daemons"):
        dapo_host.train(first, last)
        dapo_host.result()
    elif mode == "threads":
        atexit.register(dapo_host.result)  # after the threads: Python joins them before exit handlers run
        dapo_host.train_in_threads(first, last, 3)
    else:
        middle = (first + last) // 2
        dapo_host.train(first, middle)
        dapo_host.result()
        proc = multiprocessing.get_context(mode).Process(target=child,
                                                         args=(middle + 1, last, sys.argv[4], mode == "spawn"))
        proc.start()
        proc.join()
        sys.exit(proc.exitcode)
