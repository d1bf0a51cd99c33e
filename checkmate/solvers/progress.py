"""A live status line for one long solve: what it is doing, for how long, and how far it may be off.

A solve with the defaults may run for minutes (the time limit is ten minutes). :class:`SolveProgress`
shows one tqdm line on stderr once the solve has run for ``_DELAY_S`` seconds: the phase (LP
relaxation, rounding, local search, branch and bound), the time so far and, during branch and bound,
the best cost, the proven bound and the gap between them. The line is removed when the solve ends, so
what the caller prints next (the CLI's summary) stands alone.

It is on when ``SolveOptions.progress`` is True, or when that is None (the default) and stderr is a
terminal or ``CHECKMATE_PROGRESS`` is set in the environment.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time

__all__ = ["SolveProgress", "progress_wanted"]

# Solves shorter than this never show the line (most solves of small graphs take well under it).
_DELAY_S = 2.0
# The line is redrawn at most this often (the solver's callback fires thousands of times a second).
_REFRESH_S = 0.5


def progress_wanted(option: bool | None) -> bool:
    """Whether a solve shows its status line (see the module docstring)."""
    if option is not None:
        return bool(option)
    if os.environ.get("CHECKMATE_PROGRESS"):
        return True
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):   # replaced or closed stream
        return False


class SolveProgress:
    """The status line of one solve; a no-op when not ``enabled``. Use as a context manager.

    A daemon thread redraws the line every ``_REFRESH_S`` so that its clock runs during phases that
    report nothing (the local search); native solver calls that hold the interpreter lock pause it
    (HiGHS' run releases it; branch and bound also reports its bounds from its callback).
    """

    def __init__(self, enabled: bool, desc: str, *, cost_scale: float = 1.0):
        #: cost units per model unit of the bounds reported (settable once the model is built)
        self.cost_scale = cost_scale
        self._bar = None
        self._enabled = enabled
        self._desc = desc
        self._phase = ""
        self._detail = ""
        self._start = time.perf_counter()
        self._last = -math.inf
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        if enabled:
            threading.Thread(target=self._tick, daemon=True, name="checkmate-progress").start()

    @property
    def enabled(self) -> bool:
        return self._enabled

    def _tick(self) -> None:
        while not self._stopped.wait(_REFRESH_S):
            self._draw(force=True)

    def _draw(self, force: bool = False) -> None:
        with self._lock:
            now = time.perf_counter()
            if not self._enabled or now - self._start < _DELAY_S or (not force and now - self._last < _REFRESH_S):
                return
            self._last = now
            text = ", ".join(p for p in (self._phase, self._detail) if p)
            if self._bar is None:
                # created on first show (tqdm's own delay is not honoured by explicit refreshes, and a
                # bar never shown is not cleared by close)
                from tqdm.auto import tqdm

                self._bar = tqdm(total=None, desc=self._desc, bar_format="{desc}: {elapsed}{postfix}",
                                 postfix=text, file=sys.stderr, leave=False, dynamic_ncols=True)
                # the clock counts from the solve's start (tqdm's own clock is the wall clock)
                self._bar.start_t = time.time() - (now - self._start)
            self._bar.set_postfix_str(text, refresh=True)

    def phase(self, text: str) -> None:
        """The solve moved on to ``text``."""
        self._phase, self._detail = text, ""
        self._draw(force=True)

    def bounds(self, best: float | None, bound: float | None) -> None:
        """Best cost and proven bound in the model's units (either may be unknown: None or infinite)."""
        if not self._enabled:
            return
        parts = []
        best_ok = best is not None and math.isfinite(best)
        bound_ok = bound is not None and math.isfinite(bound)
        if best_ok:
            parts.append(f"best {best * self.cost_scale:.6g}")
        if bound_ok:
            parts.append(f"bound {bound * self.cost_scale:.6g}")
        if best_ok and bound_ok and best > 0:
            parts.append(f"gap {max(best - bound, 0.0) / best:.2%}")
        self._detail = ", ".join(parts)
        self._draw()

    def close(self) -> None:
        self._stopped.set()
        with self._lock:
            self._enabled = False
            if self._bar is not None:
                self._bar.close()
                self._bar = None

    def __enter__(self) -> "SolveProgress":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
