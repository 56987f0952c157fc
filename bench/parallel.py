"""Context parallelism on real processes over gloo: per-rank activation memory and bytes
communicated per layer, for one fixed long sequence, at cp = 1, 2, 4 (Ulysses and ring); and the
activation memory of tensor parallelism at tp = 2 without and with sequence parallelism.

Activation memory: the bytes autograd saves for the backward pass during one forward, counted with
saved-tensor hooks (what activation memory is, on any device). Communication: the bytes each rank
sends in the all-to-alls (Ulysses) and ring passes (ring), counted per layer for forward+backward,
beside what the algorithms should send: Ulysses 4 all-to-alls forward and 4 backward, each sending
(P-1)/P of a rank's (B, N/P, D) tensor; ring P-1 passes of K and V forward, and of K, V, dK, dV
backward plus one last dK, dV pass.

    python bench/parallel.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

HIDDEN, HEADS, LAYERS = 128, 4, 2
SHAPE = (1, 3, 8, 48, 48)  # patch (1, 2, 2): 8 * 24 * 24 = 4608 video tokens


def worker(rank: int, world: int, kind: str, rendezvous: str, out: str) -> None:
    import torch
    import torch.distributed as dist

    import train.parallelize as par
    from models.dit.model import build
    from train.parallel_dims import ParallelDims

    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    sent = {"bytes": 0}
    a2a, ring_pass = dist.all_to_all_single, par._ring_pass

    def counting_a2a(output, input, *args, group=None, **kwargs):
        # The autograd all-to-all calls this in both directions; a rank keeps 1/P of what it holds.
        p = dist.get_world_size(group)
        sent["bytes"] += input.numel() * input.element_size() * (p - 1) // p
        return a2a(output, input, *args, group=group, **kwargs)

    def counting_ring(tensors, group):
        sent["bytes"] += sum(t.numel() * t.element_size() for t in tensors)
        return ring_pass(tensors, group)

    dist.all_to_all_single, par._ring_pass = counting_a2a, counting_ring
    torch.manual_seed(0)
    model = build("debug", hidden_size=HIDDEN, num_heads=HEADS, num_layers=LAYERS)
    if world > 1 and kind.startswith("tp"):
        dims = ParallelDims(1, 1, 1, world, world, sequence_parallel=kind == "tp_sp")
        par.parallelize(model, dims, dims.build_mesh("cpu"))
    elif world > 1:
        dims = ParallelDims(1, 1, world, 1, world, kind)
        par.parallelize(model, dims, dims.build_mesh("cpu"))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*SHAPE, generator=g)
    t, y, mask = torch.rand(1, generator=g), torch.randn(1, 8, 384, generator=g), torch.ones(1, 8, dtype=torch.bool)

    seen, saved = set(), {"bytes": 0}

    def pack(tensor):
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor  # a DTensor's shard on this rank
        try:
            key, nbytes = local.untyped_storage().data_ptr(), local.untyped_storage().nbytes()
        except RuntimeError:  # a tensor without an accessible storage: count its own bytes
            key, nbytes = id(local), local.numel() * local.element_size()
        if key not in seen:  # count each buffer once, however many views are saved
            seen.add(key)
            saved["bytes"] += nbytes
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        pred = model(x, t, y, mask)
    pred.square().mean().backward()
    result = {"saved_bytes": saved["bytes"], "sent_bytes_per_layer": sent["bytes"] / LAYERS}
    gathered = [None] * world
    dist.all_gather_object(gathered, result)
    if rank == 0:
        Path(out).write_text(json.dumps(gathered))
    dist.barrier()  # every rank's sends done, and rank 0's results written, before anyone leaves
    # Leave without interpreter teardown: gloo's threads can abort a process that destroys its
    # group at exit ("terminate called without an active exception") after all the work is done.
    os._exit(0)


def run(world: int, kind: str) -> dict:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        mp.start_processes(worker, args=(world, kind, str(Path(tmp) / "rdzv"), str(out)), nprocs=world,
                           join=True, start_method="spawn")
        ranks = json.loads(out.read_text())
    return {"saved": max(r["saved_bytes"] for r in ranks), "sent": max(r["sent_bytes_per_layer"] for r in ranks)}


def expected_bytes(kind: str, p: int) -> float:
    """What one rank should send per layer, forward + backward (fp32)."""
    n = SHAPE[2] * SHAPE[3] // 2 * SHAPE[4] // 2
    local = SHAPE[0] * (-(-n // p)) * HIDDEN * 4  # one (B, N/P, D) tensor
    if kind == "ulysses":
        return 8 * local * (p - 1) / p
    return (2 * (p - 1) + 4 * (p - 1) + 2) * local


def main() -> None:
    base = run(1, "ulysses")
    rows, figures = [], {}
    for kind in ("ulysses", "ring"):
        for p in (2, 4):
            r = run(p, kind)
            ratio = r["saved"] / base["saved"]
            rows.append((kind, p, r["saved"], ratio, r["sent"], expected_bytes(kind, p)))
            figures[f"act_mem_ratio_{kind}_cp{p}"] = round(ratio, 3)
            figures[f"sent_mib_per_layer_{kind}_cp{p}"] = round(r["sent"] / 2**20, 3)
    tp = {kind: run(2, kind)["saved"] / base["saved"] for kind in ("tp", "tp_sp")}
    figures.update({f"act_mem_ratio_{kind}2": round(ratio, 3) for kind, ratio in tp.items()})
    n = SHAPE[2] * SHAPE[3] // 2 * SHAPE[4] // 2
    print(f"model hidden {HIDDEN}, {HEADS} heads, {LAYERS} layers; {n} video tokens; fp32 on CPU over gloo")
    print(f"cp=1: {base['saved'] / 2**20:.1f} MiB saved for backward")
    header = ("kind", "cp", "act MiB", "vs cp=1", "target", "sent MiB/layer", "expected")
    print("{:8s} {:>3s} {:>9s} {:>8s} {:>7s} {:>15s} {:>9s}".format(*header))
    for kind, p, saved, ratio, sent, exp in rows:
        target = {2: "<=0.60", 4: "<=0.35"}[p]
        mib = 2**20
        print(f"{kind:8s} {p:3d} {saved / mib:9.1f} {ratio:8.3f} {target:>7s} {sent / mib:15.3f} {exp / mib:9.3f}")
    print(f"tp=2 activation memory vs one device: {tp['tp']:.3f} without sequence parallel, "
          f"{tp['tp_sp']:.3f} with it")
    print(json.dumps({"bench": "parallel", "tokens": n, **figures}))


if __name__ == "__main__":
    main()
