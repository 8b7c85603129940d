"""``prompt_text`` and ``response_text``: a call's token ids decoded with a local tokenizer, padding left out.

Which columns hold token ids is a matter of convention, by name (the first present wins):

- prompt: ``prompts`` (verl's layout), ``prompt_ids`` (TRL), ``prompt_token_ids``, ``prompt_input_ids``;
- response: ``responses`` (verl), ``completion_ids`` (TRL), ``response_ids``, ``completion_token_ids``.

Which ids are padding, by the masks beside them (the first that applies):

1. ``attention_mask`` as wide as the prompt and the response together (verl's layout: a left-padded prompt, then
   the right-padded response): its first columns mask the prompt, the rest the response. It is preferred to
   ``response_mask``, which in a multi-turn rollout also masks out the tool's tokens, which are text of the
   response all the same;
2. the field's own mask, as wide as its ids: ``prompt_mask``/``prompt_attention_mask`` for a prompt,
   ``response_mask``/``completion_mask`` for a response;
3. none: every id is text (TRL's lists of ids carry no padding).

Decoding keeps special tokens (an end-of-sequence token shows where the model stopped); only masked-out ids go.
The tokenizer is loaded with ``transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True,
trust_remote_code=False)``: a local folder, never the hub, and no code from the folder is ever run (a folder whose
``tokenizer_config.json`` maps ``AutoTokenizer`` to a module of its own is refused, or loaded by its stock class).
"""

from __future__ import annotations

import logging
import os
from typing import Any

logger = logging.getLogger(__name__)

PROMPT_FIELDS = ("prompts", "prompt_ids", "prompt_token_ids", "prompt_input_ids")
RESPONSE_FIELDS = ("responses", "completion_ids", "response_ids", "completion_token_ids")
PROMPT_MASKS = ("prompt_mask", "prompt_attention_mask")
RESPONSE_MASKS = ("response_mask", "completion_mask")
TEXT_COLUMNS = ("prompt_text", "response_text")


class TokenizerUnavailable(Exception):
    """The ``--tokenizer`` folder cannot be loaded; the message says why and what to pass."""


def load_tokenizer(folder: str) -> Any:
    """Load the Hugging Face tokenizer saved in ``folder`` (``save_pretrained``), without the hub.

    Raises:
        TokenizerUnavailable: ``folder`` is not a folder, ``transformers`` is not installed, or the folder holds no
            tokenizer transformers can load.
    """
    if not os.path.isdir(folder):
        raise TokenizerUnavailable(f"--tokenizer {folder!r} is not a folder; pass a local tokenizer folder (what "
                                   "save_pretrained writes: tokenizer.json, tokenizer_config.json)")
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise TokenizerUnavailable(f"--tokenizer needs the 'transformers' package ({exc})") from None
    try:
        # never run code from the folder (an auto_map naming a module in it): a tokenizer is data; with the default
        # (None) transformers asks on a terminal whether to run it
        return AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001 - transformers raises many kinds for a folder it cannot read
        if "trust_remote_code" in str(exc):
            raise TokenizerUnavailable(
                f"--tokenizer {folder!r}: its tokenizer_config.json names a tokenizer class in code of its own "
                "(auto_map), which skipweave never runs; pass a folder of a stock tokenizer (e.g. what "
                "PreTrainedTokenizerFast.save_pretrained writes)") from None
        raise TokenizerUnavailable(f"--tokenizer {folder!r}: transformers cannot load a tokenizer from it "
                                   f"({type(exc).__name__}: {exc})") from None


def _first(columns: dict[str, Any], names: tuple[str, ...]) -> str | None:
    return next((n for n in names if n in columns), None)


def _width(value: Any) -> int | None:
    shape = getattr(value, "shape", None)
    return int(shape[1]) if shape is not None and len(shape) == 2 else None


def _ids(value: Any, mask: Any, count: int) -> list[list[int]]:
    """Each row's ids where ``mask`` is set (every id when ``mask`` is None), as lists of ints."""
    from skipweave.export.values import plain

    rows: list[list[int]] = []
    for i in range(count):
        ids = plain(value[i])
        if mask is not None:
            keep = plain(mask[i])
            ids = [t for t, m in zip(ids, keep, strict=False) if m]
        rows.append([int(t) for t in ids])
    return rows


def token_fields(columns: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    """Where a call's token ids are: ``{"prompt"|"response": (column name, mask or None)}`` for the ones present in
    the per-sample ``columns``, the mask chosen as the module docstring says (``None``: every id is text). Also what
    ``skipweave view`` measures response lengths by."""
    prompt, response = _first(columns, PROMPT_FIELDS), _first(columns, RESPONSE_FIELDS)
    masks: dict[str, Any] = {}
    attention = columns.get("attention_mask")
    wp = _width(columns[prompt]) if prompt else None
    wr = _width(columns[response]) if response else None
    if attention is not None and wp is not None and wr is not None and _width(attention) == wp + wr:
        masks = {"prompt": attention[:, :wp], "response": attention[:, wp:]}
    for key, name, own in (("prompt", prompt, PROMPT_MASKS), ("response", response, RESPONSE_MASKS)):
        if name is None or key in masks:
            continue
        width = _width(columns[name])
        mask = next((columns[m] for m in own if m in columns and width is not None and _width(columns[m]) == width),
                    None)
        if mask is not None:
            masks[key] = mask
    return {key: (name, masks.get(key)) for key, name in (("prompt", prompt), ("response", response))
            if name is not None}


def sample_ids(columns: dict[str, Any], count: int) -> dict[str, list[list[int]]]:
    """``{"prompt"|"response": each sample's ids, padding left out}`` of a call's per-sample ``columns`` (the first
    ``count`` samples; see :func:`token_fields`)."""
    return {key: _ids(columns[name], mask, count) for key, (name, mask) in token_fields(columns).items()}


def decode_texts(tokenizer: Any, columns: dict[str, Any], count: int) -> dict[str, list[str]]:
    """``prompt_text`` and ``response_text`` of a call's per-sample ``columns`` (see the module docstring); only the
    ones whose ids are there. Empty when neither is."""
    return {f"{key}_text": tokenizer.batch_decode(ids, skip_special_tokens=False)
            for key, ids in sample_ids(columns, count).items()}


__all__ = ["PROMPT_FIELDS", "RESPONSE_FIELDS", "TEXT_COLUMNS", "TokenizerUnavailable", "decode_texts",
           "load_tokenizer", "sample_ids", "token_fields"]
