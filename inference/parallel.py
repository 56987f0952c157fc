"""Parallel sampling under torchrun: CFG-parallel (the conditional and unconditional branches on two
ranks) times context parallel (the training code's CP attention over `cp` ranks).

    world = (2 if cfg_parallel else 1) x cp
    mesh axes: dp_shard (= the CFG pair), cp_ring, cp_ulysses (train/parallel_dims.py's mesh, with
    its data-parallel axis used for the two CFG branches and tp fixed at 1)

Every rank runs the same sampling loop on the same inputs (same seeds, same prompts) and ends with
the same latents; rank 0 writes the result.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from inference.pipeline import VideoPipeline
from train.parallel_dims import ParallelDims
from train.parallelize import apply_cp


def sampling_dims(parallel, cfg_parallel: bool, world_size: int) -> ParallelDims:
    """The layout, checked before any process group exists."""
    if parallel.tp != 1 or parallel.dp_shard != 1 or parallel.dp_replicate != 1:
        raise ValueError("sampling splits work by cfg_parallel and parallel.cp only; use parallel=single or a cp "
                         f"option (got dp_replicate={parallel.dp_replicate}, dp_shard={parallel.dp_shard}, "
                         f"tp={parallel.tp})")
    cfg = 2 if cfg_parallel else 1
    if cfg * parallel.cp != world_size:
        raise ValueError(f"{world_size} process(es), but cfg_parallel={cfg_parallel} x parallel.cp={parallel.cp} "
                         f"needs {cfg * parallel.cp}")
    return ParallelDims(1, cfg, parallel.cp, 1, world_size, parallel.cp_kind)


def init_parallel(pipe: VideoPipeline, dims: ParallelDims) -> None:
    """Join the process group torchrun describes and make `pipe` sample across it."""
    if dims.world_size == 1:
        return
    if not dist.is_initialized():
        dist.init_process_group("nccl" if pipe.device.type == "cuda" else "gloo")
    mesh = dims.build_mesh(pipe.device.type)
    dims.check_model(pipe.transformer.config.num_heads)
    if dims.cp > 1:
        apply_cp(pipe.transformer, dims, mesh)
    if dims.dp_shard == 2:
        pipe.cfg_group = mesh["dp"].get_group()
        pipe.cfg_rank = mesh["dp"].get_local_rank()


def broadcast_batch(requests: list | None) -> list | None:
    """Rank 0's next batch of requests to every rank (None: the server is stopping)."""
    box = [requests]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def broadcast_flag(flag: bool) -> bool:
    """Rank 0's decision, after each step, whether the batch goes on."""
    t = torch.tensor([int(flag)])
    dist.broadcast(t, src=0)
    return bool(t.item())


def serve_worker(pipe: VideoPipeline) -> None:
    """A rank other than 0 of a server: sample each batch rank 0 sends, until it sends None."""
    from inference.server import Cancelled

    def progress(step: int, total: int) -> None:
        if not broadcast_flag(True):
            raise Cancelled

    while (requests := broadcast_batch(None)) is not None:
        try:
            pipe(requests, progress)
        except Cancelled:
            continue


def world() -> tuple[int, int]:
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def finish(device: torch.device, code: int = 0) -> None:
    """Leave the group; on CPU without teardown (gloo can abort a process that tears it down at exit)."""
    if not dist.is_initialized():
        return
    dist.barrier()
    if device.type == "cpu":
        import sys

        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    dist.destroy_process_group()
