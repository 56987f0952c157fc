"""What a training run reports, from rank 0: `metrics.jsonl` (one record per step, appended across
resumes), TensorBoard event files, a progress bar on a terminal (plain lines otherwise), and
`loss.png` at the end.

MFU is model FLOPs (models.dit.model.flops_per_token) per second over the devices' peak: a table for
known GPUs in bf16, and on CPU a measured fp32 matmul, the ceiling these cores can reach.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch

# Dense bf16 tensor-core peaks (FLOP/s), from the vendors' datasheets.
GPU_PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12}


def measure_cpu_matmul_peak(n: int = 1024, repeats: int = 5) -> float:
    """FLOP/s of the best of a few fp32 (n x n) matmuls on this process's threads."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm-up: thread pool and allocator
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def peak_flops(device: torch.device, configured: float | None) -> float:
    if configured:
        return configured
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, flops in GPU_PEAK_BF16.items():
            if key in name:
                return flops
        raise ValueError(f"no peak FLOP/s known for {name!r}: set peak_flops=<FLOP/s per device>")
    return measure_cpu_matmul_peak()


def peak_memory_mib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


class Metrics:
    """Every call is a no-op except on the rank that reports."""

    def __init__(self, run_dir: Path, num_steps: int, start_step: int, log_every: int, enabled: bool):
        self.enabled = enabled
        self.run_dir = Path(run_dir)
        self.log_every = max(1, log_every)
        if not enabled:
            return
        from torch.utils.tensorboard import SummaryWriter

        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = open(self.run_dir / "metrics.jsonl", "a")
        self.tb = SummaryWriter(str(self.run_dir / "tensorboard"), purge_step=start_step + 1)
        self.bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=num_steps, initial=start_step, unit="step", dynamic_ncols=True)

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        step = record["step"]
        self.jsonl.write(json.dumps(record) + "\n")
        self.jsonl.flush()
        if step % self.log_every == 0:
            for key, value in record.items():
                if key != "step" and isinstance(value, int | float):
                    self.tb.add_scalar(f"train/{key}", value, step)
        short = (f"step {step} loss {record['loss']:.4f} grad_norm {record['grad_norm']:.3f} lr {record['lr']:.2e} "
                 f"{record['samples_per_s']:.2f} samples/s MFU {100 * record['mfu']:.1f}% "
                 f"data wait {100 * record['data_wait']:.0f}%")
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix_str(short.split(" ", 2)[2])
        elif step % self.log_every == 0:
            print(short, flush=True)

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.close()
        self.tb.close()
        self.jsonl.close()
        plot_loss(self.run_dir / "metrics.jsonl", self.run_dir / "loss.png")


def read_metrics(path: Path) -> dict[int, dict]:
    """step -> its record; a step logged again after a resume keeps its newest record."""
    records = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                record = json.loads(line)
                records[record["step"]] = record
    return dict(sorted(records.items()))


def plot_loss(metrics: Path, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(metrics)
    steps = list(records)
    losses = [records[s]["loss"] for s in steps]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, losses, lw=0.8, alpha=0.4, label="loss")
    if len(losses) >= 10:
        k = max(2, len(losses) // 20)
        smooth = np.convolve(losses, np.ones(k) / k, mode="valid")  # running mean of k
        ax.plot(steps[k - 1:], smooth, lw=1.5, label=f"mean of {k}")
    ax.set_xlabel("step")
    ax.set_ylabel("flow-matching loss")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
