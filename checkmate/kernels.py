"""Which CPU kernels TensorFlow runs: oneDNN's, whose temporaries the memory plan accounts for.

TensorFlow's x86-64 wheels run oneDNN's CPU kernels by default only on CPUs with AVX-512; on others
(AMD Zen 2, older Intel parts: AVX2 only) they run Eigen's, unless ``TF_ENABLE_ONEDNN_OPTS=1`` is set
before TensorFlow starts. Eigen's convolution gradients allocate workspaces that no graph shows: on a
Zen 2 CPU the residual CNN of ``make demo`` measured a plain step peak of 55.20 MiB against the
26.00 MiB its graph holds, and a plan for 12.01 MiB measured 45.17 MiB; with oneDNN's kernels 26.01
and 12.02 MiB. So ``checkmate.tf2`` and the commands that lower Keras models ask TensorFlow for
oneDNN's kernels on x86-64 when TensorFlow is not imported yet and the variable is unset
(:func:`prefer_onednn`); a value the user set is kept, and a process that imported TensorFlow
first keeps what it got (:func:`checkmate.tf2.memory.onednn_note` says so). This module imports no
TensorFlow.
"""

from __future__ import annotations

import os
import platform
import sys

__all__ = ["ONEDNN_ENV", "X86_MACHINES", "prefer_onednn"]

ONEDNN_ENV = "TF_ENABLE_ONEDNN_OPTS"
X86_MACHINES = ("x86_64", "amd64", "x86", "i686")


def prefer_onednn() -> bool:
    """Set ``TF_ENABLE_ONEDNN_OPTS=1`` for a TensorFlow not started yet on an x86 CPU, unless set;
    whether it was set here."""
    if "tensorflow" in sys.modules or ONEDNN_ENV in os.environ or platform.machine().lower() not in X86_MACHINES:
        return False
    os.environ[ONEDNN_ENV] = "1"
    return True
