"""VideoDiT training throughput: forward+backward tokens/s and MFU against the matmul peak
measured in the same run (fp32 on CPU; bf16 autocast on CUDA, with the ~1B flavor).

    python bench/models.py [--steps 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.dit.model import build, flops_per_token  # noqa: E402

TEXT_LEN, TEXT_DIM = 16, 384


def matmul_peak(device: str, dtype: torch.dtype, n: int, reps: int = 5) -> float:
    """Best FLOP/s of an n x n x n matrix product."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(reps + 1):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        a @ b
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def step_time(model, x, t, y, mask, steps: int, device: str, amp: bool) -> float:
    """Best seconds of one forward+backward over `steps` timed steps, after a warm-up step."""
    best = float("inf")
    for i in range(steps + 1):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast(device, dtype=torch.bfloat16, enabled=amp):
            out = model(x, t, y, mask)
        out.float().square().mean().backward()
        if device == "cuda":
            torch.cuda.synchronize()
        if i:
            best = min(best, time.perf_counter() - t0)
        model.zero_grad(set_to_none=True)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2, help="timed steps per case, after one warm-up step")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    dtype = torch.bfloat16 if cuda else torch.float32
    peak = matmul_peak(device, dtype, 8192 if cuda else 2048)
    # (flavor, batch, frames, height, width): patch (1, 2, 2) gives frames * height/2 * width/2 tokens.
    cases = [("debug", 4, 4, 32, 32), ("dit_130m", 1, 4, 32, 32), ("dit_130m", 1, 8, 32, 32)]
    if cuda:
        cases = [("dit_130m", 4, 8, 64, 64), ("dit_1b", 2, 8, 64, 64), ("dit_1b", 1, 16, 96, 96)]
    rows, figures = [], {}
    torch.manual_seed(0)
    for flavor, b, frames, h, w in cases:
        model = build(flavor).to(device)
        x = torch.randn(b, 3, frames, h, w, device=device)
        t = torch.rand(b, device=device)
        y = torch.randn(b, TEXT_LEN, TEXT_DIM, device=device)
        mask = torch.ones(b, TEXT_LEN, dtype=torch.bool, device=device)
        tokens = frames * (h // 2) * (w // 2)
        sec = step_time(model, x, t, y, mask, args.steps, device, amp=cuda)
        tok_s = b * tokens / sec
        mfu = flops_per_token(model, tokens, TEXT_LEN) * tok_s / peak
        rows.append((flavor, model.config.hidden_size, b, tokens, sec, tok_s, mfu))
        figures[f"mfu_{flavor}_{tokens}tok"] = round(mfu, 4)
        figures[f"tokens_per_s_{flavor}_{tokens}tok"] = round(tok_s, 1)
        del model
    print(f"device {device}, {dtype}; matmul peak measured {peak / 1e9:.1f} GFLOP/s")
    print(f"{'flavor':10s} {'hidden':>6s} {'batch':>5s} {'tokens':>7s} {'step s':>8s} {'tokens/s':>10s} {'MFU':>6s}")
    for flavor, hidden, b, tokens, sec, tok_s, mfu in rows:
        print(f"{flavor:10s} {hidden:6d} {b:5d} {tokens:7d} {sec:8.3f} {tok_s:10.1f} {mfu:6.1%}")
    print(json.dumps({"bench": "models", "device": device, "matmul_peak_gflops": round(peak / 1e9, 1), **figures}))


if __name__ == "__main__":
    main()
