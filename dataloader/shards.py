"""Shard lists and the sample index.

`expand_shards` turns a spec into a sorted list of tar files: a directory, a glob, a brace pattern
(`data/shard-{000000..000009}.tar`), a curated output's `summary.json`, any URL webdataset's
`gopen` reads (`https://host/shard-{0000..0099}.tar`, `pipe:aws s3 cp s3://b/shard-0001.tar -`), or
several of those joined by `::`. A remote shard is streamed once into a local cache (`fetch`),
because batches read members at their offsets.

`index_shard` reads one tar's headers and its small members (`.json`, `.txt`, `.npy` headers),
never the video bytes, and records where each member's bytes lie, so that a loader worker can
read exactly the members of the samples it decodes.
"""

from __future__ import annotations

import glob
import io
import json
import os
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

VIDEO_EXTS = ("mp4", "webm", "mkv", "mov", "avi")
IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")
SMALL_MEMBERS = ("json", "txt")


def _braces(spec: str) -> list[str]:
    """Expand `{a..b}` numeric ranges (keeping zero padding) and `{x,y}` lists, as webdataset does."""
    m = re.search(r"\{([^{}]*)\}", spec)
    if not m:
        return [spec]
    body = m.group(1)
    rng = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    if rng:
        lo, hi = rng.groups()
        options = [str(i).zfill(len(lo)) for i in range(int(lo), int(hi) + 1)]
    else:
        options = body.split(",")
    return [out for o in options for out in _braces(spec[:m.start()] + o + spec[m.end():])]


def expand_shards(spec: str) -> list[str]:
    """Every tar file a shard spec names, sorted; a clear error when it names none."""
    paths: list[str] = []
    remote: list[str] = []
    for part in spec.split("::"):
        part = part.strip()
        if is_remote(part):
            remote += _braces(part)
            continue
        p = Path(part).expanduser()
        if p.is_file() and p.name.endswith(".json"):
            summary = json.loads(p.read_text())
            paths += [str(p.parent / "shards" / s["shard"]) for s in summary.get("shards", [])]
        elif p.is_dir():
            sub = p / "shards" if (p / "shards").is_dir() else p
            paths += sorted(str(x) for x in sub.glob("*.tar"))
        else:
            for candidate in _braces(part):
                paths += glob.glob(candidate) if any(c in candidate for c in "*?[") else [candidate]
    paths = sorted(set(paths))
    missing = [x for x in paths if not os.path.isfile(x)]
    if missing:
        raise FileNotFoundError(f"data.shards={spec!r}: {len(missing)} shard(s) do not exist, e.g. {missing[0]}")
    if not paths and not remote:
        raise FileNotFoundError(f"data.shards={spec!r} names no .tar shards")
    return paths + sorted(set(remote))


def is_remote(spec: str) -> bool:
    return "://" in spec or spec.startswith("pipe:")


def fetch(url: str, cache_dir: str | os.PathLike) -> str:
    """A local copy of a remote shard, streamed once with webdataset's gopen (http(s), pipe:, and
    the other schemes it knows), written under a temporary name and renamed when complete."""
    import hashlib

    import webdataset

    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", url.rstrip("/").split("/")[-1])[-80:] or "shard.tar"
    local = cache / f"{hashlib.sha1(url.encode()).hexdigest()[:12]}-{name}"
    if local.exists():
        return str(local)
    tmp = local.with_name(f".{local.name}.{os.getpid()}.tmp")
    try:
        with webdataset.gopen(url, "rb") as src, open(tmp, "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
        os.replace(tmp, local)
    except Exception as e:
        tmp.unlink(missing_ok=True)
        raise FileNotFoundError(f"cannot fetch shard {url!r}: {e}") from e
    return str(local)


@dataclass
class SampleRef:
    """One sample of one shard: where its members' bytes lie, and its small members."""

    shard: str
    key: str
    members: dict[str, tuple[int, int]] = field(default_factory=dict)  # ext -> (offset, size)
    meta: dict = field(default_factory=dict)
    text: str | None = None
    latent_shape: tuple[int, ...] | None = None

    @property
    def kind(self) -> str:
        if "latent.npy" in self.members:
            return "latent"
        if any(e in self.members for e in VIDEO_EXTS):
            return "video"
        if any(e in self.members for e in IMAGE_EXTS):
            return "image"
        return "none"


def _npy_shape(raw: bytes) -> tuple[int, ...]:
    version = np.lib.format.read_magic(io.BytesIO(raw))
    reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    buf = io.BytesIO(raw)
    np.lib.format.read_magic(buf)
    shape, _, _ = reader(buf)
    return tuple(shape)


def index_shard(path: str) -> tuple[list[SampleRef], int]:
    """(samples in tar order, members that were unreadable). A truncated tar keeps the samples
    whose members lie wholly before the damage."""
    size = os.path.getsize(path)
    samples: dict[str, SampleRef] = {}
    broken = 0
    with open(path, "rb") as f:
        try:
            with tarfile.open(fileobj=f, mode="r:") as tar:
                for info in tar:
                    if not info.isfile():
                        continue
                    name = os.path.basename(info.name)
                    if "." not in name:
                        continue
                    key, ext = name.split(".", 1)
                    if info.offset_data + info.size > size:
                        broken += 1
                        break
                    ref = samples.setdefault(key, SampleRef(path, key))
                    ref.members[ext.lower()] = (info.offset_data, info.size)
                    if ext in SMALL_MEMBERS or ext.endswith(".npy"):
                        f_pos = f.tell()
                        f.seek(info.offset_data)
                        raw = f.read(info.size if ext in SMALL_MEMBERS else min(info.size, 4096))
                        f.seek(f_pos)
                        try:
                            if ext == "json":
                                ref.meta = json.loads(raw)
                            elif ext == "txt":
                                ref.text = raw.decode("utf-8", errors="replace").strip()
                            elif ext == "latent.npy":
                                ref.latent_shape = _npy_shape(raw)
                        except (ValueError, UnicodeError):
                            broken += 1
        except tarfile.TarError:
            broken += 1  # the rest of the file is not a tar: keep what was read
    return list(samples.values()), broken
