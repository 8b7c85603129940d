"""A tiny pre-LayerNorm causal transformer policy, built in code with seeded random weights."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention honouring a key-padding mask."""

    def __init__(self, d_model: int, n_heads: int, dropout: float) -> None:
        """Create the fused QKV and output projections."""
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """Attend over ``x`` of shape (B, T, D); ``allowed`` is a (B, 1, T, T) boolean mask."""
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        return self.drop(self.proj(y.transpose(1, 2).reshape(b, t, d)))


class Block(nn.Module):
    """Pre-LN transformer block: attention then a GELU MLP, both residual."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float) -> None:
        """Create the sub-layers."""
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads, dropout)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model), nn.Dropout(dropout)
        )

    def forward(self, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """Apply the block."""
        x = x + self.attn(self.ln1(x), allowed)
        return x + self.mlp(self.ln2(x))


class TinyCausalLM(nn.Module):
    """A small GPT-style language model over the toy vocabulary.

    Weights are initialised from a private ``torch.Generator`` seeded with ``init_seed``, so the
    initial policy does not depend on (nor perturb) the global RNG.
    """

    def __init__(
        self,
        vocab_size: int = 16,
        d_model: int = 64,
        n_layers: int = 2,
        n_heads: int = 4,
        d_ff: int = 256,
        max_seq_len: int = 64,
        dropout: float = 0.1,
        init_seed: int = 0,
    ) -> None:
        """Build the layers and initialise them deterministically."""
        super().__init__()
        self.max_seq_len = max_seq_len
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(max_seq_len, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(d_model, n_heads, d_ff, dropout) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self._init_weights(init_seed, n_layers)

    @torch.no_grad()
    def _init_weights(self, seed: int, n_layers: int) -> None:
        """GPT-2 style init from a seeded private generator."""
        gen = torch.Generator().manual_seed(seed)
        for name, param in self.named_parameters():
            if name.endswith("bias"):
                param.zero_()
            elif param.dim() == 1:  # LayerNorm weights
                param.fill_(1.0)
            else:
                std = (
                    0.02 / math.sqrt(2 * n_layers) if name.endswith(("proj.weight", "mlp.2.weight")) else 0.02
                )
                param.copy_(torch.randn(param.shape, generator=gen) * std)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Return next-token logits of shape (B, T, V) for left-padded ``input_ids`` of shape (B, T)."""
        b, t = input_ids.shape
        if t > self.max_seq_len:
            raise ValueError(f"sequence length {t} exceeds max_seq_len={self.max_seq_len}")
        valid = attention_mask.bool()
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        causal = torch.ones(t, t, dtype=torch.bool, device=input_ids.device).tril()
        # Each query sees valid keys at or before it, and always itself (keeps padded rows finite).
        allowed = (causal & valid[:, None, :]) | torch.eye(t, dtype=torch.bool, device=input_ids.device)
        allowed = allowed[:, None, :, :]
        x = self.drop(self.tok_emb(input_ids) + self.pos_emb(positions))
        for block in self.blocks:
            x = block(x, allowed)
        return self.head(self.ln_f(x))


def response_log_probs(
    model: TinyCausalLM,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_length: int,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Log-probabilities of the last ``response_length`` tokens of ``input_ids`` under ``model``."""
    logits = model(input_ids, attention_mask)[:, -response_length - 1 : -1, :] / temperature
    targets = input_ids[:, -response_length:]
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def param_checksum(model: nn.Module) -> float:
    """A deterministic float summarising every parameter (sensitive to any single-bit change)."""
    total = torch.zeros((), dtype=torch.float64)
    for index, (_, param) in enumerate(sorted(model.named_parameters())):
        flat = param.detach().double().reshape(-1)
        weights = torch.sin(torch.arange(flat.numel(), dtype=torch.float64) * 0.618 + index) + 1.5
        total += (flat * weights).sum()
    return float(total)
