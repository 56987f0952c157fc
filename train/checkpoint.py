"""Training checkpoints with torch.distributed.checkpoint (DCP), complete or invisible.

    <run>/checkpoints/step-00001000/   .metadata, __*.distcp     model, optimizer, EMA (DCP: resharded on load)
                                       rank-00000.pt ...          per rank: loader position, RNG states
                                       checkpoint.json        step, LR scheduler, counters, config, file sizes
    <run>/checkpoints/latest           the newest complete directory's name, written last

A checkpoint is written under `.tmp-step-*`, renamed when every rank has finished, and only then
named in `latest`. `checkpoint.json` is written last inside it and lists every file's size, so
a directory cut short by a crash (missing or truncated files, no marker) is never resumed from.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

MARKER = "checkpoint.json"


@contextlib.contextmanager
def quiet_dcp():
    """DCP warns that it runs in one process when there is no process group: that is intended."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def is_complete(path: Path) -> bool:
    """The marker is there and every file it lists has the size it recorded."""
    try:
        meta = json.loads((path / MARKER).read_text())
        files = meta["files"]
    except (OSError, ValueError, KeyError):
        return False
    if ".metadata" not in files:
        return False
    return all((path / name).is_file() and (path / name).stat().st_size == size for name, size in files.items())


def read_meta(path: Path) -> dict:
    return json.loads((Path(path) / MARKER).read_text())


def find_latest(root: Path) -> Path | None:
    """The newest complete checkpoint under `root`: the one `latest` names if it is complete, else the
    highest complete step directory."""
    root = Path(root)
    pointer = root / "latest"
    if pointer.is_file():
        named = root / pointer.read_text().strip()
        if named.name.startswith("step-") and is_complete(named):
            return named
    for path in sorted(root.glob("step-*"), reverse=True):
        if is_complete(path):
            return path
    return None


class Checkpointer:
    def __init__(self, root: Path, num_keep: int, rank: int, world_size: int):
        if num_keep < 1:
            raise ValueError(f"checkpoint.num_keep={num_keep}: keep at least 1")
        self.root = Path(root)
        self.num_keep = num_keep
        self.rank, self.world_size = rank, world_size

    def save(self, step: int, state: dict, extra: dict, meta: dict) -> Path:
        """Every rank calls this. `state` goes through DCP, `extra` is this rank's own, `meta` rank 0's."""
        final = self.root / f"step-{step:08d}"
        tmp = self.root / f".tmp-step-{step:08d}"
        if self.rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
        _barrier()
        with quiet_dcp():
            dcp.save(state, checkpoint_id=str(tmp))
        torch.save(extra, tmp / f"rank-{self.rank:05d}.pt")
        _barrier()
        if self.rank == 0:
            meta = {**meta, "step": step, "world_size": self.world_size,
                    "files": {p.name: p.stat().st_size for p in tmp.iterdir() if p.is_file()}}
            _write_atomic(tmp / MARKER, json.dumps(meta, indent=1))
            if final.exists():  # the same step saved again (a rerun): replace it whole
                shutil.rmtree(final)
            os.replace(tmp, final)
            _write_atomic(self.root / "latest", final.name)
            self._prune()
        _barrier()
        return final

    def _prune(self) -> None:
        complete = [p for p in sorted(self.root.glob("step-*")) if is_complete(p)]
        for old in complete[:-self.num_keep]:
            shutil.rmtree(old, ignore_errors=True)
        for stale in self.root.glob(".tmp-step-*"):  # left by a crash mid-save
            shutil.rmtree(stale, ignore_errors=True)

    def load(self, path: Path, state: dict) -> tuple[dict | None, dict]:
        """Fill `state` in place from `path` (DCP reshards to the current layout). Returns this rank's
        own saved state when the checkpoint was written by as many ranks (else None) and the meta."""
        path = Path(path)
        if not is_complete(path):
            raise FileNotFoundError(f"{path} is not a complete checkpoint (no {MARKER}, or files missing or cut short)")
        with quiet_dcp():
            dcp.load(state, checkpoint_id=str(path))
        meta = read_meta(path)
        extra = None
        own = path / f"rank-{self.rank:05d}.pt"
        if meta["world_size"] == self.world_size and own.is_file():
            extra = torch.load(own, weights_only=False)
        return extra, meta
