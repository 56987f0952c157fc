"""Attention of the video DiT. Every attention call goes through `AttentionCore`, the one seam
that context parallelism replaces or wraps; the projections are named (`to_q`, `to_k`, `to_v`,
`to_out`) so tensor-parallel plans can address them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from models.dit.layers import RMSNorm, apply_rotary


class AttentionCore(nn.Module):
    """softmax(q kᵀ / √Dh) v on (B, H, n, Dh) tensors; `mask` (B, 1, 1, Lk) True where keys count."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class Attention(nn.Module):
    """Multi-head attention from `x` to `context` (itself for self-attention), with QK-norm and,
    for video tokens, rotary positions."""

    def __init__(self, hidden_size: int, num_heads: int, qk_norm: bool = True, context_dim: int | None = None):
        super().__init__()
        if hidden_size % num_heads:
            raise ValueError(f"hidden_size={hidden_size} is not divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.head_dim = hidden_size // num_heads
        context_dim = context_dim or hidden_size
        self.to_q = nn.Linear(hidden_size, hidden_size)
        self.to_k = nn.Linear(context_dim, hidden_size)
        self.to_v = nn.Linear(context_dim, hidden_size)
        self.to_out = nn.Linear(hidden_size, hidden_size)
        self.q_norm = RMSNorm(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = RMSNorm(self.head_dim) if qk_norm else nn.Identity()
        self.core = AttentionCore()

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.unflatten(-1, (-1, self.head_dim)).transpose(1, 2)  # (B, H, n, Dh)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None, rope=None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        context = x if context is None else context
        q = self.q_norm(self._heads(self.to_q(x)))  # (B, H, N, Dh)
        k = self.k_norm(self._heads(self.to_k(context)))  # (B, H, Lk, Dh)
        v = self._heads(self.to_v(context))  # (B, H, Lk, Dh)
        if rope is not None:
            q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        out = self.core(q, k, v, mask)  # (B, H, N, Dh)
        return self.to_out(out.transpose(1, 2).flatten(2))  # (B, N, D)
