"""Probe, detect shots, window clips, measure, filter and transcode one source in one decoding pass.

These are separate steps in the data flow, but they share one pass over the source's frames: each
decoded frame is downscaled once for analysis and once for the output size, shot boundaries come
from the online detector a few frames later, and a clip is measured, judged and encoded as soon as
its last frame is known. Memory is bounded by a few clips' frames (the one being cut and those being
encoded), whatever the source's length.

`process_source` is the whole job for one input and never raises for bad media: the result is a
manifest record whose status says what happened.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import av
import numpy as np
from av.video.reformatter import ColorRange, Colorspace, VideoReformatter

from curator import containers, media
from curator.stages import detect, score
from curator.stages.transnet import GivenBoundaries


@dataclass
class Clip:
    key: str
    start_frame: int
    end_frame: int
    kept: bool
    reason: str | None
    scores: dict = field(default_factory=dict)
    mp4: bytes | None = None  # encoded only when kept
    mp4_file: str | None = None  # or, given a spool folder, the file it was written to
    width: int = 0
    height: int = 0
    shot_index: int = 0
    start_s: float = 0.0  # presentation times in the source
    end_s: float = 0.0
    num_frames: int = 0  # in the encoded clip, at the output rate; kept clips only

    def record(self) -> dict:
        return {"key": self.key, "start_frame": self.start_frame, "end_frame": self.end_frame,
                "kept": self.kept, "reason": self.reason}


class SpoolError(Exception):
    """An encoded clip could not be written to the spool folder (a full disk): the run's trouble,
    not the source's."""


class ClipEncoder:
    """Encodes a source's kept clips while decoding goes on: up to `workers` clips at once, each on
    one x264 thread (see media.encode_clip), so a clip's bytes never depend on `workers`. With one
    worker a clip is encoded in the caller, as soon as it is submitted. Frames held in flight are
    bounded by `workers` clips. Given `spool`, a folder, each clip's mp4 goes into a file there as
    soon as it is encoded (`Clip.mp4_file`), so that a long source's clips are never all in memory
    at once; else it stays in `Clip.mp4`."""

    def __init__(self, workers: int, fps: float, transcode, timings: dict, spool: str | None = None):
        self.workers, self.fps, self.t, self.timings = workers, fps, transcode, timings
        self.spool = Path(spool) if spool else None
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="encode") if workers > 1 else None
        self.in_flight: deque[Future] = deque()
        self.lock = threading.Lock()
        self.blocked_s = 0.0  # time the decoding loop spent encoding or waiting for encodes

    def _encode(self, clip: Clip, frames: list) -> None:
        t0 = time.perf_counter()
        mp4 = media.encode_clip(frames, self.fps, self.t.crf, self.t.preset, self.t.keyframe_interval_s)
        if self.spool is None:
            clip.mp4 = mp4
        else:
            path = self.spool / f"{clip.key}.mp4"
            try:
                self.spool.mkdir(exist_ok=True)  # made by the first clip: a source may keep none
                path.write_bytes(mp4)
            except OSError as e:
                raise SpoolError(str(e)) from e  # the driver says where: the run's spool folder
            clip.mp4_file = str(path)
        with self.lock:
            self.timings["encode_s"] += time.perf_counter() - t0

    def submit(self, clip: Clip, frames: list) -> None:
        t0 = time.perf_counter()
        if self.pool is None:
            self._encode(clip, frames)
        else:
            while len(self.in_flight) >= self.workers:
                self.in_flight.popleft().result()
            self.in_flight.append(self.pool.submit(self._encode, clip, frames))
        self.blocked_s += time.perf_counter() - t0

    def finish(self) -> None:
        """Wait for every clip; an encoder error is raised here."""
        t0 = time.perf_counter()
        while self.in_flight:
            self.in_flight.popleft().result()
        self.blocked_s += time.perf_counter() - t0

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


def encode_workers(codec_threads: int | None) -> int:
    """Clips encoded at once per source: `codec_threads`, or for 0 one per core this process may use,
    at most 4 (one decoding pass does not feed more, and each holds a clip's frames)."""
    return codec_threads or min(4, len(os.sched_getaffinity(0)))


class Timeline:
    """Each frame's presentation time made fit for clips, in decode order. Times never go back: a
    clock that restarts (recordings joined end to end, as broadcast .ts segments often are) goes on
    counting from the frame before. A jump, forward by more than `max_gap_s` (a pause in the
    recording, a camera that records on motion) or back by more than that, is a break: no clip
    spans one, or it would freeze on a frame for the gap, or play two stretches of time as one.
    At damaged frames the clock is not restarted: a jump forward is frames lost to the damage (the
    record's warning counts those), a break not told as a jump; a jump back is a stale frame that
    the decoder gives out after the loss, kept in order. (Restarting the clock there put every
    later frame of a file with a zeroed stretch seconds late.) Nor is it restarted where, within
    STALE_FRAMES of the step back, the old clock goes on past where it was: such stale frames come
    out unmarked too, where the demuxer dropped the lost data itself (a .ts stream's). They are then
    marked damaged (`stale` counts them), and the frame after them starts a clip anew: a clip that
    took one in showed a picture from a second before."""

    STALE_FRAMES = 4

    def __init__(self, fps: float):
        self.step = 1.0 / fps
        self.max_gap_s = max(0.5, 4 * self.step)  # a 0.5 fps time-lapse has 2 s between frames
        self.prev: float | None = None
        self.offset = 0.0  # added after each restart of the clock
        self.break_at: set[int] = set()  # the first frame after each break
        self.jumps = 0  # breaks of the clock's own
        self.first_break: tuple[int, float] | None = None  # (the first's frame, the jump in s)
        self.restart: tuple | None = None  # the last: (its frame, the old clock's latest time, the state before)
        self.since_restart: list[media.DecodedFrame] = []  # the frames from it on, while it may yet be undone
        self.stale = 0  # frames found stale and marked damaged

    def __call__(self, frame: media.DecodedFrame) -> None:
        """Set `frame.time_s` on this timeline."""
        raw = frame.time_s if frame.time_s is not None else frame.index * self.step
        if self.restart is not None and frame.index - self.restart[0] > self.STALE_FRAMES:
            self.restart, self.since_restart = None, []  # it stands
        if self.restart is not None and raw > self.restart[1]:  # the old clock goes on: the frames since were stale
            self.offset, self.jumps, self.first_break = self.restart[2]
            for stale in self.since_restart:
                stale.damaged = True
            self.stale += len(self.since_restart)
            self.break_at.add(frame.index)
            self.restart, self.since_restart = None, []
        elif self.restart is not None:
            self.since_restart.append(frame)
        t = raw + self.offset
        if self.prev is not None:
            jump = t - self.prev
            if jump < 0 and frame.damaged:
                jump = 0.0  # a stale frame out of the decoder after lost data: kept in order, as below
            before = (self.offset, self.jumps, self.first_break)
            if abs(jump) > self.max_gap_s:
                self.break_at.add(frame.index)
                if not frame.damaged:
                    self.jumps += 1
                    self.first_break = self.first_break or (frame.index, jump)
            if jump < -self.max_gap_s:  # the clock restarts, unless the old one goes on (see above)
                self.restart, self.since_restart = (frame.index, self.prev - self.offset, before), [frame]
                self.offset += self.prev + self.step - t
                t = self.prev + self.step
            elif t < self.prev:  # a frame a little out of order: not a break, kept in order
                t = self.prev
        frame.time_s = self.prev = t

    def warning(self) -> str | None:
        if self.first_break is None:
            return None
        index, jump = self.first_break
        return (f"the stream's clock jumps at {self.jumps} point(s), first by {jump:+.2f} s at frame "
                f"{index}: clips stop at each jump (a pause in the recording, recordings joined end to end, or "
                "frames lost from a damaged file)")


class _Splitter:
    """The online windowing state of one source; frames are pushed in decode order."""

    def __init__(self, source_id: str, fps: float, out_fps: float, cfg, framing: Framing, timings: dict,
                 encoder: ClipEncoder, rotation: int = 0):
        self.source_id, self.fps, self.out_fps, self.cfg = source_id, fps, out_fps, cfg
        self.rotation = rotation  # of the source's frames, as the probe read it (0, 90, 180 or 270)
        self.timeline = Timeline(fps)
        self.out_size, self.source_bars = framing
        self.timings, self.encoder = timings, encoder
        self.max_s = cfg.clips.max_s
        self.max_frames = max(1, round(self.max_s * fps))
        self.trim = cfg.clips.trim_frames
        self.shots: list[list[int]] = []
        self.clips: list[Clip] = []
        self.shot_start = 0
        self.cursor = 0  # first frame of the next clip; no trim at the very start of the stream
        self.fade_in = False  # the current shot starts out of a dark run: trim its dim frames
        self.in_transition = False  # the current shot is a dissolve, fade or wipe between two shots
        self.pending: deque[media.DecodedFrame] = deque()
        self.full_at: int | None = None  # the first frame after a full-length clip from pending[0]

    def push(self, frame: media.DecodedFrame, decided_upto: int) -> None:
        """Add a frame; `decided_upto`: the detector has decided every boundary at or before it."""
        if frame.index >= self.cursor:
            self.pending.append(frame)
            if self.full_at is None and self._ends_clip(frame):
                self.full_at = frame.index
        # A full-length clip can go once no boundary can still fall inside it or its trim.
        while self.full_at is not None and self.full_at + self.trim - 1 <= decided_upto:
            self._emit(self.full_at)

    def _ends_clip(self, frame: media.DecodedFrame) -> bool:
        """Whether the clip from the oldest pending frame is full at `frame`: `clips.max_s` on the
        clock from its start, which at a constant rate is `max_frames` frames on (half a frame
        early, for rounding), or a jump of the clock. Counted in frames at the mean rate, a variable
        rate source's clips came out too long where its rate drops and too short where it rises."""
        first = self.pending[0]
        return frame is not first and (frame.time_s >= first.time_s + (self.max_frames - 0.5) / self.fps
                                       or frame.index in self.timeline.break_at)

    def _find_full(self) -> None:
        """`full_at` anew, after the oldest pending frames went."""
        self.full_at = next((f.index for f in self.pending if self._ends_clip(f)), None)

    def boundary(self, b: int, tail_trim: int, dark: bool = False, transition: bool = False) -> None:
        """The shot that started at `shot_start` ends before frame `b`; `dark`: at a dark run;
        `transition`: the shot from `b` on is a transition."""
        end = b - tail_trim
        if end > self.cursor:
            self._emit(end, fade_out=dark)
        self.shots.append([self.shot_start, b])
        self.shot_start = b
        self.cursor = b + self.trim
        self.fade_in = dark
        self.in_transition = transition
        while self.pending and self.pending[0].index < self.cursor:
            self.pending.popleft()
        self._find_full()

    def _emit(self, end: int, fade_out: bool = False) -> None:
        frames = []
        while self.pending and self.pending[0].index < end:
            frames.append(self.pending.popleft())
        self._find_full()
        self.cursor = end
        if self.fade_in or fade_out:
            frames = _trim_fades(frames, self.fade_in, fade_out)
        self.fade_in = False
        # A damaged stretch of the file (see media.decoded_frames) is a clip of its own, dropped,
        # so that the undamaged frames on either side still make clips; a jump of the clock ends a
        # clip, and so does a change of the stream's shape (each shape has its own size, see
        # media.decode); and so does `clips.max_s` of time (a shot's last stretch, cut at its
        # boundary rather than by push, can run longer at a variable rate).
        runs: list[list[media.DecodedFrame]] = []
        for f in frames:
            if (runs and f.damaged == runs[-1][-1].damaged and f.index not in self.timeline.break_at
                    and _size(f) == _size(runs[-1][-1]) and f.time_s - runs[-1][0].time_s < self.max_s):
                runs[-1].append(f)
            else:
                runs.append([f])
        for run in runs:
            self._clip(run, run[0].damaged)

    def _clip(self, frames: list[media.DecodedFrame], damaged: bool) -> None:
        start, end = frames[0].index, frames[-1].index + 1
        t_start, t_last = frames[0].time_s, frames[-1].time_s  # on the Timeline
        t0 = time.perf_counter()
        short_side = self.cfg.transcode.short_side
        # A stretch of the stream in another shape than its first has a size of its own, and the
        # bars found in the source's key frames are not its own.
        size = _size(frames[0]) or self.out_size
        bars = self.source_bars if size == self.out_size else None
        crop = _Crop.of(frames, size, short_side, bars) \
            if self.cfg.transcode.crop_black_borders else _Crop(None, size, short_side)
        # Frames off the constant rate's grid by half a frame or more: a variable frame rate, or
        # a header's rate that the timestamps belie (a browser's WebM). Then only the clock tells
        # the clip's length, and frames are picked by time; else by count.
        times = np.array([f.time_s for f in frames])
        uneven = np.abs(times - t_start - np.arange(len(frames)) / self.fps).max() >= 0.5 / self.fps
        rate = (len(frames) - 1) / (t_last - t_start) if uneven and t_last > t_start else self.fps  # mean, if uneven
        small = crop(np.stack([f.small for f in frames]), 1)  # (T, h, w, 3): the picture, without bars
        scores = {**score.measure(small, rate), **crop.scores()}
        w, h = crop.width, crop.height
        if self.cfg.filters.ocr:
            middle = crop.frame(frames[len(frames) // 2].frame)
            scores["text_area"], scores["ocr_text"] = score.text_area(middle.to_ndarray(format="rgb24"))
        if self.cfg.filters.quality:
            scores["niqe"] = score.niqe_of([crop(f.luma, 0) for f in frames if f.luma is not None])
        # The last frame shows for a frame's time: the clip's mean one where uneven (the file's mean
        # is too long where the file has a pause in it), else the rate's.
        t_end = t_last + ((t_last - t_start) / (len(frames) - 1) if uneven else 1 / self.fps)
        duration = t_end - t_start if uneven else len(frames) / self.fps
        reason = score.filter_reason(scores, duration, len(frames), w, h, self.cfg.clips, self.cfg.filters,
                                     _detail(frames[0], size, crop, self.rotation))
        stretched = sum(f.stretched for f in frames)
        if damaged:
            reason = "damaged: decoded from a corrupt stretch of the source (lost or concealed data)"
        elif self.in_transition:
            reason = "transition: frames of a dissolve, fade or wipe between two shots"
        elif reason is None and stretched:
            reason = (f"size_change: {stretched} of its {len(frames)} frames are of another shape than the "
                      f"source's first frame, and would be stretched")
        self.timings["score_s"] += time.perf_counter() - t0
        clip = Clip(f"{self.source_id}-{len(self.clips):04d}", start, end, reason is None, reason, scores,
                    width=w, height=h, shot_index=len(self.shots), start_s=round(t_start, 4),
                    end_s=round(t_end, 4))
        if clip.kept:
            # Uneven frames are picked by their times, so that the clip plays at the speed it was
            # filmed at; at the mean rate frame after frame, the stretches filmed at a higher rate
            # played slowed down, those at a lower rate sped up.
            picks = resample_times(times, t_end, self.out_fps) if uneven \
                else resample(len(frames), self.fps, self.out_fps)
            clip.num_frames = len(picks)
            self.encoder.submit(clip, [crop.frame(frames[i].frame) for i in picks])
        self.clips.append(clip)


def _detail(frame: media.DecodedFrame, size: tuple[int, int], crop: _Crop, rotation: int) -> tuple[int, int]:
    """(w, h): how many of the source's stored pixels lie across and down a clip's picture, at most
    the clip's size. A source stored at a pixel aspect far from 1 is stretched along one axis to its
    shown size: one stored 16x1024 at 150:1 is shown 2400x1024, and its clips, 600x256, hold 16
    columns of picture. `frame`: the clip's first; `size`: its transcode frames' (w, h)."""
    sw, sh = frame.stored_size
    if rotation in (90, 270):
        sw, sh = sh, sw
    return (min(crop.width, max(1, round(crop.picture[0] * sw / size[0]))),
            min(crop.height, max(1, round(crop.picture[1] * sh / size[1]))))


def _ratio(x) -> str:
    """A Fraction as width:height ("16:15")."""
    return f"{x.numerator}:{x.denominator}"


def _size(frame: media.DecodedFrame) -> tuple[int, int] | None:
    """(w, h) of a frame's transcode frame, None where it has none."""
    return (frame.frame.width, frame.frame.height) if frame.frame is not None else None


BORDER_SAMPLES = 8  # frames of a clip, evenly spread from its first to its last, to look for black borders in
OVERSIZE = 1.1  # a clip's picture with a short side larger than this times transcode.short_side is scaled down to it
# A stream that decodes this much (seconds, and share) shorter than its header states gets a warning.
CUT_SHORT_S, CUT_SHORT_SHARE = 1.0, 0.1


class _Crop:
    """A clip's black borders (top, bottom, left, right; None when not looked for), in lines of its
    transcode frames of `size` (w, h): cut off those frames and, scaled, off its frames at other
    sizes. Scaled, a border is rounded up, so that no bar is left in the analysis frames to darken
    the clip's scores. (`width`, `height`): the clip's size, that of its picture, scaled down to
    `short_side` where it is larger by more than OVERSIZE: a clip that does not show the bars its
    source was scaled for (see transcode_framing) comes out at the short side of every other clip."""

    def __init__(self, borders: tuple[int, int, int, int] | None, size: tuple[int, int], short_side: int):
        self.borders, self.size = borders, size
        top, bottom, left, right = borders or (0, 0, 0, 0)
        self.any = any(borders or ())
        self.picture = size[0] - left - right, size[1] - top - bottom
        self.width, self.height = self.picture
        self.scaler = None  # one for all the clip's frames: its setup costs more than a frame's scaling
        if min(self.picture) > OVERSIZE * short_side:
            self.width, self.height = media.even_size(*self.picture, short_side)
            self.scaler = VideoReformatter()

    @classmethod
    def of(cls, frames: list[media.DecodedFrame], size: tuple[int, int], short_side: int,
           source_bars: tuple[int, int, int, int] | None = None) -> _Crop:
        """The crop of a clip's `frames`, whose source showed `source_bars` (see Framing)."""
        picks = np.linspace(0, len(frames) - 1, min(len(frames), BORDER_SAMPLES)).round().astype(int)
        lumas = [media.luma_plane(frames[i].frame) for i in picks]
        return cls(score.black_borders(lumas, source_bars), size, short_side)

    def scores(self) -> dict:
        if self.borders is None:
            return {}
        area = 1 - self.picture[0] * self.picture[1] / (self.size[0] * self.size[1])
        return {"black_borders": list(self.borders), "border_area": round(area, 4)}

    def __call__(self, a: np.ndarray | None, axis: int) -> np.ndarray | None:
        """`a` with its axes `axis` (height) and `axis + 1` (width) cropped."""
        if a is None or not self.any:
            return a
        cut = [slice(None)] * a.ndim
        for k, (first, last, full) in enumerate(((*self.borders[:2], self.size[1]), (*self.borders[2:], self.size[0]))):
            n = a.shape[axis + k]
            lo, hi = -(-first * n // full), -(-last * n // full)  # rounded up
            if n - lo - hi < 1:
                lo, hi = first * n // full, last * n // full
            cut[axis + k] = slice(lo, n - hi)
        return a[tuple(cut)]

    def frame(self, frame: av.VideoFrame) -> av.VideoFrame:
        """A transcode frame, cropped, at the clip's size."""
        frame = media.crop_yuv420p(frame, *self.borders) if self.any else frame
        if self.scaler is None:
            return frame
        return self.scaler.reformat(frame, width=self.width, height=self.height, interpolation="AREA",
                                    src_colorspace=Colorspace.ITU601, dst_colorspace=Colorspace.ITU601,
                                    src_color_range=ColorRange.MPEG, dst_color_range=ColorRange.MPEG)


def _trim_fades(frames: list[media.DecodedFrame], head: bool, tail: bool) -> list[media.DecodedFrame]:
    """Drop the frames of a fade next to a dark run: those dimmer than 90% of the clip's median."""
    luma = np.array([f.small.mean() for f in frames])
    floor = 0.9 * np.median(luma)
    lo, hi = 0, len(frames)
    while head and lo < hi and luma[lo] < floor:
        lo += 1
    while tail and hi > lo and luma[hi - 1] < floor:
        hi -= 1
    return frames[lo:hi]


def resample(num_frames: int, fps: float, out_fps: float) -> list[int]:
    """Source frame indices that make up `num_frames` source frames played at `out_fps`."""
    if abs(fps - out_fps) < 1e-6:
        return list(range(num_frames))
    count = max(1, round(num_frames * out_fps / fps))
    return [min(num_frames - 1, int(k * fps / out_fps + 0.5)) for k in range(count)]


def resample_times(times: np.ndarray, end_s: float, out_fps: float) -> list[int]:
    """Indices of the frames shown at `times` (non-decreasing) up to `end_s` that make up the same
    stretch of time at a constant `out_fps`: for each output frame, the frame nearest its time (the
    later of two as near, as `resample` rounds)."""
    count = max(1, round((end_s - times[0]) * out_fps))
    targets = times[0] + np.arange(count) / out_fps
    after = np.searchsorted(times, targets)  # the first frame at or after each time; len(times) past the end
    before = np.maximum(after - 1, 0)
    after = np.minimum(after, len(times) - 1)
    nearer_before = targets - times[before] < times[after] - targets
    return np.where(nearer_before, before, after).tolist()


MAX_BAR_SCALE = 3.0  # at most this times the frames' short side for the picture's: 2.76:1 in a 9:16 frame


class Framing(NamedTuple):
    """How a source's frames are transcoded: at `size` (w, h), showing black `bars` (top, bottom,
    left, right) in lines at that size in its key frames, or None where they show none."""

    size: tuple[int, int]
    bars: tuple[int, int, int, int] | None = None


def transcode_framing(path: str, p: media.Probe, transcode) -> Framing:
    """The Framing of a source's frames. Their size: `transcode.short_side` on their short side,
    or on the short side of the picture inside black bars that the source shows, so that a clip
    cropped of its bars (see _Crop) keeps as many lines as one of a source without them: a 2.35:1
    film in 1080p comes out 602x256, not 456x192, and in a 9:16 phone frame not 256x106.

    Bars are looked for where the first frame's edges are black, or the middle key frame's (a
    film after a full-frame title card): in up to 8 key frames spread over the source, a seek and
    a frame's decoding each. They count where at least half of those that the source has (a short
    clip may have one) show black edges, and are the lines black in all of these. Bars misread
    cost time, not picture or size: each clip is cropped of the bars it shows itself, and one that
    shows none is scaled down to `short_side` (a stretch filmed full frame, the title card, or a
    dark key frame taken for bars). The bars come with the size, for a clip that shows one of them
    clean and only sparse text where the other would be, in every frame: subtitles through a scene
    of dialogue (see score.black_borders)."""
    size = media.even_size(p.width, p.height, transcode.short_side)
    if not transcode.crop_black_borders:
        return Framing(size)
    if not p.dark_edges:
        middle = media.sample_lumas(path, p, size, count=1)
        if not (middle and score.dark_edges(middle[0])):
            return Framing(size)
    lumas = media.sample_lumas(path, p, size)
    dark = [luma for luma in lumas if score.dark_edges(luma)]
    if not dark or 2 * len(dark) < len(lumas):
        return Framing(size)
    bars = score.black_borders(dark)
    if not any(bars):
        return Framing(size)
    top, bottom, left, right = bars
    picture_short = min(size[0] - left - right, size[1] - top - bottom)
    out = size
    if picture_short < min(size):
        scale = min(MAX_BAR_SCALE, min(size) / picture_short)
        out = media.even_size(p.width, p.height, round(transcode.short_side * scale))
    return Framing(out, (round(top * out[1] / size[1]), round(bottom * out[1] / size[1]),
                         round(left * out[0] / size[0]), round(right * out[0] / size[0])))


def _source_limits(p: media.Probe, cfg) -> str | None:
    if p.width < 2 or p.height < 2:
        return f"frame size {p.width}x{p.height} is too small to transcode"
    return None


def process_source(path: str, source_id: str, cfg, boundaries: dict | None = None,
                   spool: str | None = None) -> tuple[dict, list[Clip]]:
    """Curate one source. Returns (manifest record, clips in order). `boundaries`: the cuts and
    transitions of an earlier detection pass (transnet.detect_shots); without them the configured
    online detector finds the shots. `spool`: a folder for the kept clips' mp4 files (ClipEncoder);
    a failure to write there raises SpoolError."""
    try:
        return _process_source(path, source_id, cfg, boundaries, spool)
    finally:
        media.forget_stand_in()  # the video standing in for it (an animated WebP's), held for its passes


def _process_source(path: str, source_id: str, cfg, boundaries: dict | None,
                    spool: str | None) -> tuple[dict, list[Clip]]:
    record = {"source": path, "source_id": source_id, "status": "error", "error": None,
              "shots": [], "clips": []}
    timings = {"probe_s": 0.0, "decode_detect_s": 0.0, "score_s": 0.0, "encode_s": 0.0}
    record["timings"] = timings
    t0 = time.perf_counter()
    try:
        p = media.probe(path)
    except media.MediaError as e:
        record["error"] = str(e)
        return record, []
    timings["probe_s"] = time.perf_counter() - t0
    record.update({k: v for k, v in p.to_dict().items() if k in ("fps", "num_frames", "width", "height",
                                                               "duration_s", "rotation", "codec", "vfr",
                                                               "pixel_aspect", "interlaced", "hdr",
                                                               "wide_gamut")})
    problem = _source_limits(p, cfg)
    if problem:
        record["error"] = problem
        return record, []

    out_fps = cfg.transcode.fps or p.filmed_fps
    framing = transcode_framing(path, p, cfg.transcode)
    detector = GivenBoundaries(**boundaries) if boundaries is not None \
        else detect.build_detector(cfg.detector, p.fps, p.filmed_fps)
    encoder = ClipEncoder(encode_workers(cfg.get("codec_threads")), out_fps, cfg.transcode, timings, spool)
    try:
        return _split(path, p, cfg, detector,
                      _Splitter(source_id, p.fps, out_fps, cfg, framing, timings, encoder, p.rotation), record)
    finally:
        encoder.close()


def _split(path: str, p: media.Probe, cfg, detector, splitter: _Splitter, record: dict) -> tuple[dict, list[Clip]]:
    """The decoding pass of process_source."""
    timings, encoder = record["timings"], splitter.encoder
    splitter.in_transition = 0 in detector.transition_starts  # a fade in from the first frame
    small_size = media.analysis_size(p.width, p.height, cfg.detector.get("analysis_width", 64))
    lookahead = getattr(detector, "lookahead", 0)  # frames its decisions lag behind
    n = 0
    times: list[float] = []
    warnings = []
    size, aspect = None, None
    damage = media.Damage()
    t_loop = time.perf_counter()
    try:
        # A quality score is measured on one frame a second, at more detail than the transcode size.
        quality_every = max(1, round(p.fps)) if cfg.filters.quality else 0
        for frame in media.decode(path, p, small_size, splitter.out_size, threads=cfg.get("codec_threads") or 0,
                                  damage=damage, quality_every=quality_every, short_side=cfg.transcode.short_side):
            n = frame.index + 1
            splitter.timeline(frame)
            times.append(frame.time_s)
            if frame.stored_size != size:
                if size is not None:
                    warnings.append(f"frame size changed from {size[0]}x{size[1]} to "
                                    f"{frame.stored_size[0]}x{frame.stored_size[1]} at frame {frame.index}")
                size = frame.stored_size
            elif frame.pixel_aspect != aspect and aspect is not None:
                warnings.append(f"pixel aspect changed from {_ratio(aspect)} to {_ratio(frame.pixel_aspect)} at "
                                f"frame {frame.index}")
            aspect = frame.pixel_aspect
            for b in detector.push(frame.small, frame.damaged):
                splitter.boundary(b, splitter.trim, b in detector.dark_boundaries, b in detector.transition_starts)
            splitter.push(frame, frame.index - lookahead)
    except media.TruncatedStream as e:
        warnings.append(str(e))
    except media.MediaError as e:
        record["error"] = str(e)
        return record, []
    damage.damaged_frames += splitter.timeline.stale
    warnings += [w for w in (splitter.timeline.warning(), damage.summary()) if w]
    given = getattr(detector, "frames", None)
    if given is not None and given != n:
        warnings.append(f"the detection pass decoded {given} frames and this pass {n}: its shot boundaries may be "
                        "off by the difference")
    for b in detector.flush():
        splitter.boundary(b, splitter.trim, b in detector.dark_boundaries, b in detector.transition_starts)
    if n == 0:
        record["error"] = "no decodable video frame"
        return record, []
    splitter.boundary(n, 0)
    encoder.finish()
    timings["decode_detect_s"] = time.perf_counter() - t_loop - timings["score_s"] - encoder.blocked_s

    cuts = getattr(detector, "scene_cuts", [s for s, _ in splitter.shots[1:]])
    if p.stated_rotation is not None:
        warnings.append(f"the stream asks to be turned by {p.stated_rotation} degrees, not a right angle: its frames "
                        f"are turned by the nearest one, {p.rotation}")
    # As decoded, like num_frames: a header can lack a duration (a live WebM) or overstate it (a cut download).
    record["duration_s"] = round(times[-1] + 1 / p.fps, 4)
    if p.stated_s and record["duration_s"] < p.stated_s - max(CUT_SHORT_S, CUT_SHORT_SHARE * p.stated_s):
        # Often without any decoding error: the demuxer finds the end of the file where the
        # header said frames would be (a Matroska file cut in two, an MP4 index pointing past the end).
        warnings.append(f"decoding ended at {record['duration_s']:.2f} s of the {p.stated_s:.2f} s the header "
                        "states: the file may be cut short (an interrupted download or copy)")
    elif inside := (containers.ends_inside(path, read_as_is=media.stand_in(path) is None)
                    or ("a frame of the video" if damage.ends_in_a_frame else None)):
        # a format that states no duration, or one the cut did not reach; an MPEG-TS cut between two of
        # its packets, amid a frame's data
        warnings.append(f"the file ends inside {inside}: it was cut short (an interrupted download or copy), and "
                        "what came after is lost")
    record.update({"status": "ok", "num_frames": n, "warning": "; ".join(warnings) or None, "shots": splitter.shots,
                   "scene_cuts": cuts, "scene_cuts_s": [round(times[c], 4) for c in cuts if c < len(times)],
                   "clips": [c.record() for c in splitter.clips],
                   "out_width": splitter.out_size[0], "out_height": splitter.out_size[1], "out_fps": splitter.out_fps})
    return record, splitter.clips
