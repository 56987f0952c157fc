"""Shards to training batches: rank-aware, bucketed, resumable, and deterministic for a seed.

Each epoch's batches are planned from the sample index alone (no decoding):
    shuffle the shard list (seed, epoch), or draw it with replacement (resampled)
    ─► this data-parallel rank's shards (shard-level split; sample-level when there are fewer
       shards than ranks) ─► shuffle their samples (seed, epoch, rank) ─► bucket each one
    ─► fill per-bucket batches in that order.
Every rank can compute every rank's plan, so all of them cut the epoch to the same number of
batches: a rank that skips more data can never leave a collective waiting. Ranks that share a
data-parallel index (the CP and TP peers of one replica) compute the same plan: identical samples
in identical order. Loader workers take planned batches round-robin and decode only those, so the
DataLoader's in-order delivery gives the plan's order; the loader's state is (epoch, batch).

A batch (DESIGN.md "Batch"): `video` float32 (B, C, T, H, W) in [-1, 1] (or `latent` when samples
carry `latent.npy`), `text` list[str] after caption dropout, `key` list[str], `fps` (B,), plus
`text_emb`/`text_mask` when samples carry `text_emb.npy`, and `num_skipped`: samples of this batch
that failed to decode and were replaced by a good sample of the same batch.
"""

from __future__ import annotations

import io
import os
import random
import tempfile
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from dataloader import decode
from dataloader.buckets import Bucket, BucketSet
from dataloader.shards import IMAGE_EXTS, VIDEO_EXTS, SampleRef, expand_shards, fetch, index_shard, is_remote


@dataclass
class LoaderSettings:
    buckets: list[list[int]]
    tokens_per_batch: int
    token_size: list[int]
    fps: float | None = None  # sample frames at this rate; None: every `frame_stride`-th frame
    frame_stride: int = 1
    image_ratio: float | None = None  # fraction of image samples; None: as the shards have them
    caption_dropout: float = 0.0
    random_crop: bool = True  # training: random windows and crops; evaluation: centred
    resampled: bool = False  # each pass draws shards with replacement (webdataset's resampled stream)
    seed: int = 0


class VideoBatches(IterableDataset):
    def __init__(self, shards: str, settings: LoaderSettings, dp_rank: int = 0, dp_size: int = 1,
                 num_epochs: int | None = None, cache_dir: str | None = None):
        if not 0 <= dp_rank < dp_size:
            raise ValueError(f"dp_rank={dp_rank} is not in [0, dp_size={dp_size})")
        if not 0 <= settings.caption_dropout <= 1:
            raise ValueError(f"data.caption_dropout={settings.caption_dropout}: a probability in [0, 1]")
        if settings.image_ratio is not None and not 0 <= settings.image_ratio < 1:
            raise ValueError(f"data.image_ratio={settings.image_ratio}: in [0, 1), or null")
        self.s = settings
        self.buckets = BucketSet(settings.buckets, settings.tokens_per_batch, settings.token_size)
        self.dp_rank, self.dp_size, self.num_epochs = dp_rank, dp_size, num_epochs
        self.shards = expand_shards(shards)
        if any(is_remote(s) for s in self.shards):
            cache = cache_dir or os.path.join(tempfile.gettempdir(), "vfm-shard-cache")
            self.shards = [fetch(s, cache) if is_remote(s) else s for s in self.shards]
        self.index: dict[str, list[SampleRef]] = {}
        self.index_skipped = 0  # samples without the members a batch needs, or past the damage
        for shard in self.shards:
            refs, broken = index_shard(shard)
            self.index[shard] = refs
            self.index_skipped += broken
        self.start = (0, 0)  # (epoch, batch) the next iteration begins at
        self._plans: dict[tuple[int, int], list[tuple[Bucket, list[SampleRef]]]] = {}

    # -- planning (metadata only) ----------------------------------------------------------------

    def _bucket(self, ref: SampleRef) -> Bucket | None:
        m = ref.meta
        if ref.kind == "latent":
            return Bucket(*ref.latent_shape[-3:]) if ref.latent_shape and len(ref.latent_shape) >= 3 else None
        if not m or ref.text is None:
            return None  # a sample needs its .json (size, frames) and its .txt
        if ref.kind == "image":
            return self.buckets.for_image(int(m.get("width", 1)), int(m.get("height", 1)))
        if ref.kind == "video" and m.get("num_frames") and m.get("fps"):
            available = decode.frames_at_rate(int(m["num_frames"]), float(m["fps"]), self.s.fps, self.s.frame_stride)
            return self.buckets.for_video(int(m["width"]), int(m["height"]), available)
        return None

    def plan(self, epoch: int, rank: int) -> list[tuple[Bucket, list[SampleRef]]]:
        """This epoch's batches for one data-parallel rank, in order."""
        if (epoch, rank) in self._plans:
            return self._plans[(epoch, rank)]
        rng = random.Random(f"{self.s.seed}-{epoch}")
        if self.s.resampled:
            shards = rng.choices(self.shards, k=len(self.shards))
        else:
            shards = list(self.shards)
            rng.shuffle(shards)
        if len(shards) >= self.dp_size:
            samples = [r for sh in shards[rank::self.dp_size] for r in self.index[sh]]
        else:  # too few shards to give every rank one: split by sample
            samples = [r for sh in shards for r in self.index[sh]][rank::self.dp_size]
        rng = random.Random(f"{self.s.seed}-{epoch}-{rank}")
        rng.shuffle(samples)
        bucketed = [(r, b) for r in samples if (b := self._bucket(r)) is not None]
        if self.s.image_ratio is not None:
            bucketed = self._mix(bucketed, rng)
        queues: dict[Bucket, list[SampleRef]] = defaultdict(list)
        batches = []
        for ref, b in bucketed:
            queues[b].append(ref)
            if len(queues[b]) == self.buckets.batch_size(b):
                batches.append((b, queues.pop(b)))
        self._plans[(epoch, rank)] = batches
        return batches

    def _mix(self, bucketed, rng):
        """Images drawn (with repeats when there are too few) so they make `image_ratio` of samples."""
        videos = [x for x in bucketed if x[0].kind != "image"]
        images = [x for x in bucketed if x[0].kind == "image"]
        if not videos or not images:
            return bucketed
        want = round(self.s.image_ratio / (1 - self.s.image_ratio) * len(videos))
        chosen = rng.sample(images, want) if want <= len(images) else rng.choices(images, k=want)
        mixed = videos + chosen
        rng.shuffle(mixed)
        return mixed

    def epoch_length(self, epoch: int) -> int:
        """Batches every rank yields in this epoch: the fewest any rank has."""
        return min(len(self.plan(epoch, r)) for r in range(self.dp_size))

    # -- decoding (in the loader workers) --------------------------------------------------------

    def _read(self, ref: SampleRef, ext: str, handles: dict) -> bytes:
        f = handles.get(ref.shard)
        if f is None:
            f = handles[ref.shard] = open(ref.shard, "rb")
        offset, size = ref.members[ext]
        f.seek(offset)
        data = f.read(size)
        if len(data) != size:
            raise decode.SampleError(f"{ref.key}.{ext} is cut short")
        return data

    def _decode(self, ref: SampleRef, bucket: Bucket, rng: random.Random | None, handles: dict) -> dict:
        out = {"key": ref.key, "fps": float(ref.meta.get("fps", 0.0) or 0.0), "text": ref.text or ""}
        if ref.kind == "latent":
            out["latent"] = torch.from_numpy(np.load(io.BytesIO(self._read(ref, "latent.npy", handles))))
        elif ref.kind == "image":
            ext = next(e for e in IMAGE_EXTS if e in ref.members)
            out["video"] = decode.decode_image(self._read(ref, ext, handles), bucket.width, bucket.height, rng)
        else:
            ext = next(e for e in VIDEO_EXTS if e in ref.members)

            def indices_for(n, fps):
                return decode.frame_indices(n, fps, bucket.num_frames, self.s.fps, self.s.frame_stride, rng)

            m = ref.meta
            src = (int(m["width"]), int(m["height"])) if m.get("width") and m.get("height") else None
            out["video"] = decode.decode_video(self._read(ref, ext, handles), src, indices_for, bucket.width,
                                               bucket.height, rng)
        if "text_emb.npy" in ref.members:
            out["text_emb"] = torch.from_numpy(np.load(io.BytesIO(self._read(ref, "text_emb.npy", handles))))
        return out

    def bucket_of(self, ref: SampleRef) -> Bucket | None:
        """The bucket a sample trains in; None when it has none (no metadata, too few frames)."""
        return self._bucket(ref)

    def decode_sample(self, ref: SampleRef, bucket: Bucket, handles: dict) -> dict:
        """One sample as a batch would hold it (`video` (3, T, H, W) or `latent`, `text`, ...);
        centred unless the settings ask for random crops. `handles` caches open shard files."""
        return self._decode(ref, bucket, None, handles)

    def _batch(self, epoch: int, i: int, bucket: Bucket, refs: list[SampleRef], handles: dict) -> dict:
        rng_seed = f"{self.s.seed}-{epoch}-{self.dp_rank}-{i}"
        decoded, skipped = [], 0
        for j, ref in enumerate(refs):
            rng = random.Random(f"{rng_seed}-{j}") if self.s.random_crop else None
            try:
                decoded.append(self._decode(ref, bucket, rng, handles))
            except (decode.SampleError, OSError, ValueError, KeyError, StopIteration):
                skipped += 1
        if decoded:  # keep the batch shape: failed samples are replaced by good ones of this batch
            decoded += [decoded[k % len(decoded)] for k in range(skipped)]
        drop = random.Random(f"{rng_seed}-caption")
        texts = ["" if drop.random() < self.s.caption_dropout else d["text"] for d in decoded]
        batch = {"key": [d["key"] for d in decoded], "text": texts,
                 "fps": torch.tensor([d["fps"] for d in decoded], dtype=torch.float32),
                 "bucket": (bucket.num_frames, bucket.height, bucket.width), "num_skipped": skipped,
                 "epoch": epoch, "batch_index": i}
        field = "latent" if decoded and "latent" in decoded[0] else "video"
        batch[field] = torch.stack([d[field] for d in decoded]) if decoded else torch.empty(
            0, 3, bucket.num_frames, bucket.height, bucket.width)
        if decoded and all("text_emb" in d for d in decoded):
            lengths = [d["text_emb"].shape[0] for d in decoded]
            emb = torch.zeros(len(decoded), max(lengths), decoded[0]["text_emb"].shape[-1])
            mask = torch.zeros(len(decoded), max(lengths), dtype=torch.bool)
            for k, d in enumerate(decoded):
                emb[k, :lengths[k]] = d["text_emb"]
                mask[k, :lengths[k]] = texts[k] != ""  # a dropped caption encodes as no tokens
            batch["text_emb"], batch["text_mask"] = emb, mask
        return batch

    def __iter__(self):
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info else (0, 1)
        epoch, first = self.start
        handles: dict = {}
        position = 0  # batches yielded by the DataLoader as a whole since `start`
        try:
            while self.num_epochs is None or epoch < self.num_epochs:
                plan = self.plan(epoch, self.dp_rank)[:self.epoch_length(epoch)]
                for i in range(first, len(plan)):
                    if position % num_workers == worker:
                        yield self._batch(epoch, i, *plan[i], handles)
                    position += 1
                epoch, first = epoch + 1, 0
        finally:
            for f in handles.values():
                f.close()


def _leave_signals_to_the_trainer(worker_id: int) -> None:
    """A launcher's SIGTERM (or a terminal's Ctrl-C) goes to the whole process group. The trainer
    answers it with a checkpoint, during which a worker killed by it would abort the trainer; so
    workers leave the group. They still end with the trainer: the DataLoader shuts them down, and
    they watch for its exit."""
    os.setpgrp()


class Loader:
    """A DataLoader over `VideoBatches` that remembers what the trainer has taken, for checkpoints:
    `state_dict()` after k batches, `load_state_dict()` in a new process, and the next batch is
    batch k+1 of the uninterrupted run."""

    def __init__(self, dataset: VideoBatches, num_workers: int = 2, prefetch_factor: int = 2):
        self.dataset = dataset
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.position = dataset.start
        self.num_skipped = 0

    def __iter__(self):
        self.dataset.start = self.position
        kwargs = {"prefetch_factor": self.prefetch_factor, "persistent_workers": False,
                  "worker_init_fn": _leave_signals_to_the_trainer} if self.num_workers else {}
        loader = DataLoader(self.dataset, batch_size=None, num_workers=self.num_workers, **kwargs)
        for batch in loader:
            batch["bucket"] = tuple(batch["bucket"])  # the DataLoader hands sequences back as lists
            self.position = (batch["epoch"], batch["batch_index"] + 1)
            self.num_skipped += batch["num_skipped"]
            yield batch

    def state_dict(self) -> dict:
        return {"epoch": self.position[0], "batch": self.position[1], "seed": self.dataset.s.seed,
                "dp_rank": self.dataset.dp_rank, "dp_size": self.dataset.dp_size, "num_skipped": self.num_skipped}

    def load_state_dict(self, state: dict) -> None:
        if (state["seed"], state["dp_size"]) != (self.dataset.s.seed, self.dataset.dp_size):
            raise ValueError(f"loader state is for seed={state['seed']}, dp_size={state['dp_size']}; this loader has "
                             f"seed={self.dataset.s.seed}, dp_size={self.dataset.dp_size}")
        self.position = (state["epoch"], state["batch"])
        self.num_skipped = state["num_skipped"]


def build_loader(cfg, dp_rank: int = 0, dp_size: int = 1, seed: int = 0, train: bool = True) -> Loader:
    """The loader a `data` config group option describes, for one data-parallel rank."""
    settings = LoaderSettings(buckets=[list(b) for b in cfg.buckets], tokens_per_batch=cfg.tokens_per_batch,
                              token_size=list(cfg.token_size), fps=cfg.fps, frame_stride=cfg.frame_stride,
                              image_ratio=cfg.image_ratio, caption_dropout=cfg.caption_dropout if train else 0.0,
                              random_crop=train, resampled=cfg.resampled, seed=seed)
    dataset = VideoBatches(cfg.shards, settings, dp_rank, dp_size, cfg.num_epochs, cfg.cache_dir)
    return Loader(dataset, num_workers=cfg.num_workers)
