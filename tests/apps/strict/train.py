"""A one-file trainer for strict runs: ``python train.py MODE END [hydra overrides]``.

MODE is ``plain`` (no skipweave: the program ``skipweave run`` weaves) or ``hydra`` (a Hydra app, woven by
``+skip=...``). Its rollout, ``Trainer.generate`` (target ``train.Trainer.generate``), is called at steps 1-3 and
keeps the step in ``self.step`` (``step.expr: self.step``). END says how the program ends: ``none`` (its last
line), ``raise`` (an uncaught exception) or an exit status (``sys.exit(END)``). Prints ``DONE`` after the steps.
"""

import sys

MODE, END = sys.argv[1], sys.argv[2]


class Trainer:
    def __init__(self):
        self.step = 0

    def generate(self, prompts):
        return [p * 2 for p in prompts]


def run() -> None:
    trainer = Trainer()
    for step in (1, 2, 3):
        trainer.step = step
        trainer.generate([step, step + 1])
    print("DONE", flush=True)
    if END == "raise":
        raise RuntimeError("the trainer failed")
    if END != "none":
        sys.exit(int(END))


if MODE == "hydra":
    import hydra

    @hydra.main(version_base=None, config_path=None)
    def main(cfg: object) -> None:
        run()

    sys.argv = [sys.argv[0], *sys.argv[3:]]
    main()
else:
    run()
