"""Captioners: each turns a clip's record into (caption, source of the caption).

- `attributes`: a sentence composed from what was measured in the clip; offline, always available.
- `sidecar`: captions given beside the sources (same-stem .txt or .json, or a CSV of path,caption);
  a clip whose source has none falls back to `attributes`, and says so in `caption_source`.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path


def attributes_caption(scores: dict) -> str:
    subject = f"a {scores['object_colour']} object" if scores.get("object_colour") else "a scene"
    if subject.startswith("a ") and subject[2] in "aeiou":
        subject = "an" + subject[1:]
    if scores.get("object_direction"):
        action = f" moves {scores['object_direction']}"
    elif scores.get("object_colour"):
        action = " stays still"
    else:
        action = ""
    text = f"{subject}{action} on a {scores['background_colour']} background"
    if scores.get("camera_pan"):
        text += f", the camera pans {scores['camera_pan']}"
    brightness = scores.get("brightness", 128)
    if brightness < 30:
        text += ", dimly lit"
    if scores.get("text_area", 0) > 0.01:
        text += ", with text on screen"
    return text


class AttributesCaptioner:
    def __init__(self, cfg=None):
        pass

    def __call__(self, source: str, scores: dict) -> tuple[str, str]:
        return attributes_caption(scores), "attributes"


class SidecarCaptioner:
    def __init__(self, cfg):
        self.table: dict[str, str] = {}
        if cfg.csv:
            path = Path(cfg.csv)
            if not path.is_file():
                raise FileNotFoundError(f"captioner.csv={cfg.csv!r}: no such file")
            with open(path, newline="") as f:
                for row in csv.reader(f):
                    if len(row) >= 2 and row[0] != "path":
                        self.table[str((path.parent / row[0]).resolve())] = row[1].strip()

    def _lookup(self, source: str) -> str | None:
        if source in self.table:
            return self.table[source]
        stem = Path(source).with_suffix("")
        txt, js = stem.with_suffix(".txt"), stem.with_suffix(".json")
        if txt.is_file():
            return txt.read_text(errors="replace").strip() or None
        if js.is_file():
            try:
                value = json.loads(js.read_text()).get("caption")
            except (json.JSONDecodeError, AttributeError):
                return None
            return value.strip() if isinstance(value, str) and value.strip() else None
        return None

    def __call__(self, source: str, scores: dict) -> tuple[str, str]:
        caption = self._lookup(source)
        if caption is None:
            return attributes_caption(scores), "attributes (no sidecar)"
        return caption, "sidecar"


def build_captioner(cfg):
    if cfg.name == "attributes":
        return AttributesCaptioner(cfg)
    if cfg.name == "sidecar":
        return SidecarCaptioner(cfg)
    raise ValueError(f"captioner={cfg.name!r} is not available yet; use attributes or sidecar")
