"""Synthetic H.264 test videos whose ground truth is known by construction.

A video is a list of segments (shots). Each segment draws one coloured shape on a plain background,
moving in one direction or standing still, optionally near-black or with burned-in text; a segment
starts after a hard cut or a fade through black. `write_corpus` writes a fixed set of feature videos
(cuts, a fade, a static shot, a near-black shot, burned-in text) plus any number of single-shot
shape videos, and `ground_truth.json` beside them. Everything is drawn from the seed.

    python -m curator.synth OUT_DIR [--seed 0] [--num-shape-videos 8]
"""

from __future__ import annotations

import argparse
import json
import os
import random
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import av
import numpy as np
from PIL import Image, ImageDraw, ImageFont

COLORS = {
    "red": (220, 40, 40),
    "green": (40, 200, 60),
    "blue": (60, 100, 240),
    "yellow": (240, 220, 40),
    "white": (245, 245, 245),
    "magenta": (220, 50, 210),
    "cyan": (50, 220, 230),
    "orange": (245, 140, 30),
}
BACKGROUNDS = {
    "dark blue": (15, 25, 90),
    "dark green": (15, 70, 30),
    "gray": (110, 110, 110),
    "brown": (90, 55, 25),
    "purple": (70, 20, 90),
    "teal": (0, 95, 95),
}
SHAPES = ("circle", "square", "triangle")
DIRECTIONS = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}

DEFAULT_FPS = 24
DEFAULT_SIZE = (128, 96)  # (width, height)


@dataclass(frozen=True)
class Segment:
    """One shot. `direction` None is a shape standing still."""

    num_frames: int
    shape: str
    color: str
    background: str
    direction: str | None
    text: str | None = None
    brightness: float = 1.0  # multiplies every pixel; 0.05 makes a near-black shot
    transition: str = "cut"  # how the segment begins after the previous one: "cut" or "fade"
    fade_frames: int = 0  # with "fade": frames of fade-out before and of fade-in after the boundary

    def caption(self) -> str:
        motion = f"moves {self.direction}" if self.direction else "stays still"
        article = "an" if self.color[0] in "aeiou" else "a"
        return f"{article} {self.color} {self.shape} {motion} on a {self.background} background"


def _radius(width: int, height: int) -> int:
    return max(4, min(width, height) // 8)


def _centre_path(seg: Segment, width: int, height: int) -> tuple[np.ndarray, np.ndarray]:
    """Shape centre per frame: crosses about 60% of the frame in the segment's direction."""
    if seg.direction is None:
        start = np.array([width / 2, height / 2])
        return start, start
    dx, dy = DIRECTIONS[seg.direction]
    travel = np.array([0.6 * width * dx, 0.6 * height * dy]) / 2
    centre = np.array([width / 2, height / 2])
    return centre - travel, centre + travel


def _draw(seg: Segment, i: int, width: int, height: int, font: ImageFont.ImageFont) -> np.ndarray:
    """Frame `i` of the segment, before fades: (H, W, 3) uint8."""
    img = Image.new("RGB", (width, height), BACKGROUNDS[seg.background])
    draw = ImageDraw.Draw(img)
    start, end = _centre_path(seg, width, height)
    frac = i / max(seg.num_frames - 1, 1)
    cx, cy = start + (end - start) * frac
    r = _radius(width, height)
    color = COLORS[seg.color]
    if seg.shape == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=color)
    elif seg.shape == "square":
        draw.rectangle([cx - r, cy - r, cx + r, cy + r], fill=color)
    else:
        draw.polygon([(cx, cy - r), (cx + r, cy + r), (cx - r, cy + r)], fill=color)
    if seg.text:
        x0, y0, x1, y1 = draw.textbbox((0, 0), seg.text, font=font)
        x, y = (width - (x1 - x0)) // 2 - x0, height - 4 - y1  # centred, at the bottom
        draw.rectangle(draw.textbbox((x, y), seg.text, font=font), fill=(0, 0, 0))
        draw.text((x, y), seg.text, font=font, fill=(255, 255, 255))
    return np.asarray(img)


def _fade_gain(segments: list[Segment], seg_index: int, i: int) -> float:
    """Brightness factor from fades through black on either side of segment `seg_index`."""
    seg = segments[seg_index]
    gain = 1.0
    if seg.transition == "fade" and i < seg.fade_frames:  # fading in
        gain = min(gain, i / seg.fade_frames)
    nxt = segments[seg_index + 1] if seg_index + 1 < len(segments) else None
    if nxt is not None and nxt.transition == "fade":
        left = seg.num_frames - 1 - i  # frames until the boundary
        if left < nxt.fade_frames:
            gain = min(gain, left / nxt.fade_frames)
    return gain


def render(segments: list[Segment], width: int, height: int):
    """Yield every frame of the video, (H, W, 3) uint8."""
    font = ImageFont.load_default(size=max(8, height // 8))
    for k, seg in enumerate(segments):
        for i in range(seg.num_frames):
            frame = _draw(seg, i, width, height, font).astype(np.float32)
            frame *= seg.brightness * _fade_gain(segments, k, i)
            yield np.clip(np.rint(frame), 0, 255).astype(np.uint8)


def ground_truth(segments: list[Segment], fps: float, width: int, height: int) -> dict:
    """What the video contains, in frames of decode order."""
    shots, cuts, fades, text = [], [], [], []
    start = 0
    for seg in segments:
        end = start + seg.num_frames
        if start > 0 and seg.transition == "cut":
            cuts.append(start)
        if start > 0 and seg.transition == "fade":
            fades.append({"start_frame": start - seg.fade_frames, "end_frame": start + seg.fade_frames,
                          "boundary": start})
        if seg.text:
            text.append({"start_frame": start, "end_frame": end, "text": seg.text})
        p0, p1 = _centre_path(seg, width, height)
        shots.append({
            "start_frame": start,
            "end_frame": end,
            "caption": seg.caption(),
            "start_centre": [float(v) for v in p0],
            "end_centre": [float(v) for v in p1],
            **asdict(seg),
        })
        start = end
    return {"fps": fps, "num_frames": start, "width": width, "height": height,
            "cuts": cuts, "fades": fades, "text": text, "shots": shots}


def write_video(path: str | os.PathLike, segments: list[Segment], *, fps: int = DEFAULT_FPS,
                size: tuple[int, int] = DEFAULT_SIZE, crf: int = 18) -> dict:
    """Encode the segments as H.264 yuv420p at a constant rate; returns the ground truth."""
    width, height = size
    if width % 2 or height % 2:
        raise ValueError(f"size {width}x{height}: H.264 yuv420p needs an even width and height")
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with av.open(str(tmp), mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        # cpu-independent: the same bytes on every machine (x264 picks its algorithms by the CPU's
        # instruction sets otherwise), so that a corpus and the results on it can be compared.
        stream.options = {"crf": str(crf), "preset": "veryfast", "x264-params": "cpu-independent=1"}
        for frame in render(segments, width, height):
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    os.replace(tmp, path)
    return ground_truth(segments, fps, width, height)


def random_shot(rng: random.Random, num_frames: int, previous: Segment | None = None,
                still: bool = False) -> Segment:
    """A moving (or still) shape that differs from `previous` in shape, colour and background."""
    def pick(options, avoid):
        return rng.choice([o for o in options if o != avoid])

    background = pick(sorted(BACKGROUNDS), previous and previous.background)
    return Segment(
        num_frames=num_frames,
        shape=pick(SHAPES, previous and previous.shape),
        color=pick(sorted(COLORS), previous and previous.color),
        background=background,
        direction=None if still else rng.choice(sorted(DIRECTIONS)),
    )


def _chain(rng: random.Random, lengths: list[int]) -> list[Segment]:
    segments: list[Segment] = []
    for n in lengths:
        segments.append(random_shot(rng, n, segments[-1] if segments else None))
    return segments


def feature_videos(seed: int) -> dict[str, list[Segment]]:
    """The fixed feature set: each video exercises one thing a curator must get right."""
    rng = random.Random(seed)
    cuts = _chain(rng, [30, 26, 34, 30])
    a, b = _chain(rng, [44, 44])
    fade = [a, replace(b, transition="fade", fade_frames=12)]
    still = random_shot(rng, 40, still=True)
    static = [still, random_shot(rng, 40, still)]
    lit = random_shot(rng, 40)
    dark = [replace(random_shot(rng, 40, lit), brightness=0.05), lit]
    titled = random_shot(rng, 48)
    text = [replace(titled, text="VFM NEWS 2026"), random_shot(rng, 48, titled)]
    return {"cuts": cuts, "fade": fade, "static": static, "dark": dark, "text": text}


def write_corpus(out_dir: str | os.PathLike, *, seed: int = 0, num_shape_videos: int = 0,
                 shape_video_frames: int = 48, fps: int = DEFAULT_FPS,
                 size: tuple[int, int] = DEFAULT_SIZE) -> dict:
    """Write the feature videos and `num_shape_videos` single-shot videos (each with a same-stem
    .txt caption) into `out_dir`, and `ground_truth.json` mapping file name to ground truth."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    videos = {f"{name}.mp4": segs for name, segs in feature_videos(seed).items()}
    rng = random.Random(seed + 1)
    for i in range(num_shape_videos):
        videos[f"shapes-{i:03d}.mp4"] = [random_shot(rng, shape_video_frames)]
    truth = {}
    for name, segments in videos.items():
        truth[name] = write_video(out / name, segments, fps=fps, size=size)
        if name.startswith("shapes-"):
            (out / name).with_suffix(".txt").write_text(segments[0].caption() + "\n")
    tmp = out / ".ground_truth.json.tmp"
    tmp.write_text(json.dumps({"seed": seed, "videos": truth}, indent=1))
    os.replace(tmp, out / "ground_truth.json")
    return truth


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-shape-videos", type=int, default=8)
    parser.add_argument("--fps", type=int, default=DEFAULT_FPS)
    parser.add_argument("--size", default="x".join(map(str, DEFAULT_SIZE)), help="WIDTHxHEIGHT, both even")
    args = parser.parse_args(argv)
    parts = args.size.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        parser.error(f"--size {args.size!r}: expected WIDTHxHEIGHT, e.g. 128x96")
    size = (int(parts[0]), int(parts[1]))
    truth = write_corpus(args.out_dir, seed=args.seed, num_shape_videos=args.num_shape_videos,
                         fps=args.fps, size=size)
    frames = sum(t["num_frames"] for t in truth.values())
    print(f"wrote {len(truth)} videos ({frames} frames) and ground_truth.json to {args.out_dir}")


if __name__ == "__main__":
    main()
