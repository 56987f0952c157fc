"""kill -9 of a running vfm-curate, then the same command again: the job finishes with no duplicate,
missing or truncated samples, and the same samples as an uninterrupted run."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import decord
import webdataset as wds

from curator import synth
from curator.writer import read_jsonl

ARGS = ["writer.samples_per_shard=2", "num_workers=1", "ray.num_cpus=2", "dedup.enabled=false"]


def _run(inputs: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "curator.cli", f"input={inputs}", f"output={out}", *ARGS],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _samples(out: Path) -> dict[str, dict]:
    shards = sorted(str(p) for p in (out / "shards").glob("*.tar"))
    samples = {}
    for s in wds.WebDataset(shards, shardshuffle=False):
        assert s["__key__"] not in samples, f"duplicate sample {s['__key__']}"
        samples[s["__key__"]] = s
    return samples


def _finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        os.killpg(proc.pid, signal.SIGKILL) if proc.poll() is None else None
    return out


def test_kill_9_mid_run_then_rerun_finishes_the_job(tmp_path):
    inputs = tmp_path / "in"
    synth.write_corpus(inputs, seed=5, num_shape_videos=10)
    clean, resumed = tmp_path / "clean", tmp_path / "resumed"
    proc = _run(inputs, clean)
    assert proc.wait(timeout=300) == 0, _finish(proc)

    proc = _run(inputs, resumed)
    deadline = time.time() + 240
    while time.time() < deadline and len(read_jsonl(resumed / "manifest.jsonl")) < 4:
        time.sleep(0.05)
    done_before_kill = len(read_jsonl(resumed / "manifest.jsonl"))
    os.kill(proc.pid, signal.SIGKILL)  # the driver, mid-run
    proc.wait()
    time.sleep(1)
    with contextlib.suppress(ProcessLookupError):  # nothing of it left
        os.killpg(proc.pid, signal.SIGKILL)  # whatever of its local Ray instance outlived it
    total = len(list(inputs.glob("*.mp4")))
    assert 4 <= done_before_kill < total, "the kill did not land mid-run"

    proc = _run(inputs, resumed)
    log = _finish(proc)
    assert proc.returncode == 0, log
    assert f"curating {total - done_before_kill} of {total} inputs" in log

    records = read_jsonl(resumed / "manifest.jsonl")
    assert sorted(r["source"] for r in records) == sorted(str(p.resolve()) for p in inputs.glob("*.mp4"))
    a, b = _samples(clean), _samples(resumed)
    assert sorted(a) == sorted(b)
    for key in a:
        assert a[key]["txt"] == b[key]["txt"]
        meta_a, meta_b = json.loads(a[key]["json"]), json.loads(b[key]["json"])
        assert meta_a == meta_b
        path = tmp_path / f"{key}.mp4"
        path.write_bytes(b[key]["mp4"])
        assert len(decord.VideoReader(str(path))) == meta_b["num_frames"]
    assert not list((resumed / "shards").glob(".*"))
    summary = json.loads((resumed / "summary.json").read_text())
    assert summary["inputs"] == total and summary["kept"] == len(b)

    proc = _run(inputs, resumed)
    assert "nothing to do" in _finish(proc)


def test_a_second_run_on_an_output_in_use_stops_and_touches_nothing(tmp_path):
    """While one run holds the output (here this process, through the writer's own lock), the same
    command from another process exits 2 naming the holder, and leaves the holder's unfinished shard
    and manifest as they are; once the holder is done, it runs."""
    from curator.writer import OutputDir

    inputs = tmp_path / "in"
    synth.write_corpus(inputs, seed=6, num_shape_videos=1)
    out = tmp_path / "out"
    holder = OutputDir(out, samples_per_shard=2, max_hamming=None)
    unfinished = out / "shards" / ".shard-000000.tar.tmp"
    unfinished.write_bytes(b"the holder's shard, half written")
    done = {"source": "/elsewhere/a.mp4", "status": "error", "error": "not a video", "shots": [], "clips": []}
    (out / "manifest.jsonl").write_text(json.dumps(done) + "\n")

    proc = _run(inputs, out)
    log = _finish(proc, timeout=120)
    assert proc.returncode == 2, log
    assert f"is being written by another run (pid {os.getpid()} on" in log
    assert unfinished.read_bytes() == b"the holder's shard, half written"
    assert len(read_jsonl(out / "manifest.jsonl")) == 1
    assert not (out / "summary.json").exists()

    holder.close()
    holder.release()
    proc = _run(inputs, out)
    log = _finish(proc)
    assert proc.returncode == 0, log
    assert not unfinished.exists()
    total = len(list(inputs.glob("*.mp4")))
    assert len(read_jsonl(out / "manifest.jsonl")) == 1 + total
    assert json.loads((out / "summary.json").read_text())["inputs"] == 1 + total
