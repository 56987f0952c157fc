"""Black bars round the picture (a wide film letterboxed in 16:9 or in a 9:16 phone frame, 4:3 in a
16:9 frame): made of real footage (bikes.mp4) padded as such sources are, cropped off every clip,
measured and cut without them, and not mistaken in footage that has none."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest
from omegaconf import OmegaConf
from vfm_testmedia import _encode

import conf
from curator.stages.score import black_borders
from curator.stages.split import process_source
from curator.stages.transnet import detect_shots

FRAMES = 100  # bikes' first 100 frames: cuts at 30 and 76
SHOTS = [[0, 30], [30, 76], [76, 100]]


def bikes_frames(bikes, width: int, height: int) -> list[np.ndarray]:
    """(height, width, 3) RGB frames of bikes.mp4."""
    with av.open(str(bikes)) as c:
        return [f.reformat(width=width, height=height, format="rgb24").to_ndarray()
                for f, _ in zip(c.decode(video=0), range(FRAMES), strict=False)]


def _cfg(*overrides):
    return conf.compose("curate", ["input=x", "output=y", "clips.min_s=0.5", *overrides])


def _decoded(clip) -> np.ndarray:
    with av.open(io.BytesIO(clip.mp4)) as c:
        return np.stack([f.to_ndarray(format="gray") for f in c.decode(video=0)]).astype(np.float32)  # (T, H, W)


# name: (picture size, frame size, picture's top-left corner in the frame)
PADDED = {
    "letterbox 2.35:1 in 16:9": ((640, 272), (640, 360), (0, 44)),
    "letterbox in a 9:16 phone frame": ((320, 136), (320, 568), (0, 216)),
    "pillarbox 1:1 in 16:9": ((272, 272), (480, 272), (104, 0)),
    "windowbox": ((320, 136), (480, 270), (80, 67)),
}


@pytest.fixture(scope="module")
def plain(bikes, tmp_path_factory):
    """bikes.mp4's first frames at each picture size, without bars, curated: the reference."""
    out = {}
    for size in {p for p, _, _ in PADDED.values()}:
        path = tmp_path_factory.mktemp("plain") / "plain.mp4"
        _encode(path, bikes_frames(bikes, *size), fps=25)
        out[size] = process_source(str(path), "plain", _cfg())
    return out


@pytest.mark.parametrize("name", PADDED)
def test_black_bars_are_cropped_off_every_clip_and_the_shots_are_found_through_them(name, bikes, plain, tmp_path):
    (pw, ph), (fw, fh), (x, y) = PADDED[name]
    frames = []
    for picture in bikes_frames(bikes, pw, ph):
        a = np.zeros((fh, fw, 3), np.uint8)  # black: luma 16 once stored as limited-range yuv420p
        a[y:y + ph, x:x + pw] = picture
        frames.append(a)
    path = tmp_path / "padded.mp4"
    _encode(path, frames, fps=25)

    record, clips = process_source(str(path), "padded", _cfg())
    # The bars of the phone frame are three quarters of it: measured over the whole frame, every
    # cut's colour difference fell under detector.min_content, and the three shots came out as one.
    assert record["shots"] == SHOTS
    plain_record, plain_clips = plain[(pw, ph)]
    assert plain_record["shots"] == SHOTS
    assert all(c.scores["black_borders"] == [0, 0, 0, 0] for c in plain_clips)  # footage without bars

    scale = record["out_width"] / fw  # frame to transcode size
    kept = [c for c in clips if c.kept]
    assert [(c.start_frame, c.end_frame) for c in kept] == [(c.start_frame, c.end_frame) for c in plain_clips if c.kept]
    for clip, ref in zip(kept, [c for c in plain_clips if c.kept], strict=True):
        top, bottom, left, right = clip.scores["black_borders"]
        assert (clip.width, clip.height) == (record["out_width"] - left - right, record["out_height"] - top - bottom)
        # All of the bars go, and at most the line blended of bar and picture (and one for even sizes) with them.
        for got, want in ((clip.width, pw * scale), (clip.height, ph * scale)):
            assert want - 5 <= got <= want + 0.5, (clip.width, clip.height, pw * scale, ph * scale)
        video = _decoded(clip)
        assert video.shape[1:] == (clip.height, clip.width)
        edges = [video[:, 0].mean(), video[:, -1].mean(), video[:, :, 0].mean(), video[:, :, -1].mean()]
        assert min(edges) > 40, edges  # a bar's line is 16
        # Measured on the picture alone: as bright as the same frames without bars.
        assert abs(clip.scores["brightness"] - ref.scores["brightness"]) < 3, (clip.scores, ref.scores)
        area = 1 - clip.width * clip.height / (record["out_width"] * record["out_height"])
        assert clip.scores["border_area"] == pytest.approx(area, abs=1e-4)

    # TransNetV2 takes the picture without the bars too: with them, it lost the cut at 76 in the
    # phone frame and in the windowbox.
    assert detect_shots(str(path), OmegaConf.to_container(_cfg("detector=transnetv2").detector))["cuts"] == [30, 76]

    whole, uncropped = process_source(str(path), "padded", _cfg("transcode.crop_black_borders=false"))
    assert {(c.width, c.height) for c in uncropped} == {(whole["out_width"], whole["out_height"])}
    assert min(whole["out_width"], whole["out_height"]) == min(256, fw, fh)
    assert all("black_borders" not in c.scores for c in uncropped)


def _letterboxed(bikes, path, frame=(640, 360), at=(0, 44), *, frames=250, gop=None, full_frame=(), subtitled=()):
    """bikes.mp4's first `frames` frames (640x272) as a 2.35:1 film letterboxed in a `frame` (w, h)
    with the picture's top-left corner `at`, but for the frames in `full_frame`, stretched to the
    whole frame; with a subtitle in the bottom bar of a 640x360 frame in the frames in `subtitled`.
    A key frame every `gop` frames (x264's default where None)."""
    (fw, fh), (x, y) = frame, at
    out = []
    with av.open(str(bikes)) as c:
        for k, f in zip(range(frames), c.decode(video=0), strict=False):
            if k in full_frame:
                out.append(f.to_ndarray(format="rgb24", width=fw, height=fh))
                continue
            a = np.zeros((fh, fw, 3), np.uint8)
            a[y:y + 272, x:x + 640] = f.to_ndarray(format="rgb24")
            if k in subtitled:
                for s in range(200, 440, 14):  # letters' strokes in the bar, white
                    a[330:346, s:s + 8] = 255
            out.append(a)
    _encode(path, out, fps=25, gop=gop)
    return path


@pytest.mark.parametrize("frame, at, gop", [((640, 360), (0, 44), 25), ((640, 1136), (0, 432), 25),
                                           ((640, 360), (0, 44), 250)])
def test_bars_shown_throughout_a_source_cost_its_clips_no_lines(frame, at, gop, bikes, tmp_path):
    """bikes.mp4 letterboxed in 16:9 and in a 9:16 phone frame, all 250 frames, a key frame a second
    or only the first (a short clip as ffmpeg cuts it): its frames are scaled so that the picture,
    cropped of the bars, has the configured short side. Scaled to the whole frame's short side, its
    clips had 192 lines, and 106 in the phone frame; with one key frame, 192 until 3 were asked for."""
    path = _letterboxed(bikes, tmp_path / "letterboxed.mp4", frame, at, gop=gop)
    record, clips = process_source(str(path), "film", _cfg())
    assert [s for s, _ in record["shots"][1:]] == [30, 76, 137, 187, 242]
    kept = [c for c in clips if c.kept]
    assert len(kept) == 5
    for clip in kept:  # the picture: at most the source's 640x272, its bars and their blended lines off
        assert 254 <= clip.height <= 272 and clip.width == record["out_width"] <= 640
        video = _decoded(clip)
        assert min(video[:, 0].mean(), video[:, -1].mean()) > 40  # no bar left
    # Without the crop, the frames are scaled to the whole frame's short side, as before.
    record, _ = process_source(str(path), "film", _cfg("transcode.crop_black_borders=false"))
    assert min(record["out_width"], record["out_height"]) == 256


def test_a_stretch_without_the_bars_the_key_frames_showed_keeps_all_its_picture(bikes, tmp_path):
    """Letterboxed, but for frames 160-186 filmed full frame, which no sampled key frame (a key frame
    a second, frames 0, 25, 75, ...) falls in: that stretch's clip keeps all its picture, uncropped,
    scaled down to the short side of the others (it came out larger, at the frames' size, before)."""
    path = _letterboxed(bikes, tmp_path / "mixed.mp4", gop=25, full_frame=range(160, 187))
    record, clips = process_source(str(path), "film", _cfg())
    assert min(record["out_width"], record["out_height"]) > 256  # scaled for the picture inside the bars
    assert [160, 187] in record["shots"]  # the switch to full frame is a cut
    kept = {c.start_frame: c for c in clips if c.kept}
    assert (kept[161].width, kept[161].height) == (456, 256)  # 16:9, as the frames: nothing cropped
    assert kept[161].scores["border_area"] == 0
    whole = _decoded(kept[161])
    assert whole.shape[1:] == (256, 456) and min(whole[:, 0].mean(), whole[:, -1].mean()) > 40
    assert len(kept) == 6 and all(254 <= c.height <= 262 for start, c in kept.items() if start != 161)


def test_a_film_after_a_full_frame_title_card_is_scaled_for_its_bars(bikes, tmp_path):
    """bikes.mp4 letterboxed in 16:9 but for its first shot (frames 0-29), shown full frame as a
    title card or a studio's logo would be: the first frame has picture at its edges, the middle key
    frame has bars. The letterboxed clips get their lines (192 before, the bars looked for only where
    the first frame had black edges), and the full-frame one keeps all its picture at 456x256."""
    path = _letterboxed(bikes, tmp_path / "titled.mp4", gop=25, full_frame=range(0, 30))
    record, clips = process_source(str(path), "film", _cfg())
    assert [s for s, _ in record["shots"][1:]] == [30, 76, 137, 187, 242]
    kept = {c.start_frame: c for c in clips if c.kept}
    assert (kept[0].width, kept[0].height) == (456, 256) and kept[0].scores["border_area"] == 0
    letterboxed = [c for start, c in kept.items() if start > 0]
    assert len(letterboxed) == 4 and all(254 <= c.height <= 272 for c in letterboxed)


SUBTITLED = {  # frames of bikes with a subtitle in the bottom bar
    "now and then": [*range(10, 20), *range(40, 60)],
    # through the whole second shot, as in a scene of dialogue: its clip's bar is never black (left
    # as it was, subtitles and all, before the clips were told of the bars their source showed)
    "through a shot": [*range(30, 76), *range(80, 100)],
}


@pytest.fixture(scope="module")
def letterboxed_film(bikes, tmp_path_factory):
    """bikes.mp4 as a 2.35:1 film letterboxed in 16:9, curated: the reference for the subtitled ones."""
    path = _letterboxed(bikes, tmp_path_factory.mktemp("film") / "film.mp4", frames=FRAMES)
    return process_source(str(path), "film", _cfg())


@pytest.mark.parametrize("when", SUBTITLED)
def test_a_bar_with_subtitles_in_it_is_cropped_subtitles_and_all(bikes, tmp_path, letterboxed_film, when):
    """A 2.35:1 film letterboxed in 16:9 with its subtitles shown in the bottom bar."""
    path = _letterboxed(bikes, tmp_path / "subtitled.mp4", frames=FRAMES, subtitled=SUBTITLED[when])
    record, clips = process_source(str(path), "film", _cfg())
    assert record["shots"] == SHOTS
    kept = [c for c in clips if c.kept]
    assert len(kept) == 3 and all(c.scores["black_borders"][0] > 0 for c in kept)
    # Cropped as the film without subtitles is, to the same pictures (but for the source's coding).
    plain_kept = [c for c in letterboxed_film[1] if c.kept]
    assert [c.scores["black_borders"] for c in kept] == [c.scores["black_borders"] for c in plain_kept]
    for clip, ref in zip(kept, plain_kept, strict=True):
        video, ref_video = _decoded(clip), _decoded(ref)
        assert video.shape == ref_video.shape
        assert np.abs(video - ref_video).mean() < 2 and np.abs(video - ref_video)[:, -4:].mean() < 4


def test_dark_edges_that_are_picture_are_not_cropped(bikes):
    """Luma planes of real frames with dark bands that bars do not make."""
    pictures = [a[..., 0] // 2 + 60 for a in bikes_frames(bikes, 320, 136)[::10]]  # (136, 320), all above black

    def framed(top, bottom, left=0, right=0, fill=16):
        out = []
        for p in pictures:
            a = np.full((136 + top + bottom, 320 + left + right), fill, np.uint8)
            a[top:top + 136, left:left + 320] = p
            out.append(a)
        return out

    assert black_borders(framed(24, 24)) == (26, 26, 0, 0)  # a letterbox: each bar, and the blended line
    assert black_borders(framed(0, 0, 30, 31)) == (0, 0, 32, 32)
    assert black_borders(framed(24, 24, fill=30)) == (26, 26, 0, 0)  # full-range black stored as limited
    assert black_borders(framed(40, 0)) == (0, 0, 0, 0)  # a dark sky above, nothing below: picture
    assert black_borders(framed(40, 10)) == (0, 0, 0, 0)  # dark bands of unlike widths: picture
    assert black_borders(framed(1, 1)) == (0, 0, 0, 0)  # under 1% of the height: left as it is
    assert black_borders([np.full((180, 320), 16, np.uint8)] * 3) == (0, 0, 0, 0)  # a black frame has no picture
    # A subtitle shown in the bottom bar in some of the frames: the bar goes, as wide as the top one,
    # and the subtitle with it (the bars were left before, subtitle and all).
    frames = framed(40, 40)
    for k in (1, 3):
        for x in range(100, 220, 12):  # letters: strokes, not a block
            frames[k][190:200, x:x + 7] = 235
    assert black_borders(frames) == (42, 42, 0, 0)
    # Not a subtitle: lines of the bottom bar as bright as picture in a frame (a shot wider than the
    # bar); and lines never black, in which text and picture cannot be told apart.
    frames = framed(40, 40)
    frames[3][180:200] = 200
    assert black_borders(frames) == (0, 0, 0, 0)
    frames = framed(40, 40)
    for f in frames:
        f[190:200, 100:220:3] = 235
    assert black_borders(frames) == (0, 0, 0, 0)
    # Unless the clip's source showed bars that wide in its key frames: then they are captions, in
    # every frame (a scene of dialogue), and go; not for bars of another width, nor with a line of
    # picture in the bar.
    assert black_borders(frames, source=(42, 42, 0, 0)) == (42, 42, 0, 0)
    assert black_borders(frames, source=(26, 26, 0, 0)) == (0, 0, 0, 0)
    assert black_borders(frames, source=(0, 0, 0, 0)) == (0, 0, 0, 0)
    frames[2][180:182] = 200
    assert black_borders(frames, source=(42, 42, 0, 0)) == (0, 0, 0, 0)
    # The picture between bars is at least a fifth of the frame, or they are no bars.
    assert black_borders([np.pad(p[60:76], ((40, 40), (0, 0)), constant_values=16) for p in pictures]) == (0, 0, 0, 0)


def test_a_small_picture_in_a_large_black_frame_is_scaled_up_at_most_three_times(bikes, tmp_path):
    """bikes.mp4 as a 1920x240 strip in a 1080p frame: the picture's short side inside the bars is
    about a fifth of the frame's, but the frames are scaled for at most 3x the short side (1366x768),
    not for the whole picture (the whole 1080p frame, and a clip's frames decoded and scaled at it)."""
    from curator import media
    from curator.stages.split import transcode_framing

    frames = []
    for picture in bikes_frames(bikes, 1920, 240)[:16]:
        a = np.zeros((1080, 1920, 3), np.uint8)
        a[420:660] = picture
        frames.append(a)
    path = tmp_path / "strip.mp4"
    _encode(path, frames, fps=25, gop=4)
    cfg = _cfg()
    p = media.probe(str(path))
    assert p.dark_edges
    assert transcode_framing(str(path), p, cfg.transcode).size == (1366, 768)
