"""dataloader/: real shards of real H.264 clips to bucketed, rank-aware, resumable batches."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import webdataset as wds
from PIL import Image
from vfm_testmedia import write_test_shards

import conf
from dataloader import decode
from dataloader.buckets import Bucket, BucketSet
from dataloader.dataset import Loader, LoaderSettings, VideoBatches, build_loader
from dataloader.shards import expand_shards

BUCKETS = [[8, 32, 48], [8, 48, 32], [16, 32, 48]]


def _settings(**kw):
    return LoaderSettings(**{"buckets": BUCKETS, "tokens_per_batch": 768, "token_size": [1, 8, 8], "seed": 0, **kw})


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return tmp_path_factory.mktemp("shards"), write_test_shards(tmp_path_factory.mktemp("shards") / "d", seed=0)


def _folder(shards):
    return str(Path(shards[1][0]).parent)


def test_shard_specs_expand_from_dirs_globs_braces_and_summaries(shards, tmp_path):
    folder = _folder(shards)
    all_six = expand_shards(folder)
    assert len(all_six) == 6
    assert expand_shards(f"{folder}/shard-*.tar") == all_six
    assert expand_shards(f"{folder}/shard-{{000001..000003}}.tar") == all_six[1:4]
    assert expand_shards(f"{folder}/shard-000000.tar::{folder}/shard-000005.tar") == [all_six[0], all_six[5]]
    summary = tmp_path / "summary.json"
    (tmp_path / "shards").symlink_to(folder)
    summary.write_text(json.dumps({"shards": [{"shard": "shard-000002.tar", "num_samples": 6}]}))
    assert expand_shards(str(summary)) == [str(tmp_path / "shards" / "shard-000002.tar")]
    with pytest.raises(FileNotFoundError, match="do not exist"):
        expand_shards(f"{folder}/shard-{{000004..000009}}.tar")
    with pytest.raises(FileNotFoundError, match="no .tar"):
        expand_shards(str(tmp_path / "shards" / "nothing-*.tar"))


def test_buckets_by_aspect_and_frames_with_batch_sizes_from_the_token_budget():
    bs = BucketSet(BUCKETS, tokens_per_batch=768, token_size=[1, 8, 8])
    assert bs.for_video(96, 64, 24) == Bucket(16, 32, 48)  # landscape, enough frames for the longest
    assert bs.for_video(96, 64, 10) == Bucket(8, 32, 48)
    assert bs.for_video(64, 96, 30) == Bucket(8, 48, 32)
    assert bs.for_video(96, 64, 5) is None
    assert bs.for_image(640, 480) == Bucket(1, 32, 48)
    assert bs.batch_size(Bucket(8, 32, 48)) == 4 and bs.batch_size(Bucket(16, 32, 48)) == 2
    assert bs.tokens(Bucket(8, 32, 48)) == 8 * 4 * 6
    assert bs.batch_size(Bucket(1, 32, 48)) == 32  # smaller buckets get larger batches
    with pytest.raises(ValueError, match="even height"):
        BucketSet([[8, 33, 48]], 768, [1, 8, 8])


def test_batches_follow_the_contract(shards):
    ds = VideoBatches(_folder(shards), _settings(caption_dropout=0.0), num_epochs=1)
    batches = list(Loader(ds, num_workers=2))
    assert len(batches) == ds.epoch_length(0) >= 6
    keys = [k for b in batches for k in b["key"]]
    assert len(keys) == len(set(keys))
    for b in batches:
        t, h, w = b["bucket"]
        assert b["video"].dtype == torch.float32 and b["video"].shape[1:] == (3, t, h, w)
        assert b["video"].shape[0] == len(b["text"]) == len(b["key"]) == b["fps"].shape[0]
        assert -1.0 <= b["video"].min() and b["video"].max() <= 1.0 and b["video"].std() > 0.05
        assert all(text.startswith("a") and "background" in text for text in b["text"])
        assert b["num_skipped"] == 0 and torch.all(b["fps"] == 24.0)
    assert {b["bucket"] for b in batches} >= {(16, 32, 48), (8, 48, 32)}


def test_frames_at_a_target_rate_random_windows_and_centred_windows():
    assert decode.frame_indices(48, 24.0, 4, 12.0, 1, None) == [21, 23, 25, 27]  # centred: 20.5 .. 26.5
    assert decode.frame_indices(48, 24.0, 8, None, 3, None) == [13, 16, 19, 22, 25, 28, 31, 34]
    assert decode.frame_indices(10, 24.0, 8, 12.0, 1, None) is None
    import random

    starts = {decode.frame_indices(48, 24.0, 4, None, 1, random.Random(s))[0] for s in range(30)}
    assert len(starts) > 10 and min(starts) >= 0 and max(starts) <= 44
    assert decode.frames_at_rate(48, 24.0, 12.0, 1) == 24


def test_decoding_falls_back_when_decord_cannot_resize_while_decoding(tmp_path):
    from curator import synth

    seg = synth.Segment(12, "circle", "red", "gray", "right")
    synth.write_video(tmp_path / "wide.mp4", [seg], size=(128, 72))
    data = (tmp_path / "wide.mp4").read_bytes()
    assert decode.cover_size(128, 72, 48, 26) == (48, 27)  # a size decord fails to decode to
    x = decode.decode_video(data, (128, 72), lambda n, fps: [0, 4, 8], 48, 26, None)
    assert x.shape == (3, 3, 26, 48)
    y = decode.decode_video(data, None, lambda n, fps: [0, 4, 8], 64, 36, None)  # decord resizes this one
    assert y.shape == (3, 3, 36, 64)
    # Both paths agree with each other on the picture: the red object is right of centre in frame 8.
    for v in (x, y):
        red = (v[0] > 0.5) & (v[1] < 0)
        cols = red[2].nonzero()[:, 1].float().mean() / v.shape[-1]
        assert 0.5 < cols < 0.9
    with pytest.raises(decode.SampleError):
        decode.decode_video(b"not a video", None, lambda n, fps: [0], 48, 26, None)


def test_caption_dropout_and_eval_mode_are_deterministic(shards):
    folder = _folder(shards)
    all_dropped = [t for b in Loader(VideoBatches(folder, _settings(caption_dropout=1.0), num_epochs=1), 0)
                   for t in b["text"]]
    assert set(all_dropped) == {""}
    half = [t for b in Loader(VideoBatches(folder, _settings(caption_dropout=0.5), num_epochs=1), 0) for t in b["text"]]
    assert 0.2 < half.count("") / len(half) < 0.8
    a = next(iter(Loader(VideoBatches(folder, _settings(random_crop=False), num_epochs=1), 0)))
    b = next(iter(Loader(VideoBatches(folder, _settings(random_crop=False), num_epochs=1), 2)))
    assert a["key"] == b["key"] and torch.equal(a["video"], b["video"])


def test_images_mix_in_as_one_frame_videos_at_a_ratio(shards, tmp_path):
    folder = _folder(shards)
    with wds.TarWriter(str(tmp_path / "images.tar")) as sink:
        for i in range(40):
            img = Image.new("RGB", (120, 80), (i * 5, 100, 200))
            buf = io.BytesIO()
            img.save(buf, format="JPEG")
            sink.write({"__key__": f"img{i:02d}", "jpg": buf.getvalue(), "txt": f"a picture {i}",
                        "json": json.dumps({"width": 120, "height": 80})})
    spec = f"{folder}::{tmp_path / 'images.tar'}"
    ds = VideoBatches(spec, _settings(image_ratio=0.5, caption_dropout=0.0), num_epochs=1)
    batches = list(Loader(ds, 0))
    images = [b for b in batches if b["bucket"][0] == 1]
    assert images and images[0]["video"].shape[1:] == (3, 1, 32, 48)
    n_img = sum(len(b["key"]) for b in images)
    n_vid = sum(len(b["key"]) for b in batches) - n_img
    assert 0.3 < n_img / (n_img + n_vid) < 0.7


def test_precomputed_latents_and_text_embeddings_are_used_as_they_are(tmp_path):
    g = np.random.default_rng(0)
    with wds.TarWriter(str(tmp_path / "latents.tar")) as sink:
        for i in range(6):
            buf, tbuf = io.BytesIO(), io.BytesIO()
            np.save(buf, g.standard_normal((4, 3, 4, 6)).astype(np.float32))
            np.save(tbuf, g.standard_normal((5 + i % 2, 384)).astype(np.float32))
            sink.write({"__key__": f"lat{i}", "latent.npy": buf.getvalue(), "text_emb.npy": tbuf.getvalue(),
                        "txt": "x", "json": json.dumps({"fps": 24.0})})
    ds = VideoBatches(str(tmp_path / "latents.tar"), _settings(caption_dropout=0.0, tokens_per_batch=9),
                      num_epochs=1)
    batches = list(Loader(ds, 0))
    assert len(batches) == 2  # latents (C, T, H, W) = (4, 3, 4, 6): 3 tokens each, 3 per batch
    batch = batches[0]
    assert batch["latent"].shape[1:] == (4, 3, 4, 6) and "video" not in batch
    assert batch["text_emb"].shape[-1] == 384 and batch["text_mask"].shape == batch["text_emb"].shape[:2]
    assert batch["text_mask"].sum(1).tolist() == [5 if int(k[-1]) % 2 == 0 else 6 for k in batch["key"]]


def test_bad_samples_are_skipped_and_counted_without_a_hang(tmp_path):
    folder = tmp_path / "bad"
    write_test_shards(folder, seed=1, bad=True)
    ds = VideoBatches(str(folder), _settings(caption_dropout=0.0), num_epochs=1)
    keys = {r.key for refs in ds.index.values() for r in refs}
    assert "s1_01" in keys and "s1_02" in keys  # indexed, but planned out: no .txt / no .json
    planned = {r.key for _, refs in ds.plan(0, 0) for r in refs}
    assert "s1_01" not in planned and "s1_02" not in planned
    assert ds.index_skipped >= 1  # the truncated shard's cut member
    loader = Loader(ds, num_workers=2)
    batches = list(loader)
    assert len(batches) == ds.epoch_length(0)
    if "s1_00" in planned:
        assert loader.num_skipped >= 1  # the corrupt mp4, replaced inside its batch
    for b in batches:
        assert b["video"].shape[0] == len(b["key"]) and torch.isfinite(b["video"]).all()


RESUME = r"""
import sys, torch
sys.path.insert(0, {tests!r})
from dataloader.dataset import Loader, LoaderSettings, VideoBatches
s = LoaderSettings(buckets={buckets!r}, tokens_per_batch=768, token_size=[1, 8, 8], seed=3, caption_dropout=0.3)
loader = Loader(VideoBatches({folder!r}, s, 0, 1), num_workers=2)
loader.load_state_dict(torch.load({state!r}))
out = []
for i, b in enumerate(loader):
    out.append((b["key"], b["text"], b["video"]))
    if len(out) == {n}:
        break
torch.save(out, {result!r})
"""


def test_resume_in_a_new_process_gives_the_same_batches(shards, tmp_path):
    folder = _folder(shards)
    s = LoaderSettings(buckets=BUCKETS, tokens_per_batch=768, token_size=[1, 8, 8], seed=3, caption_dropout=0.3)
    straight = []
    for b in Loader(VideoBatches(folder, s, 0, 1), num_workers=2):  # endless: runs past an epoch's end
        straight.append((b["key"], b["text"], b["video"]))
        if len(straight) == 20:
            break
    loader = Loader(VideoBatches(folder, s, 0, 1), num_workers=2)
    for i, _ in enumerate(loader):
        if i == 6:
            break
    torch.save(loader.state_dict(), tmp_path / "state.pt")
    script = RESUME.format(tests=str(Path(__file__).parent), buckets=BUCKETS, folder=folder,
                           state=str(tmp_path / "state.pt"), n=13, result=str(tmp_path / "rest.pt"))
    subprocess.run([sys.executable, "-c", script], check=True, timeout=300)
    rest = torch.load(tmp_path / "rest.pt")
    assert len(rest) == 13
    for (k1, t1, v1), (k2, t2, v2) in zip(straight[7:], rest, strict=True):
        assert k1 == k2 and t1 == t2 and torch.equal(v1, v2)
    with pytest.raises(ValueError, match="dp_size"):
        Loader(VideoBatches(folder, s, 0, 2)).load_state_dict(torch.load(tmp_path / "state.pt"))


def test_build_loader_from_the_data_config_group(shards):
    cfg = conf.compose("train", [f"data.shards={_folder(shards)}", "data.buckets=[[8,32,48]]",
                                 "data.tokens_per_batch=768", "data.num_workers=0", "data.num_epochs=1"]).data
    batches = list(build_loader(cfg, dp_rank=0, dp_size=1, seed=0))
    assert batches and all(b["bucket"] == (8, 32, 48) and b["video"].shape[0] == 4 for b in batches)


@pytest.mark.parametrize(("world", "cp", "bad"), [(2, 1, False), (2, 2, False), (4, 2, False), (4, 2, True)])
def test_ranks_split_by_data_parallel_index_and_peers_see_identical_batches(shards, tmp_path, world, cp, bad):
    import torch.multiprocessing as mp
    from vfm_testmedia import loader_rank_worker

    folder = _folder(shards)
    if bad:
        folder = str(tmp_path / "bad")
        write_test_shards(Path(folder), seed=1, bad=True)
    out = tmp_path / "ranks.json"
    args = (world, cp, folder, str(tmp_path / "rendezvous"), str(out))
    mp.start_processes(loader_rank_worker, args=args, nprocs=world,
                       join=True, start_method="spawn")
    ranks = json.loads(out.read_text())
    assert len({len(r) for r in ranks}) == 1 and len(ranks[0]) > 0  # every rank: the same number of batches
    for rank in range(world):
        peer = (rank // cp) * cp
        assert ranks[rank] == ranks[peer]  # CP/TP peers of one replica: identical samples, order, pixels
    keys_by_dp = [{k for batch in ranks[d * cp] for k in batch[0]} for d in range(world // cp)]
    for i in range(len(keys_by_dp)):
        for j in range(i + 1, len(keys_by_dp)):
            assert not keys_by_dp[i] & keys_by_dp[j]  # data-parallel ranks read different shards


def test_remote_shards_over_http_and_pipe_are_fetched_once_and_read_alike(shards, tmp_path):
    import functools
    import http.server
    import threading

    folder = _folder(shards)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=folder)
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        spec = f"http://127.0.0.1:{port}/shard-{{000000..000003}}.tar::pipe:cat {folder}/shard-000004.tar"
        s = _settings(random_crop=False, caption_dropout=0.0)
        remote = VideoBatches(spec, s, num_epochs=1, cache_dir=str(tmp_path / "cache"))
        assert len(list((tmp_path / "cache").glob("*.tar"))) == 5 and not list((tmp_path / "cache").glob(".*"))
        local_spec = "::".join(f"{folder}/shard-{i:06d}.tar" for i in range(5))
        local = VideoBatches(local_spec, s, num_epochs=1)
        got = [b["key"] for b in Loader(remote, 0)]
        assert got and sorted(k for b in got for k in b) == sorted(k for b in Loader(local, 0) for k in b["key"])
        with pytest.raises(FileNotFoundError, match="cannot fetch"):
            VideoBatches(f"http://127.0.0.1:{port}/missing.tar", s, cache_dir=str(tmp_path / "cache"))
    finally:
        server.shutdown()
