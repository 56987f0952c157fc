"""vfm-train on real shards: one process and torchrun with 2 processes over gloo; checkpoints that
resume bit-exact after kill -9 and SIGTERM, reshard across layouts, and are never picked when
partial; NaN steps skipped; bad set-ups fail before any process group could hang."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from vfm_testmedia import write_test_shards

import conf
from train.checkpoint import find_latest, is_complete
from train.metrics import read_metrics

REPO = Path(__file__).resolve().parents[1]
DATA = ["data.buckets=[[8,32,48],[8,48,32]]", "data.tokens_per_batch=4096", "data.num_workers=1"]
RECORD_KEYS = {"step", "loss", "grad_norm", "lr", "samples_per_s", "tokens_per_s", "mfu", "data_wait",
               "peak_mem_mib", "skipped_samples", "nonfinite_steps"}


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("train-shards")
    write_test_shards(folder, seed=3, num_shards=4, per_shard=6)
    return str(folder / "*.tar")


def overrides(run_dir: Path, shards: str, *extra: str) -> list[str]:
    return [f"run_dir={run_dir}", f"data.shards='{shards}'", *DATA, *extra]


def command(nproc: int, args: list[str]) -> list[str]:
    if nproc == 1:
        return [sys.executable, "-m", "train", *args]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m", "train",
            *args]


def train(nproc: int, args: list[str], timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(command(nproc, args), cwd=REPO, capture_output=True, text=True, timeout=timeout)


def start(nproc: int, args: list[str], log: Path) -> subprocess.Popen:
    """A run in its own process group, so a signal reaches the launcher and every worker."""
    return subprocess.Popen(command(nproc, args), cwd=REPO, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (torchrun starts its workers in sessions of their own, so a
    process-group signal to the launcher does not reach them)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the process ended while we looked
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_9(proc: subprocess.Popen) -> None:
    """kill -9 the launcher and every process it started, all at once."""
    for pid in [proc.pid, *descendants(proc.pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()


def wait_for_step(run_dir: Path, step: int, proc: subprocess.Popen, timeout: float = 180) -> None:
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= step:
            return
        assert proc.poll() is None, "the run ended before it was interrupted"
        time.sleep(0.2)
    raise TimeoutError(f"no step {step} within {timeout} s")


def losses(run_dir: Path) -> dict[int, float]:
    return {s: r["loss"] for s, r in read_metrics(run_dir / "metrics.jsonl").items()}


@pytest.fixture(scope="module")
def one_process_run(shards, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("run1")
    r = train(1, overrides(run_dir, shards, "num_steps=6", "checkpoint.every_steps=2", "checkpoint.num_keep=2",
                           "optim.warmup_steps=2", "optim.ema_decay=0.9"))
    assert r.returncode == 0, r.stdout + r.stderr
    return run_dir


def test_one_process_writes_metrics_tensorboard_plot_checkpoints_and_exports(one_process_run, tmp_path):
    run_dir = one_process_run
    records = read_metrics(run_dir / "metrics.jsonl")
    assert list(records) == [1, 2, 3, 4, 5, 6]
    assert all(RECORD_KEYS <= set(r) for r in records.values())
    assert all(np.isfinite(r["loss"]) and r["grad_norm"] > 0 and 0 < r["mfu"] < 1 for r in records.values())
    assert records[1]["lr"] < records[2]["lr"]  # warmup
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert (run_dir / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    kept = sorted(p.name for p in (run_dir / "checkpoints").glob("step-*"))
    assert kept == ["step-00000004", "step-00000006"]  # num_keep=2
    assert (run_dir / "checkpoints" / "latest").read_text() == "step-00000006"

    out = tmp_path / "export"
    r = subprocess.run([sys.executable, "-m", "train.export", str(run_dir), str(out)], cwd=REPO,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    from models.dit.model import VideoDiT

    ema = VideoDiT.from_pretrained(out / "transformer")
    r = subprocess.run([sys.executable, "-m", "train.export", str(run_dir), str(tmp_path / "raw"), "--weights",
                        "model"], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    raw = VideoDiT.from_pretrained(tmp_path / "raw" / "transformer")
    diff = max((a - b).abs().max().item() for a, b in zip(ema.parameters(), raw.parameters(), strict=True))
    assert diff > 0  # the average lags the weights
    x = torch.randn(1, 3, 8, 32, 48)
    assert ema(x, torch.rand(1), torch.randn(1, 4, 384)).shape == x.shape


def test_kill_9_mid_training_then_resume_repeats_the_uninterrupted_losses(shards, tmp_path):
    """FSDP2 over 2 processes: killed mid-run and resumed, the same losses bit for bit as a whole run;
    the whole run's last checkpoint loads into one process (reshards)."""
    args = ["num_steps=8", "checkpoint.every_steps=2", "parallel=fsdp2"]
    whole = tmp_path / "whole"
    r = train(2, overrides(whole, shards, *args))
    assert r.returncode == 0, r.stdout + r.stderr

    cut = tmp_path / "cut"
    proc = start(2, overrides(cut, shards, *args), tmp_path / "cut.log")
    wait_for_step(cut, 5, proc)
    kill_9(proc)
    saved = find_latest(cut / "checkpoints")
    assert saved is not None and saved.name in ("step-00000004", "step-00000006")
    resume_step = int(saved.name.split("-")[1])
    r = train(2, overrides(cut, shards, *args))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"resumed from {saved}" in r.stdout

    expected, got = losses(whole), losses(cut)
    assert sorted(got) == list(range(1, 9))
    for step in range(resume_step + 1, 9):
        assert got[step] == expected[step], (step, got[step], expected[step])  # bit-exact

    assert_reshards_to_one_process(find_latest(whole / "checkpoints"), shards, tmp_path)


def test_sigterm_writes_a_checkpoint_that_resumes_and_reshards_to_one_process(shards, tmp_path):
    run_dir = tmp_path / "run"
    args = ["checkpoint.every_steps=1000", "parallel=cp2_ulysses"]
    proc = start(2, overrides(run_dir, shards, "num_steps=1000", *args), tmp_path / "run.log")
    wait_for_step(run_dir, 3, proc)
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=120)
    log = (tmp_path / "run.log").read_text()
    saved = find_latest(run_dir / "checkpoints")
    assert saved is not None, log
    step = int(saved.name.split("-")[1])
    assert step >= 3 and f"stopped by a signal at step {step}" in log

    r = train(2, overrides(run_dir, shards, f"num_steps={step + 2}", *args))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"resumed from {saved} at step {step}" in r.stdout
    assert max(losses(run_dir)) == step + 2

    assert_reshards_to_one_process(saved, shards, tmp_path)


def assert_reshards_to_one_process(checkpoint: Path, shards: str, tmp_path: Path) -> None:
    """Loaded into a one-process trainer, the weights and their average equal what the ranks saved
    (read back by DCP's own converter, which knows nothing of our model)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from train.main import Trainer

    flat = tmp_path / "flat.pt"
    dcp_to_torch_save(checkpoint, flat)
    saved = torch.load(flat, weights_only=False)
    args = overrides(tmp_path / "single", shards, "num_steps=100", f"checkpoint.resume={checkpoint}")
    cfg = conf.compose("train", args)
    trainer = Trainer(cfg)
    trainer.resume()
    assert trainer.step == int(checkpoint.name.split("-")[1])
    state = trainer.model.state_dict()
    assert set(state) == set(saved["model"])
    for name, value in state.items():
        assert torch.equal(value, saved["model"][name]), name
        assert torch.equal(trainer.ema.shadow[name], saved["ema"][name]), name


def test_partial_or_corrupt_checkpoints_are_never_resumed(one_process_run, shards, tmp_path):
    root = tmp_path / "checkpoints"
    shutil.copytree(one_process_run / "checkpoints", root)
    good = root / "step-00000006"
    no_marker = root / "step-00000007"  # a crash before the marker was written
    shutil.copytree(good, no_marker)
    (no_marker / "checkpoint.json").unlink()
    truncated = root / "step-00000008"  # a file cut short after the marker
    shutil.copytree(good, truncated)
    distcp = next(truncated.glob("*.distcp"))
    distcp.write_bytes(distcp.read_bytes()[:100])
    no_metadata = root / "step-00000009"
    shutil.copytree(good, no_metadata)
    (no_metadata / ".metadata").unlink()
    shutil.copytree(good, root / ".tmp-step-00000010")  # a save still in flight
    (root / "latest").write_text("step-00000008")
    assert [is_complete(p) for p in (good, no_marker, truncated, no_metadata)] == [True, False, False, False]
    assert find_latest(root) == good

    run_dir = tmp_path
    cfg = conf.compose("train", overrides(run_dir, shards, "num_steps=100"))
    from train.main import Trainer

    trainer = Trainer(cfg)
    assert trainer.resume() == good and trainer.step == 6


def write_latent_shard(path: Path, num: int, value: float) -> None:
    """Precomputed samples (`latent.npy` + `text_emb.npy`) filled with `value`."""
    with tarfile.open(path, "w") as tar:
        for i in range(num):
            key = f"lat{i:03d}"
            members = {"latent.npy": np.full((3, 8, 32, 48), value, np.float32),
                       "text_emb.npy": np.full((4, 384), 0.1, np.float32)}
            for ext, array in members.items():
                buf = io.BytesIO()
                np.save(buf, array)
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = buf.tell()
                buf.seek(0)
                tar.addfile(info, buf)
            for ext, text in (("txt", "a red square"), ("json", json.dumps({"key": key}))):
                data = text.encode()
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def test_nan_steps_are_skipped_and_counted_then_the_run_stops_with_a_checkpoint(tmp_path):
    write_latent_shard(tmp_path / "nan.tar", 12, float("nan"))
    run_dir = tmp_path / "run"
    r = train(1, [f"run_dir={run_dir}", f"data.shards={tmp_path / 'nan.tar'}", "data.tokens_per_batch=6144",
                  "data.num_workers=0", "num_steps=50", "max_nonfinite_steps=3"])
    assert r.returncode == 2
    assert "3 steps in a row had a NaN/Inf loss" in r.stderr
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [rec["nonfinite_steps"] for rec in records.values()] == [1, 2, 3]
    assert all(rec["skipped_step"] for rec in records.values())
    assert find_latest(run_dir / "checkpoints").name == "step-00000003"


@pytest.mark.parametrize("case,extra,message", [
    ("missing data", ["parallel=fsdp2", "data.shards=/nonexistent/*.tar"], "names no .tar shards"),
    ("impossible layout", ["parallel=cp2_tp2"], "but the world size is 2"),
    ("heads vs tp", ["parallel=tp2", "model.num_heads=3", "model.hidden_size=48"], "does not divide by parallel.tp=2"),
])
def test_bad_setups_fail_clearly_before_any_process_group(case, extra, message, shards, tmp_path, without_torch):
    """Each rank, as torchrun starts it (WORLD_SIZE=2), says what to change before it imports torch:
    here a `torch` that cannot be imported comes first on the path. Each rank imported torch, the
    model and its libraries first (5 s, on every rank) and said it in the trainer."""
    env = {**without_torch, "WORLD_SIZE": "2", "RANK": "1"}
    args = overrides(tmp_path / "run", shards, "num_steps=2") + extra
    r = subprocess.run(command(1, args), cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2 and r.stderr.startswith("vfm-train: ") and r.stderr.count("\n") == 1, r.stderr[-2000:]
    assert message in r.stderr, r.stderr[-2000:]


def test_vfm_encode_on_a_ray_address_that_does_not_answer_exits_at_once_saying_so(tmp_path):
    """vfm-encode joins a cluster as vfm-curate does: nothing listening at the address is one line
    naming it, at once (Ray itself retried it for minutes), not a traceback."""
    write_test_shards(tmp_path / "raw", seed=1, num_shards=1, per_shard=2)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]  # free once the socket closes: nothing listens there
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "train.encode", f"input={tmp_path / 'raw'}", f"output={tmp_path / 'o'}",
                        f"ray.address=127.0.0.1:{closed_port}"], cwd=REPO, capture_output=True, text=True, timeout=120,
                       env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})
    assert r.returncode == 1 and time.monotonic() - t0 < 30, r.stderr[-2000:]
    assert f"vfm-encode: ray.address='127.0.0.1:{closed_port}': cannot join that Ray cluster: nothing answers" \
        in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]


def test_training_on_vfm_encode_output_gives_the_losses_of_encoding_on_the_fly(ray_local, tmp_path):
    """Clips exactly the bucket's size, so training's random window and crop and encoding's centred
    ones take the same pixels."""
    from train.encode import encode

    raw = tmp_path / "raw"
    write_test_shards(raw, seed=5, num_shards=3, per_shard=4, sizes=((48, 32), (32, 48)), num_frames=8)
    with tarfile.open(tmp_path / "broken.tar", "w") as tar:  # a sample that cannot decode, alone in its shard
        for ext, data in (("mp4", b"\x00" * 500), ("txt", b"broken"),
                          ("json", json.dumps({"num_frames": 8, "fps": 24, "width": 48, "height": 32}).encode())):
            info = tarfile.TarInfo(f"broken.{ext}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    out = tmp_path / "encoded"
    cfg = conf.compose("encode", [f"input={raw}::{tmp_path / 'broken.tar'}", f"output={out}", *DATA[:1]])
    summary = encode(cfg, log=lambda _: None)
    assert summary["num_samples"] == 12 and summary["num_failed"] == 1
    records = [json.loads(line) for line in (out / "encode.jsonl").read_text().splitlines()]
    assert any("broken" in r["failed"] and r["failed"]["broken"].startswith("decode") for r in records)
    assert encode(cfg, log=lambda _: None)["num_samples"] == 12  # a rerun skips the written shards
    # Other clips would mix with the written shards' latents: refused, naming what differs. A setting
    # of training's alone (the loader's workers) is no difference.
    given = [f"input={raw}::{tmp_path / 'broken.tar'}", f"output={out}", *DATA[:1]]
    with pytest.raises(ValueError, match="data.frame_stride=1 there, 2 here"):
        encode(conf.compose("encode", [*given, "data.frame_stride=2"]), log=lambda _: None)
    assert encode(conf.compose("encode", [*given, "data.num_workers=7"]), log=lambda _: None)["num_samples"] == 12

    runs = {}
    for name, shards in (("fly", str(raw)), ("pre", str(out / "shards" / "shard-00000{0..2}.tar"))):
        run_dir = tmp_path / name
        r = train(1, overrides(run_dir, shards, "num_steps=4", "data.caption_dropout=0", "checkpoint.every_steps=100"))
        assert r.returncode == 0, r.stdout + r.stderr
        runs[name] = losses(run_dir)
    assert list(runs["pre"]) == [1, 2, 3, 4]
    for step, loss in runs["fly"].items():
        assert abs(runs["pre"][step] - loss) <= 1e-5 * loss, (step, runs["pre"][step], loss)
