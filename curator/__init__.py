"""vfm's curation stage: raw videos to webdataset shards (see curator/pipeline.py)."""

from __future__ import annotations

import sys


def tolerant_stdio() -> None:
    """Let stdout and stderr write what their encoding cannot, as backslash escapes, rather than
    fail on it. A file name that is not UTF-8 (from an old Windows or FAT drive, out of a zip) is
    a str with surrogates in Python, and under a UTF-8 locale such as en_US.UTF-8 printing it
    raised UnicodeEncodeError: the log line of that source ended the run."""
    for stream in (sys.stdout, sys.stderr):
        if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
