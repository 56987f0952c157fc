"""Shared fixtures. tests/ is not a package (see pyproject: --import-mode=importlib)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from curator import synth


@pytest.fixture(scope="session")
def synth_corpus(tmp_path_factory) -> tuple[Path, dict]:
    """The generator's default corpus plus two single-shot videos, written once per session."""
    out = tmp_path_factory.mktemp("synth")
    synth.write_corpus(out, seed=0, num_shape_videos=2)
    return out, json.loads((out / "ground_truth.json").read_text())["videos"]
