"""Shot boundary detection on small analysis frames, online: frames go in one at a time and shot
boundaries come out a few frames later, so detection rides along the single decoding pass.

The adaptive detector scores each frame by its colour difference to the previous one, and calls a
cut where that score stands out against its neighbours' mean (the idea of PySceneDetect's
AdaptiveDetector): a camera pan raises every score around it, a cut raises one. A run of dark
frames (a fade through black, or a black gap) becomes a shot of its own, so that the frames around
a fade are not glued to either side.
"""

from __future__ import annotations

from collections import deque

import numpy as np

# Mean luma (0..255) below which a frame counts as dark for fade/gap detection.
DARK_LUMA = 12.0
LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)


def frame_features(small: np.ndarray) -> tuple[np.ndarray, float]:
    """(h, w, 3) uint8 RGB -> (float32 image, mean luma)."""
    f = small.astype(np.float32)
    return f, float(f.reshape(-1, 3).mean(0) @ LUMA)


class AdaptiveDetector:
    """Online cut detection. `push(frame)` returns the boundaries (frame indices where a new shot
    starts) decided so far; `flush()` returns the rest at the end of the stream."""

    def __init__(self, threshold: float = 3.0, min_content: float = 15.0, window: int = 2,
                 min_shot_frames: int = 8, dark_luma: float = DARK_LUMA):
        if threshold <= 1:
            raise ValueError(f"threshold={threshold}: the ratio to the neighbours' mean must be > 1")
        if window < 1:
            raise ValueError(f"window={window}: need at least one neighbour on each side")
        if min_shot_frames < 1:
            raise ValueError(f"min_shot_frames={min_shot_frames}: must be >= 1")
        self.threshold, self.min_content, self.window = threshold, min_content, window
        self.min_shot_frames, self.dark_luma = min_shot_frames, dark_luma
        self._prev: np.ndarray | None = None
        self._scores: deque[tuple[int, float]] = deque()  # (frame index, score) awaiting a decision
        self._index = -1
        self._last_cut = 0
        self._dark_start: int | None = None
        self._prev_dark = False
        self.scores: list[float] = []  # every frame's content score, for diagnostics
        self.dark_boundaries: set[int] = set()  # boundaries that enter or leave a dark run (fades)

    def _decide(self, out: list[int]) -> None:
        """Decide the frame `window` frames back, now that its neighbours on both sides are known."""
        w = self.window
        i, score = self._scores[w]
        neighbours = [s for k, (_, s) in enumerate(self._scores) if k != w]
        mean = max(sum(neighbours) / len(neighbours), 1e-3)
        if (score >= self.min_content and score / mean >= self.threshold
                and i - self._last_cut >= self.min_shot_frames):
            self._cut(i, out)
        self._scores.popleft()

    def _cut(self, i: int, out: list[int]) -> None:
        if i > 0 and (not out or out[-1] != i) and i != self._last_cut:
            out.append(i)
            self._last_cut = i

    def push(self, small: np.ndarray) -> list[int]:
        f, luma = frame_features(small)
        self._index += 1
        i = self._index
        out: list[int] = []
        score = 0.0 if self._prev is None else float(np.abs(f - self._prev).mean())
        self._prev = f
        self.scores.append(score)

        dark = luma < self.dark_luma
        if dark != self._prev_dark and i > 0:
            # Entering or leaving a dark run is a boundary whatever the content score says.
            self._flush_scores(out)
            self._cut(i, out)
            self.dark_boundaries.add(i)
        self._prev_dark = dark

        self._scores.append((i, score))
        if len(self._scores) == 2 * self.window + 1:
            self._decide(out)
        return out

    def _flush_scores(self, out: list[int]) -> None:
        """Decide pending frames with the neighbours they have (at a forced boundary or the end)."""
        while len(self._scores) > self.window:
            w = min(self.window, len(self._scores) - 1)
            i, score = self._scores[w] if len(self._scores) > w else self._scores[-1]
            rest = [s for k, (_, s) in enumerate(self._scores) if k != w]
            mean = max(sum(rest) / len(rest), 1e-3) if rest else 1e-3
            if (score >= self.min_content and score / mean >= self.threshold
                    and i - self._last_cut >= self.min_shot_frames):
                self._cut(i, out)
            self._scores.popleft()
        self._scores.clear()

    def flush(self) -> list[int]:
        out: list[int] = []
        self._flush_scores(out)
        return out


class FixedDetector:
    """No detection: a boundary every `window_frames` frames."""

    def __init__(self, window_frames: int):
        if window_frames < 1:
            raise ValueError(f"window of {window_frames} frames: must be at least 1 frame")
        self.window_frames = window_frames
        self._index = -1
        self.dark_boundaries: set[int] = set()

    def push(self, small: np.ndarray) -> list[int]:
        self._index += 1
        i = self._index
        return [i] if i > 0 and i % self.window_frames == 0 else []

    def flush(self) -> list[int]:
        return []


def build_detector(cfg, fps: float):
    """The online detector a `detector` config group option names."""
    if cfg.name == "adaptive":
        return AdaptiveDetector(cfg.threshold, cfg.min_content, cfg.window, cfg.min_shot_frames)
    if cfg.name == "fixed":
        if cfg.window_s <= 0:
            raise ValueError(f"detector.window_s={cfg.window_s}: must be > 0 seconds")
        return FixedDetector(max(1, round(cfg.window_s * fps)))
    raise ValueError(f"detector={cfg.name!r} has no online detector; available: adaptive, fixed")
