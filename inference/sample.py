"""`vfm-sample checkpoint=<exported dir> prompt="..." output=<file.mp4> [num_frames= height= width=
steps= guidance_scale= seed=]`; across ranks: `torchrun --nproc-per-node N -m inference.sample ...
[cfg_parallel=true] [parallel=cp2_ulysses]`. The same seed gives the same video."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from omegaconf import DictConfig

from inference.parallel import finish, init_parallel, sampling_dims, world
from inference.pipeline import Request, VideoPipeline, write_gif, write_mp4


def sample(cfg: DictConfig) -> int:
    rank, world_size = world()
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    try:
        dims = sampling_dims(cfg.parallel, cfg.cfg_parallel, world_size)
        pipe = VideoPipeline.from_export(cfg.checkpoint, cfg.diffusion.scheduler, cfg.diffusion.shift, device)
        request = Request(cfg.prompt, cfg.negative_prompt, cfg.num_frames, cfg.height, cfg.width, cfg.steps,
                          cfg.guidance_scale, cfg.seed)
        problems = pipe.limits().check(request)
        if problems:
            raise ValueError("; ".join(problems))
    except (ValueError, FileNotFoundError) as e:
        print(f"vfm-sample: {e}", file=sys.stderr, flush=True)
        return 2
    init_parallel(pipe, dims)

    tty = sys.stdout.isatty()

    def progress(step, total):
        if rank != 0:
            return
        if tty:  # one line, redrawn
            print(f"\rstep {step}/{total}", end="\n" if step == total else "", flush=True)
        elif step == total or step % max(1, total // 4) == 0:  # a log: a few plain lines
            print(f"step {step}/{total}", flush=True)

    frames, timings = pipe([request], progress)
    if rank == 0:
        out = Path(cfg.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        write_mp4(frames[0], out, cfg.fps)
        write_gif(frames[0], out.with_suffix(".gif"), cfg.fps)
        print(f"wrote {out} and {out.with_suffix('.gif')}: {frames.shape[1]} frames {cfg.width}x{cfg.height}, "
              f"{cfg.steps} steps in {timings['sample_s']:.1f} s on {world_size} process(es)")
    finish(device)
    return 0


def main() -> None:
    """`python -m inference.sample` and torchrun's entry: vfm-sample's (inference.cli)."""
    from inference.cli import sample_main

    sample_main()


if __name__ == "__main__":
    main()
