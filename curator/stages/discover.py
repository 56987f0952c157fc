"""Inputs: a directory (searched recursively), a glob, a single video, or a list file of paths."""

from __future__ import annotations

import glob
import hashlib
import os
import re
import stat
from pathlib import Path

from curator.sandbox import progress

# What a directory is searched for, in any case (.MP4, .MTS): containers FFmpeg reads, from phones
# (.3gp), camcorders (AVCHD .mts/.m2ts, tape captured as raw DV .dv/.dif, MPEG-2 .mod/.tod, DVD
# recorders' .vro), broadcast and editing (.mxf, .vob), old collections (.divx, RealVideo .rm/.rmvb)
# and the web, and the raw streams that security recorders and drones export (H.264/H.265, MJPEG).
# A glob or a list file names its inputs itself, whatever their extensions (an animated .gif, say).
VIDEO_EXTENSIONS = {".mp4", ".m4v", ".mov", ".qt", ".mkv", ".webm", ".avi", ".mpg", ".mpeg", ".m2v", ".ts", ".mts",
                    ".m2ts", ".flv", ".f4v", ".wmv", ".asf", ".3gp", ".3g2", ".ogv", ".mxf", ".vob", ".y4m",
                    ".dv", ".dif", ".mod", ".tod", ".vro", ".divx", ".rm", ".rmvb", ".m1v", ".ivf", ".nut",
                    ".h264", ".264", ".h265", ".265", ".hevc", ".mjpeg", ".mjpg"}
LIST_EXTENSIONS = {".txt", ".lst", ".list"}


def discover(spec: str) -> list[str]:
    """Every input video the spec names, as sorted absolute paths (duplicates removed). A spec that
    names an existing file or directory is that path, glob characters in it or not: a folder called
    `Holiday [2024]` is a folder, not a pattern that matches nothing."""
    path = Path(spec).expanduser()
    urls: list[str] = []  # a list file's, kept as they are: a record names the URL it is for
    if is_url(spec):
        raise FileNotFoundError(f"input={spec!r}: a URL, and vfm-curate reads files: download it first (or mount "
                                "the bucket)")
    if any(ch in spec for ch in "*?[") and not path.exists():
        found = [Path(p) for p in glob.glob(str(path), recursive=True)]
        paths = [p for p in found if p.is_file()]
        if not paths:
            raise FileNotFoundError(f"input={spec!r}: the glob matches no file")
    elif path.is_dir():
        paths = _videos_under(path)
        if not paths:
            raise FileNotFoundError(f"input={spec!r}: no video files ({', '.join(sorted(VIDEO_EXTENSIONS))}) in it")
    elif path.is_file() and path.suffix.lower() in LIST_EXTENSIONS:
        # utf-8-sig: a byte order mark (Notepad, Excel) is not part of the first path; surrogateescape:
        # a name that is not UTF-8 comes out as Python has it from the filesystem.
        lines = [ln.strip() for ln in path.read_text(encoding="utf-8-sig", errors="surrogateescape").splitlines()]
        lines = [ln for ln in lines if ln and not ln.startswith("#")]
        if not lines:
            raise FileNotFoundError(f"input={spec!r}: the list file names no videos")
        urls = [ln for ln in lines if is_url(ln)]
        if len(urls) == len(lines):
            raise FileNotFoundError(f"input={spec!r}: the list file names URLs ({urls[0]}, ...), and vfm-curate "
                                    "reads files: download them first (or mount the bucket), then list the files")
        paths = [path.parent / ln for ln in lines if not is_url(ln)]
    elif path.is_file():
        paths = [path]
    else:
        raise FileNotFoundError(f"input={spec!r}: no such file or directory")
    return sorted({*urls, *(str(p.resolve() if p.exists() else p.absolute()) for p in paths)})


def is_url(line) -> bool:
    """Whether a list file's line is a URL (https://, s3://, gs://) rather than a path. A Path object
    is none: it would have made `https://` into `https:/`."""
    return isinstance(line, str) and re.match(r"[A-Za-z][A-Za-z0-9+.-]+://", line) is not None


def _videos_under(root: Path) -> list[Path]:
    """The video files in `root` and every folder below it, links to folders followed (a dataset's
    batches linked in from other disks), each folder once: a link back up the tree is no loop. A
    broken link named like a video is kept: it gets an error record rather than vanishing."""
    found, seen = [], set()
    for folder, subfolders, names in os.walk(root, followlinks=True):
        real = os.path.realpath(folder)
        if real in seen:
            subfolders.clear()
            continue
        seen.add(real)
        subfolders.sort()
        for name in names:
            p = Path(folder, name)
            if (p.suffix.lower() in VIDEO_EXTENSIONS and not name.startswith(".")
                    and (p.is_file() or (p.is_symlink() and not p.exists()))):
                found.append(p)
    return found


def largest_first(paths: list[str]) -> list[str]:
    """The order a run takes `paths` in: the largest files first (ties by path), their sizes
    standing in for the work each is. A long source then starts early, beside the short ones,
    instead of running alone at the end of the run while the other workers wait; the order is still
    a function of the inputs alone. A path that cannot be read goes last (its error is quick)."""

    def size(path: str) -> int:
        try:
            return os.path.getsize(path)
        except OSError:
            return -1

    return sorted(paths, key=lambda p: (-size(p), p))


def not_a_file(path) -> str | None:
    """Why `path` is no file to curate, where it is none: a folder, a named pipe, a device or a
    socket, as a list file can name one. Reading a pipe waits for a writer for ever, and a device
    such as /dev/zero never ends, so such an input held up its worker until its time ran out, or for
    good. None for a regular file or a link to one, and for a path that is not there (opening it says
    why)."""
    if is_url(path):
        return "a URL, not a file: vfm-curate reads files; download it first (or mount its bucket)"
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode):
        return None
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a device"),
             (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"))
    kind = next((name for test, name in kinds if test(mode)), "a special file")
    return f"not a regular file: {kind}"


def content_hash(path: str) -> str:
    """sha256 of the file. In a sandbox job it reports progress as it reads: a film of tens of GB
    on network storage takes minutes to read, more than `source_timeout_s` allows a silent job."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
            progress()
    return h.hexdigest()


def source_id(path: str, sha256: str) -> str:
    """Stable and readable: the file stem (letters, digits, '_') and a hash of name and content.
    Sample keys are `<source_id>-<clip:04d>`, so the id holds no dots and no '-'."""
    stem = re.sub(r"[^A-Za-z0-9_]+", "_", Path(path).stem).strip("_")[:40] or "video"
    # The name's bytes as the filesystem has them: a name that is not UTF-8 (copied from an old
    # Windows or FAT drive, or out of a zip) is a str with surrogates, which .encode() refuses.
    digest = hashlib.sha1(os.fsencode(Path(path).name) + b"\0" + sha256.encode()).hexdigest()[:12]
    return f"{stem}_{digest}"
