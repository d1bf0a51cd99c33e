"""The partial order: what a computation waits for, the memory bound that choice keeps, and the critical
path (longest path by the plan's node costs through data and control edges) it leaves the step."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from checkmate.solvers import checkpoint_all_peak, solve  # noqa: E402
from checkmate.solvers.baselines import checkpoint_all_schedule  # noqa: E402
from checkmate.tf2.codegen import (BACKWARD_WORKSPACE_FACTOR, critical_path, generate, partial_waits,  # noqa: E402
                                   rewrite_graph_def)
from checkmate.tf2.lowering import lower  # noqa: E402
from checkmate.tf2.memory import measure_peak_memory  # noqa: E402
from checkmate.tf2.step import predicted_step_peak  # noqa: E402
from isolation import ran_in_fresh_process  # noqa: E402
from test_codegen import SOLVE_OPTIONS, batch_for, nasnet_cell_model, unet_model  # noqa: E402

pytestmark = pytest.mark.tf


def _node(name, *inputs):
    nd = tf.compat.v1.NodeDef()
    nd.name = name
    nd.op = "NoOp"
    nd.input.extend(inputs)
    return nd


def test_critical_path_follows_data_and_control_edges_and_counts_a_computation_once():
    # a -> (b, c) -> d, with b and c of one computation each; a static op s between a and d costs nothing
    nodes = [_node("a"), _node("b1", "a"), _node("b2", "b1"), _node("c", "a"), _node("s", "a"),
             _node("d", "b2", "c:1", "s")]
    units = {"a": "A", "b1": "B", "b2": "B", "c": "C", "d": "D"}
    costs = {"A": 1.0, "B": 5.0, "C": 2.0, "D": 1.0}
    assert critical_path(nodes, units, costs) == 7.0          # a, b (both ops once), d
    # c waiting for b (a control input) puts it on the path
    nodes[3] = _node("c", "a", "^b2")
    assert critical_path(nodes, units, costs) == 9.0


def _simulated_peaks(graph, plan, waits, orders, seed=0):
    """Peaks of ``orders`` random executions of the computations (each one's data inputs and waits run
    before it; a value dies once its last consumer has run, or never if the plan keeps it to the end;
    a backward computation holds its temporaries while it runs), above the graph's fixed memory."""
    computes = [i for action, i in plan if action == "compute"]
    n = len(computes)
    latest, preds, readers = {}, [set() for _ in range(n)], [set() for _ in range(n)]
    for c, i in enumerate(computes):
        for d in graph.deps[i]:
            if d in latest:
                preds[c].add(latest[d])
                readers[latest[d]].add(c)
        preds[c].update(waits[c])
        latest[i] = c
    kept = {latest[i] for i in set(computes)}
    freed = {i for action, i in plan if action == "free"}
    kept = {c for c in kept if computes[c] not in freed}
    rng = np.random.default_rng(seed)
    peaks = []
    for _ in range(orders):
        done, live, peak = set(), 0, 0
        left = {c: len(preds[c]) for c in range(n)}
        users_of = [set() for _ in range(n)]
        for c in range(n):
            for p in preds[c]:
                users_of[p].add(c)
        remaining = {c: set(readers[c]) for c in range(n)}
        ready = [c for c in range(n) if left[c] == 0]
        while ready:
            c = ready.pop(int(rng.integers(len(ready))))
            i = computes[c]
            work = BACKWARD_WORKSPACE_FACTOR * int(graph.mem[i]) if graph.backward[i] else 0
            live += int(graph.mem[i])
            peak = max(peak, live + work)
            done.add(c)
            for p in preds[c]:
                if c in remaining[p]:
                    remaining[p].discard(c)
                    if not remaining[p] and p not in kept:
                        live -= int(graph.mem[computes[p]])
            if not remaining[c] and c not in kept:
                live -= int(graph.mem[i])
            for u in users_of[c]:
                left[u] -= 1
                if left[u] == 0:
                    ready.append(u)
        assert len(done) == n
        peaks.append(peak)
    return peaks


def _plan_peak(graph, plan):
    """The plan's peak with each backward computation's temporaries counted while it runs (the total
    order's, by the same accounting)."""
    current = peak = 0
    for action, i in plan:
        current += int(graph.mem[i]) if action == "compute" else -int(graph.mem[i])
        work = BACKWARD_WORKSPACE_FACTOR * int(graph.mem[i]) if action == "compute" and graph.backward[i] else 0
        peak = max(peak, current + work)
    return peak


@pytest.mark.parametrize("fraction", [0.7, 0.5])
def test_any_execution_the_partial_order_allows_stays_within_the_plans_peak(fraction):
    """On NASNet-style cells, any order TF's executor may pick within the partial order's waits peaks
    within the plan's peak (random executions, the values counted as the plan counts them); with no
    wait at all some execution exceeds it, so the waits are what keeps the plan."""
    model, loss, xs, ys = nasnet_cell_model(size=16, cells=4)
    graph = lower(model, loss, xs, ys, level="layer").graph
    plan = solve(graph, int(checkpoint_all_peak(graph) * fraction), strategy="auto", **SOLVE_OPTIONS).schedule.plan
    limit = _plan_peak(graph, plan)
    waits = partial_waits(graph, plan)
    peaks = _simulated_peaks(graph, plan, waits, orders=200)
    assert max(peaks) <= limit, (max(peaks), limit)
    unordered = _simulated_peaks(graph, plan, [()] * len(waits), orders=200)
    assert max(unordered) > limit, (max(unordered), limit)


def test_partial_order_keeps_parallel_branches_side_by_side():
    """NASNet-style cells (two branches per cell): with nothing recomputed and the partial order forced,
    the step's critical path is within 10% of the plain step's, and with recomputations at 70% of the
    checkpoint-all peak well below the total order's (which runs every computation in one chain); a
    U-Net at 70% stays within 5% of its plain step's path."""
    model, loss, xs, ys = nasnet_cell_model(size=32, cells=4)
    lowered = lower(model, loss, xs, ys, level="layer")
    graph = lowered.graph
    nothing = rewrite_graph_def(lowered, checkpoint_all_schedule(graph), order="partial")
    assert nothing.critical_path_ratio <= 1.10, nothing.describe_order()
    schedule = solve(graph, int(checkpoint_all_peak(graph) * 0.7), strategy="auto", **SOLVE_OPTIONS).schedule
    assert schedule.recompute_count > 0
    partial = rewrite_graph_def(lowered, schedule, order="partial")
    total = rewrite_graph_def(lowered, schedule, order="total")
    assert total.critical_path_cost == pytest.approx(total.total_cost)
    assert partial.critical_path_ratio <= 0.9 * total.critical_path_ratio, (partial.describe_order(),
                                                                             total.describe_order())
    assert "critical path" in partial.describe_order() and "of the plain step's" in partial.describe_order()

    model, loss, xs, ys = unet_model()
    lowered = lower(model, loss, xs, ys, level="layer")
    graph = lowered.graph
    schedule = solve(graph, int(checkpoint_all_peak(graph) * 0.7), strategy="auto", **SOLVE_OPTIONS).schedule
    partial = rewrite_graph_def(lowered, schedule, order="partial")
    assert partial.critical_path_ratio <= 1.05, partial.describe_order()


@pytest.mark.slow
def test_unet_at_70_percent_measures_within_the_plan(request):
    """The U-Net at 70% of its checkpoint-all peak, in the partial order: the measured step peak stays
    within the plan's prediction and the total order's (allocator chunks: 0.5 MiB at these peaks)."""
    if ran_in_fresh_process(request):
        return
    model, loss, xs, ys = unet_model()
    lowered = lower(model, loss, xs, ys, level="layer")
    graph = lowered.graph
    schedule = solve(graph, int(checkpoint_all_peak(graph) * 0.7), strategy="auto", **SOLVE_OPTIONS).schedule
    assert schedule.recompute_count > 0
    x, y = batch_for(xs, ys, int(model.outputs[0].shape[-1]))
    predicted = predicted_step_peak(lowered, schedule)
    peaks = {}
    for order in ("partial", "total"):
        fn = generate(lowered, schedule, order=order)
        peaks[order] = measure_peak_memory(fn.call_flat, *fn.flat_args(x, y), repeats=2, reduce="min")
    assert peaks["partial"] <= 1.10 * peaks["total"], peaks
    assert peaks["partial"] <= 1.15 * predicted, (peaks, predicted)


def test_auto_takes_the_total_order_for_a_plan_of_too_many_computations(monkeypatch):
    """The partial order's placement grows with the square of the plan's computations: beyond
    PARTIAL_ORDER_MAX_COMPUTATIONS, order="auto" chains them (the total order) instead."""
    import checkmate.tf2.codegen as codegen

    model, loss, xs, ys = unet_model()
    lowered = lower(model, loss, xs, ys, level="layer")
    graph = lowered.graph
    schedule = solve(graph, int(checkpoint_all_peak(graph) * 0.7), strategy="auto", **SOLVE_OPTIONS).schedule
    computations = int(schedule.recompute.sum())
    assert computations > graph.n
    assert rewrite_graph_def(lowered, schedule).order == "partial"
    monkeypatch.setattr(codegen, "PARTIAL_ORDER_MAX_COMPUTATIONS", computations - 1)
    chained = rewrite_graph_def(lowered, schedule)
    assert chained.order == "total"
    assert chained.critical_path_cost == pytest.approx(chained.total_cost)
