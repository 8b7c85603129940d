"""The example's "rollout": slow, random, and counted, like a real generation."""

import random
import time

GENERATED: list[int] = []  # steps generated for real in this process (replays do not add to it)


class Batch:
    """verl-shaped input: the step sits in ``meta_info["global_steps"]``."""

    def __init__(self, step: int, prompts: list[str]) -> None:
        self.meta_info = {"global_steps": step}
        self.prompts = prompts


class Rollout:
    def generate(self, batch: Batch) -> dict:
        GENERATED.append(batch.meta_info["global_steps"])
        time.sleep(0.2)  # a real rollout takes minutes
        return {"responses": [f"{p} -> {random.randint(0, 999)}" for p in batch.prompts]}
