"""A long-lived child process that runs one job at a time, so that a job which crashes the
interpreter (a decoder segfault on a corrupt stream) or hangs costs that job an error, not the
caller.

The parent sends `(function, args)` and reads back `(ok, result or message)`, each a pickle with an
8-byte length prefix, over the child's stdin/stdout; before that, `(None, note)` whenever the job
reports progress (`progress(note)`; the note, if any, says how far it is). The timeout is on time
without progress, so a long source takes as long as it needs while a hung decoder is stopped. Only
this package's own parent and child exchange these pickles. The child is a fresh interpreter
(`python -m curator.sandbox`), not a fork or a multiprocessing spawn, so it never re-imports its
parent's main module.
"""

from __future__ import annotations

import importlib
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

_HEADER = struct.Struct("<Q")
_PROGRESS_EVERY_S = 1.0
_child_out = None  # in a sandbox child: the stream to the parent
_child_lock = threading.Lock()
_last_progress = 0.0


def progress(note=None) -> None:
    """Tell the parent that the job is getting on (in a sandbox child; elsewhere it does nothing),
    and how far it is if `note` (something small to pickle) says. Cheap enough to call for every
    frame: at most one message a second goes out."""
    global _last_progress
    if _child_out is None:
        return
    now = time.monotonic()
    if now - _last_progress >= _PROGRESS_EVERY_S:
        _last_progress = now
        with _child_lock:
            _write(_child_out, (None, note))


@contextmanager
def keepalive():
    """Progress, once a second, through a stretch of work that cannot report its own (a model's
    forward passes over a whole source)."""
    stop = threading.Event()

    def beat():
        while not stop.wait(_PROGRESS_EVERY_S):
            progress()

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


class SandboxError(Exception):
    """The job did not return: the child died or stopped making progress. The message says which."""


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    chunks, left = [], n
    while left:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                raise TimeoutError
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _write(stream, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


class Sandbox:
    """`preload`: a module the child imports as soon as it starts (the jobs' own), so that a pool's
    children load their libraries while the pool is still being set up, not at their first job."""

    def __init__(self, preload: str | None = None):
        self.preload = preload
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        """Start the child now rather than at the first job; returns without waiting for it."""
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()

    def _start(self) -> subprocess.Popen:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        return subprocess.Popen([sys.executable, "-m", "curator.sandbox", *([self.preload] if self.preload else [])],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)

    def run(self, func: str, *args, timeout_s: float | None = None, on_progress=None):
        """Call `func` ("module:function") with `args` in the child; its result, or SandboxError.
        `timeout_s`: the longest the job may go without reporting progress (or returning);
        `on_progress`: called with each note the job's progress comes with."""
        self.start()
        try:
            _write(self.proc.stdin, (func, args))
            fd = self.proc.stdout.fileno()
            ok = None
            while ok is None:  # progress messages until the result
                deadline = None if timeout_s is None else time.monotonic() + timeout_s
                (size,) = _HEADER.unpack(_read_exact(fd, _HEADER.size, deadline))
                ok, value = pickle.loads(_read_exact(fd, size, deadline))
                if ok is None and value is not None and on_progress is not None:
                    on_progress(value)
        except TimeoutError:
            self.close()
            raise SandboxError(f"timed out: no progress for {timeout_s}s") from None
        except (EOFError, BrokenPipeError):
            code = self.proc.wait()
            self.proc = None
            how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            raise SandboxError(f"the process running it died ({how})") from None
        if not ok:
            raise SandboxError(value)
        return value

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def _serve(preload: str | None) -> None:
    global _child_out
    # The protocol owns the real stdout; anything a library prints goes to stderr instead.
    out = _child_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    if preload:
        try:
            importlib.import_module(preload)
        except Exception as e:  # noqa: BLE001 - the first job that needs it fails with its own message
            print(f"curator.sandbox: could not preload {preload}: {e}", file=sys.stderr)
    inp = sys.stdin.buffer
    funcs = {}
    while True:
        header = inp.read(_HEADER.size)
        if len(header) < _HEADER.size:
            return
        (size,) = _HEADER.unpack(header)
        func, args = pickle.loads(inp.read(size))
        try:
            if func not in funcs:
                module, name = func.split(":")
                funcs[func] = getattr(importlib.import_module(module), name)
            reply = (True, funcs[func](*args))
        except Exception as e:  # the job's own failure travels back as its message
            reply = (False, f"{type(e).__name__}: {e}")
        with _child_lock:
            _write(out, reply)


if __name__ == "__main__":
    # Served from the module as the jobs import it, not from __main__, so that their progress()
    # finds the stream to the parent.
    from curator.sandbox import _serve as serve

    serve(sys.argv[1] if len(sys.argv) > 1 else None)
