"""The learning check: does a small vfm model, trained for minutes on these cores, follow its prompts?

    synthetic corpus (curator.synth: a coloured shape moving in one direction, captions naming
    colour, shape, motion and background) with some (colour, direction) pairs held out
    ─► vfm-curate captioner=sidecar ─► vfm-train (one process, all cores) ─► vfm-export
    ─► sample every held-out pair (prompts the model never saw) ─► measure each video

Each video is measured from its pixels: the background is the video's median colour; the object is
every pixel far from it. Its colour is the majority vote of those pixels over the 8 colours a prompt
can name; its direction is the sign of the larger component of the least-squares velocity of the
object's centroid over the frames. Figures: how often the colour matches the prompt (target >= 80%)
and how often the direction does (target >= 70%), beside chance (1/8 and 1/4). A grid of samples is
saved as an image.

    python bench/learn.py [--steps 2600] [--out learn]      (make learn)
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from curator import synth  # noqa: E402

COLOURS = sorted(synth.COLORS)  # 8
DIRECTIONS = sorted(synth.DIRECTIONS)  # 4
# Each colour is never seen moving in one direction: 8 held-out pairs, every direction held out twice.
HELD_OUT = {(c, DIRECTIONS[i % 4]) for i, c in enumerate(COLOURS)}
HEIGHT, WIDTH = 24, 32
# A small DiT; its tokens are `--patch` frames x pixels. The default, one frame x 4x4 pixels on 4 frames
# (4 x 6 x 8 = 192 tokens a clip), trains at about 48 clips/s here.
MODEL = ["model.hidden_size=128", "model.num_layers=4", "model.num_heads=4"]


def write_corpus(out: Path) -> int:
    """One single-shot video for every training (colour, direction) pair x shape x background, each
    with a same-stem .txt caption; returns how many."""
    out.mkdir(parents=True, exist_ok=True)
    combos = [(c, d, s, b) for c, d, s, b in itertools.product(COLOURS, DIRECTIONS, synth.SHAPES,
                                                                sorted(synth.BACKGROUNDS)) if (c, d) not in HELD_OUT]
    for i, (colour, direction, shape, background) in enumerate(combos):
        seg = synth.Segment(num_frames=48, shape=shape, color=colour, background=background, direction=direction)
        path = out / f"learn-{i:04d}.mp4"
        if not path.exists():
            synth.write_video(path, [seg])
            path.with_suffix(".txt").write_text(seg.caption() + "\n")
    return len(combos)


def measure(video: np.ndarray) -> tuple[str | None, str | None]:
    """(object colour, direction) of a (T, H, W, 3) uint8 video; None where there is no object."""
    f = video.astype(np.float32)
    background = np.median(f.reshape(-1, 3), axis=0)
    fg = np.abs(f - background).sum(-1) > 90  # (T, H, W)
    if fg.sum() < 3:
        return None, None
    palette = np.array([synth.COLORS[c] for c in COLOURS], np.float32)  # (8, 3)
    nearest = ((f[fg][:, None, :] - palette[None]) ** 2).sum(-1).argmin(1)
    colour = COLOURS[int(np.bincount(nearest, minlength=len(COLOURS)).argmax())]
    ys, xs = np.mgrid[0:video.shape[1], 0:video.shape[2]]
    t = [i for i in range(len(fg)) if fg[i].sum() >= 2]
    if len(t) < 2:
        return colour, None
    cx = np.array([xs[fg[i]].mean() for i in t])
    cy = np.array([ys[fg[i]].mean() for i in t])
    vx, vy = np.polyfit(t, cx, 1)[0], np.polyfit(t, cy, 1)[0]  # pixels per frame
    if max(abs(vx), abs(vy)) * (len(fg) - 1) < 2:  # under 2 pixels over the clip: standing still
        return colour, None
    if abs(vx) >= abs(vy):
        return colour, "right" if vx > 0 else "left"
    return colour, "down" if vy > 0 else "up"


def run(cmd: list[str], log: Path) -> None:
    t0 = time.perf_counter()
    with log.open("w") as f:
        r = subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])} failed; see {log}:\n{log.read_text()[-3000:]}")
    print(f"   {Path(cmd[0]).name} {' '.join(cmd[1:3])}: {time.perf_counter() - t0:.0f} s (log: {log})", flush=True)


def held_out_prompts(seeds_per_prompt: int, pairs=None) -> list[dict]:
    """Every held-out (colour, direction) pair (or every one of `pairs`) with every shape, on a few
    backgrounds."""
    backgrounds = sorted(synth.BACKGROUNDS)
    prompts = []
    for k, ((colour, direction), shape) in enumerate(itertools.product(sorted(pairs or HELD_OUT), synth.SHAPES)):
        seg = synth.Segment(num_frames=48, shape=shape, color=colour, background=backgrounds[k % len(backgrounds)],
                            direction=direction)
        for s in range(seeds_per_prompt):
            prompts.append({"prompt": seg.caption(), "colour": colour, "direction": direction, "seed": 1000 * k + s})
    return prompts


def sample_and_measure(export: Path, prompts: list[dict], num_frames: int, steps: int,
                       guidance: float) -> list[dict]:
    from inference.pipeline import Request, VideoPipeline

    pipe = VideoPipeline.from_export(export)
    results = []
    for i in range(0, len(prompts), 8):
        chunk = prompts[i:i + 8]
        requests = [Request(prompt=p["prompt"], num_frames=num_frames, height=HEIGHT, width=WIDTH, steps=steps,
                            guidance_scale=guidance, seed=p["seed"]) for p in chunk]
        frames, _ = pipe(requests)  # (B, T, H, W, 3) uint8
        for p, video in zip(chunk, frames, strict=True):
            colour, direction = measure(video)
            results.append({**p, "frames": video, "seen_colour": colour, "seen_direction": direction})
    return results


def save_grid(results: list[dict], path: Path, per_row: int = 4) -> None:
    """Rows of samples, each the first, middle and last frame, enlarged 3x, captioned."""
    from PIL import Image, ImageDraw

    tiles = []
    for r in results:
        v = r["frames"]
        strip = np.concatenate([v[0], np.full((HEIGHT, 2, 3), 255, np.uint8), v[len(v) // 2],
                                np.full((HEIGHT, 2, 3), 255, np.uint8), v[-1]], axis=1)
        img = Image.fromarray(strip).resize((strip.shape[1] * 3, HEIGHT * 3), Image.NEAREST)
        tile = Image.new("RGB", (img.width, img.height + 30), "white")
        tile.paste(img, (0, 0))
        d = ImageDraw.Draw(tile)
        ok = "ok" if (r["seen_colour"], r["seen_direction"]) == (r["colour"], r["direction"]) else "x"
        d.text((2, img.height + 2), f"{r['colour']} {r['direction']} [{ok}]", fill="black")
        d.text((2, img.height + 15), f"seen: {r['seen_colour']} {r['seen_direction']}", fill="gray")
        tiles.append(tile)
    w, h = tiles[0].size
    rows = (len(tiles) + per_row - 1) // per_row
    grid = Image.new("RGB", (per_row * (w + 6), rows * (h + 6)), "white")
    for i, t in enumerate(tiles):
        grid.paste(t, ((i % per_row) * (w + 6), (i // per_row) * (h + 6)))
    grid.save(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / "learn", help="where the corpus, run and grid go")
    parser.add_argument("--steps", type=int, default=2600, help="training steps (sized for <= 30 min here)")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch", type=int, default=32, help="clips per step")
    parser.add_argument("--frames", type=int, default=4, help="frames per clip (a multiple of the token's frames)")
    parser.add_argument("--patch", default="1,4,4", help="a token's frames,height,width in pixels")
    parser.add_argument("--pooled-text", action="store_true",
                        help="model.pooled_text: the prompt's mean token in every block's AdaLN too")
    parser.add_argument("--absolute-positions", action=argparse.BooleanOptionalAction, default=True,
                        help="model.absolute_positions: sin-cos embeddings of each token's (t, h, w) beside the "
                             "3D RoPE, so a token knows where in the frame and clip it is")
    parser.add_argument("--frame-stride", type=int, default=12,
                        help="source frames between training frames (12: 4 frames span 37 of a clip's 48)")
    parser.add_argument("--shift", type=float, default=3.0,
                        help="timestep shift for training and sampling; > 1 trains more at high noise, where "
                             "a sample's layout (where the object is, which way it goes) is decided")
    parser.add_argument("--sample-steps", type=int, default=30)
    parser.add_argument("--guidance", type=float, default=5.0)
    parser.add_argument("--seeds", type=int, default=2, help="samples per held-out prompt")
    parser.add_argument("--sample-only", action="store_true", help="sample and measure the export of an earlier run")
    args = parser.parse_args()
    args.patch = tuple(int(v) for v in args.patch.split(","))
    if len(args.patch) != 3 or args.frames % args.patch[0] or HEIGHT % args.patch[1] or WIDTH % args.patch[2]:
        parser.error(f"--patch {args.patch} must divide --frames {args.frames} and {HEIGHT}x{WIDTH}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    bin_dir = Path(sys.executable).parent

    num_videos = write_corpus(out / "media")
    print(f"1. corpus: {num_videos} videos of {len(COLOURS) * len(DIRECTIONS) - len(HELD_OUT)} (colour, direction) "
          f"pairs x shapes x backgrounds; held out: {sorted(HELD_OUT)}", flush=True)
    print("2. curate (captioner=sidecar: the generator's captions)", flush=True)
    if not (out / "curated" / "summary.json").exists():
        # No dedup: its perceptual hash is of luma, so clips that differ only in the object's colour
        # would count as duplicates and a third of the corpus would go.
        run([str(bin_dir / "vfm-curate"), f"input={out / 'media'}", f"output={out / 'curated'}", "captioner=sidecar",
             "dedup.enabled=false"], out / "curate.log")
    summary = json.loads((out / "curated" / "summary.json").read_text())
    print(f"   {summary['kept']} clips kept of {summary['clips']}", flush=True)

    evaluate(args, out, float("nan") if args.sample_only else train(args, out, bin_dir))


def train(args, out: Path, bin_dir: Path) -> float:
    tokens = args.frames // args.patch[0] * (HEIGHT // args.patch[1]) * (WIDTH // args.patch[2])
    patch = ",".join(map(str, args.patch))
    print(f"3. train {args.steps} steps, {args.batch} clips of {args.frames}x{HEIGHT}x{WIDTH} per step", flush=True)
    t_train = time.perf_counter()
    run([str(bin_dir / "vfm-train"), f"run_dir={out / 'run'}", f"data.shards={out / 'curated'}",
         f"num_steps={args.steps}", *MODEL, f"model.patch_size=[{patch}]",
         f"model.pooled_text={str(args.pooled_text).lower()}",
         f"model.absolute_positions={str(args.absolute_positions).lower()}",
         f"data.buckets=[[{args.frames},{HEIGHT},{WIDTH}]]",
         f"data.tokens_per_batch={tokens * args.batch}", f"data.token_size=[{patch}]",
         f"data.frame_stride={args.frame_stride}", "data.num_workers=1", f"optim.lr={args.lr}",
         "optim.warmup_steps=100", "optim.ema_decay=0.99", "checkpoint.every_steps=500",
         f"diffusion.shift={args.shift}"], out / "train.log")
    train_s = time.perf_counter() - t_train
    run([str(bin_dir / "vfm-export"), str(out / "run"), str(out / "export")], out / "export.log")
    return train_s


def evaluate(args, out: Path, train_s: float) -> None:
    prompts = held_out_prompts(args.seeds)
    print(f"4. sample {len(prompts)} videos of held-out prompts ({args.sample_steps} steps, guidance "
          f"{args.guidance}) and measure them", flush=True)
    results = sample_and_measure(out / "export", prompts, args.frames, args.sample_steps, args.guidance)
    colour_ok = np.mean([r["seen_colour"] == r["colour"] for r in results])
    direction_ok = np.mean([r["seen_direction"] == r["direction"] for r in results])
    save_grid(results, out / "samples.png")
    # For comparison, not a target: pairs the model was trained on, one sample each.
    trained_pairs = sorted(set(itertools.product(COLOURS, DIRECTIONS)) - HELD_OUT)
    seen = sample_and_measure(out / "export", held_out_prompts(1, trained_pairs), args.frames, args.sample_steps,
                              args.guidance)
    seen_direction_ok = np.mean([r["seen_direction"] == r["direction"] for r in seen])
    losses = [json.loads(line)["loss"] for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    print(f"   {'':24} {'measured':>9} {'target':>7} {'chance':>7}")
    print(f"   {'colour matches prompt':24} {colour_ok:9.1%} {'>= 80%':>7} {1 / len(COLOURS):7.1%}")
    print(f"   {'direction matches':24} {direction_ok:9.1%} {'>= 70%':>7} {1 / len(DIRECTIONS):7.1%}")
    print(f"   {'(trained pairs: direction)':24} {seen_direction_ok:9.1%}")
    print(f"   training: {train_s / 60:.1f} min, loss {np.mean(losses[:20]):.3f} (first 20 steps) -> "
          f"{np.mean(losses[-20:]):.3f} (last 20); grid: {out / 'samples.png'}, loss curve: {out / 'run' / 'loss.png'}")
    print(json.dumps({"bench": "learn", "colour_match": round(float(colour_ok), 3),
                      "direction_match": round(float(direction_ok), 3),
                      "trained_pairs_direction_match": round(float(seen_direction_ok), 3),
                      "train_minutes": round(train_s / 60, 1),
                      "steps": args.steps, "samples": len(results)}))


if __name__ == "__main__":
    main()
