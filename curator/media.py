"""Reading sources with PyAV: probe without decoding, and one decoding pass that hands out each frame
at the two sizes curation needs (a small analysis frame, and the transcode frame). A source FFmpeg
would misread (an animated picture, a damaged or joined file) is read through a stand-in
(stand_in), and the frames that damage broke are marked (Damage); what the file's own bytes tell
without FFmpeg is read by containers.py.
"""

from __future__ import annotations

import bisect
import collections
import functools
import heapq
import io
import itertools
import math
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from fractions import Fraction

import av
import numpy as np
from av.video.frame import PictureType
from av.video.reformatter import ColorRange, Colorspace, VideoReformatter

from curator.containers import (
    EBML,
    FLV_TAGS,
    SEGMENT,
    boxes_to_the_end,
    boxes_to_the_end_near,
    ebml_size,
    failed_clusters,
    file_head,
    flv_tags,
    index_start,
    is_flv_header,
    misfit_media_data,
    not_a_video_kind,
    passed_over,
    top_level_boxes,
    ts_cut_short,
)
from curator.sandbox import progress
from curator.stages import score
from curator.stages.discover import not_a_file


class MediaError(Exception):
    """The source cannot be curated; the message says why, for its manifest record."""


class TruncatedStream(MediaError):
    def __init__(self, num_frames: int, message: str):
        super().__init__(f"decoding stopped after frame {num_frames}: {message}")
        self.num_frames = num_frames


@dataclass
class Probe:
    fps: float  # average frame rate over the stream
    num_frames: int  # as the container states it; 0 when it does not say
    width: int  # as displayed: pixels made square, then rotated
    height: int
    duration_s: float
    rotation: int  # degrees counter-clockwise to turn decoded frames upright: 0, 90, 180 or 270
    codec: str
    vfr: bool  # variable frame rate: the average rate differs from the nominal one
    # The rate the frames come at where the stream runs steadily (see filmed_rate); `fps` when the
    # rate is constant. Each source's clips are transcoded at it unless transcode.fps says otherwise.
    filmed_fps: float = 0.0
    pixel_aspect: float = 1.0  # the stored pixels' width over height (DVD, DV, broadcast: not 1)
    interlaced: bool = False  # two fields a frame (DV, DVD, broadcast, 1080i camcorders)
    top_field_first: bool = True  # of an interlaced stream: which field is shown first
    hdr: str | None = None  # "pq" (HDR10, Dolby Vision) or "hlg" (phones, broadcast): high dynamic range
    wide_gamut: bool = False  # BT.2020 primaries
    # The first frame's outer rows, or its outer columns, are black: it may be letterboxed (or black)
    dark_edges: bool = False
    stated_s: float = 0.0  # the video's duration as the header states it (see stated_duration); 0: unknown
    # The turn the stream's display matrix states, where it is not a right angle (see right_angle); else None
    stated_rotation: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


# FFmpeg's colour codes (AVColorTransferCharacteristic, AVColorPrimaries).
HDR_TRANSFERS = {16: "pq", 18: "hlg"}  # SMPTE ST 2084, ARIB STD-B67
BT2020 = 9


def right_angle(degrees: int) -> int:
    """The right angle (0, 90, 180, 270) nearest a stated turn of `degrees` (0..359), the smaller
    one where two are as near (45 -> 0). A display matrix may state any angle, but a picture turned
    by another would need corners filled in (FFmpeg's CLI fills them black); players mostly take the
    stored frame as it is."""
    return (degrees + 44) // 90 * 90 % 360


def _rate(value) -> float:
    return float(value) if value else 0.0


def open_input(source) -> av.container.InputContainer:
    """A media file (a path or a file object) opened for reading. Tags that are not UTF-8 (Latin-1
    titles in older AVI and camera files) are read with replacement characters: decoding them
    strictly failed the whole file over its title. A file that FFmpeg would not play as a browser
    shows it is opened as the video that stands in for it (stand_in): an animated WebP, whose
    animation FFmpeg's WebP decoder in PyAV's build does not read, and a GIF with frames said to
    last 10 ms. An animated PNG is read with APNG_OPTIONS."""
    options = {}
    if isinstance(source, (str, os.PathLike)):
        if (video := stand_in(os.fspath(source))) is not None:
            source = video.reader()
        elif is_png(source):
            options = APNG_OPTIONS
    return av.open(source, "r", metadata_errors="replace", options=options)


def _is_animated_webp(head: bytes) -> bool:
    """Whether a file starting with `head` (21 bytes) is a WebP with an animation: its extended
    header (VP8X) says so."""
    return len(head) >= 21 and head[:4] == b"RIFF" and head[8:16] == b"WEBPVP8X" and bool(head[20] & 0x02)


WEBP_IN_MEMORY = 64 << 20  # bytes of an animated WebP's video kept in memory; a larger one goes to a temporary file
WEBP_CODEC = "webp"  # an animated WebP's codec in its record (Probe.codec), not its video's FFV1
# A frame of an animated picture (WebP, GIF) said to show for FAST_MS or less shows for SHOWN_MS, as
# browsers show it: ads and converters write 0 or 10 ms to mean "as fast as you can". Timed as
# written, a WebP of 0 ms frames lasted no time at all, and came out as one clip of 0 s, too short; a
# GIF of 10 ms frames (FFmpeg reads 0 as 100 ms, but 10 ms as it is) played ten times too fast.
FAST_MS, SHOWN_MS = 10, 100


@dataclass
class StandIn:
    """The video that stands in for a source (see stand_in): `file` holds it; `unread` counts an
    animated WebP's frames from a damaged one on, which Pillow could not decode; `note` says what
    was wrong with the source and what was done (a WebP that ends before the size its header
    states, an MP4 realigned); `lost` holds the byte positions of packets whose data is gone (an
    MP4 that lost bytes), which are not decoded."""

    file: tempfile.SpooledTemporaryFile | _Realigned
    codec: str | None = None  # the source's codec in its record (Probe.codec), where not the stand-in's own
    unread: int = 0
    note: str | None = None
    lost: frozenset[int] = frozenset()

    def reader(self) -> _SharedReader:
        return _SharedReader(self.file)


class _SharedReader(io.RawIOBase):
    """A reader of `file` with a position of its own, so that several containers can read one
    StandIn's file (a source's probe, its border sampling and its decoding)."""

    def __init__(self, file):
        self.file, self.pos = file, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        self.file.seek(self.pos)
        n = self.file.readinto(buffer)
        self.pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.file.seek(0, io.SEEK_END)}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def tell(self) -> int:
        return self.pos


def _whole_chunks(path: str) -> tuple[str | io.BytesIO, str | None]:
    """A RIFF (WebP) file to open: its path, and None; or, for a file that ends before the size its
    header states (an interrupted download or copy), its whole chunks alone, the header's size set
    to theirs, and a line that says how much of the file is there."""
    with open(path, "rb") as f:
        stated = int.from_bytes(f.read(8)[4:8], "little") + 8
        if os.fstat(f.fileno()).st_size >= stated:
            return path, None
        data = f.read()
    at = 4  # after the file's header, in `data`: the form type, then chunks
    while at + 8 <= len(data):
        size = int.from_bytes(data[at + 4:at + 8], "little")
        if at + 8 + size > len(data):
            break
        at = min(len(data), at + 8 + size + size % 2)
    whole = b"RIFF" + at.to_bytes(4, "little") + data[:at]
    return io.BytesIO(whole), f"the file is cut short: it ends after {len(data) + 8} of the {stated} bytes " \
        "its header states"


def webp_video(path: str) -> StandIn:
    """An animated WebP's frames, decoded by Pillow, as their lossless video: FFV1 in Matroska, each
    frame at its own time in milliseconds (a WebP's frames can show for different times; see
    FAST_MS), transparent pixels over black, in memory up to WEBP_IN_MEMORY bytes. Where a frame
    cannot be decoded (damaged data), the frames before it are kept; a file cut short keeps its
    whole frames."""
    from PIL import Image

    out = tempfile.SpooledTemporaryFile(max_size=WEBP_IN_MEMORY)
    video, cut_short = StandIn(out, codec=WEBP_CODEC), None
    try:
        source, cut_short = _whole_chunks(path)
        with Image.open(source) as im, av.open(out, "w", format="matroska") as c:
            im.load()

            def shown_ms() -> int:  # the frame's time on screen
                ms = im.info.get("duration") or 0
                return SHOWN_MS if ms <= FAST_MS else ms

            s = c.add_stream("ffv1", rate=Fraction(1000, shown_ms()))
            s.width, s.height, s.pix_fmt = *im.size, "bgr0"
            s.codec_context.time_base = Fraction(1, 1000)
            n, at_ms = getattr(im, "n_frames", 1), 0
            for i in range(n):
                try:
                    im.seek(i)
                    im.load()
                except (OSError, ValueError, EOFError):
                    if i == 0:
                        raise
                    video.unread = n - i  # the frames from the damaged one on
                    break
                rgba = np.asarray(im.convert("RGBA"))  # (h, w, 4)
                rgb = rgba[..., :3]
                if rgba[..., 3].min() < 255:  # transparent pixels: over black
                    rgb = ((rgb.astype(np.uint16) * rgba[..., 3:] + 127) // 255).astype(np.uint8)
                frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
                frame.pts, frame.time_base = at_ms, Fraction(1, 1000)
                at_ms += shown_ms()
                c.mux(s.encode(frame))
                progress()  # for the sandbox's timeout, which is on time without progress
            c.mux(s.encode())
    except (OSError, ValueError, av.FFmpegError) as e:
        out.close()
        why = f"{cut_short} (an interrupted download or copy), before its first frame" if cut_short else e
        raise MediaError(f"cannot read animated WebP: {why}") from e
    if cut_short:
        video.note = f"{cut_short} (an interrupted download or copy): the frames in it were kept"
    return video


# FFmpeg's APNG demuxer shows a frame said to last 0 ms at 15 fps, and one of 10 ms as it says: with
# these options both show for SHOWN_MS, as browsers show them (see FAST_MS).
APNG_OPTIONS = {"default_fps": str(1000 // SHOWN_MS), "max_fps": str(1000 // FAST_MS - 1)}


def is_png(path) -> bool:
    return file_head(path, 8) == b"\x89PNG\r\n\x1a\n"


def retimed_gif(path: str) -> StandIn | None:
    """A GIF whose frames said to last FAST_MS or less last SHOWN_MS, as browsers show them: its
    packets copied, in one pass, into a NUT file (in memory up to WEBP_IN_MEMORY bytes), timed anew;
    None for a GIF that has no such frame, or that FFmpeg cannot read (its own errors say why)."""
    fast, shown_cs = FAST_MS // 10, SHOWN_MS // 10  # a GIF's times are in hundredths of a second
    out = tempfile.SpooledTemporaryFile(max_size=WEBP_IN_MEMORY)
    retimed = False
    try:
        with av.open(path) as src, av.open(out, "w", format="nut") as dst:
            stream = src.streams.video[0]
            copy = dst.add_stream_from_template(stream)
            at = 0
            for packet in src.demux(stream):
                if not packet.size:
                    continue
                is_fast = 0 < (packet.duration or 0) <= fast
                retimed |= is_fast
                shown = shown_cs if is_fast else packet.duration or shown_cs
                packet.pts = packet.dts = at
                packet.duration, packet.stream = shown, copy
                at += shown
                dst.mux(packet)
    except av.FFmpegError:
        retimed = False
    if not retimed:
        out.close()
        return None
    return StandIn(out)


@functools.lru_cache(maxsize=1)
def _stand_in(path: str, size: int, mtime_ns: int) -> StandIn | None:
    head = file_head(path, 21)
    if _is_animated_webp(head):
        return webp_video(path)
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return retimed_gif(path)
    if head[4:8] == b"ftyp":
        boxes = top_level_boxes(path)  # read once for the three
        return realigned_iso(path, boxes) or first_of_joined_isos(path, boxes) or iso_with_mended_index(path, boxes)
    if is_flv_header(head) and (joined := first_of_joined_flvs(path)) is not None:
        return joined
    if head[:4] == b"RIFF" and head[8:12] == b"AVI " and (hidden := avi_without_a_damaged_index(path)) is not None:
        return hidden
    return None if _opens(path) else iso_after_a_damaged_head(path) or matroska_after_bytes_before(path)


def _opens(path: str) -> bool:
    """Whether FFmpeg takes the file at `path` for media of a format it reads (probe says what else
    is wrong with it, if anything)."""
    try:
        with av.open(path, "r", metadata_errors="replace"):
            return True
    except av.InvalidDataError:
        return False
    except (av.FFmpegError, OSError, ValueError):
        return True


def stand_in(path: str) -> StandIn | None:
    """The video that stands in for the source at `path` (webp_video, retimed_gif, realigned_iso,
    first_of_joined_isos, iso_with_mended_index, first_of_joined_flvs, iso_after_a_damaged_head,
    matroska_after_bytes_before),
    or None for one that is read as it is. The last source's is kept (a file is converted once for a source's probe,
    border sampling and decoding, not three times: that took most of an animated WebP's curation
    time) until forget_stand_in()."""
    try:
        st = os.stat(path)
    except OSError:
        return None  # not a file to read: av.open says why
    if not stat.S_ISREG(st.st_mode):
        return None  # a named pipe or a device: probe says so, and nothing may read it first
    return _stand_in(os.path.abspath(path), st.st_size, st.st_mtime_ns)


def forget_stand_in() -> None:
    """Let go of the last source's stand-in (up to WEBP_IN_MEMORY bytes held in memory)."""
    _stand_in.cache_clear()


def video_stream(container) -> av.VideoStream | None:
    """The source's video: of its video streams that are not a cover picture (music and podcast
    files, and downloads with an embedded thumbnail, carry one as a one-frame video stream marked as
    such), the longest as the header states it; among those within a tenth of it, the largest
    picture, then the first; the first where the header states no length. A thumbnail added the
    naive way (`ffmpeg -i video -i thumb.jpg -map 0 -map 1`) is an unmarked one-frame stream,
    sometimes the first and the default: it is not the video."""
    streams = [s for s in container.streams.video if not s.disposition & av.stream.Disposition.attached_pic]
    streams = [s for s in streams if s.codec_context is not None] or streams  # those FFmpeg has a decoder for
    if len(streams) < 2:
        return streams[0] if streams else None
    lengths = [_stated_length(container, s) for s in streams]
    longest = max(lengths)
    if not longest:
        return streams[0]
    return max((s for s, n in zip(streams, lengths, strict=True) if n >= 0.9 * longest),
               key=lambda s: (s.codec_context.width or 0) * (s.codec_context.height or 0))


def _stated_length(container, stream) -> float:
    """Seconds of the stream as the header states them: its duration, else its frame count at its
    rate; 0 when it says neither."""
    rate = _rate(stream.average_rate or stream.base_rate)
    return stated_duration(container, stream) or (stream.frames / rate if stream.frames and rate else 0.0)


# What decoders answer for a packet whose data they cannot make sense of: FFmpeg's decoders mostly say
# "Invalid data", but PNG's (and others through zlib) say "Generic error in an external library"
# for a damaged frame, some "Invalid argument" for a damaged frame's size (raw video's last frame cut
# short, a damaged header's dimensions) and some "not implemented" for a feature that a damaged
# header asks for. Each is a packet refused: taken for the end of the stream, one bit flipped in a
# PNG-in-MOV's first frame lost the whole source, where 53 of its 75 frames decode.
REFUSED = (av.InvalidDataError, av.ExternalError, av.ArgumentError, av.PatchWelcomeError)


class Damage:
    """What a damaged file cost while it was decoded (a bit-flipped or badly cut download)."""

    MAX_BAD_RUN = 100  # packets rejected in a row after a rejected key frame: the stream is broken from there on

    def __init__(self):
        self.skipped_packets = 0  # rejected by the decoder, and stepped over
        self.damaged_frames = 0  # decoded from a corrupt stretch (see decoded_frames)
        self.bad_run = 0
        self.key_at: int | None = None  # the place in this run of its first rejected key frame
        self.since_key = False  # a frame was lost or concealed since the last intra frame
        self.unread = 0  # an animated WebP's frames from a damaged one on, which Pillow could not decode
        self.note: str | None = None  # the stand-in's word on the source (StandIn.note)
        self.lost: frozenset[int] = frozenset()  # byte positions of packets whose data is gone (StandIn.lost)
        self.lost_packets = 0  # of those, met and left out
        self.failed_clusters: set[int] = set()  # Matroska clusters met that failed their checksum (failed_clusters)
        self.ends_in_a_frame = False  # an MPEG-TS file cut short amid a frame of the video (ts_cut_short)

    def knowing(self, path: str) -> Damage:
        """This count, told what the stand-in for the source at `path` (if any) knows of it."""
        if (video := stand_in(path)) is not None:
            self.unread, self.note, self.lost = video.unread, video.note, video.lost
        return self

    def summary(self) -> str | None:
        parts = []
        if self.skipped_packets:
            parts.append(f"{self.skipped_packets} packets could not be decoded and were skipped")
        if self.damaged_frames:
            parts.append(f"{self.damaged_frames} frames came out damaged")
        if self.lost_packets:
            parts.append(f"{self.lost_packets} packets whose data is gone were left out")
        if self.unread:
            parts.append(f"its last {self.unread} frames could not be decoded and were left out")
        if self.failed_clusters:
            parts.append(f"{len(self.failed_clusters)} clusters of the file failed their checksum (CRC-32)")
        lines = [f"damaged stream: {', '.join(parts)}"] if parts else []
        return "; ".join(lines + [self.note] if self.note else lines) or None


def packets(container, stream) -> Iterator[av.Packet]:
    """`container.demux(stream)`, to its end also where the demuxer added streams while reading
    (MPEG-TS files whose tables announce another programme further on: joined recordings, damaged
    ones). PyAV's demux then fails with an IndexError after the last packet, its flush of `stream`
    included, has come out: its list of streams has only those known at open. That is the end of
    the stream, not an error. The other streams are not read where the format lets the demuxer pass
    over them (an MP4's): a wrong size or place in an MP4's audio index stopped its video where
    the demuxer, reading the audio too, ran past the end of the file (138 of 250 frames kept)."""
    for other in container.streams:
        if other.index != stream.index:
            other.discard = av.stream.Discard.all
    demuxed = container.demux(stream)
    flushed = False  # the last packet was the empty one that drains the decoder
    while True:
        try:
            packet = next(demuxed)
        except StopIteration:
            return
        except IndexError:
            if flushed:
                return
            raise
        flushed = packet.size == 0
        yield packet


# Decoders that, besides those of intra-only formats, tell of damage only in their log: the MS-MPEG-4
# family's, Windows Media Video 7 and 8 among them ("dc overflow" in a damaged WMV2 file). Found by
# damaging files of each kind FFmpeg writes: H.264, MPEG-1/2/4, H.263 and AV1 reject the packet or
# mark the frame corrupt, and their logs also hold errors of no damage ("mmco: unref short
# failure"), so they are not read. HEVC's, VP8's and VP9's mostly say nothing at all (SILENT_DECODERS).
# B-frames held back at most, until the frame after them that they are predicted from is decoded
# (H.264 allows 16 in a row); more in a row are frames of a stream coded all in B-slices.
MAX_HELD_B = 16
DAMAGE_ONLY_LOGGED = {"wmv1", "wmv2", "msmpeg4v1", "msmpeg4v2", "msmpeg4"}
# What Matroska's demuxer logs where the file ends inside an element: a file cut short (lost_data).
# Where it ends inside an element's ID or size (at a block's end, or up to 2 bytes after it), the
# place follows: "File ended prematurely at pos. 56902 (0xde46)".
CUT_SHORT = "File ended prematurely"


def decoded_frames(container, stream, damage: Damage) -> Iterator[tuple[av.VideoFrame, bool]]:
    """(frame, damaged) for every frame of `stream`, in presentation order. A packet the decoder
    rejects is stepped over, as FFmpeg's own tools do, rather than ending the stream there: a
    bit flip an hour into a file then costs a few seconds of it, not the rest. The frames the
    decoder says it concealed errors in, and those after a lost or concealed one up to the next
    intra frame (they are predicted from it), are marked damaged: they hold smears and blocks.

    FFmpeg's decoders of intra-only formats (MJPEG, ProRes) and those of DAMAGE_ONLY_LOGGED decode
    a damaged frame with its broken blocks left grey or smeared and say so only in their log
    ("mjpeg_decode_dc: bad vlc", "error y=16 x=39"): they neither reject the packet nor mark the
    frame corrupt, as H.264's decoder does. For those, an error the decoder logs while a packet is
    decoded marks that packet's frames. The demuxer's errors are read for every stream (see
    lost_data). FFmpeg's log is captured for the whole stream, from every thread (a frame-threaded
    decoder logs from its own), so that none of it reaches the output where it did not before
    (FFmpeg's log is off by default in PyAV)."""
    codec = stream.codec_context.codec
    logged_codec = codec.name if codec.intra_only or codec.name in DAMAGE_ONLY_LOGGED else ""
    level = av.logging.get_level()  # FFmpeg's errors reach Capture at this level or a more verbose one
    raise_level = level is None or level < av.logging.ERROR
    skip_repeated = av.logging.get_skip_repeated()  # PyAV holds back a message the same as the last
    if raise_level:
        av.logging.set_level(av.logging.ERROR)
    av.logging.set_skip_repeated(False)
    try:
        with av.logging.Capture(local=False) as logs:
            try:
                yield from _decoded_frames(container, stream, damage, logs, logged_codec)
            finally:
                # A decoder's frame threads still at work when decoding stops (on an error, or where
                # the caller stops early) log as they finish, and PyAV's log callback, set here, takes
                # the GIL. PyAV frees a decoder, waiting for its threads, with the GIL held: a thread
                # that logged then waited for it for good, and the process with it (a chained Ogg's
                # second stream, which the threaded Theora decoder refuses, hung 5 runs in 6). A
                # flush waits for them here, without the GIL, while their lines still go to `logs`.
                stream.codec_context.flush_buffers()
    finally:
        av.logging.set_skip_repeated(skip_repeated)
        if raise_level:
            av.logging.set_level(level)


def lost_data(demuxed: Iterator[av.Packet], logs: list, demuxer: str,
              ends_cut: bool = False) -> Iterator[tuple[av.Packet, bool]]:
    """(packet, whether data was lost in it) for the packets of `demuxed`, reading `logs` (a
    Capture's list) for the errors of the demuxer named `demuxer` in them. `ends_cut`: the file
    was cut short inside the last packet's data (ts_cut_short), which is then taken for damaged.

    A demuxer that meets bytes it cannot parse logs an error and reads on from the next place it can
    (Matroska's, the next cluster; MPEG-TS's, the next sync byte): bytes lost from a damaged copy,
    or noise or zeros written over a stretch of it. Where it does so between two packets, the packet
    before took its data up to where the broken bytes began, and may have taken some of them: it is
    taken for damaged (VP9's decoder decodes it into a broken picture without a word). So is the
    last packet where the demuxer stops on such an error (it found no place to read on from), but
    for a Matroska (WebM) file cut short (CUT_SHORT, the only error at the end): that demuxer reads
    a block whole or not at all, so the last packet it gave out is whole, and the block the file
    ends in never comes out. Among the whole files of every container tried, none logged an error.

    MPEG-TS's demuxer also flags a packet corrupt where the continuity count of its transport
    packets jumps: bytes were lost (a recording's dropped packets, a damaged copy), and H.264's
    decoder then decodes the picture with a piece missing, and those predicted from it, without a
    word. The flag falls on the packet before the one that lost data (FFmpeg's parser hands a
    packet's flags to the one it finishes), so both are taken for damaged. The count also jumps
    where two files were joined end to end; there the packets are whole, and the second file's
    first, a key frame, is one or two on. So a flag with a key frame in the next two packets is
    taken for a join. (Where data was lost just before a key frame, the picture or two it cut short
    are missed.) MP4's demuxer flags the last packet of a file cut short in its middle, which is
    taken for damaged the same way. The next packet is read before each is decoded, the next two
    after a flagged one."""

    def read() -> tuple[av.Packet, bool] | None:  # the next packet, and whether the demuxer skipped bytes before it
        seen = len(logs)
        packet = next(demuxed, None)
        if packet is None:
            return None
        errors = {text.strip() for level, name, text in logs[seen:] if level <= av.logging.ERROR and name == demuxer}
        if packet.size == 0:  # the end: the packet before lost data where the file was cut inside it
            return packet, ends_cut or any(not e.startswith(CUT_SHORT) for e in errors)
        return packet, bool(errors)

    ahead: collections.deque[tuple[av.Packet, bool]] = collections.deque()  # read, not yet yielded
    lost = 0  # of the packets next yielded, how many lost data
    while True:
        item = ahead.popleft() if ahead else read()
        if item is None:
            return
        packet = item[0]
        flagged = packet.is_corrupt and packet.size
        while len(ahead) < (2 if flagged else 1) and (more := read()) is not None:
            ahead.append(more)
        if flagged and not any(p.is_keyframe for p, _ in itertools.islice(ahead, 2)):
            lost = 2  # this one and the next
        if ahead and ahead[0][1] and packet.size:
            lost = max(lost, 1)  # the bytes the demuxer skipped came right after this one's
        yield packet, lost > 0 and packet.size > 0  # the flush packet at the end holds no data to lose
        lost = max(0, lost - 1)


def _decoded_frames(container, stream, damage: Damage, logs: list,
                    codec: str) -> Iterator[tuple[av.VideoFrame, bool]]:
    """decoded_frames, reading `logs` (a Capture's list, emptied as it goes) for the demuxer's errors
    (lost_data) and for those of decoder `codec`, if one is named ("" for none)."""
    held: list[av.VideoFrame] = []  # B-frames not yet shown: the frame they are predicted from may be damaged

    def shown(damaged: bool) -> Iterator[tuple[av.VideoFrame, bool]]:  # the held B-frames, damaged or not
        damage.damaged_frames += damaged * len(held)
        yield from ((b, damaged) for b in held)
        held.clear()

    # The times of packets that lost data (see lost_data), decoded all the same, whose frames have not
    # come out yet (a heap). One each: a run of them (a cluster that failed its checksum) put under one
    # time, the first frame shown at or after it took the whole run's, and the key frame of the run,
    # shown later, came out whole where it was broken.
    lost_times: list[float] = []
    after_lost, after_lost_pts = False, set()  # since a packet in damage.lost; its successors' times
    # Whether a packet the decoder refuses is the only one damaged near it: so with H.264's decoder in
    # one thread, which marks the frames it conceals errors in. In frame threads a decoder tells of a
    # packet's error with a later packet; HEVC's decodes a damaged packet into a broken picture
    # without a word before it refuses the next (2 of 12 damaged HEVC files, in one thread).
    ctx = stream.codec_context
    in_order = ctx.name == "h264" and (ctx.thread_count == 1 or not ctx.thread_type & av.codec.context.ThreadType.FRAME)
    damage.ends_in_a_frame = ends_cut = container.format.name == "mpegts" and ts_cut_short(container.name, stream.id)
    # AV1's decoders show a frame again for a packet of a few bytes (show_existing_frame), typed as
    # that frame was. After refused packets the frame shown again can be a key frame from before the
    # damage: its picture frozen over the frames the decoder refused, each typed a key frame, which
    # ended the marking (76 broken frames of a bit-flipped WebM, none marked). So in AV1 a marking
    # ends only at a frame of a packet the container flags as a key frame (their times, key_pts).
    key_pts: set | None = set() if _codec_name(ctx) == "av1" else None
    failed = failed_clusters(container.name) if _codec_name(ctx) in SILENT_DECODERS and \
        container.format.name.startswith("matroska") else ()
    for packet, lost in lost_data(packets(container, stream), logs, container.format.name, ends_cut):
        if failed and packet.pos is not None and packet.pos >= 0:
            i = bisect.bisect_right(failed, packet.pos, key=lambda cluster: cluster[0]) - 1
            if i >= 0 and packet.pos < failed[i][1]:  # in a cluster that failed its checksum: damaged data
                lost = True
                damage.failed_clusters.add(failed[i][0])
        if packet.size and packet.pos in damage.lost:  # its data is gone (realigned_iso): garbage to a decoder
            damage.lost_packets += 1
            after_lost = True
            yield from shown(True)
            continue
        if packet.is_keyframe:
            after_lost = False
            if key_pts is not None and packet.pts is not None:
                key_pts.add(packet.pts)
        elif after_lost and packet.pts is not None:
            # Decoded after a frame that is gone, so perhaps predicted from it. A decoder gives out
            # frames later than it takes their packets (to reorder them): marked as they come out,
            # the key frame before the loss, given out after it, ended the marking, and B-frames of a
            # pyramid, shown before the lost frame and predicted from it, were not marked at all.
            after_lost_pts.add(packet.pts)
        logs.clear()  # what came before this packet's decoding: the demuxer's (read by lost_data), other threads'
        try:
            frames = _decode(packet, ctx)
            logged = bool(codec and logs) and any(level <= av.logging.ERROR and name == codec
                                                  for level, name, _ in logs)
        except REFUSED:
            damage.skipped_packets += 1
            damage.bad_run += 1
            if packet.is_keyframe and damage.key_at is None:
                damage.key_at = damage.bad_run
            if in_order and packet.pts is not None:
                # Refused as it was sent, after every packet before it was decoded: the frames given
                # out so far, and those the decoder holds to reorder, are whole. Those decoded after
                # it, up to the next key frame, may be predicted from the frame it lost.
                after_lost = True
            else:  # in frame threads the error may be an earlier packet's (see below); see in_order for other decoders
                damage.since_key = True
                yield from shown(True)  # shown before the frame they are predicted from, which may be this one
            # A run is given up only a while after a key frame failed too: a stream cut from the
            # middle of a long group of pictures (a recording started part-way) is rejected packet
            # after packet until its next key frame brings the parameter sets the decoder lacks.
            # (A threaded decoder reports a packet's error with a later packet's.)
            if damage.key_at is not None and damage.bad_run - damage.key_at >= Damage.MAX_BAD_RUN:
                raise
            continue
        damage.bad_run, damage.key_at = 0, None
        if lost:  # and decoded all the same (one the decoder rejects is counted above, and ends no marking)
            heapq.heappush(lost_times, -math.inf if packet.pts is None else packet.pts)
        for frame in frames:
            intra = frame.key_frame or frame.pict_type == PictureType.I
            if key_pts and frame.pts is not None:  # AV1 (see key_pts)
                intra = intra and frame.pts in key_pts
            if intra:
                damage.since_key = False  # predicted from nothing before it
            if lost_times and (frame.pts is None or frame.pts >= lost_times[0]):
                # This frame, or one shown before it, lost data. A key frame shown after the time of the
                # loss is whole: the decoder gave out no frame for the one that lost data.
                reached = lost_times[0]
                while lost_times and (frame.pts is None or lost_times[0] <= frame.pts):
                    reached = heapq.heappop(lost_times)  # the last of those it reaches
                damage.since_key |= not (intra and frame.pts is not None and frame.pts > reached)
            if frame.is_corrupt or logged or frame.pts in after_lost_pts:
                damage.since_key = True  # the frames predicted from it carry its errors on
            if frame.pict_type == PictureType.B and not damage.since_key and len(held) < MAX_HELD_B:
                held.append(frame)
                continue
            # B-frames shown before this frame are predicted from it too (it was decoded first):
            # where it is damaged, so are they.
            yield from shown(damage.since_key)
            damage.damaged_frames += damage.since_key
            yield frame, damage.since_key
    yield from shown(False)


def _decode(packet: av.Packet, ctx) -> list[av.VideoFrame]:
    """packet.decode(), where a decoder that takes no more packets after refusing a run of them is
    reset and given the packet again. FFmpeg's VP9 decoder, after a dozen packets refused in a row
    (a damaged key frame's, then those of the frames predicted from it), refused every packet after
    them, key frames too, with EAGAIN ("Resource temporarily unavailable"): the rest of the stream
    was lost, or the whole source where the damage was at its start. Reset, it loses its reference
    frames (the frames up to the next key frame are refused as they were before) and decodes again
    from the next key frame."""
    try:
        return packet.decode()
    except av.BlockingIOError:
        ctx.flush_buffers()
        return packet.decode()


def stated_duration(container, stream) -> float:
    """The video stream's duration as the file's header states it, 0 when it does not say: the
    stream's own, else the DURATION tag that FFmpeg and mkvmerge write for each stream of a
    Matroska file, else the container's where the video is its only stream (otherwise the
    container's is its longest stream's, which can be the audio). An index or header written
    before the media data outlives a download or copy cut short, and so does this.

    An AVI cut short has lost its index, which comes last, and FFmpeg then puts the stream's
    duration at the file's size over the bit rate the header states: about what is left, so it would
    never show the cut. Its header's frame count, written when the recording ended, still states the
    whole (an MP4's count is no such statement: it holds the frames an edit list leaves out)."""
    rate = _rate(stream.average_rate or stream.base_rate)
    if container.format.name == "avi" and stream.frames and rate:
        return max(stream.frames / rate, float(stream.duration * stream.time_base) if stream.duration else 0.0)
    if stream.duration:
        return float(stream.duration * stream.time_base)
    try:
        h, m, sec = (stream.metadata or {}).get("DURATION", "").split(":")
        return int(h) * 3600 + int(m) * 60 + float(sec)
    except ValueError:  # no such tag, or not HH:MM:SS.fraction
        if container.duration and len(container.streams) == 1:
            return container.duration / av.time_base
        return 0.0


def _codec_name(ctx) -> str:
    """The stream's codec as FFmpeg names the format ("av1"), not the decoder that reads it: FFmpeg
    decodes AV1 with libdav1d, whose name a record said before."""
    return ctx.codec.canonical_name or ctx.name


def _pixel_aspect(stream) -> Fraction:
    sar = stream.sample_aspect_ratio or stream.codec_context.sample_aspect_ratio
    return Fraction(sar) if sar and sar > 0 else Fraction(1)


def probe(path: str) -> Probe:
    """Stream facts from the container header and the first decoded frame."""
    if problem := not_a_file(path):
        raise MediaError(problem)
    try:
        with open_input(path) as container:
            stream = video_stream(container)
            if stream is None:
                what = "only a cover picture" if container.streams.video else "audio only or not a video"
                raise MediaError(f"no video stream ({what})")
            if stream.codec_context is None:  # PyAV's where FFmpeg has no decoder for the codec the header names
                raise MediaError("its video stream's codec is none FFmpeg can decode: the header names an unknown one, "
                                 "or is damaged where it names it")
            ctx = stream.codec_context
            damage = Damage().knowing(path)
            try:
                first = next((f for f, _ in decoded_frames(container, stream, damage)), None)
            except REFUSED:
                if damage.key_at is None:
                    raise
                # Rejected packets from the start, as many as decoded_frames allows in a row, key
                # frames among them: a stream without the parameter sets its frames refer to, or
                # not of the codec its container says.
                raise MediaError(f"no decodable video frame ({_codec_name(ctx)} stream, the decoder rejected its "
                                 f"first {damage.bad_run} packets, key frames among them)") from None
            if first is None:
                n = damage.skipped_packets
                rejected = f", the decoder rejected {n} packet(s)" if n else ""
                raise MediaError(f"no decodable video frame ({_codec_name(ctx)} stream{rejected})")
            stated = round(getattr(first, "rotation", 0) or 0) % 360
            rotation = right_angle(stated)
            avg, nominal = _rate(stream.average_rate), _rate(stream.base_rate or stream.guessed_rate)
            gaps = frame_gaps(container, stream) if avg and nominal and abs(avg - nominal) / nominal > 0.01 else None
            if gaps is not None and len(gaps) >= 8 and avg * gaps.min() > 2:
                # A mean rate twice as fast as any two frames follow each other is none: a raw DV
                # file's header states its time base as its rate, 60000 a second, for 29.97 frames.
                avg = 0.0
            fps = avg or nominal
            if not fps or not math.isfinite(fps):
                raise MediaError("the stream states no frame rate")
            duration = float(stream.duration * stream.time_base) if stream.duration else 0.0
            if not duration and container.duration:
                duration = container.duration / av.time_base
            # Anamorphic sources (720x576 shown at 16:9) are shown wider or narrower than stored:
            # curation works at the shown size, so clips come out with square pixels.
            aspect = _pixel_aspect(stream)
            width, height = max(1, round(first.width * aspect)), first.height
            # FFmpeg's field orders: 1 progressive, 2 top first, 3 bottom first, 4 and 5 coded in
            # one order, shown in the other (4: bottom shown first, 5: top).
            interlaced = bool(first.interlaced_frame) or ctx.field_order in (2, 3, 4, 5)
            if rotation in (90, 270):
                width, height = height, width
            vfr = bool(avg and nominal and abs(avg - nominal) / nominal > 0.01)
            return Probe(
                fps=fps,
                num_frames=int(stream.frames or 0),
                width=width,
                height=height,
                duration_s=duration,
                rotation=rotation,
                stated_rotation=stated if stated != rotation else None,
                codec=getattr(stand_in(path), "codec", None) or _codec_name(ctx),  # an animated WebP's: webp
                vfr=vfr,
                filmed_fps=filmed_rate(gaps, fps, nominal) if vfr else fps,
                pixel_aspect=round(float(aspect), 4),
                interlaced=interlaced,
                top_field_first=ctx.field_order not in (3, 4),
                hdr=HDR_TRANSFERS.get(first.color_trc),
                wide_gamut=first.color_primaries == BT2020,
                # In one thread: FFmpeg's scaler threads (the default, one a core) for one frame, in a
                # process that detect_many forked from one with threads of its own, hung for good.
                dark_edges=score.dark_edges(first.reformat(format="gray", threads=1).to_ndarray()),
                stated_s=stated_duration(container, stream),
            )
    except MediaError:
        raise
    except av.FFmpegError as e:
        if isinstance(e, av.InvalidDataError) and (mdat := misfit_media_data(path)) and not mdat[2]:
            if index_start(path) is not None:
                raise MediaError("cannot read video: an MP4/MOV whose media data does not end where its header says, "
                                 "so the index (moov box) at the file's end cannot be reached: bytes were lost from "
                                 "or added to its middle (a damaged copy)") from e
            raise MediaError("cannot read video: an MP4/MOV cut off in its media data, before the index (moov box) "
                             "that comes after it: an interrupted recording or download") from e
        said = isinstance(e, av.InvalidDataError) and not_a_video_kind(file_head(path, 2048))
        raise MediaError(f"cannot read video: {said or ffmpeg_message(e, path)}{HEADER_ERRORS.get(type(e), '')}") from e
    except (OSError, StopIteration, ValueError) as e:
        raise MediaError(f"cannot read video: {e}") from e


# What FFmpeg's words mean where it failed to read a file's header, said after them: a count in an
# MP4's index with its high bit flipped made it ask for memory ("Cannot allocate memory", as if the
# machine had run out) or read past the file's end ("End of file"); a flipped flag, a feature it
# does not implement ("Not yet implemented in FFmpeg, patches welcome").
HEADER_ERRORS = {
    av.EOFError: ": the file ends where its header says more follows (a size or count in the header is damaged, "
                 "or the file was cut short)",
    av.MemoryError: ": its header states a size or count too large for any video (a damaged header)",
    av.PatchWelcomeError: ": its header asks for what FFmpeg does not read (a damaged header, or a kind of file "
                          "FFmpeg does not support)",
}


def first_of_joined_isos(path: str, boxes: list) -> StandIn | None:
    """An MP4/MOV with a second one after it (files joined end to end, as `cat` joins them), read
    as the first alone, with a note that says where the second starts; None for any other file.
    FFmpeg, as players do, took the first file's index alone (it logs "Found duplicated MOOV Atom"
    at most), so the second's frames were passed over without a word; of fragmented files it read
    the second's fragments as more of the first's, into packets its decoder refused, and lost the
    first's last frames with them. The second starts at the second file type box (ftyp) among the
    top-level boxes (`boxes`: its top_level_boxes)."""
    second = next((at for kind, at, _ in boxes[1:] if kind == "ftyp"), None)
    return None if second is None else _first_of_joined(path, second, "MP4/MOV")


def _first_of_joined(path: str, second: int, kind: str) -> StandIn:
    """The file at `path` read up to byte `second`, where a second file of `kind` starts."""
    note = (f"a second {kind} starts at byte {second}, after this one's end (files joined end to end): as players "
            "do, only the first was read; cut the file there to curate the second")
    return StandIn(_Realigned(path, 0, 0, size=second), note=note)


def first_of_joined_flvs(path: str) -> StandIn | None:
    """An FLV file with a second one after it (files joined end to end, as `cat` joins them; a
    recording's pieces from a stream or a camera), read as the first alone, with a note that says
    where the second starts; None for any other file. FFmpeg's demuxer, as players do, stopped at
    the second file's header without a word. The tags are walked from the first header: each is 11
    bytes of header, its data and 4 bytes of the size before the next. A walk that meets bytes that
    are no tag ends there (damage, or the end of the file)."""
    for at, tag in flv_tags(path):
        if is_flv_header(tag):
            return _first_of_joined(path, at, "FLV file")
        if len(tag) < 11 or tag[0] & 0x1F not in FLV_TAGS:
            return None
    return None


def avi_without_a_damaged_index(path: str) -> StandIn | None:
    """An AVI whose index (its idx1 chunk, last in the file) puts some frame or sound chunk past the
    file's end (a damaged copy: a flipped high bit in an entry's offset), read with the index hidden,
    its chunks in the order they are stored, as FFmpeg reads an AVI that has none; None for any other
    file. FFmpeg's demuxer, sent past the end by one such entry of the sound's, ended the video there:
    14 of a camera's 75 frames. AVIs of over 1 GB (OpenDML, whose own index FFmpeg reads first) are
    left as they are, and so is an index whose first entry does not lead to its chunk (the place the
    offsets count from is then unknown)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        movi = idx1 = None
        at = 12  # after "RIFF", its size and "AVI "
        while at + 8 <= size:  # the RIFF's chunks: hdrl, movi (LISTs), idx1, JUNK, ...
            f.seek(at)
            head = f.read(12)
            kind, n = head[:4], int.from_bytes(head[4:8], "little")
            if kind == b"LIST" and head[8:12] == b"hdrl" and b"indx" in f.read(min(n, 1 << 20)):
                return None  # OpenDML
            if kind == b"LIST" and head[8:12] == b"movi":
                movi = at + 8  # where its "movi" is: idx1's offsets count from there (or from the file's start)
            elif kind == b"idx1":
                idx1 = (at, n)
                break
            at += 8 + n + (n & 1)
        if movi is None or idx1 is None:
            return None
        f.seek(idx1[0] + 8)
        table = f.read(min(idx1[1], size - idx1[0] - 8))
    entries = np.frombuffer(table[:len(table) // 16 * 16],
                            dtype=[("id", "S4"), ("flags", "<u4"), ("offset", "<u4"), ("size", "<u4")])
    if not len(entries):
        return None
    first = entries[0]
    base = next((b for b in (movi, 0) if file_head(path, 4, b + int(first["offset"])) == first["id"]), None)
    if base is None:
        return None
    past = int(np.count_nonzero(base + entries["offset"].astype(np.int64) + 8 + entries["size"] > size))
    if not past:
        return None
    note = (f"its index (idx1) puts {past} of its {len(entries)} entries past the file's end (a damaged copy): "
            "it was read without its index")
    return StandIn(_Realigned(path, 0, 0, patches=((idx1[0], b"JUNK"),)), note=note)


def _children(data: bytes, start: int, end: int) -> Iterator[tuple[bytes, int, int]]:
    """The boxes that follow each other in data[start:end], each as (type, where its content starts,
    where it ends), up to bytes that are no box."""
    at = start
    while at + 8 <= end:
        size, kind, head = int.from_bytes(data[at:at + 4], "big"), data[at + 4:at + 8], 8
        if size == 1:
            size, head = int.from_bytes(data[at + 8:at + 16], "big"), 16
        elif size == 0:
            size = end - at
        if size < head or at + size > end:
            return
        yield kind, at + head, at + size
        at += size


def _child(data: bytes, start: int, end: int, kind: bytes) -> tuple[int, int] | None:
    return next(((s, e) for k, s, e in _children(data, start, end) if k == kind), None)


def _video_table(data: bytes) -> tuple[dict | None, list[int]]:
    """Of an index (a moov box's bytes, `data`): the first video track's sample table where it says
    where each of its frames lies, as a dict: `sizes` (each frame's, in bytes), `chunks` (each chunk's
    offset in the file), `chunk_of` (each frame's chunk), `first` (each chunk's first frame),
    `sizes_at` and `chunks_at` (where in `data` the stsz entries and the chunk offsets start), `wide`
    (8-byte chunk offsets: co64), `stts` and `ctts` (where those tables lie in `data`, if there), or
    None where there is none that states each frame's size; and the chunk offsets of every track,
    sorted."""
    video, offsets = None, []
    for kind, s, e in _children(data, 8, len(data)):
        if kind != b"trak" or not (mdia := _child(data, s, e, b"mdia")):
            continue
        hdlr, minf = _child(data, *mdia, b"hdlr"), _child(data, *mdia, b"minf")
        stbl = minf and _child(data, *minf, b"stbl")
        tables = {k: (cs, ce) for k, cs, ce in _children(data, *stbl)} if stbl else {}
        if (co := tables.get(b"stco") or tables.get(b"co64")) is None:
            continue
        wide = b"stco" not in tables
        n_chunks = int.from_bytes(data[co[0] + 4:co[0] + 8], "big")
        if co[0] + 8 + (8 if wide else 4) * n_chunks > co[1]:
            continue
        chunks = np.frombuffer(data, ">u8" if wide else ">u4", n_chunks, co[0] + 8).astype(np.int64)
        offsets += chunks.tolist()
        stsz, stsc = tables.get(b"stsz"), tables.get(b"stsc")
        if video or not (hdlr and data[hdlr[0] + 8:hdlr[0] + 12] == b"vide" and stsz and stsc):
            continue
        one_size, count = (int.from_bytes(data[stsz[0] + k:stsz[0] + k + 4], "big") for k in (4, 8))
        n_runs = int.from_bytes(data[stsc[0] + 4:stsc[0] + 8], "big")
        if one_size or stsc[0] + 8 + 12 * n_runs > stsc[1] or stsz[0] + 12 + 4 * count > stsz[1]:
            continue  # one size for every frame, or tables that do not hold what they state
        runs = np.frombuffer(data, ">u4", 3 * n_runs, stsc[0] + 8).reshape(-1, 3).astype(np.int64)
        firsts = np.append(runs[:, 0], n_chunks + 1)  # a run of stsc: from its first chunk to the next run's
        per_chunk = np.repeat(runs[:, 1], np.diff(firsts).clip(0))
        if len(per_chunk) != n_chunks or per_chunk.sum() != count:
            continue
        video = {"sizes": np.frombuffer(data, ">u4", count, stsz[0] + 12).astype(np.int64), "chunks": chunks,
                 "chunk_of": np.repeat(np.arange(n_chunks), per_chunk),
                 "first": np.concatenate([[0], np.cumsum(per_chunk)[:-1]]).astype(np.int64),
                 "sizes_at": stsz[0] + 12, "chunks_at": co[0] + 8, "wide": wide,
                 "stts": tables.get(b"stts"), "ctts": tables.get(b"ctts")}
    return video, sorted(offsets)


def _mended_times(data: bytes, track: dict) -> dict[int, bytes]:
    """Of a track whose composition offsets (ctts) are one bit off in one entry, in its count or
    its offset (a damaged copy), that entry mended, as {where in `data`: its bytes}; {} for any
    other. In time order a stream's frames come at its decoding times (stts) moved on by one delay
    (of its B-frames' reordering). A count one bit off gave the frames after it the offsets of
    others; an offset one bit off put its frames far from their place. Either way the frames' times
    were out of order, and FFmpeg's decoder dropped 1 to 3 frames. Where the offsets do put the
    frames so, or no one-bit change of one entry does, nothing is mended."""
    stts, ctts, n = track["stts"], track["ctts"], len(track["sizes"])
    if stts is None or ctts is None or n < 2:
        return {}
    runs, entries = (int.from_bytes(data[t[0] + 4:t[0] + 8], "big") for t in (stts, ctts))
    if stts[0] + 8 + 8 * runs > stts[1] or ctts[0] + 8 + 8 * entries > ctts[1]:
        return {}
    steps = np.frombuffer(data, ">u4", 2 * runs, stts[0] + 8).reshape(-1, 2).astype(np.int64)
    deltas = np.repeat(steps[:, 1], steps[:, 0].clip(max=n))[:n - 1]
    if len(deltas) < n - 1:
        return {}
    dts = np.concatenate([[0], np.cumsum(deltas)])
    table = np.frombuffer(data, ">i4", 2 * entries, ctts[0] + 8).reshape(-1, 2).astype(np.int64)
    counts, offsets = table[:, 0] & 0xFFFFFFFF, table[:, 1]

    def in_order(counts: np.ndarray, offsets: np.ndarray) -> bool:
        if counts.sum() != n:
            return False
        shown = np.sort(dts + np.repeat(offsets, counts)) - dts
        return bool((shown == shown[0]).all())

    if in_order(counts, offsets):
        return {}
    entry = ctts[0] + 8  # where the first entry starts in `data`: its count, then its offset
    more = int(counts.sum()) - n
    if more and not abs(more) & (abs(more) - 1):
        bit = abs(more).bit_length() - 1  # a count one bit off: the frames' count is that power of two off
        found = []  # the entries whose count, so mended, puts the frames in order: one alone is mended
        for j in np.flatnonzero((counts >> bit & 1) == (more > 0))[:64].tolist():
            mended = counts.copy()
            mended[j] ^= 1 << bit
            if in_order(mended, offsets):
                found.append((j, int(mended[j])))
        return {entry + 8 * j: count.to_bytes(4, "big") for j, count in found} if len(found) == 1 else {}
    if more:
        return {}
    # An offset one bit off: a frame not at a decoding time moved on by the delay, or at one that
    # another frame is at, where the delay is the one that puts the most frames at such times.
    pts = dts + np.repeat(offsets, counts)
    gaps, times = np.unique(np.sort(pts) - dts, return_counts=True)
    delay = max(gaps[np.argsort(times)[-16:]].tolist(), key=lambda d: np.isin(pts, dts + d).sum())
    due = dts + delay
    shared = np.unique(pts, return_counts=True)
    stray = np.flatnonzero(~np.isin(pts, due) | np.isin(pts, shared[0][shared[1] > 1]))
    runs_end = np.cumsum(counts)
    found = set()  # (entry, its offset) that put the frames in order
    for i in stray[:8].tolist():
        j = int(np.searchsorted(runs_end, i, side="right"))  # its entry
        for at in np.setdiff1d(due, pts)[:8].tolist():
            offset = at - int(dts[i])
            flip = (offset ^ int(offsets[j])) & 0xFFFFFFFF
            mended = offsets.copy()
            mended[j] = offset
            if flip and not flip & (flip - 1) and in_order(counts, mended):
                found.add((j, offset))
    # Of two frames at one time, either may be the one moved: where both can be, neither is mended
    return {entry + 8 * j + 4: (offset & 0xFFFFFFFF).to_bytes(4, "big") for j, offset in found} \
        if len(found) == 1 else {}


def iso_with_mended_index(path: str, boxes: list) -> StandIn | None:
    """An MP4/MOV whose index states a wrong size for a frame, a wrong place for a chunk of frames
    or wrong times for its frames (a flipped bit in a stsz, stco or ctts entry: a damaged copy),
    read with the index mended (_mended_places, _mended_times); None for any other (`boxes`: its
    top_level_boxes)."""
    index = next(((at, size) for kind, at, size in boxes if kind == "moov"), None)
    ends = [at + size for kind, at, size in boxes if kind == "mdat"]
    if index is None or not ends or index[1] > 256 << 20:
        return None
    with open(path, "rb") as f:
        f.seek(index[0])
        data = f.read(index[1])
    video, offsets = _video_table(data)
    if video is None:
        return None
    times = _mended_times(data, video)
    new_sizes, new_places = _mended_places(path, video, offsets, ends)
    if not new_sizes and not new_places and not times:
        return None
    width = 8 if video["wide"] else 4
    patches = tuple([(index[0] + video["sizes_at"] + 4 * i, size.to_bytes(4, "big")) for i, size in new_sizes.items()]
                    + [(index[0] + video["chunks_at"] + width * c, at.to_bytes(width, "big"))
                       for c, at in new_places.items()] + [(index[0] + at, value) for at, value in times.items()])
    wrong = [f"a wrong size for {len(new_sizes)} frame(s)"] * bool(new_sizes) + \
        [f"a wrong place for {len(new_places)} chunk(s) of frames"] * bool(new_places) + \
        ["wrong times for its frames"] * bool(times)
    note = f"its index states {' and '.join(wrong)} (a damaged index): mended where the frames' data and times show it"
    return StandIn(_Realigned(path, 0, 0, patches=patches), note=note)


def _mended_places(path: str, video: dict, offsets: list[int], ends: list[int]) -> tuple[dict, dict]:
    """Of the MP4/MOV at `path` whose index states a wrong size for a frame or a wrong place for a
    chunk of frames (`video`: its video track's tables, _video_table; `offsets`: every track's
    chunks' places; `ends`: where its media data boxes end), the sizes mended as {frame: size} and
    the places as {chunk: place}. The index puts a chunk's frames one after the other from the
    chunk's place, by their sizes: FFmpeg read the frames of the chunk after a wrong size, or all of
    a chunk put in the wrong place, from the wrong bytes into packets its decoder refused, or, where
    that ran past the end of the file, stopped there (27 of a 250 frames' file kept). A chunk's
    frames fill it up to the next chunk (of any track) or the end of its media data: where by the
    index they end elsewhere (past it, or short of it with its last frame not whole where the index
    puts it), the first frame not whole of its codec (_sample_check) where the index puts it has a
    size that difference off, where it and the next are whole at that size; or, where even the
    chunk's first frame is not, the chunk is where its first and last frames are whole at a place
    one bit off its stated one. Only codecs whose frames show where they end are mended (H.264,
    HEVC)."""
    end = os.path.getsize(path)
    sizes, chunk_of, chunks, first = video["sizes"], video["chunk_of"], video["chunks"], video["first"]
    before = np.cumsum(sizes) - sizes
    within = before - before[first[chunk_of]]  # each frame's place in its chunk, by the sizes before it
    lengths = np.bincount(chunk_of, weights=sizes, minlength=len(chunks)).astype(np.int64)
    bounds = np.array(sorted(set(offsets) | set(ends) | {end}), dtype=np.int64)
    off = chunks + lengths - bounds[np.searchsorted(bounds, chunks, side="right").clip(max=len(bounds) - 1)]
    new_sizes, new_places = {}, {}
    if not off.any():
        return new_sizes, new_places
    with av.open(path, "r", metadata_errors="replace") as container:
        stream = video_stream(container)
        check = stream and stream.codec_context.name in ("h264", "hevc") and _sample_check(stream)
    if not check:
        return new_sizes, new_places
    counts = np.bincount(chunk_of, minlength=len(chunks))
    with open(path, "rb") as f:
        def whole(at: int, n: int) -> bool:
            return 0 <= at and 0 < n <= 64 << 20 and at + n <= end and check(os.pread(f.fileno(), n, at))

        for c in np.flatnonzero(off).tolist():
            frames = range(int(first[c]), int(first[c] + counts[c]))
            place = [int(chunks[c] + within[i]) for i in frames]
            if not frames or off[c] < 0 and whole(place[-1], int(sizes[frames[-1]])):
                continue  # a chunk followed by bytes of no frame, not one whose frames moved back
            k = next((k for k, i in enumerate(frames) if not whole(place[k], int(sizes[i]))), None)
            if k is None:
                continue
            i, size = frames[k], int(sizes[frames[k]] - off[c])
            if whole(place[k], size) and (k + 1 == len(frames) or whole(place[k] + size, int(sizes[i + 1]))):
                new_sizes[i] = size
            elif k == 0:
                for bit in range(max(end, int(chunks[c])).bit_length()):
                    start = int(chunks[c]) ^ (1 << bit)
                    if whole(start, int(sizes[frames[0]])) and whole(start + place[-1] - place[0],
                                                                      int(sizes[frames[-1]])):
                        new_places[c] = start
                        break
    return new_sizes, new_places


class _Realigned(io.RawIOBase):
    """A file read as it was before bytes were lost from or added to it at one place (a damaged
    copy): byte `x` of the view is the file's byte `x` before `split`, and its byte `x + shift`
    from there on (zeros where that is outside the file); `patches` are bytes put over its own, each
    as (where in the view, bytes): a box header put over a damaged one, an index entry mended; it
    ends at byte `size`, where given (the file's first bytes alone)."""

    def __init__(self, path: str, split: int, shift: int, patches: tuple[tuple[int, bytes], ...] = (),
                 size: int | None = None):
        self.raw = open(path, "rb")  # noqa: SIM115 (open while the stand-in is kept; closed with it)
        self.split, self.shift, self.patches = split, shift, patches
        self.size = os.fstat(self.raw.fileno()).st_size - shift if size is None else size
        self.pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def file_bytes(self, at: int, n: int) -> bytes:
        """The file's `n` bytes from its byte `at`, zeros for those outside it."""
        lo, hi = max(0, at), min(at + n, self.size + self.shift)
        data = os.pread(self.raw.fileno(), hi - lo, lo) if hi > lo else b""
        if len(data) == n:
            return data
        before = min(n, lo - at)
        return bytes(before) + data + bytes(n - before - len(data))

    def view_bytes(self, at: int, n: int) -> bytes:
        """The view's `n` bytes from its byte `at`."""
        before = max(0, min(n, self.split - at))
        data = self.file_bytes(at, before) + self.file_bytes(at + before + self.shift, n - before)
        for start, patch in self.patches:
            lo, hi = max(at, start), min(at + n, start + len(patch))
            if lo < hi:
                data = data[:lo - at] + patch[lo - start:hi - start] + data[hi - at:]
        return data

    def readinto(self, buffer) -> int:
        n = max(0, min(len(buffer), self.size - self.pos))
        buffer[:n] = self.view_bytes(self.pos, n)
        self.pos += n
        return n

    def close(self) -> None:
        self.raw.close()
        super().close()


def iso_after_a_damaged_head(path: str) -> StandIn | None:
    """An MP4/MOV whose first bytes, its file type box (ftyp) among them, were zeroed or overwritten (a
    lost disk sector, a damaged copy), or that has bytes put before it, read from the boxes after
    them; None for any other file. FFmpeg read such a file as no media at all, though its index and
    its frames' data were there (a file that starts with its ftyp box: realigned_iso). Where boxes
    run from some place to the file's end with the index (moov box) among them
    (boxes_to_the_end), the file is read with its bytes up to there as a box to pass over (a free
    box's header put over their first bytes): the index says where each frame's data lies in the
    file, which is where it still is; frames whose data was overwritten do not read as their codec's
    data (_sample_check) and are left out. Where those boxes start with a file type box
    (ftyp), a whole file follows bytes put before it: it is read from there."""
    if (found := boxes_to_the_end(path)) is None:
        return None
    start, kind = found
    if kind == "ftyp":
        view, note = _Realigned(path, 0, start), passed_over(start)
    elif start >= 16:
        free = (start.to_bytes(4, "big") + b"free" if start < 1 << 32 else
                (1).to_bytes(4, "big") + b"free" + start.to_bytes(8, "big"))  # a 64-bit size after the type
        view = _Realigned(path, 0, 0, patches=((0, free),))
        note = (f"its first {start} bytes are no box of an MP4/MOV's (a damaged header): it was read from its "
                f"{kind} box at byte {start} on")
    else:
        return None
    check, samples = _indexed_samples(view)
    lost = frozenset(at for at, _, whole in samples if not whole)
    if check and len(lost) == len(samples):
        view.close()
        return None  # no frame's data where the index says: not that file's index
    return StandIn(view, lost=lost, note=note)


def matroska_after_bytes_before(path: str, within: int = 1 << 20) -> StandIn | None:
    """A Matroska (WebM) file with bytes put before it (a damaged copy, a download saved with what came
    before the file), read from its header on; None for any other file. FFmpeg looks for a Matroska
    header at a file's first byte only, and took such a file for no media at all. The header is looked
    for in the file's first `within` bytes: its ID, a size that ends it inside them, a DocType of
    "matroska" or "webm" inside it, and a segment's ID right after it."""
    head = file_head(path, within)
    at = head.find(EBML, 1)
    while at > 0:
        size = ebml_size(head, at + 4)
        if size is not None:
            end = at + 4 + size[1] + size[0]  # where the header ends and the segment should start
            body = head[at + 4 + size[1]:end]
            if head[end:end + 4] == SEGMENT and (b"\x42\x82\x88matroska" in body or b"\x42\x82\x84webm" in body):
                return StandIn(_Realigned(path, 0, at), note=passed_over(at))
        at = head.find(EBML, at + 1)
    return None


# Decoders that decode damaged data into broken pictures without a word: of 8 files of each with 10
# bits flipped, HEVC's gave out 332 broken frames (of 748), VP9's 399 (of 751) and VP8's 214 (of 600),
# with none rejected nor marked corrupt, and HEVC's few logged errors came after the frames they broke;
# H.264's, MPEG-2's, AV1's left none unmarked. Where the file holds checksums (FFmpeg's Matroska
# muxer, and with it OBS's and HandBrake's MKV recordings, writes one for each cluster; WebM has
# none), a cluster that fails its own marks its frames damaged (see failed_clusters).
SILENT_DECODERS = {"hevc", "vp8", "vp9"}


def _sample_check(stream) -> Callable[[bytes], bool] | None:
    """For the codecs whose samples in an MP4 show what they are, a test of whether some bytes are
    such a sample, whole: H.264 and HEVC's are NAL units, each after its length (in 1 to 4 bytes, as
    the stream's header says), that fill the sample exactly; MPEG-4 Part 2's start with a start
    code, (M)JPEG's with an SOI marker, ProRes's with its frame header. None for other codecs."""
    ctx = stream.codec_context
    extra = bytes(ctx.extradata or b"")
    if ctx.name in ("h264", "hevc"):
        at = 4 if ctx.name == "h264" else 21  # the length's size, in an avcC or hvcC record
        if len(extra) <= at or extra[0] != 1:
            return None  # parameter sets in the stream (Annex B), not an MP4's NAL units
        length = (extra[at] & 3) + 1

        def nal_units(data: bytes) -> bool:
            i = 0
            while i + length < len(data):
                n = int.from_bytes(data[i:i + length], "big")
                if n == 0 or data[i + length] & 0x80:  # a NAL unit's first bit is zero
                    return False
                i += length + n
            return i == len(data) > 0
        return nal_units
    starts = {"mpeg4": (0, b"\0\0\1"), "mjpeg": (0, b"\xff\xd8"), "prores": (4, b"icpf")}.get(ctx.name)
    if starts is None:
        return None
    at, marker = starts
    return lambda data: data[at:at + len(marker)] == marker


def realigned_iso(path: str, boxes: list) -> StandIn | None:
    """An MP4/MOV that lost or gained bytes in its media data (a damaged copy), read as it was
    before; None for any other. Its index (moov box) says where each frame's data lies, as the
    file was: before the place of the damage, that is where it still is; after it, the bytes lost
    or gained shifted it. A frame's data is told by what its codec's data looks like
    (_sample_check): the place is where the frames stop being where the index says and are found
    that many bytes away. The frames whose data is neither place (those lost with the bytes) are
    left out. Where the index comes after the media data, as it mostly does, the file could not
    be read at all: the media data box's size says where the index starts. Where it comes first,
    the frames after the damage decoded into garbage. `boxes`: its top_level_boxes."""
    if (mdat := misfit_media_data(path, boxes)) is None:
        return None
    start, size, index_first, fragment = mdat
    stated_end, end = start + size, os.path.getsize(path)
    if fragment:  # a fragmented MP4: the next fragment is where the boxes from there on run to the end
        if (next_box := boxes_to_the_end_near(path, stated_end)) is None:
            return None
        shift = next_box - stated_end
    elif index_first:
        shift = end - stated_end  # the index first: the media data runs to the end of the file
    elif (index := index_start(path)) is not None:
        shift = index - stated_end
    else:
        return None  # no index: cut short before it (probe says so)
    if shift == 0:
        return None
    view = _Realigned(path, stated_end, shift)  # the media data as it is, the index where it is
    video = None
    try:
        video = _realigned(view, index_first or fragment, stated_end if fragment else None)
    finally:
        if video is None:
            view.close()
    return video


def _indexed_samples(view: _Realigned) -> tuple[Callable[[bytes], bool] | None, list[tuple[int, int, bool]]]:
    """The test of the video's codec for its samples (_sample_check), and (where, bytes, whole as the
    view has it) of every frame's data, in the order of where, as the index says; (None, []) where the
    view opens as no video or its codec has no such test."""
    try:
        with av.open(_SharedReader(view), "r", metadata_errors="replace") as container:
            stream = video_stream(container)
            check = stream and _sample_check(stream)
            if not check:
                return None, []
            samples = []
            for p in container.demux(stream):
                if p.size and p.pos >= 0:
                    samples.append((p.pos, p.size, check(bytes(p))))
                    progress()  # for the sandbox's timeout: a long file's data is read through once
    except (av.FFmpegError, OSError, ValueError):
        return None, []
    return check, sorted(samples)


def _realigned(view: _Realigned, needs_shift: bool, split_by: int | None = None) -> StandIn | None:
    """realigned_iso's work on `view`, split at the media data's stated end: the split moved to
    where the frames are found shifted, if they are (`needs_shift`: None where none is; with the
    index first, or fragments, the file reads as it is up to the damage), and to `split_by` at the
    latest (the next fragment's boxes, which are read shifted too)."""
    check, samples = _indexed_samples(view)
    if not check:
        return None
    # Where the frames stop being where the index says, and the first one found shifted from there on.
    shift = view.shift
    gone = next((i for i, (_, _, whole) in enumerate(samples) if not whole), len(samples))
    shifted = [check(view.file_bytes(at + shift, n)) for at, n, _ in samples[gone:]]  # whole, read shifted
    moved = next((gone + i for i, whole in enumerate(shifted) if whole), None)
    if moved is None and needs_shift:
        return None  # none found shifted: a file cut short (or damaged some other way), read as it is
    if moved is not None:
        view.split = min(samples[moved][0], split_by if split_by is not None else math.inf)
    # The frames whose data is not whole where the view now has it (as it was read before the split,
    # which moved back if at all, and before the first one not whole; shifted from there on), and the
    # one before the first not where the index says: the place of the damage is most likely inside
    # it, past its last NAL unit's length, which alone the check reads (HEVC's decoder decoded such a
    # frame into garbage without a word).
    lost = {at for i, (at, _, whole) in enumerate(samples)
            if not (whole if i < gone or at < view.split else shifted[i - gone])}
    if 0 < gone < len(samples):
        lost.add(samples[gone - 1][0])
    lost = frozenset(lost)
    if len(lost) == len(samples):
        return None
    more_or_less = f"{shift} bytes more" if shift > 0 else f"{-shift} bytes less"
    found = f": the frames after that place were found {abs(shift)} bytes {'on' if shift > 0 else 'back'}" \
        if moved is not None and moved > 0 else ""
    return StandIn(view, lost=lost, note=f"its media data holds {more_or_less} than its header says (bytes lost or "
                   f"added at one place: a damaged copy){found}")


def sample_lumas(path: str, probe_: Probe, size: tuple[int, int], count: int = 8) -> list[np.ndarray]:
    """The luma (h, w) at `size` (as displayed: turned by the rotation) of up to `count` key frames
    spread over the source: a seek and one frame's decoding each. [] where the source cannot be
    sought in (a raw stream, a damaged index); fewer where key frames are far apart."""
    rot = probe_.rotation
    w, h = (size[1], size[0]) if rot in (90, 270) else size
    lumas, seen, lost = [], set(), Damage().knowing(path).lost
    scaler = VideoReformatter()
    try:
        with open_input(path) as container:
            stream = video_stream(container)
            start, tb = stream.start_time or 0, float(stream.time_base)
            for k in range(count):
                container.seek(start + int((k + 0.5) / count * probe_.duration_s / tb), stream=stream)
                # The key frame the seek lands on, drained out of the decoder at once: it would hold
                # it back for the frames after it (B-frames), which need not be decoded.
                key = next((p for p in packets(container, stream) if p.is_keyframe and p.size), None)
                if key is None or key.pts in seen or key.pos in lost:
                    continue
                seen.add(key.pts)
                try:
                    frames = [*key.decode(), *stream.codec_context.decode(None)]
                except av.FFmpegError:
                    continue
                if not frames:
                    continue
                frame = frames[0]
                y = luma_plane(scaler.reformat(frame, width=w, height=h, format="yuv420p", interpolation="AREA",
                                               src_color_range=frame.color_range, dst_color_range=ColorRange.MPEG,
                                               threads=1))
                lumas.append(np.ascontiguousarray(np.rot90(y, rot // 90)) if rot else y)
    except (av.FFmpegError, ValueError, OverflowError):
        return []
    return lumas


def ffmpeg_message(e: av.FFmpegError, path: str) -> str:
    """FFmpeg's words for an error, without its error number and the path the record already
    names: "Invalid data found when processing input", or with the call that failed."""
    where = f" ({e.filename})" if e.filename and e.filename != path else ""
    return f"{e.strerror or e}{where}"


def frame_gaps(container, stream, count: int = 500) -> np.ndarray:
    """Seconds between the stream's next `count` packets (demuxed, not decoded) in presentation
    order, those above 0."""
    try:
        pts = [p.pts for p in itertools.islice(packets(container, stream), count) if p.pts is not None]
    except (av.FFmpegError, ValueError):
        pts = []
    gaps = np.diff(np.unique(np.array(pts, dtype=np.int64))) * float(stream.time_base or 0)
    return gaps[gaps > 0]


def filmed_rate(gaps: np.ndarray, mean: float, nominal: float) -> float:
    """The rate a variable frame rate stream runs at where it runs steadily, from the `gaps` between
    its frames (frame_gaps): one over their 10th percentile, between the mean rate and the nominal
    one. The mean alone is too low wherever the recording pauses (a 25 fps file with a 10 s pause
    in it averages 12.5 fps), and a stream transcoded at it drops every other frame of its footage;
    the nominal rate (FFmpeg's guess from the first frames) is no more than a bound, as a phone's
    1/600 s clock can make it 600."""
    if len(gaps) < 8:
        return mean
    rate = 1.0 / float(np.percentile(gaps, 10))
    return min(max(rate, mean), nominal) if nominal >= mean else max(rate, mean)


def even_size(width: int, height: int, short_side: int) -> tuple[int, int]:
    """(width, height) scaled so the short side is `short_side` (never upscaled), both even."""
    scale = min(1.0, short_side / min(width, height))
    return max(2, round(width * scale / 2) * 2), max(2, round(height * scale / 2) * 2)


def analysis_size(width: int, height: int, analysis_width: int) -> tuple[int, int]:
    w = min(analysis_width, width)
    return w, max(2, round(height * w / width))


@dataclass
class DecodedFrame:
    index: int  # in decode (presentation) order, from 0
    small: np.ndarray  # (h, w, 3) uint8 RGB analysis frame
    frame: av.VideoFrame | None  # yuv420p at the transcode size; None when not asked for
    # Presentation time in seconds from the source's start, as players and `ffmpeg -ss` count it (a
    # broadcast .ts starts its clock at 1.4 s or anywhere); frame index / fps is wrong for variable
    # frame rates. None when the stream gives no timestamp.
    time_s: float | None
    stored_size: tuple[int, int] = (0, 0)  # (width, height) as decoded, before scaling and rotation
    stretched: bool = False  # of another shape than the stream's first frame, so stretched to fit
    damaged: bool = False  # decoded from a corrupt stretch of the file (see decoded_frames)
    luma: np.ndarray | None = None  # (H, W) uint8 for a quality score, on sampled frames only (see decode)
    pixel_aspect: Fraction = Fraction(1)  # of the stored pixels, width over height, as the stream says here


def _planes(frame: av.VideoFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The Y (h, w), U and V (h/2, w/2) planes of a yuv420p frame (even sizes)."""
    h, w = frame.height, frame.width
    packed = frame.to_ndarray()  # (h * 3/2, w): the Y plane's rows, then the U and V planes
    u, v = packed[h:].reshape(2, h // 2, w // 2)
    return packed[:h], u, v


def _from_planes(y: np.ndarray, u: np.ndarray, v: np.ndarray) -> av.VideoFrame:
    packed = np.concatenate([p.ravel() for p in (y, u, v)]).reshape(-1, y.shape[1])
    return av.VideoFrame.from_ndarray(packed, format="yuv420p")


def luma_plane(frame: av.VideoFrame) -> np.ndarray:
    """(h, w) uint8: the Y plane of a yuv420p frame."""
    return _planes(frame)[0]


def _rotate_yuv420p(frame: av.VideoFrame, rotation: int) -> av.VideoFrame:
    """Turn a yuv420p frame (even sizes) by the display rotation (counter-clockwise degrees), plane
    by plane: lossless, and without the round trip through RGB."""
    return _from_planes(*(np.rot90(p, rotation // 90) for p in _planes(frame)))


def crop_yuv420p(frame: av.VideoFrame, top: int, bottom: int, left: int, right: int) -> av.VideoFrame:
    """A yuv420p frame without so many lines at each edge (even numbers, so chroma stays aligned)."""
    y, u, v = _planes(frame)
    h, w = y.shape
    return _from_planes(y[top:h - bottom, left:w - right],
                        *(p[top // 2:(h - bottom) // 2, left // 2:(w - right) // 2] for p in (u, v)))


def decode(path: str, probe_: Probe, small_size: tuple[int, int],
           out_size: tuple[int, int] | None, fast: bool = False, threads: int = 0,
           damage: Damage | None = None, quality_every: int = 0,
           quality_short_side: int = 480, short_side: int | None = None) -> Iterator[DecodedFrame]:
    """Decode the source once, yielding every frame as an analysis frame and (if `out_size`) a
    transcode frame. Sizes are (width, height) after rotation. The analysis frame is scaled from
    the transcode frame, so the full-size frame is scaled only once. `fast` skips H.264's
    deblocking filter: fine for analysis at a few dozen pixels wide, not for frames to keep.
    `threads`: decoder threads, 0 for FFmpeg's choice; 1 when other processes already use the cores.
    `damage`, if given, counts what a damaged file cost. Every `quality_every`-th frame (none for 0)
    also comes as luma for a quality score, scaled from the decoded frame to a short side of
    `quality_short_side` at most (never up): detail that the transcode size no longer has, and in
    which a blurred or noisy source shows. A stream can change shape part-way (recordings joined
    end to end, a broadcast switching between SD and HD): given `short_side`, frames of another
    shape than the first come at a transcode size of their own, with that short side, rather than
    stretched to `out_size`; where the source needs FFmpeg filters (interlaced, HDR), they are set up
    again for each shape."""
    rot = probe_.rotation
    swap = rot in (90, 270)

    def pre(size):  # a size before rotation
        return (size[1], size[0]) if swap else size

    sw, sh = pre(small_size)
    # One scaler per output size for the whole stream: frame.reformat() would set up a new
    # swscale context (filter tables and all) for every frame, which costs more than the scaling.
    # Both scale down with area averaging: for the transcode frame, against swscale's bilinear, it
    # took 0.25 ms a 720p frame instead of 0.46 and came 3 dB closer to Lanczos (sizes never go up).
    # Colours: transcode frames are BT.601 limited range (tagged so by encode_clip), which is what
    # a decoder assumes of an untagged small video (decord does). BT.709 sources (HD cameras and
    # phones) and full-range ones (webcams, MJPEG) are converted: copied as they are, their
    # numbers read as BT.601 were up to 30 levels off in a channel.
    to_out, to_small, to_luma = VideoReformatter(), VideoReformatter(), VideoReformatter()
    scale_threads = 1 if threads == 1 else 0  # swscale's own slice threads
    damage = (damage or Damage()).knowing(path)
    with open_input(path) as container:
        stream = video_stream(container)
        if threads != 1:
            stream.thread_type = "AUTO"
        # One thread where asked, not PyAV's default of slice threads, as many as the cores: those
        # turn off the error resilience of FFmpeg's H.264 decoder, which then decodes a damaged
        # stretch into garbage that it neither conceals nor marks (every damaged frame of a
        # bit-flipped mp4 came out unmarked, into kept clips). Frame threads keep it.
        stream.codec_context.thread_count = threads
        if fast:
            stream.codec_context.options = {"skip_loop_filter": "all"}
        # A stream can change shape part-way (a recording across a switch): its stored size, or
        # its pixel aspect alone (a broadcast switching between 4:3 and 16:9 in one 720x576 frame).
        first_aspect = None  # the first frame's shown width over height
        own_sizes: dict[tuple, tuple[int, int]] = {}  # shape -> its transcode size, before rotation

        def sizes(shape: tuple[int, int, Fraction]) -> tuple[tuple[int, int], bool]:
            """(the transcode size before rotation, stretched) of frames decoded in `shape`: (stored
            width, height, pixel aspect)."""
            nonlocal first_aspect
            w, h, sar = shape
            first_aspect = first_aspect or w * sar / h
            stretched = abs(w * sar / h / first_aspect - 1) > 0.02
            if not stretched or not short_side or out_size is None:
                return (pre(out_size) if out_size is not None else (0, 0)), stretched
            if shape not in own_sizes:
                own_sizes[shape] = even_size(max(1, round(w * sar)), h, short_side)
            return own_sizes[shape], False

        def shaped(frames: Iterator[tuple[av.VideoFrame, bool]]) -> Iterator[tuple[av.VideoFrame, bool, tuple]]:
            """(frame, damaged, shape). PyAV gives no frame's own pixel aspect, only the decoder's,
            which the parameter sets of the packets decoded so far set: with B-frames, frames before
            it in time. It is read at each key frame, where new parameter sets take effect."""
            sar = None
            for frame, damaged in frames:
                if sar is None or frame.key_frame:
                    sar = stream.codec_context.sample_aspect_ratio
                    sar = Fraction(sar) if sar and sar > 0 else Fraction(1)
                yield frame, damaged, (frame.width, frame.height, sar)

        frames = shaped(decoded_frames(container, stream, damage))
        if out_size is not None and (probe_.interlaced or probe_.hdr or probe_.wide_gamut):  # see _filters
            frames = _filtered(frames, stream, lambda shape: _filters(probe_, *sizes(shape)[0], shape[1]))
        # The source's start: the container's earliest timestamp, over all streams.
        origin = container.start_time / av.time_base if container.start_time is not None else None
        index = 0
        try:
            for frame, damaged, shape in frames:
                (ow, oh), stretched = sizes(shape)
                out, luma = None, None
                if quality_every and index % quality_every == 0:
                    k = min(1.0, quality_short_side / min(frame.width, frame.height))
                    luma = to_luma.reformat(frame, width=max(1, round(frame.width * k)),
                                            height=max(1, round(frame.height * k)), format="gray",
                                            interpolation="AREA", threads=scale_threads).to_ndarray()  # (h, w)
                    luma = np.ascontiguousarray(np.rot90(luma, rot // 90)) if rot else luma
                if out_size is not None:
                    frame = out = to_out.reformat(frame, width=ow, height=oh, format="yuv420p",
                                                  interpolation="AREA", src_color_range=frame.color_range,
                                                  dst_colorspace=Colorspace.ITU601,
                                                  dst_color_range=ColorRange.MPEG, threads=scale_threads)
                small = to_small.reformat(frame, width=sw, height=sh, format="rgb24", interpolation="AREA",
                                          src_color_range=frame.color_range,
                                          threads=scale_threads).to_ndarray()  # (sh, sw, 3)
                if rot:
                    small = np.ascontiguousarray(np.rot90(small, rot // 90))
                    out = out and _rotate_yuv420p(out, rot)
                time_s = None
                if frame.time is not None:
                    origin = float(frame.time) if origin is None else origin
                    time_s = max(0.0, float(frame.time) - origin)  # not -3e-7 from rounding
                # For the sandbox's timeout, which is on time without progress, and the run's log.
                progress((index + 1, probe_.num_frames))  # (frames decoded, of the header's count or 0)
                yield DecodedFrame(index, small, out, time_s, shape[:2], stretched, damaged, luma, shape[2])
                index += 1
        except av.FFmpegError as e:
            if index == 0:
                raise MediaError(f"cannot decode video: {ffmpeg_message(e, path)}") from e
            # A stream that breaks part-way keeps the frames before the damage; the record says so.
            raise TruncatedStream(index, ffmpeg_message(e, path)) from e


def _filters(probe_: Probe, out_width: int, out_height: int, stored_lines: int) -> list[tuple[str, str]]:
    """FFmpeg filters that a source's frames go through before the scaler, if it needs any, for
    frames decoded with `stored_lines` lines; the output size is before rotation.

    - Interlaced: made progressive, one frame out for each frame in. Scaled as they are, the two
      fields, 1/50 or 1/60 s apart, would show moving things twice. Where the output has no more
      lines than a field (1080i or 576i to a short side of 256), the field shown first is taken
      alone: no detail is lost and it costs nothing (`field` steps over every other line). Else
      bwdif interpolates the missing lines (about 4 ms a 1080i frame here).
    - HDR (PQ, HLG) or BT.2020 primaries: scaled to the output size, then mapped to SDR BT.709
      light and primaries by FFmpeg's colour-managed scaler, and stored as BT.601 numbers like
      every clip. Taken as SDR numbers, a PQ source's colours came out up to 83 levels off, an HLG
      source's 48. The mapping costs about 1 s to set up for each source, then 4 ms a 1080p frame."""
    specs = []
    if probe_.interlaced:
        if out_height <= stored_lines // 2:
            specs.append(("field", "type=top" if probe_.top_field_first else "type=bottom"))
        else:
            specs.append(("bwdif", "mode=send_frame:parity=auto:deint=interlaced"))
    if probe_.hdr or probe_.wide_gamut:
        specs += [("scale", f"w={out_width}:h={out_height}:flags=area"), ("format", "yuv444p16le"),  # size first
                  ("scale", "out_color_matrix=bt601:out_range=tv:out_transfer=bt709:out_primaries=bt709"),
                  ("format", "yuv420p")]
    return specs


def _filtered(frames: Iterator[tuple[av.VideoFrame, bool, tuple]], stream,
              specs_for) -> Iterator[tuple[av.VideoFrame, bool, tuple]]:
    """(frame, damaged, shape) through a chain of FFmpeg filters, `specs_for(shape)` ((name,
    arguments) each; shape: stored width, height, pixel aspect); a frame out is damaged when the frame
    in at its time was. A filter graph is set up for one shape and format: where the stream changes
    either (a broadcast switching between SD and HD), the graph is drained and set up again."""
    damaged_pts: set[int] = set()
    graph, key = None, None

    def ready(graph, shape) -> Iterator[tuple[av.VideoFrame, bool, tuple]]:
        while True:
            try:
                frame = graph.pull()
            except (av.BlockingIOError, av.EOFError):
                return
            yield frame, frame.pts in damaged_pts, shape

    def drain() -> Iterator[tuple[av.VideoFrame, bool, tuple]]:
        if graph is not None:
            graph.push(None)  # bwdif holds a frame back to look ahead
            yield from ready(graph, key[0])

    for frame, damaged, shape in frames:
        if (shape, frame.format.name) != key:
            yield from drain()
            graph, key = av.filter.Graph(), (shape, frame.format.name)
            # The decoder's context describes the frames it gives out now, of the new shape too.
            nodes = [graph.add_buffer(template=stream), *(graph.add(*spec) for spec in specs_for(shape)),
                     graph.add("buffersink")]
            for a, b in itertools.pairwise(nodes):
                a.link_to(b)
            graph.configure()
        if damaged and frame.pts is not None:
            damaged_pts.add(frame.pts)
        graph.push(frame)
        yield from ready(graph, shape)
    yield from drain()


def encode_clip(frames: list[av.VideoFrame], fps: float, crf: int, preset: str,
                keyframe_interval_s: float = 1.0) -> bytes:
    """H.264 yuv420p mp4 at a constant rate, in memory, with a keyframe every `keyframe_interval_s`
    so that a loader reading a window of the clip seeks instead of decoding from its start.

    A clip's bytes depend only on its frames and the config, not on the run, the machine or the
    number of workers:
    - x264 runs on one thread, as its output depends on its thread count; clips are encoded
      concurrently instead (split.ClipEncoder), PyAV releasing the GIL while x264 works;
    - macroblock-tree rate control is off: its AVX-512 code gave different bytes from run to run
      for the same frames (seen with the libx264 in PyAV's wheel), and without it the bytes are the
      same whether x264 uses SSSE3, AVX2 or AVX-512;
    - the source's frame types (I/P/B, set by the decoder) are cleared, or x264 would copy them."""
    import io

    buf = io.BytesIO()
    rate = Fraction(fps).limit_denominator(1001)
    with av.open(buf, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=rate)
        stream.width, stream.height, stream.pix_fmt = frames[0].width, frames[0].height, "yuv420p"
        stream.codec_context.colorspace = Colorspace.ITU601  # what decode() made of the source's colours
        stream.codec_context.color_range = ColorRange.MPEG
        gop = max(1, round(keyframe_interval_s * float(rate)))
        stream.options = {"crf": str(crf), "preset": preset, "threads": "1",
                          "g": str(gop), "keyint_min": str(gop), "x264-params": "mbtree=0"}
        for i, frame in enumerate(frames):
            frame.pict_type = av.video.frame.PictureType.NONE  # not the source's frame types
            frame.pts = i
            frame.time_base = 1 / rate
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()
