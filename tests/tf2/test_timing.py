"""Interleaved timing of several step functions in one process."""

from __future__ import annotations

import pytest

tf = pytest.importorskip("tensorflow")

from checkmate.tf2.timing import interleaved_times  # noqa: E402

pytestmark = pytest.mark.tf


def test_each_round_starts_one_function_further_on():
    """No function is always called first in a round, or always right after the same other one."""
    calls = []

    def recorder(name):
        def fn(*args):
            calls.append(name)
            return tf.constant(0.0)
        return fn

    walls, cpus = interleaved_times([recorder("a"), recorder("b"), recorder("c")], repeats=6)
    assert len(walls) == len(cpus) == 3 and all(w >= 0 for w in walls)
    warmup, timed = calls[:3], calls[3:]
    assert warmup == ["a", "b", "c"] and len(timed) == 18
    rounds = [timed[k:k + 3] for k in range(0, 18, 3)]
    assert all(sorted(r) == ["a", "b", "c"] for r in rounds)
    assert [r[0] for r in rounds] == ["a", "b", "c", "a", "b", "c"]
    followers = {(r[j], r[j + 1]) for r in rounds for j in range(2)}
    assert ("a", "b") in followers and ("c", "a") in followers


def test_a_slower_function_measures_slower():
    import time

    def fast(*args):
        return tf.constant(0.0)

    def slow(*args):
        time.sleep(0.005)
        return tf.constant(0.0)

    (fast_s, slow_s), _ = interleaved_times([fast, slow], repeats=5)
    assert slow_s > fast_s + 0.004
