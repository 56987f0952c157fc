"""Inputs: what a directory, a glob, one file and a list file name, and the errors when they name nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from curator.stages.discover import content_hash, discover, largest_first, source_id


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for name in ("a.mp4", "sub/b.MTS", "sub/deeper/c.3gp", "sub/d.Mov", "notes.txt", "e.json", ".hidden.mp4",
                 "sub/f.gif", "tapes/g.dv", "tapes/h.MOD"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(name.encode())
    return tmp_path


def test_a_directory_gives_its_videos_recursively_in_any_case_without_hidden_files(tree):
    found = [Path(p).relative_to(tree).as_posix() for p in discover(str(tree))]
    assert found == ["a.mp4", "sub/b.MTS", "sub/d.Mov", "sub/deeper/c.3gp", "tapes/g.dv", "tapes/h.MOD"]


def test_a_broken_link_in_a_directory_is_an_input_that_cannot_be_read_not_a_silent_skip(tree):
    (tree / "gone.mp4").symlink_to(tree / "moved" / "gone.mp4")
    (tree / "sub" / "dir.mp4").mkdir()
    found = discover(str(tree))
    assert str(tree / "gone.mp4") in found and str(tree / "sub" / "dir.mp4") not in found
    with pytest.raises(OSError):
        content_hash(str(tree / "gone.mp4"))  # what the worker turns into the input's error record


def test_links_to_folders_are_followed_each_folder_once(tree, tmp_path_factory):
    """A dataset's batches linked in from another disk are inputs too (rglob skipped them, saying
    nothing); a link back up the tree, and a second link to one folder, give each video once."""
    other = tmp_path_factory.mktemp("other_disk")
    (other / "batch1").mkdir()
    (other / "batch1" / "x.mp4").write_bytes(b"x")
    (tree / "batch1").symlink_to(other / "batch1")
    (tree / "sub" / "again").symlink_to(other / "batch1")
    (tree / "sub" / "deeper" / "up").symlink_to(tree)
    found = discover(str(tree))
    assert found.count(str(other / "batch1" / "x.mp4")) == 1
    assert sorted(Path(p).name for p in found) == ["a.mp4", "b.MTS", "c.3gp", "d.Mov", "g.dv", "h.MOD", "x.mp4"]


def test_a_glob_and_a_list_file_name_their_inputs_whatever_the_extension(tree):
    assert [Path(p).name for p in discover(str(tree / "sub" / "*.gif"))] == ["f.gif"]
    listing = tree / "sub" / "inputs.txt"
    # As Notepad saves it: a byte order mark, CRLF.
    listing.write_text("\ufeff# two videos, relative to the list\r\nd.Mov\r\n\r\n../a.mp4\r\nd.Mov\r\n")
    assert discover(str(listing)) == sorted([str((tree / "a.mp4").resolve()), str((tree / "sub/d.Mov").resolve())])


def test_a_folder_or_file_named_with_glob_characters_is_itself_not_a_pattern(tree):
    folder = tree / "Holiday [2024]"
    (folder / "day 1").mkdir(parents=True)
    (folder / "day 1" / "beach?.mp4").write_bytes(b"x")
    assert discover(str(folder)) == [str(folder / "day 1" / "beach?.mp4")]
    assert discover(str(folder / "day 1" / "beach?.mp4")) == [str(folder / "day 1" / "beach?.mp4")]
    assert [Path(p).name for p in discover(str(tree / "sub" / "[bd].*"))] == ["b.MTS", "d.Mov"]  # still a glob


@pytest.mark.parametrize("spec, message", [("nope/", "no such file"), ("*.nothing", "matches no file")])
def test_a_spec_that_names_nothing_says_so(tmp_path, spec, message):
    with pytest.raises(FileNotFoundError, match=message):
        discover(str(tmp_path / spec))


def test_a_directory_without_videos_says_which_extensions_it_looked_for(tmp_path):
    (tmp_path / "readme.md").write_text("x")
    with pytest.raises(FileNotFoundError, match=r"no video files \(.*\.mp4"):
        discover(str(tmp_path))


def test_the_source_id_depends_on_name_and_content_not_on_the_folder(tmp_path):
    a, b = tmp_path / "x" / "clip one.mp4", tmp_path / "y" / "clip one.mp4"
    for p in (a, b):
        p.parent.mkdir()
        p.write_bytes(b"same bytes")
    ids = [source_id(str(p), content_hash(str(p))) for p in (a, b)]
    assert ids[0] == ids[1] and ids[0].startswith("clip_one_") and "-" not in ids[0] and "." not in ids[0]
    b.write_bytes(b"other bytes")
    assert source_id(str(b), content_hash(str(b))) != ids[0]


def test_a_run_takes_the_largest_files_first_ties_by_path_and_unreadable_ones_last(tmp_path):
    sizes = {"a.mp4": 10, "b.mp4": 300, "c.mp4": 20, "d.mp4": 300, "e.mp4": 0}
    for name, size in sizes.items():
        (tmp_path / name).write_bytes(b"x" * size)
    (tmp_path / "gone.mp4").symlink_to(tmp_path / "moved.mp4")
    order = largest_first(discover(str(tmp_path)))
    assert [Path(p).name for p in order] == ["b.mp4", "d.mp4", "c.mp4", "a.mp4", "e.mp4", "gone.mp4"]


def test_a_pipe_a_device_or_a_folder_named_as_an_input_is_an_error_record_at_once(tmp_path):
    """A list file can name anything. A named pipe held its worker until the source's time ran out
    (reading one waits for a writer), and /dev/zero held it for good (its reading never ends, and
    reports progress all the while). Each is now an error record at once, as a folder is, and so is
    each for the TransNetV2 pass, which probes first."""
    import os
    import re
    import threading

    from omegaconf import OmegaConf

    import conf
    from curator import media
    from curator.pipeline import _work

    os.mkfifo(tmp_path / "pipe.mp4")
    (tmp_path / "folder.mp4").mkdir()
    cfg = OmegaConf.to_container(conf.compose("curate", [f"input={tmp_path}", f"output={tmp_path / 'out'}"]))
    for path, kind in ((tmp_path / "pipe.mp4", "a named pipe (FIFO)"), ("/dev/zero", "a device"),
                       (tmp_path / "folder.mp4", "a folder")):
        answer = []
        worker = threading.Thread(target=lambda p=str(path), out=answer: out.append(_work(p, cfg)), daemon=True)
        worker.start()
        worker.join(timeout=20)  # without the check the worker never comes back: no hang of the suite
        assert answer, f"{path}: still reading"
        record, metas, mp4s = answer[0]
        assert record["status"] == "error" and record["error"] == f"not a regular file: {kind}", record
        assert metas == [] and mp4s == []
        with pytest.raises(media.MediaError, match=re.escape(f"not a regular file: {kind}")):
            media.probe(str(path))


def test_a_macs_metadata_file_is_skipped_in_a_folder_and_named_as_such_in_a_list(tmp_path):
    """A Mac copying `clip.mp4` to a shared disk writes `._clip.mp4` beside it (AppleDouble: the
    file's metadata). A folder's scan skips it, as it skips every hidden file; named in a list, its
    error says what it is, where FFmpeg said "Invalid data found when processing input"."""
    from curator import containers, media

    apple_double = containers.APPLE_DOUBLE + b"\x00\x02\x00\x00" + b"Mac OS X        " + bytes(4000)
    (tmp_path / "._clip.mp4").write_bytes(apple_double)
    (tmp_path / "clip.mp4").write_bytes(b"")
    assert discover(str(tmp_path)) == [str(tmp_path / "clip.mp4")]
    with pytest.raises(media.MediaError) as e:
        media.probe(str(tmp_path / "._clip.mp4"))
    assert str(e.value) == ("cannot read video: a Mac's metadata file (AppleDouble, the `._` file a Mac writes beside "
                            "each file it copies), not a video")


def test_urls_are_named_as_urls_not_mangled_into_paths(tmp_path):
    """A list of URLs (video2dataset's input) named files such as `<list's folder>/https:/host/a.mp4`,
    each an error 'No such file or directory' with that path. A URL among files is now an error
    record that names it and says what to do; a list of nothing but URLs, or a URL as the input,
    stops the run at once. A missing file's error no longer repeats its path."""
    import conf
    from curator.pipeline import _work

    (tmp_path / "list.txt").write_text("https://example.com/a.mp4\ns3://bucket/b.mp4\nmissing.mp4\n")
    found = discover(str(tmp_path / "list.txt"))
    assert found == [str(tmp_path / "missing.mp4"), "https://example.com/a.mp4", "s3://bucket/b.mp4"]
    cfg = OmegaConf.to_container(conf.compose("curate", [f"input={tmp_path}", f"output={tmp_path / 'out'}"]))
    errors = {path: _work(path, cfg)[0]["error"] for path in found}
    url = "a URL, not a file: vfm-curate reads files; download it first (or mount its bucket)"
    assert errors == {str(tmp_path / "missing.mp4"): "cannot read file: No such file or directory",
                      "https://example.com/a.mp4": url, "s3://bucket/b.mp4": url}
    (tmp_path / "urls.txt").write_text("# from video2dataset\nhttps://example.com/a.mp4\nhttps://example.com/b.mp4\n")
    with pytest.raises(FileNotFoundError, match=r"names URLs \(https://example.com/a.mp4, \.\.\.\), and vfm-curate "
                                                r"reads files: download them first"):
        discover(str(tmp_path / "urls.txt"))
    with pytest.raises(FileNotFoundError, match=r"a URL, and vfm-curate reads files"):
        discover("https://example.com/a.mp4")
