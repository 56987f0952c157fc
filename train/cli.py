"""`vfm-train run_dir=<dir> data.shards=<curated dir> [key=value ...]` (see train/main.py) and `vfm-encode
input=<curated dir> output=<dir>` (see train/encode.py): each checks its arguments before it imports
torch, the model and its libraries (seconds), so that a command missing one, or a training run set up
so that it cannot work (train/validate.py), says so at once."""

from __future__ import annotations

import os
import sys
import warnings

import hydra
from omegaconf import DictConfig

import conf.schema  # noqa: F401  (registers the structured configs)


@hydra.main(config_path="pkg://conf", config_name="train", version_base="1.3")
def _app(cfg: DictConfig) -> None:
    conf.require(cfg, "train", ["run_dir", "data.shards"])
    from train.validate import validate

    try:  # each rank alike (torchrun's WORLD_SIZE), as the trainer would, but before seconds of imports
        validate(cfg, int(os.environ.get("WORLD_SIZE", "1")))
    except (ValueError, FileNotFoundError) as e:
        print(f"vfm-train: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
    from train.main import run  # torch, the model and its libraries: seconds to import, after the checks

    code = run(cfg)
    if code:
        sys.exit(code)


@hydra.main(config_path="pkg://conf", config_name="encode", version_base="1.3")
def _encode(cfg: DictConfig) -> None:
    conf.require(cfg, "encode", ["input", "output"])
    from curator.pipeline import ClusterError
    from train.encode import encode

    try:
        encode(cfg)
    except (FileNotFoundError, ValueError, ClusterError) as e:
        sys.exit(f"vfm-encode: {e}")


def encode_main() -> None:
    _encode()


def main() -> None:
    # torch 2.10+ deprecates slicing flattened axes (mesh["dp"]) for a later release; it works now.
    warnings.filterwarnings("ignore", message="Slicing a flattened dim")
    _app()


if __name__ == "__main__":
    main()
