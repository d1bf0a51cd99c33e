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


def test_counters_see_the_pages_a_call_touches_fresh():
    """A call that first-touches a fresh 64 MiB buffer (over glibc's largest mmap threshold, so mapped
    and unmapped on every call) counts page faults on every call; one that reuses a buffer counts none
    to speak of."""
    import numpy as np

    from checkmate.tf2.timing import interleaved_counters

    kept = np.zeros(2 ** 20)

    def fresh(*args):
        np.ones(64 * 2 ** 20 // 8)           # np.ones writes every page of a new mapping
        return tf.constant(0.0)

    def reused(*args):
        kept.fill(1.0)
        return tf.constant(0.0)

    fresh_counts, reused_counts = interleaved_counters([fresh, reused], repeats=5)
    # 64 MiB is 16384 pages of 4 KiB, or 32 transparent huge pages of 2 MiB where the kernel uses them
    assert fresh_counts.minor_faults >= 32
    assert reused_counts.minor_faults < fresh_counts.minor_faults / 4
    assert fresh_counts.wall_s > 0 and fresh_counts.cpu_s > 0 and fresh_counts.major_faults >= 0


def test_counters_call_in_rounds_like_the_timing():
    from checkmate.tf2.timing import interleaved_counters

    calls = []

    def recorder(name):
        def fn(*args):
            calls.append((name, args))
            return tf.constant(0.0)
        return fn

    counts = interleaved_counters([recorder("a"), recorder("b")], 7, repeats=4)
    assert len(counts) == 2
    assert [c[0] for c in calls] == ["a", "b", "a", "b", "b", "a", "a", "b", "b", "a"]
    assert all(args == (7,) for _, args in calls)
