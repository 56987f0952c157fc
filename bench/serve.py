"""Serving: batching throughput, pipeline overhead per step and latency under load, on one machine.

1. Pipeline overhead: `VideoPipeline.sample_latents` against the bare transformer forward calls it
   makes, in one process. Per step: its scheduler steps (classifier-free guidance, scheduler update)
   against those calls, the target's measure. Per call: the whole call, noise and prompt encoding
   included, with a new prompt each time (the empty negative prompt comes from the pipeline's cache,
   as in a server after its first request).
2. Batching: a real `vfm-serve` on 127.0.0.1 (its own process, all cores), 8 same-shape requests
   sent at once to a batching server (max_batch_size=8) beside the same 8 sent one after another to
   a server that does not batch (max_batch_size=1, so no batching window either), per shape.
3. Latency: a closed loop of `--clients` clients, each sending requests back to back; p50/p95 of
   the time from POST to the mp4 in hand.

The model is the debug flavor (or --flavor) with random weights: speed does not depend on training.

    python bench/serve.py [--flavor debug] [--steps 20] [--clients 4]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from inference import client  # noqa: E402
from inference.pipeline import Request, VideoPipeline  # noqa: E402
from models.dit.model import build  # noqa: E402
from train.export import save_export  # noqa: E402

SHAPES = [(4, 16, 16), (8, 32, 32)]  # (frames, height, width): a small request and a compute-bound one


def write_random_export(folder: Path, flavor: str) -> Path:
    torch.manual_seed(0)
    info = {"step": 0, "weights": "random", "text_encoder": {"name": "minilm", "max_length": 64},
            "autoencoder": {"name": "identity"},
            "diffusion": {"scheduler": "FlowMatchEulerDiscreteScheduler", "shift": 1.0}}
    return save_export(build(flavor, in_channels=3, text_dim=384), folder, info)


def pipeline_overhead(export: Path, shape: tuple[int, int, int], steps: int, batch: int, reps: int = 5) -> dict:
    """Medians of `reps` interleaved runs: the sampling call and its steps against `steps` bare
    forward calls on inputs of the same shapes."""
    pipe = VideoPipeline.from_export(export)
    f, h, w = shape

    def requests(rep: int) -> list[Request]:  # new prompts every run: none comes from the cache
        return [Request(prompt=f"a red square moving left {rep} {i}", num_frames=f, height=h, width=w, steps=steps,
                        seed=i) for i in range(batch)]

    first = requests(-1)
    latents = torch.randn(2 * batch, *pipe.latent_shape(first[0]))
    sigma = torch.full((2 * batch,), 0.5)
    emb, mask = pipe.text_encoder([r.prompt for r in first] + [r.negative_prompt for r in first])
    call, in_steps, bare = [], [], []
    with torch.no_grad():
        pipe.sample_latents(first)  # warm-up
        for rep in range(reps):
            timings = {}
            t0 = time.perf_counter()
            pipe.sample_latents(requests(rep), timings=timings)
            call.append(time.perf_counter() - t0)
            in_steps.append(timings["steps_s"])
            t0 = time.perf_counter()
            for _ in range(steps):
                pipe.transformer(latents, sigma, emb, mask)
            bare.append(time.perf_counter() - t0)
    call_s, steps_s, bare_s = statistics.median(call), statistics.median(in_steps), statistics.median(bare)
    return {"call_s": call_s, "steps_s": steps_s, "bare_s": bare_s, "per_step": steps_s / bare_s - 1,
            "per_call": call_s / bare_s - 1}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(export: Path, log: Path, max_batch_size: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    args = [f"checkpoint={export}", f"server.port={port}", f"server.max_batch_size={max_batch_size}",
            f"server.max_wait_ms={500 if max_batch_size > 1 else 0}", "server.max_queue=64"]
    proc = subprocess.Popen([sys.executable, "-m", "inference.server", *args], cwd=REPO,
                            stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        client.wait_for_server(url, 180)
    except TimeoutError:
        proc.kill()
        raise RuntimeError(f"vfm-serve did not start:\n{log.read_text()[-3000:]}") from None
    return proc, url


def one_video(url: str, body: dict) -> tuple[float, dict]:
    """Seconds from POST to the mp4 in hand, and the job."""
    t0 = time.perf_counter()
    job = client.wait(url, client.submit(url, body), poll_s=0.1, show=False)
    client.fetch(url, job)
    return time.perf_counter() - t0, job


def same_shape(shape: tuple[int, int, int], steps: int, n: int = 8) -> list[dict]:
    f, h, w = shape
    return [{"prompt": f"a blue circle moving right {i}", "num_frames": f, "height": h, "width": w, "steps": steps,
             "seed": i} for i in range(n)]


def one_after_another(url: str, bodies: list[dict]) -> float:
    one_video(url, bodies[0])  # warm-up at this shape
    t0 = time.perf_counter()
    for body in bodies:
        one_video(url, body)
    return time.perf_counter() - t0


def all_at_once(url: str, bodies: list[dict]) -> tuple[float, list[int]]:
    """Seconds until every video is in hand, and the batch sizes the server formed."""
    one_video(url, bodies[0])  # warm-up at this shape
    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(bodies)) as pool:
        jobs = [job for _, job in pool.map(lambda b: one_video(url, b), bodies)]
    return time.perf_counter() - t0, sorted({j["timings"]["batch_size"] for j in jobs})


def latency(url: str, shape: tuple[int, int, int], steps: int, clients: int, per_client: int) -> dict:
    f, h, w = shape

    def loop(c: int) -> list[float]:
        return [one_video(url, {"prompt": f"a green triangle moving up {c}", "num_frames": f, "height": h, "width": w,
                                "steps": steps, "seed": 100 * c + i})[0] for i in range(per_client)]

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        seconds = sorted(s for run in pool.map(loop, range(clients)) for s in run)
    wall = time.perf_counter() - t0
    return {"p50_s": statistics.median(seconds), "p95_s": seconds[max(0, round(0.95 * len(seconds)) - 1)],
            "videos_per_s": len(seconds) / wall, "requests": len(seconds)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flavor", default="debug")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--per-client", type=int, default=4)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    figures: dict = {"flavor": args.flavor, "steps": args.steps}
    with tempfile.TemporaryDirectory(prefix="vfm-bench-serve-") as tmp:
        export = write_random_export(Path(tmp) / "export", args.flavor)

        print(f"1. pipeline overhead over the bare forward calls ({args.steps} steps, CFG doubles the batch); "
              "per call: with noise and encoding a new prompt")
        print(f"   {'shape':>10} {'batch':>5} {'bare s':>8} {'steps s':>8} {'per step':>9} {'call s':>8} "
              f"{'per call':>9}  target: per step <= 5%")
        for shape in SHAPES:
            for batch in (1, 4):
                o = pipeline_overhead(export, shape, args.steps, batch)
                key = f"{'x'.join(map(str, shape))}_b{batch}"
                figures[f"overhead_{key}"] = round(o["per_step"], 4)
                figures[f"overhead_per_call_{key}"] = round(o["per_call"], 4)
                print(f"   {'x'.join(map(str, shape)):>10} {batch:>5} {o['bare_s']:8.3f} {o['steps_s']:8.3f} "
                      f"{o['per_step']:9.1%} {o['call_s']:8.3f} {o['per_call']:9.1%}")

        sequential = {}
        proc, url = start_server(export, Path(tmp) / "server-unbatched.log", max_batch_size=1)
        try:
            for shape in SHAPES:
                sequential[shape] = one_after_another(url, same_shape(shape, args.steps))
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        proc, url = start_server(export, Path(tmp) / "server.log", max_batch_size=8)
        try:
            print("2. 8 same-shape requests over HTTP: one after another (server without batching) vs all at once "
                  "(batching server)")
            print(f"   {'shape':>10} {'sequential s':>13} {'concurrent s':>13} {'speedup':>8} {'batches':>8}"
                  "  target >= 2x")
            for shape in SHAPES:
                concurrent, sizes = all_at_once(url, same_shape(shape, args.steps))
                key = "x".join(map(str, shape))
                speedup = sequential[shape] / concurrent
                figures[f"batching_speedup_{key}"] = round(speedup, 3)
                print(f"   {key:>10} {sequential[shape]:13.2f} {concurrent:13.2f} {speedup:7.2f}x {str(sizes):>8}")
            shape = SHAPES[-1]
            print(f"3. latency, {args.clients} clients back to back, {args.per_client} requests each, "
                  f"{'x'.join(map(str, shape))}, {args.steps} steps, batching server")
            lat = latency(url, shape, args.steps, args.clients, args.per_client)
            print(f"   p50 {lat['p50_s']:.2f} s, p95 {lat['p95_s']:.2f} s, {lat['videos_per_s']:.2f} videos/s "
                  f"over {lat['requests']} requests")
            figures.update({"latency_p50_s": round(lat["p50_s"], 3), "latency_p95_s": round(lat["p95_s"], 3),
                            "videos_per_s": round(lat["videos_per_s"], 3)})
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
