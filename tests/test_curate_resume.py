"""kill -9 of a running vfm-curate, then the same command again: the job finishes with no duplicate,
missing or truncated samples, and the same samples as an uninterrupted run. The same for Ctrl-C, a
full disk and a torn state line; and one run at a time writes an output."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import decord
import pytest
import webdataset as wds

import conf
from curator import synth
from curator.pipeline import curate
from curator.writer import OutputDir, OutputWriteError, read_jsonl

ARGS = ["writer.samples_per_shard=2", "num_workers=1", "ray.num_cpus=2", "dedup.enabled=false"]


def _run(inputs: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "curator.cli", f"input={inputs}", f"output={out}", *ARGS],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=_ctrl_c_as_in_a_terminal)


def _ctrl_c_as_in_a_terminal() -> None:
    """A shell's background job (`make test &`) starts with SIGINT ignored, and its children with
    it: the run would not see the Ctrl-C that the test sends. A run started from a terminal does."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _samples(out: Path) -> dict[str, dict]:
    shards = sorted(str(p) for p in (out / "shards").glob("*.tar"))
    samples = {}
    for s in wds.WebDataset(shards, shardshuffle=False):
        assert s["__key__"] not in samples, f"duplicate sample {s['__key__']}"
        samples[s["__key__"]] = s
    return samples


def _finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        os.killpg(proc.pid, signal.SIGKILL) if proc.poll() is None else None
    return out


def test_kill_9_mid_run_then_rerun_finishes_the_job(tmp_path, ray_local):
    inputs = tmp_path / "in"
    synth.write_corpus(inputs, seed=5, num_shape_videos=10)
    clean, resumed = tmp_path / "clean", tmp_path / "resumed"
    # The uninterrupted run, in this process's Ray (runs are the same in any: test_curate's determinism tests)
    assert curate(conf.compose("curate", [f"input={inputs}", f"output={clean}", *ARGS]), log=lambda *_: None)

    proc = _run(inputs, resumed)
    deadline = time.time() + 240
    while time.time() < deadline and len(read_jsonl(resumed / "manifest.jsonl")) < 4:
        time.sleep(0.05)
    done_before_kill = len(read_jsonl(resumed / "manifest.jsonl"))
    os.kill(proc.pid, signal.SIGKILL)  # the driver, mid-run
    proc.wait()
    time.sleep(1)
    with contextlib.suppress(ProcessLookupError):  # nothing of it left
        os.killpg(proc.pid, signal.SIGKILL)  # whatever of its local Ray instance outlived it
    total = len(list(inputs.glob("*.mp4")))
    assert 4 <= done_before_kill < total, "the kill did not land mid-run"

    proc = _run(inputs, resumed)
    log = _finish(proc)
    assert proc.returncode == 0, log
    assert f"curating {total - done_before_kill} of {total} inputs" in log

    records = read_jsonl(resumed / "manifest.jsonl")
    assert sorted(r["source"] for r in records) == sorted(str(p.resolve()) for p in inputs.glob("*.mp4"))
    a, b = _samples(clean), _samples(resumed)
    assert sorted(a) == sorted(b)
    for key in a:
        assert a[key]["txt"] == b[key]["txt"]
        meta_a, meta_b = json.loads(a[key]["json"]), json.loads(b[key]["json"])
        assert meta_a == meta_b
        path = tmp_path / f"{key}.mp4"
        path.write_bytes(b[key]["mp4"])
        assert len(decord.VideoReader(str(path))) == meta_b["num_frames"]
    assert not list((resumed / "shards").glob(".*"))
    assert not (clean / ".state" / "spool").exists() and not (resumed / ".state" / "spool").exists()
    summary = json.loads((resumed / "summary.json").read_text())
    assert summary["inputs"] == total and summary["kept"] == len(b)

    proc = _run(inputs, resumed)
    assert "nothing to do" in _finish(proc)


def test_ctrl_c_then_sigterm_mid_run_stop_cleanly_and_the_same_command_goes_on(tmp_path):
    """Ctrl-C (SIGINT) mid-run, then a scheduler's stop (SIGTERM) of the rerun: each exits 130 or 143
    with a line that says what is kept, no traceback, no unfinished shard, no spooled clip; the same
    command then finishes the job."""
    inputs, out = tmp_path / "in", tmp_path / "out"
    synth.write_corpus(inputs, seed=6, num_shape_videos=10)
    total = len(list(inputs.glob("*.mp4")))
    done = 0
    for sig, code, said in [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "stopped (SIGTERM)")]:
        proc = _run(inputs, out)
        deadline = time.time() + 240
        while time.time() < deadline and len(read_jsonl(out / "manifest.jsonl")) < done + 2:
            time.sleep(0.05)
        os.kill(proc.pid, sig)
        log = _finish(proc, timeout=60)
        assert proc.returncode == code, log
        assert done == 0 or f"curating {total - done} of {total} inputs" in log, log
        done_now = len(read_jsonl(out / "manifest.jsonl"))
        assert done < done_now < total, (sig, done, done_now, log)
        done = done_now
        assert f"vfm-curate: {said}. The complete shards and the records in manifest.jsonl are kept" in log
        assert "Traceback" not in log
        assert not list((out / "shards").glob(".*")) and not (out / ".state" / "spool").exists()

    proc = _run(inputs, out)
    log = _finish(proc)
    assert proc.returncode == 0 and f"curating {total - done} of {total} inputs" in log, log
    assert sorted(r["source"] for r in read_jsonl(out / "manifest.jsonl")) == \
        sorted(str(p.resolve()) for p in inputs.glob("*.mp4"))
    assert len(_samples(out)) == json.loads((out / "summary.json").read_text())["kept"]


def test_a_second_run_on_an_output_in_use_stops_and_touches_nothing(tmp_path, ray_local):
    """While one run holds the output (here this process, through the writer's own lock), the same
    command from another process exits 2 naming the holder, and leaves the holder's unfinished shard
    and manifest as they are; once the holder is done, it runs."""
    inputs = tmp_path / "in"
    synth.write_corpus(inputs, seed=6, num_shape_videos=1)
    out = tmp_path / "out"
    holder = OutputDir(out, samples_per_shard=2, max_hamming=None)
    unfinished = out / "shards" / ".shard-000000.tar.tmp"
    unfinished.write_bytes(b"the holder's shard, half written")
    done = {"source": "/elsewhere/a.mp4", "status": "error", "error": "not a video", "shots": [], "clips": []}
    (out / "manifest.jsonl").write_text(json.dumps(done) + "\n")

    proc = _run(inputs, out)
    log = _finish(proc, timeout=120)
    assert proc.returncode == 2, log
    assert f"is being written by another run (pid {os.getpid()} on" in log
    assert unfinished.read_bytes() == b"the holder's shard, half written"
    assert len(read_jsonl(out / "manifest.jsonl")) == 1
    assert not (out / "summary.json").exists()

    holder.close()
    holder.release()
    assert curate(conf.compose("curate", [f"input={inputs}", f"output={out}", *ARGS]), log=lambda *_: None)
    assert not unfinished.exists()
    total = len(list(inputs.glob("*.mp4")))
    assert len(read_jsonl(out / "manifest.jsonl")) == 1 + total
    assert json.loads((out / "summary.json").read_text())["inputs"] == 1 + total


def _sample(out: OutputDir, key: str, size: int = 100_000) -> None:
    out.add_sample(key, {"mp4": bytes(size), "txt": key.encode()}, ["0" * 16], [[0, 0, 0]])


def test_a_full_disk_is_a_clear_error_that_leaves_no_unfinished_shard(tmp_path):
    """The unfinished shard is written into /dev/full, which takes nothing (ENOSPC, as a full disk
    gives): a clear error saying what is kept, the unfinished shard gone, the manifest untouched."""
    out = OutputDir(tmp_path / "out", samples_per_shard=2, max_hamming=None)
    _sample(out, "a")
    out.finish_shard()
    out.add_record({"source": "a.mp4"}, {"a"})
    unfinished = out.shard_dir / ".shard-000001.tar.tmp"
    unfinished.symlink_to("/dev/full")
    with pytest.raises(OutputWriteError, match=r"No space left on device\. The complete shards and the records"):
        _sample(out, "b")
    assert not unfinished.is_symlink() and not unfinished.exists()
    assert [p.name for p in out.shard_dir.iterdir()] == ["shard-000000.tar"]
    assert read_jsonl(out.manifest_path) == [{"source": "a.mp4"}]
    out.release()


def test_a_torn_state_line_and_a_shard_it_did_not_record_are_undone(tmp_path):
    """A full disk or a crash just after a shard was renamed into place leaves the shard without its
    state line, or with a torn one. The next run deletes that shard (its sources have no record and
    are done again), numbers its next shard past the recorded ones, and writes its state line on a
    line of its own, not glued to the torn one."""
    out = OutputDir(tmp_path / "out", samples_per_shard=1, max_hamming=None)
    _sample(out, "a")
    out.release()
    with open(out.shards_state_path, "a") as f:
        f.write('{"shard": "shard-000001.tar", "ke')  # torn
    (out.shard_dir / "shard-000001.tar").write_bytes((out.shard_dir / "shard-000000.tar").read_bytes())

    again = OutputDir(tmp_path / "out", samples_per_shard=1, max_hamming=None)
    assert sorted(p.name for p in again.shard_dir.iterdir()) == ["shard-000000.tar"]
    assert again.written_keys == {"a"}
    _sample(again, "b")
    again.release()
    assert [r["shard"] for r in read_jsonl(again.shards_state_path)] == ["shard-000000.tar", "shard-000001.tar"]
    assert sorted(s["__key__"] for s in wds.WebDataset(sorted(str(p) for p in again.shard_dir.glob("*.tar")),
                                                        shardshuffle=False)) == ["a", "b"]


def test_the_clips_a_killed_run_spooled_are_removed_when_the_output_is_opened_again(tmp_path):
    """A run's clips wait in <out>/.state/spool on their way to a shard; a killed run leaves them
    there. Their sources have no record, so the next run does them again: it removes the files."""
    out = OutputDir(tmp_path / "out", samples_per_shard=2, max_hamming=None)
    folder = out.new_spool() / "a-source"
    folder.mkdir()
    (folder / "a-source-0000.mp4").write_bytes(b"\0" * 1000)
    out.release()  # as a kill -9 does: no drop_spool
    again = OutputDir(tmp_path / "out", samples_per_shard=2, max_hamming=None)
    assert not again.spool_dir.exists()
    spool = again.new_spool()
    again.drop_spool(spool)
    assert not again.spool_dir.exists()
    again.release()


def test_a_power_cut_s_stray_bytes_in_the_state_are_skipped_like_a_torn_line(tmp_path):
    """After a power cut a file can end in zeros or stray bytes where its last append was. Those
    lines, not UTF-8 and not JSON objects, are skipped like a torn line; the records round them count."""
    out = OutputDir(tmp_path / "out", samples_per_shard=1, max_hamming=None)
    out.add_record({"source": "a.mp4"}, set())
    out.release()
    with open(out.manifest_path, "ab") as f:
        f.write(b"\x00" * 40 + b"\n\xff\xfe{\x9c\n[1, 2]\n\"a string\"\n")
    out.add_record({"source": "b.mp4"}, set())  # appended by the next run
    assert OutputDir(tmp_path / "out", samples_per_shard=1, max_hamming=None).done_sources == {"a.mp4", "b.mp4"}


def test_an_output_that_cannot_be_opened_is_a_clear_error_and_is_not_left_locked(tmp_path):
    """Opening an output reads what earlier runs left there. Where that fails (here its manifest is a
    folder; a permission or a lost mount does the same), the error says which output, and the lock
    taken first is let go: the same process can open it once the trouble is fixed."""
    (tmp_path / "out" / "manifest.jsonl").mkdir(parents=True)
    with pytest.raises(OutputWriteError, match=r"cannot open the output directory .*out to go on from it: .*Is a dir"):
        OutputDir(tmp_path / "out", samples_per_shard=1, max_hamming=None)
    (tmp_path / "out" / "manifest.jsonl").rmdir()
    OutputDir(tmp_path / "out", samples_per_shard=1, max_hamming=None).release()


def test_a_rerun_with_other_settings_is_refused_naming_them_and_the_same_settings_go_on(tmp_path, ray_local):
    """A rerun that changed a setting which decides what is written (here `clips.max_s`) would skip
    the inputs done and give new ones clips of the new settings, under a summary.json naming only
    the new: it is refused (exit 2), saying what differs, and touches nothing. Settings of the run
    alone (`num_workers`) are no difference, and with the output's settings new inputs are added."""
    import conf
    from curator.pipeline import curate

    inputs = tmp_path / "in"
    synth.write_corpus(inputs, seed=3, num_shape_videos=1)
    videos = sorted(inputs.glob("*.mp4"))
    (tmp_path / "later").mkdir()
    videos[-1].rename(tmp_path / "later" / videos[-1].name)
    out = tmp_path / "out"
    cfg = lambda *o: conf.compose("curate", [f"input={inputs}", f"output={out}", *ARGS, *o])  # noqa: E731
    first = curate(cfg(), log=lambda _: None)
    assert first["ok"] == len(videos) - 1
    before = {p.name: p.read_bytes() for p in [*out.iterdir(), *(out / "shards").iterdir()] if p.is_file()}

    with pytest.raises(ValueError, match=r"clips.max_s=10.0 there, 2.0 here\. Its inputs with a record"):
        curate(cfg("clips.max_s=2"), log=lambda _: None)
    assert {p.name: p.read_bytes() for p in [*out.iterdir(), *(out / "shards").iterdir()] if p.is_file()} == before
    proc = subprocess.run([sys.executable, "-m", "curator.cli", f"input={inputs}", f"output={out}", *ARGS,
                           "detector.threshold=2.5"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "detector.threshold=3.0 there, 2.5 here" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr

    assert curate(cfg("num_workers=2"), log=lambda _: None) is None  # nothing to do: not another setting
    (tmp_path / "later" / videos[-1].name).rename(inputs / videos[-1].name)
    assert curate(cfg(), log=lambda _: None)["ok"] == len(videos)

    # An output from before the settings were saved is compared with its summary.json's config.
    (out / ".state" / "settings.json").unlink()
    with pytest.raises(ValueError, match="clips.max_s=10.0 there, 2.0 here"):
        curate(cfg("clips.max_s=2"), log=lambda _: None)
