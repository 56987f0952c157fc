"""Text to video with an exported vfm model: the visible sampling loop (diffusers style).

    prompt, negative prompt ─► text encoder (through a cache of encoded prompts) ─► (B, L, Dt) each
    seed ─► initial noise (B, C, T', H', W'), one generator per request
    for each scheduler step: velocity of [cond; uncond] ─► v_u + g (v_c − v_u) ─► scheduler.step
    ─► autoencoder decode ─► uint8 frames (B, T, H, W, 3) ─► mp4 (and a gif preview)

Parallel sampling plugs in at one place, `velocity()`: with CFG-parallel the conditional and
unconditional halves run on different ranks, and with context parallel the model's tokens are
split over ranks by the training code's CP attention (inference/parallel.py). Every rank runs this
same loop on the same inputs and ends with the same latents.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from models.autoencoder import build_autoencoder
from models.dit.model import VideoDiT
from models.flow import make_scheduler
from models.text_encoder import build_text_encoder


@dataclass
class Request:
    prompt: str
    negative_prompt: str = ""
    num_frames: int = 8
    height: int = 32
    width: int = 32
    steps: int = 20
    guidance_scale: float = 5.0
    seed: int = 0

    def shape_key(self) -> tuple:
        """Requests with equal keys can be sampled as one batch."""
        return self.num_frames, self.height, self.width, self.steps


@dataclass
class Limits:
    """What a request may ask for; `check` says what is allowed when it asks for more."""

    max_frames: int = 64
    max_height: int = 512
    max_width: int = 512
    max_steps: int = 100
    max_guidance: float = 30.0
    max_prompt_chars: int = 1000
    multiples: tuple[int, int, int] = field(default=(1, 2, 2))  # (frames, height, width) from patch x autoencoder

    def check(self, r: Request) -> list[str]:
        mt, mh, mw = self.multiples
        problems = []
        if not 1 <= r.num_frames <= self.max_frames or (r.num_frames - 1) % mt and r.num_frames % mt:
            problems.append(f"num_frames={r.num_frames}: 1..{self.max_frames}, a multiple of {mt} (or 1 more)")
        for name, value, m, top in (("height", r.height, mh, self.max_height), ("width", r.width, mw, self.max_width)):
            if not m <= value <= top or value % m:
                problems.append(f"{name}={value}: a multiple of {m} in {m}..{top}")
        if not 1 <= r.steps <= self.max_steps:
            problems.append(f"steps={r.steps}: 1..{self.max_steps}")
        if not 0 <= r.guidance_scale <= self.max_guidance:
            problems.append(f"guidance_scale={r.guidance_scale}: 0..{self.max_guidance}")
        for name, text in (("prompt", r.prompt), ("negative_prompt", r.negative_prompt)):
            if len(text) > self.max_prompt_chars:
                problems.append(f"{name}: at most {self.max_prompt_chars} characters, got {len(text)}")
        return problems


class PromptCache:
    """Encoded prompts by their text, the least recently used dropped first once they hold more than
    `max_bytes`: the negative prompt (most often "") and repeated prompts are encoded once, not at
    every request. `max_bytes=0` encodes every call afresh."""

    def __init__(self, encoder, max_bytes: int):
        self.encoder, self.max_bytes = encoder, max_bytes
        self.entries: OrderedDict[str, torch.Tensor] = OrderedDict()  # text -> (L_i, Dt), its own tokens
        self.bytes = 0
        self.hits = self.misses = 0

    def __call__(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, L, Dt) hidden states, zero past each text's tokens, and their (B, L) mask; L is the
        longest text's token count."""
        if self.max_bytes <= 0:
            return self.encoder(texts)
        missing = list(dict.fromkeys(t for t in texts if t not in self.entries))  # unique, in order
        new = {}
        if missing:
            emb, mask = self.encoder(missing)  # (M, L, Dt), (M, L): one call for all of them
            new = {t: e[m] for t, e, m in zip(missing, emb, mask, strict=True)}  # (L_i, Dt) each
        rows = []
        for t in texts:
            if t in new:
                rows.append(new[t])
            else:
                self.entries.move_to_end(t)
                rows.append(self.entries[t])
        self.hits += len(texts) - len(missing)
        self.misses += len(missing)
        for t, e in new.items():
            self.entries[t] = e
            self.bytes += e.nbytes
        while self.bytes > self.max_bytes and self.entries:
            self.bytes -= self.entries.popitem(last=False)[1].nbytes
        length = max(r.shape[0] for r in rows)
        first = rows[0]
        out = first.new_zeros(len(rows), length, first.shape[1])  # (B, L, Dt)
        mask = torch.zeros(len(rows), length, dtype=torch.bool, device=first.device)  # (B, L)
        for i, r in enumerate(rows):
            out[i, : r.shape[0]] = r
            mask[i, : r.shape[0]] = True
        return out, mask


class VideoPipeline:
    def __init__(self, transformer: VideoDiT, text_encoder, autoencoder,
                 scheduler: str = "FlowMatchEulerDiscreteScheduler", shift: float = 1.0,
                 device: torch.device | str = "cpu", prompt_cache_mb: float = 64):
        self.device = torch.device(device)
        self.transformer = transformer.to(self.device).eval()
        self.text_encoder = text_encoder.to(self.device)
        self.prompts = PromptCache(self.text_encoder, int(prompt_cache_mb * 2**20))
        self.autoencoder = autoencoder.to(self.device)
        self.scheduler_name, self.shift = scheduler, shift
        self.cfg_group = None  # set by inference.parallel: the two ranks that split cond/uncond
        self.cfg_rank = 0

    @classmethod
    def from_export(cls, folder: str | Path, scheduler: str | None = None, shift: float | None = None,
                    device: torch.device | str = "cpu", prompt_cache_mb: float = 64) -> VideoPipeline:
        """From a `vfm-export` folder: transformer/ and vfm.yaml (text encoder, autoencoder, diffusion)."""
        folder = Path(folder)
        if not (folder / "vfm.yaml").is_file() or not (folder / "transformer").is_dir():
            raise FileNotFoundError(f"{folder} is not an exported model (no vfm.yaml or transformer/): run vfm-export")
        info = OmegaConf.load(folder / "vfm.yaml")
        transformer = VideoDiT.from_pretrained(folder / "transformer", low_cpu_mem_usage=False)
        return cls(transformer, build_text_encoder(info.text_encoder), build_autoencoder(info.autoencoder),
                   scheduler or info.diffusion.scheduler, info.diffusion.shift if shift is None else shift, device,
                   prompt_cache_mb)

    def limits(self, **kw) -> Limits:
        pt, ph, pw = self.transformer.patch_size
        ae = self.autoencoder
        return Limits(multiples=(ae.temporal_compression * pt, ae.spatial_compression * ph,
                                 ae.spatial_compression * pw), **kw)

    def latent_shape(self, r: Request) -> tuple[int, int, int, int]:
        ae = self.autoencoder
        return (ae.latent_channels, ae.latent_frames(r.num_frames), r.height // ae.spatial_compression,
                r.width // ae.spatial_compression)

    # --- the loop ---

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.prompts(prompts)  # (B, L, Dt), (B, L)

    def guidance_text(self, emb, mask) -> tuple[torch.Tensor, torch.Tensor]:
        """The text the model sees each step: all of [cond; uncond] (2B, L, Dt), or with CFG-parallel
        this rank's half (B, L, Dt)."""
        if self.cfg_group is None:
            return emb, mask
        half = slice(None, len(emb) // 2) if self.cfg_rank == 0 else slice(len(emb) // 2, None)
        return emb[half], mask[half]

    @torch.no_grad()
    def velocity(self, latents, sigma, text, guidance: torch.Tensor) -> torch.Tensor:
        """Classifier-free guided velocity for (B, C, T', H', W') latents at noise level `sigma` (B,)."""
        emb, mask = text
        if self.cfg_group is not None:  # this rank computes one half; the other rank the other
            mine = self.transformer(latents, sigma, emb, mask)
            both = [torch.empty_like(mine) for _ in range(2)]
            torch.distributed.all_gather(both, mine.contiguous(), group=self.cfg_group)
            v_cond, v_uncond = both
        else:
            v = self.transformer(torch.cat([latents, latents]), torch.cat([sigma, sigma]), emb, mask)
            v_cond, v_uncond = v.chunk(2)
        g = guidance.view(-1, 1, 1, 1, 1)
        return v_uncond + g * (v_cond - v_uncond)

    @torch.no_grad()
    def sample_latents(self, requests: list[Request], callback=None, timings: dict | None = None) -> torch.Tensor:
        """Final latents (B, C, T', H', W') for requests of one shape; each request's noise comes from
        its own seed, so it gets the same result alone or batched. `callback(step, total)` after each
        step; it may raise to cancel. `timings` gets the seconds of prompt encoding (text_s) and of
        the scheduler steps (steps_s)."""
        first = requests[0]
        if any(r.shape_key() != first.shape_key() for r in requests):
            raise ValueError("one batch needs one (num_frames, height, width, steps)")
        shape = self.latent_shape(first)
        noise = [torch.randn(shape, generator=torch.Generator().manual_seed(r.seed)) for r in requests]
        latents = torch.stack(noise).to(self.device)  # (B, C, T', H', W')
        t0 = self._now()
        # [cond; uncond] (2B, L, Dt) and (2B, L), in one encoder call for the prompts not cached
        text = self.guidance_text(*self.encode_prompts([r.prompt for r in requests] +
                                                       [r.negative_prompt for r in requests]))
        t1 = self._now()
        guidance = torch.tensor([r.guidance_scale for r in requests], device=self.device)
        scheduler = make_scheduler(self.scheduler_name, self.shift)
        scheduler.set_timesteps(first.steps, device=self.device)
        for i, t in enumerate(scheduler.timesteps):
            sigma = (t / 1000).expand(len(requests)).float()  # the model was trained on sigma in [0, 1]
            v = self.velocity(latents, sigma, text, guidance)
            latents = scheduler.step(v, t, latents).prev_sample
            if callback is not None:
                callback(i + 1, first.steps)
        if timings is not None:
            timings["text_s"], timings["steps_s"] = t1 - t0, self._now() - t1
        return latents

    def _now(self) -> float:
        """A timestamp after the device's queued work: CUDA runs asynchronously."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> np.ndarray:
        """(B, C, T', H', W') latents -> (B, T, H, W, 3) uint8 frames."""
        video = self.autoencoder.decode(latents)  # (B, 3, T, H, W) in [-1, 1]
        frames = ((video.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
        return frames.permute(0, 2, 3, 4, 1).cpu().numpy()

    def __call__(self, requests: list[Request], callback=None) -> tuple[np.ndarray, dict]:
        """(B, T, H, W, 3) uint8 frames, and seconds: text_s and steps_s within sample_s, decode_s."""
        t0, timings = time.perf_counter(), {}
        latents = self.sample_latents(requests, callback, timings)
        t1 = self._now()
        frames = self.decode(latents)
        return frames, {**timings, "sample_s": t1 - t0, "decode_s": time.perf_counter() - t1}


def write_mp4(frames: np.ndarray, path: str | Path, fps: int = 8) -> None:
    """(T, H, W, 3) uint8 -> H.264 mp4 (yuv420p), written under a temporary name then renamed."""
    import av

    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp.mp4")
    with av.open(str(tmp), "w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.height, stream.width = frames.shape[1], frames.shape[2]
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": "18"}
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())
    tmp.replace(path)


def write_gif(frames: np.ndarray, path: str | Path, fps: int = 8) -> None:
    from PIL import Image

    images = [Image.fromarray(f) for f in frames]
    images[0].save(path, save_all=True, append_images=images[1:], duration=int(1000 / fps), loop=0)
