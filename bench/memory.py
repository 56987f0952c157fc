"""Checks train/memory.py's memory model against what a real forward/backward holds on the CPU.

Activations: bytes of every tensor autograd saves for backward (each storage counted once) in one
fp32 training forward, across hidden sizes, depths and token counts, with and without activation
checkpointing, beside the model's prediction. States: the bytes of weights, gradients, AdamW moments
and EMA after a real optimizer step, beside 20 bytes per parameter. (The cp split of activations is
measured on 2 and 4 processes by bench/parallel.py: 0.51x and 0.27x of one process.)

    python bench/memory.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.dit.model import build  # noqa: E402
from train.memory import ACT_ELEMENTS, Layout, estimate, model_shape  # noqa: E402
from train.parallelize import apply_ac  # noqa: E402

# (hidden, layers, heads, frames, height, width): tokens = frames x height/2 x width/2 (1x2x2 patches)
CASES = [(64, 2, 4, 8, 32, 32), (128, 2, 4, 8, 32, 64), (256, 4, 8, 8, 64, 64), (512, 2, 8, 4, 64, 64)]


def saved_bytes(model, x, t, y, mask) -> int:
    seen, total = set(), [0]

    def pack(tensor):
        key, nbytes = tensor.untyped_storage().data_ptr(), tensor.untyped_storage().nbytes()
        if key not in seen:
            seen.add(key)
            total[0] += nbytes
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = model(x, t, y, mask)
    out.square().mean().backward()
    return total[0] - x.numel() * 4  # the input is the caller's, not an activation


def state_bytes(model) -> int:
    from train.ema import EMA

    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    ema = EMA(model, 0.999)
    tensors = [p for p in model.parameters()] + [p.grad for p in model.parameters()]
    tensors += [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0]
    tensors += list(ema.state_dict().values())
    return sum(t.numel() * t.element_size() for t in tensors)


def main() -> None:
    torch.manual_seed(0)
    worst = 0.0
    print(f"{'hidden':>6} {'layers':>6} {'tokens':>6} {'AC':>3} {'measured MiB':>13} {'predicted MiB':>14} "
          f"{'ratio':>6}")
    for hidden, layers, heads, frames, height, width in CASES:
        tokens = frames * height // 2 * width // 2
        for ac in (False, True):
            model = build("debug", hidden_size=hidden, num_layers=layers, num_heads=heads, in_channels=3, text_dim=384)
            if ac:
                apply_ac(model)
            x = torch.randn(1, 3, frames, height, width)
            y, mask = torch.randn(1, 8, 384), torch.ones(1, 8, dtype=torch.bool)
            measured = saved_bytes(model, x, torch.rand(1), y, mask)
            shape = model_shape("debug", hidden_size=hidden, num_layers=layers, num_heads=heads, in_channels=3,
                                text_dim=384)
            predicted = estimate(shape, tokens, 1, Layout(activation_checkpointing=ac), act_bytes=4)["activations"]
            if ac:  # forward saves only the block inputs; the recomputed block is held during backward
                predicted -= ACT_ELEMENTS * tokens * hidden * 4
            ratio = measured / predicted
            worst = max(worst, abs(ratio - 1))
            print(f"{hidden:6} {layers:6} {tokens:6} {'yes' if ac else 'no':>3} {measured / 2**20:13.2f} "
                  f"{predicted / 2**20:14.2f} {ratio:6.2f}")
    model = build("debug", hidden_size=256, num_layers=4, num_heads=8, in_channels=3, text_dim=384)
    states = state_bytes(model)
    params = sum(p.numel() for p in model.parameters())
    print(f"states of a {params / 1e6:.2f}M-parameter model after an AdamW step, with EMA: {states / params:.2f} "
          f"bytes per parameter (model: 20)")
    print(json.dumps({"bench": "memory", "act_elements_model": ACT_ELEMENTS, "worst_activation_error": round(worst, 3),
                      "state_bytes_per_param": round(states / params, 2)}))


if __name__ == "__main__":
    main()
