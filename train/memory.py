"""Per-device training memory of a VideoDiT layout, predicted before renting the machines.

    states       = parameters x (4 weights + 4 gradients + 8 AdamW moments + 4 EMA) bytes, fp32,
                   sharded over dp_shard x tp (FSDP2 and tensor parallel)
    gathered     = one block's full fp32 weights while FSDP2 has it unsharded (x2: prefetch)
    activations  = (ACT_ELEMENTS per layer + OUTSIDE_ELEMENTS) x (tokens / cp) x hidden elements saved
                   for backward (tensor parallel with sequence parallel also divides the tokens by
                   tp); with activation checkpointing each block keeps only its input (1 per layer),
                   plus one block's full set while it is recomputed

The constants are measured by bench/memory.py (saved-tensor bytes of a real forward on the CPU) and
the formula is checked there across hidden sizes 64-512, depths and token counts. Bytes per
activation element: 2 under bf16 autocast, 4 in fp32. What it leaves out: the CUDA context and the
allocator's fragmentation (allow ~10-20%), the frozen text encoder and autoencoder.

    python -m train.memory --flavor dit_7b --frames 129 --height 720 --width 1280 --dp-shard 8 --cp 8
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch

from models.dit.model import build

# Elements saved for backward per video token per hidden unit: per block at mlp_ratio 4, and outside
# the blocks (patch embedding, final layer, output), of which block 0's input is one.
ACT_ELEMENTS = 32.0
OUTSIDE_ELEMENTS = 4.0
GIB = 2**30


@dataclass
class Layout:
    dp_shard: int = 1
    cp: int = 1
    tp: int = 1
    sequence_parallel: bool = False
    activation_checkpointing: bool = False


def model_shape(flavor: str, **overrides) -> dict:
    """Parameter counts of a flavor without allocating it (meta device)."""
    with torch.device("meta"):
        model = build(flavor, **overrides)
    block = sum(p.numel() for p in model.blocks[0].parameters())
    cfg = model.config
    return {"params": sum(p.numel() for p in model.parameters()), "block_params": block,
            "hidden_size": cfg.hidden_size, "num_layers": cfg.num_layers, "patch_size": tuple(cfg.patch_size)}


def video_tokens(shape: dict, frames: int, height: int, width: int, temporal: int = 4, spatial: int = 8) -> int:
    """Tokens of one clip after the autoencoder (causal in time: 1 + (frames - 1) / temporal) and patching."""
    pt, ph, pw = shape["patch_size"]
    latent_t = 1 + (frames - 1) // temporal if temporal > 1 else frames
    return (latent_t // pt) * (height // spatial // ph) * (width // spatial // pw)


def estimate(shape: dict, tokens: int, batch: int, layout: Layout, act_bytes: int = 2) -> dict:
    """Predicted bytes per device, by part and in total."""
    shard = layout.dp_shard * layout.tp
    states = 20 * shape["params"] / shard
    gathered = 2 * 4 * shape["block_params"] / layout.tp if layout.dp_shard > 1 else 0
    local_tokens = batch * -(-tokens // layout.cp)
    if layout.tp > 1 and layout.sequence_parallel:
        local_tokens /= layout.tp
    unit = local_tokens * shape["hidden_size"] * act_bytes  # one (tokens, hidden) tensor
    if layout.activation_checkpointing:
        activations = (shape["num_layers"] + OUTSIDE_ELEMENTS - 1) * unit + ACT_ELEMENTS * unit
    else:
        activations = (shape["num_layers"] * ACT_ELEMENTS + OUTSIDE_ELEMENTS) * unit
    total = states + gathered + activations
    return {"states": states, "gathered": gathered, "activations": activations, "total": total}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--flavor", default="dit_1b")
    p.add_argument("--frames", type=int, default=33)
    p.add_argument("--height", type=int, default=256)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--batch", type=int, default=1, help="clips per device")
    p.add_argument("--dp-shard", type=int, default=1)
    p.add_argument("--cp", type=int, default=1)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--sequence-parallel", action="store_true")
    p.add_argument("--checkpointing", action="store_true", help="activation checkpointing per block")
    p.add_argument("--fp32", action="store_true", help="activations in fp32 (the CPU path)")
    a = p.parse_args(argv)
    shape = model_shape(a.flavor)
    tokens = video_tokens(shape, a.frames, a.height, a.width)
    layout = Layout(a.dp_shard, a.cp, a.tp, a.sequence_parallel, a.checkpointing)
    e = estimate(shape, tokens, a.batch, layout, 4 if a.fp32 else 2)
    print(f"{a.flavor}: {shape['params'] / 1e9:.2f}B parameters, {tokens} tokens per clip, {a.batch} clip(s) per "
          f"device, "
          f"dp_shard={a.dp_shard} cp={a.cp} tp={a.tp}{' +SP' if a.sequence_parallel else ''}"
          f"{' +checkpointing' if a.checkpointing else ''}")
    for part in ("states", "gathered", "activations", "total"):
        print(f"  {part:12} {e[part] / GIB:8.1f} GiB")


if __name__ == "__main__":
    main()
