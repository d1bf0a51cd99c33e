"""Recomputations priced where they run (checkmate.tf2.step.price_in_place): the generated step's own
trace, its recomputed copies' time over its first copies', as the predicted step-time ratio."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import checkmate.tf2 as ct  # noqa: E402
from checkmate.tf2 import profiling  # noqa: E402
from checkmate.tf2.codegen import IMPORT_SCOPE, copy_name  # noqa: E402
from checkmate.tf2.step import price_in_place  # noqa: E402

pytestmark = pytest.mark.tf

XENT = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
SPECS = (tf.TensorSpec((64, 32)), tf.TensorSpec((64,), tf.int32))


def mlp(blocks=6, width=128):
    """Dense, batch normalization (state that a traced run updates) and GELU per block."""
    keras.utils.set_random_seed(0)
    inp = keras.Input((32,))
    h = keras.layers.Dense(width, name="stem")(inp)
    for b in range(blocks):
        h = keras.layers.Dense(width, name=f"d{b}")(h)
        h = keras.layers.BatchNormalization(name=f"bn{b}")(h)
        h = keras.layers.Activation("gelu", name=f"act{b}")(h)
    return keras.Model(inp, keras.layers.Dense(10, name="head")(h))


def _compile(model, tmp_path, **options):
    return ct.compile(model, XENT, keras.optimizers.SGD(), *SPECS, budget="50% activations", time_limit_s=30,
                      schedule_cache=False, cost_model=options.pop("cost_model", "profile"), **options)


def test_share_is_the_copies_time_over_the_first_copies(monkeypatch):
    """Per run: the recomputed copies' shares over the first copies' (the profiler's cost per op the
    same in both); the robust median over the runs."""
    exclusive = np.array([[40.0, 60.0, 10.0, 5.0],       # run 0: 15 / 100
                          [50.0, 50.0, 20.0, 0.0],       # run 1: 20 / 100
                          [30.0, 20.0, 10.0, 0.0],       # run 2: 10 / 50
                          [0.0, 0.0, 3.0, 0.0]])         # run 3: no first copy timed, left out
    calls = {}

    def trace(function, args, groups, runs, warmup):
        calls.update(groups=groups, runs=runs)
        return exclusive, exclusive, exclusive.sum(axis=1)

    monkeypatch.setattr(profiling, "trace_op_groups", trace)
    share = profiling.in_place_share(object(), [], [["a"], ["b"]], [["a__cm1"], ["b__cm1"]], runs=4)
    assert share == pytest.approx(np.median([0.15, 0.20, 0.20]))
    assert calls == {"groups": [["a"], ["b"], ["a__cm1"], ["b__cm1"]], "runs": 4}
    monkeypatch.setattr(profiling, "trace_op_groups",
                        lambda *a, **k: (np.zeros((2, 2)), np.zeros((2, 2)), np.zeros(2)))
    assert profiling.in_place_share(object(), [], [["a"]], [["a__cm1"]]) is None


def test_a_plan_that_recomputes_is_priced_in_its_own_trace(tmp_path):
    model = mlp()
    step = _compile(model, tmp_path)
    p = step.predicted
    assert p.recompute_count > 0
    assert p.in_place_overhead is not None
    assert p.time_overhead == p.in_place_overhead
    # the copies add time, at most a few times their price in the plain step
    assert 1.0 < p.in_place_overhead < 1.0 + 3 * (p.overhead - 1.0)
    assert "priced where they run in the generated step" in step.summary()
    assert f"{p.overhead:.3f}x at the plain step's prices" in step.summary()
    # the same share from the step's own trace, taken here
    counts = step.schedule.recompute.sum(axis=0).astype(int)
    concrete = step.function.concrete_function
    names = {op.name for op in concrete.graph.get_operations()}
    first = [[f"{IMPORT_SCOPE}/{op}" for op in ops if f"{IMPORT_SCOPE}/{op}" in names]
             for ops in step.lowered.node_ops]
    copies = [[n for n in (f"{IMPORT_SCOPE}/{copy_name(op, k)}" for op in ops) if n in names]
              for i, ops in enumerate(step.lowered.node_ops) for k in range(1, counts[i])]
    assert sum(map(len, copies)) > 0
    x = tf.random.stateless_normal(SPECS[0].shape, seed=(0, 1))
    y = tf.zeros(SPECS[1].shape, tf.int32)

    class Flat:
        graph = concrete.graph

        def __call__(self, *flat):
            return step.function.call_flat(*flat)

    again = profiling.in_place_share(Flat(), step.function.flat_args(x, y), [g for g in first if g],
                                     [g for g in copies if g], runs=9)
    # another trace of the same step, on a machine whose load may change in between: the same share
    # to within half the plan's overhead (the copies' time and the first copies' move together)
    assert again == pytest.approx(p.in_place_overhead - 1.0, abs=max(0.5 * (p.overhead - 1.0), 0.05))


def test_pricing_leaves_the_model_as_it_was(tmp_path):
    """The traced runs update batch normalization's statistics; they are put back."""
    model = mlp()
    step = _compile(model, tmp_path, in_place=False)
    assert step.predicted.in_place_overhead is None
    assert step.predicted.time_overhead == step.predicted.overhead
    before = [v.numpy().copy() for v in model.variables]
    assert price_in_place(step) is not None
    assert step.predicted.in_place_overhead is not None
    for v, b in zip(model.variables, before):
        np.testing.assert_array_equal(v.numpy(), b)


def test_nothing_to_price_without_recomputations_or_profiled_costs(tmp_path):
    model = mlp()
    every = ct.compile(model, XENT, keras.optimizers.SGD(), *SPECS, budget="100%", strategy="checkpoint_all",
                       schedule_cache=False)
    assert every.predicted.recompute_count == 0 and every.predicted.in_place_overhead is None
    flops = _compile(model, tmp_path, cost_model="flops")
    assert flops.predicted.recompute_count > 0 and flops.predicted.in_place_overhead is None
    assert "priced where they run" not in flops.summary()
