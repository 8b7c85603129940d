"""A Hydra app whose primary config is a dataclass schema (no ``skip`` key can be added to it)."""

from dataclasses import dataclass

import hydra
import worker
from hydra.core.config_store import ConfigStore
from report import report


@dataclass
class Config:
    steps: int = 3


ConfigStore.instance().store(name="schema_config", node=Config)


@hydra.main(config_path=None, config_name="schema_config", version_base=None)
def main(cfg: Config) -> None:
    print("TASK STARTED", flush=True)
    gen = worker.Generator()
    report([gen.generate(worker.Batch(step)) for step in range(1, cfg.steps + 1)])


if __name__ == "__main__":
    main()
