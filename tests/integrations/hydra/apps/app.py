"""A Hydra app written for skipweave's tests; it imports nothing from skipweave."""

import hydra
import worker
from omegaconf import DictConfig
from report import report


@hydra.main(config_path="conf", config_name="config", version_base=None)
def main(cfg: DictConfig) -> None:
    print("TASK STARTED", flush=True)
    worker.REAL_CALLS.clear()  # per job: a --multirun sweep runs its jobs in one process
    gen = worker.Generator()
    results = [gen.generate(worker.Batch(step)) for step in range(1, cfg.steps + 1)]
    if cfg.get("use_lazy"):
        import lazy_worker

        results.append(lazy_worker.LazyGenerator().generate(None))
    report(results, job=cfg.get("job", 0))


if __name__ == "__main__":
    main()
