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


# Each stage's command line, as its `--help` and its error for a missing setting give it.
USAGE = {
    "curate": "vfm-curate input=<videos> output=<dir> [key=value ...]",
    "encode": "vfm-encode input=<curated dir or shards> output=<dir> [key=value ...]",
    "train": "vfm-train run_dir=<dir> data.shards=<curated dir> [key=value ...]",
    "sample": 'vfm-sample checkpoint=<exported dir> prompt="..." output=<file.mp4> [key=value ...]',
    "serve": "vfm-serve checkpoint=<exported dir> [key=value ...]",
}


def require(cfg: DictConfig, stage: str, keys: list[str]) -> None:
    """Exit (status 2, as for a missing argument) with one line that names those of `keys` left unset
    and gives the stage's usage, where OmegaConf would raise MissingMandatoryValue in a traceback."""
    unset = [key for key in keys if _unset(cfg, key)]
    if unset:
        missing = " and ".join(f"{k}=" for k in unset)
        print(f"vfm-{stage}: {missing} must be given. Usage: {USAGE[stage]} (--help lists every setting)",
              file=sys.stderr)
        sys.exit(2)


def _unset(cfg: DictConfig, key: str) -> bool:
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    return node is not None and OmegaConf.is_missing(node, leaf)


def config_groups(stage: str) -> str:
    """The groups of `--help` (hydra/help/vfm.yaml): one line for each group the stage's config
    chooses from, with its options (the YAML files in its folder), the default marked with a *.
    Hydra's own list held every stage's groups."""
    lines = []
    for entry in OmegaConf.load(schema.CONF_DIR / f"{stage}.yaml").defaults:
        if not isinstance(entry, DictConfig):  # the stage's schema, _self_
            continue
        (group, default), = entry.items()
        if not group.startswith("override "):  # Hydra's own groups
            options = sorted(p.stem for p in (schema.CONF_DIR / group).glob("*.yaml"))
            lines.append(f"{group}: " + ", ".join(f"{o}*" if o == default else o for o in options))
    return "\n".join(lines)


OmegaConf.register_new_resolver("vfm_groups", config_groups, replace=True)
OmegaConf.register_new_resolver("vfm_usage", USAGE.__getitem__, replace=True)
