"""The host's "rollout" for the test apps: counts the calls that really run (replays do not)."""

import os

REAL_CALLS: list[int] = []


class Batch:
    """verl-shaped input: the step sits in ``meta_info["global_steps"]`` (skipweave's default step source)."""

    def __init__(self, step: int) -> None:
        self.meta_info = {"global_steps": step}


class Generator:
    def generate(self, batch: Batch) -> dict:
        step = batch.meta_info["global_steps"]
        REAL_CALLS.append(step)
        return {"step": step, "pid": os.getpid(), "tokens": [step * 10 + i for i in range(3)]}
