"""A command-line client for vfm-serve: request one video, follow its progress, save the mp4.

    python -m inference.client --url http://127.0.0.1:8000 --prompt "a red square moving left" \\
        --output video.mp4 [--num-frames 8 --height 32 --width 32 --steps 20 --seed 0] [--wait-server 60]

The API key, if the server needs one, comes from the VFM_API_KEY environment variable.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path


def _call(url: str, method: str = "GET", body: dict | None = None) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json"}
    if os.environ.get("VFM_API_KEY"):
        headers["Authorization"] = f"Bearer {os.environ['VFM_API_KEY']}"
    data = json.dumps(body).encode() if body is not None else None
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data, headers, method=method), timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def wait_for_server(url: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            if _call(f"{url}/healthz")[0] == 200:
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no server answered at {url} within {seconds:g} s") from None
            time.sleep(0.5)


def submit(url: str, body: dict) -> str:
    """The id of a new video job."""
    status, reply = _call(f"{url}/v1/videos", "POST", body)
    if status != 202:
        raise RuntimeError(f"the server refused the request ({status}): {reply.decode(errors='replace')}")
    return json.loads(reply)["id"]


def wait(url: str, job_id: str, poll_s: float = 0.3, show: bool = True) -> dict:
    """The finished job's status, after following its progress (redrawn on a terminal, else one
    line per change of status)."""
    tty, last = sys.stdout.isatty(), None
    while True:
        status, reply = _call(f"{url}/v1/videos/{job_id}")
        if status != 200:
            raise RuntimeError(f"status of {job_id} ({status}): {reply.decode(errors='replace')}")
        job = json.loads(reply)
        line = f"{job['status']}: step {job['progress']['step']}/{job['progress']['total']}"
        if show and tty:
            print(f"\r{line}", end="", flush=True)
        elif show and job["status"] != last:
            print(line, flush=True)
        last = job["status"]
        if job["status"] not in ("queued", "running"):
            if show and tty:
                print()
            return job
        time.sleep(poll_s)


def fetch(url: str, job: dict) -> bytes:
    """The mp4 of a finished job."""
    if job["status"] != "succeeded":
        raise RuntimeError(f"the video {job['status']}: {job['error']}")
    status, video = _call(f"{url}/v1/videos/{job['id']}/content")
    if status != 200:
        raise RuntimeError(f"content of {job['id']} ({status}): {video.decode(errors='replace')}")
    return video


def request_video(url: str, body: dict, output: Path) -> dict:
    job = wait(url, submit(url, body))
    video = fetch(url, job)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_bytes(video)
    return job


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--prompt", required=True)
    p.add_argument("--negative-prompt", default="")
    p.add_argument("--num-frames", type=int, default=8)
    p.add_argument("--height", type=int, default=32)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--guidance-scale", type=float, default=5.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", type=Path, required=True)
    p.add_argument("--wait-server", type=float, default=0, help="seconds to wait for the server to come up")
    a = p.parse_args(argv)
    body = {"prompt": a.prompt, "negative_prompt": a.negative_prompt, "num_frames": a.num_frames, "height": a.height,
            "width": a.width, "steps": a.steps, "guidance_scale": a.guidance_scale, "seed": a.seed}
    try:
        if a.wait_server:
            wait_for_server(a.url, a.wait_server)
        job = request_video(a.url, body, a.output)
    except (RuntimeError, TimeoutError, OSError) as e:
        sys.exit(f"vfm client: {e}")
    print(f"saved {a.output} ({job['timings']['total_s']} s, batch of {job['timings']['batch_size']})")


if __name__ == "__main__":
    main()
