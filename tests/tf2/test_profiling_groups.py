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


def test_group_times_add_up_to_the_runs_and_say_what_ran_side_by_side():
    concrete, x, groups = _matmuls(["a", "b", "s", "c"])
    exclusive, busy, run_us = profiling.trace_op_groups(concrete, [x], groups, runs=9, warmup=2)
    assert exclusive.shape == busy.shape == (len(run_us), 4)
    assert len(run_us) == 9
    # every op that runs is in a group: their shares, the time no op filled included, are the runs' time
    np.testing.assert_allclose(exclusive.sum(axis=1), run_us, rtol=1e-6)
    # the product on the sum waits for both others: it ran alone, its own duration is its share
    # (less the part of the run's unfilled time it was given)
    side_by_side = busy.mean(axis=0) / exclusive.mean(axis=0)
    assert side_by_side[3] <= 1.05
    # the two independent products overlap in most runs: each one's duration is more than its share
    overlapped = np.median(busy[:, :2].sum(axis=1) / exclusive[:, :2].sum(axis=1))
    assert overlapped > 1.2, (overlapped, side_by_side)
    assert overlapped > side_by_side[3] + 0.15
