"""CP-SAT next to TensorFlow: a clear BackendUnavailableError, not a crashed process."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.tf

SCRIPT = """
import tensorflow as tf
import checkmate
from checkmate.synthetic import chain
try:
    checkmate.solve(chain(4), "70%", strategy="checkmate_milp", solver="ortools", time_limit_s=10)
except checkmate.BackendUnavailableError as exc:
    print("refused:", exc)
"""


def test_ortools_refuses_when_tensorflow_is_loaded():
    pytest.importorskip("ortools")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "refused:" in proc.stdout and "TensorFlow" in proc.stdout
