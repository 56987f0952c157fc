"""Per-clip measurements from the small analysis frames, and the filters that read them.

Every measurement lands in the clip's JSON; a filter only compares a measurement to a threshold,
so a dropped clip always says which score and which limit dropped it.
"""

from __future__ import annotations

import numpy as np

from curator.stages.detect import LUMA, phase_correlation

CHANGED_LEVEL = 8.0  # a pixel moving more than this (0..255) in a channel between frames has changed
CAMERA_MOTION_AREA = 0.3  # above this fraction of the frame off the median, no one object stands apart
# A camera move (see camera_move) is judged on a PAN_CELLS x PAN_CELLS grid over the frame: at least
# PAN_AGREE of its cells must move with the picture, each a cell that changes by PAN_CHANGE or more
# (a mean luma difference, 0..255: above a codec's noise) between the frames compared. A pan slower
# than MIN_PAN_SPEED frames a second (across the frame in more than 50 s), one that moves the picture
# less than MIN_PAN_PX analysis pixels over the clip, or along a path less straight than
# MIN_PAN_STRAIGHT (its net way over its length: a hand-held camera's wander) is none.
PAN_CELLS, PAN_AGREE, PAN_CHANGE = 4, 0.5, 1.0
MIN_PAN_SPEED, MIN_PAN_PX, MIN_PAN_STRAIGHT = 0.02, 2.0, 0.6
# A zoom (see camera_zoom) grows or shrinks the picture by at least this a second, as the natural
# log of the factor (3% a second: twice the size in 23 s), and a turn turns it by at least this many
# radians a second (1.7 degrees); either moves its corners MIN_PAN_PX or more over the clip.
MIN_ZOOM_SPEED = 0.03
# Motion is measured between frames this far apart in time (the nearest whole number of frames, at
# least one), so that a scene scores the same filmed at 25, 50 or 100 fps: between neighbouring
# frames, 100 fps footage of bikes.mp4's shots scored a third of their 25 fps motion, and slow
# footage at a high rate fell under `filters.min_motion_area`. Where the frames compared lie further
# apart (below 25 fps) or nearer (30 fps), the motion score is scaled to this step by the ratio of
# the times to the power MOTION_POWER: a picture's difference grows slower than the time between.
# Over the 91 shots of 30 frames or more of the bench's footage (the music video, bikes.mp4,
# PySceneDetect's clips), every 2nd frame scored 1.71 times the motion (1.58 to 1.81 for 8 in 10),
# every 3rd 2.29 times (1.96 to 2.53): 2 and 3 to the power 0.77 and 0.75. Unscaled, a 12 fps clip
# scored about twice its 25 fps motion, and dropped as `too_shaky` twice as soon.
MOTION_STEP_S = 1 / 25
MOTION_POWER = 0.75
SHOWS = 2.0  # a frame whose luma varies less than this (a standard deviation, 0..255) shows nothing: black, a fade

# Named colours for captions: the nearest name in RGB wins.
PALETTE = {
    "black": (10, 10, 10), "white": (245, 245, 245), "gray": (128, 128, 128),
    "red": (220, 40, 40), "green": (40, 200, 60), "blue": (60, 100, 240), "yellow": (240, 220, 40),
    "magenta": (220, 50, 210), "cyan": (50, 220, 230), "orange": (245, 140, 30),
    "dark blue": (15, 25, 90), "dark green": (15, 70, 30), "brown": (90, 55, 25),
    "purple": (70, 20, 90), "teal": (0, 95, 95), "pink": (240, 160, 190), "beige": (210, 195, 160),
}
_PALETTE_NAMES = list(PALETTE)
_PALETTE_RGB = np.array([PALETTE[n] for n in _PALETTE_NAMES], dtype=np.float32)


def colour_name(rgb) -> str:
    return _PALETTE_NAMES[int(np.argmin(((_PALETTE_RGB - np.asarray(rgb, np.float32)) ** 2).sum(1)))]


def colour_grid(frame: np.ndarray, n: int = 4) -> list[int]:
    """Mean RGB of each cell of an n x n grid over a (h, w, 3) frame: 3n² values that tell colours
    apart where a luma hash cannot (the same layout in other colours). A frame with fewer than n
    rows or columns (a 2-pixel strip) shares pixels between cells rather than leaving one empty."""
    def cells(size: int) -> list[tuple[int, int]]:
        return [(min(k * size // n, size - 1), max((k + 1) * size // n, min(k * size // n, size - 1) + 1))
                for k in range(n)]

    return [int(v) for y0, y1 in cells(frame.shape[0]) for x0, x1 in cells(frame.shape[1])
            for v in frame[y0:y1, x0:x1].reshape(-1, 3).mean(0)]


def phash(gray: np.ndarray) -> int:
    """64-bit perceptual hash: signs of the 8x8 lowest DCT frequencies of a 32x32 resize."""
    h, w = gray.shape
    ys = (np.arange(32) * h / 32).astype(int)
    xs = (np.arange(32) * w / 32).astype(int)
    img = gray[ys][:, xs].astype(np.float64)
    n = np.arange(32)
    dct = np.cos(np.pi * (2 * n[None, :] + 1) * n[:, None] / 64)  # (32, 32) DCT-II basis
    coeffs = (dct @ img @ dct.T)[:8, :8].ravel()
    bits = coeffs > np.median(coeffs[1:])
    return int(sum(1 << k for k, b in enumerate(bits) if b))


def _shifts(a: np.ndarray, b: np.ndarray, window: np.ndarray) -> np.ndarray:
    """(n, 2): the (dx, dy) that moves each of n gray views `a` (n, h, w) onto the same of `b`, to a
    fraction of a pixel: phase correlation of the views under `window` (a Hann window: the views'
    edges, which do not move with the picture, would pull the peak to no shift), its peak refined
    by a parabola each way."""
    n, h, w = a.shape
    views = np.concatenate([a, b])  # (2n, h, w)
    spectra = np.fft.rfft2((views - views.mean((1, 2), keepdims=True)) * window, axes=(1, 2))
    corr = phase_correlation(spectra[:n], spectra[n:], (h, w))  # (n, h, w)
    py, px = np.divmod(corr.reshape(n, -1).argmax(1), w)  # (n,) each
    each = np.arange(n)
    peak = corr[each, py, px]

    def vertex(before: np.ndarray, after: np.ndarray) -> np.ndarray:
        curve = before - 2 * peak + after
        return np.where(curve < 0, 0.5 * (before - after) / np.minimum(curve, -1e-12), 0.0)

    dx = px + vertex(corr[each, py, (px - 1) % w], corr[each, py, (px + 1) % w])
    dy = py + vertex(corr[each, (py - 1) % h, px], corr[each, (py + 1) % h, px])
    return np.stack([np.where(dx > w / 2, dx - w, dx), np.where(dy > h / 2, dy - h, dy)], 1).astype(np.float32)


def _moved_back(b: np.ndarray, step: np.ndarray, m: int, scale: float = 1.0, turn: float = 0.0) -> np.ndarray:
    """Gray frame `b` (h, w) read where a frame before it had its inner [m:h-m, m:w-m] pixels, if the
    whole picture moved by `step` (dx, dy) pixels, grew `scale` times and turned by `turn` radians
    (clockwise on screen) about the frame's centre: bilinearly, over that inner part."""
    h, w = b.shape
    ys, xs = np.mgrid[m:h - m, m:w - m].astype(np.float32)
    cy, cx = (h - 1) / 2, (w - 1) / 2
    u, v = (xs - cx) * scale, (ys - cy) * scale
    c, s = np.cos(turn), np.sin(turn)
    yy = np.clip(cy + s * u + c * v + step[1], 0, h - 1)
    xx = np.clip(cx + c * u - s * v + step[0], 0, w - 1)
    y0, x0 = np.minimum(yy.astype(int), h - 2), np.minimum(xx.astype(int), w - 2)
    fy, fx = yy - y0, xx - x0
    top = b[y0, x0] * (1 - fx) + b[y0, x0 + 1] * fx
    bottom = b[y0 + 1, x0] * (1 - fx) + b[y0 + 1, x0 + 1] * fx
    return top * (1 - fy) + bottom * fy


def _cells(x: np.ndarray) -> np.ndarray:
    """The mean of each cell of a PAN_CELLS x PAN_CELLS grid over `x` (h, w)."""
    h, w = x.shape
    rows, cols = np.arange(PAN_CELLS) * h // PAN_CELLS, np.arange(PAN_CELLS) * w // PAN_CELLS
    sums = np.add.reduceat(np.add.reduceat(x, rows, axis=0), cols, axis=1)  # (n, n)
    return sums / np.outer(np.diff(rows, append=h), np.diff(cols, append=w))


def camera_move(gray: np.ndarray, fps: float) -> tuple[str | None, float | None]:
    """Which way the camera pans over a clip's gray analysis frames (T, h, w) shown at `fps`, and
    how fast (frames a second, see _speed): the way opposite to the one the whole picture shifts.
    (None, None) where the picture does not shift as a whole, or too little (MIN_PAN_*).

    The shift is taken between frames far enough apart that a slow pan moves the picture some
    pixels between them, and near enough that it moves less than a sixth of the frame. It counts
    where it explains the change of at least PAN_AGREE of the cells, in the mean pair: a cell that
    changes (PAN_CHANGE), and whose difference to the earlier frame, read through the shift, is
    under 0.6 of the plain one. A plain cell (sky, a wall) changes too little to count. A thing
    moving before a still background explains only its own cells; a big thing before a plain
    background can pass for a pan, as it can to an eye."""
    t, h, w = gray.shape
    if t < 2 or min(h, w) < 4 * PAN_CELLS:
        return None, None
    window = np.outer(np.hanning(h), np.hanning(w))

    def shifts(gap: int, n: int = 16) -> np.ndarray:  # (n, 2)
        first = _starts(t, gap, n)
        return _shifts(gray[first], gray[first + gap], window)

    gap = _gap(t, fps, lambda gap: np.abs(shifts(gap, 4).mean(0)).max(), min(w, h) / 6)  # under a sixth of the frame
    steps = shifts(gap)
    rate = np.median(steps, axis=0) / gap  # (dx, dy) pixels a frame; a car passing close by is an outlier
    axis = int(np.argmax(np.abs(rate) / (w, h)))
    if abs(steps[:, axis].sum()) < MIN_PAN_STRAIGHT * np.abs(steps[:, axis]).sum():
        return None, None  # one way here, another there: a hand-held camera's wander, or a shake
    speed = _speed(rate * fps, w, h, 1.0)
    m = int(np.ceil(np.abs(rate).max() * gap)) + 1  # a margin that the shift does not read past
    if speed < MIN_PAN_SPEED or np.abs(rate).max() * (t - 1) < MIN_PAN_PX or m > min(h, w) / 4:
        return None, None
    if not _explains(gray, _starts(t, gap), gap, m, rate * gap):
        return None, None
    return _direction(-rate, 0.0), speed


def camera_zoom(gray: np.ndarray, fps: float) -> tuple[str | None, str | None, float | None]:
    """Whether the camera zooms or turns over a clip's gray analysis frames (T, h, w) shown at `fps`:
    ("zoom", "in" or "out", the natural log of how many times the picture grows in a second: 0.1 is
    by 10% a second, from wide to 10x in 4 s is 0.58), or ("turn", "clockwise" or "counterclockwise",
    radians a second), the way the camera turns about its axis, opposite to the picture's way. (None,
    None, None) where the picture does neither as a whole about its centre, or too little
    (MIN_ZOOM_SPEED, MIN_PAN_PX at its corners).

    Each quarter of a frame is shifted onto the same quarter of a later frame, by phase correlation
    as camera_move does for the whole frame: a zoom moves the quarters apart (in) or together
    (out), where a pan moves them alike and a turn of the camera moves them round. A move, a growth
    and a turn are fitted to the four shifts, between frames chosen as camera_move chooses them;
    the larger of the growth and the turn counts where it goes one way over the clip, and where the
    picture moved, grown and turned so explains the change of at least PAN_AGREE of the cells, as a
    pan must."""
    t, h, w = gray.shape
    hh, hw = h // 2, w // 2
    if t < 2 or min(hh, hw) < 2 * PAN_CELLS:
        return None, None, None
    window = np.outer(np.hanning(hh), np.hanning(hw))
    cx, cy = (w - hw) / 2, (h - hh) / 2
    centres = np.array([[-cx, -cy], [cx, -cy], [-cx, cy], [cx, cy]], np.float32)  # (4, 2): the quarters', from its
    turned = centres[:, ::-1] * np.array([-1, 1], np.float32)  # (4, 2): the way each goes as the picture turns
    norm = float((centres ** 2).sum())

    def quarters(frames: np.ndarray) -> np.ndarray:  # (n, h, w) -> (n * 4, hh, hw)
        return np.stack([frames[:, :hh, :hw], frames[:, :hh, w - hw:], frames[:, h - hh:, :hw],
                         frames[:, h - hh:, w - hw:]], 1).reshape(-1, hh, hw)

    def fit(gap: int, n: int = 16) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # growth (n,), turn (n,), move (n, 2)
        first = _starts(t, gap, n)
        shifts = _shifts(quarters(gray[first]), quarters(gray[first + gap]), window).reshape(-1, 4, 2)  # (n, 4, 2)
        move = shifts.mean(1)
        rest = shifts - move[:, None]
        return (rest * centres).sum((1, 2)) / norm, (rest * turned).sum((1, 2)) / norm, move

    def moved(gap: int) -> float:  # how far the quarters move round or apart, over a few pairs
        growth, turn, _ = fit(gap, 4)
        return (abs(np.median(growth)) + abs(np.median(turn))) * np.hypot(cx, cy)

    # The quarters move less than a sixth of a quarter, over at most half the clip: a quarter's view is
    # small, and its peak can fall far off (9 pixels in one of two encodings of a slow turn, 0.05
    # radians a second over 3 s, compared over its first and last frames alone: a zoom out, too slow
    # to count, and the clip dropped as static). Pairs over half the clip are many, and a wrong peak is
    # outvoted by their median.
    gap = _gap(t, fps, moved, min(hh, hw) / 6, longest=(t - 1) // 2)
    growth, turn, move = fit(gap)
    g, r = float(np.median(growth)), float(np.median(turn))
    kind, way, it = ("zoom", "in" if g > 0 else "out", growth) if abs(g) > abs(r) else \
        ("turn", "clockwise" if r < 0 else "counterclockwise", turn)
    if abs(it.sum()) < MIN_PAN_STRAIGHT * np.abs(it).sum():
        return None, None, None  # one way here, the other there: a subject coming and going, a wobble
    speed = (abs(np.log1p(g)) if kind == "zoom" else abs(r)) / gap * fps
    corner = np.hypot(w, h) / 2
    m = int(np.ceil((abs(g) + abs(r)) * corner + np.abs(np.median(move, axis=0)).max())) + 1
    if speed < MIN_ZOOM_SPEED or speed / fps * (t - 1) * corner < MIN_PAN_PX or m > min(h, w) / 4:
        return None, None, None
    if not _explains(gray, _starts(t, gap), gap, m, np.median(move, axis=0), 1 + g, r):
        return None, None, None
    return kind, way, round(speed, 3)


def _gap(t: int, fps: float, moved, most: float, longest: int | None = None) -> int:
    """Frames between the frames compared over a clip of t frames at `fps`: 0.1 s first, which even
    a quick move leaves in view; then twice as far apart while the move, `moved(gap)` pixels grown in
    proportion, stays under `most`, so that a slow move moves some pixels; `longest` at most (the
    clip's ends, t - 1, where not given)."""
    longest = t - 1 if longest is None else max(1, min(t - 1, longest))
    gap = max(1, min(longest, round(fps / 10)))
    while gap < longest:
        further = min(longest, 2 * gap)
        if moved(gap) * further / gap > most:
            break
        gap = further
    return gap


def _starts(t: int, gap: int, n: int = 16) -> np.ndarray:
    """Up to n first frames of pairs `gap` apart, spread over a clip of t frames."""
    return np.unique(np.linspace(0, t - 1 - gap, min(n, t - gap)).round().astype(int))


def _explains(gray: np.ndarray, pairs: np.ndarray, gap: int, m: int, step: np.ndarray, scale: float = 1.0,
              turn: float = 0.0) -> bool:
    """Whether the whole picture moving by `step`, growing `scale` times and turning (see _moved_back) from
    each frame in `pairs` to the frame `gap` on explains the change of at least PAN_AGREE of the
    cells, over the pairs: a cell that changes (PAN_CHANGE), and whose difference to the earlier
    frame, read through the move, is under 0.6 of the plain one."""
    h, w = gray.shape[1:]
    agree = 0  # cells, summed over the pairs
    for a in pairs:
        before, after = gray[a][m:h - m, m:w - m], gray[a + gap][m:h - m, m:w - m]
        explained = _cells(np.abs(_moved_back(gray[a + gap], step, m, scale, turn) - before))
        plain = _cells(np.abs(after - before))
        agree += int(((plain >= PAN_CHANGE) & (explained < 0.6 * plain)).sum())
    return agree >= PAN_AGREE * PAN_CELLS ** 2 * len(pairs)


def _speed(step: np.ndarray, w: int, h: int, seconds: float) -> float:
    """How fast a move of `step` (dx, dy) pixels in `seconds` goes: frames (widths, or heights for
    an up or down move) a second."""
    return round(max(abs(float(step[0])) / w, abs(float(step[1])) / h) / max(seconds, 1e-6), 3)


def _direction(step: np.ndarray, min_px: float) -> str | None:
    dx, dy = float(step[0]), float(step[1])
    if max(abs(dx), abs(dy)) < min_px:
        return None
    if abs(dx) >= abs(dy):
        return "right" if dx > 0 else "left"
    return "down" if dy > 0 else "up"


def _coherence(gray: np.ndarray, k: int) -> float:
    """How alike gray frames (T, h, w) are to the frames `k` on: the median Pearson correlation of
    their luma, over pairs whose frames both show something (a standard deviation of SHOWS or more;
    1.0 where none do). Footage keeps most of its picture from one moment to the next, a quick pan
    or a dance too (0.7 and above in the bench's footage); TV static, new noise in every frame, ~0."""
    t = len(gray)
    if t < 2:
        return 1.0
    a = gray[:-k].reshape(t - k, -1) - gray[:-k].mean((1, 2))[:, None]  # (T-k, h*w)
    b = gray[k:].reshape(t - k, -1) - gray[k:].mean((1, 2))[:, None]
    sa, sb = np.sqrt((a * a).mean(1)), np.sqrt((b * b).mean(1))
    shown = (sa >= SHOWS) & (sb >= SHOWS)
    if not shown.any():
        return 1.0
    return round(float(np.median((a * b).mean(1)[shown] / (sa * sb)[shown])), 3)


def motion_step(fps: float) -> int:
    """Frames between the two frames of each motion measurement at `fps` (see MOTION_STEP_S)."""
    return max(1, round(fps * MOTION_STEP_S))


def measure(small: np.ndarray, fps: float) -> dict:
    """Scores of one clip from its analysis frames (T, h, w, 3) uint8, shown at `fps` frames a second."""
    f = small.astype(np.float32)
    gray = f @ LUMA  # (T, h, w)
    t, h, w = gray.shape
    k = min(motion_step(fps), max(1, t - 1))  # a clip shorter than the step compares its ends
    per_step = (MOTION_STEP_S * fps / k) ** MOTION_POWER  # the motion over MOTION_STEP_S, of that over k frames
    motion = float(np.abs(gray[k:] - gray[:-k]).mean()) * per_step if t > 1 else 0.0
    # Fraction of pixels that change visibly between frames, in any channel (an object can have
    # its background's luma): codec noise on a still shot stays near 0, a small moving object not.
    # (|a - b| in uint8 without wrapping round: the larger minus the smaller.)
    changed = (np.maximum(small[k:], small[:-k]) - np.minimum(small[k:], small[:-k])).max(-1) > CHANGED_LEVEL \
        if t > 1 else np.zeros(1)  # (T-k, h, w)
    motion_area = float(changed.mean())
    coherence = _coherence(gray, k)

    # Background: the per-pixel median over time; foreground: what differs from it. Where the camera
    # does not pan and no more than CAMERA_MOTION_AREA of the frame differs, that is an object.
    background = np.median(small, axis=0).astype(np.float32)  # (h, w, 3); halves are exact in float32
    bg_colour = colour_name(np.median(background.reshape(-1, 3), axis=0))
    diff = np.abs(f - background)  # (T, h, w, 3)
    fg = diff[..., 0] + diff[..., 1] + diff[..., 2] > 60  # (T, h, w)
    fg_frac = float(fg.mean())
    fg_colour, fg_direction, fg_speed = None, None, None
    pan_direction, pan_speed = camera_move(gray, fps)
    kind, way, speed = camera_zoom(gray, fps) if pan_direction is None else (None, None, None)
    zoom_way, zoom_speed = (way, speed) if kind == "zoom" else (None, None)
    turn_way, turn_speed = (way, speed) if kind == "turn" else (None, None)
    if pan_direction is None and kind is None and CAMERA_MOTION_AREA >= fg_frac > 0.002:
        fg_colour = colour_name(np.median(f[fg], axis=0))
        ys, xs = np.mgrid[0:h, 0:w]
        cents = [(i, xs[m].mean(), ys[m].mean()) for i, m in enumerate(fg) if m.sum() >= 3]
        if len(cents) >= 2:
            (i0, *first), (i1, *last) = cents[0], cents[-1]
            step = np.array(last) - np.array(first)
            fg_direction = _direction(step, 0.15 * w)
            if fg_direction:
                fg_speed = _speed(step, w, h, (i1 - i0) / fps)

    picks = sorted({0, t // 2, t - 1})
    return {
        "motion": round(motion, 3),
        "motion_area": round(motion_area, 4),
        "coherence": coherence,
        "brightness": round(float(gray.mean()), 3),
        "background_colour": bg_colour,
        "object_colour": fg_colour,
        "object_area": round(fg_frac, 4),
        "object_direction": fg_direction,
        "object_speed": fg_speed,  # frames a second (widths, or heights up or down), where it goes somewhere
        "camera_pan": pan_direction,
        "pan_speed": pan_speed,  # the same, of the scene as the camera pans
        "camera_zoom": zoom_way,  # "in" or "out", where the camera does not pan
        "zoom_speed": zoom_speed,  # the natural log of how many times the picture grows in a second
        "camera_turn": turn_way,  # "clockwise" or "counterclockwise", where it neither pans nor zooms
        "turn_speed": turn_speed,  # radians a second
        "phash": [format(phash(gray[i]), "016x") for i in picks],
        "colour_grid": [colour_grid(small[i]) for i in picks],
    }


# Black borders: letterbox bars (a wide film in a 16:9 or 9:16 frame), pillarbox bars (4:3 in
# 16:9, a phone's portrait video in a landscape one), or both. Measured on the transcode frames'
# luma (16 is black, 235 white) and cropped off the clip, which a model would learn to draw.
BORDER_LUMA = 40  # brighter than this, a pixel is picture (bars are 16, or up to 30 where a
                  # full-range black was stored as limited range, give or take noise)
BORDER_SPECKS = 0.02  # a line with up to this fraction of brighter pixels is still a bar (noise, dust)
MIN_BORDER = 0.01  # of the frame's height or width: thinner edges are left as they are
MIN_PICTURE = 0.2  # of the frame's height or width: what the bars leave at least, or they are no bars
UNEVEN_BORDERS = 0.2  # bars of a pair differ by at most this fraction of the wider (and 2 lines)
CAPTION_LINE = 0.5  # a bar's line with captions shown in it has at most this fraction of bright pixels


def dark_edges(luma: np.ndarray) -> bool:
    """Whether a frame's luma (H, W) is black along its first and last rows, or along its first and
    last columns: it may show bars (or be black), and a source's frames are worth looking at for them."""
    bright = luma > BORDER_LUMA

    def black(line: np.ndarray) -> bool:
        return line.mean() <= BORDER_SPECKS

    return (black(bright[0]) and black(bright[-1])) or (black(bright[:, 0]) and black(bright[:, -1]))


def black_borders(lumas: list[np.ndarray],
                  source: tuple[int, int, int, int] | None = None) -> tuple[int, int, int, int]:
    """(top, bottom, left, right): lines to crop off a clip for black bars, from the luma (H, W)
    of some of its frames, even numbers (for yuv420p); zeros where it has none. A line is a bar
    where it is black in every frame given, counted in from the edge. Bars come in pairs (top and
    bottom, left and right) of about the same width, as a picture is centred in its frame: a dark
    sky, floor or screen at one edge is picture, and so is a dark band wider at one edge than at
    the other. Captions shown in one bar (a film's subtitles under its picture) leave that bar
    sparse text on black: it goes, as wide as the bar across from it, captions and all, where it
    is black in some of the frames, or where `source` (the bars, in the same lines, that the
    clip's source showed in its key frames) has a pair of bars that wide: the subtitles of a scene
    of dialogue can be in every frame of its clip. One more line goes with each bar, rounded up to
    even: the line that the downscale blended of bar and picture."""
    bright = np.stack(lumas) > BORDER_LUMA  # (T, H, W)

    def pair(share: np.ndarray, given: tuple[int, int] | None) -> tuple[int, int]:
        """Bars at the two ends of the lines whose bright shares per frame are `share` (T, n), with
        `given`: the source's bars at these ends, or None."""
        black = (share <= BORDER_SPECKS).all(0)  # (n,): black in every frame
        n = len(black)
        a, b = int(np.argmin(black)), int(np.argmin(black[::-1]))  # black lines in from each edge
        if black.all() or max(a, b) < max(1, MIN_BORDER * n):
            return 0, 0
        if abs(a - b) > max(2, UNEVEN_BORDERS * max(a, b)):
            wide = max(a, b)
            other = share[:, n - wide:] if a > b else share[:, :wide]  # (T, wide): where the other bar would be
            cleared = (other <= BORDER_SPECKS).all(1).any()  # a frame in which it is all black
            as_given = given is not None and min(given) > 0 and \
                abs((wide + 2) // 2 * 2 - given[0 if a > b else 1]) <= max(2, MIN_BORDER * n)
            if not ((other <= CAPTION_LINE).all() and (cleared or as_given)):
                return 0, 0
            a = b = wide
        elif min(a, b) < max(1, MIN_BORDER * n):
            return 0, 0
        a, b = (a + 2) // 2 * 2, (b + 2) // 2 * 2  # the blended line too, and even
        return (a, b) if n - a - b >= MIN_PICTURE * n else (0, 0)

    return (*pair(bright.mean(2), source and source[:2]), *pair(bright.mean(1), source and source[2:]))


_ocr_engine = None


SURE_OF_A_SHORT_READ = 0.9  # the confidence a read of one or two letters or digits needs to count as text


def text_area(frame: np.ndarray, min_confidence: float = 0.5) -> tuple[float, list[str]]:
    """Fraction of an (H, W, 3) RGB frame covered by text that PP-OCR (rapidocr) can read, and the
    text. Boxes whose recognition is unsure, or reads no letter or digit, are not text: detection
    alone also boxes plain shapes, and recognition reads a square as '■'. A read of one or two
    characters needs SURE_OF_A_SHORT_READ: in real footage detection boxes textures (a bicycle's
    wheels, a face, a logo's curve), often a third of the frame high, and the Chinese-English
    recognizer reads each as a letter or a character at 0.5 to 0.8 ('N' over half a music video's
    frame; 'AA' over a fifth of bikes.mp4's). Such a box dropped a clip for text on its own."""
    global _ocr_engine
    if _ocr_engine is None:
        from rapidocr_onnxruntime import RapidOCR

        _ocr_engine = RapidOCR()
    result, _ = _ocr_engine(frame[:, :, ::-1], use_cls=False)  # rapidocr reads BGR, as OpenCV does
    area, texts = 0.0, []
    for box, text, confidence in result or []:
        characters = sum(ch.isalnum() for ch in text)
        sure = min_confidence if characters > 2 else max(min_confidence, SURE_OF_A_SHORT_READ)
        if characters and float(confidence) >= sure:
            xs, ys = np.array(box)[:, 0], np.array(box)[:, 1]
            area += 0.5 * abs(np.dot(xs, np.roll(ys, 1)) - np.dot(ys, np.roll(xs, 1)))  # shoelace
            texts.append(text)
    h, w = frame.shape[:2]
    return round(min(1.0, area / (h * w)), 4), texts


def niqe_of(lumas: list[np.ndarray]) -> float | None:
    """A clip's NIQE quality score (see quality.py; lower is better): the mean over its sampled
    frames, or None when it has none or they are too small to judge."""
    from curator.stages.quality import niqe

    values = [v for v in (niqe(luma) for luma in lumas) if v is not None]
    return round(float(np.mean(values)), 3) if values else None


def filter_reason(scores: dict, duration: float, num_frames: int, width: int, height: int, clips_cfg,
                  cfg, detail: tuple[int, int] | None = None) -> str | None:
    """Why a clip of `duration` seconds and `num_frames` source frames, `width` x `height`, is
    dropped, or None to keep it. `detail`: (w, h), the source's stored pixels across and down its
    picture where it knows them (fewer than its size where the source's pixel aspect stretches
    them); the short side is weighed on those."""
    if duration < clips_cfg.min_s:
        return f"too_short: {duration:.2f}s < clips.min_s={clips_cfg.min_s}"
    # A source of a frame a minute (a timelapse camera's) makes clips of one frame that last long
    # enough: a picture, not a video, and one frame shows no motion to measure.
    if num_frames < 2:
        return f"too_few_frames: {num_frames} frame of {duration:.2f}s: a still picture, not a video"
    short = min(detail or (width, height))
    if short < cfg.min_short_side:
        reason = f"low_resolution: short side {short} < filters.min_short_side={cfg.min_short_side}"
        if short < min(width, height):  # fewer stored pixels than the clip shows
            reason += (f": its {width}x{height} frames hold {detail[0]}x{detail[1]} pixels' detail, the source's "
                       "pixels stretched by its pixel aspect")
        return reason
    aspect = max(width, height) / min(width, height)
    if aspect > cfg.max_aspect:
        return f"bad_aspect: {aspect:.2f} > filters.max_aspect={cfg.max_aspect}"
    if scores["brightness"] < cfg.min_brightness:
        return f"too_dark: brightness {scores['brightness']:.1f} < filters.min_brightness={cfg.min_brightness}"
    if scores["brightness"] > cfg.max_brightness:
        return f"too_bright: brightness {scores['brightness']:.1f} > filters.max_brightness={cfg.max_brightness}"
    # A slow pan, zoom or turn changes few pixels between frames 1/25 s apart, but the camera moves: no still shot.
    camera_moves = scores.get("camera_pan") or scores.get("camera_zoom") or scores.get("camera_turn")
    if scores["motion_area"] < cfg.min_motion_area and not camera_moves:
        return f"static: motion_area {scores['motion_area']:.4f} < filters.min_motion_area={cfg.min_motion_area}"
    if scores.get("coherence", 1.0) < cfg.min_coherence:
        return f"noise: coherence {scores['coherence']:.2f} < filters.min_coherence={cfg.min_coherence}"
    if scores["motion"] > cfg.max_motion:
        return f"too_shaky: motion {scores['motion']:.1f} > filters.max_motion={cfg.max_motion}"
    if cfg.max_niqe is not None and scores.get("niqe") is not None and scores["niqe"] > cfg.max_niqe:
        return f"low_quality: niqe {scores['niqe']:.1f} > filters.max_niqe={cfg.max_niqe}"
    if scores.get("text_area", 0.0) > cfg.max_text_area:
        return f"too_much_text: text_area {scores['text_area']:.3f} > filters.max_text_area={cfg.max_text_area}"
    return None
