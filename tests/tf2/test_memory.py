"""measure_peak_memory: the device allocator's peak during one call, above what was already allocated.

Sizes are powers of two of at least 256 KiB: TF's default CPU allocator counts only allocations from
256 KiB up (and rounds some others up), so such sizes are measured exactly.
"""

from __future__ import annotations

import pytest

tf = pytest.importorskip("tensorflow")

from isolation import ran_in_fresh_process  # noqa: E402
from checkmate.tf2 import _compat  # noqa: E402
from checkmate.tf2.memory import (  # noqa: E402
    available_device_memory,
    default_device,
    measure_peak_memory,
    measure_step,
)

pytestmark = pytest.mark.tf

MIB = 2**20
FLOATS_PER_MIB = MIB // 4


@tf.function
def two_temporaries(x):
    # a (4 MiB) and b (4 MiB) are alive together; the 1 MiB result is returned.
    a = tf.tile(x, [4]) + 1.0
    b = a * 2.0
    return tf.reduce_sum(tf.reshape(a + b, [16, -1]), axis=0)


def test_peak_of_a_known_function(request):
    # in a fresh process: the allocator's chunk rounding depends on what earlier tests allocated
    if ran_in_fresh_process(request):
        return
    x = tf.ones([FLOATS_PER_MIB])          # 1 MiB, allocated before the call: not counted
    m = measure_step(two_temporaries, x, repeats=3, reduce="min")
    assert m.device == default_device()
    # a and b (4 MiB each) plus a + b (4 MiB) while the sum runs; the 256 KiB result may or may not
    # be counted depending on where the reduction lands; oneDNN may reuse a's buffer in place.
    assert 8 * MIB <= m.peak_bytes <= 12.25 * MIB
    assert m.absolute_peak_bytes >= m.baseline_bytes + m.peak_bytes


def test_resident_tensors_and_previous_outputs_are_excluded(request):
    if ran_in_fresh_process(request):
        return
    big = tf.ones([8 * FLOATS_PER_MIB])     # 8 MiB resident for the whole test

    @tf.function
    def make(x):
        return tf.tile(x, [2])              # 2 MiB output

    x = tf.ones([FLOATS_PER_MIB])
    # min over repeats: the statistics are process-wide and earlier tests may leave threads running
    first = measure_peak_memory(make, x, repeats=3, reduce="min")
    second = measure_peak_memory(make, x, repeats=3, reduce="min")
    assert first == second == 2 * MIB
    assert measure_peak_memory(make, x, repeats=2) >= first
    assert big.shape[0] == 8 * FLOATS_PER_MIB


def test_python_callables_and_eager_ops(request):
    if ran_in_fresh_process(request):
        return
    def eager(x):
        y = x * 3.0                         # 1 MiB
        return y + 1.0                      # 1 MiB, y still alive

    assert measure_peak_memory(eager, tf.ones([FLOATS_PER_MIB]), repeats=3, reduce="min") == 2 * MIB
    with pytest.raises(ValueError):
        measure_peak_memory(eager, tf.ones([FLOATS_PER_MIB]), reduce="mean")


def test_available_memory_is_positive():
    assert available_device_memory() > 0
    assert available_device_memory("CPU:0") > 2**20


def test_grappler_scope_is_reentrant_and_restores(monkeypatch):
    """The block a generated step runs in keeps Grappler on and switches off exactly the passes in
    PLAN_BREAKING_PASSES (here one, to exercise it), nested or not, restoring them on the way out."""
    monkeypatch.setitem(_compat.PLAN_BREAKING_PASSES, "dependency_optimization", False)
    before = tf.config.optimizer.get_experimental_options()
    with _compat.grappler_disabled():
        with _compat.grappler_disabled():
            inside = tf.config.optimizer.get_experimental_options()
            assert inside["dependency_optimization"] is False
            assert not inside.get("disable_meta_optimizer", False)
        assert tf.config.optimizer.get_experimental_options()["dependency_optimization"] is False
    assert tf.config.optimizer.get_experimental_options() == before
    with pytest.raises(RuntimeError):
        with _compat.grappler_disabled():
            raise RuntimeError("boom")
    assert tf.config.optimizer.get_experimental_options() == before
