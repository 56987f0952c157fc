"""Hydra configs for every vfm stage; `conf.schema` registers their dataclass schemas."""

from __future__ import annotations

from hydra import compose as _compose
from hydra import initialize_config_module
from omegaconf import DictConfig

from conf import schema


def compose(stage: str, overrides: list[str] | None = None) -> DictConfig:
    """The config a stage's CLI would see for these `key=value` overrides, outside a Hydra app."""
    if stage not in schema.STAGES:
        raise ValueError(f"unknown stage {stage!r}; expected one of {', '.join(schema.STAGES)}")
    with initialize_config_module("conf", version_base="1.3"):
        return _compose(stage, overrides=list(overrides or []))
