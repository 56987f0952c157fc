"""Flow matching (rectified flow): the training target, timestep sampling, and the sampler.

Convention (diffusers' FlowMatchEulerDiscreteScheduler): sigma runs from 1 (pure noise) to 0
(data); x_sigma = sigma * noise + (1 - sigma) * x0, and the model predicts the velocity
v = noise - x0, so that one Euler step is x_{sigma'} = x_sigma + (sigma' - sigma) * v.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def shift_sigmas(sigma: torch.Tensor, shift: float) -> torch.Tensor:
    """SD3's time shift: shift > 1 spends more of training and sampling near the noise end, which
    larger inputs need (more tokens keep more signal at the same noise level)."""
    return shift * sigma / (1 + (shift - 1) * sigma)


def resolution_shift(num_tokens: int, base_tokens: int = 1024, base_shift: float = 1.0) -> float:
    """Shift that grows with the square root of the token count, from `base_shift` at `base_tokens`."""
    return base_shift * math.sqrt(num_tokens / base_tokens)


@dataclass
class FlowMatching:
    logit_mean: float = 0.0
    logit_std: float = 1.0
    shift: float = 1.0
    timestep_sampling: str = "logit_normal"  # or "uniform"

    def __post_init__(self):
        if self.timestep_sampling not in ("logit_normal", "uniform"):
            raise ValueError(f"timestep_sampling={self.timestep_sampling!r}: logit_normal or uniform")
        if self.shift <= 0 or self.logit_std <= 0:
            raise ValueError("shift and logit_std must be > 0")

    def sample_sigmas(self, batch_size: int, generator: torch.Generator | None = None,
                      shift: float | None = None) -> torch.Tensor:
        """Training noise levels in (0, 1), (B,): logit-normal (SD3) or uniform, then shifted."""
        if self.timestep_sampling == "logit_normal":
            u = torch.randn(batch_size, generator=generator) * self.logit_std + self.logit_mean
            sigma = torch.sigmoid(u)
        else:
            sigma = torch.rand(batch_size, generator=generator)
        return shift_sigmas(sigma, self.shift if shift is None else shift)

    @staticmethod
    def noisy(x0: torch.Tensor, noise: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        s = sigma.view(-1, *([1] * (x0.dim() - 1))).to(x0.dtype)
        return s * noise + (1 - s) * x0

    @staticmethod
    def target(x0: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        return noise - x0

    def loss(self, model, x0: torch.Tensor, text_emb: torch.Tensor, text_mask: torch.Tensor | None,
             generator: torch.Generator | None = None) -> torch.Tensor:
        """Mean squared error between the predicted and the true velocity, one draw of noise and sigma."""
        noise = torch.randn(x0.shape, generator=generator, dtype=x0.dtype).to(x0.device)
        sigma = self.sample_sigmas(x0.shape[0], generator).to(x0.device)
        pred = model(self.noisy(x0, noise, sigma), sigma, text_emb, text_mask)
        return torch.nn.functional.mse_loss(pred.float(), self.target(x0, noise).float())


SCHEDULERS = ("FlowMatchEulerDiscreteScheduler", "UniPCMultistepScheduler")


def make_scheduler(name: str, shift: float = 1.0):
    """A diffusers scheduler for sampling a flow-matching model; timesteps are sigma * 1000."""
    import diffusers

    if name == "FlowMatchEulerDiscreteScheduler":
        return diffusers.FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=shift)
    if name == "UniPCMultistepScheduler":
        return diffusers.UniPCMultistepScheduler(num_train_timesteps=1000, prediction_type="flow_prediction",
                                                 use_flow_sigmas=True, flow_shift=shift)
    raise ValueError(f"scheduler {name!r}: one of {', '.join(SCHEDULERS)}")
