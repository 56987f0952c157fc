"""vfm-report on a real curated corpus: the page parses, links only images that exist, states the
totals of summary.json, bounds its contact sheets, and loads cleanly in headless Chromium."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import av
import numpy as np
import pytest
from vfm_testmedia import _encode, _moving

import conf
from curator.pipeline import main_from_config
from curator.report import frames_at, write_report
from curator.stages.split import process_source

REPO = Path(__file__).resolve().parents[1]


class Page(HTMLParser):
    """Image sources, element texts by id, and h2/h3 headings of a page."""

    def __init__(self, text: str):
        super().__init__()
        self.images: list[str] = []
        self.by_id: dict[str, str] = {}
        self.headings: list[str] = []
        self._open: list[tuple[str, str | None]] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img":
            self.images.append(attrs["src"])
        elif tag not in ("link", "meta", "br"):
            self._open.append((tag, attrs.get("id")))
            if attrs.get("id"):
                self.by_id[attrs["id"]] = ""

    def handle_endtag(self, tag):
        if self._open and self._open[-1][0] == tag:
            self._open.pop()

    def handle_data(self, data):
        if self._open:
            tag, ident = self._open[-1]
            if ident:
                self.by_id[ident] += data
            if tag in ("h2", "h3"):
                self.headings.append(data)


@pytest.fixture(scope="module")
def curated(synth_corpus, ray_local, tmp_path_factory) -> Path:
    """The synthetic corpus (cuts, a fade, static and near-black shots) plus two broken files, curated
    by `vfm-curate ... report=true` (the same entry point, without Hydra's command line)."""
    media_dir, _ = synth_corpus
    inputs = tmp_path_factory.mktemp("report-inputs")
    for p in media_dir.glob("*.mp4"):
        shutil.copy(p, inputs / p.name)
    (inputs / "empty.mp4").write_bytes(b"")
    (inputs / "notes.mp4").write_text("not a video\n")
    out = tmp_path_factory.mktemp("report-curated")
    cfg = conf.compose("curate", [f"input={inputs}", f"output={out}", "ray.num_cpus=2", "report=true"])
    assert main_from_config(cfg) == 0
    return out


def test_the_page_states_the_summary_and_links_only_images_that_exist(curated):
    index = curated / "report" / "index.html"
    summary = json.loads((curated / "summary.json").read_text())
    page = Page(index.read_text())
    for name in ("inputs", "errors", "clips", "kept", "dropped", "hours-in", "hours-out"):
        assert page.by_id[f"total-{name}"] == str(summary[name.replace("-", "_")]), name
    assert summary["errors"] == 2 and summary["dropped"] >= 2
    assert page.images and all((index.parent / src).is_file() for src in page.images)
    for chart in ("hist-duration_s.png", "hist-brightness.png", "hist-motion_area.png", "drop-reasons.png",
                  "stage-seconds.png"):
        assert chart in page.images
    text = index.read_text()
    for message in summary["error_messages"]:
        assert message.replace("'", "&#x27;").replace('"', "&quot;") in text or message in text
    for reason in summary["drop_reasons"]:
        assert any(h.startswith(f"{reason}: showing") for h in page.headings), (reason, page.headings)
    assert f"showing {summary['kept']} of {summary['kept']}" in text
    assert summary["config_hash"] in text and "min_brightness" in text  # the config that made the data
    assert f"Ray starting {summary['last_run_ray_start_s']:.2f} s, stopping {summary['last_run_ray_stop_s']:.2f} s" \
        in text
    assert not (curated / ".report.tmp").exists()


def test_contact_sheets_are_a_bounded_seeded_sample(curated, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(curated, out, ignore=shutil.ignore_patterns("report"))
    kept = json.loads((out / "summary.json").read_text())["kept"]
    first = write_report(out, max_kept=3, max_dropped=1, seed=7, log=lambda *_: None).read_text()
    assert f"showing 3 of {kept}" in first
    dropped_headings = [h for h in Page(first).headings if ": showing" in h and not h.startswith("Kept")]
    assert dropped_headings and all(": showing 1 of" in h for h in dropped_headings)
    assert len(list((out / "report" / "clips").glob("*.jpg"))) == 3 + len(
        json.loads((out / "summary.json").read_text())["drop_reasons"])
    again = write_report(out, max_kept=3, max_dropped=1, seed=7, log=lambda *_: None).read_text()
    assert again == first
    other = write_report(out, max_kept=3, max_dropped=1, seed=8, log=lambda *_: None).read_text()
    assert re.findall(r"clips/[^\"]+\.jpg", other) != re.findall(r"clips/[^\"]+\.jpg", first)


def test_a_moved_source_costs_its_dropped_thumbnails_not_the_report(curated, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(curated, out, ignore=shutil.ignore_patterns("report"))
    manifest = out / "manifest.jsonl"
    lines = [json.loads(line) for line in manifest.read_text().splitlines()]
    for r in lines:
        r["source"] = str(tmp_path / "gone" / Path(r["source"]).name)
    manifest.write_text("".join(json.dumps(r) + "\n" for r in lines))
    index = write_report(out, log=lambda *_: None)
    page = Page(index.read_text())
    assert all((index.parent / src).is_file() for src in page.images)
    assert "frames unavailable" in index.read_text()  # dropped clips: not in shards, source gone
    kept = json.loads((out / "summary.json").read_text())["kept"]
    assert sum(src.startswith("clips/") for src in page.images) == kept  # kept clips come from the shards


def _curated_moving_square(path: Path):
    """A 72-frame moving square written to `path` (its container from the suffix) and curated:
    (the source's record, its one clip, every decoded frame as RGB)."""
    _encode(path, _moving(72, 64, 96, 4))
    record, clips = process_source(str(path), path.stem, conf.compose("curate", ["input=x", "output=y"]))
    with av.open(str(path)) as c:
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    (clip,) = clips
    return record, clip, frames


def test_a_clips_seconds_find_its_frames_in_a_ts_source(tmp_path):
    # MPEG-TS starts its clock at 1.4 s and has no index to seek by: the manifest counts seconds from
    # the file's start (as players and `ffmpeg -ss` do), and the report's thumbnails find a clip's
    # first and last frames from them.
    path = tmp_path / "broadcast.ts"
    record, clip, frames = _curated_moving_square(path)
    assert 0 <= clip.start_s < 0.2  # its first frame comes 2 frames in, after the B-frame delay
    first, last = frames_at(path, [clip.start_s, clip.end_s - 1.5 / record["fps"]])
    assert np.array_equal(first, frames[clip.start_frame]) and np.array_equal(last, frames[clip.end_frame - 1])


def test_a_raw_h264_source_that_cannot_seek_still_shows_a_clips_frames(tmp_path):
    # Raw H.264, as some cameras and encoders write it, has no index to seek by and no timestamps:
    # the report decodes it from its start, timing frames by their index as curation did. The last
    # time, within a frame after the last frame's start, is that last frame.
    path = tmp_path / "camera.h264"
    record, clip, frames = _curated_moving_square(path)
    assert (clip.start_frame, clip.end_frame) == (0, 72)
    middle_s = (clip.start_s + clip.end_s) / 2
    got = frames_at(path, [clip.start_s, middle_s, clip.end_s - 0.01])
    want = [frames[0], frames[round(middle_s * record["fps"])], frames[71]]
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))


def test_vfm_report_refuses_a_folder_that_is_not_curated(tmp_path):
    r = subprocess.run([sys.executable, "-m", "curator.report", str(tmp_path)], cwd=REPO, capture_output=True,
                       text=True)
    assert r.returncode == 1 and "is not a curated output" in r.stderr and "Traceback" not in r.stderr


def test_the_page_loads_from_disk_in_headless_chromium(curated, tmp_path):
    from vfm_browser import browser_page

    with browser_page() as (page, problems):
        failed = []
        page.on("requestfailed", lambda request: failed.append(request.url))
        page.goto((curated / "report" / "index.html").as_uri())
        page.wait_for_load_state("load")
        broken = page.eval_on_selector_all("img", "imgs => imgs.filter(i => !i.complete || i.naturalWidth === 0)"
                                                  ".map(i => i.src)")
        count = page.eval_on_selector_all("img", "imgs => imgs.length")
        page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
    assert count > 5 and broken == [] and failed == [] and problems == []
    assert (tmp_path / "report.png").stat().st_size > 10_000
