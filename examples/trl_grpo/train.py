"""A tiny GRPO run with TRL on CPU: the training script the golden test (``tests/test_golden.py``) protects.

``python train.py OUTPUT_DIR [--max-steps N]`` builds a 2-layer Qwen2 model (hidden size 16, seeded weights) and a
word-level tokenizer in code (nothing from a hub), saves both to ``OUTPUT_DIR/model`` (TRL loads the reference model
from that path: ``beta`` > 0), and trains TRL's own ``GRPOTrainer`` on 8 prompts made in code with a rule reward.
It imports nothing from skipweave: the golden test weaves the shipped profile ``trl_grpo_replay`` onto TRL.

Each step is one generation batch (4 prompts x 2 completions) split into 2 micro-batches
(``gradient_accumulation_steps=2``), so the loss is computed twice per optimizer step.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from trl import GRPOConfig, GRPOTrainer

logger = logging.getLogger(__name__)

SEED = 1234
WORDS = ["a", "b", "c", "d", "e", "f", "g", "h", "yes", "no", "count", "say"]
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
GOOD = {"a", "b", "c", "d"}
"""The words the reward likes."""

REWARD_CALLS: list[int] = []
"""How many completions each call of the reward function scored (the golden test checks a replay makes none)."""


def build_model(path: Path) -> None:
    """Save a random tiny causal LM and its tokenizer, from :data:`SEED`, to ``path`` (created if missing)."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS + WORDS)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<s>",
                                        eos_token="</s>", unk_token="<unk>")
    torch.manual_seed(SEED)
    config = Qwen2Config(vocab_size=len(vocab), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True)
    Qwen2ForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)


def reward_good_words(completions: list[str], **kwargs: Any) -> list[float]:
    """The share of each completion's words that the reward likes (:data:`GOOD`), in [0, 1]."""
    REWARD_CALLS.append(len(completions))
    return [sum(w in GOOD for w in c.split()) / max(1, len(c.split())) for c in completions]


def make_trainer(output_dir: Path, max_steps: int = 2) -> GRPOTrainer:
    """The model, tokenizer, data and ``GRPOTrainer`` of the run, everything seeded.

    Args:
        output_dir: where the model is saved (``model/``) and where TRL writes its outputs.
        max_steps: optimizer steps to train for.
    """
    torch.set_num_threads(1)  # a tiny model: more threads only wait for each other, and round differently
    model_dir = output_dir / "model"
    build_model(model_dir)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)
    prompts = [f"say {WORDS[i % 8]} {WORDS[(3 * i + 1) % 8]}" for i in range(8)]
    args = GRPOConfig(
        output_dir=str(output_dir / "out"), max_steps=max_steps, per_device_train_batch_size=4,
        gradient_accumulation_steps=2, num_generations=2, max_completion_length=6, learning_rate=5e-2,
        beta=0.1,
        loss_type="grpo",
        logging_steps=1, save_strategy="no", seed=SEED, report_to=[], use_cpu=True, bf16=False,
        dataloader_num_workers=0, disable_tqdm=True,
    )
    return GRPOTrainer(model=str(model_dir), reward_funcs=reward_good_words, processing_class=tokenizer, args=args,
                       train_dataset=Dataset.from_dict({"prompt": prompts}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output_dir", type=Path)
    parser.add_argument("--max-steps", type=int, default=2)
    opts = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    trainer = make_trainer(opts.output_dir, opts.max_steps)
    trainer.train()
    for line in trainer.state.log_history:
        logger.info("%s", line)


if __name__ == "__main__":
    main()
