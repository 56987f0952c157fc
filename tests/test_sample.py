"""The sampling pipeline: deterministic per seed, the same alone or batched, and equal to itself
across ranks (CFG-parallel, context parallel, both) over gloo; vfm-sample writes mp4 and gif."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from vfm_testmedia import layouts_by_world, sampling_rank_worker, write_export

from inference.pipeline import PromptCache, Request, VideoPipeline

REPO = Path(__file__).resolve().parents[1]
REQUESTS = [{"prompt": "a red square moving left", "num_frames": 4, "height": 16, "width": 24, "steps": 4,
             "guidance_scale": 4.0, "seed": 11},
            {"prompt": "a blue circle moving up", "negative_prompt": "blurry", "num_frames": 4, "height": 16,
             "width": 24, "steps": 4, "guidance_scale": 6.0, "seed": 12}]


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    return write_export(tmp_path_factory.mktemp("export"))


@pytest.fixture(scope="module")
def pipe(export) -> VideoPipeline:
    return VideoPipeline.from_export(export)


def test_the_same_seed_gives_the_same_video_and_another_seed_another(pipe):
    request = Request(**REQUESTS[0])
    a, timings = pipe([request])
    b, _ = pipe([request])
    c, _ = pipe([Request(**{**REQUESTS[0], "seed": 99})])
    assert a.shape == (1, 4, 16, 24, 3) and a.dtype == np.uint8
    assert np.array_equal(a, b)
    assert np.abs(a.astype(int) - c.astype(int)).mean() > 5
    assert timings["sample_s"] > 0


def test_a_request_gives_the_same_latents_alone_and_batched(pipe):
    batched = pipe.sample_latents([Request(**r) for r in REQUESTS])
    for i, r in enumerate(REQUESTS):
        alone = pipe.sample_latents([Request(**r)])[0]
        assert (batched[i] - alone).abs().max().item() <= 1e-5


class CountingEncoder:
    """The pipeline's real text encoder, with a record of the texts it was asked to encode."""

    def __init__(self, encoder):
        self.encoder, self.calls = encoder, []

    def __call__(self, texts):
        self.calls.append(list(texts))
        return self.encoder(texts)


def test_the_prompt_cache_encodes_each_text_once_and_gives_what_the_encoder_gives(pipe):
    enc = CountingEncoder(pipe.text_encoder)
    cache = PromptCache(enc, max_bytes=2**20)
    texts = ["a red square moving left", "", "a much longer prompt about a blue circle moving up", ""]
    emb, mask = cache(texts)
    again, again_mask = cache(["", "a red square moving left"])
    assert enc.calls == [texts[:3]]  # one call, each text once; the second call hit the cache only
    assert (cache.hits, cache.misses) == (3, 3)
    fresh, fresh_mask = pipe.text_encoder(texts)  # (4, L, Dt), (4, L)
    assert torch.equal(mask, fresh_mask) and emb.shape == fresh.shape
    assert (emb - fresh * fresh_mask[..., None]).abs().max().item() <= 1e-5
    assert (emb[mask] != 0).any(dim=-1).all() and (emb[~mask] == 0).all()  # zero past each text's tokens
    assert torch.equal(again[0, : again_mask[0].sum()], emb[1, : mask[1].sum()])
    assert torch.equal(again[1, : again_mask[1].sum()], emb[0, : mask[0].sum()])


def test_the_prompt_cache_stays_within_its_bytes_dropping_the_least_recently_used(pipe):
    enc = CountingEncoder(pipe.text_encoder)
    one = pipe.text_encoder(["x"])[0]  # (1, L, Dt): "x" is one token between [CLS] and [SEP]
    cache = PromptCache(enc, max_bytes=2 * one[0].nbytes)  # room for two such texts
    cache(["a"])
    cache(["b"])
    cache(["a"])  # a is now the most recently used
    cache(["c"])  # over the budget: b goes
    assert list(cache.entries) == ["a", "c"] and cache.bytes <= cache.max_bytes
    cache(["b"])
    assert enc.calls == [["a"], ["b"], ["c"], ["b"]]
    off = PromptCache(enc, max_bytes=0)
    off(["a"])
    off(["a"])
    assert enc.calls[-2:] == [["a"], ["a"]] and not off.entries


def test_sampling_with_the_prompt_cache_equals_sampling_without(export, pipe):
    uncached = VideoPipeline.from_export(export, prompt_cache_mb=0)
    requests = [Request(**r) for r in REQUESTS]
    a = uncached.sample_latents(requests)
    pipe.sample_latents(requests)  # the prompts are in its cache now
    timings = {}
    b = pipe.sample_latents(requests, timings=timings)
    assert (a - b).abs().max().item() <= 1e-5
    assert timings["text_s"] >= 0 and timings["steps_s"] > 0


def test_guidance_changes_the_result(pipe):
    base = pipe.sample_latents([Request(**{**REQUESTS[0], "guidance_scale": 1.0})])
    guided = pipe.sample_latents([Request(**REQUESTS[0])])
    assert (base - guided).abs().max().item() > 1e-3


def test_limits_say_what_is_allowed(pipe):
    limits = pipe.limits(max_steps=50)
    assert limits.check(Request(**REQUESTS[0])) == []
    problems = limits.check(Request("x" * 2000, num_frames=0, height=17, width=2048, steps=51, guidance_scale=-1))
    text = " ".join(problems)
    for expected in ("num_frames=0", "height=17: a multiple of 2", "width=2048", "steps=51: 1..50",
                     "guidance_scale=-1", "prompt: at most 1000 characters"):
        assert expected in text, (expected, text)


LAYOUTS = {
    "cfg_parallel": (2, {"cfg_parallel": True}),
    "cp2_ulysses": (2, {"cp": 2}),
    "cp2_ring": (2, {"cp": 2, "cp_kind": "ring"}),
    "cfg_parallel_x_cp2": (4, {"cfg_parallel": True, "cp": 2}),
}


@pytest.fixture(scope="module")
def latents_by_world(export, tmp_path_factory):
    """Each world size's layouts, sampled in one process group on first use."""
    layouts = {name: (world, {**layout, "requests": REQUESTS}) for name, (world, layout) in LAYOUTS.items()}
    return layouts_by_world(sampling_rank_worker, layouts, tmp_path_factory, str(export))


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_parallel_sampling_equals_one_process(name, latents_by_world, pipe):
    world, _ = LAYOUTS[name]
    single = pipe.sample_latents([Request(**r) for r in REQUESTS])
    for rank, by_name in enumerate(latents_by_world(world)):
        diff = (torch.tensor(by_name[name]) - single).abs().max().item()
        assert diff <= 1e-4, (rank, diff)


def test_vfm_sample_on_two_ranks_writes_mp4_and_gif(export, tmp_path):
    import av

    out = tmp_path / "video.mp4"
    args = [f"checkpoint={export}", "prompt=a red square moving left", f"output={out}", "num_frames=4", "height=16",
            "width=24", "steps=3", "cfg_parallel=true"]
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m",
                        "inference.sample", *args], cwd=REPO, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    with av.open(str(out)) as c:
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    assert len(frames) == 4 and frames[0].shape == (16, 24, 3)
    assert out.with_suffix(".gif").read_bytes()[:6] == b"GIF89a"

    r = subprocess.run([sys.executable, "-m", "inference.sample", *args[:3], "height=17", "steps=0"], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "height=17: a multiple of 2" in r.stderr and "steps=0" in r.stderr
