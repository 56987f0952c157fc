"""`vfm-encode input=<curated dir or shards> output=<dir>`: precompute what training would encode on
the fly, once, as a Ray job like the curator.

    shards ─► Ray Data: one shard per task ─► ShardEncoder actors (text encoder + autoencoder loaded
    once each; samples of one shape encoded in batches of `batch_size`)
           ─► <output>/shards/<same name>.tar: every member kept, plus <key>.latent.npy (C, T', H', W')
              and <key>.text_emb.npy (L, Dt), the caption's real tokens only
           ─► <output>/encode.jsonl (one record per shard: samples written, failures with reasons)
              and <output>/summary.json (the shard list the loader reads); <output>/settings.json
              holds the settings that decide the encodings, which a rerun must keep

Each sample is decoded as evaluation would (the data config's buckets, centred window and crop).
A sample that fails to decode or encode is left out and named in encode.jsonl; the run goes on.
Shards are written under a temporary name and renamed; a rerun skips shards already written, and is
refused if it would encode the rest with other settings (check_same_settings).
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from dataloader.dataset import LoaderSettings, VideoBatches
from dataloader.decode import SampleError
from dataloader.shards import expand_shards, index_shard


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


class ShardEncoder:
    """Ray actor: `__call__({"shard": [path]}) -> {"record": [json]}`, one shard per call."""

    def __init__(self, cfg_dict: dict):
        from models.autoencoder import build_autoencoder
        from models.text_encoder import build_text_encoder

        cfg = OmegaConf.create(cfg_dict)
        torch.set_num_threads(1)  # one actor per core
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.text_encoder = build_text_encoder(cfg.text_encoder).to(self.device)
        self.autoencoder = build_autoencoder(cfg.autoencoder).to(self.device)
        self.cfg = cfg
        self.out_dir = Path(cfg.output) / "shards"
        d = cfg.data
        self.settings = LoaderSettings(buckets=[list(b) for b in d.buckets], tokens_per_batch=d.tokens_per_batch,
                                       token_size=list(d.token_size), fps=d.fps, frame_stride=d.frame_stride,
                                       random_crop=False)

    def __call__(self, batch: dict) -> dict:
        return {"record": [json.dumps(self.encode_shard(path)) for path in batch["shard"]]}

    def encode_shard(self, path: str) -> dict:
        t0 = time.perf_counter()
        reader = VideoBatches(path, self.settings)
        refs, _ = index_shard(path)
        failures: dict[str, str] = {}
        ready = []  # (ref, decoded sample) that have a bucket and decoded
        handles: dict = {}
        try:
            for ref in refs:
                bucket = reader.bucket_of(ref)
                if bucket is None:
                    failures[ref.key] = "no bucket: missing .json/.txt, or too few frames for every bucket"
                    continue
                try:
                    ready.append((ref, reader.decode_sample(ref, bucket, handles)))
                except (SampleError, OSError, ValueError, KeyError, StopIteration) as e:
                    failures[ref.key] = f"decode: {e}"
        finally:
            for f in handles.values():
                f.close()
        encoded = self._encode(ready, failures)
        written = self._write(path, refs, encoded)
        return {"shard": Path(path).name, "num_samples": written, "failed": failures,
                "seconds": round(time.perf_counter() - t0, 3)}

    @torch.no_grad()
    def _encode(self, ready: list, failures: dict) -> dict[str, dict[str, bytes]]:
        """key -> new members, for the samples that encoded; batched over samples of one shape."""
        by_shape: dict[tuple, list] = {}
        for ref, sample in ready:
            if "video" not in sample:
                failures[ref.key] = "already precomputed (has latent.npy)"
                continue
            by_shape.setdefault(tuple(sample["video"].shape), []).append((ref, sample))
        out = {}
        for group in by_shape.values():
            for i in range(0, len(group), self.cfg.batch_size):
                chunk = group[i:i + self.cfg.batch_size]
                try:
                    video = torch.stack([s["video"] for _, s in chunk]).to(self.device)  # (B, 3, T, H, W)
                    latents = self.autoencoder.encode(video).cpu().numpy()  # (B, C, T', H', W')
                    emb, mask = self.text_encoder([s["text"] for _, s in chunk])  # (B, L, Dt), (B, L)
                except (RuntimeError, ValueError) as e:
                    for ref, _ in chunk:
                        failures[ref.key] = f"encode: {e}"
                    continue
                emb, mask = emb.cpu().numpy(), mask.cpu().numpy()
                for k, (ref, _) in enumerate(chunk):
                    if not np.isfinite(latents[k]).all():
                        failures[ref.key] = "encode: the latent has NaN/Inf"
                        continue
                    out[ref.key] = {"latent.npy": _npy(latents[k].astype(np.float32)),
                                    "text_emb.npy": _npy(emb[k][mask[k]].astype(np.float32))}
        return out

    def _write(self, path: str, refs: list, encoded: dict[str, dict[str, bytes]]) -> int:
        final = self.out_dir / Path(path).name
        tmp = final.with_name(f".{final.name}.tmp")
        with open(path, "rb") as src, tarfile.open(tmp, "w") as tar:
            for ref in refs:
                if ref.key not in encoded:
                    continue
                members = {}
                for ext, (offset, size) in ref.members.items():
                    src.seek(offset)
                    members[ext] = src.read(size)
                members.update(encoded[ref.key])
                for ext, data in members.items():
                    info = tarfile.TarInfo(f"{ref.key}.{ext}")
                    info.size = len(data)
                    info.mtime = 0
                    tar.addfile(info, io.BytesIO(data))
        os.replace(tmp, final)
        return len(encoded)


# What decides an encoded sample: the clip it is cut to (the rest of `data` is training's) and the encoders.
_CLIP_KEYS = ("buckets", "fps", "frame_stride", "token_size")


def encode_settings(config: dict) -> dict:
    """{dotted key: value} of the settings that decide what a sample's latent and text embedding are."""
    from curator.pipeline import flat_settings

    return flat_settings({"data": {k: config["data"].get(k) for k in _CLIP_KEYS},
                          "text_encoder": config["text_encoder"], "autoencoder": config["autoencoder"]})


def check_same_settings(out: Path, now: dict) -> None:
    """A rerun goes on with the settings that encoded the shards written. With others (another
    autoencoder, other buckets) it skipped those and encoded the rest anew: a training run would
    have read latents of two autoencoders. Refused, naming what differs. An output from before the
    settings were saved is compared with its summary.json's config."""
    from curator.pipeline import saved_settings, settings_changed

    before = saved_settings(out / "settings.json", out / "summary.json", encode_settings)
    if before is None:
        return
    what = settings_changed(before, now)
    if what:
        raise ValueError(f"output={str(out)!r} was encoded with other settings: {what}. Its shards written would keep "
                         "their latents and the others would get these settings'. Encode into a new output for these "
                         "settings; to go on with this output, run with its settings")


def encode(cfg: DictConfig, log=print) -> dict:
    from curator.pipeline import ray_session
    from curator.writer import write_json

    shards = expand_shards(cfg.input)
    out = Path(cfg.output)
    settings = encode_settings(OmegaConf.to_container(cfg, resolve=True))
    check_same_settings(out, settings)
    (out / "shards").mkdir(parents=True, exist_ok=True)
    records_path = out / "encode.jsonl"
    done = set()
    if records_path.exists():
        done = {json.loads(line)["shard"] for line in records_path.read_text().splitlines() if line.strip()}
    todo = [s for s in shards if Path(s).name not in done or not (out / "shards" / Path(s).name).exists()]
    log(f"encoding {len(todo)} of {len(shards)} shards into {out}")
    if todo:
        write_json(out / "settings.json", settings)
        with ray_session(cfg) as ray:
            workers = cfg.num_workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
            workers = min(workers, len(todo))
            ds = ray.data.from_items([{"shard": s} for s in todo], override_num_blocks=len(todo))
            gpus = 1 if torch.cuda.is_available() else 0
            cfg_dict = OmegaConf.to_container(cfg, resolve=True)
            encoded = ds.map_batches(ShardEncoder, fn_constructor_kwargs={"cfg_dict": cfg_dict},
                                     batch_size=1, compute=ray.data.ActorPoolStrategy(size=workers), num_cpus=1,
                                     num_gpus=gpus)
            with open(records_path, "a") as records:
                for i, row in enumerate(encoded.iter_rows(), 1):
                    record = json.loads(row["record"])
                    records.write(json.dumps(record) + "\n")
                    records.flush()
                    log(f"[{i}/{len(todo)}] {record['shard']}: {record['num_samples']} samples, "
                        f"{len(record['failed'])} failed, {record['seconds']} s")
    by_shard = {}
    for line in records_path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            by_shard[record["shard"]] = record
    summary = {"shards": [{"shard": name, "num_samples": r["num_samples"]} for name, r in sorted(by_shard.items())],
               "num_samples": sum(r["num_samples"] for r in by_shard.values()),
               "num_failed": sum(len(r["failed"]) for r in by_shard.values()),
               "config": OmegaConf.to_container(cfg, resolve=True)}
    write_json(out / "summary.json", summary)
    log(f"done: {summary['num_samples']} samples in {len(by_shard)} shards ({summary['num_failed']} failed); "
        f"{out / 'summary.json'}")
    return summary


def main() -> None:
    """`python -m train.encode`'s entry: vfm-encode's (train.cli)."""
    from train.cli import encode_main

    encode_main()


if __name__ == "__main__":
    main()
