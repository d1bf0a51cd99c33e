"""Run a memory-measuring test in a fresh Python process.

The allocator's statistics are process-wide, and what earlier tests leave behind in the same process
(cached kernels, buffers of the eager runtime, the default CPU allocator's bookkeeping) shifts a
measured peak by whole allocation units. A peak is only comparable with a prediction when measured in
a process that has done nothing else, as a user's training script would be.
"""

from __future__ import annotations

import os
import subprocess
import sys

_MARK = "CHECKMATE_ISOLATED_TEST"


def ran_in_fresh_process(request) -> bool:
    """Inside the fresh process: False (run the test body). Otherwise run the test in a fresh process,
    fail with its output if it failed, and return True (the caller returns at once)."""
    nodeid = request.node.nodeid
    if os.environ.get(_MARK) == nodeid:
        return False
    # "-m": the default run deselects slow tests, and this one was selected already
    proc = subprocess.run([sys.executable, "-m", "pytest", nodeid, "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "-m", "slow or not slow"],
                          cwd=str(request.config.rootpath), env={**os.environ, _MARK: nodeid},
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{nodeid} failed in a fresh process:\n{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}"
    return True
