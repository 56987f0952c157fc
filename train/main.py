"""`vfm-train run_dir=<dir> data.shards=<curated dir> num_steps=N [model=...] [parallel=...]`.
Several processes: `torchrun --nproc-per-node N -m train run_dir=... parallel=cp2_ulysses`.

    shards ─► loader (this data-parallel rank) ─► text encoder, autoencoder (frozen; skipped when
    samples carry text_emb.npy / latent.npy) ─► flow-matching loss on the parallelized DiT
    ─► sync CP/TP gradients, clip ─► AdamW (warmup, cosine) ─► EMA
    ─► metrics.jsonl, TensorBoard, progress; checkpoints every K steps, at the end, on SIGTERM/SIGINT

Determinism: weights from `seed`; each step's noise and noise levels from (seed, step, micro-batch,
data-parallel rank); the loader's plan from (seed, epoch, rank). A resumed run therefore repeats
the uninterrupted one exactly.
"""

from __future__ import annotations

import math
import os
import random
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf

from dataloader.dataset import build_loader
from models.autoencoder import build_autoencoder
from models.dit.model import flops_per_token
from models.flow import FlowMatching
from models.text_encoder import build_text_encoder
from train.checkpoint import Checkpointer, find_latest
from train.ema import EMA
from train.export import model_from_config
from train.metrics import Metrics, peak_flops, peak_memory_mib
from train.parallelize import parallelize, sync_gradients
from train.validate import validate


class TrainingError(RuntimeError):
    """A run that cannot go on; the message says why and what was saved."""


# --- set-up, before any process group exists (the checks of the arguments alone: train/validate.py) ---


def token_size(cfg: DictConfig, autoencoder) -> list[int]:
    """Pixels per model token: the autoencoder's compression times the model's patch."""
    pt, ph, pw = cfg.model.patch_size
    return [autoencoder.temporal_compression * pt, autoencoder.spatial_compression * ph,
            autoencoder.spatial_compression * pw]


def init_distributed() -> tuple[int, int, torch.device]:
    """(rank, world size, device) from torchrun's environment, or a single process."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    return rank, world_size, device


# --- optimisation ------------------------------------------------------------------------------------


def build_optimizer(model: torch.nn.Module, cfg: DictConfig) -> torch.optim.AdamW:
    """AdamW; weight decay only on matrices (never norms, biases or embeddings)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and "embed" not in name else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), foreach=False)


def lr_factor(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warmup over `warmup` steps, then cosine from 1 to `min_ratio` at `total`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def _norm(g: torch.Tensor) -> torch.Tensor:
    n = torch.linalg.vector_norm(g.float())
    return n.full_tensor() if hasattr(n, "full_tensor") else n  # a DTensor's norm over all its shards


def clip_gradients(model: torch.nn.Module, max_norm: float) -> float:
    """Global gradient norm over every parameter, whether a plain tensor or a DTensor shard; grads
    scaled down to `max_norm` when it is > 0 and the norm is finite."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    total = torch.stack([_norm(g) for g in grads]).norm().item()
    if max_norm > 0 and math.isfinite(total) and total > max_norm:
        for g in grads:
            g.mul_(max_norm / (total + 1e-6))
    return total


def step_generator(seed: int, step: int, micro: int, dp_rank: int) -> torch.Generator:
    """Noise for one micro-batch: the same on the CP/TP peers of a replica, different across replicas."""
    state = np.random.SeedSequence([seed, step, micro, dp_rank]).generate_state(1)[0]
    return torch.Generator().manual_seed(int(state))


# --- the trainer -------------------------------------------------------------------------------------


@dataclass
class StepInputs:
    x0: torch.Tensor  # (B, C, T', H', W') latents
    text_emb: torch.Tensor  # (B, L, Dt)
    text_mask: torch.Tensor  # (B, L)


class Trainer:
    def __init__(self, cfg: DictConfig):
        self.cfg = cfg
        self.rank, self.world_size, self.device = init_distributed()
        self.dims = validate(cfg, self.world_size)
        if self.world_size > 1 and not dist.is_initialized():
            dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo")
        self.mesh = self.dims.build_mesh(self.device.type) if self.world_size > 1 else None
        self.dp_rank = self.mesh["dp"].get_local_rank() if self.mesh is not None else 0
        self.run_dir = Path(cfg.run_dir)
        use_bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and self.device.type == "cuda")
        self.autocast_dtype = torch.bfloat16 if use_bf16 else None

        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)  # the same initial weights on every rank
        self.text_encoder = build_text_encoder(cfg.text_encoder).to(self.device)
        self.autoencoder = build_autoencoder(cfg.autoencoder).to(self.device)
        data_cfg = OmegaConf.merge(cfg.data, {"token_size": token_size(cfg, self.autoencoder)})
        self.loader = build_loader(data_cfg, self.dp_rank, self.dims.dp, seed=cfg.seed, train=True)
        self.model = model_from_config(cfg.model, self.autoencoder.latent_channels,
                                       self.text_encoder.dim).to(self.device)
        self.num_params = sum(p.numel() for p in self.model.parameters())
        if self.world_size > 1:
            parallelize(self.model, self.dims, self.mesh, cfg.parallel.activation_checkpointing, cfg.parallel.compile)
        self.flow = FlowMatching(cfg.diffusion.logit_mean, cfg.diffusion.logit_std, cfg.diffusion.shift,
                                 cfg.diffusion.timestep_sampling)
        self.optimizer = build_optimizer(self.model, cfg.optim)
        o = cfg.optim
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, o.warmup_steps, cfg.num_steps, o.min_lr_ratio))
        self.ema = EMA(self.model, o.ema_decay)
        self.checkpointer = Checkpointer(self.run_dir / "checkpoints", cfg.checkpoint.num_keep, self.rank,
                                         self.world_size)
        self.step = 0
        self.nonfinite_total = 0
        self.nonfinite_in_a_row = 0
        self.stop_signal: str | None = None

    # --- checkpoints ---

    def _dcp_state(self) -> dict:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        return {"model": get_model_state_dict(self.model),
                "optim": get_optimizer_state_dict(self.model, self.optimizer),
                "ema": self.ema.state_dict()}

    def save(self) -> Path:
        extra = {"loader": self.loader.state_dict(),
                 "rng": {"python": random.getstate(), "numpy": np.random.get_state(),
                         "torch": torch.get_rng_state()}}
        meta = {"scheduler": self.scheduler.state_dict(), "nonfinite_total": self.nonfinite_total,
                "num_params": self.num_params, "config": OmegaConf.to_container(self.cfg, resolve=True)}
        return self.checkpointer.save(self.step, self._dcp_state(), extra, meta)

    def resume(self) -> Path | None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

        choice = self.cfg.checkpoint.resume
        if choice == "none":
            return None
        path = find_latest(self.run_dir / "checkpoints") if choice == "auto" else Path(choice)
        if path is None:
            return None
        state = self._dcp_state()
        extra, meta = self.checkpointer.load(path, state)
        set_model_state_dict(self.model, state["model"])
        set_optimizer_state_dict(self.model, self.optimizer, state["optim"])
        self.scheduler.load_state_dict(meta["scheduler"])
        self.step = meta["step"]
        self.nonfinite_total = meta["nonfinite_total"]
        if extra is not None and extra["loader"]["dp_size"] == self.dims.dp:
            self.loader.load_state_dict(extra["loader"])
            random.setstate(extra["rng"]["python"])
            np.random.set_state(extra["rng"]["numpy"])
            torch.set_rng_state(extra["rng"]["torch"])
        else:
            self._say(f"resuming {path.name} under another layout ({meta['world_size']} ranks then, "
                      f"{self.world_size} now): weights and optimizer resharded; the data restarts at its first epoch")
        return path

    # --- one step ---

    def _inputs(self, batch: dict) -> StepInputs:
        if "latent" in batch:
            x0 = batch["latent"].to(self.device)
        else:
            x0 = self.autoencoder.encode(batch["video"].to(self.device))
        if "text_emb" in batch:
            emb, mask = self._with_empty_captions(batch["text_emb"], batch["text_mask"], batch["text"])
        else:
            emb, mask = self.text_encoder(batch["text"])
        return StepInputs(x0, emb, mask)

    def _with_empty_captions(self, emb, mask, texts):
        """Precomputed embeddings, with each dropped caption encoded as the empty prompt, exactly as
        on the fly (and as sampling encodes its negative prompt), never as a sequence with no keys."""
        emb, mask = emb.to(self.device), mask.to(self.device)
        dropped = [k for k, text in enumerate(texts) if text == ""]
        if not dropped:
            return emb, mask
        empty, empty_mask = self.text_encoder([""])  # (1, L0, Dt)
        length = max(emb.shape[1], empty.shape[1])
        emb = torch.nn.functional.pad(emb, (0, 0, 0, length - emb.shape[1]))
        mask = torch.nn.functional.pad(mask, (0, length - mask.shape[1]))
        emb[dropped] = torch.nn.functional.pad(empty, (0, 0, 0, length - empty.shape[1]))
        mask[dropped] = torch.nn.functional.pad(empty_mask, (0, length - empty_mask.shape[1]))
        return emb, mask

    def _all_mean(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        if self.world_size > 1:
            dist.all_reduce(t)
            t /= self.world_size
        return t.tolist()

    def train_step(self, batches) -> dict:
        t0 = time.perf_counter()
        wait, losses, samples, tokens, text_len, skipped = 0.0, [], 0, 0, 0, 0
        for micro in range(self.cfg.optim.grad_accum_steps):
            tw = time.perf_counter()
            batch = next(batches)
            while not batch["key"]:  # every sample of it failed to decode: counted, and the next batch taken
                skipped += batch["num_skipped"]
                batch = next(batches)
            wait += time.perf_counter() - tw
            inputs = self._inputs(batch)
            generator = step_generator(self.cfg.seed, self.step, micro, self.dp_rank)
            with torch.autocast(self.device.type, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None):
                loss = self.flow.loss(self.model, inputs.x0, inputs.text_emb, inputs.text_mask, generator)
            (loss / self.cfg.optim.grad_accum_steps).backward()
            losses.append(loss.item())
            grid = self.model.grid(inputs.x0.shape)
            samples += inputs.x0.shape[0]
            tokens += inputs.x0.shape[0] * math.prod(grid)
            text_len = max(text_len, inputs.text_emb.shape[1])
            skipped += batch["num_skipped"]
        if self.world_size > 1:
            sync_gradients(self.model, self.dims, self.mesh)
        grad_norm = clip_gradients(self.model, self.cfg.optim.grad_clip)
        loss, grad_norm_all, stop = self._all_mean([sum(losses) / len(losses), grad_norm,
                                                    float(self.stop_signal is not None)])
        finite = math.isfinite(loss) and math.isfinite(grad_norm_all)
        lr = self.scheduler.get_last_lr()[0]
        if finite:
            self.optimizer.step()
            self.scheduler.step()
            self.ema.update(self.model, self.step)
            self.nonfinite_in_a_row = 0
        else:
            self.nonfinite_total += 1
            self.nonfinite_in_a_row += 1
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elapsed = time.perf_counter() - t0
        # Each replica's tokens were computed by its cp x tp ranks together.
        replica_tokens_per_s = tokens / elapsed
        flops = flops_per_token(self.model, max(1, tokens // max(1, samples)), text_len) * replica_tokens_per_s
        return {"step": self.step, "loss": loss, "grad_norm": grad_norm_all, "lr": lr,
                "samples_per_s": samples * self.dims.dp / elapsed, "tokens_per_s": replica_tokens_per_s * self.dims.dp,
                "mfu": flops / (self.dims.cp * self.dims.tp * self.peak), "data_wait": wait / elapsed,
                "step_s": elapsed, "peak_mem_mib": peak_memory_mib(self.device), "skipped_samples": skipped,
                "nonfinite_steps": self.nonfinite_total, "skipped_step": not finite, "stop": stop > 0}

    # --- the loop ---

    def _say(self, text: str) -> None:
        if self.rank == 0:
            print(text, flush=True)

    def _on_signal(self, signum, frame) -> None:
        self.stop_signal = signal.Signals(signum).name

    def run(self) -> None:
        cfg = self.cfg
        resumed = self.resume()
        if resumed is not None:
            self._say(f"resumed from {resumed} at step {self.step}")
        if self.step >= cfg.num_steps:
            self._say(f"nothing to do: step {self.step} >= num_steps={cfg.num_steps}")
            return
        self.peak = peak_flops(self.device, cfg.peak_flops)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        self._say(f"training {cfg.model.flavor} ({self.num_params / 1e6:.2f}M parameters) on {self.world_size} "
                  f"process(es), dp={self.dims.dp} cp={self.dims.cp} tp={self.dims.tp}, {self.device.type}, "
                  f"steps {self.step + 1}..{cfg.num_steps}; run dir {self.run_dir}")
        metrics = Metrics(self.run_dir, cfg.num_steps, self.step, cfg.log_every_steps, enabled=self.rank == 0)
        batches = iter(self.loader)
        try:
            while self.step < cfg.num_steps:
                self.model.train()
                record = self.train_step(batches)
                metrics.log(record)
                if self.nonfinite_in_a_row >= cfg.max_nonfinite_steps:
                    path = self.save()
                    raise TrainingError(f"{self.nonfinite_in_a_row} steps in a row had a NaN/Inf loss or gradient "
                                        f"(each skipped); stopped at step {self.step}, checkpoint {path}. Lower "
                                        "optim.lr, check the data (NaN in latent.npy?) or raise max_nonfinite_steps")
                if record["stop"]:
                    path = self.save()
                    metrics.message(f"stopped by a signal at step {self.step}; checkpoint {path}")
                    return
                if self.step % cfg.checkpoint.every_steps == 0 or self.step == cfg.num_steps:
                    path = self.save()
                    metrics.message(f"checkpoint {path}")
        except StopIteration as e:
            raise TrainingError(f"the data ran out at step {self.step} (data.num_epochs={cfg.data.num_epochs}); "
                                "set data.num_epochs=null or fewer num_steps") from e
        finally:
            metrics.close()


def run(cfg: DictConfig) -> int:
    """Train; the exit code: 0 done (or stopped by a signal, with a checkpoint), 2 a clear error."""
    code, device = 0, None
    try:
        trainer = Trainer(cfg)
        device = trainer.device
        trainer.run()
    except (ValueError, FileNotFoundError, TrainingError) as e:
        # Raised alike on every rank; each says it, since the launcher stops the others when the first exits.
        print(f"vfm-train: {e}", file=sys.stderr, flush=True)
        code = 2
    if dist.is_initialized():
        dist.barrier()
        if device is not None and device.type == "cpu":
            # gloo's threads can abort a process that tears its group down at exit, after all the
            # work is done ("terminate called without an active exception"): leave without it.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        dist.destroy_process_group()
    return code
