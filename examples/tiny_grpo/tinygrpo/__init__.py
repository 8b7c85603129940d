"""tinygrpo: a deliberately small, verl-shaped GRPO trainer used as skipweave's example job.

The package knows nothing about skipweave. It mimics the structure of an RL-for-LLM trainer:
a driver-side policy trained with a clipped policy-gradient loss, a ``RolloutManager`` whose
``async generate_sequences`` dispatches chunks of a DataProto-like :class:`~tinygrpo.data.Batch`
to Ray rollout workers, a rule reward and group-relative advantages.
"""

__all__ = ["data", "model", "reward", "rollout", "trainer"]
