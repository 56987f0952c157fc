"""A video file's container read from its bytes, without FFmpeg: what kind of file it is where FFmpeg
finds no media in it, where it was cut short (an interrupted download or copy), and the structure
that media.py's stand-ins mend or step over (an MP4's top-level boxes, an FLV's tags, a Matroska
file's segment and its clusters' checksums). Each reads a few bytes of the file, or walks its units
by their stated sizes; none decodes.
"""

from __future__ import annotations

import functools
import os
import re
import stat
import zlib
from collections.abc import Iterator

import numpy as np


def file_head(path, size: int, at: int = 0) -> bytes:
    """The first `size` bytes of the file at `path` (fewer in a shorter one), or those from its byte
    `at`; none where it cannot be read: av.open says why."""
    try:
        with open(path, "rb") as f:
            f.seek(at)
            return f.read(size)
    except OSError:
        return b""


APPLE_DOUBLE = b"\x00\x05\x16\x07"  # the magic number of the `._name` files a Mac writes beside a file it copies


def not_a_video_kind(head: bytes) -> str | None:
    """What a file that starts with `head` is, where FFmpeg finds no media in it and it is one of the
    files that commonly stand where a video was looked for: the `._clip.mp4` a Mac copies beside
    `clip.mp4` (its metadata), a web page (a download that saved an error or sign-in page in the
    video's place), or other text, with how it begins. None for anything else."""
    import codecs
    import html
    import re

    if head.startswith(APPLE_DOUBLE):
        return ("a Mac's metadata file (AppleDouble, the `._` file a Mac writes beside each file it copies), "
                "not a video")
    head = head.removeprefix(codecs.BOM_UTF8)
    try:  # the last character may be cut in two
        text = codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError:
        return None
    if not text.strip() or any(not (c.isprintable() or c in "\t\r\n") for c in text):
        return None
    if re.match(r"\s*<(!doctype\s+html|html|head|body)\b", text, re.IGNORECASE):
        title = re.search(r"<title[^>]*>([^<]*)", text, re.IGNORECASE)
        named = " ".join(html.unescape(title[1]).split())[:80] if title else ""
        return ("a web page, not a video (a download that saved an error or sign-in page in its place)"
                + (f", titled {named!r}" if named else ""))
    words = " ".join(text.split())
    begins = words if len(words) <= 60 else words[:60].rstrip() + "..."
    return f"a text file, not a video; it begins {begins!r}"


TS_TAIL = 64 << 10  # bytes at the end of a .ts searched for the video's last transport packet


def ends_inside(path: str, read_as_is: bool = True) -> str | None:
    """What the file at `path` ends inside, where its container frames its data in units that state
    their own length and the last is cut off: the file was cut short (a download or copy stopped
    part-way). A Matroska segment or an ASF (WMV) file of stated size, an Ogg page, an MP4's last box
    (a fragmented MP4's fragment; an MP4 read as it is), a raw DV frame, a Y4M picture, an MPEG
    program stream's packet, an FLV tag, an MPEG-TS (M2TS, DVB) transport packet, or where an MPEG-TS
    ends between two of its packets, a PES packet of stated length (the sound's). Such files state
    no duration to compare the frames decoded with, or one the cut did not reach far enough below
    (the sound's, or where the frames' times run slower), and their demuxers end without a word. None
    where the file ends at a unit's end, or is none of these. `read_as_is`: False where a stand-in is read in the
    file's place (media.stand_in: an MP4 mended or realigned, whose last box is not then looked at)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(0)
            head = f.read(MATROSKA_HEAD)
            f.seek(max(0, size - TS_TAIL))
            tail = f.read()
    except OSError:
        return None
    n = len(tail)
    if head.startswith(EBML):  # Matroska, WebM: the segment's size, unless unknown (a live recording's)
        segment = _matroska_segment(head)
        if segment is not None and segment[1] is not None and sum(segment) > size:
            return f"its segment ({size} of the {sum(segment)} bytes its header states)"
        return None
    if head.startswith(b"OggS"):
        page = tail.rfind(b"OggS\x00")  # the last page's header (its capture pattern, version 0)
        if page >= 0 and (page + 27 > n or page + 27 + tail[page + 26] > n or
                          page + 27 + tail[page + 26] + sum(tail[page + 27:page + 27 + tail[page + 26]]) > n):
            return "an Ogg page"
        return None
    if head[4:8] == b"ftyp" and read_as_is:  # its last box (a fragment's)
        boxes = top_level_boxes(path)
        if boxes and boxes[-1][1] + boxes[-1][2] > size:
            return f"its last box ({boxes[-1][0]}, {size - boxes[-1][1]} of the {boxes[-1][2]} bytes it states)"
        return None
    if head.startswith(ASF_HEADER):
        return _asf_ends_inside(path, size)
    if head[:3] == b"\x1f\x07\x00" and head[3] in (0x3F, 0xBF):  # a raw DV file: frames of a fixed size
        frame = 144000 if head[3] & 0x80 else 120000  # 625 lines (PAL) or 525 (NTSC)
        return "a DV frame" if size % frame else None
    if head.startswith(PACK_START):
        return "an MPEG program stream packet" if _ps_ends_inside(tail) else None
    if head.startswith(Y4M):
        return _y4m_ends_inside(path, size, head)
    if is_flv_header(head):
        for at, tag in flv_tags(path):
            if tag[0] & 0x1F not in FLV_TAGS:
                return None  # bytes that are no tag (damage, a second file joined on): not a cut
            if len(tag) < 11 or at + 11 + int.from_bytes(tag[1:4], "big") > size:
                # Its header or its data cut off; or its size damaged, where a tag's "previous tag size"
                # (11 bytes more than its data) follows some bytes on, as it would after this one.
                return None if _flv_tag_ends_before(path, at, size) else "an FLV tag"
        return None
    for packet, at in TS_PACKETS:
        if head[at:at + 1] != b"\x47" or head[at + packet:at + packet + 1] not in (b"\x47", b""):
            continue
        # The last packet's sync byte: the last of three a packet apart on the file's grid of packets.
        grid = (size - n) % packet  # the tail's offset from the grid
        sync = next((i for i in range(n - 1, 2 * packet - 1, -1) if (grid + i - at) % packet == 0
                     and tail[i] == tail[i - packet] == tail[i - 2 * packet] == 0x47), None)
        if sync is None:
            continue
        if sync - at + packet != n:
            return "an MPEG-TS packet"
        return "a PES packet of stated length (a stream's, as the sound's)" \
            if _ts_pes_ends_inside(tail, (at - grid) % packet, packet) else None
    return None


# Transport packets' sizes, and where the sync byte 0x47 is in each: MPEG-TS's, Blu-ray's M2TS (a
# 4-byte time code first) and DVB's with 16 bytes of error correction after each.
TS_PACKETS = ((188, 0), (192, 4), (204, 0))


def ts_cut_short(path: str, pid: int) -> bool:
    """Whether the MPEG-TS file at `path` was cut short in the middle of a frame of the video (stream
    `pid`), as a download, a copy or a recording stopped part-way leaves it. The demuxer gives out
    the frame it was reading with the data it had, unflagged (a video's PES packet states no length
    to check it by); H.264's decoder in frame threads marks the broken picture in some runs only.

    Where the file ends inside a transport packet of the video, that packet tells: one that goes on
    with a frame's data was cut; one that starts a frame's lost nothing more (that frame never comes
    out, and the one before is whole). Otherwise (whole packets to the end, or a part packet of
    another stream) the video's last packet tells: the last of a frame's PES packet fills out the
    transport packet with stuffing, one amid a frame's data is full. False where the end is no
    transport packets, or the file cannot be read."""
    try:
        with open(path, "rb") as f:
            end = f.seek(0, os.SEEK_END)
            f.seek(max(0, end - TS_TAIL))
            tail = f.read()
    except OSError:
        return False
    n = len(tail)
    for size, at in TS_PACKETS:
        if n < 3 * size:
            continue
        if tail[n - size + at] == tail[n - 2 * size + at] == 0x47:
            grid = n - size + at  # whole packets to the end: the sync byte of the last
        else:  # the part packet's sync byte, if it is one of this size's
            grid = next((sync for sync in range(n - size + at + 1, n)
                         if tail[sync] == tail[sync - size] == tail[sync - 2 * size] == 0x47), None)
            if grid is None:
                continue
            header = tail[grid + 1:grid + 3]
            if len(header) < 2:
                return True  # too little of it left to say which stream's it was
            if (header[0] & 0x1F) << 8 | header[1] == pid:
                return not header[0] & 0x40  # payload_unit_start_indicator: a new PES packet starts in it
            grid -= size
        while grid >= 0 and tail[grid] == 0x47:  # back to the video's last whole packet
            packet = tail[grid:grid + 188]
            if (packet[1] & 0x1F) << 8 | packet[2] == pid and packet[3] & 0x10:  # one with payload
                return not _stuffed(packet)
            grid -= size
        return False  # no packet of the video in the last TS_TAIL bytes
    return False


def _ts_pes_ends_inside(tail: bytes, first: int, packet: int) -> bool:
    """Whether the last PES packet of some stream of an MPEG-TS, whose last bytes are `tail` (whole
    transport packets of `packet` bytes from its byte `first` on, each from its sync byte), runs past
    the end: one that states its length (the sound's do; the video's mostly state none) and whose
    transport packets to the end carry less than that. Only PES packets that start in `tail` count."""
    wanted: dict[int, int] = {}  # a stream's last PES packet: its bytes still to come
    for i in range(first, len(tail) - 187, packet):
        ts = tail[i:i + 188]
        if ts[0] != 0x47:
            return False  # no sync byte where one should be: damage, not known
        if not ts[3] & 0x10:
            continue  # no payload
        pid = (ts[1] & 0x1F) << 8 | ts[2]
        payload = ts[5 + ts[4]:] if ts[3] & 0x20 else ts[4:]  # after an adaptation field, if any
        if ts[1] & 0x40:  # payload_unit_start_indicator: a PES packet starts here
            length = int.from_bytes(payload[4:6], "big") if payload[:3] == b"\x00\x00\x01" else 0
            wanted[pid] = 6 + length if length else 0
        if wanted.get(pid):
            wanted[pid] -= len(payload)
    return any(left > 0 for left in wanted.values())


def _stuffed(packet: bytes) -> bool:
    """Whether a 188-byte transport packet fills out its payload with stuffing bytes in its
    adaptation field, as the last packet of a PES packet does unless its data fits exactly."""
    if not packet[3] & 0x20:  # no adaptation field: payload only, 184 bytes
        return False
    length = packet[4]
    if length == 0:  # an adaptation field of its length byte alone: one byte of stuffing
        return True
    flags = packet[5]
    used = 1 + 6 * bool(flags & 0x10) + 6 * bool(flags & 0x08) + bool(flags & 0x04)  # flags, PCR, OPCR, splice
    if flags & 0x02 and used < length:  # transport private data: a length byte, then that many bytes
        used += 1 + packet[5 + used]
    return length > used or bool(flags & 0x01)  # an extension is not sized here: taken for an end


ASF_HEADER = bytes.fromhex("3026b2758e66cf11a6d900aa0062ce6c")  # a WMV's (ASF) header object's GUID
ASF_FILE_PROPERTIES = bytes.fromhex("a1dcab8c47a9cf118ee400c00c205365")


def _asf_ends_inside(path: str, size: int) -> str | None:
    """Where the ASF (WMV, WMA) file at `path` holds fewer bytes than its header's file properties
    state (unless it is a live broadcast's, whose size is not known when its header is written)."""
    head = file_head(path, 64 << 10)
    at = head.find(ASF_FILE_PROPERTIES)
    if at < 0 or at + 92 > len(head):
        return None
    stated = int.from_bytes(head[at + 40:at + 48], "little")
    broadcast = head[at + 88] & 0x01
    return f"its data ({size} of the {stated} bytes its header states)" if not broadcast and size < stated else None


PACK_START = b"\x00\x00\x01\xba"  # an MPEG program stream's pack header (.mpg, .vob, .mod)


def _ps_ends_inside(tail: bytes) -> bool:
    """Whether an MPEG program stream whose last bytes are `tail` ends inside a packet: walked from
    its last pack header, each packet states its length (a pack header its stuffing)."""
    at = tail.rfind(PACK_START)
    n = len(tail)
    while 0 <= at < n:
        if n - at < 4:
            return True
        if tail[at:at + 3] != b"\x00\x00\x01":
            return False  # no start code where a packet should start: not known
        code = tail[at + 3]
        if code == 0xBA:  # a pack header: MPEG-2's is 14 bytes and its stuffing, MPEG-1's 12
            if n - at < 14:
                return True
            at += 14 + (tail[at + 13] & 0x07) if tail[at + 4] >> 6 == 1 else 12
        elif code == 0xB9:  # the program's end code
            at += 4
        elif code >= 0xBB:  # the system header, or a PES packet: 2 bytes of length follow
            if n - at < 6:
                return True
            at += 6 + int.from_bytes(tail[at + 4:at + 6], "big")
        else:
            return False
    return at > n


Y4M = b"YUV4MPEG2 "
# A Y4M's colour spaces (its header's C, 420jpeg without one), as FFmpeg reads them: (its planes of
# the picture's size (luma, and alpha), the two chroma planes' width and height divisors or None for
# none); "420p10" and the like take 2 bytes a sample.
Y4M_SPACES = {"mono": (1, None), "411": (1, (4, 1)), "420": (1, (2, 2)), "422": (1, (2, 1)), "444": (1, (1, 1)),
              "444alpha": (2, (1, 1))}
Y4M_FRAME = b"FRAME"


def _y4m_frame_bytes(header: bytes) -> int | None:
    """The bytes of each picture of a Y4M whose header line is `header`; None for a size or colour
    space not known (a damaged header: FFmpeg says so)."""
    fields = {f[:1]: f[1:] for f in header.split()[1:]}
    try:
        w, h = int(fields[b"W"]), int(fields[b"H"])
        space = fields.get(b"C", b"420jpeg").decode("ascii")
    except (KeyError, ValueError, UnicodeDecodeError):
        return None
    name, bits = space, ""
    if space in ("420jpeg", "420mpeg2", "420paldv"):  # where the chroma samples sit
        name = "420"
    elif space.startswith("mono"):  # "mono16": bits a sample
        name, bits = "mono", space[4:]
    elif space not in Y4M_SPACES:  # "420p10"
        name, _, bits = space.partition("p")
    if name not in Y4M_SPACES or w <= 0 or h <= 0 or (bits and not bits.isdigit()):
        return None
    full, chroma = Y4M_SPACES[name]
    sample = 2 if bits and int(bits) > 8 else 1
    return sample * (full * w * h + (2 * -(-w // chroma[0]) * -(-h // chroma[1]) if chroma else 0))


def _y4m_ends_inside(path: str, size: int, head: bytes) -> str | None:
    """Where a Y4M file (raw pictures, each behind a FRAME line) ends inside a picture or its line,
    walked picture by picture from its header line; None where it ends at one's end, or where no
    FRAME line is where one should be (damage, not a cut)."""
    end = head.find(b"\n")
    picture = _y4m_frame_bytes(head[:end]) if end > 0 else None
    if picture is None:
        return None
    at = end + 1
    try:
        with open(path, "rb") as f:
            while at < size:
                f.seek(at)
                line = f.read(256)
                if not line.startswith(Y4M_FRAME[:len(line)]):
                    return None
                nl = line.find(b"\n")
                if nl < 0:
                    return "a Y4M frame's line" if at + len(line) >= size else None
                at += nl + 1 + picture
    except OSError:
        return None
    return f"a Y4M frame ({picture - (at - size)} of its {picture} bytes)" if at > size else None


def is_flv_header(head: bytes) -> bool:
    """Whether `head` starts as an FLV file does: "FLV", version 1, then its header's size (9)."""
    return head[:4] == b"FLV\x01" and int.from_bytes(head[5:9], "big") == 9


FLV_TAGS = {8, 9, 18}  # audio, video, script data (the low five bits of a tag's first byte)


def flv_tags(path: str) -> Iterator[tuple[int, bytes]]:
    """(where it starts, its 11 bytes of header: type, data size, time, stream) of each tag of the FLV
    file at `path`, walked from the file's header by the sizes they state, to the file's end: the
    last header may be cut short (fewer bytes). The caller stops the walk where bytes are no tag."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        at = 9 + 4  # the header, then the first tag's "previous tag size" (0)
        while at < size:
            f.seek(at)
            tag = f.read(11)
            yield at, tag
            at += 11 + int.from_bytes(tag[1:4], "big") + 4


def _flv_tag_ends_before(path: str, at: int, size: int, within: int = 64 << 20) -> bool:
    """Whether the FLV tag at byte `at`, whose stated size runs past the file's end (`size`), ends
    before it all the same: some bytes on, the 4 bytes of a "previous tag size" state as many bytes
    back to `at` and a tag's type follows them. A damaged size, not the file cut short."""
    with open(path, "rb") as f:
        f.seek(at + 11)
        rest = np.frombuffer(f.read(min(size - at - 11, within)), dtype=np.uint8)
    if len(rest) < 5:
        return False
    # stated[k]: the 4 bytes from rest[k] as a number, big-endian
    stated = (rest[:-4].astype(np.uint32) << 24 | rest[1:-3].astype(np.uint32) << 16
              | rest[2:-2].astype(np.uint32) << 8 | rest[3:-1].astype(np.uint32))
    types = rest[4:] & 0x1F
    return bool(np.any((stated == np.arange(len(stated)) + 11) & np.isin(types, list(FLV_TAGS))))


def index_start(path: str, tail: int = 64 << 20) -> int | None:
    """Where the index (moov box) that ends an ISO media file, running to its last byte, starts
    (looked for in its last `tail` bytes; a two-hour recording's index is about 20 MB); None where
    none does."""
    try:
        with open(path, "rb") as f:
            end = f.seek(0, 2)
            start = f.seek(max(0, end - tail))
            data = f.read()
    except OSError:
        return None
    at = data.rfind(b"moov")
    while at >= 4:
        if start + at - 4 + int.from_bytes(data[at - 4:at], "big") == end:
            return start + at - 4
        at = data.rfind(b"moov", 0, at)
    return None


def top_level_boxes(path: str) -> list[tuple[str, int, int]]:
    """An ISO media file's (MP4, MOV, 3GP) top-level boxes, in order, up to the one that runs past
    the end of the file, each as (type, start, stated size in bytes); [] for a file that does not
    start with one."""
    try:
        with open(path, "rb") as f:
            boxes = list(_boxes_from(f, 0))
    except OSError:
        return []
    return boxes if boxes and boxes[0][0] == "ftyp" else []


def _boxes_from(f, at: int) -> Iterator[tuple[str, int, int]]:
    """The boxes of open file `f` that follow each other from its byte `at`, as top_level_boxes's, up to
    the one that runs past its end or bytes that are no box's header."""
    end = f.seek(0, 2)
    while at + 8 <= end:
        f.seek(at)
        head = f.read(16)
        size, kind = int.from_bytes(head[:4], "big"), head[4:8]
        if size == 1 and len(head) == 16:  # a 64-bit size follows the type
            size = int.from_bytes(head[8:16], "big")
        elif size == 0:  # to the end of the file
            size = end - at
        if size < 8 or not (kind.isascii() and kind.decode().isprintable()):
            return
        yield kind.decode(), at, size
        at += size


def misfit_media_data(path: str, boxes: list | None = None) -> tuple[int, int, bool, bool] | None:
    """For an ISO media file whose media data (mdat box) does not end where its stated size says,
    where the next box or the end of the file should be: (its start, its stated size, whether the
    index came before it, whether it is a fragment's: a moof box came before it); None for a whole
    file. The boxes read after such media data, if any, are bytes of it read as a box (a type of
    four letters can come of them): not an index, and not ending with the file. `boxes`: its
    top_level_boxes, where read already."""
    boxes = top_level_boxes(path) if boxes is None else boxes
    kinds = [kind for kind, _, _ in boxes]
    if "mdat" not in kinds:
        return None
    k = len(kinds) - 1 - kinds[::-1].index("mdat")
    _, start, size = boxes[k]
    _, last, last_size = boxes[-1]
    end = os.path.getsize(path)
    if last + last_size == end or "moov" in kinds[k + 1:]:
        return None  # whole, or damaged after the media data
    return start, size, "moov" in kinds[:k], "moof" in kinds[:k]


def boxes_to_the_end_near(path: str, at: int, within: int = 16 << 20) -> int | None:
    """The place nearest `at`, within `within` bytes of it, where a fragment's box (moof) starts from
    which boxes follow each other to the end of the file; None where there is none."""
    with open(path, "rb") as f:
        end = f.seek(0, 2)
        lo = f.seek(max(0, at - within))
        data = f.read(min(end, at + within) - lo)
        found, i = [], data.find(b"moof", 4)
        while i >= 4:
            found.append(lo + i - 4)
            i = data.find(b"moof", i + 1)
        for start in sorted(found, key=lambda x: abs(x - at)):
            boxes = list(_boxes_from(f, start))
            if boxes and boxes[-1][1] + boxes[-1][2] == end:
                return start
    return None


ISO_BOXES = re.compile(b"ftyp|moov|mdat|free|skip|wide")  # the top-level boxes a header is made of


def passed_over(n: int) -> str:
    """A stand-in's note for a file read from its byte `n` on: a whole file after bytes put before it."""
    return f"its first {n} bytes are no part of it (bytes put before its header): they were passed over"


def boxes_to_the_end(path: str, within: int = 1 << 20) -> tuple[int, str] | None:
    """The first place past the start of an ISO media file from which boxes follow each other to its
    last byte with the index (moov box) among them, and the first of those boxes' type: one of the
    header's boxes found in its first `within` bytes, else the index that ends the file (where the
    media data's box header was damaged too; the file's last bytes are read only then); None where
    there is none."""
    try:
        with open(path, "rb") as f:
            end = f.seek(0, 2)
            f.seek(0)
            named = [m.start() - 4 for m in ISO_BOXES.finditer(f.read(within)) if m.start() > 4]

            def to_the_end(at: int) -> str | None:  # the first box's type, where they run to the end
                boxes = list(_boxes_from(f, at))
                whole = boxes and boxes[-1][1] + boxes[-1][2] == end and any(k == "moov" for k, _, _ in boxes)
                return boxes[0][0] if whole else None

            for at in named:
                if kind := to_the_end(at):
                    return at, kind
            if (at := index_start(path)) is not None and (kind := to_the_end(at)):
                return at, kind
    except OSError:
        return None
    return None


EBML = b"\x1a\x45\xdf\xa3"  # the ID of the header a Matroska (WebM) file starts with
SEGMENT = b"\x18\x53\x80\x67"  # the ID of the segment that follows it, which holds everything else


def ebml_size(data: bytes, at: int) -> tuple[int, int] | None:
    """(the value, the bytes it takes) of the EBML variable-length size at `data[at:]`; None where
    there is none (a zero first byte, or past the end)."""
    if at >= len(data) or not data[at]:
        return None
    n = 9 - data[at].bit_length()  # its length: one more than the leading zero bits of the first byte
    if at + n > len(data):
        return None
    return int.from_bytes(data[at:at + n], "big") & ((1 << (7 * n)) - 1), n


MATROSKA_HEAD = 256  # bytes read for a Matroska file's EBML header and its segment's ID and size


def _matroska_segment(head: bytes) -> tuple[int, int | None] | None:
    """Of a Matroska (WebM) file whose first bytes are `head`: where its segment's content starts, and
    the size the segment states (None where unknown: a live recording's, written as it went); None
    for any other file, or a header that does not fit in `head`."""
    header = ebml_size(head, 4) if head.startswith(EBML) else None
    if header is None:
        return None
    at = 4 + header[1] + header[0]
    size = ebml_size(head, at + 4) if head[at:at + 4] == SEGMENT else None
    if size is None:
        return None
    return at + 4 + size[1], None if _unknown(*size) else size[0]


def _unknown(value: int, length: int) -> bool:
    """Whether an EBML size `value` written in `length` bytes is the one that means "unknown": all ones."""
    return value == (1 << 7 * length) - 1


CLUSTER = b"\x1f\x43\xb6\x75"  # the ID of a Matroska cluster: the blocks of a few seconds of every stream
CRC32 = b"\xbf\x84"  # the ID and size of a CRC-32 element: its 4 bytes check the rest of the element it opens


def failed_clusters(path: str) -> tuple[tuple[int, int], ...]:
    """[start, end) byte ranges of the clusters of the Matroska file at `path` whose CRC-32 does not
    match their data: bytes in them changed (a bit flipped, a bad sector read back) since the file was
    written. Clusters without a checksum, and a last one cut short (a file cut short: its frames
    are whole, see lost_data), are not checked; the walk stops where the segment's elements cannot be
    followed (a size unknown or past the end). Empty for any other file, or one that cannot be read."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return ()
    return _failed_clusters(path, st.st_size, st.st_mtime_ns) if stat.S_ISREG(st.st_mode) else ()


@functools.lru_cache(maxsize=4)  # a source's probe and its decoding read it once
def _failed_clusters(path: str, size: int, _mtime_ns: int) -> tuple[tuple[int, int], ...]:
    failed = []
    try:
        with open(path, "rb") as f:
            segment = _matroska_segment(f.read(MATROSKA_HEAD))
            if segment is None:
                return ()
            at = segment[0]
            while at < size:  # the segment's elements, one after the other
                f.seek(at)
                element = f.read(12)
                id_bytes = 9 - element[0].bit_length() if element else 9
                stated = ebml_size(element, id_bytes) if id_bytes <= 4 else None
                if stated is None:
                    break
                n, size_bytes = stated
                body = at + id_bytes + size_bytes
                if _unknown(n, size_bytes) or body + n > size:
                    break
                if element[:id_bytes] == CLUSTER and element[id_bytes + size_bytes:][:2] == CRC32:
                    f.seek(body)
                    data = f.read(n)
                    if zlib.crc32(memoryview(data)[6:]) != int.from_bytes(data[2:6], "little"):
                        failed.append((body, body + n))
                at = body + n
    except OSError:
        return tuple(failed)
    return tuple(failed)
