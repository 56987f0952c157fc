"""Pixels to latents and back. Videos are (B, 3, T, H, W) in [-1, 1]; latents (B, C, T', H', W').

- `IdentityAutoencoder`: pixel space, for tiny CPU runs: latents are the pixels.
- `DiffusersAutoencoder`: a diffusers video VAE (AutoencoderKLWan, AutoencoderKLCogVideoX, ...) from
  a local folder, with its latent normalisation, exposing its temporal and spatial compression.
"""

from __future__ import annotations

import os

import torch
from torch import nn


class IdentityAutoencoder(nn.Module):
    latent_channels = 3
    temporal_compression = 1
    spatial_compression = 1

    def encode(self, video: torch.Tensor) -> torch.Tensor:
        return video

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return latents.clamp(-1, 1)

    def latent_frames(self, num_frames: int) -> int:
        return num_frames


class DiffusersAutoencoder(nn.Module):
    def __init__(self, path: str, model_class: str):
        super().__init__()
        import diffusers

        if not os.path.isdir(path):
            raise FileNotFoundError(f"autoencoder folder {path!r} does not exist")
        cls = getattr(diffusers, model_class, None)
        if cls is None:
            raise ValueError(f"autoencoder.model_class={model_class!r} is not a diffusers class")
        self.vae = cls.from_pretrained(path).eval().requires_grad_(False)
        cfg = self.vae.config
        self.latent_channels = cfg.get("z_dim") or cfg.get("latent_channels")
        self.temporal_compression = cfg.get("scale_factor_temporal") or cfg.get("temporal_compression_ratio") or 1
        self.spatial_compression = cfg.get("scale_factor_spatial") or 2 ** (len(cfg.get("block_out_channels", [0])) - 1)
        # Per-channel mean/std (Wan) or one scaling factor (most others) to bring latents to unit scale.
        c = self.latent_channels
        mean, std = cfg.get("latents_mean"), cfg.get("latents_std")
        if mean is not None and std is not None and len(mean) == c:
            self.register_buffer("mean", torch.tensor(mean).view(1, c, 1, 1, 1), persistent=False)
            self.register_buffer("std", torch.tensor(std).view(1, c, 1, 1, 1), persistent=False)
        else:
            scale = float(cfg.get("scaling_factor", 1.0))
            self.register_buffer("mean", torch.zeros(1, c, 1, 1, 1), persistent=False)
            self.register_buffer("std", torch.full((1, c, 1, 1, 1), 1 / scale), persistent=False)

    def latent_frames(self, num_frames: int) -> int:
        """Causal video VAEs keep the first frame and compress the rest: 1 + (T - 1) / ratio."""
        return 1 + (num_frames - 1) // self.temporal_compression

    @torch.no_grad()
    def encode(self, video: torch.Tensor) -> torch.Tensor:
        latents = self.vae.encode(video.to(self.vae.dtype)).latent_dist.mode()
        return ((latents - self.mean) / self.std).float()

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        video = self.vae.decode((latents * self.std + self.mean).to(self.vae.dtype)).sample
        return video.float().clamp(-1, 1)


def build_autoencoder(cfg) -> nn.Module:
    if cfg.name == "identity":
        return IdentityAutoencoder()
    if cfg.name == "diffusers":
        return DiffusersAutoencoder(cfg.path, cfg.model_class)
    raise ValueError(f"autoencoder={cfg.name!r}: one of identity, diffusers")
