"""Entry point of the tiny GRPO example: ``python examples/tiny_grpo/train.py [hydra overrides]``."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))  # makes the `tinygrpo` package importable

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from omegaconf import DictConfig  # noqa: E402
from tinygrpo import cluster  # noqa: E402
from tinygrpo.trainer import GRPOTrainer, seed_everything  # noqa: E402


def worker_pythonpath() -> str:
    """PYTHONPATH for Ray workers: this folder first, then whatever the driver already had."""
    existing = os.environ.get("PYTHONPATH", "")
    return os.pathsep.join(p for p in (str(HERE), existing) if p)


@hydra.main(config_path=".", config_name="config", version_base=None)
def main(cfg: DictConfig) -> None:
    """Train (Ray is started by the first worker group built, see ``tinygrpo.cluster``), then shut Ray down."""
    output_dir = Path(HydraConfig.get().runtime.output_dir)
    seed_everything(int(cfg.seed), int(cfg.trainer.torch_threads))
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    cluster.configure(
        num_cpus=int(cfg.ray.num_cpus),
        include_dashboard=False,
        logging_level=logging.WARNING,
        runtime_env={"env_vars": {"PYTHONPATH": worker_pythonpath()}},
    )
    try:
        trainer = GRPOTrainer(cfg, output_dir)
        try:
            trainer.fit()
        finally:
            trainer.close()
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    main()
