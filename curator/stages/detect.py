"""Shot boundary detection on small analysis frames, online: frames go in one at a time and shot
boundaries come out a few frames later, so detection rides along the single decoding pass.

The adaptive detector scores each frame by its colour difference to the previous one, and calls a
cut where that score stands out against its neighbours' mean (the idea of PySceneDetect's
AdaptiveDetector): a camera pan raises every score around it, a cut raises one. A shaken camera
raises them all as a pan does, but each frame moves its own way: a change that does not stand out is
weighed again with the shake taken out (see STEADY_CONTENT), and so is a flickering light's change
(see LIGHT_CORR); a change of light alone, a lamp switched on, is no cut. Frames that repeat
the one before (a frame rate raised by repeating frames, a drawing held on twos or threes, also
under a film's grain) are no neighbours. A flash (a camera flash,
lightning, a white frame) raises the scores into and out of it as much as a cut, but the picture
after it is the picture before it again: a change that comes back within a few frames is no cut. A
run of dark frames (a fade through black, or a black gap) becomes a shot of its own, so that the
frames around a fade are not glued to either side, and so does a dissolve whose frames are blends of
the pictures at its ends (see DISSOLVE_BLEND), as a transition. A short run of frames decoded from a
corrupt stretch of the file is passed over: the frame after it is compared with the frame before it.
"""

from __future__ import annotations

import bisect
import functools

import numpy as np

# A frame is dark, part of a fade through black or a black gap, where its mean luma (0..255) is under
# DARK_LUMA and it shows next to nothing: its spread (see frame_features) is under DARK_SPREAD, or its
# mean is under BLACK_LUMA (black but for a few specks, as in a title's gap). A run goes on while they
# hold at DARK_STAY times those: a dim picture whose mean or spread is near them entered and left a run
# at every other frame. The darkest frames of fades spread 0 to 2.2, a black gap 0.5; a dim shot (a
# night scene, an underexposed phone video) shows its picture at a low mean: bikes.mp4 at 15% of its
# contrast spreads 3.4 and more at means of 8 to 12. Taken for dark by its mean alone, each time such
# a shot's mean crossed DARK_LUMA was a shot boundary (9 false ones in those 10 s), and no cut was
# looked for inside the run.
DARK_LUMA, DARK_SPREAD, BLACK_LUMA, DARK_STAY = 12.0, 3.0, 3.0, 1.5
SPREAD_BLOCK = 4  # pixels (of the analysis frame) a side of a block of frame_features' spread
# `min_content` holds as given where the brighter of a frame and the one before it has a mean luma of
# CONTENT_LUMA or more; below, in proportion to that luma (down to MIN_CONTENT_SHARE of it). A dim
# picture's changes are as dim: bikes.mp4's cuts score 46 to 83, and at 15% of its contrast 8 to 14,
# so that a fixed 15 found none of them. Not within `decide_after` frames of a dark frame, though,
# where a fade into or out of black is: its steps, held on threes under grain, or at a low rate,
# stood out as cuts (in the music video's fade to black, in the bench's lines).
CONTENT_LUMA, MIN_CONTENT_SHARE = 64.0, 0.2
LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)
# A shaken camera (held while running, on a vehicle) moves the picture a new way at each frame, so
# every frame's score is high, and a cut among them stood out less than `threshold` times: the
# bench's footage shaken by random offsets of up to 2% and 4% of its width lost 39% and 74% of its
# cuts (PySceneDetect's AdaptiveDetector 61% and 80%). Where a change does not stand out, each frame
# of the test is scored again against the frame before it moved by the shift that lays one on the
# other best (phase correlation: see _steady), which takes a shake out and leaves a cut as it was;
# with those scores, 2 of their 138 cuts were lost at each, and no frame more taken for a cut. A frame found so must
# change by STEADY_CONTENT times the content a cut needs (see _min_content_at): at 1, pictures held
# on threes under grain (the bench's line) had 2 false cuts more, which changed by 15.1 and 15.3.
STEADY_CONTENT = 1.5
# A flickering light (an old film's exposure from frame to frame, a lamp on mains power filmed at a
# shutter out of step with it, a camera's exposure hunting) changes every frame's brightness its own
# way, as a shake moves it: cuts stood out too little, and a frame whose light jumped more than its
# neighbours' stood out as a cut (as did a light switched on or off). The change with the light taken
# out (see relit_change) compares a frame with the one before at the gain and offset that fit it
# best, where the two correlate by LIGHT_CORR or more: one picture in two lights (0.96 for bikes.mp4
# darkened or brightened by 30% from one frame on), where frames either side of a cut correlated by
# 0.72 at most (218 cuts of the bench's footage, median 0.10). A cut must stand out with the shake
# and the light taken out as well as without.
LIGHT_CORR = 0.8


# Brighter than this in a channel (0..255), a pixel shows picture rather than a black bar.
BAR_LEVEL = 24
# A change of picture is a flash, not a cut, where a frame before it and a frame after it, around at
# most `flash_frames` frames, differ by less than this times the change. That ratio, at 64 pixels
# wide, was 0.91 or more at each of 131 cuts (bikes.mp4's, PySceneDetect's clips', 117 spliced
# ones), and 0.03 to 0.38 at flashes of 1 to 3 frames (+90 levels or white, still and fast motion).
FLASH_RATIO = 0.6
# A frame that differs from the one before by less than this (mean levels at 64 pixels wide)
# repeats it. A frame rate raised by repeating frames (24 fps film in a 60 fps file: repeats 2, 3,
# 2, 3 times) leaves one such frame or two between moving ones; counted as neighbours, their zeros
# made fast motion stand out as cuts. Repeats measured 0.0 to 0.1 there.
REPEAT_SCORE = 0.5
# A frame whose change is under this share of the largest change of a frame near it (within `near`
# frames on its own side, the frame being decided left out) holds the picture before it too, in
# noise: a drawing held for 3 frames of a film scan, or filmed off a screen, changes by its grain
# alone (1 to 2 levels, where a frame that moves changes by 5 to 20). Counted as neighbours, such
# frames made each moving frame stand out as a cut: 6 in bikes.mp4 on threes under grain of 8
# levels, 10 under 20.
HOLD_SHARE = 0.25
# Past `near` frames, a frame's neighbours that move are looked for over exact repeats alone, where
# each picture is shown for up to this many frames: a 5 fps camera's recording in a 30 fps file, or a
# slideshow of 4 pictures a second at 25. Taken as neighbours, the repeats' zeros made each change of
# picture a cut: 336 in the music video with each picture shown 4 times, 515 with each shown 6 times.
# Longer runs of repeats are a still shot (a freeze frame), whose frames are the neighbours.
MAX_HOLD = 6
# `threshold` holds as given at this rate and above. Below it, frames are further apart in time, and
# motion between neighbours scores higher against a cut: at 12.5 fps (every 2nd frame of a 25 fps
# music video) its cuts stood 2.0 to 3.0 times above their neighbours where at 25 fps they stood 3
# or more, and a fixed 3.0 missed 11 of 130, at 8.3 fps 33. The ratio needed goes down towards 1 with
# the square root of the rate: there 3 and 10 missed, no frame of motion taken for a cut more (in
# spliced films of bikes.mp4's and testvideo.mp4's shots at those rates, none either). Where pictures
# are held for some frames (a cartoon on threes), the rate is the one at which they change.
FULL_RATE_FPS = 24.0
# A run of up to this many frames decoded from a corrupt stretch of the file (see
# media.decoded_frames) is passed over: its frames start no shot and are no neighbours, and the frame
# after them is scored against the frame before them (and as a neighbour, that score over the frames it
# spans: motion between frames 2 apart scored 1.7 to 1.9 times that between neighbours in bikes.mp4's
# shots). An intra-only codec's damaged frame (MJPEG: a
# band of blocks in a shifted colour) is such a run; scored as it was, it raised its neighbours so
# that a cut beside it stood 1.7 times above them (bit-flipped MJPEG of bikes.mp4, cut 76). A longer
# run, in a codec that predicts frames from others (H.264: until its next intra frame), mostly shows
# the picture with a smear in it, and cuts inside it are found as ever.
MAX_PASSED = 3
# A dissolve (a cross-fade) from one shot to the next: the frames between its ends are blends of them.
# Over a window of DISSOLVE_FRAMES frames (at 25 fps, in proportion at others), from frame s to
# frame e: the two ends differ by DISSOLVE_CHANGE or more (mean gray levels, on every other pixel of
# the analysis frames), are not the same picture (their correlation is under DISSOLVE_CORR: a light
# dimming, a focus pull; and their change is not mostly of brightness, DISSOLVE_LIGHT), both show
# something and neither is dark (a fade through black is a dark run), and the
# middle frame differs from the mean of the ends by under DISSOLVE_BLEND times their difference. A
# cut inside the window puts the middle frame at one end, 0.5 times; motion moves it away from both,
# 0.35 and more (the smallest of the music video's and bikes.mp4's windows, and 0.48 in
# PySceneDetect's clips; 0.39 and more where it also goes one way, DISSOLVE_BACK), where dissolves
# of 6 to 24 frames between bikes.mp4's still shots came to 0.07 to 0.16, between its moving ones
# up to 0.27, and the dissolve in PySceneDetect's testvideo.mp4 to 0.06 (the only one found in all
# that footage, and in bigbuckbunny.mp4: frames 528 to 559, checked by eye). A dissolve between shots in
# fast motion (0.3 to 0.4) is not told from motion, and stays inside a shot. Windows that fit and
# overlap are one dissolve, whose blended frames make a shot of their own (see _take_dissolve).
DISSOLVE_FRAMES = (6, 10, 16, 24, 32)
DISSOLVE_CHANGE, DISSOLVE_CORR, DISSOLVE_BLEND = 10.0, 0.6, 0.27
# A dissolve goes one way, from one end to the other: no frame of it goes back further than this share
# of the way from the furthest one before it (see _way_back). Motion that brings the middle frame near
# the mean of the ends goes back and forth: 0.10 to 0.15 in the music video's four windows whose
# middle came nearest (0.36 to 0.39); the bench's dissolves went back 0.05 at most.
DISSOLVE_BACK = 0.1
DISSOLVE_SHOWS = 2.0  # an end whose gray varies less than this (a standard deviation) shows nothing (score.SHOWS)
# Ends whose means differ by more than this share of their change changed mostly in brightness: a fade
# out or in (in smoke/media/fade.mp4 the share was 0.97 and more), a light switched on; no dissolve.
DISSOLVE_LIGHT = 0.9


def frame_features(small: np.ndarray) -> tuple[np.ndarray, float, float]:
    """(h, w, 3) uint8 RGB -> (float32 image, mean luma, spread: the standard deviation of the luma
    over blocks of SPREAD_BLOCK pixels, where a film's grain or a sensor's noise averages out and a
    picture's shapes do not)."""
    f = small.astype(np.float32)
    gray = f @ LUMA  # (h, w)
    b = SPREAD_BLOCK if min(gray.shape) >= SPREAD_BLOCK else 1
    h, w = gray.shape[0] // b, gray.shape[1] // b
    blocks = gray[:h * b, :w * b].reshape(h, b, w, b).mean((1, 3))  # (h, w) whole blocks
    return f, float(gray.mean()), float(blocks.std())


@functools.cache
def _hann(h: int, w: int) -> np.ndarray:
    """(h, w) float32: a Hann window for _spectrum."""
    return np.outer(np.hanning(h), np.hanning(w)).astype(np.float32)


def phase_correlation(spectra_a: np.ndarray, spectra_b: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """(..., h, w): the phase correlation of views of `shape` (h, w) from their spectra (rfft2 over
    the last two axes); its peak lies at the shift (dy, dx) that moves a onto b, wrapped around."""
    cross = spectra_b * np.conj(spectra_a)
    return np.fft.irfft2(cross / np.maximum(np.abs(cross), 1e-6), s=shape, axes=(-2, -1))


def shifted_change(a: np.ndarray, spectrum_a: np.ndarray, b: np.ndarray, spectrum_b: np.ndarray) -> float:
    """Frame b's difference to frame a ((h, w, 3) float32 each, with the spectra of their luma) moved by
    the whole-pixel shift at the peak of their phase correlation, over the part both show; inf where
    there is no such shift (none, or more than a quarter of the frame)."""
    h, w = a.shape[:2]
    if min(h, w) < 8:
        return np.inf
    corr = phase_correlation(spectrum_a, spectrum_b, (h, w))  # (h, w)
    dy, dx = np.unravel_index(int(corr.argmax()), corr.shape)
    dy, dx = (dy - h if dy > h // 2 else dy), (dx - w if dx > w // 2 else dx)
    if not 0 < abs(dx) + abs(dy) or abs(dx) > w // 4 or abs(dy) > h // 4:
        return np.inf
    moved = b[max(0, dy):h + min(0, dy), max(0, dx):w + min(0, dx)]  # the part both show
    before = a[max(0, -dy):h + min(0, -dy), max(0, -dx):w + min(0, -dx)]
    return float(np.abs(moved - before).mean())


def relit_change(a: np.ndarray, b: np.ndarray) -> float:
    """Frame b's difference to frame a ((h, w, 3) float32 each) with the change of light taken out (see
    LIGHT_CORR): to frame a at the gain and offset (one for all three channels) that lay it on frame b
    best (least squares); inf where the two correlate by less than LIGHT_CORR (not one picture in two
    lights)."""
    a, b = a - a.mean(), b - b.mean()  # (h, w, 3) each
    cov, var_a, var_b = float((a * b).mean()), float((a * a).mean()), float((b * b).mean())
    if not cov > 0 or cov < LIGHT_CORR * np.sqrt(var_a * var_b):  # (a plain frame fits any at gain 0)
        return np.inf
    return float(np.abs(b - cov / var_a * a).mean())


class PictureBox:
    """The part of a stream's analysis frames that has shown picture so far: from the first to the
    last row, and column, in which some frame had a pixel brighter than a black bar. Letterbox and
    pillarbox bars (three quarters of a 9:16 phone frame round a wide film) lie outside it, and a
    frame's content score and luma are taken inside it, so that bars do not thin them out below
    the detector's thresholds. The whole frame until some frame shows anything; it only grows, and
    once it is the whole frame it costs nothing more."""

    def __init__(self):
        self.rows: np.ndarray | None = None  # (h,) bool: rows that have shown picture
        self.cols: np.ndarray | None = None  # (w,)
        self.box = (slice(None), slice(None))
        self.whole = False

    def __call__(self, small: np.ndarray) -> tuple[slice, slice]:
        """Take in a (h, w, 3) frame; the box (rows, columns) to measure it and the frame before in."""
        if self.whole:
            return self.box
        bright = small.max(-1) > BAR_LEVEL  # (h, w)
        rows, cols = bright.any(1), bright.any(0)
        self.rows = rows if self.rows is None else self.rows | rows
        self.cols = cols if self.cols is None else self.cols | cols
        if self.rows.any():
            r, c = np.flatnonzero(self.rows), np.flatnonzero(self.cols)
            self.box = (slice(r[0], r[-1] + 1), slice(c[0], c[-1] + 1))
            self.whole = self.rows[[0, -1]].all() and self.cols[[0, -1]].all()
        return self.box


def flash_end(frame, i: int, flash_frames: int, change: float) -> int | None:
    """The first frame after a flash that frame i goes into or comes out of, or None: a frame
    before i and a frame from i on, with at most `flash_frames` frames between them and frame i or
    i - 1 among those, that are nearly the same picture (they differ by less than FLASH_RATIO times
    `change`, frame i's difference to the frame before). At a cut no frame after it is the picture
    before it. `frame(index)`: that (h, w, 3) frame, or None where it is not at hand."""
    limit = FLASH_RATIO * change
    for before in range(max(0, i - 1 - flash_frames), i):
        for after in range(max(i, before + 2), min(i + flash_frames, before + flash_frames + 1) + 1):
            a, b = frame(before), frame(after)
            if a is not None and b is not None and np.abs(a.astype(np.float32) - b).mean() < limit:
                return after
    return None


class AdaptiveDetector:
    """Online cut detection. `push(frame)` returns the shot boundaries (frame indices where a new
    shot starts) decided so far; `flush()` returns the rest at the end of the stream.

    Besides shot boundaries, `scene_cuts` lists where a new scene starts in PySceneDetect's sense,
    for comparing with it: hard cuts, hard cuts into and out of black, and the first frame of
    content rising out of a dark run that a fade out began (fade out, black, fade in). A fade out
    into black starts nothing, nor does the fade in after a hard cut to black (that cut did).
    A cut closer than `min_shot_frames` to the one before is no scene cut (as PySceneDetect's
    min_scene_len has it), but it is a shot boundary: the frames between are a shot of their own,
    too short to keep, rather than the first frames of the next shot's clip.
    """

    def __init__(self, threshold: float = 3.0, min_content: float = 15.0, window: int = 2,
                 min_shot_frames: int = 8, dark_luma: float = DARK_LUMA, flash_frames: int = 3,
                 fps: float = FULL_RATE_FPS, find_dissolves: bool = False):
        if threshold <= 1:
            raise ValueError(f"threshold={threshold}: the ratio to the neighbours' mean must be > 1")
        if window < 1:
            raise ValueError(f"window={window}: need at least one neighbour on each side")
        if min_shot_frames < 1:
            raise ValueError(f"min_shot_frames={min_shot_frames}: must be >= 1")
        if flash_frames < 0:
            raise ValueError(f"flash_frames={flash_frames}: must be >= 0 (0: no flash is told from a cut)")
        self.threshold, self.min_content, self.window = threshold, min_content, window
        # The ratio needed between neighbours with the full window at this rate (FULL_RATE_FPS).
        self.fps = fps
        self.rate_threshold = self._threshold_for(fps)
        self.min_shot_frames, self.dark_luma, self.flash_frames = min_shot_frames, dark_luma, flash_frames
        # Frames near a frame that a hold (see _holds) is weighed against, on each side.
        self.near = max(window, flash_frames)
        # Frames after a frame that its decision waits for: its neighbours that move, past pictures
        # held for up to MAX_HOLD frames, and a flash's end.
        self.decide_after = max(self.near, window * MAX_HOLD)
        # Dissolves: the windows' lengths at this rate. One is decided once no window that overlaps
        # it can come (the longest window on), and may then start up to twice that far back: a
        # boundary goes out (push) that far behind the stream, so that boundaries go out in order.
        self.dissolve_frames = sorted({max(4, 2 * round(n * fps / FULL_RATE_FPS / 2)) for n in DISSOLVE_FRAMES}) \
            if find_dissolves else []
        longest = max(self.dissolve_frames, default=0)
        self.lookahead = self.decide_after + (2 * longest + 2 if find_dissolves else 0)  # frames a boundary lags
        self._grays: dict[int, np.ndarray] = {}  # index -> gray of every other pixel of its analysis frame
        self._gray_from = 0  # the oldest frame _grays may still hold
        self._dissolve: tuple[int, int] | None = None  # (s, e): the longest window of a dissolve found so far
        self._out: list[int] = []  # boundaries decided, not yet gone out
        self.dissolves: list[list[int]] = []  # [first, end) frames of each dissolve found
        self.scores: list[float] = []  # content score of every frame (0 for the first, and a damaged one)
        self.damaged: set[int] = set()  # short runs of damaged frames, passed over (see MAX_PASSED)
        self.spans: dict[int, int] = {}  # the frame after such a run -> the frames its score spans
        self._broken: list[int] = []  # the damaged frames since the last frame that was not
        self._good: np.ndarray | None = None  # the last frame that was not damaged
        self.lumas: list[float] = []
        self.dark: list[bool] = []  # whether each frame is dark (see DARK_LUMA), as a run has it
        self.dark_boundaries: set[int] = set()  # boundaries that enter or leave a dark run
        self.transition_starts: set[int] = set()  # shots that are a transition: dissolves (see DISSOLVE_BLEND)
        self.scene_cuts: list[int] = []
        self._prev: np.ndarray | None = None
        # index -> (h, w, 3) uint8: the frames a flash test or a neighbour's _steady may need
        self._recent: dict[int, np.ndarray] = {}
        self._steadies: dict[int, float] = {}  # index -> _steady, as far as it was needed
        self._spectra: dict[int, tuple] = {}  # index -> (box, frame, spectrum): see _spectrum
        self._keep = 2 * self.decide_after + self.flash_frames + 2  # frames of _recent kept
        self._flash_end = 0  # the first frame after the last flash found
        self._box = PictureBox()
        self._next = 1  # the next frame to decide; frame 0 starts the first shot anyway
        # A source may start anywhere in a shot (a recording cut out of a longer one), so its first
        # cut can come at any frame: the frames before it are a shot of their own, too short to keep.
        self._last_cut = -min_shot_frames
        self._dark_start: int | None = None
        self._dark_entered_by_cut = False

    def _threshold_for(self, fps: float) -> float:
        """The ratio a change needs with the full window, where pictures change `fps` times a second."""
        return 1 + (self.threshold - 1) * min(1.0, fps / FULL_RATE_FPS) ** 0.5 if fps > 0 else self.threshold

    def _hard(self, i: int) -> bool:
        """Whether frame i changes enough to start a shot (or to be a cut into or out of the dark,
        not a fade)."""
        return self.scores[i] >= self._min_content_at(i)

    def _min_content_at(self, i: int) -> float:
        """The change frame i needs to start a shot: `min_content`, less in a dim picture
        (CONTENT_LUMA) but near a dark frame."""
        light = max(self.lumas[i], self.lumas[i - 1])
        if light >= CONTENT_LUMA or self._near_dark(i):
            return self.min_content
        return self.min_content * max(MIN_CONTENT_SHARE, light / CONTENT_LUMA)

    def _near_dark(self, i: int) -> bool:
        """Whether frame i is near a dark frame (see CONTENT_LUMA), where a fade into or out of black is."""
        return any(self.dark[max(0, i - self.decide_after):i + self.decide_after + 1])

    def _neighbours(self, i: int, step: int) -> list[int]:
        """Frame i's neighbours on one side (step -1 or +1): the `window` nearest frames that do not
        hold the picture before them (see _holds) within `near` frames, and past those, only over
        exact repeats of pictures held for up to MAX_HOLD frames; where that side has none, its
        `window` nearest frames as they are (a still shot). Frame 0 has no score."""
        raw = [x for x in range(i + step, i + step * (self.window + 1), step)
               if 0 < x < len(self.scores) and x not in self.damaged]
        moving, x, exact, repeats = [], i + step, True, 0
        while len(moving) < self.window and abs(x - i) <= self.decide_after and 0 < x < len(self.scores):
            if x in self.damaged:
                x += step
                continue
            repeats = repeats + 1 if self.scores[x] < REPEAT_SCORE else 0  # exact repeats in a row, to x
            if abs(x - i) <= self.near:
                if not self._holds(x, i):
                    moving.append(x)
                exact = exact and self.scores[x] < REPEAT_SCORE
            elif not exact or repeats >= MAX_HOLD:  # a still shot, not a picture held
                break
            elif not repeats:  # past `near`, over exact repeats of a picture held only
                moving.append(x)
            x += step
        return moving or raw

    def _holds(self, x: int, i: int) -> bool:
        """Whether frame x, a neighbour of frame i, repeats the picture before it, exactly or but for
        noise (REPEAT_SCORE, HOLD_SHARE). It is weighed against the frames near it on its own side
        of i only: across a cut out of fast motion into a still shot, the still shot's first frames
        are no holds."""
        end = min(len(self.scores), x + self.near + 1, i + self.near + 1)  # as far as a decision `near` on sees
        lo, hi = (max(1, x - self.near), i) if x < i else (i + 1, end)
        near = [self.scores[y] for y in range(lo, hi) if y != x and y not in self.damaged]
        return self.scores[x] < max(REPEAT_SCORE, HOLD_SHARE * max(near, default=0.0))

    def _is_cut(self, i: int) -> bool:
        if not self._hard(i):
            return False
        sides = (self._neighbours(i, -1), self._neighbours(i, +1))
        threshold = self._threshold_at(i, sides)
        # It stands out as it is, or it changes enough with the shake or light taken out; and it
        # stands out with them taken out (a change of light alone does not).
        stands_out = (self._stands_out(i, sides, self.scores.__getitem__) >= threshold
                      or self._steady(i) >= STEADY_CONTENT * self._min_content_at(i)) \
            and self._stands_out(i, sides, self._steady) >= threshold
        return stands_out and not self._flash_at(i, in_any_light=True)

    def _stands_out(self, i: int, sides: tuple[list[int], list[int]], score) -> float:
        """Frame i's `score(i)` over the mean of its neighbours' (`sides`), each over the frames it spans."""
        near = [score(x) / self.spans.get(x, 1) for side in sides for x in side]  # change a frame
        return score(i) / max(sum(near) / max(len(near), 1), 1e-3)

    def _steady(self, i: int) -> float:
        """Frame i's score with the camera's shake or a flickering light taken out (see STEADY_CONTENT
        and LIGHT_CORR): the least of its score, its change over the shift that lays the frame before
        on it best (shifted_change), and its change with the light's change taken out (relit_change).
        Its score where there is no frame before to compare: the frame after a passed-over damaged
        run, frames of another size."""
        if i not in self._steadies:
            score = self.scores[i]
            if i - 1 in self._recent and i in self._recent and i not in self.spans:
                (a, sa), (b, sb) = self._spectrum(i - 1), self._spectrum(i)
                if a.shape == b.shape:
                    score = min(score, shifted_change(a, sa, b, sb), relit_change(a, b))
            self._steadies[i] = score
        return self._steadies[i]

    def _spectrum(self, x: int) -> tuple[np.ndarray, np.ndarray]:
        """Frame x inside the picture box, as (h, w, 3) float32 and as the spectrum of its luma under
        a Hann window (its edges, which do not move with the picture, would pull a shift to none)."""
        box = self._box.box
        if x not in self._spectra or self._spectra[x][0] != box:
            f = self._recent[x][box].astype(np.float32)
            gray = f @ LUMA
            self._spectra[x] = (box, f, np.fft.rfft2((gray - gray.mean()) * _hann(*gray.shape)))
        return self._spectra[x][1:]

    def _threshold_at(self, i: int, sides: tuple[list[int], list[int]]) -> float:
        """The ratio a change at frame i needs: `rate_threshold` (`threshold` at 24 fps and above,
        less below; see FULL_RATE_FPS), or where its neighbours that move lie some frames apart
        (`sides`, its neighbours before and after it; pictures held, see _holds), the ratio at the
        rate the pictures change. Next to the stream's first frame (which has no score) and, once
        the stream has ended (flush), its last, a side has fewer than `window` neighbours, and those
        left are the ones most like the cut's own frame: beside a cut out of or into fast motion,
        only the moving shot's frames. There the ratio needed goes down towards 1 with the share of
        neighbours missing: a source cut from a longer one a frame off a cut (clips split by another
        tool) began or ended a clip with another shot's frame, whose change was 2.1 to 2.6 times its
        neighbours' mean. Wrong there, a boundary costs a clip a frame or two at the stream's edge.
        Not for a change that is all brightness, though (the score less the change of mean luma
        under `min_content`): a camera's exposure settling in its first frames, which its neighbours
        cannot tell from a cut."""
        present = min(i - 1, self.window) + min(len(self.scores) - 1 - i, self.window)
        if present >= 2 * self.window:
            # Pictures held for some frames (a cartoon on threes) change at a lower rate than the stream:
            # the k-th neighbour that moves, k frames off at the stream's rate, lies k * spacing off.
            gaps = [self._apart(i, x) / k for side in sides for k, x in enumerate(side, 1)]
            spacing = sum(gaps) / len(gaps)
            return self._threshold_for(self.fps / spacing) if spacing > 1 else self.rate_threshold
        if self.scores[i] - abs(self.lumas[i] - self.lumas[i - 1]) < self.min_content:
            return self.threshold
        return min(1 + (self.threshold - 1) * present / (2 * self.window), self.rate_threshold)

    def _apart(self, i: int, x: int) -> int:
        """Frames from frame i to frame x, the damaged ones between not counted."""
        lo, hi = min(i, x), max(i, x)
        return hi - lo - sum(y in self.damaged for y in range(lo + 1, hi))

    def _flash_at(self, i: int, in_any_light: bool = False) -> bool:
        """Whether the change at frame i goes into or out of a flash (see flash_end); the frames up
        to the flash's end start no shot. `in_any_light`: only where it is a flash too with each
        frame's mean level taken out (see LIGHT_CORR), where the change is a cut's so too: in a
        flickering light a cut's change is the cut's and the light's, and frames either side of it
        came nearer than FLASH_RATIO of that."""
        box = self._box.box

        def frame(x: int) -> np.ndarray | None:
            return self._recent[x][box] if x in self._recent else None

        def centred(x: int) -> np.ndarray | None:  # (h, w, 3) float32, less its mean level
            f = frame(x)
            return None if f is None else f.astype(np.float32) - f.mean()

        end = flash_end(frame, i, self.flash_frames, self.scores[i])
        if end is not None and in_any_light and i - 1 in self._recent and i in self._recent:
            change = float(np.abs(centred(i) - centred(i - 1)).mean())
            if change >= self._min_content_at(i):  # (less: a change mostly of light, a flash as it is)
                end = flash_end(centred, i, self.flash_frames, change)
        if end is None:
            return False
        self._flash_end = max(self._flash_end, end)
        return True

    def _decide_upto(self, last: int, out: list[int]) -> None:
        """Decide frames in order up to `last`: each starts a shot, or not; no frame of a flash does."""
        while self._next <= last:
            if self._next >= self._flash_end:
                self._decide(self._next, out)
            self._next += 1

    def _decide(self, i: int, out: list[int]) -> None:
        if i in self.damaged:
            return
        in_run = self._dark_start is not None
        dark = self.dark[i]
        hard = self._hard(i)
        # Lightning in a night scene leaves a dark run for a frame or two, and a black frame in a
        # bright shot (a capture's dropped frame) enters one: flashes, not edges of a run.
        if dark != in_run and not (hard and self._flash_at(i)):
            self._dark_edge(i, out)
        elif not in_run and self._is_cut(i):
            out.append(i)
            if i - self._last_cut >= self.min_shot_frames:
                self.scene_cuts.append(i)
                self._last_cut = i

    def _dark_edge(self, i: int, out: list[int]) -> None:
        """Frame i enters or leaves a dark run: a shot boundary whatever the content score says."""
        hard = self._hard(i)
        if self._dark_start is None:  # entering
            self._dark_start, self._dark_entered_by_cut = i, hard
            if hard:
                self.scene_cuts.append(i)
        else:
            if hard:
                self.scene_cuts.append(i)
            elif not self._dark_entered_by_cut:
                # The new scene starts where its fade in lifts off the run's black floor.
                floor = min(self.lumas[self._dark_start:i])
                k = i
                while k - 1 > self._dark_start and self.lumas[k - 1] > floor + 1.0:
                    k -= 1
                self.scene_cuts.append(k)
            self._dark_start = None
        out.append(i)
        self.dark_boundaries.add(i)
        self._last_cut = i

    def push(self, small: np.ndarray, damaged: bool = False) -> list[int]:
        """Take in the next (h, w, 3) frame; the shot boundaries decided since the last push.
        `damaged`: decoded from a corrupt stretch of the file (see media.decoded_frames)."""
        i = len(self.scores)
        self._recent.pop(i - self._keep, None)  # older than any test needs
        self._steadies.pop(i - self._keep, None)
        self._spectra.pop(i - self._keep, None)
        box = self._box(small)
        f, luma, spread = frame_features(small[box])
        self.scores.append(0.0 if self._prev is None else float(np.abs(f - self._prev[box]).mean()))
        self.lumas.append(luma)
        stay = DARK_STAY if self.dark and self.dark[-1] else 1.0  # a run goes on at a little more
        self.dark.append(luma < self.dark_luma * stay and (spread < DARK_SPREAD * stay or luma < BLACK_LUMA * stay))
        if damaged:
            self._broken.append(i)
        elif self._broken:
            if len(self._broken) <= MAX_PASSED and self._good is not None:
                self._pass_over(i, f, box)
            self._broken = []
        self._prev = small  # uint8: the next frame's box can be larger
        self._good = self._good if damaged else small
        self._recent[i] = small
        if i == 0 and self.dark[0]:  # the stream opens in the dark: frame 0 has started the first scene
            self._dark_start, self._dark_entered_by_cut = 0, True
        self._decide_upto(i - self.decide_after, self._out)
        if self.dissolve_frames:
            if not damaged:
                self._grays[i] = small[::2, ::2] @ LUMA  # (h / 2, w / 2) float32, rounded up
            # The oldest frame that a dissolve taken from now on looks at (see _take_dissolve).
            oldest = i - 2 * self.dissolve_frames[-1] - 2 - self.dissolve_frames[0]
            if self._dissolve is not None:
                oldest = min(oldest, self._dissolve[0] - self.dissolve_frames[0])
            while self._gray_from < oldest:
                self._grays.pop(self._gray_from, None)
                self._gray_from += 1
            self._look_for_dissolve(i)
        return self._release(i - self.lookahead)

    def _release(self, upto: int) -> list[int]:
        """The boundaries decided at or before frame `upto`, in order; none inside a dissolve."""
        self._out.sort()
        k = bisect.bisect_right(self._out, upto)
        gone, self._out = self._out[:k], self._out[k:]
        return [b for b in dict.fromkeys(gone) if not any(a < b < e for a, e in self.dissolves[-4:])]

    def _look_for_dissolve(self, i: int) -> None:
        """Try the windows that end at frame i (every other frame: a dissolve spans more) for a
        dissolve (see DISSOLVE_BLEND), and take the one found before once none can overlap it."""
        if self._dissolve is not None and i - self._dissolve[1] > self.dissolve_frames[-1]:
            self._take_dissolve()
        if i % 2 or i not in self._grays:
            return
        ns = [n for n in self.dissolve_frames if i - n in self._grays and i - n // 2 in self._grays]
        if not ns:
            return
        end = self._grays[i]  # (h, w)
        starts = np.stack([self._grays[i - n] for n in ns])  # (k, h, w)
        change = np.abs(starts - end).mean((1, 2))  # (k,)
        if change.max() < DISSOLVE_CHANGE:
            return
        middles = np.stack([self._grays[i - n // 2] for n in ns])  # (k, h, w)
        blend = np.abs(middles - (starts + end) / 2).mean((1, 2))  # (k,)
        fits = (change >= DISSOLVE_CHANGE) & (blend < DISSOLVE_BLEND * change)
        if not fits.any():  # motion, as nearly always: no need to look further
            return
        e_mean, e_std = end.mean(), end.std()
        for k in np.flatnonzero(fits):  # ends that show something, are not dark, and are not the same picture
            s_mean, s_std = starts[k].mean(), starts[k].std()
            if min(s_mean, e_mean) < self.dark_luma or min(s_std, e_std) < DISSOLVE_SHOWS or \
                    abs(s_mean - e_mean) > DISSOLVE_LIGHT * change[k] or \
                    float(((starts[k] - s_mean) * (end - e_mean)).mean()) >= DISSOLVE_CORR * s_std * e_std or \
                    self._way_back(i - ns[k], i) > DISSOLVE_BACK:
                fits[k] = False
        if not fits.any():
            return
        n = max(n for n, ok in zip(ns, fits, strict=True) if ok)  # the longest: its ends the likeliest outside it
        if self._dissolve is not None and i - n > self._dissolve[1]:  # no overlap: that one is done
            self._take_dissolve()
        # The windows that fit, overlapping, together: their outer ends the likeliest outside it.
        self._dissolve = (i - n, i) if self._dissolve is None else (min(self._dissolve[0], i - n), i)

    def _ways(self, s: int, e: int) -> tuple[list[int], np.ndarray]:
        """The frames between s and e at hand, and each one's way from frame s to frame e: its change
        from frame s projected onto the change from s to e (0 at s, 1 at e)."""
        start = self._grays[s]
        change = (self._grays[e] - start).ravel()
        frames = [t for t in range(s + 1, e) if t in self._grays]
        way = np.array([float((self._grays[t] - start).ravel() @ change) for t in frames]) / float(change @ change)
        return frames, way  # (frames,)

    def _way_back(self, s: int, e: int) -> float:
        """How far the frames from s to e go back on their way from frame s to frame e, at most (see
        _ways): the largest fall of a frame's way below the highest before it."""
        _, way = self._ways(s, e)
        return float((np.maximum.accumulate(way) - way).max()) if len(way) else 0.0

    def _take_dissolve(self) -> None:
        """A dissolve, found in the windows from frame s to frame e: the frames that are on the way
        from one side of it to the other make a shot of their own, a transition, and a boundary
        decided inside it goes. The sides are frames s and e, each moved out by the shortest
        window's length where those frames are at hand (a window's end can lie inside a dissolve
        longer than the window, or in its first or last blends); a frame's way is its change from
        the first side projected onto the change from side to side (0 at the one, 1 at the other).
        The transition runs from the first frame past 5% of the way to the last short of 95%, and
        a frame either side."""
        s, e = self._dissolve
        self._dissolve = None
        out = self.dissolve_frames[0]
        s = next(t for t in range(s - out, s + 1) if t in self._grays)
        e = next(t for t in range(e + out, e - 1, -1) if t in self._grays)
        frames, way = self._ways(s, e)
        inside = [t for t, w in zip(frames, way, strict=True) if 0.05 < w < 0.95]
        if not inside:
            return
        first, end = max(0, inside[0] - 1), inside[-1] + 2
        if self.dissolves and first <= self.dissolves[-1][1]:  # the one before runs into it: one transition
            self.dissolves[-1][1] = max(self.dissolves[-1][1], end)  # (its old end no longer goes out: _release)
        else:
            self.dissolves.append([first, end])
            self.transition_starts.add(first)
            self._out.append(first)
        self._out.append(end)

    def _pass_over(self, i: int, f: np.ndarray, box: tuple[slice, slice]) -> None:
        """Frame i follows a short run of damaged frames (see MAX_PASSED), none decided yet: they
        start no shot and are no neighbours, and frame i is scored against the frame before them."""
        if len(self.damaged) > 4 * self.decide_after:  # those no decision looks at any more
            self.damaged = {y for y in self.damaged if y > self._next - 2 * self.decide_after}
            self.spans = {y: n for y, n in self.spans.items() if y > self._next - 2 * self.decide_after}
        before = self._broken[0] - 1
        for y in self._broken:
            self.damaged.add(y)
            self.scores[y], self.lumas[y], self.dark[y] = 0.0, self.lumas[before], self.dark[before]  # no dark edge
            self._recent.pop(y, None)
        self.scores[i] = float(np.abs(f - self._good[box]).mean())
        self.spans[i] = len(self._broken) + 1  # as a neighbour, its change counts for each frame it spans

    def flush(self) -> list[int]:
        self._decide_upto(len(self.scores) - 1, self._out)
        if self._dissolve is not None:
            self._take_dissolve()
        return self._release(len(self.scores))


class FixedDetector:
    """No detection: a boundary every `window_frames` frames."""

    def __init__(self, window_frames: int):
        if window_frames < 1:
            raise ValueError(f"window of {window_frames} frames: must be at least 1 frame")
        self.window_frames = window_frames
        self._index = -1
        self.dark_boundaries: set[int] = set()
        self.transition_starts: set[int] = set()

    def push(self, small: np.ndarray, damaged: bool = False) -> list[int]:
        self._index += 1
        i = self._index
        return [i] if i > 0 and i % self.window_frames == 0 else []

    def flush(self) -> list[int]:
        return []


def min_shot_frames(min_shot_s: float, fps: float) -> int:
    """A detector's `min_shot_s` in frames of a source at `fps`: at least one."""
    if not min_shot_s >= 0:
        raise ValueError(f"detector.min_shot_s={min_shot_s}: must be >= 0 seconds")
    return max(1, round(min_shot_s * fps))


def flash_frames(flash_s: float, fps: float) -> int:
    """A detector's `flash_s` in frames of a source at `fps`: at least one, or 0 for 0 s."""
    if not flash_s >= 0:
        raise ValueError(f"detector.flash_s={flash_s}: must be >= 0 seconds (0: no flash is told from a cut)")
    return max(1, round(flash_s * fps)) if flash_s > 0 else 0


def build_detector(cfg, fps: float, steady_fps: float | None = None):
    """The online detector a `detector` config group option names, for a source whose frames come
    at `fps` on average and at `steady_fps` where it runs steadily (Probe.filmed_fps: a phone's
    video with a pause in it averages a fraction of the rate it was filmed at)."""
    if cfg.name == "adaptive":
        return AdaptiveDetector(cfg.threshold, cfg.min_content, cfg.window, min_shot_frames(cfg.min_shot_s, fps),
                                flash_frames=flash_frames(cfg.flash_s, fps), fps=steady_fps or fps,
                                find_dissolves=cfg.get("dissolves", True))
    if cfg.name == "fixed":
        if cfg.window_s <= 0:
            raise ValueError(f"detector.window_s={cfg.window_s}: must be > 0 seconds")
        return FixedDetector(max(1, round(cfg.window_s * fps)))
    raise ValueError(f"detector={cfg.name!r} has no online detector; available: adaptive, fixed")


def detect_file(path: str, cfg, threads: int = 0) -> dict:
    """Detection alone, one decoding pass without deblocking (analysis frames only): shot
    boundaries, scene cuts and the presentation time of each cut, and dissolves ([start, end) each)."""
    from curator import media

    p = media.probe(path)
    detector = build_detector(cfg, p.fps, p.filmed_fps)
    times: list[float | None] = []
    boundaries: list[int] = []
    small = media.analysis_size(p.width, p.height, cfg.get("analysis_width", 64))
    for frame in media.decode(path, p, small, None, fast=True, threads=threads):
        times.append(frame.time_s)
        boundaries += detector.push(frame.small, frame.damaged)
    boundaries += detector.flush()
    cuts = getattr(detector, "scene_cuts", boundaries)
    return {"source": path, "fps": p.fps, "num_frames": len(times), "vfr": p.vfr,
            "boundaries": boundaries, "scene_cuts": cuts,
            "scene_cuts_s": [times[c] if c < len(times) else None for c in cuts],
            "dissolves": getattr(detector, "dissolves", [])}


def main(argv: list[str] | None = None) -> None:
    """python -m curator.stages.detect VIDEO [VIDEO ...] [--detector adaptive|fixed] [key=value ...]"""
    import argparse
    import json
    import sys

    import conf

    parser = argparse.ArgumentParser(description="Print each video's scene cuts as one JSON line.")
    parser.add_argument("videos", nargs="+")
    parser.add_argument("--detector", default="adaptive")
    parser.add_argument("--workers", type=int, default=1, help="videos detected at once, each in its own process")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a detector field, e.g. --set threshold=2.5")
    args = parser.parse_args(argv)
    cfg = conf.compose("curate", [f"detector={args.detector}"] + [f"detector.{kv}" for kv in args.set]).detector
    results = detect_many(args.videos, cfg, args.workers)
    for r in results:
        print(json.dumps(r), flush=True)
    sys.exit(1 if any("error" in r for r in results) else 0)


def _detect_one(args) -> dict:
    path, cfg, threads = args
    try:
        return detect_file(path, cfg, threads)
    except Exception as e:  # one bad file must not stop the others; its result says why
        return {"source": path, "error": str(e)}


def detect_many(paths: list[str], cfg, workers: int = 1) -> list[dict]:
    """detect_file over many videos, `workers` at once in separate processes, results in order.
    The largest files go first (as a run takes them: discover.largest_first), so that no long video
    starts last while the other workers idle."""
    import concurrent.futures as cf

    from omegaconf import OmegaConf

    from curator.stages.discover import largest_first

    if workers <= 1:
        return [_detect_one((p, cfg, 0)) for p in paths]
    own = OmegaConf.create(OmegaConf.to_container(cfg))  # detached from the whole config it came in
    with cf.ProcessPoolExecutor(workers) as pool:
        futures = {p: pool.submit(_detect_one, (p, own, 1)) for p in largest_first(list(dict.fromkeys(paths)))}
        return [futures[p].result() for p in paths]


if __name__ == "__main__":
    main()
