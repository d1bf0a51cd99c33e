"""Reading where a program's time goes (profiling.trace_op_groups): groups of ops priced as a step's
nodes are, with how many ops ran beside each, as the look at a generated step's recomputed copies
uses it (experiments/wall_clock.py --trace-copies)."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from checkmate.tf2 import profiling  # noqa: E402

pytestmark = pytest.mark.tf

N = 384


def _matmuls(names_of):
    """Three 384x384 products: ``a`` and ``b`` independent of each other (the executor runs them side
    by side on the inter-op threads), then ``c`` on their sum (it waits for both)."""
    w1 = tf.random.stateless_normal((N, N), seed=(1, 1))
    w2 = tf.random.stateless_normal((N, N), seed=(1, 2))

    @tf.function(autograph=False)
    def fn(x):
        a = tf.linalg.matmul(x, w1, name="a")
        b = tf.linalg.matmul(x, w2, name="b")
        s = tf.math.add(a, b, name="s")
        return tf.linalg.matmul(s, w1, name="c")

    x = tf.random.stateless_normal((N, N), seed=(1, 3))
    concrete = fn.get_concrete_function(x)
    ops = {op.name for op in concrete.graph.get_operations()}
    groups = [[n for n in ops if n == name] for name in names_of]
    assert all(groups), f"expected ops {names_of} in {sorted(ops)}"
    return concrete, x, groups


def test_group_times_add_up_to_the_runs_of_a_real_trace():
    concrete, x, groups = _matmuls(["a", "b", "s", "c"])
    exclusive, busy, run_us = profiling.trace_op_groups(concrete, [x], groups, runs=9, warmup=2)
    assert exclusive.shape == busy.shape == (len(run_us), 4)
    assert len(run_us) == 9
    assert np.all(run_us > 0)
    # every op that runs is in a group: their shares, the time no op filled included, are the runs' time
    np.testing.assert_allclose(exclusive.sum(axis=1), run_us, rtol=1e-6)
    # every group's ops ran in every run and took time of their own
    assert np.all(busy > 0) and np.all(exclusive > 0)
    # the product on the sum waits for both others: no traced op runs beside it, so its own duration
    # is at most its share (its share holds a part of the run's unfilled time besides)
    side_by_side = busy.mean(axis=0) / exclusive.mean(axis=0)
    assert side_by_side[3] <= 1.05, side_by_side


def test_ops_side_by_side_share_the_time_they_overlap(monkeypatch):
    """How much ran side by side depends on the machine's load (on two shared cores the independent
    products often run one after the other), so the arithmetic is checked on a trace of known times:
    run 0 has ``a`` and ``b`` fully side by side, run 1 has them one after the other."""
    concrete, x, groups = _matmuls(["a", "b", "s", "c"])
    types = {op.name: op.type for op in concrete.graph.get_operations()}
    runs = [(0.0, 220.0), (1000.0, 1330.0)]
    events = [
        ("a", types["a"], 0.0, 100.0, False), ("b", types["b"], 0.0, 100.0, False),
        ("s", types["s"], 100.0, 10.0, False), ("c", types["c"], 110.0, 100.0, False),
        ("a", types["a"], 1000.0, 100.0, False), ("b", types["b"], 1100.0, 100.0, False),
        ("s", types["s"], 1200.0, 10.0, False), ("c", types["c"], 1210.0, 100.0, False),
    ]
    monkeypatch.setattr(profiling._compat, "profiler_trace", lambda body: body())
    monkeypatch.setattr(profiling, "_op_events", lambda space, known: (runs, events))
    monkeypatch.setattr(profiling, "calibrate", lambda: profiling.Calibration(1e4, 1e4, 1.0))
    exclusive, busy, run_us = profiling.trace_op_groups(concrete, [x], groups, runs=1, warmup=0)
    np.testing.assert_allclose(run_us, [220.0, 330.0])
    # run 0: a and b split their 100 us; the 10 us no op filled is shared by the four ops
    np.testing.assert_allclose(exclusive[0], [52.5, 52.5, 12.5, 102.5])
    np.testing.assert_allclose(busy[0], [100.0, 100.0, 10.0, 100.0])
    # run 1: nothing overlaps; 20 us unfilled
    np.testing.assert_allclose(exclusive[1], [105.0, 105.0, 15.0, 105.0])
    np.testing.assert_allclose(busy[1], [100.0, 100.0, 10.0, 100.0])
    np.testing.assert_allclose(exclusive.sum(axis=1), run_us)
    side_by_side = busy / exclusive
    assert side_by_side[0, 0] == pytest.approx(100 / 52.5)
    assert np.all(side_by_side[1] < 1.0)
