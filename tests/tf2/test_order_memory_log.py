"""A step's peak read from TF's allocation log (experiments/step_order.py --memory-log): the bytes its
kernels asked for, which the plan predicts, against the bytes of the allocator's chunks, which a measured
peak counts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "experiments"))

from step_order import MEMORY_LOG_VMODULE, allocation_peaks  # noqa: E402

pytestmark = pytest.mark.tf


def _alloc(i, asked, chunk):
    return (f'I0 log_memory.cc:34] __LOG_MEMORY__ MemoryLogTensorAllocation {{ step_id: 5 kernel_name: "k{i}" '
            f'tensor {{ dtype: DT_FLOAT shape {{ dim {{ size: 4 }} }} allocation_description {{ requested_bytes: '
            f'{asked} allocated_bytes: {chunk} allocator_name: "cpu" allocation_id: {i} has_single_reference: true '
            f'ptr: 1 }} }} }}')


def _free(i, raw=False):
    kind = "Raw" if raw else "Tensor"
    return f'I0 log_memory.cc:34] __LOG_MEMORY__ MemoryLog{kind}Deallocation {{ allocation_id: {i} allocator_name: "cpu" }}'


def test_allocation_peaks_separates_asked_bytes_from_chunks_and_finds_what_the_step_keeps():
    log = "\n".join([
        _free(99),                                   # allocated before the log: not the step's
        _alloc(1, 1000, 1024),                       # kept to the end (a step output)
        _alloc(2, 3000, 5120),                       # a large chunk handed to a smaller request
        'I0 __LOG_MEMORY__ MemoryLogRawAllocation { step_id: 5 operation: "scratch" num_bytes: 512 ptr: 2 '
        'allocation_id: 3 allocator_name: "cpu" }',
        _free(3, raw=True),
        _free(2),
        _alloc(4, 4000, 4096),
        "an unrelated line",
    ])
    peaks = allocation_peaks(log)
    # asked: 1000 + 3000 + 512 = 4512 at once, later 1000 + 4000 = 5000
    assert peaks["tensor_peak_bytes"] == 5000
    # chunks: 1024 + 5120 + 512 = 6656 at once (their peak), later 1024 + 4096 = 5120
    assert peaks["chunk_peak_bytes"] == 6656
    # at the chunk peak: 24 + 2120 + 0 bytes beyond what was asked; of them, only tensor 1 is still allocated
    assert peaks["chunk_excess_bytes"] == 24 + 2120
    assert peaks["kept_chunk_excess_bytes"] == 24


def test_allocation_peaks_of_an_empty_log_are_zero():
    assert allocation_peaks("") == {"tensor_peak_bytes": 0, "chunk_peak_bytes": 0, "chunk_excess_bytes": 0,
                                    "kept_chunk_excess_bytes": 0}


_SCRIPT = r"""
import json, sys
sys.path[:0] = [sys.argv[1], sys.argv[2]]
from step_order import logged_step_peaks, start_memory_log
start_memory_log()
import keras, tensorflow as tf
from checkmate.solvers.baselines import checkpoint_all_schedule
from checkmate.tf2.codegen import generate
from checkmate.tf2.lowering import lower
from checkmate.tf2.memory import measure_step
from checkmate.tf2.step import predicted_step_peak
keras.utils.set_random_seed(0)
layers = keras.layers
inp = keras.Input((16, 16, 3))
x = layers.Conv2D(8, 3, padding="same")(inp)
branches = [layers.Conv2D(8, k, padding="same", activation="relu")(x) for k in (1, 3)]
branches.append(layers.AveragePooling2D(3, 1, padding="same")(x))
x = layers.Concatenate()(branches)
out = layers.Dense(10)(layers.GlobalAveragePooling2D()(x))
model = keras.Model(inp, out)
loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
xs, ys = tf.TensorSpec((4, 16, 16, 3)), tf.TensorSpec((4,), tf.int32)
lowered = lower(model, loss, xs, ys, level="layer")
schedule = checkpoint_all_schedule(lowered.graph)
fn = generate(lowered, schedule, order="total")
x = tf.random.stateless_normal((4, 16, 16, 3), seed=(1, 2))
y = tf.constant([0, 1, 2, 3])
flat = fn.flat_args(x, y)
logged = logged_step_peaks(fn.call_flat, *flat)
measured = measure_step(fn.call_flat, *flat).peak_bytes
print(json.dumps({**logged, "measured": int(measured), "predicted": int(predicted_step_peak(lowered, schedule))}))
"""


def test_the_logged_chunk_peak_is_what_the_allocator_measures():
    """In a fresh process with TF's allocation log on: the chunk peak of the log is the allocator's own peak
    statistic for the same step (both count chunks; the log starts after the resident bytes, as a measured
    peak does), and the bytes asked for are at most the chunks."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, str(REPO / "experiments"), str(REPO)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["tensor_peak_bytes"] > 0, ("no allocation was logged: TF_CPP_VMODULE must be "
                                          f"{MEMORY_LOG_VMODULE!r} when TF starts", got)
    assert got["tensor_peak_bytes"] <= got["chunk_peak_bytes"]
    assert 0 <= got["kept_chunk_excess_bytes"] <= got["chunk_excess_bytes"]
    assert abs(got["chunk_peak_bytes"] - got["measured"]) <= 0.02 * got["measured"], got
    # the plan's memory model counts the tensors' bytes: the logged asked-for peak is within it
    assert got["tensor_peak_bytes"] <= got["predicted"], got
