"""Captioners: `captioner(source, clips, mp4s)` returns (caption, where it came from) for each
kept clip of one source, given the clips' records and their encoded mp4s (bytes, or files).

- `attributes`: a sentence composed from what was measured in the clip; offline, always available.
- `sidecar`: captions given beside the sources (same-stem .txt or .json, or a CSV of path,caption);
  a clip whose source has none falls back to `attributes`, and says so in `caption_source`.
- `vlm`: a transformers vision-language model (local folder or hub id) over frames sampled from
  each clip, tiled into one image, in batches.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import av
import numpy as np

# Of the frame, changing visibly between frames 1/25 s apart (score.measure's motion_area): above
# this, an object that goes nowhere moves about (waves, paces, turns); below, it stays still.
MOVES_ABOUT_AREA = 0.005
# Frames a second (score.measure's object_speed, pan_speed) below which a move is slow: across the
# frame in more than 10 s; and above which it is quick: in less than 2 s. A zoom's speed (zoom_speed,
# the log of its growth a second) against the same: slow, by under 10% a second; quick, 65% and more;
# and a turn's (turn_speed, radians a second): slow, under 6 degrees a second; quick, over 29.
SLOW, QUICK = 0.1, 0.5


def _pace(speed: float | None) -> str:
    if speed is None:
        return ""
    return " slowly" if speed < SLOW else " quickly" if speed > QUICK else ""


def attributes_caption(scores: dict) -> str:
    subject = f"a {scores['object_colour']} object" if scores.get("object_colour") else "a scene"
    if subject.startswith("a ") and subject[2] in "aeiou":
        subject = "an" + subject[1:]
    if scores.get("object_direction"):
        action = f" moves {scores['object_direction']}{_pace(scores.get('object_speed'))}"
    elif scores.get("object_colour"):
        # Something apart from the background with no way it goes. It "stayed still" also where it
        # moved all the time (bikes.mp4's first shot: a road passing under a camera from above).
        action = " moves about" if scores.get("motion_area", 0.0) > MOVES_ABOUT_AREA else " stays still"
    else:
        action = ""
    text = f"{subject}{action} on a {scores['background_colour']} background"
    if scores.get("camera_pan"):
        text += f", the camera pans {scores['camera_pan']}{_pace(scores.get('pan_speed'))}"
    elif scores.get("camera_zoom"):
        text += f", the camera zooms {scores['camera_zoom']}{_pace(scores.get('zoom_speed'))}"
    elif scores.get("camera_turn"):
        text += f", the camera turns {scores['camera_turn']}{_pace(scores.get('turn_speed'))}"
    brightness = scores.get("brightness", 128)
    if brightness < 30:
        text += ", dimly lit"
    if scores.get("text_area", 0) > 0.01:
        text += ", with text on screen"
    return text


class AttributesCaptioner:
    def __call__(self, source: str, clips: list[dict], mp4s: list[bytes | str]) -> list[tuple[str, str]]:
        return [(attributes_caption(c["scores"]), "attributes") for c in clips]


def read_sidecar(path: Path, errors: str = "replace") -> str:
    """A caption file's text, as the tools that write them save it: UTF-8, with the byte order mark
    Excel's "CSV UTF-8" and Windows' Notepad put first (it stayed at the caption's start, and JSON
    would not parse), or UTF-16 (Notepad's "Unicode", which read as UTF-8 was noise). Bytes of no
    such encoding (Latin-1, say) come out as replacement characters rather than failing the source;
    with `errors="surrogateescape"`, in UTF-8, as Python has such bytes in a file name."""
    data = path.read_bytes()
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return data.decode("utf-16", errors="replace")
    return data.decode("utf-8-sig", errors=errors)


def _text(value: str) -> str:
    """`value` with the surrogates of bytes that are not UTF-8 as replacement characters."""
    return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


class SidecarCaptioner:
    def __init__(self, cfg):
        self.table: dict[str, str] = {}
        if cfg.csv:
            path = Path(cfg.csv)
            if not path.is_file():
                raise FileNotFoundError(f"captioner.csv={cfg.csv!r}: no such file")
            # A path that is not UTF-8 (a name off an old Windows drive) keeps its bytes, to match
            # its source; a caption's such bytes become replacement characters.
            for row in csv.reader(io.StringIO(read_sidecar(path, "surrogateescape"), newline="")):
                if len(row) >= 2 and row[0] != "path":
                    self.table[str((path.parent / row[0]).resolve())] = _text(row[1].strip())

    def _lookup(self, source: str) -> str | None:
        if source in self.table:
            return self.table[source]
        stem = Path(source).with_suffix("")
        txt, js = stem.with_suffix(".txt"), stem.with_suffix(".json")
        if txt.is_file():
            return read_sidecar(txt).strip() or None
        if js.is_file():
            try:
                value = json.loads(read_sidecar(js)).get("caption")
            except (json.JSONDecodeError, AttributeError):
                return None
            return value.strip() if isinstance(value, str) and value.strip() else None
        return None

    def __call__(self, source: str, clips: list[dict], mp4s: list[bytes | str]) -> list[tuple[str, str]]:
        caption = self._lookup(source)
        if caption is None:
            return [(attributes_caption(c["scores"]), "attributes (no sidecar)") for c in clips]
        return [(caption, "sidecar") for _ in clips]


def sample_frames(mp4: bytes | str, num_frames: int) -> list[np.ndarray]:
    """`num_frames` frames spread evenly over an encoded clip (its bytes or its file), (H, W, 3) uint8 each."""
    with av.open(io.BytesIO(mp4) if isinstance(mp4, bytes) else mp4) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    picks = np.linspace(0, len(frames) - 1, num_frames).round().astype(int)
    return [frames[i] for i in picks]


def tile(frames: list[np.ndarray]) -> np.ndarray:
    """Frames in a near-square grid, row by row: one image a single-image model can read as a clip."""
    cols = int(np.ceil(np.sqrt(len(frames))))
    rows = int(np.ceil(len(frames) / cols))
    h, w, _ = frames[0].shape
    grid = np.zeros((rows * h, cols * w, 3), np.uint8)
    for i, f in enumerate(frames):
        r, c = divmod(i, cols)
        grid[r * h:(r + 1) * h, c * w:(c + 1) * w] = f
    return grid


class VLMCaptioner:
    """Loads the model once per actor; on CUDA in bf16 when a GPU is given, else fp32 on the CPU."""

    def __init__(self, cfg, device: str | None = None):
        import torch
        from transformers import AutoModelForImageTextToText, AutoProcessor

        self.cfg = cfg
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.dtype = torch.bfloat16 if self.device == "cuda" else torch.float32
        self.processor = AutoProcessor.from_pretrained(cfg.model)
        self.model = AutoModelForImageTextToText.from_pretrained(cfg.model, dtype=self.dtype).to(self.device).eval()
        self.prompt = cfg.prompt
        if getattr(self.processor, "chat_template", None):
            messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": cfg.prompt}]}]
            self.prompt = self.processor.apply_chat_template(messages, add_generation_prompt=True)

    def caption_images(self, images: list[np.ndarray]) -> list[str]:
        import torch

        out = []
        for i in range(0, len(images), self.cfg.batch_size):
            batch = images[i:i + self.cfg.batch_size]
            inputs = self.processor(images=batch, text=[self.prompt] * len(batch), return_tensors="pt", padding=True)
            # Pixels come as fp32 whatever the model's dtype; not every model casts them itself.
            inputs = {k: v.to(self.device, self.dtype) if v.is_floating_point() else v.to(self.device)
                      for k, v in inputs.items()}
            with torch.no_grad():
                ids = self.model.generate(**inputs, max_new_tokens=self.cfg.max_new_tokens, do_sample=False)
            new = ids[:, inputs["input_ids"].shape[1]:]  # the answer, without the prompt
            out += [t.strip() for t in self.processor.batch_decode(new, skip_special_tokens=True)]
        return out

    def __call__(self, source: str, clips: list[dict], mp4s: list[bytes | str]) -> list[tuple[str, str]]:
        texts = self.caption_images([tile(sample_frames(m, self.cfg.num_frames)) for m in mp4s])
        return [(t, "vlm") if t else (attributes_caption(c["scores"]), "attributes (vlm gave no text)")
                for t, c in zip(texts, clips, strict=True)]


def check_vlm(cfg) -> None:
    """Fail before any work when the model cannot be found (no download happens here)."""
    from transformers import AutoConfig

    if cfg.num_frames < 1 or cfg.batch_size < 1 or cfg.max_new_tokens < 1:
        raise ValueError("captioner.num_frames, batch_size and max_new_tokens must all be >= 1")
    try:
        AutoConfig.from_pretrained(cfg.model)
    except (OSError, ValueError) as e:
        raise ValueError(f"captioner.model={cfg.model!r}: cannot load its config ({e})") from e


def build_captioner(cfg):
    if cfg.name == "attributes":
        return AttributesCaptioner()
    if cfg.name == "sidecar":
        return SidecarCaptioner(cfg)
    if cfg.name == "vlm":
        return VLMCaptioner(cfg)
    raise ValueError(f"captioner={cfg.name!r}: available are attributes, sidecar, vlm")
