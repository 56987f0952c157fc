"""Building blocks of the video DiT: embedders, 3D rotary positions, norms, MLP, modulation.

Shapes: B batch, N video tokens, L text tokens, D hidden size, H heads, Dh head size.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """AdaLN: x (B, N, D) scaled and shifted per sample by (B, D) vectors."""
    return x * (1 + scale[:, None]) + shift[:, None]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class PatchEmbed3D(nn.Module):
    """(B, C, T, H, W) video -> (B, N, D) tokens, one per (pt, ph, pw) patch, in (t, h, w) order."""

    def __init__(self, in_channels: int, hidden_size: int, patch_size: tuple[int, int, int]):
        super().__init__()
        self.patch_size = tuple(patch_size)
        self.proj = nn.Conv3d(in_channels, hidden_size, kernel_size=self.patch_size, stride=self.patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(x)  # (B, D, T', H', W')
        return x.flatten(2).transpose(1, 2)  # (B, N, D)


class TimestepEmbedder(nn.Module):
    """Scalar timesteps in [0, 1] -> (B, D): sinusoidal features, then an MLP."""

    def __init__(self, hidden_size: int, freq_dim: int = 256):
        super().__init__()
        self.freq_dim = freq_dim
        self.mlp = nn.Sequential(nn.Linear(freq_dim, hidden_size), nn.SiLU(), nn.Linear(hidden_size, hidden_size))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.freq_dim // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
        args = (t.float() * 1000)[:, None] * freqs[None]  # (B, half)
        emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)  # (B, freq_dim)
        return self.mlp(emb.to(self.mlp[0].weight.dtype))  # (B, D)


class TextProjection(nn.Module):
    """Text encoder states (B, L, Dt) -> (B, L, D)."""

    def __init__(self, text_dim: int, hidden_size: int):
        super().__init__()
        self.fc1 = nn.Linear(text_dim, hidden_size)
        self.fc2 = nn.Linear(hidden_size, hidden_size)

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(y), approximate="tanh"))


class TextPooling(nn.Module):
    """Text encoder states (B, L, Dt) and mask (B, L) -> (B, D): the prompt as one vector, the mean
    of its tokens through an MLP, for the AdaLN conditioning (as SD3 and Flux add a pooled text
    vector to the timestep's). Cross-attention reads the prompt token by token; this gives every
    block the whole prompt at once."""

    def __init__(self, text_dim: int, hidden_size: int):
        super().__init__()
        self.fc1 = nn.Linear(text_dim, hidden_size)
        self.fc2 = nn.Linear(hidden_size, hidden_size)

    def forward(self, y: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        if mask is None:
            pooled = y.mean(1)  # (B, Dt)
        else:
            w = mask.to(y.dtype)[..., None]  # (B, L, 1)
            pooled = (y * w).sum(1) / w.sum(1).clamp(min=1)  # (B, Dt)
        return self.fc2(F.silu(self.fc1(pooled)))  # (B, D)


class MLP(nn.Module):
    def __init__(self, hidden_size: int, mlp_ratio: float):
        super().__init__()
        inner = int(hidden_size * mlp_ratio)
        self.fc1 = nn.Linear(hidden_size, inner)
        self.fc2 = nn.Linear(inner, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class Modulation(nn.Module):
    """Conditioning vector (B, D) -> `count` vectors (B, D) each: shift, scale, gate, ...

    rank 0: one full Linear(D, count*D) (AdaLN-Zero). rank r > 0: a low-rank Linear(D, r) then
    Linear(r, count*D) (AdaLN-LoRA, as NeMo's DiT uses to cut modulation parameters).
    """

    def __init__(self, hidden_size: int, count: int, rank: int = 0):
        super().__init__()
        self.count = count
        self.down = nn.Linear(hidden_size, rank, bias=False) if rank else None
        self.up = nn.Linear(rank or hidden_size, count * hidden_size)

    def forward(self, c: torch.Tensor) -> list[torch.Tensor]:
        h = F.silu(c)
        if self.down is not None:
            h = self.down(h)
        return list(self.up(h).chunk(self.count, dim=-1))


# --- rotary positions over (t, h, w) ----------------------------------------------------------


def rope_axis_dims(head_dim: int) -> tuple[int, int, int]:
    """How a head's dimensions split over the (t, h, w) axes; each even, h and w equal."""
    if head_dim % 2:
        raise ValueError(f"head size {head_dim} must be even for rotary embeddings")
    hw = 2 * (head_dim // 6)
    return head_dim - 2 * hw, hw, hw


def token_coords(grid: tuple[int, int, int], index: torch.Tensor) -> torch.Tensor:
    """(t, h, w) grid coordinates of flat token indices (any slice of the sequence): (n, 3)."""
    _, gh, gw = grid
    return torch.stack([index // (gh * gw), (index // gw) % gh, index % gw], dim=-1)


def axis_angles(grid: tuple[int, int, int], index: torch.Tensor | None, dims: tuple[int, int, int],
                theta: float) -> list[torch.Tensor]:
    """Per axis (t, h, w), the angles coordinate x theta^(-2k/d) of the tokens at flat indices `index`
    (None: all): three (n, d/2) tensors, for axes of d = `dims` dimensions."""
    if index is None:
        index = torch.arange(grid[0] * grid[1] * grid[2])
    coords = token_coords(grid, index).float()  # (n, 3)
    angles = []
    for axis, dim in enumerate(dims):
        inv = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)  # (dim/2,)
        angles.append(coords[:, axis:axis + 1] * inv[None])  # (n, dim/2)
    return angles


class RotaryEmbedding3D(nn.Module):
    """cos/sin tables for tokens at (t, h, w) grid positions. `forward(grid, index)` takes the flat
    indices of the tokens wanted, so a context-parallel rank asks only for its own slice."""

    def __init__(self, head_dim: int, theta: float = 10000.0):
        super().__init__()
        self.dims = rope_axis_dims(head_dim)
        self.theta = theta

    def forward(self, grid: tuple[int, int, int], index: torch.Tensor | None = None):
        angles = torch.cat(axis_angles(grid, index, self.dims, self.theta), dim=-1)  # (n, Dh/2)
        return angles.cos(), angles.sin()


def sincos_positions(grid: tuple[int, int, int], index: torch.Tensor | None, dim: int) -> torch.Tensor:
    """Fixed sin-cos embeddings of the tokens' absolute (t, h, w) grid coordinates, as DiT and Latte add
    to their patch embeddings: (n, dim). The dimensions and frequencies per axis are the rotary ones;
    each axis is half sines, half cosines."""
    angles = axis_angles(grid, index, rope_axis_dims(dim), 10000.0)  # 3 x (n, d/2)
    return torch.cat([f(a) for a in angles for f in (torch.sin, torch.cos)], dim=-1)  # (n, dim)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[2i], x[2i+1]) of x (B, H, n, Dh) by the angles of each token (n, Dh/2)."""
    x1, x2 = x.float().unflatten(-1, (-1, 2)).unbind(-1)  # (B, H, n, Dh/2) each
    cos, sin = cos.to(x.device), sin.to(x.device)
    out = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)
    return out.type_as(x)
