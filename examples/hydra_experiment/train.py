"""A tiny Hydra "trainer" that knows nothing of skipweave.

python train.py                              # every rollout generated live
python train.py +experiment=cached_rollout   # steps 1-2 recorded once, then replayed
"""

import time

import hydra
import rollout
from omegaconf import DictConfig


@hydra.main(config_path="conf", config_name="config", version_base=None)
def main(cfg: DictConfig) -> None:
    gen = rollout.Rollout()
    for step in range(1, cfg.trainer.total_steps + 1):
        start = time.perf_counter()
        out = gen.generate(rollout.Batch(step, [f"prompt{step}.{i}" for i in range(cfg.data.batch_size)]))
        print(
            f"step {step}: rollout {time.perf_counter() - start:.2f} s, "
            f"first response {out['responses'][0]!r}"
        )
    print(f"generated live at steps: {rollout.GENERATED}")


if __name__ == "__main__":
    main()
