"""Deadlines for work that has no solver to hand a time limit to.

The classic strategies, the simulator's walk over stages and the schedule builders run plain Python
and numpy; on graphs of many thousand nodes they take minutes. A caller with a time limit opens a
:func:`deadline_scope`; their long loops call :func:`check_deadline`, which raises
:class:`~checkmate.errors.TimeLimitError` once it has passed, so the limit holds at any graph size.
Outside a scope :func:`check_deadline` does nothing (the final validation of a result is never cut
short). The deadline is per thread (a context variable).
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from typing import Iterator

from checkmate.errors import TimeLimitError

__all__ = ["deadline_scope", "check_deadline", "no_deadline", "seconds_left"]

# The deadline (a time.perf_counter() value) of the strategy running in this thread, if any. The
# classic strategies have no solver to hand a time limit to; their long loops (schedule searches, the
# simulator's walk over stages) call check_deadline() instead, so a limit holds at any graph size.
_DEADLINE: contextvars.ContextVar[tuple[float, str] | None] = contextvars.ContextVar("checkmate_deadline",
                                                                                     default=None)


@contextlib.contextmanager
def deadline_scope(deadline: float | None, what: str = "the strategy") -> Iterator[None]:
    """Within the block, :func:`check_deadline` raises :class:`~checkmate.errors.TimeLimitError` once
    ``deadline`` (a ``time.perf_counter()`` value) has passed. An enclosing, earlier deadline stays."""
    current = _DEADLINE.get()
    if deadline is None or (current is not None and current[0] <= deadline):
        yield
        return
    token = _DEADLINE.set((deadline, what))
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def check_deadline() -> None:
    """Raise :class:`~checkmate.errors.TimeLimitError` if the current deadline has passed."""
    current = _DEADLINE.get()
    if current is not None and time.perf_counter() > current[0]:
        raise TimeLimitError(f"{current[1]} reached its time limit before it had a schedule; "
                             "raise the time limit or choose another strategy")


def seconds_left() -> float | None:
    """Seconds until the current deadline (at least 0), or None outside a scope: for work handed to
    a solver that takes a time limit of its own."""
    current = _DEADLINE.get()
    return None if current is None else max(current[0] - time.perf_counter(), 0.0)


@contextlib.contextmanager
def no_deadline() -> Iterator[None]:
    """Lift any deadline inside the block: for checks of a finished result, which must not be cut short."""
    token = _DEADLINE.set(None)
    try:
        yield
    finally:
        _DEADLINE.reset(token)

