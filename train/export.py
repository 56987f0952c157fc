"""`vfm-export <checkpoint or run dir> <output dir> [--weights ema|model]`: a training checkpoint
(any parallel layout) to the folder inference loads, in one process:

    <output>/transformer/   config.json + diffusion_pytorch_model.safetensors (diffusers ModelMixin)
    <output>/vfm.yaml       the text encoder, autoencoder and diffusion configs it was trained with,
                            the step, and the checkpoint it came from

The EMA weights by default. The folder is written under a temporary name and renamed when complete.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import torch.distributed.checkpoint as dcp
from omegaconf import OmegaConf

from models.dit.model import VideoDiT, build
from train.checkpoint import find_latest, is_complete, quiet_dcp, read_meta


def resolve_checkpoint(path: Path) -> Path:
    """A checkpoint directory as given, or the newest complete one of a run directory."""
    path = Path(path)
    if is_complete(path):
        return path
    for root in (path / "checkpoints", path):
        found = find_latest(root) if root.is_dir() else None
        if found is not None:
            return found
    raise FileNotFoundError(f"{path} is neither a complete checkpoint nor a run directory with one")


def model_from_config(model_cfg, in_channels: int, text_dim: int) -> VideoDiT:
    """The VideoDiT a `model` config describes (the run's DictConfig, or a checkpoint's dict)."""
    m = model_cfg
    return build(m["flavor"], hidden_size=m["hidden_size"], num_layers=m["num_layers"], num_heads=m["num_heads"],
                 mlp_ratio=m["mlp_ratio"], patch_size=tuple(m["patch_size"]), adaln_lora_rank=m["adaln_lora_rank"],
                 qk_norm=m["qk_norm"], pooled_text=m.get("pooled_text", False),  # both absent in older checkpoints
                 absolute_positions=m.get("absolute_positions", False),
                 in_channels=in_channels, text_dim=text_dim)


def load_weights(checkpoint: Path, which: str = "ema") -> tuple[VideoDiT, dict]:
    """A single-device VideoDiT with the checkpoint's EMA (or raw) weights, and the checkpoint's meta."""
    from models.autoencoder import build_autoencoder
    from models.text_encoder import build_text_encoder

    meta = read_meta(checkpoint)
    cfg = meta["config"]
    # The shapes the trainer built: input channels from the autoencoder, text width from the encoder.
    autoencoder = build_autoencoder(OmegaConf.create(cfg["autoencoder"]))
    text_dim = build_text_encoder(OmegaConf.create(cfg["text_encoder"])).dim
    model = model_from_config(cfg["model"], autoencoder.latent_channels, text_dim)
    state = {which: dict(model.state_dict())}
    with quiet_dcp():
        dcp.load(state, checkpoint_id=str(checkpoint))
    model.load_state_dict(state[which])
    return model.eval(), meta


def save_export(model: VideoDiT, output: Path, info: dict) -> Path:
    """The inference folder: transformer/ and vfm.yaml (`info`: at least text_encoder, autoencoder and
    diffusion configs), written under a temporary name and renamed when complete."""
    output = Path(output)
    tmp = output.with_name(f".{output.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp / "transformer")
    (tmp / "vfm.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(info)))
    if output.exists():
        shutil.rmtree(output)
    tmp.rename(output)
    return output


def export(checkpoint: Path, output: Path, which: str = "ema") -> Path:
    checkpoint = resolve_checkpoint(checkpoint)
    model, meta = load_weights(checkpoint, which)
    cfg = meta["config"]
    info = {"step": meta["step"], "weights": which, "checkpoint": str(checkpoint.resolve()),
            "text_encoder": cfg["text_encoder"], "autoencoder": cfg["autoencoder"], "diffusion": cfg["diffusion"],
            "model": cfg["model"]}
    return save_export(model, output, info)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="vfm-export", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path, help="a checkpoint directory, or a run directory (its newest)")
    parser.add_argument("output", type=Path, help="the folder to write")
    parser.add_argument("--weights", choices=("ema", "model"), default="ema")
    args = parser.parse_args(argv)
    try:
        out = export(args.checkpoint, args.output, args.weights)
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"vfm-export: {e}")
    meta = OmegaConf.load(out / "vfm.yaml")
    print(f"exported step {meta.step} ({meta.weights} weights) from {meta.checkpoint} to {out}")


if __name__ == "__main__":
    main()
