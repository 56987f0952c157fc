"""The test-media generator: what it writes decodes to exactly what its ground truth says."""

from __future__ import annotations

import decord
import numpy as np
import pytest

from curator import synth


def _frames(path) -> np.ndarray:
    vr = decord.VideoReader(str(path))
    return vr.get_batch(list(range(len(vr)))).asnumpy()  # (T, H, W, 3)


def _frame_diffs(frames: np.ndarray) -> np.ndarray:
    """Mean absolute difference of each frame to the one before; index i compares i-1 and i."""
    f = frames.astype(np.float32)
    return np.concatenate([[0.0], np.abs(f[1:] - f[:-1]).mean(axis=(1, 2, 3))])


def test_every_video_decodes_to_its_frame_count_fps_and_size(synth_corpus):
    out, truth = synth_corpus
    assert set(truth) == {p.name for p in out.glob("*.mp4")}
    for name, t in truth.items():
        vr = decord.VideoReader(str(out / name))
        assert len(vr) == t["num_frames"], name
        assert vr.get_avg_fps() == pytest.approx(t["fps"]), name
        assert vr[0].shape == (t["height"], t["width"], 3), name


def test_hard_cuts_are_exactly_the_frames_the_ground_truth_names(synth_corpus):
    out, truth = synth_corpus
    for name in ("cuts.mp4", "static.mp4", "dark.mp4", "text.mp4"):
        diffs = _frame_diffs(_frames(out / name))
        # Within a shot a small shape moves a few pixels; across a cut the background changes.
        jumps = [int(i) for i in np.flatnonzero(diffs > 8.0)]
        assert jumps == truth[name]["cuts"], name
    assert truth["cuts.mp4"]["cuts"] == [30, 56, 90]


def test_fade_goes_through_black_at_its_boundary(synth_corpus):
    out, truth = synth_corpus
    frames = _frames(out / "fade.mp4").astype(np.float32)
    (fade,) = truth["fade.mp4"]["fades"]
    luma = frames.mean(axis=(1, 2, 3))
    assert luma[fade["boundary"]] < 3
    assert luma[fade["start_frame"] - 1] > 20 and luma[fade["end_frame"]] > 20
    assert truth["fade.mp4"]["cuts"] == []
    assert _frame_diffs(frames).max() < 12.0  # gradual: no step as large as a cut's


def test_near_black_static_and_text_segments(synth_corpus):
    out, truth = synth_corpus
    dark = _frames(out / "dark.mp4").astype(np.float32)
    cut = truth["dark.mp4"]["cuts"][0]
    assert dark[:cut].mean() < 8 < dark[cut:].mean()

    static = _frames(out / "static.mp4").astype(np.float32)
    cut = truth["static.mp4"]["cuts"][0]
    assert _frame_diffs(static)[1:cut].max() < 1.0
    assert _frame_diffs(static)[cut + 1:].mean() > 0.5

    text = _frames(out / "text.mp4")
    (span,) = truth["text.mp4"]["text"]
    assert span["text"] == "VFM NEWS 2026"
    bottom = text[:, -16:].astype(np.int16)
    white = ((bottom > 200).all(axis=-1)).sum(axis=(1, 2))  # white glyph pixels per frame
    assert white[span["start_frame"]:span["end_frame"]].min() > 30
    assert white[span["end_frame"]:].max() == 0


def _centroid(frame: np.ndarray, rgb) -> np.ndarray:
    mask = (np.abs(frame.astype(np.int16) - np.array(rgb)).sum(-1) < 60)
    ys, xs = np.nonzero(mask)
    return np.array([xs.mean(), ys.mean()])


def test_shapes_move_in_the_direction_their_caption_says(synth_corpus):
    out, truth = synth_corpus
    checked = 0
    for name, t in truth.items():
        frames = _frames(out / name)
        for shot in t["shots"]:
            if shot["brightness"] < 1 or name == "fade.mp4":
                continue  # too dim to segment by colour
            rgb = synth.COLORS[shot["color"]]
            first = _centroid(frames[shot["start_frame"] + 2], rgb)
            last = _centroid(frames[shot["end_frame"] - 3], rgb)
            step = last - first
            assert shot["color"] in shot["caption"] and shot["background"] in shot["caption"]
            if shot["direction"] is None:
                assert np.abs(step).max() < 1.0, (name, shot["caption"])
                assert "stays still" in shot["caption"]
                continue
            dx, dy = synth.DIRECTIONS[shot["direction"]]
            assert step @ np.array([dx, dy]) > 0.4 * min(t["width"], t["height"]), (name, shot["caption"])
            assert f"moves {shot['direction']}" in shot["caption"]
            checked += 1
    assert checked >= 8


def test_same_seed_same_videos_other_seed_other_videos(tmp_path):
    a = synth.write_corpus(tmp_path / "a", seed=3, num_shape_videos=1)
    b = synth.write_corpus(tmp_path / "b", seed=3, num_shape_videos=1)
    c = synth.write_corpus(tmp_path / "c", seed=4, num_shape_videos=1)
    assert a == b
    assert [s["caption"] for s in a["cuts.mp4"]["shots"]] != [s["caption"] for s in c["cuts.mp4"]["shots"]]
    for name in a:
        np.testing.assert_array_equal(_frames(tmp_path / "a" / name), _frames(tmp_path / "b" / name))
    assert (tmp_path / "a" / "shapes-000.txt").read_text().strip() == a["shapes-000.mp4"]["shots"][0]["caption"]


def test_odd_size_is_refused_with_a_message(tmp_path):
    seg = synth.Segment(4, "circle", "red", "gray", "left")
    with pytest.raises(ValueError, match="even width and height"):
        synth.write_video(tmp_path / "odd.mp4", [seg], size=(65, 48))
    assert not list(tmp_path.iterdir())
