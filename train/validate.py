"""The checks of a training run's arguments alone, before torch is imported and any process group
exists: a bad run fails at once with a message that says what to change, not after seconds of
imports on every rank, nor in a hung group. `vfm-train` runs them first (train/cli.py); the trainer
runs them again for a caller that builds one itself."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from dataloader.shards import expand_shards
from train.parallel_dims import ParallelDims


def validate(cfg: DictConfig, world_size: int) -> ParallelDims:
    """Everything that can be checked alone, so a bad run fails with a message and not a hung group."""
    if cfg.num_steps < 1:
        raise ValueError(f"num_steps={cfg.num_steps}: train at least one step")
    if cfg.optim.grad_accum_steps < 1:
        raise ValueError(f"optim.grad_accum_steps={cfg.optim.grad_accum_steps}: at least 1")
    if cfg.precision not in ("auto", "fp32", "bf16"):
        raise ValueError(f"precision={cfg.precision!r}: auto, fp32 or bf16")
    dims = ParallelDims.from_config(cfg.parallel, world_size)
    dims.check_model(cfg.model.num_heads)
    if not expand_shards(cfg.data.shards):
        raise FileNotFoundError(f"data.shards={cfg.data.shards!r} names no .tar shards")
    resume = cfg.checkpoint.resume
    if resume not in ("auto", "none") and not Path(resume).is_dir():
        raise FileNotFoundError(f"checkpoint.resume={resume!r}: not a directory (or use auto / none)")
    return dims
