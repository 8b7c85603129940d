"""What every test app prints at the end: one ``REPORT {json}`` line the tests parse."""

import json
import sys

import worker


def report(results: list, **extra: object) -> None:
    data = {
        "real_calls": worker.REAL_CALLS,
        "results": results,
        "patched": type(worker.Generator.__dict__["generate"]).__name__ != "function",
        "loaded": sorted(m for m in ("torch", "ray", "skipweave") if m in sys.modules),
        "plugins": sorted(m for m in sys.modules if m.startswith("hydra_plugins.skipweave")),
        **extra,
    }
    print("REPORT " + json.dumps(data), flush=True)
