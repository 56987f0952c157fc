"""Hydra configs for every vfm stage; `conf.schema` registers their dataclass schemas."""

from __future__ import annotations

import sys

from hydra import compose as _compose
from hydra import initialize_config_module
from omegaconf import DictConfig, OmegaConf

from conf import schema


def compose(stage: str, overrides: list[str] | None = None) -> DictConfig:
    """The config a stage's CLI would see for these `key=value` overrides, outside a Hydra app."""
    if stage not in schema.STAGES:
        raise ValueError(f"unknown stage {stage!r}; expected one of {', '.join(schema.STAGES)}")
    with initialize_config_module("conf", version_base="1.3"):
        return _compose(stage, overrides=list(overrides or []))


def require(cfg: DictConfig, command: str, keys: list[str], usage: str) -> None:
    """Exit (status 2, as for a missing argument) with one line that names those of `keys` left unset
    and gives the command's `usage`, where OmegaConf would raise MissingMandatoryValue in a traceback."""
    unset = [key for key in keys if _unset(cfg, key)]
    if unset:
        print(f"{command}: {' and '.join(f'{k}=' for k in unset)} must be given. Usage: {usage}", file=sys.stderr)
        sys.exit(2)


def _unset(cfg: DictConfig, key: str) -> bool:
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    return node is not None and OmegaConf.is_missing(node, leaf)
