"""`vfm-serve checkpoint=<exported dir> [server.port=8000]`: the sampling pipeline as an HTTP service
(FastAPI + uvicorn); across ranks: `torchrun --nproc-per-node N -m inference.server ...`.

    POST /v1/videos {prompt, ...} ─► 202 {id} ─► bounded queue (429 + Retry-After when full)
    scheduler thread: the oldest job, plus queued jobs of the same shape and step count that arrive
    within max_wait_ms, up to max_batch_size, sampled as one batch ─► mp4 kept for result_ttl_s
    GET /v1/videos/{id} (status, progress, timings) · /content (video/mp4) · DELETE cancels
    GET /healthz · /metrics (Prometheus text) · / (a web page) · /docs, /openapi.json

With several ranks, rank 0 serves HTTP and schedules; it sends each batch to every rank, and all
ranks sample it together (inference/parallel.py). Each step rank 0 also sends whether to go on,
so a cancel or timeout stops every rank at the same step.
"""

# No `from __future__ import annotations` here: FastAPI reads the request models that create_app
# defines locally from the handlers' annotations, which must then be real classes, not strings.
import hmac
import os
import secrets
import threading
import time
from collections import Counter, deque
from dataclasses import asdict, dataclass, field
from pathlib import Path

from inference.pipeline import Limits, Request, VideoPipeline

STATIC = Path(__file__).parent / "static"
LATENCY_BUCKETS = (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600)


class Cancelled(Exception):
    """Every job of a batch was cancelled or timed out: stop sampling it."""


@dataclass
class Job:
    id: str
    request: Request
    created: float = field(default_factory=time.time)
    status: str = "queued"  # queued | running | succeeded | failed | cancelled
    step: int = 0
    error: str | None = None
    video: bytes | None = None
    timings: dict = field(default_factory=dict)
    finished: float | None = None

    def view(self) -> dict:
        return {"id": self.id, "status": self.status, "progress": {"step": self.step, "total": self.request.steps},
                "error": self.error, "timings": self.timings, "request": asdict(self.request)}


class Metrics:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = Counter()
        self.batch_sizes = Counter()
        self.latency = Counter()
        self.latency_sum = 0.0

    def observe(self, job: Job) -> None:
        seconds = job.finished - job.created
        with self.lock:
            self.counts[job.status] += 1
            self.latency_sum += seconds
            self.latency["+Inf"] += 1
            for b in LATENCY_BUCKETS:
                if seconds <= b:
                    self.latency[str(b)] += 1

    def text(self, queue_depth: int, prompt_cache) -> str:
        """Prometheus text; `prompt_cache`: the pipeline's PromptCache (texts looked up, found or encoded)."""
        with self.lock:
            lines = ["# TYPE vfm_queue_depth gauge", f"vfm_queue_depth {queue_depth}",
                     "# TYPE vfm_requests_total counter"]
            lines += [f'vfm_requests_total{{status="{s}"}} {n}' for s, n in sorted(self.counts.items())]
            lines.append("# TYPE vfm_batch_size_total counter")
            lines += [f'vfm_batch_size_total{{size="{s}"}} {n}' for s, n in sorted(self.batch_sizes.items())]
            lines.append("# TYPE vfm_request_latency_seconds histogram")
            lines += [f'vfm_request_latency_seconds_bucket{{le="{b}"}} {self.latency[str(b)]}' for b in LATENCY_BUCKETS]
            lines.append(f'vfm_request_latency_seconds_bucket{{le="+Inf"}} {self.latency["+Inf"]}')
            lines.append(f"vfm_request_latency_seconds_sum {self.latency_sum:.6f}")
            lines.append(f"vfm_request_latency_seconds_count {self.latency['+Inf']}")
        lines += ["# TYPE vfm_prompt_cache_lookups_total counter",
                  f'vfm_prompt_cache_lookups_total{{result="hit"}} {prompt_cache.hits}',
                  f'vfm_prompt_cache_lookups_total{{result="miss"}} {prompt_cache.misses}']
        return "\n".join(lines) + "\n"


class Scheduler:
    """Queue, batching and the sampling thread; the HTTP layer only calls submit/get/cancel."""

    def __init__(self, pipe: VideoPipeline, cfg, fps: int = 8, distributed: bool = False):
        self.pipe = pipe
        self.cfg = cfg
        self.fps = fps
        self.distributed = distributed
        self.jobs: dict[str, Job] = {}
        self.queue: deque[Job] = deque()
        self.cond = threading.Condition()
        self.metrics = Metrics()
        self.stopping = False
        self.thread = threading.Thread(target=self._loop, name="vfm-scheduler", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        self.thread.join(timeout=30)

    # --- called from HTTP handlers ---

    def submit(self, request: Request) -> Job | None:
        """The queued job, or None when the queue is full."""
        with self.cond:
            if len(self.queue) >= self.cfg.max_queue:
                return None
            job = Job(secrets.token_urlsafe(16), request)  # 128 random bits: ids cannot be guessed
            self.jobs[job.id] = job
            self.queue.append(job)
            self.cond.notify_all()
            return job

    def get(self, job_id: str) -> Job | None:
        with self.cond:
            self._expire()
            return self.jobs.get(job_id)

    def cancel(self, job_id: str) -> Job | None:
        with self.cond:
            job = self.jobs.get(job_id)
            if job is not None and job.status in ("queued", "running"):
                if job.status == "queued":
                    self.queue.remove(job)
                self._finish(job, "cancelled", "cancelled by the client")
            return job

    def retry_after(self) -> int:
        """Seconds until a queue slot is likely free: one batch's worth of the slowest queued job."""
        with self.cond:
            steps = max((j.request.steps for j in self.queue), default=1)
        return max(1, int(steps * 0.5))

    def queue_depth(self) -> int:
        with self.cond:
            return len(self.queue)

    # --- the sampling thread ---

    def _finish(self, job: Job, status: str, error: str | None = None) -> None:
        job.status, job.error, job.finished = status, error, time.time()
        self.metrics.observe(job)

    def _expire(self) -> None:
        now = time.time()
        for job_id in [i for i, j in self.jobs.items() if j.finished and now - j.finished > self.cfg.result_ttl_s]:
            del self.jobs[job_id]

    def _next_batch(self) -> list[Job] | None:
        with self.cond:
            while not self.queue and not self.stopping:
                self.cond.wait(timeout=1.0)
                self._expire()
            if self.stopping:
                return None
            first = self.queue[0]
            deadline = time.monotonic() + self.cfg.max_wait_ms / 1000
            while True:
                same = [j for j in self.queue if j.request.shape_key() == first.request.shape_key()]
                if len(same) >= self.cfg.max_batch_size or time.monotonic() >= deadline:
                    break
                self.cond.wait(timeout=max(0.0, deadline - time.monotonic()))
            batch = same[:self.cfg.max_batch_size]
            for job in batch:
                self.queue.remove(job)
                job.status = "running"
            self.metrics.batch_sizes[str(len(batch))] += 1
            return batch

    def _loop(self) -> None:
        while True:
            batch = self._next_batch()
            if self.distributed:
                from inference.parallel import broadcast_batch

                broadcast_batch([j.request for j in batch] if batch else None)
            if batch is None:
                return
            self._run(batch)

    def _run(self, batch: list[Job]) -> None:
        t0 = time.time()

        def progress(step: int, total: int) -> None:
            go_on = False
            with self.cond:
                for job in batch:
                    if job.status == "running" and time.time() - job.created > self.cfg.request_timeout_s:
                        self._finish(job, "failed", f"timed out after {self.cfg.request_timeout_s} s")
                    if job.status == "running":
                        job.step = step
                        go_on = True
            if self.distributed:
                from inference.parallel import broadcast_flag

                go_on = broadcast_flag(go_on)
            if not go_on:
                raise Cancelled

        try:
            frames, timings = self.pipe([j.request for j in batch], progress)
        except Cancelled:
            return
        except Exception as e:  # a failure inside sampling fails this batch's requests, never the server
            with self.cond:
                for job in batch:
                    if job.status == "running":
                        self._finish(job, "failed", f"sampling failed: {type(e).__name__}: {e}")
            return
        encoded = {}
        for i, job in enumerate(batch):
            if job.status == "running":
                encoded[job.id] = _mp4_bytes(frames[i], self.fps)
        with self.cond:
            for job in batch:
                if job.id in encoded and job.status == "running":
                    job.video = encoded[job.id]
                    job.timings = {"queued_s": round(t0 - job.created, 3), "sample_s": round(timings["sample_s"], 3),
                                   "text_s": round(timings["text_s"], 3), "steps_s": round(timings["steps_s"], 3),
                                   "decode_s": round(timings["decode_s"], 3), "batch_size": len(batch),
                                   "total_s": round(time.time() - job.created, 3)}
                    self._finish(job, "succeeded")


def _mp4_bytes(frames, fps: int) -> bytes:
    import tempfile

    from inference.pipeline import write_mp4

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "video.mp4"
        write_mp4(frames, path, fps)
        return path.read_bytes()


# --- HTTP ---------------------------------------------------------------------------------------------


def create_app(scheduler: Scheduler, limits: Limits, api_key: str | None = None):
    from fastapi import Depends, FastAPI, Header, HTTPException, Response
    from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse
    from pydantic import BaseModel, ConfigDict, Field

    class VideoRequest(BaseModel):
        model_config = ConfigDict(extra="forbid")
        prompt: str = Field(min_length=1, max_length=limits.max_prompt_chars)
        negative_prompt: str = Field(default="", max_length=limits.max_prompt_chars)
        num_frames: int = Field(default=8, ge=1, le=limits.max_frames)
        height: int = Field(default=32, ge=1, le=limits.max_height)
        width: int = Field(default=32, ge=1, le=limits.max_width)
        steps: int = Field(default=20, ge=1, le=limits.max_steps)
        guidance_scale: float = Field(default=5.0, ge=0, le=limits.max_guidance)
        seed: int = Field(default=0, ge=0, le=2**63 - 1)

    class Accepted(BaseModel):
        id: str

    def authorize(authorization: str | None = Header(default=None), x_api_key: str | None = Header(default=None)):
        if api_key is None:
            return
        given = x_api_key or (authorization[7:] if authorization and authorization.startswith("Bearer ") else None)
        if given is None or not hmac.compare_digest(given.encode(), api_key.encode()):
            raise HTTPException(401, "a valid API key is required: header 'Authorization: Bearer <key>' or 'X-API-Key'")

    def job_or_404(job_id: str) -> Job:
        job = scheduler.get(job_id)
        if job is None:
            raise HTTPException(404, f"no video {job_id!r} (never made, or expired after "
                                     f"{scheduler.cfg.result_ttl_s:g} s)")
        return job

    app = FastAPI(title="vfm", description="Text to video with a vfm model.", version="0.1.0")

    @app.post("/v1/videos", status_code=202, response_model=Accepted, dependencies=[Depends(authorize)])
    def create(body: VideoRequest):
        request = Request(**body.model_dump())
        problems = limits.check(request)
        if problems:
            raise HTTPException(422, "; ".join(problems))
        job = scheduler.submit(request)
        if job is None:
            return JSONResponse({"detail": f"the queue is full ({scheduler.cfg.max_queue} waiting): retry later"},
                                status_code=429, headers={"Retry-After": str(scheduler.retry_after())})
        return {"id": job.id}

    @app.get("/v1/videos/{job_id}", dependencies=[Depends(authorize)])
    def status(job_id: str):
        return job_or_404(job_id).view()

    @app.get("/v1/videos/{job_id}/content", dependencies=[Depends(authorize)],
             responses={200: {"content": {"video/mp4": {}}}})
    def content(job_id: str):
        job = job_or_404(job_id)
        if job.status == "succeeded":
            return Response(job.video, media_type="video/mp4")
        if job.status == "failed":
            raise HTTPException(500, job.error)
        if job.status == "cancelled":
            raise HTTPException(410, "the video was cancelled")
        raise HTTPException(409, f"the video is {job.status} (step {job.step} of {job.request.steps})")

    @app.delete("/v1/videos/{job_id}", dependencies=[Depends(authorize)])
    def cancel(job_id: str):
        job_or_404(job_id)
        return scheduler.cancel(job_id).view()

    @app.get("/healthz")
    def healthz():
        return {"status": "ok", "queue_depth": scheduler.queue_depth()}

    @app.get("/metrics", response_class=PlainTextResponse)
    def metrics():
        return scheduler.metrics.text(scheduler.queue_depth(), scheduler.pipe.prompts)

    @app.get("/", include_in_schema=False)
    def page():
        return FileResponse(STATIC / "index.html", media_type="text/html")

    @app.get("/v1/limits")
    def allowed():
        return asdict(limits)

    return app


def serve(cfg) -> int:
    import sys

    import torch
    import uvicorn

    from inference.parallel import finish, init_parallel, sampling_dims, serve_worker, world

    rank, world_size = world()
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    s = cfg.server
    try:
        dims = sampling_dims(cfg.parallel, cfg.cfg_parallel, world_size)
        pipe = VideoPipeline.from_export(cfg.checkpoint, cfg.diffusion.scheduler, cfg.diffusion.shift, device,
                                         s.prompt_cache_mb)
        api_key = None
        if s.api_key_env:
            api_key = os.environ.get(s.api_key_env)
            if not api_key:
                raise ValueError(f"server.api_key_env={s.api_key_env}, but that environment variable is empty")
    except (ValueError, FileNotFoundError) as e:
        print(f"vfm-serve: {e}", file=sys.stderr, flush=True)
        return 2
    init_parallel(pipe, dims)
    if rank != 0:  # the other ranks sample what rank 0 sends until it says stop
        serve_worker(pipe)
        finish(device)
        return 0
    limits = pipe.limits(max_frames=s.max_num_frames, max_height=s.max_height, max_width=s.max_width,
                         max_steps=s.max_steps, max_prompt_chars=s.max_prompt_chars)
    scheduler = Scheduler(pipe, s, cfg.fps, distributed=world_size > 1)
    scheduler.start()
    print(f"vfm-serve: http://{s.host}:{s.port}/ ({world_size} process(es); API key "
          f"{'required' if api_key else 'off'})", flush=True)
    try:
        uvicorn.run(create_app(scheduler, limits, api_key), host=s.host, port=s.port, log_level="warning")
    finally:
        scheduler.stop()
    finish(device)
    return 0


def main() -> None:
    """`python -m inference.server` and torchrun's entry: vfm-serve's (inference.cli)."""
    from inference.cli import serve_main

    serve_main()


if __name__ == "__main__":
    main()
