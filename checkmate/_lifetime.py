"""Helper processes that end with the process they work for.

Checkmate starts helper processes (sweep workers, the CP-SAT child of a MILP race). If the process
they work for is killed (``SIGKILL``, an out-of-memory kill, a closed terminal), nothing runs in it to
stop them, and a solve in native code would keep them busy for its whole time limit. Each helper
therefore watches the process it works for itself, in two ways:

- on Linux, the kernel's parent-death signal (``prctl(PR_SET_PDEATHSIG)``) kills the helper as soon
  as the process that started it ends;
- a watchdog thread checks, every :data:`WATCH_INTERVAL_S`, that the process it works for is still
  running (also when that is not its direct parent, as for pool workers forked by a forkserver) and
  ends the helper when it is not. It needs the interpreter lock, which the solvers release while they
  run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time

__all__ = ["die_with_parent", "watch_process", "process_alive", "WATCH_INTERVAL_S"]

# How often a watchdog looks at the process it works for: a helper outlives it by at most this much.
WATCH_INTERVAL_S = 0.25
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def _start_time(pid: int) -> str | None:
    """The start time of ``pid`` in clock ticks since boot (field 22 of /proc/PID/stat), which tells
    a process apart from a later one that reuses its pid."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            text = fh.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # the command name may contain spaces
    return fields[19] if len(fields) > 19 else None


def process_alive(pid: int, start_time: str | None = None) -> bool:
    """Whether ``pid`` is running (a zombie, waiting to be reaped, is not); with ``start_time``, also
    that it is the same process as when that was read."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            text = fh.read()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc (not Linux): ask the kernel whether the pid exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    fields = text[text.rindex(")") + 2:].split()
    if fields[0] in ("Z", "X"):
        return False
    return start_time is None or (len(fields) > 19 and fields[19] == start_time)


_prctl = None


def _load_prctl():
    """libc's ``prctl``, looked up once."""
    global _prctl
    if _prctl is None and sys.platform.startswith("linux"):
        try:
            import ctypes

            _prctl = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):
            _prctl = False
    return _prctl or None


def _set_parent_death_signal(signum: int) -> bool:
    prctl = _load_prctl()
    return prctl is not None and prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0


def watch_process(pid: int, on_exit=None, *, interval_s: float = WATCH_INTERVAL_S) -> threading.Thread:
    """Start a daemon thread that calls ``on_exit()`` (default: end this process at once, exit code 1)
    when process ``pid`` is no longer running."""
    start = _start_time(pid)

    def watch() -> None:
        while process_alive(pid, start):
            time.sleep(interval_s)
        if on_exit is not None:
            on_exit()
        else:
            os._exit(1)

    thread = threading.Thread(target=watch, name=f"checkmate-watch-{pid}", daemon=True)
    thread.start()
    return thread


def die_with_parent(owner_pid: int | None = None, on_owner_exit=None) -> None:
    """Make this (helper) process end when the process it works for ends.

    ``owner_pid`` is that process (default: the parent). Sets the parent-death signal where the
    platform has one, so the kernel kills this process when its parent ends, then starts a watchdog
    on ``owner_pid``. Call it first thing in the helper. If the owner is already gone (it died while
    this process started), this process ends here. ``on_owner_exit()``, if given, runs in the watchdog
    before this process ends (to remove what the owner can no longer remove).
    """
    parent = os.getppid()
    owner = parent if owner_pid is None else int(owner_pid)
    _set_parent_death_signal(signal.SIGKILL)
    # the parent may have died before the signal was armed: the kernel would then never send it
    if os.getppid() != parent or not process_alive(owner):
        os._exit(1)

    def end() -> None:
        if on_owner_exit is not None:
            with contextlib.suppress(Exception):
                on_owner_exit()
        os._exit(1)

    watch_process(owner, end)
