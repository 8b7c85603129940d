"""Stores for the ``skipweave view`` tests, made by really recording (tests/export/recording.py's host, woven in this
process): a DataProto-shaped rollout store A, a store B of the same calls whose step 2 diverges at one token, a verify
run's report of B's calls against A, and a tokenizer folder whose words include markup.

Untrusted input on purpose: sample 0's ``uid`` of every call is :data:`HOSTILE`, and the tokenizer's word of id 3 is
:data:`HOSTILE_WORD`: a page that let either through unescaped would run a script (the tests check it does not).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.export.recording import forget, host_module, record, rollouts

N = 6
STEPS = (1, 2, 3)
VALIDATE_AT = (2,)
DIVERGING_STEP, DIVERGING_SAMPLE, DIVERGING_POSITION, LIVE_TOKEN = 2, 1, 1, 7
"""Where B differs from A: step 2's response of sample 1 holds token 7 at position 1 (A: the end-of-sequence 2)."""
HOSTILE = "<script>document.title='pwned-uid'</script>"
HOSTILE_WORD = "<script>document.title='pwned-text'</script>"
WORDS = ["<pad>", "<s>", "</s>", HOSTILE_WORD, "four", "five", "six", "seven"]


@dataclass
class Stores:
    a: Path
    b: Path
    report: Path
    tokenizer: Path


def _hostile(host: Any) -> dict[str, bool]:
    """Make ``host``'s rollouts carry :data:`HOSTILE` in sample 0's uid and, while the returned switch's
    ``diverge`` is set, B's one token."""
    original = host.rollout_batch
    switch = {"diverge": False}

    def rollout_batch(step: int, n: int) -> Any:
        out = original(step, n)
        out.non_tensor_batch["uid"][0] = HOSTILE
        if switch["diverge"] and step == DIVERGING_STEP and n == N:
            out.batch["responses"][DIVERGING_SAMPLE, DIVERGING_POSITION] = LIVE_TOKEN
        return out

    host.rollout_batch = rollout_batch
    return switch


def tokenizer(folder: Path) -> Path:
    """A WordLevel tokenizer built in code (:data:`WORDS` by id), saved as a ``PreTrainedTokenizerFast`` folder."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>",
                            eos_token="</s>").save_pretrained(str(folder))
    return folder


def make(tmp: Path) -> Stores:
    """Record A, then B (one host module: a verify run rebuilds A's ``Batch`` from it), run B's calls as a verify run
    against A, save the tokenizer; all under ``tmp``."""
    stores = Stores(tmp / "a", tmp / "b", tmp / "skipweave-verify.jsonl", tmp / "tokenizer")
    calls = rollouts(STEPS, N, validate_at=VALIDATE_AT)
    target = {"gen": "Rollout.generate_sequences"}
    host = host_module(tmp)
    try:
        switch = _hostile(host)
        record(stores.a, host, target, calls, record_validation=True)
        switch["diverge"] = True
        record(stores.b, host, target, calls, record_validation=True)
        record(stores.a, host, target, calls, record_validation=True, action="verify", report=str(stores.report),
               compare={"fields": {"meta_info.skipweave": "ignore"}})
    finally:
        forget(host)
    tokenizer(stores.tokenizer)
    return stores
