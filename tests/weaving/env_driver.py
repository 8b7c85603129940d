"""Record or replay three steps of ``envhost.rollout:Rollout.generate`` (tests/weaving/test_env_fingerprint.py).

``python env_driver.py DUMP ON_ENV_MISMATCH TEMPERATURE [TORCH_VERSION]``, with the host package ``envhost`` (and any
stand-in engine modules named in ``$IMPORT``, comma-separated) on ``PYTHONPATH``. The app's whole config holds
``model.temperature``, which the role's ``fingerprint.env`` names, and the keys of the JSON mapping ``$EXTRA``, named
too (as ``model.<key>``). Prints ``REAL [steps that ran live]``, ``OUT
[results]`` and, when the replay stopped on a changed environment, ``MISMATCH <message>``.
"""

import importlib
import json
import logging
import os
import sys

logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
dump, policy, temperature = sys.argv[1], sys.argv[2], float(sys.argv[3])
for name in filter(None, os.environ.get("IMPORT", "").split(",")):
    importlib.import_module(name)  # the stand-in engines a real host would have imported by its first rollout
if len(sys.argv) > 4:
    import torch

    torch.__version__ = sys.argv[4]  # as another torch build would say (read from sys.modules, as the host's is)

from envhost.rollout import REAL, Batch, Rollout  # noqa: E402

import skipweave  # noqa: E402

extra = json.loads(os.environ.get("EXTRA", "{}"))
skipweave.weave({
    "model": {"temperature": temperature, "path": "/models/a", **extra},
    "skip": {"rollout": {"enable": True, "dump_dir": dump, "targets": {"gen": "envhost.rollout:Rollout.generate"},
                         "fingerprint": {"env": ["model.temperature", "model.path", *(f"model.{k}" for k in extra)],
                                         "on_env_mismatch": policy}}},
})
out = []
try:
    for step in (1, 2, 3):
        out.append(Rollout().generate(Batch(step)))
except skipweave.EnvironmentMismatch as exc:
    print("MISMATCH", exc)
print("REAL", json.dumps(REAL))
print("OUT", json.dumps(out))
skipweave.unweave()
