"""A long-lived child process that runs one job at a time, so that a job which crashes the
interpreter (a decoder segfault on a corrupt stream) or hangs costs that job an error, not the
caller.

The parent sends `(function, args)` and reads back `(ok, result or message)`, each a pickle with an
8-byte length prefix, over the child's stdin/stdout. Only this package's own parent and child
exchange these pickles. The child is a fresh interpreter (`python -m curator.sandbox`), not a fork
or a multiprocessing spawn, so it never re-imports its parent's main module.
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
import time

_HEADER = struct.Struct("<Q")


class SandboxError(Exception):
    """The job did not return: the child died or ran out of time. The message says which."""


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

    def run(self, func: str, *args, timeout_s: float | None = None):
        """Call `func` ("module:function") with `args` in the child; its result, or SandboxError."""
        self.start()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            _write(self.proc.stdin, (func, args))
            fd = self.proc.stdout.fileno()
            (size,) = _HEADER.unpack(_read_exact(fd, _HEADER.size, deadline))
            ok, value = pickle.loads(_read_exact(fd, size, deadline))
        except TimeoutError:
            self.close()
            raise SandboxError(f"timed out after {timeout_s}s") from None
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
    # The protocol owns the real stdout; anything a library prints goes to stderr instead.
    out = os.fdopen(os.dup(1), "wb")
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
            _write(out, (True, funcs[func](*args)))
        except Exception as e:  # the job's own failure travels back as its message
            _write(out, (False, f"{type(e).__name__}: {e}"))


if __name__ == "__main__":
    _serve(sys.argv[1] if len(sys.argv) > 1 else None)
