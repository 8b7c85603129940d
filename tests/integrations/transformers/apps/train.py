"""The user's training script: a tiny random GPT-2 trained by :class:`hftrainer.OnlineTrainer` on CPU.

It imports nothing from skipweave. ``python train.py REPORT.json`` trains for 6 steps (logging every 2, evaluating
every 3), evaluates once more at the end and writes a JSON report: the log history, the final parameters (a hash of
all of them and a few values), ``state.num_input_tokens_seen`` and the real calls of ``generate_completions``.
"""

from __future__ import annotations

import hashlib
import json
import sys

import torch
from hftrainer import BOS, EOS, PAD, OnlineTrainer
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

SEED = 1234


class Prompts(Dataset):
    """Fixed-length prompts of token ids, made in code."""

    def __init__(self, n: int, offset: int) -> None:
        self.rows = [[3 + (7 * (i + offset) + 5 * j) % 61 for j in range(4)] for i in range(n)]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        return {"input_ids": self.rows[i]}


def collate(rows: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.tensor([r["input_ids"] for r in rows], dtype=torch.long)}


def parameters_digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main(report_path: str) -> None:
    torch.set_num_threads(1)  # a tiny model: more threads only wait for each other (and share 2 cores with others)
    torch.manual_seed(SEED)
    config = GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=32,
                        bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD)
    model = GPT2LMHeadModel(config)  # random weights, dropout on (0.1): training draws from the torch RNG
    args = TrainingArguments(
        output_dir="out",
        max_steps=6,
        per_device_train_batch_size=2,
        per_device_eval_batch_size=2,
        learning_rate=5e-2,
        logging_steps=2,
        eval_strategy="steps",
        eval_steps=3,
        save_strategy="no",
        seed=SEED,
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        remove_unused_columns=False,
        disable_tqdm=True,
    )
    # 8 prompts, 2 per step: 6 steps cross an epoch boundary (the sampler reshuffles).
    trainer = OnlineTrainer(model=model, args=args, train_dataset=Prompts(8, 0), eval_dataset=Prompts(4, 100),
                            data_collator=collate)
    trainer.train()
    final_eval = trainer.evaluate()
    state = dict(model.state_dict())
    report = {
        "log_history": trainer.state.log_history,
        "final_eval": final_eval,
        "num_input_tokens_seen": trainer.state.num_input_tokens_seen,
        "global_step": trainer.state.global_step,
        "parameters_sha256": parameters_digest(model),
        "parameters_sample": {
            "transformer.wte.weight[3]": state["transformer.wte.weight"][3].tolist(),
            "transformer.h.0.attn.c_attn.bias[:8]": state["transformer.h.0.attn.c_attn.bias"][:8].tolist(),
        },
        "real_generations": trainer.real_generations,
    }
    with open(report_path, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
