"""checkmate.tf2 asks TensorFlow for oneDNN's CPU kernels before it starts (x86-64), keeps a value the
user set, and says so when a process that imported TensorFlow first runs Eigen's."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

pytest.importorskip("tensorflow")

pytestmark = [pytest.mark.tf,
              pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86-64 only")]

PROBE = """
import json, os, sys
{first}
import checkmate.tf2
from checkmate.tf2 import _compat
from checkmate.tf2.memory import onednn_note
print(json.dumps({{"env": os.environ.get("TF_ENABLE_ONEDNN_OPTS"), "onednn": _compat.onednn_enabled(),
                  "note": onednn_note()}}))
"""


def probe(first: str = "", **env: str) -> dict:
    environment = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    environment.update(env)
    out = subprocess.run([sys.executable, "-c", PROBE.format(first=first)], capture_output=True, text=True,
                         env=environment, timeout=300, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_checkmate_tf2_imported_first_runs_onednn_kernels():
    got = probe()
    assert got["env"] == "1" and got["onednn"] is True and got["note"] is None


def test_a_value_the_user_set_is_kept_and_eigen_kernels_are_named():
    got = probe(TF_ENABLE_ONEDNN_OPTS="0")
    assert got["env"] == "0" and got["onednn"] is False
    assert "Eigen" in got["note"] and "TF_ENABLE_ONEDNN_OPTS=1" in got["note"]


def test_tensorflow_imported_first_keeps_its_default():
    got = probe(first="import tensorflow")
    assert got["env"] is None
    # TF's own default: oneDNN on CPUs with AVX-512, Eigen elsewhere; the note says which
    assert (got["note"] is None) == bool(got["onednn"])


def test_profiles_are_cached_apart_for_eigen_kernels():
    code = "from checkmate.tf2 import profiling; print(profiling.device_description())"
    environment = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    described = {}
    for value in ("0", "1"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True,
                             env={**environment, "TF_ENABLE_ONEDNN_OPTS": value}).stdout
        described[value] = out.strip().splitlines()[-1]
    assert described["0"].endswith(" | kernels=eigen") and "kernels=" not in described["1"]
