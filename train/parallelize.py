"""Parallelism applied to a single-device VideoDiT from outside, in torchtitan's order:
tensor parallel (optionally with sequence parallel), then context parallel, then activation
checkpointing, then FSDP2.

    parallelize(model, dims, mesh)      # before training
    loss.backward(); sync_gradients(model, dims, mesh)

Context parallelism splits the video tokens over the `cp` ranks. Each rank keeps every P-th token
(P = cp; the sequence padded to a multiple of P), so no rank holds more than one real token more
than another, computes its tokens' rotary positions, and attends to the whole sequence through a
replaced `AttentionCore`: Ulysses (all-to-all from sequence shards to head shards and back), ring
(key/value blocks passed round the ring, online-softmax merge, dK/dV sent home in backward) or the
two combined. Text keys stay whole on every rank; the final outputs are gathered so the loss sees
every token.

Tensor parallelism shards attention heads and the MLP's hidden units (DTensor plans). Sequence
parallelism (Megatron-LM's) adds to it: between the projections, the TP ranks of a block each hold
a contiguous 1/tp of the tokens, so norms, modulation and residuals run on a chunk; an all-gather
enters each column-parallel projection and a reduce-scatter leaves each row-parallel one.
"""

from __future__ import annotations

import re
import warnings

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn
import torch.nn.functional as F
from torch import nn

from models.dit.attention import AttentionCore
from models.dit.model import TokenLayout, VideoDiT
from train.parallel_dims import ParallelDims


class _GatherSequence(torch.autograd.Function):
    """All-gather of each rank's tokens along dim 1. Every CP rank computes the same loss from the
    gathered tokens, so each keeps only its own slice of the gradient (no reduction: summing the
    identical copies would count the loss P times)."""

    @staticmethod
    def forward(ctx, x, group, rank, size):
        ctx.rank, ctx.n = rank, x.shape[1]
        parts = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx, grad):
        return grad[:, ctx.rank * ctx.n:(ctx.rank + 1) * ctx.n].contiguous(), None, None, None


class StridedTokenLayout(TokenLayout):
    """Rank r of P keeps grid tokens r, r+P, r+2P, ... of the sequence padded to a multiple of P."""

    def __init__(self, group, rank: int, size: int):
        super().__init__()
        self.group, self.rank, self.size = group, rank, size
        self.key_valid: torch.Tensor | None = None  # (P*n,) real (True) or padding, in gathered order
        self._num_tokens = 0

    def split(self, tokens, grid):
        b, n_real, d = tokens.shape
        per_rank = -(-n_real // self.size)
        padded = per_rank * self.size
        if padded > n_real:
            tokens = torch.cat([tokens, tokens.new_zeros(b, padded - n_real, d)], dim=1)
        order = torch.arange(padded).view(per_rank, self.size).t().reshape(-1)  # rank 0's, then rank 1's, ...
        self.key_valid = order < n_real
        self._order, self._num_tokens = order, n_real
        mine = order[self.rank * per_rank:(self.rank + 1) * per_rank]
        return tokens[:, mine], mine.clamp(max=n_real - 1)  # padded slots borrow a real position; masked anyway

    def merge(self, tokens):
        gathered = _GatherSequence.apply(tokens, self.group, self.rank, self.size)  # (B, P*n, E) in rank order
        inverse = torch.empty_like(self._order)
        inverse[self._order] = torch.arange(self._order.numel())
        return gathered[:, inverse[:self._num_tokens]]  # (B, N, E) in grid order


def _all_to_all(x: torch.Tensor, group) -> torch.Tensor:
    """Exchange the chunks of dim 0 between the ranks of `group` (chunk i goes to rank i)."""
    x = x.contiguous()  # before empty_like, which would copy a transposed view's strides
    with warnings.catch_warnings():  # deprecated in favour of the functional collectives; still correct
        warnings.simplefilter("ignore", FutureWarning)
        return dist_nn.all_to_all_single(torch.empty_like(x), x, group=group)


def _ring_pass(tensors: list[torch.Tensor], group) -> list[torch.Tensor]:
    """Send each tensor to the next rank of the ring and receive the previous rank's."""
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    nxt, prv = dist.get_global_rank(group, (rank + 1) % size), dist.get_global_rank(group, (rank - 1) % size)
    received = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
    ops = [dist.P2POp(dist.isend, t.contiguous(), nxt, group) for t in tensors]
    ops += [dist.P2POp(dist.irecv, r, prv, group) for r in received]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    return received


def _block(q, k, valid, scale):
    """Scores of q against one key block, padded keys at -inf: (B, H, n, m)."""
    scores = (q @ k.transpose(-1, -2)) * scale
    return scores.masked_fill(~valid[None, None, None, :], float("-inf"))


class _RingAttention(torch.autograd.Function):
    """softmax(q kᵀ/√Dh) v over the keys of every rank of the ring, never holding more than one
    remote key/value block. Forward: merge each block's result by its log-sum-exp. Backward: the
    same pass again; each block's key/value gradients travel with it and arrive home at the end."""

    @staticmethod
    def forward(ctx, q, k, v, valid_blocks, group):
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        scale = q.shape[-1] ** -0.5
        out = torch.zeros_like(q)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype)
        kv = [k, v]
        for step in range(size):
            src = (rank - step) % size
            scores = _block(q, kv[0], valid_blocks[src], scale)  # (B, H, n, m)
            block_lse = torch.logsumexp(scores, dim=-1)  # (B, H, n)
            probs = torch.exp(scores - block_lse[..., None]).nan_to_num(0.0)  # an all-padding block: 0
            new_lse = torch.logaddexp(lse, block_lse)
            keep = torch.exp(lse - new_lse).nan_to_num(0.0)[..., None]
            add = torch.exp(block_lse - new_lse).nan_to_num(0.0)[..., None]
            out = out * keep + (probs @ kv[1]) * add
            lse = new_lse
            if step < size - 1:
                kv = _ring_pass(kv, group)
        ctx.save_for_backward(q, k, v, out, lse, valid_blocks)
        ctx.group = group
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, valid_blocks = ctx.saved_tensors
        group = ctx.group
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        scale = q.shape[-1] ** -0.5
        delta = (dout * out).sum(-1, keepdim=True)  # (B, H, n, 1)
        dq = torch.zeros_like(q)
        kv, dkv = [k, v], [torch.zeros_like(k), torch.zeros_like(v)]
        for step in range(size):
            src = (rank - step) % size
            scores = _block(q, kv[0], valid_blocks[src], scale)
            probs = torch.exp(scores - lse[..., None]).nan_to_num(0.0)  # (B, H, n, m)
            dkv[1] = dkv[1] + probs.transpose(-1, -2) @ dout
            ds = probs * (dout @ kv[1].transpose(-1, -2) - delta)
            dq = dq + (ds @ kv[0]) * scale
            dkv[0] = dkv[0] + (ds.transpose(-1, -2) @ q) * scale
            if step < size - 1:
                kv, dkv = _ring_pass(kv, group), _ring_pass(dkv, group)
            else:
                dkv = _ring_pass(dkv, group)  # home: the block of rank+1 goes back to rank+1
        return dq, dkv[0], dkv[1], None, None


class ContextParallelAttention(AttentionCore):
    """Attention over the whole sequence from sequence-sharded q, k, v (B, H, n, Dh).

    Ulysses (`ulysses` > 1): an all-to-all inside the Ulysses group turns sequence shards into head
    shards over the group's tokens, (B, H/U, U*n, Dh). Ring (`ring` > 1): those tokens' keys and
    values then go round the ring groups. Both: the 2D layout of USP and LongVILA's MM-SP.
    """

    def __init__(self, layout: StridedTokenLayout, uly_group, ulysses: int, ring_group, ring: int):
        super().__init__()
        self.layout, self.uly_group, self.ulysses, self.ring_group, self.ring = layout, uly_group, ulysses, \
            ring_group, ring

    def _to_heads(self, x):
        if self.ulysses == 1:
            return x
        b, h, n, dh = x.shape
        u = self.ulysses
        x = x.view(b, u, h // u, n, dh).transpose(0, 1)  # (U, B, H/U, n, Dh)
        x = _all_to_all(x, self.uly_group)  # dim 0 now: the rank whose tokens these are
        return x.permute(1, 2, 0, 3, 4).reshape(b, h // u, u * n, dh)  # (B, H/U, U*n, Dh)

    def _to_sequence(self, x):
        if self.ulysses == 1:
            return x
        b, hu, un, dh = x.shape
        u = self.ulysses
        x = x.view(b, hu, u, un // u, dh).permute(2, 0, 1, 3, 4)  # (U, B, H/U, n, Dh)
        x = _all_to_all(x, self.uly_group)  # dim 0 now: the rank whose heads these are
        return x.transpose(0, 1).reshape(b, hu * u, un // u, dh)  # (B, H, n, Dh)

    def forward(self, q, k, v, mask=None):
        q, k, v = self._to_heads(q), self._to_heads(k), self._to_heads(v)
        valid = self.layout.key_valid.to(q.device).view(self.ring, -1)  # (R, U*n): each ring group's keys
        if self.ring == 1:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=valid[0][None, None, None, :])
        else:
            out = _RingAttention.apply(q, k, v, valid, self.ring_group)
        return self._to_sequence(out)


def apply_tp(model: VideoDiT, tp_mesh, sequence_parallel: bool = False) -> None:
    """Heads and MLP hidden units over the TP ranks: q/k/v and fc1 column-wise, the output
    projections row-wise. Without sequence parallelism the row-wise outputs are all-reduced; with it
    they stay partial sums, reduce-scattered into token chunks by `apply_sequence_parallel`."""
    from torch.distributed.tensor import Partial
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    def rowwise():
        return RowwiseParallel(output_layouts=Partial()) if sequence_parallel else RowwiseParallel()

    plan = {}
    for attn in ("attn", "cross_attn"):
        plan.update({f"{attn}.to_q": ColwiseParallel(), f"{attn}.to_k": ColwiseParallel(),
                     f"{attn}.to_v": ColwiseParallel(), f"{attn}.to_out": rowwise()})
    plan.update({"mlp.fc1": ColwiseParallel(), "mlp.fc2": rowwise()})
    for block in model.blocks:
        parallelize_module(block, tp_mesh, plan)
    if sequence_parallel:
        apply_sequence_parallel(model, tp_mesh)


# --- sequence parallelism inside tensor parallelism ----------------------------------------------


def _gather_chunks(x: torch.Tensor, group, size: int) -> torch.Tensor:
    """(B, m, D) on each rank -> (B, size*m, D), rank order."""
    parts = [torch.empty_like(x) for _ in range(size)]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=1)


class _EnterSequenceParallel(torch.autograd.Function):
    """Every TP rank holds the same (B, n, D); keep this rank's chunk of n padded to a multiple of
    tp. Backward all-gathers the chunks' gradients, so what came before gets the full gradient."""

    @staticmethod
    def forward(ctx, x, group, rank, size):
        n = x.shape[1]
        m = -(-n // size)
        ctx.group, ctx.size, ctx.n = group, size, n
        x = F.pad(x, (0, 0, 0, m * size - n))
        return x[:, rank * m:(rank + 1) * m].contiguous()  # (B, m, D)

    @staticmethod
    def backward(ctx, grad):
        return _gather_chunks(grad, ctx.group, ctx.size)[:, :ctx.n], None, None, None


class _GatherChunks(torch.autograd.Function):
    """Chunks (B, m, D) -> the n tokens (B, n, D) on every TP rank, before a column-parallel
    projection or the replicated final layer. Both give every rank the same full input gradient
    (DTensor all-reduces a column-parallel input's gradient), so backward keeps this rank's chunk."""

    @staticmethod
    def forward(ctx, x, group, rank, size, n):
        ctx.rank, ctx.m, ctx.pad = rank, x.shape[1], x.shape[1] * size - n
        return _gather_chunks(x, group, size)[:, :n]

    @staticmethod
    def backward(ctx, grad):
        grad = F.pad(grad, (0, 0, 0, ctx.pad))
        return grad[:, ctx.rank * ctx.m:(ctx.rank + 1) * ctx.m].contiguous(), None, None, None, None


class _ReduceScatterChunks(torch.autograd.Function):
    """A row-parallel projection's partial sums (B, n, D) -> this rank's chunk of their total,
    (B, m, D). Backward all-gathers the chunks' gradients: each partial sum's full gradient."""

    @staticmethod
    def forward(ctx, x, group, rank, size):
        b, n, d = x.shape
        m = -(-n // size)
        ctx.group, ctx.size, ctx.n = group, size, n
        padded = x.new_zeros(b, m * size, d)
        padded[:, :n] = x
        if dist.get_backend(group) == "gloo":  # gloo has no reduce-scatter: sum everything, keep a chunk
            dist.all_reduce(padded, group=group)
            return padded[:, rank * m:(rank + 1) * m].contiguous()
        out = x.new_empty(b, m, d)
        dist.reduce_scatter_tensor(out, padded.view(b, size, m, d).transpose(0, 1).contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return _gather_chunks(grad, ctx.group, ctx.size)[:, :ctx.n], None, None, None


class _AllReduceGradient(torch.autograd.Function):
    """Identity forward; backward sums the gradient over the TP ranks. For values computed whole on
    every rank (the modulation vectors) but used on one chunk of the tokens each."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def apply_sequence_parallel(model: VideoDiT, tp_mesh) -> None:
    """Hooks around the blocks' projections (after `apply_tp`); the model code is unchanged."""
    group, rank, size = tp_mesh.get_group(), tp_mesh.get_local_rank(), tp_mesh.size()
    tokens = {}  # n, the token count before chunking, set on entry and read by every gather

    def enter(_, args):
        tokens["n"] = args[0].shape[1]
        return (_EnterSequenceParallel.apply(args[0], group, rank, size), *args[1:])

    def gather(_, args):
        return (_GatherChunks.apply(args[0], group, rank, size, tokens["n"]), *args[1:])

    def scatter(_, args, out):
        return _ReduceScatterChunks.apply(out, group, rank, size)

    def reduce_gradients(_, args, out):
        return [_AllReduceGradient.apply(o, group) for o in out]

    model.blocks[0].register_forward_pre_hook(enter)
    for block in model.blocks:
        for module in (block.attn, block.cross_attn, block.mlp):
            module.register_forward_pre_hook(gather)
            module.register_forward_hook(scatter)
        block.modulation.register_forward_hook(reduce_gradients)
    model.final.register_forward_pre_hook(gather)


def _sequence_parallel_partial(name: str) -> bool:
    """Replicated block parameters that see one chunk of the tokens under sequence parallelism (the
    affine norms): their gradients are partial sums over the TP ranks."""
    return re.search(r"blocks\.\d+\.(.+\.)?norm\d\.", name) is not None


def apply_cp(model: VideoDiT, dims: ParallelDims, mesh) -> None:
    cp = mesh["cp"]
    layout = StridedTokenLayout(cp.get_group(), cp.get_local_rank(), dims.cp)
    model.token_layout = layout
    uly_group = mesh["cp_ulysses"].get_group() if dims.ulysses > 1 else None
    ring_group = mesh["cp_ring"].get_group() if dims.ring > 1 else None
    for block in model.blocks:
        block.attn.core = ContextParallelAttention(layout, uly_group, dims.ulysses, ring_group, dims.ring)


def apply_ac(model: VideoDiT) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for i, block in enumerate(model.blocks):
        model.blocks[i] = checkpoint_wrapper(block, preserve_rng_state=False)


def apply_fsdp(model: VideoDiT, dims: ParallelDims, mesh) -> None:
    from torch.distributed.fsdp import fully_shard

    dp_mesh = mesh[("dp_replicate", "dp_shard")] if dims.dp_replicate > 1 else mesh["dp_shard"]
    for block in model.blocks:
        fully_shard(block, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)


def parallelize(model: VideoDiT, dims: ParallelDims, mesh, activation_checkpointing: bool = False,
                compile: bool = False) -> VideoDiT:
    dims.check_model(model.config.num_heads)
    if dims.tp > 1:
        apply_tp(model, mesh["tp"], dims.sequence_parallel)
    if dims.cp > 1:
        apply_cp(model, dims, mesh)
    if activation_checkpointing:
        apply_ac(model)
    if dims.dp_shard > 1 or dims.dp_replicate > 1:
        apply_fsdp(model, dims, mesh)
    if compile:
        for i, block in enumerate(model.blocks):
            model.blocks[i] = torch.compile(block)
    return model


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def sync_gradients(model: nn.Module, dims: ParallelDims, mesh) -> None:
    """Sum what data parallelism does not: every gradient over the CP ranks (each saw a slice of the
    tokens), QK-norm weights over the TP ranks (each saw a slice of the heads) and, with sequence
    parallelism, the blocks' affine norms over the TP ranks (each saw a chunk of the tokens)."""
    if dims.cp > 1:
        group = mesh["cp"].get_group()
        for p in model.parameters():
            if p.grad is not None:
                dist.all_reduce(_local(p.grad), group=group)
    if dims.tp > 1:
        group = mesh["tp"].get_group()
        for name, p in model.named_parameters():
            partial = ".q_norm." in name or ".k_norm." in name
            if p.grad is not None and (partial or (dims.sequence_parallel and _sequence_parallel_partial(name))):
                dist.all_reduce(_local(p.grad), group=group)
