"""`vfm-report <curated dir> [--max-kept 48] [--max-dropped 12] [--seed 0]`: a page that shows what
curation kept, what it dropped and why, written to `<dir>/report/index.html` with its images beside
it. It opens from disk: no scripts, no network.

    summary.json ─► totals, errors by message, drop reasons, per-stage time, config
    manifest.jsonl ─► one row per clip (duration, size, fps, scores, kept or why not) ─► histograms
    shards (kept clips' mp4) and sources (dropped clips) ─► contact sheets of a seeded sample

`vfm-curate ... report=true` writes it at the end of a run. The report folder is written under a
temporary name and renamed when complete.
"""

from __future__ import annotations

import argparse
import html
import io
import json
import random
import shutil
import sys
import tarfile
from collections import defaultdict
from pathlib import Path

import numpy as np

from curator import tolerant_stdio
from curator.writer import read_jsonl

THUMB_HEIGHT = 72
# Scores that a filter reads, with the config keys of its thresholds (drawn on the histograms).
THRESHOLDS = {
    "duration_s": [("clips", "min_s"), ("clips", "max_s")],
    "short_side": [("filters", "min_short_side")],
    "motion": [("filters", "max_motion")],
    "motion_area": [("filters", "min_motion_area")],
    "brightness": [("filters", "min_brightness"), ("filters", "max_brightness")],
    "text_area": [("filters", "max_text_area")],
    "niqe": [("filters", "max_niqe")],
}


# --- the clips ------------------------------------------------------------------------------------


def clip_rows(records: list[dict], shard_meta: dict[str, dict]) -> list[dict]:
    """One row per clip of every readable source: what the histograms and contact sheets show."""
    rows = []
    for r in records:
        if r["status"] != "ok":
            continue
        for c in r["clips"]:
            meta = shard_meta.get(c["key"], {})
            scores = c.get("scores") or meta.get("scores") or {}
            width = c.get("width") or meta.get("width") or r.get("out_width") or r["width"]
            height = c.get("height") or meta.get("height") or r.get("out_height") or r["height"]
            rows.append({
                "key": c["key"], "source": r["source"], "kept": c["kept"],
                "reason": (c["reason"] or "").split(":")[0] or None, "reason_text": c["reason"],
                "start_frame": c["start_frame"], "end_frame": c["end_frame"],
                "start_s": c["start_s"], "end_s": c["end_s"], "duration_s": c["end_s"] - c["start_s"],
                "width": width, "height": height, "short_side": min(width, height), "fps": r["fps"],
                "scores": {k: v for k, v in scores.items() if isinstance(v, int | float) and not isinstance(v, bool)},
                "caption": meta.get("caption"), "caption_source": meta.get("caption_source"),
            })
    return rows


def shard_members(root: Path, keys: set[str] | None, suffixes: tuple[str, ...]) -> dict[str, dict[str, bytes]]:
    """{key: {suffix: bytes}} for the wanted keys (all keys when None) from every complete shard."""
    found: dict[str, dict[str, bytes]] = defaultdict(dict)
    for shard in sorted((root / "shards").glob("*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar:
                key, _, suffix = member.name.partition(".")
                if suffix in suffixes and (keys is None or key in keys):
                    found[key][suffix] = tar.extractfile(member).read()
    return found


# --- frames ---------------------------------------------------------------------------------------


class _CannotSeek(Exception):
    """The container has no index to seek by (raw H.264): decode from the start instead."""


def frames_at(source, times_s: list[float]) -> list[np.ndarray]:
    """RGB frames at (or just after) the given times of a video file or mp4 bytes, in seconds from
    its start (as the manifest counts them: a .ts file's clock starts at 1.4 s or anywhere). A time
    past the last frame's start, by less than a frame, is the last frame. A stream that cannot seek
    (raw H.264, as some cameras and encoders write it) is decoded from its start up to each time."""
    from curator.media import open_input

    def opened():
        return open_input(io.BytesIO(source) if isinstance(source, bytes) else str(source))

    try:
        with opened() as container:
            return [_frame_by_seeking(container, t) for t in times_s]
    except _CannotSeek:
        with opened() as container:
            return _frames_in_order(container, times_s)


def _frame_by_seeking(container, time_s: float) -> np.ndarray:
    import av

    from curator.media import video_stream

    stream = video_stream(container)
    origin = container.start_time / av.time_base if container.start_time is not None else 0.0
    t = origin + time_s  # on the stream's clock
    back = 0.0
    while True:
        try:
            container.seek(max(0, int((t - back) / stream.time_base)), stream=stream, backward=True)
        except av.FFmpegError as e:
            raise _CannotSeek(str(e)) from e
        frames = container.decode(stream)
        frame = next(frames, None)
        if (frame is not None and (frame.time is None or frame.time <= t + 1e-3)) or t - back < origin:
            break
        # Landed past t, or at the end: an MPEG-TS file has no index to seek by. Go back further.
        back = max(1.0, 2 * back)
    shown = None  # the frame on screen at t so far
    while frame is not None and frame.time is not None and frame.time < t - 1e-3:
        shown, frame = frame, next(frames, None)
    if frame is None and shown is not None and t - shown.time < _frame_s(stream):
        frame = shown
    if frame is None:
        raise ValueError(f"no frame at {time_s:.2f} s")
    return frame.to_ndarray(format="rgb24")


def _frame_s(stream) -> float:
    rate = float(stream.average_rate or stream.guessed_rate or 0)
    return 1.0 / rate if rate else 0.0


def _frames_in_order(container, times_s: list[float]) -> list[np.ndarray]:
    """The frames at `times_s`, in one pass from the start. A frame without a timestamp (raw H.264
    has none) is timed by its index at the stream's rate, as curation timed it."""
    import av

    from curator.media import video_stream

    stream = video_stream(container)
    step = _frame_s(stream)
    origin = container.start_time / av.time_base if container.start_time is not None else None
    wanted = sorted(range(len(times_s)), key=lambda i: times_s[i])
    out: list[np.ndarray | None] = [None] * len(times_s)
    shown, t = None, 0.0
    for index, frame in enumerate(container.decode(stream)):
        if frame.time is not None:
            origin = float(frame.time) if origin is None else origin
            t = float(frame.time) - origin
        elif step:
            t = index * step
        else:
            raise ValueError("the stream has neither timestamps nor a frame rate to find a time by")
        while wanted and t >= times_s[wanted[0]] - 1e-3:
            out[wanted.pop(0)] = frame.to_ndarray(format="rgb24")
        if not wanted:
            return out
        shown = frame
    while shown is not None and wanted and times_s[wanted[0]] - t < step:
        out[wanted.pop(0)] = shown.to_ndarray(format="rgb24")
    if wanted:
        raise ValueError(f"no frame at {times_s[wanted[0]]:.2f} s")
    return out


def strip(frames: list[np.ndarray]) -> bytes:
    """Frames side by side at THUMB_HEIGHT, as a JPEG."""
    from PIL import Image

    images = [Image.fromarray(f) for f in frames]
    images = [im.resize((max(1, round(im.width * THUMB_HEIGHT / im.height)), THUMB_HEIGHT)) for im in images]
    sheet = Image.new("RGB", (sum(im.width for im in images) + 2 * (len(images) - 1), THUMB_HEIGHT), "white")
    x = 0
    for im in images:
        sheet.paste(im, (x, 0))
        x += im.width + 2
    buf = io.BytesIO()
    sheet.save(buf, "JPEG", quality=80)
    return buf.getvalue()


def clip_strip(row: dict, mp4: bytes | None) -> bytes:
    """Start, middle and end of a clip: from its mp4 in a shard, else from its source."""
    if mp4 is not None:
        length = row["end_s"] - row["start_s"]
        return strip(frames_at(mp4, [0.0, length / 2, max(0.0, length - 0.05)]))
    a, b = row["start_s"], row["end_s"]
    return strip(frames_at(Path(row["source"]), [a, (a + b) / 2, max(a, b - 0.05)]))


# --- plots ----------------------------------------------------------------------------------------


def _config_value(config: dict, group: str, name: str):
    value = (config.get(group) or {}).get(name)
    return value if isinstance(value, int | float) else None


def histogram(path: Path, title: str, kept: list[float], dropped: list[float], lines: list[tuple[str, float]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.2, 2.6), dpi=90)
    values = kept + dropped
    bins = np.histogram_bin_edges(values, bins=min(30, max(5, len(set(values))))) if values else 10
    ax.hist([kept, dropped], bins=bins, stacked=True, color=["#3a7", "#d54"], label=["kept", "dropped"])
    for label, x in lines:
        ax.axvline(x, color="#333", linestyle="--", linewidth=1)
        ax.text(x, ax.get_ylim()[1] * 0.95, f" {label}={x:g}", fontsize=7, va="top", rotation=90)
    ax.set_title(title, fontsize=9)
    ax.set_ylabel("clips", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def bar_chart(path: Path, title: str, labels: list[str], values: list[float], xlabel: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 0.5 + 0.3 * max(1, len(labels))), dpi=90)
    ax.barh(labels, values, color="#47a")
    for y, v in enumerate(values):
        ax.text(v, y, f" {v:g}", va="center", fontsize=7)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.tick_params(labelsize=7)
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plots(rows: list[dict], summary: dict, out: Path) -> list[tuple[str, str]]:
    """(title, file) of every chart, written into `out`."""
    config = summary.get("config") or {}
    charts = []
    series = {"duration_s": "clip duration (s)", "short_side": "clip short side (px)", "fps": "source fps"}
    names = sorted({k for r in rows for k in r["scores"]})
    series.update({f"score:{n}": f"score: {n}" for n in names})
    for name, title in series.items():
        field = name.removeprefix("score:")
        pick = (lambda r, f=field: r["scores"].get(f)) if name.startswith("score:") else (lambda r, f=field: r[f])
        kept = [float(pick(r)) for r in rows if r["kept"] and pick(r) is not None]
        dropped = [float(pick(r)) for r in rows if not r["kept"] and pick(r) is not None]
        lines = [(f"{g}.{k}", v) for g, k in THRESHOLDS.get(field, [])
                 if (v := _config_value(config, g, k)) is not None and (field != "text_area" or config.get(
                     "filters", {}).get("ocr"))]
        file = f"hist-{field}.png"
        histogram(out / file, title, kept, dropped, lines)
        charts.append((title, file))
    reasons = sorted(summary.get("drop_reasons", {}).items(), key=lambda kv: -kv[1])
    if reasons:
        bar_chart(out / "drop-reasons.png", "dropped clips by reason", [k for k, _ in reasons],
                  [v for _, v in reasons], "clips")
        charts.append(("dropped clips by reason", "drop-reasons.png"))
    stages = summary.get("stage_seconds", {})
    if stages:
        bar_chart(out / "stage-seconds.png", "time per stage (summed over workers)",
                  [k.removesuffix("_s") for k in stages], list(stages.values()), "seconds")
        charts.append(("time per stage", "stage-seconds.png"))
    return charts


# --- the page -------------------------------------------------------------------------------------

CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5rem; color: #222; }
table { border-collapse: collapse; margin: 0.5rem 0 1rem; }
td, th { border: 1px solid #ccc; padding: 0.2rem 0.6rem; text-align: left; font-size: 0.9rem; }
.charts img { margin: 0.3rem; border: 1px solid #eee; }
.cards { display: flex; flex-wrap: wrap; gap: 0.6rem; }
.card { border: 1px solid #ddd; padding: 0.4rem; width: 19rem; font-size: 0.8rem; }
.card img { max-width: 100%; display: block; }
.muted { color: #777; }
pre { background: #f6f6f6; padding: 0.6rem; overflow-x: auto; font-size: 0.8rem; }
"""


def _e(value) -> str:
    return html.escape(str(value))


def card(row: dict, image: str | None, problem: str | None) -> str:
    scores = ", ".join(f"{k} {v:g}" for k, v in sorted(row["scores"].items()))
    picture = f'<img src="{_e(image)}" alt="frames of {_e(row["key"])}">' if image else \
        f'<p class="muted">frames unavailable: {_e(problem)}</p>'
    caption = f"<p>{_e(row['caption'])} <span class='muted'>({_e(row['caption_source'])})</span></p>" \
        if row["caption"] else ""
    why = f"<p><b>{_e(row['reason_text'])}</b></p>" if not row["kept"] else ""
    return (f'<div class="card">{picture}<p><code>{_e(row["key"])}</code> {row["duration_s"]:.2f} s, '
            f'{row["width"]}x{row["height"]}, {row["fps"]:g} fps</p>{why}{caption}'
            f'<p class="muted">{_e(scores)}</p></div>')


def page(summary: dict, charts: list[tuple[str, str]], kept_cards: list[str], dropped: dict[str, list[str]],
         num_kept: int, num_dropped: dict[str, int]) -> str:
    from omegaconf import OmegaConf

    totals = [("inputs", summary["inputs"]), ("errors", summary["errors"]),
              ("hours-in", summary["hours_in"]), ("hours-out", summary["hours_out"]),
              ("clips", summary["clips"]), ("kept", summary["kept"]), ("dropped", summary["dropped"])]
    rows = "".join(f'<tr><th>{name.replace("-", " ")}</th><td id="total-{name}">{_e(v)}</td></tr>'
                   for name, v in totals)
    errors = "".join(f"<tr><td>{_e(m)}</td><td>{n}</td></tr>"
                     for m, n in sorted(summary.get("error_messages", {}).items(), key=lambda kv: -kv[1]))
    errors = f"<table><tr><th>error</th><th>inputs</th></tr>{errors}</table>" if errors else "<p>none</p>"
    wall, frames = summary.get("last_run_wall_s"), summary.get("frames_in", 0)
    stages = "".join(f"<tr><td>{_e(k.removesuffix('_s'))}</td><td>{v:.2f}</td>"
                     f"<td>{frames / v:.1f}</td></tr>" if v else f"<tr><td>{_e(k)}</td><td>0</td><td></td></tr>"
                     for k, v in summary.get("stage_seconds", {}).items())
    ray_s = [f"{what} {summary[key]:.2f} s" for what, key in (("Ray starting", "last_run_ray_start_s"),
                                                                ("stopping", "last_run_ray_stop_s")) if key in summary]
    ray_s = f" (of it {', '.join(ray_s)})" if ray_s else ""
    chart_html = "".join(f'<img src="{_e(f)}" alt="{_e(t)}" title="{_e(t)}">' for t, f in charts)
    dropped_html = "".join(
        f"<h3>{_e(reason)}: showing {len(cards)} of {num_dropped[reason]}</h3><div class='cards'>{''.join(cards)}</div>"
        for reason, cards in dropped.items())
    config = OmegaConf.to_yaml(OmegaConf.create(summary.get("config", {})))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>vfm curation report</title>
<link rel="icon" href="data:,"><style>{CSS}</style></head><body>
<h1>Curation report</h1>
<p class="muted">curator {_e(summary.get('curator_version'))}, config {_e(summary.get('config_hash'))},
output {_e((summary.get('config') or {}).get('output', ''))}</p>
<h2>Totals</h2><table>{rows}</table>
<h2>Errors by message</h2>{errors}
<h2>Time</h2><p>last run: {wall if wall is not None else '?'} s wall{ray_s},
{summary.get('last_run_frames_per_s')} frames/s over {frames} source frames</p>
<table><tr><th>stage</th><th>seconds (summed over workers)</th><th>frames/s</th></tr>{stages}</table>
<h2>Distributions</h2><p class="muted">Stacked: kept (green) and dropped (red) clips; dashed lines are the
filter thresholds of the config.</p><div class="charts">{chart_html}</div>
<h2>Kept clips: showing {len(kept_cards)} of {num_kept}</h2><div class="cards">{''.join(kept_cards)}</div>
<h2>Dropped clips by reason</h2>{dropped_html or '<p>none</p>'}
<h2>Config</h2><pre>{_e(config)}</pre>
</body></html>
"""


def write_report(root: str | Path, max_kept: int = 48, max_dropped: int = 12, seed: int = 0, log=print) -> Path:
    """Write `<root>/report/index.html`; returns its path."""
    root = Path(root)
    if not (root / "summary.json").is_file() or not (root / "manifest.jsonl").is_file():
        raise FileNotFoundError(f"{root} is not a curated output (no summary.json or manifest.jsonl): run vfm-curate")
    if max_kept < 0 or max_dropped < 0:
        raise ValueError("max_kept and max_dropped must be 0 or more")
    summary = json.loads((root / "summary.json").read_text())
    records = read_jsonl(root / "manifest.jsonl")
    meta = {k: json.loads(m["json"]) for k, m in shard_members(root, None, ("json",)).items() if "json" in m}
    rows = clip_rows(records, meta)

    # A seeded sample: the same page for the same data, bounded in size however large the data.
    rng = random.Random(seed)
    kept = [r for r in rows if r["kept"] and r["key"] in meta]
    kept_pick = sorted(rng.sample(kept, min(max_kept, len(kept))), key=lambda r: r["key"])
    by_reason = defaultdict(list)
    for r in rows:
        if not r["kept"]:
            by_reason[r["reason"]].append(r)
    dropped_pick = {reason: sorted(rng.sample(rs, min(max_dropped, len(rs))), key=lambda r: r["key"])
                    for reason, rs in sorted(by_reason.items())}

    tmp = root / ".report.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "clips").mkdir(parents=True)
    log(f"report: {len(rows)} clips; charts, then frames of {len(kept_pick)} kept and "
        f"{sum(map(len, dropped_pick.values()))} dropped clips")
    charts = plots(rows, summary, tmp)
    mp4s = shard_members(root, {r["key"] for r in kept_pick}, ("mp4",))

    def cards(picked: list[dict]) -> list[str]:
        out = []
        for r in picked:
            image, problem = f"clips/{r['key']}.jpg", None
            try:
                (tmp / image).write_bytes(clip_strip(r, mp4s.get(r["key"], {}).get("mp4")))
            except Exception as e:  # an unreadable or moved source costs its thumbnail, not the report
                image, problem = None, f"{type(e).__name__}: {e}"
            out.append(card(r, image, problem))
        return out

    html_text = page(summary, charts, cards(kept_pick), {k: cards(v) for k, v in dropped_pick.items()},
                     len(kept), {k: len(v) for k, v in by_reason.items()})
    # A source name that is not UTF-8 (surrogates in Python) shows as "?", rather than failing the page.
    (tmp / "index.html").write_text(html_text, encoding="utf-8", errors="replace")
    final = root / "report"
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    log(f"report: {final / 'index.html'}")
    return final / "index.html"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="vfm-report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("output", type=Path, help="a vfm-curate output folder")
    parser.add_argument("--max-kept", type=int, default=48, help="kept clips on the contact sheet")
    parser.add_argument("--max-dropped", type=int, default=12, help="dropped clips shown per drop reason")
    parser.add_argument("--seed", type=int, default=0, help="seeds which clips are shown")
    args = parser.parse_args(argv)
    tolerant_stdio()
    try:
        write_report(args.output, args.max_kept, args.max_dropped, args.seed)
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"vfm-report: {e}")


if __name__ == "__main__":
    main()
