"""RematModel's solve time limit follows the lowered graph's size: the flat MILP's graphs keep the
short first-plan limit, larger graphs (where the hierarchical plan needs CPU time in proportion to its
segments before it has any plan) get more, up to a cap; a limit given in compile_options wins."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import checkmate  # noqa: E402
from checkmate.solvers.auto import AUTO_MILP_MAX_NODES  # noqa: E402
from checkmate.tf2 import step as step_module  # noqa: E402
from checkmate.tf2.keras_model import (FIRST_PLAN_MAX_TIME_LIMIT_S, FIRST_PLAN_TIME_LIMIT_S,  # noqa: E402
                                       first_plan_time_limit_s)


def test_the_limit_grows_with_the_graph_beyond_the_flat_milp_up_to_its_cap():
    assert first_plan_time_limit_s(10) == FIRST_PLAN_TIME_LIMIT_S
    assert first_plan_time_limit_s(AUTO_MILP_MAX_NODES) == FIRST_PLAN_TIME_LIMIT_S
    sizes = [AUTO_MILP_MAX_NODES + 1, 2 * AUTO_MILP_MAX_NODES, 654, 2621, 100_000]
    limits = [first_plan_time_limit_s(n) for n in sizes]
    assert limits == sorted(limits)
    assert FIRST_PLAN_TIME_LIMIT_S < limits[0] < limits[1] < FIRST_PLAN_MAX_TIME_LIMIT_S
    assert limits[1] == pytest.approx(2 * FIRST_PLAN_TIME_LIMIT_S)
    assert limits[-1] == FIRST_PLAN_MAX_TIME_LIMIT_S


def _mlp() -> keras.Model:
    keras.utils.set_random_seed(0)
    inputs = keras.Input((12,))
    h = inputs
    for k in range(4):
        h = keras.layers.Dense(16, activation="relu", name=f"d{k}")(h)
    return keras.Model(inputs, keras.layers.Dense(3, name="head")(h))


def _limits_seen(monkeypatch, **remat_kwargs):
    seen = []
    real = step_module.solve_or_reuse

    def recording(graph, budget_bytes, **kwargs):
        seen.append((graph.n, kwargs.get("time_limit_s")))
        return real(graph, budget_bytes, **kwargs)

    monkeypatch.setattr(step_module, "solve_or_reuse", recording)
    trainer = checkmate.tf2.RematModel(_mlp(), budget="100%", strategy="checkpoint_all", **remat_kwargs)
    trainer.compile(keras.optimizers.SGD(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    trainer.fit(rng.standard_normal((8, 12)).astype("float32"), rng.integers(0, 3, (8,)), batch_size=8,
                epochs=1, verbose=0)
    assert seen
    return seen


def test_rematmodel_solves_within_the_limit_for_its_lowered_graph(monkeypatch):
    import checkmate.solvers.auto as auto_module

    # the test model's graph counts as a large one: its limit is above the short first-plan limit
    monkeypatch.setattr(auto_module, "AUTO_MILP_MAX_NODES", 4)
    nodes, limit = _limits_seen(monkeypatch)[0]
    assert isinstance(limit, float)
    assert limit == first_plan_time_limit_s(nodes) > FIRST_PLAN_TIME_LIMIT_S


def test_a_limit_in_compile_options_wins(monkeypatch):
    nodes, limit = _limits_seen(monkeypatch, compile_options={"time_limit_s": 7.0})[0]
    assert limit == 7.0


def test_compile_takes_a_limit_that_depends_on_the_graph(monkeypatch):
    calls = []
    seen = []
    real = step_module.solve_or_reuse

    def recording(graph, budget_bytes, **kwargs):
        seen.append(kwargs.get("time_limit_s"))
        return real(graph, budget_bytes, **kwargs)

    monkeypatch.setattr(step_module, "solve_or_reuse", recording)
    model = _mlp()
    checkmate.tf2.compile(model, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                          keras.optimizers.SGD(0.01), tf.TensorSpec((8, 12)), tf.TensorSpec((8,), tf.int32),
                          budget="100%", strategy="checkpoint_all", cost_model="flops",
                          time_limit_s=lambda n: calls.append(n) or 3.0 + n)
    assert len(calls) == 1 and calls[0] > 0
    assert seen[0] == 3.0 + calls[0]


def _first_solve_times_out(monkeypatch):
    """``solve_or_reuse`` that raises TimeLimitError on its first call and solves on the others,
    recording each call's time limit."""
    from checkmate.errors import TimeLimitError

    seen = []
    real = step_module.solve_or_reuse

    def first_times_out(graph, budget_bytes, **kwargs):
        seen.append(kwargs.get("time_limit_s"))
        if len(seen) == 1:
            raise TimeLimitError("auto: no strategy found a schedule within the time limit")
        return real(graph, budget_bytes, **kwargs)

    monkeypatch.setattr(step_module, "solve_or_reuse", first_times_out)
    return seen


def _compile_mlp(**kwargs):
    return checkmate.tf2.compile(_mlp(), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                                 keras.optimizers.SGD(0.01), tf.TensorSpec((8, 12)),
                                 tf.TensorSpec((8,), tf.int32), budget="100%", strategy="checkpoint_all",
                                 cost_model="flops", **kwargs)


def test_a_default_limit_that_finds_no_schedule_is_raised_once_instead_of_refusing(monkeypatch):
    seen = _first_solve_times_out(monkeypatch)
    step = _compile_mlp(time_limit_s=lambda n: 4.0)        # a limit by the graph's size: RematModel's default
    assert step.predicted.peak_memory_bytes > 0
    assert seen == [4.0, step_module.DEFAULT_LIMIT_RETRY_FACTOR * 4.0]

    seen = _first_solve_times_out(monkeypatch)
    _compile_mlp()                                          # no limit: compile's own default
    assert seen == [step_module.COMPILE_TIME_LIMIT_S,
                    step_module.DEFAULT_LIMIT_RETRY_FACTOR * step_module.COMPILE_TIME_LIMIT_S]


def test_a_limit_the_caller_gave_is_kept_when_it_finds_no_schedule(monkeypatch):
    from checkmate.errors import TimeLimitError

    seen = _first_solve_times_out(monkeypatch)
    with pytest.raises(TimeLimitError):
        _compile_mlp(time_limit_s=4.0)
    assert seen == [4.0]


def _first_plan_far_from_its_bound(monkeypatch, overhead: float, bound_overhead: float):
    """``solve_or_reuse`` whose first answer is the Griewank baseline's schedule (recomputing a lot),
    reported with overhead ``overhead`` against a bound of ``bound_overhead``, and which solves on the
    others; records each call's time limit."""
    from dataclasses import replace

    seen = []
    real = step_module.solve_or_reuse

    def first_is_poor(graph, budget_bytes, **kwargs):
        seen.append(kwargs.get("time_limit_s"))
        result = real(graph, budget_bytes, **kwargs)
        if len(seen) == 1:
            total = graph.total_cost
            return replace(result, compute_cost=overhead * total, lower_bound=bound_overhead * total, optimal=False,
                           status="a poor first plan")
        return result

    monkeypatch.setattr(step_module, "solve_or_reuse", first_is_poor)
    return seen


def test_a_default_limits_plan_far_from_its_bound_is_solved_once_more_and_the_cheaper_kept(monkeypatch):
    seen = _first_plan_far_from_its_bound(monkeypatch, overhead=2.0, bound_overhead=1.0)
    step = _compile_mlp(time_limit_s=lambda n: 4.0)        # RematModel's kind of default limit
    assert seen == [4.0, step_module.DEFAULT_LIMIT_RETRY_FACTOR * 4.0]
    assert step.result.status != "a poor first plan" and step.result.overhead < 2.0


@pytest.mark.parametrize("overhead, bound_overhead, limit", [
    (1.2, 1.0, lambda n: 4.0),       # cheap: not worth a second solve
    (2.0, 1.9, lambda n: 4.0),       # close to its bound
    (2.0, 1.0, 4.0),                 # a limit the caller gave
    (2.0, 1.0, None),                # compile's own default (150 s): a second solve would double it
])
def test_a_plan_close_to_its_bound_cheap_or_under_a_given_limit_is_kept(monkeypatch, overhead, bound_overhead, limit):
    seen = _first_plan_far_from_its_bound(monkeypatch, overhead=overhead, bound_overhead=bound_overhead)
    step = _compile_mlp(time_limit_s=limit)
    assert len(seen) == 1
    assert step.result.status == "a poor first plan"
