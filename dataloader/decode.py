"""Decoding samples to float tensors in [-1, 1], (C, T, H, W), at a bucket's size.

Videos: only the frames needed are decoded (decord), at the cover size when decord can resize
while decoding; for the sizes where it cannot, frames are resized after decoding. Then a crop to
the bucket: random for training, centred for evaluation. Images are one-frame videos.
"""

from __future__ import annotations

import io
import math
import random

import av
import decord
import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

decord.bridge.set_bridge("native")


class SampleError(Exception):
    """This sample cannot be decoded; the loader skips and counts it."""


def frame_indices(available: int, src_fps: float, num_frames: int, target_fps: float | None, stride: int,
                  rng: random.Random | None) -> list[int] | None:
    """`num_frames` indices at `target_fps` (or every `stride`-th frame), a random window when
    `rng` is given, else the centre one; None when the clip is too short."""
    step = src_fps / target_fps if target_fps else float(stride)
    span = (num_frames - 1) * step + 1
    if span > available + 1e-6:
        return None
    slack = available - span
    start = rng.uniform(0, slack) if rng is not None else slack / 2
    return [min(available - 1, int(start + i * step + 0.5)) for i in range(num_frames)]


def frames_at_rate(available: int, src_fps: float, target_fps: float | None, stride: int) -> int:
    """How many frames a clip of `available` source frames gives at the sampling rate."""
    step = src_fps / target_fps if target_fps else float(stride)
    return int((available - 1) // step) + 1 if available else 0


def cover_size(src_w: int, src_h: int, width: int, height: int) -> tuple[int, int]:
    """The smallest size with the source's aspect ratio that covers (width, height)."""
    s = max(width / src_w, height / src_h)
    return max(width, math.ceil(src_w * s)), max(height, math.ceil(src_h * s))


def _crop(x: torch.Tensor, height: int, width: int, rng: random.Random | None) -> torch.Tensor:
    """(..., H', W') -> (..., height, width)."""
    h, w = x.shape[-2:]
    top = rng.randint(0, h - height) if rng is not None else (h - height) // 2
    left = rng.randint(0, w - width) if rng is not None else (w - width) // 2
    return x[..., top:top + height, left:left + width]


def _to_tensor(frames: np.ndarray) -> torch.Tensor:
    """(T, H, W, 3) uint8 -> (3, T, H, W) float in [-1, 1]."""
    return torch.from_numpy(np.ascontiguousarray(frames)).permute(3, 0, 1, 2).float().div_(127.5).sub_(1.0)


def _resize(x: torch.Tensor, width: int, height: int) -> torch.Tensor:
    """(3, T, H, W) -> (3, T, height, width), antialiased."""
    if x.shape[-2:] == (height, width):
        return x
    y = F.interpolate(x.transpose(0, 1), size=(height, width), mode="bilinear", antialias=True, align_corners=False)
    return y.transpose(0, 1)


def _pyav_frames(data: bytes, indices_for) -> torch.Tensor:
    """decord's job done by PyAV: every frame decoded (clips are short), then the chosen ones."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        decoded = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
        fps = float(stream.average_rate or 0)
    indices = indices_for(len(decoded), fps)
    if not indices:
        raise SampleError("the clip has too few frames for its bucket")
    return _to_tensor(np.stack([decoded[i] for i in indices]))


def decode_video(data: bytes, src_size: tuple[int, int] | None, indices_for, width: int, height: int,
                 rng: random.Random | None) -> torch.Tensor:
    """(3, T, height, width). `src_size`: the clip's (width, height) from its metadata, so the clip
    is opened once, already at the cover size; None opens it once more to find out.
    `indices_for(num_frames, fps)` picks the frames once the clip is open."""
    def frames(vr) -> torch.Tensor:
        indices = indices_for(len(vr), vr.get_avg_fps())
        if not indices:
            raise SampleError("the clip has too few frames for its bucket")
        return _to_tensor(vr.get_batch(indices).asnumpy())

    errors = (decord.DECORDError, RuntimeError, IndexError)  # decord raises RuntimeError for bad input
    try:
        if src_size is None:
            src_size = tuple(reversed(decord.VideoReader(io.BytesIO(data), num_threads=1)[0].shape[:2]))
        cw, ch = cover_size(*src_size, width, height)
        try:
            x = frames(decord.VideoReader(io.BytesIO(data), width=cw, height=ch, num_threads=1))
        except errors:
            # decord cannot scale to some sizes while decoding (e.g. 48x27), nor copy out frames of
            # some widths at all (e.g. 48x32): scale after decoding, with PyAV if decord fails.
            # Decided per sample, never remembered: a sample must decode the same way in any
            # process and after any history, or a resumed run would differ from an uninterrupted one.
            try:
                x = frames(decord.VideoReader(io.BytesIO(data), num_threads=1))
            except errors:
                x = _pyav_frames(data, indices_for)
            x = _resize(x, cw, ch)
    except (*errors, av.error.FFmpegError) as e:
        raise SampleError(f"cannot decode video: {str(e).splitlines()[0][:200] if str(e) else type(e).__name__}") from e
    if x.shape[-2:] != (ch, cw):
        x = _resize(x, cw, ch)
    return _crop(x, height, width, rng)


def decode_image(data: bytes, width: int, height: int, rng: random.Random | None) -> torch.Tensor:
    """(3, 1, height, width)."""
    try:
        img = Image.open(io.BytesIO(data)).convert("RGB")
    except (OSError, ValueError) as e:
        raise SampleError(f"cannot decode image: {e}") from e
    cw, ch = cover_size(img.width, img.height, width, height)
    img = img.resize((cw, ch), Image.BILINEAR, reducing_gap=2.0)
    return _crop(_to_tensor(np.asarray(img)[None]), height, width, rng)
