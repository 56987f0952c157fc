"""Buckets: every batch holds samples of one (num_frames, height, width), and smaller buckets get
larger batches, from one token budget (the idea of Open-Sora's bucket_config).

A video goes to the bucket whose aspect ratio is closest to its own among those it has enough
frames for (the longest such); an image goes to a one-frame bucket of the closest aspect ratio;
precomputed latents are grouped by their exact shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Bucket:
    num_frames: int
    height: int
    width: int


class BucketSet:
    def __init__(self, buckets: list[list[int]], tokens_per_batch: int, token_size: list[int]):
        if not buckets:
            raise ValueError("data.buckets is empty: give at least one [num_frames, height, width]")
        if tokens_per_batch < 1 or len(token_size) != 3 or min(token_size) < 1:
            raise ValueError("data.tokens_per_batch must be >= 1 and data.token_size three sizes >= 1")
        self.videos = sorted({Bucket(*map(int, b)) for b in buckets})
        for b in self.videos:
            if min(b.num_frames, b.height, b.width) < 1 or b.height % 2 or b.width % 2:
                raise ValueError(f"bucket {list(b.__dict__.values())}: frames >= 1, even height and width")
        self.images = sorted({Bucket(1, b.height, b.width) for b in self.videos})
        self.tokens_per_batch = tokens_per_batch
        self.token_size = tuple(token_size)

    def tokens(self, b: Bucket) -> int:
        t, h, w = self.token_size
        return math.ceil(b.num_frames / t) * math.ceil(b.height / h) * math.ceil(b.width / w)

    def batch_size(self, b: Bucket) -> int:
        return max(1, self.tokens_per_batch // self.tokens(b))

    @staticmethod
    def _closest(options: list[Bucket], width: int, height: int) -> Bucket:
        aspect = math.log(width / height)
        return min(options, key=lambda b: (abs(math.log(b.width / b.height) - aspect), -b.num_frames))

    def for_video(self, width: int, height: int, frames_available: int) -> Bucket | None:
        """The bucket for a clip that yields `frames_available` frames at the sampling rate."""
        fits = [b for b in self.videos if b.num_frames <= frames_available]
        return self._closest(fits, width, height) if fits else None

    def for_image(self, width: int, height: int) -> Bucket:
        return self._closest(self.images, width, height)
