"""The user's TRL training script: a tiny GRPO or RLOO run on CPU. It imports nothing from skipweave.

``python train.py {grpo|rloo} REPORT.json [--learning-rate LR]`` builds a 2-layer Qwen2 model (hidden size 16, seeded
weights) and a word-level tokenizer in code, saves both to ``./model`` (TRL builds the reference model from that
path: ``beta`` > 0), trains for 3 steps on prompts made in code with a rule reward, evaluates at step 2, at the end
of training and once more after it, and writes a JSON report: the trainer's log history, the final evaluation, the
token counter, a hash of the final parameters, the completions table TRL logs at each log line (``log_completions``;
read from the trainer's ``_logs`` when it logs, as TRL's own ``log`` reads it), every real call of ``model.generate``
as ``[global_step, model.training]`` and the number of completions each reward call scored.

GRPO runs 2 micro-batches per step (``gradient_accumulation_steps=2``: one generation per step, buffered and split,
shuffled through torch's generator); RLOO reuses each generation for 2 steps (``num_iterations=2``: old log-probs
computed, a generation at steps 0 and 2 only).
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import GenerationMixin, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM, TrainerCallback

SEED = 1234
WORDS = ["a", "b", "c", "d", "e", "f", "g", "h", "yes", "no", "count", "say"]
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
GOOD = {"a", "b", "c", "d"}
"""The words the reward likes."""

REAL_GENERATIONS: list[list[Any]] = []
REWARD_CALLS: list[int] = []


def build_model(path: Path) -> None:
    """A random tiny causal LM and its tokenizer, from a seed (nothing from a hub), saved to ``path``."""
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
    """The share of a completion's words the reward likes."""
    REWARD_CALLS.append(len(completions))
    return [sum(w in GOOD for w in c.split()) / max(1, len(c.split())) for c in completions]


def count_generations(trainer_of: list[Any]) -> None:
    """Count the real calls of ``model.generate`` (TRL samples through it when vLLM is off)."""
    real = GenerationMixin.generate

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        REAL_GENERATIONS.append([trainer_of[0].state.global_step, self.training])
        return real(self, *args, **kwargs)

    GenerationMixin.generate = counted  # type: ignore[method-assign]


class CompletionsTables(TrainerCallback):
    """At each log line, the completions table TRL prints with it (``log_completions``), as plain lists."""

    def __init__(self, trainer_of: list[Any]) -> None:
        self.trainer_of = trainer_of
        self.tables: list[dict[str, Any]] = []

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        logged = self.trainer_of[0]._logs
        self.tables.append({
            "step": state.global_step,
            "prompt": list(logged["prompt"]),
            "completion": list(logged["completion"]),
            "rewards": {name: list(values) for name, values in logged["rewards"].items()},
            "advantages": list(logged["advantages"]),
        })


def digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("trainer", choices=["grpo", "rloo"])
    parser.add_argument("report")
    parser.add_argument("--learning-rate", type=float, default=5e-2)
    opts = parser.parse_args()

    torch.set_num_threads(1)  # a tiny model: more threads only wait for each other (and share 2 cores with others)
    build_model(Path("model"))
    tokenizer = PreTrainedTokenizerFast.from_pretrained("model")
    prompts = [f"say {WORDS[i % 8]} {WORDS[(3 * i + 1) % 8]}" for i in range(8)]
    train = Dataset.from_dict({"prompt": prompts})
    evals = Dataset.from_dict({"prompt": ["count a b", "count c d"]})
    common: dict[str, Any] = dict(
        output_dir="out", max_steps=3, per_device_train_batch_size=4, per_device_eval_batch_size=4,
        num_generations=2, max_completion_length=6, learning_rate=opts.learning_rate, beta=0.1, logging_steps=1,
        eval_strategy="steps", eval_steps=2, save_strategy="no", seed=SEED, report_to=[], use_cpu=True, bf16=False,
        dataloader_num_workers=0, disable_tqdm=True, log_completions=True,
    )
    trainer_of: list[Any] = []
    count_generations(trainer_of)
    tables = CompletionsTables(trainer_of)
    if opts.trainer == "grpo":
        from trl import GRPOConfig, GRPOTrainer

        trainer: Any = GRPOTrainer(model="model", reward_funcs=reward_good_words, processing_class=tokenizer,
                                   args=GRPOConfig(**common, gradient_accumulation_steps=2),
                                   train_dataset=train, eval_dataset=evals, callbacks=[tables])
    else:
        from trl import RLOOConfig, RLOOTrainer

        trainer = RLOOTrainer(model="model", reward_funcs=reward_good_words, processing_class=tokenizer,
                              args=RLOOConfig(**common, num_iterations=2), train_dataset=train, eval_dataset=evals,
                              callbacks=[tables])
    trainer_of.append(trainer)
    trainer.train()
    final_eval = trainer.evaluate()
    report = {
        "log_history": trainer.state.log_history,
        "final_eval": final_eval,
        "num_input_tokens_seen": trainer.state.num_input_tokens_seen,
        "global_step": trainer.state.global_step,
        "parameters_sha256": digest(trainer.model),
        "completions": tables.tables,
        "real_generations": REAL_GENERATIONS,
        "reward_calls": REWARD_CALLS,
    }
    Path(opts.report).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
