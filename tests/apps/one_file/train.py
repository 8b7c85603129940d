"""A one-file trainer: its rollout class, an async rollout and a plain function all live in the script it runs.

``python train.py MODE NAMING DUMP_DIR [hydra overrides]``: MODE is ``plain`` (no skipweave: the program
``skipweave run`` weaves), ``weave`` (``skipweave.weave()`` at the top, before the definitions) or ``hydra``;
NAMING is ``main`` (targets ``__main__:...``) or ``script`` (targets ``train....``). Prints ``REAL n`` (calls
that really ran) and ``OUT ...`` (every result).
"""

import asyncio
import json
import sys

MODE, NAMING, DUMP = sys.argv[1], sys.argv[2], sys.argv[3]
PREFIX = "__main__:" if NAMING == "main" else "train."
TARGETS = {"cls": f"{PREFIX}Trainer.generate", "fn": f"{PREFIX}score", "aio": f"{PREFIX}AsyncTrainer.generate"}

if MODE == "weave":
    import skipweave

    skipweave.weave({"skip": {"rollout": {"enable": True, "dump_dir": DUMP, "step": "counter",
                                          "targets": TARGETS}}})

REAL = []


class Trainer:
    def generate(self, prompts):
        REAL.append("cls")
        return [p * 3 for p in prompts]


def score(xs):
    REAL.append("fn")
    return sum(xs) / len(xs)


class AsyncTrainer:
    async def generate(self, prompts):
        REAL.append("aio")
        await asyncio.sleep(0)
        return [p + 100 for p in prompts]


def run() -> None:
    out = []
    for step in range(3):
        got = Trainer().generate([step, step + 1])
        out.append([got, score(got), asyncio.run(AsyncTrainer().generate([step]))])
    print("REAL", len(REAL))
    print("OUT", json.dumps(out))


if MODE == "hydra":
    import hydra

    @hydra.main(version_base=None, config_path=None)
    def main(cfg: object) -> None:
        run()

    sys.argv = [sys.argv[0], *sys.argv[4:]]
    main()
else:
    run()
