"""A Hydra app of the exit-status tests: ``python hydra_train.py +first=1 +last=16 +skip=rollout_cache ...``."""

from typing import Any

import dapo_host
import hydra


@hydra.main(version_base=None, config_path=None)
def main(cfg: Any) -> None:
    dapo_host.train(cfg.first, cfg.last)
    dapo_host.result()


if __name__ == "__main__":
    main()
