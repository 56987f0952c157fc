"""VideoDiT: a diffusion transformer over video latents, trained with flow matching.

    x (B, C, T, H, W) ─ PatchEmbed3D ─► tokens (B, N, D)
      (+ sin-cos embeddings of each token's absolute (t, h, w) with absolute_positions)
    t (B,) ─ TimestepEmbedder ─► c (B, D)          text (B, L, Dt) ─ TextProjection ─► (B, L, D)
      (+ TextPooling(text) ─► (B, D) with pooled_text: the whole prompt in every block's AdaLN)
    num_layers × DiTBlock: AdaLN-Zero self-attention with 3D RoPE, cross-attention to text, MLP
    FinalLayer (AdaLN, linear) ─ unpatchify ─► velocity (B, C, T, H, W)

Single-device code: parallelism is applied from outside (train/parallelize.py). Saved and loaded
as a diffusers folder (config.json + diffusion_pytorch_model.safetensors) through ModelMixin.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin
from torch import nn

from models.dit.attention import Attention
from models.dit.layers import (
    MLP,
    Modulation,
    PatchEmbed3D,
    RotaryEmbedding3D,
    TextPooling,
    TextProjection,
    TimestepEmbedder,
    modulate,
    sincos_positions,
)


class DiTBlock(nn.Module):
    def __init__(self, hidden_size: int, num_heads: int, mlp_ratio: float, qk_norm: bool, adaln_lora_rank: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(hidden_size, num_heads, qk_norm)
        self.norm2 = nn.LayerNorm(hidden_size, eps=1e-6)
        self.cross_attn = Attention(hidden_size, num_heads, qk_norm)
        self.norm3 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.mlp = MLP(hidden_size, mlp_ratio)
        self.modulation = Modulation(hidden_size, 6, adaln_lora_rank)

    def forward(self, x, c, text, text_mask, rope):
        shift1, scale1, gate1, shift2, scale2, gate2 = self.modulation(c)  # 6 x (B, D)
        x = x + gate1[:, None] * self.attn(modulate(self.norm1(x), shift1, scale1), rope=rope)  # (B, N, D)
        x = x + self.cross_attn(self.norm2(x), context=text, mask=text_mask)  # (B, N, D)
        x = x + gate2[:, None] * self.mlp(modulate(self.norm3(x), shift2, scale2))  # (B, N, D)
        return x


class FinalLayer(nn.Module):
    def __init__(self, hidden_size: int, patch_volume: int, out_channels: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.modulation = Modulation(hidden_size, 2)
        self.linear = nn.Linear(hidden_size, patch_volume * out_channels)

    def forward(self, x, c):
        shift, scale = self.modulation(c)
        return self.linear(modulate(self.norm(x), shift, scale))  # (B, N, pt*ph*pw*C)


class TokenLayout(nn.Module):
    """Which video tokens this process computes. On one device: all of them, in order. Context
    parallelism replaces this module (train/parallelize.py) with one that keeps a slice of the
    sequence and gathers the outputs back; `index` are the flat grid positions of the kept tokens."""

    def split(self, tokens: torch.Tensor, grid: tuple[int, int, int]) -> tuple[torch.Tensor, torch.Tensor | None]:
        return tokens, None

    def merge(self, tokens: torch.Tensor) -> torch.Tensor:
        return tokens


class VideoDiT(ModelMixin, ConfigMixin):
    @register_to_config
    def __init__(self, in_channels: int = 3, out_channels: int | None = None, hidden_size: int = 64,
                 num_layers: int = 2, num_heads: int = 4, mlp_ratio: float = 4.0,
                 patch_size: tuple[int, int, int] = (1, 2, 2), text_dim: int = 384, qk_norm: bool = True,
                 adaln_lora_rank: int = 0, rope_theta: float = 10000.0, pooled_text: bool = False,
                 absolute_positions: bool = False):
        super().__init__()
        self.out_channels = out_channels or in_channels
        self.patch_size = tuple(patch_size)
        self.patch_embed = PatchEmbed3D(in_channels, hidden_size, self.patch_size)
        self.time_embed = TimestepEmbedder(hidden_size)
        self.text_proj = TextProjection(text_dim, hidden_size)
        self.text_pool = TextPooling(text_dim, hidden_size) if pooled_text else None
        self.rope = RotaryEmbedding3D(hidden_size // num_heads, rope_theta)
        self.absolute_positions = absolute_positions
        self.token_layout = TokenLayout()
        self.blocks = nn.ModuleList(DiTBlock(hidden_size, num_heads, mlp_ratio, qk_norm, adaln_lora_rank)
                                    for _ in range(num_layers))
        self.final = FinalLayer(hidden_size, math.prod(self.patch_size), self.out_channels)
        self.init_weights()

    def init_weights(self) -> None:
        """Xavier for linear layers; zero for every AdaLN modulation and the output layer, so the
        untrained model is the identity in each block and outputs zero (AdaLN-Zero)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        w = self.patch_embed.proj.weight
        nn.init.xavier_uniform_(w.view(w.shape[0], -1))
        nn.init.normal_(self.time_embed.mlp[0].weight, std=0.02)
        nn.init.normal_(self.time_embed.mlp[2].weight, std=0.02)
        for block in self.blocks:
            nn.init.zeros_(block.modulation.up.weight)
            nn.init.zeros_(block.modulation.up.bias)
        nn.init.zeros_(self.final.modulation.up.weight)
        nn.init.zeros_(self.final.modulation.up.bias)
        nn.init.zeros_(self.final.linear.weight)
        nn.init.zeros_(self.final.linear.bias)

    def grid(self, shape: tuple[int, ...]) -> tuple[int, int, int]:
        """Token grid (T', H', W') of an input (B, C, T, H, W); each size must divide by its patch."""
        t, h, w = shape[-3:]
        pt, ph, pw = self.patch_size
        if t % pt or h % ph or w % pw:
            raise ValueError(f"input (T, H, W)=({t}, {h}, {w}) does not divide by patch size {self.patch_size}")
        return t // pt, h // ph, w // pw

    def unpatchify(self, x: torch.Tensor, grid: tuple[int, int, int]) -> torch.Tensor:
        """(B, N, pt*ph*pw*C) -> (B, C, T, H, W)."""
        gt, gh, gw = grid
        pt, ph, pw = self.patch_size
        x = x.view(x.shape[0], gt, gh, gw, pt, ph, pw, self.out_channels)
        x = x.permute(0, 7, 1, 4, 2, 5, 3, 6)  # (B, C, T', pt, H', ph, W', pw)
        return x.reshape(x.shape[0], self.out_channels, gt * pt, gh * ph, gw * pw)

    def forward(self, x: torch.Tensor, t: torch.Tensor, text_emb: torch.Tensor,
                text_mask: torch.Tensor | None = None) -> torch.Tensor:
        grid = self.grid(x.shape)
        tokens, index = self.token_layout.split(self.patch_embed(x), grid)  # (B, n, D): n = N on one device
        if self.absolute_positions:
            tokens = tokens + sincos_positions(grid, index, tokens.shape[-1]).to(tokens)  # (n, D) broadcast
        c = self.time_embed(t)  # (B, D)
        if self.text_pool is not None:
            c = c + self.text_pool(text_emb, text_mask)  # (B, D)
        text = self.text_proj(text_emb)  # (B, L, D)
        mask = None if text_mask is None else text_mask.bool()[:, None, None, :]  # (B, 1, 1, L)
        rope = self.rope(grid, index)
        for block in self.blocks:
            tokens = block(tokens, c, text, mask, rope)  # (B, n, D)
        out = self.token_layout.merge(self.final(tokens, c))  # (B, N, pt*ph*pw*C)
        return self.unpatchify(out, grid)  # (B, C, T, H, W)


@dataclass(frozen=True)
class Flavor:
    hidden_size: int
    num_layers: int
    num_heads: int
    mlp_ratio: float = 4.0
    adaln_lora_rank: int = 0

    def kwargs(self) -> dict:
        return asdict(self)


# Parameter counts (transformer alone): debug 0.24M, dit_130m ~125M, dit_1b ~1.0B, dit_7b ~7.8B.
FLAVORS = {
    "debug": Flavor(hidden_size=64, num_layers=2, num_heads=4),
    "dit_130m": Flavor(hidden_size=768, num_layers=12, num_heads=12, adaln_lora_rank=128),
    "dit_1b": Flavor(hidden_size=2048, num_layers=14, num_heads=16, adaln_lora_rank=256),
    "dit_7b": Flavor(hidden_size=4096, num_layers=28, num_heads=32, adaln_lora_rank=256),
}


def build(flavor: str, **overrides) -> VideoDiT:
    if flavor not in FLAVORS:
        raise ValueError(f"model flavor {flavor!r}: one of {', '.join(FLAVORS)}")
    return VideoDiT(**{**FLAVORS[flavor].kwargs(), **overrides})


def matmul_params(model: VideoDiT) -> int:
    """Parameters that take part in a matrix product per token (all but norms and biases)."""
    return sum(p.numel() for n, p in model.named_parameters() if p.dim() >= 2 and "time_embed" not in n
               and "modulation" not in n and "text_proj" not in n and "text_pool" not in n)


def flops_per_token(model: VideoDiT, num_tokens: int, text_len: int, training: bool = True) -> float:
    """FLOPs for one video token: 2 per multiply-add in the per-token matrix products, plus
    attention scores and weighted sums (4·D per key, over N video keys and L text keys per layer);
    training is forward + backward = 3x forward. Per-sample work (timestep, text, modulation) is
    left out, as nanoGPT and PaLM's MFU leave out embeddings."""
    cfg = model.config
    forward = 2 * matmul_params(model) + 4 * cfg.num_layers * cfg.hidden_size * (num_tokens + text_len)
    return 3 * forward if training else forward
