"""Progress of a run: one bar per phase of work with an honest total, or periodic lines on stderr.

A workload declares each phase of its work with its real total (`ctx.progress.phase("serve hccl",
total=60, unit="s")`) and advances it; on a terminal this drives a tqdm bar, elsewhere (piped
output, CI, a cluster job) a line goes to stderr at most every `interval_s` seconds and at each
phase's end, so a long run is never silent. Every phase's wall time also goes to the run log.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

log = logging.getLogger("stratacl")


class Progress:
    def __init__(self, label: str, enabled: bool = True, tty: bool | None = None,
                 interval_s: float = 10.0) -> None:
        self.label = label
        self.enabled = enabled
        self.tty = sys.stderr.isatty() if tty is None else tty
        self.interval_s = interval_s
        self._bar: Any = None
        self._name = ""
        self._total = 0.0
        self._done = 0.0
        self._unit = ""
        self._t0 = self._last = time.perf_counter()

    def phase(self, name: str, total: float, unit: str = "") -> Progress:
        """Start a phase of work of `total` units (closing the previous one)."""
        self._end_phase()
        self._name, self._total, self._done, self._unit = name, float(total), 0.0, unit
        self._t0 = self._last = time.perf_counter()
        if self.enabled and self.tty:
            from tqdm import tqdm

            self._bar = tqdm(total=self._total, desc=f"{self.label}: {name}", unit=unit or "it", leave=False)
        elif self.enabled:
            self._line()
        return self

    def __call__(self, n: float = 1.0) -> None:
        """Advance the current phase by `n` units (never past its total)."""
        step = max(0.0, min(float(n), self._total - self._done))
        self._done += step
        if self._bar is not None:
            self._bar.update(step)
        elif self.enabled and not self.tty and time.perf_counter() - self._last >= self.interval_s:
            self._line()

    def close(self, failed: bool = False) -> None:
        """End the last phase; after a failure only the log hears of it (the error says the rest)."""
        if failed:
            self.enabled = False
        self._end_phase()

    def _line(self, end: bool = False) -> None:
        self._last = time.perf_counter()
        if end:  # a phase that ended finished its work, however far the workload advanced the count
            print(f"[{self.label}] {self._name}: done in {self._last - self._t0:.1f} s", file=sys.stderr, flush=True)
            return
        pct = 100.0 * self._done / self._total if self._total else 0.0
        print(f"[{self.label}] {self._name}: {pct:3.0f}% ({self._done:g}/{self._total:g} {self._unit}) "
              f"{self._last - self._t0:.1f} s", file=sys.stderr, flush=True)

    def _end_phase(self) -> None:
        if not self._name:
            return
        if self._bar is not None:
            self._bar.leave = False
            self._bar.close()
            self._bar = None
        elif self.enabled and not self.tty:
            self._line(end=True)
        log.info("phase %s: %g/%g %s in %.2f s", self._name, self._done, self._total, self._unit,
                 time.perf_counter() - self._t0)
        self._name = ""
