"""Peak resident memory of a process and all its descendants, sampled every 50 ms (a helper of the
benchmarks, not a benchmark: run_all.py skips files starting with '_')."""

from __future__ import annotations

import contextlib
import threading
import time


class PeakRSS:
    def __init__(self, pid: int):
        import psutil

        self.proc, self.peak, self._stop = psutil.Process(pid), 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            with contextlib.suppress(psutil.Error):  # a process may exit between listing and reading
                total = 0
                for p in [self.proc, *self.proc.children(recursive=True)]:
                    with contextlib.suppress(psutil.Error):
                        total += p.memory_info().rss
                self.peak = max(self.peak, total)
            time.sleep(0.05)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak
