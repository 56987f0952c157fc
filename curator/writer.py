"""Shards, manifest and resume state of one curated output directory.

Layout (DESIGN.md "Shards" and "Manifest"):
    <out>/shards/shard-000000.tar   complete shards only; written as .shard-*.tar.tmp, then renamed
    <out>/manifest.jsonl            one record per input, appended once all its clips are in shards
    <out>/summary.json              rewritten at the end of each run that did work
    <out>/.state/shards.jsonl       per complete shard: its keys and their dedup signatures
    <out>/.state/settings.json      the settings that decide what is written, as the last run had them
    <out>/.state/lock               held (flock) by the run writing the directory: one run at a time
    <out>/.state/spool/<run>/       the run's encoded clips on their way to a shard (SourceWorker)

After a crash, a rerun skips every input with a manifest record, discards any unfinished shard, and
never writes a key that a complete shard already holds: no duplicate, missing or truncated samples.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import io
import json
import os
import shutil
import socket
import tarfile
import uuid
from pathlib import Path

from curator.stages.dedup import DedupIndex


def _fsync_append(path: Path, line: str) -> None:
    """Append `line` durably, on a line of its own: after a torn last line (a full disk or a crash
    mid-append), a newline first, so that the torn part stays a line of its own that readers skip
    rather than swallowing this one."""
    with open(path, "a+b") as f:
        torn = f.tell() > 0 and os.pread(f.fileno(), 1, f.tell() - 1) != b"\n"
        f.write((("\n" if torn else "") + line + "\n").encode())
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: Path) -> list[dict]:
    """Records of a JSON-lines file. A line that is not a JSON object is ignored: a torn last line (a
    crash mid-append), or the zeros or stray bytes a power cut can leave at the end of a file."""
    if not path.exists():
        return []
    out = []
    for line in path.read_bytes().decode(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


class OutputInUseError(RuntimeError):
    """Another run is writing the output directory."""


class OutputWriteError(RuntimeError):
    """The output directory could not be written (a full disk, say)."""


def write_json(path: Path, data) -> None:
    """`data` as JSON at `path`, whole or not at all: written beside it, then renamed over it."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def write_error(where: str | os.PathLike, trouble: str | OSError) -> OutputWriteError:
    """The error for a run that cannot write `where` (in the output): it says what is kept."""
    return OutputWriteError(f"cannot write {where}: {trouble}. The complete shards and the records in "
                            "manifest.jsonl are kept: fix that and run the same command again to go on")


def _writes(method):
    """An OutputDir method that writes: its OSError (no space left, a quota, a lost mount) becomes
    an OutputWriteError that says what is kept, and the unfinished shard is removed."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except OSError as e:
            self.discard_unfinished_shard()
            raise write_error(self.root, e) from e

    return wrapper


def _lock(root: Path, state_dir: Path) -> int | None:
    """An exclusive flock on `state_dir/lock`, its file descriptor; it says which process holds it.
    Two runs writing one directory would each write every source (a manifest with every record
    twice) and delete the other's unfinished shard as stale. The kernel lets go of the lock when its
    process ends, however it ends, so a `kill -9` never leaves the directory locked. None where the
    filesystem has no locks (some network and FUSE mounts): the run goes on, unguarded."""
    fd = os.open(state_dir / "lock", os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by child processes
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "a process that has not said which"
        os.close(fd)
        raise OutputInUseError(f"output={str(root)!r} is being written by another run ({holder}): wait for it to "
                               "end, or give another output") from None
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
            return None
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
    return fd


class OutputDir:
    """The output directory of one run, locked against other runs from here until release()."""

    def __init__(self, root: str | os.PathLike, samples_per_shard: int, max_hamming: int | None):
        if samples_per_shard < 1:
            raise ValueError(f"writer.samples_per_shard={samples_per_shard}: must be >= 1")
        self.root = Path(root)
        self.shard_dir = self.root / "shards"
        self.state_dir = self.root / ".state"
        try:
            self.shard_dir.mkdir(parents=True, exist_ok=True)
            self.state_dir.mkdir(parents=True, exist_ok=True)
            self._lock_fd = _lock(self.root, self.state_dir)
        except OSError as e:
            raise OutputWriteError(f"cannot make the output directory {self.root}: {e}") from e
        self.locked = self._lock_fd is not None
        try:
            self._go_on_from_state(samples_per_shard, max_hamming)
        except BaseException as e:
            self.release()  # the directory is free again for the run that follows, in this process too
            if isinstance(e, OSError):
                raise OutputWriteError(f"cannot open the output directory {self.root} to go on from it: {e}") from e
            raise

    def _go_on_from_state(self, samples_per_shard: int, max_hamming: int | None) -> None:
        """What the runs before this one left: records, complete shards and their keys; the
        unfinished shard and spooled clips of a killed run are removed."""
        self.manifest_path = self.root / "manifest.jsonl"
        self.shards_state_path = self.state_dir / "shards.jsonl"
        self.samples_per_shard = samples_per_shard
        for stale in self.shard_dir.glob(".shard-*.tmp"):
            stale.unlink()  # an unfinished shard from a killed run; its sources have no record yet
        self.spool_dir = self.state_dir / "spool"
        shutil.rmtree(self.spool_dir, ignore_errors=True)  # a killed run's clips; their sources are done again

        self.done_sources = {r["source"] for r in read_jsonl(self.manifest_path)}
        shard_records = [r for r in read_jsonl(self.shards_state_path) if (self.shard_dir / r["shard"]).exists()]
        for orphan in {p.name for p in self.shard_dir.glob("shard-*.tar")} - {r["shard"] for r in shard_records}:
            # Renamed into place, but its state line never got written (a crash or a full disk just
            # then): its sources have no record yet and are done again, into a new shard.
            (self.shard_dir / orphan).unlink()
        self.written_keys: set[str] = set()
        self.dedup = DedupIndex(max_hamming) if max_hamming is not None else None
        for r in shard_records:
            for key, (hashes, colours) in zip(r["keys"], r["dedup"], strict=True):
                self.written_keys.add(key)
                if self.dedup is not None:
                    self.dedup.add(key, hashes, colours)
        # Past every shard recorded, also where one recorded earlier has gone since: never over one.
        self.shard_index = 1 + max((int(r["shard"][len("shard-"):-len(".tar")]) for r in shard_records), default=-1)
        self._tar: tarfile.TarFile | None = None
        self._tmp: Path | None = None
        self._keys: list[str] = []
        self._dedup: list[list] = []  # per key: [phashes, colour grids]
        self._waiting: list[tuple[dict, set[str]]] = []  # (manifest record, its keys not yet in a shard)

    @_writes
    def new_spool(self) -> Path:
        """A new, empty folder for this run's encoded clips on their way to a shard."""
        folder = self.spool_dir / uuid.uuid4().hex
        folder.mkdir(parents=True)
        return folder

    def drop_spool(self, folder: Path) -> None:
        """Remove a run's spool folder (new_spool) and what is left in it."""
        shutil.rmtree(folder, ignore_errors=True)
        with contextlib.suppress(OSError):
            self.spool_dir.rmdir()  # unless another folder is there

    # -- samples ----------------------------------------------------------------------------------

    def _open(self) -> None:
        name = f"shard-{self.shard_index:06d}.tar"
        self._tmp = self.shard_dir / f".{name}.tmp"
        self._tar = tarfile.open(self._tmp, "w", format=tarfile.USTAR_FORMAT)

    @_writes
    def add_sample(self, key: str, members: dict[str, bytes], hashes: list[str], colours: list[list[int]]) -> None:
        """Write one sample (`<key>.<ext>` members) into the open shard."""
        if "." in key:
            raise ValueError(f"sample key {key!r} has a dot; webdataset splits keys at the first dot")
        if self._tar is None:
            self._open()
        for ext, data in members.items():
            info = tarfile.TarInfo(f"{key}.{ext}")
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            self._tar.addfile(info, io.BytesIO(data))
        self._keys.append(key)
        self._dedup.append([hashes, colours])
        self.written_keys.add(key)
        if self.dedup is not None:
            self.dedup.add(key, hashes, colours)
        if len(self._keys) >= self.samples_per_shard:
            self.finish_shard()

    @_writes
    def finish_shard(self) -> None:
        if self._tar is None:
            return
        self._tar.close()
        with open(self._tmp, "rb") as f:
            os.fsync(f.fileno())
        name = self._tmp.name[1:-len(".tmp")]
        os.replace(self._tmp, self.shard_dir / name)
        _fsync_append(self.shards_state_path, json.dumps({"shard": name, "keys": self._keys, "dedup": self._dedup}))
        done = set(self._keys)
        self._tar, self._tmp, self._keys, self._dedup = None, None, [], []
        self.shard_index += 1
        for _, keys in self._waiting:
            keys -= done
        self._flush_records()

    # -- manifest ---------------------------------------------------------------------------------

    @_writes
    def add_record(self, record: dict, keys_in_shards: set[str]) -> None:
        """The input's record goes to the manifest once every one of its written keys is in a shard."""
        pending = {k for k in keys_in_shards if k in self._keys}
        self._waiting.append((record, pending))
        self._flush_records()

    def _flush_records(self) -> None:
        while self._waiting and not self._waiting[0][1]:
            record, _ = self._waiting.pop(0)
            _fsync_append(self.manifest_path, json.dumps(record))
            self.done_sources.add(record["source"])

    def discard_unfinished_shard(self) -> None:
        """Remove the shard being written: its sources have no record yet, so a rerun does them again."""
        if self._tar is not None:
            with contextlib.suppress(OSError):
                self._tar.close()
        if self._tmp is not None:
            self._tmp.unlink(missing_ok=True)
        self._tar, self._tmp = None, None

    @_writes
    def close(self) -> None:
        self.finish_shard()
        self._flush_records()

    @_writes
    def write_summary(self, summary: dict) -> None:
        write_json(self.root / "summary.json", summary)

    @_writes
    def save_settings(self, settings: dict) -> None:
        write_json(self.state_dir / "settings.json", settings)

    def release(self) -> None:
        """Let go of the directory: another run may write it from now on."""
        if self._lock_fd is not None:
            os.ftruncate(self._lock_fd, 0)  # no holder named
            os.close(self._lock_fd)  # the flock goes with it
            self._lock_fd = None

    def shard_counts(self) -> list[dict]:
        return [{"shard": r["shard"], "num_samples": len(r["keys"])} for r in read_jsonl(self.shards_state_path)]
