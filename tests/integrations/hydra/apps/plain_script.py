"""A program without Hydra, for ``skipweave run``: ``python plain_script.py STEPS``."""

import os
import sys

import worker
from report import report

if __name__ == "__main__":
    print("TASK STARTED", flush=True)
    gen = worker.Generator()
    report(
        [gen.generate(worker.Batch(step)) for step in range(1, int(sys.argv[1]) + 1)],
        argv=sys.argv[1:],
        user_sitecustomize=os.environ.get("USER_SITECUSTOMIZE_RAN"),
    )
