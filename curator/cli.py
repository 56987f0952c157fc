"""`vfm-curate input=<videos> output=<dir> [key=value ...]`: see curator/pipeline.py."""

from __future__ import annotations

import signal
import sys

import hydra
from omegaconf import DictConfig

import conf.schema  # noqa: F401  (registers the structured configs)
from curator import tolerant_stdio
from curator.pipeline import Stopped, main_from_config


def _stop(signum, frame) -> None:
    raise Stopped


@hydra.main(config_path="pkg://conf", config_name="curate", version_base="1.3")
def _app(cfg: DictConfig) -> None:
    conf.require(cfg, "curate", ["input", "output"])
    signal.signal(signal.SIGTERM, _stop)  # a scheduler's stop cleans up as Ctrl-C does, rather than dying mid-write
    code = main_from_config(cfg)
    if code:
        sys.exit(code)


def main() -> None:
    tolerant_stdio()
    _app()


if __name__ == "__main__":
    main()
