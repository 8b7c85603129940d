"""Time-to-return of a recorded call: how long the host waits for a recording, beside a raw write+fsync.

    python -m bench.returns --mb 250 --rounds 3 --dir /tmp/x

Prints one JSON line. A woven function returns a verl-sized batch (``bench.payload``) built beforehand, so the
host's own work is nil and what the call costs is skipweave's. Per round, back to back:

* ``raw``: the bytes skipweave writes (``bench.io_cases.raw_buffers``) written to one file and fsynced, the
  floor of a recording that blocks;
* ``behind``: the call with the default ``write_buffer`` (the result is encoded and copied, the background
  writer commits it), as the first recording of a process (its copy into fresh memory): seconds until the call
  returned, then seconds until ``skipweave.flush()`` returned (the writing the host did not wait for), and the
  peak memory above the batch while it ran;
* ``behind_warm``: the same call once more, right after (a training's next step): its copy goes into the buffers
  the first one's writer handed back (``skipweave.store.buffers``); ``kept_bytes``: what the pool keeps then;
* ``through``: the call with ``write_buffer: 0`` (the record commits before the call returns).
"""

from __future__ import annotations

import gc
import logging
import os
import shutil
import time
from typing import Any

from bench.common import peak_bytes, reset_peak, rss_bytes, sized_main, write_host
from bench.io_cases import raw_buffers, raw_write
from bench.payload import make_batch, sequences_for

HOST = '''
BATCH = None


def generate(step):
    return BATCH
'''


def measure(mb: float, rounds: int, folder: str) -> dict[str, Any]:
    """Run every case ``rounds`` times; ``{case: {"seconds": [...], ...}}`` plus the batch's size."""
    import skipweave
    from skipweave.store.buffers import POOL

    logging.getLogger("skipweave").setLevel(logging.WARNING)
    name = "skipweave_bench_returns_host"
    work, host = write_host("skipweave-bench-returns-", name, HOST)
    batch = make_batch(sequences_for(mb))
    host.BATCH = batch
    buffers = raw_buffers(batch)
    nbytes = sum(len(b) for b in buffers)
    out: dict[str, dict[str, list[float]]] = {
        "raw": {"seconds": []},
        "behind": {"seconds": [], "flush_s": [], "peak_extra": []},
        "behind_warm": {"seconds": [], "kept_bytes": []},
        "through": {"seconds": []},
    }
    try:
        for r in range(rounds):
            raw_path = os.path.join(folder, f"raw{r}.bin")
            gc.collect()
            t0 = time.perf_counter()
            raw_write(raw_path, buffers)
            out["raw"]["seconds"].append(time.perf_counter() - t0)
            os.unlink(raw_path)
            for case, buffer in (("behind", None), ("through", 0)):
                dump = os.path.join(folder, f"{case}{r}")
                role: dict[str, Any] = {"enable": True, "dump_dir": dump, "step": {"source": "arg", "arg": 0,
                                                                                  "path": ""},
                                        "restore_rng": False, "targets": {"g": f"{name}:generate"}}
                if buffer is not None:
                    role["write_buffer"] = buffer
                skipweave.weave({"skip": {"rollout": role}})
                POOL.clear()  # each round's first recording copies into fresh memory, as a process's first does
                gc.collect()
                base = rss_bytes()
                reset_peak()
                t0 = time.perf_counter()
                host.generate(1)
                out[case]["seconds"].append(time.perf_counter() - t0)
                t1 = time.perf_counter()
                skipweave.flush()
                if case == "behind":
                    out[case]["flush_s"].append(time.perf_counter() - t1)
                    out[case]["peak_extra"].append(float(max(0, peak_bytes() - base)))
                    t0 = time.perf_counter()
                    host.generate(2)
                    out["behind_warm"]["seconds"].append(time.perf_counter() - t0)
                    skipweave.flush()
                    out["behind_warm"]["kept_bytes"].append(float(POOL.kept_bytes))
                skipweave.unweave()
                assert skipweave.counters()["record_failures"] == 0
                shutil.rmtree(dump, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    from skipweave.store.buffers import POOL_IDLE_S

    return {"cases": out, "bytes": nbytes, "mb": mb, "rounds": rounds, "pool_idle_s": POOL_IDLE_S}


if __name__ == "__main__":
    sized_main(__doc__, measure, mb=250.0)
