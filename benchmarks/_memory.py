"""Process memory readings shared by the benchmarks (Linux ``/proc/self/status``)."""

from __future__ import annotations

import resource
import threading


def status_mb(field: str) -> float:
    """``VmHWM`` (peak), ``VmRSS`` or ``RssAnon`` of this process in MB; not ru_maxrss, which Linux
    carries across exec, so a child would report its parent's peak (used only where /proc lacks it)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class AnonPeak:
    """Samples this process's anonymous RSS (``RssAnon``: what it allocated, not the page cache it
    mapped) every 10 ms while running (``resume()`` .. ``pause()``) and keeps the peak, in MB.

    A peer samples only during its own epochs: idle between them, a dozen peers' samplers waking
    100 times a second would take CPU from the peer that is being timed."""

    def __init__(self, running: bool = True) -> None:
        self.peak_mb = 0.0
        self._stop = threading.Event()
        self._running = threading.Event()
        if running:
            self._running.set()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._running.wait()
            if self._stop.wait(0.01):
                break
            if self._running.is_set():
                self.peak_mb = max(self.peak_mb, status_mb("RssAnon"))

    def resume(self) -> None:
        self._running.set()

    def pause(self) -> None:
        self._running.clear()
        self.peak_mb = max(self.peak_mb, status_mb("RssAnon"))

    def stop(self) -> float:
        self._stop.set()
        self._running.set()
        self._thread.join()
        self.peak_mb = max(self.peak_mb, status_mb("RssAnon"))
        return self.peak_mb
