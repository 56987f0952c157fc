"""Exponential moving average of the weights, for sampling.

The average is kept beside the weights in their own layout (plain tensors, or the DTensor shards
that FSDP2 and tensor parallelism make), keyed by the parameters' canonical names, so a checkpoint
reshards it exactly as it reshards the model.
"""

from __future__ import annotations

import torch
from torch import nn

# Wrappers that parallelize() and torch.compile put into parameter names; checkpoints leave them out.
_WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


def canonical_name(name: str) -> str:
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


class EMA:
    def __init__(self, model: nn.Module, decay: float):
        if not 0 <= decay < 1:
            raise ValueError(f"optim.ema_decay={decay}: in [0, 1)")
        self.decay = decay
        self.shadow = {canonical_name(n): p.detach().clone() for n, p in model.named_parameters()}

    def decay_at(self, step: int) -> float:
        """Warmed up, (1 + step) / (10 + step) until it reaches `decay`: early averages follow the
        weights instead of remembering the random initialisation for thousands of steps."""
        return min(self.decay, (1 + step) / (10 + step))

    @torch.no_grad()
    def update(self, model: nn.Module, step: int) -> None:
        weight = 1 - self.decay_at(step)
        for name, p in model.named_parameters():
            self.shadow[canonical_name(name)].lerp_(p.detach(), weight)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.shadow
