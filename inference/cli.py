"""`vfm-sample` and `vfm-serve` (see inference/sample.py and inference/server.py): each checks its
arguments before it imports torch, the model and the pipeline (seconds), so that a command missing
one says so at once."""

from __future__ import annotations

import sys
import warnings

import hydra
from omegaconf import DictConfig

import conf.schema  # noqa: F401  (registers the structured configs)


@hydra.main(config_path="pkg://conf", config_name="sample", version_base="1.3")
def _sample(cfg: DictConfig) -> None:
    conf.require(cfg, "sample", ["checkpoint", "prompt", "output"])
    from inference.sample import sample

    code = sample(cfg)
    if code:
        sys.exit(code)


@hydra.main(config_path="pkg://conf", config_name="serve", version_base="1.3")
def _serve(cfg: DictConfig) -> None:
    conf.require(cfg, "serve", ["checkpoint"])
    from inference.server import serve

    code = serve(cfg)
    if code:
        sys.exit(code)


def sample_main() -> None:
    # torch 2.10+ deprecates slicing flattened axes (mesh["dp"]) for a later release; it works now.
    warnings.filterwarnings("ignore", message="Slicing a flattened dim")
    _sample()


def serve_main() -> None:
    warnings.filterwarnings("ignore", message="Slicing a flattened dim")
    _serve()
