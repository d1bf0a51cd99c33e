"""The memory bound with what a recomputation needs: a value computed again after a moment needs its
inputs then, so an input no longer needed at the moment is held (its bytes count) or computed again
as well. Never above a proven optimum, and tighter than the moments alone on long skips."""

from __future__ import annotations

import random

import numpy as np
import pytest

import checkmate.bounds as bounds
from checkmate import synthetic
from checkmate.bounds import (_moments, _recompute_inputs, checkpoint_all_peak, cost_lower_bound,
                              largest_working_set_bytes)
from checkmate.errors import InfeasibleBudgetError
from checkmate.graph import GraphBuilder
from checkmate.solvers import solve
from quality_graphs import dense_blocks, long_skip_unet


def _optimum(graph, budget):
    """The proven optimal cost, or None where the budget is infeasible or optimality is not proven."""
    try:
        exact = solve(graph, budget, strategy="checkmate_milp", mip_gap=1e-9, time_limit_s=120)
    except InfeasibleBudgetError:
        return None
    return exact.compute_cost if exact.optimal else None


def _forward_dag(nodes: int, seed: int):
    """A random DAG that is not a training graph: concatenation-like nodes reading up to three earlier
    values, some values not recomputable, some outputs, zero-byte values among them."""
    rng = random.Random(seed)
    b = GraphBuilder(f"dag{nodes}_s{seed}")
    for v in range(nodes):
        deps = [v - 1] if v else []
        while v and len(deps) < 3 and rng.random() < 0.45:
            deps.append(rng.randrange(0, v))
        b.add_node(f"n{v}", rng.randint(1, 10), rng.randint(0, 20), sorted(set(deps)), backward=v >= nodes // 2,
                   output=v == nodes - 1 or (v >= nodes // 2 and rng.random() < 0.2),
                   recomputable=rng.random() > 0.1)
    return b.build()


def _graphs(count: int, sizes: tuple[int, int]):
    """Half forward DAGs, half training graphs of random forward DAGs with skips (seeds fixed)."""
    for seed in range(count):
        rng = random.Random(1000 + seed)
        if seed % 2:
            yield _forward_dag(rng.randint(*sizes), seed)
        else:
            yield synthetic.random_forward(max(3, rng.randint(*sizes) // 2), seed=seed, skip_prob=0.5)


# budgets between the largest working set (no schedule fits less) and the checkpoint-all peak
FRACTIONS = (0.75, 0.45, 0.2)


def _check_below_optimum(graphs) -> int:
    checked = 0
    for graph in graphs:
        peak = checkpoint_all_peak(graph)
        least = largest_working_set_bytes(graph)
        for fraction in FRACTIONS:
            budget = least + int((peak - least) * fraction)
            optimum = _optimum(graph, budget)
            if optimum is None:
                continue
            bound = cost_lower_bound(graph, budget)
            assert bound <= optimum * (1 + 1e-9) + 1e-9, (graph.name, fraction, bound, optimum)
            assert bound >= cost_lower_bound(graph, budget, recompute_inputs=False) * (1 - 1e-9) - 1e-9
            checked += 1
    return checked


def test_never_above_the_proven_optimum_on_random_dags():
    assert _check_below_optimum(_graphs(10, (6, 9))) >= 15


@pytest.mark.slow
def test_never_above_the_proven_optimum_on_more_and_larger_random_dags():
    assert _check_below_optimum(_graphs(40, (8, 14))) >= 60


def _six_nodes():
    """0 -> 1 -> 2 -> 3 -> 4 -> 5 with 2 reading 0, 4 reading 1 and 5 reading 2 (5 is the output)."""
    b = GraphBuilder("six")
    for name, cost, mem, deps in [("n0", 4, 1, []), ("n1", 9, 1, [0]), ("n2", 1, 1, [0, 1]), ("n3", 3, 6, [2]),
                                  ("n4", 8, 6, [1, 3]), ("n5", 6, 4, [2, 4])]:
        b.add_node(name, cost, mem, deps, output=name == "n5")
    return b.build()


def test_a_dropped_value_pays_for_the_input_it_is_computed_from():
    # at 13 bytes node 4's run (inputs 1 and 3, output 4: 13 bytes) leaves no room for value 2, which
    # node 5 reads later: it is computed again (1). That needs its input 0, read last by node 2 and
    # not resident (a byte over the budget) unless computed again too (4). The moments alone see 1.
    graph = _six_nodes()
    budget = 13
    assert cost_lower_bound(graph, budget, recompute_inputs=False) == pytest.approx(graph.total_cost + 1)
    assert cost_lower_bound(graph, budget) == pytest.approx(graph.total_cost + 5)
    assert _optimum(graph, budget) == pytest.approx(graph.total_cost + 5)


def test_the_inputs_listed_are_those_nothing_else_keeps():
    graph = _six_nodes()
    droppables, _, _, pairs = _moments(graph, 13, closure=True)
    moment = [i for i, d in enumerate(droppables) if d.tolist() == [2]]
    assert moment, droppables
    # value 2 computed again needs 0 (dead after node 2) and 1 (node 4's input, resident anyway)
    assert pairs[moment[0]].tolist() == [[2, 0]]
    # a free input is never listed; an input listed is followed to its own inputs
    alive = np.zeros(graph.n, dtype=bool)
    free = np.zeros(graph.n, dtype=bool)
    free[[0, 1]] = True
    assert _recompute_inputs(graph, np.array([2]), alive, free).tolist() == []
    assert _recompute_inputs(graph, np.array([3]), alive, np.zeros(graph.n, dtype=bool)).tolist() == [
        [3, 2], [2, 0], [2, 1], [1, 0]]


def test_tighter_than_the_moments_alone_on_a_u_net_with_a_known_optimum():
    # two levels of two convolutions each, every one concatenated into the decoder: at 60% of
    # checkpoint-all the moments alone bound 1.058x, the optimum is 1.1015x; dropping a skip value
    # costs its encoder chain or the bytes of the input it is computed from
    graph = long_skip_unet(2, 2)
    budget = int(checkpoint_all_peak(graph) * 0.6)
    optimum = _optimum(graph, budget)
    assert optimum is not None
    before = cost_lower_bound(graph, budget, recompute_inputs=False)
    after = cost_lower_bound(graph, budget)
    assert after <= optimum * (1 + 1e-9)
    assert (after - graph.total_cost) >= 1.5 * (before - graph.total_cost)
    # the gap to the optimum shrinks from over 4% to under 1%
    assert optimum / before > 1.04
    assert optimum / after < 1.01


@pytest.mark.parametrize("make, fraction", [(lambda: long_skip_unet(2, 2), 0.7), (lambda: dense_blocks(2, 3), 0.6),
                                            (lambda: synthetic.resnet(3, mem=4), 0.6)])
def test_never_below_the_moments_alone_and_never_above_the_optimum(make, fraction):
    graph = make()
    budget = int(checkpoint_all_peak(graph) * fraction)
    optimum = _optimum(graph, budget)
    assert optimum is not None
    before = cost_lower_bound(graph, budget, recompute_inputs=False)
    after = cost_lower_bound(graph, budget)
    assert before * (1 - 1e-9) <= after <= optimum * (1 + 1e-9)


def test_the_inputs_enter_for_the_worst_moments_up_to_the_cap(monkeypatch):
    graph = long_skip_unet(2, 2)
    budget = int(checkpoint_all_peak(graph) * 0.6)
    droppables, excesses, windows, pairs = _moments(graph, budget, closure=True)
    singles = [bounds._knapsack_extra(graph, d, e) for d, e in zip(droppables, excesses)]
    sizes = [len(p) for p in pairs]
    worst = int(np.argmax(singles))
    monkeypatch.setattr(bounds, "CLOSURE_BOUND_MAX_PAIRS", sizes[worst])
    kept = bounds._worst_moments_pairs(pairs, singles)
    assert sum(len(p) for p in kept) <= sizes[worst]
    assert kept[worst].tolist() == pairs[worst].tolist()
    # with no pairs at all the programme is the combined one: the bound of the moments alone
    monkeypatch.setattr(bounds, "CLOSURE_BOUND_MAX_PAIRS", 0)
    assert cost_lower_bound(graph, budget) == pytest.approx(cost_lower_bound(graph, budget, recompute_inputs=False))


@pytest.mark.parametrize("make, fraction", [(lambda: long_skip_unet(2, 2), 0.6), (lambda: dense_blocks(2, 3), 0.6)])
def test_with_a_cap_the_moments_binding_the_combined_programme_are_tried_too(monkeypatch, make, fraction):
    # the inputs of only some moments fit: by single bound and by the combined programme's duals are
    # both valid choices; the bound is the larger, and still never above the optimum
    graph = make()
    budget = int(checkpoint_all_peak(graph) * fraction)
    droppables, excesses, windows, pairs = _moments(graph, budget, closure=True)
    singles = [bounds._knapsack_extra(graph, d, e) for d, e in zip(droppables, excesses)]
    duals = []
    bounds._combined_extra(graph, droppables, excesses, windows, duals=duals)
    assert len(duals) == 1 and len(duals[0]) == len(droppables) and duals[0].max() > 0
    cap = max(len(p) for p in pairs)
    monkeypatch.setattr(bounds, "CLOSURE_BOUND_MAX_PAIRS", cap)
    assert sum(len(p) for p in pairs) > cap
    by_single = bounds._worst_moments_pairs(pairs, singles)
    by_duals = bounds._worst_moments_pairs(pairs, singles, priority=duals[0])
    assert sum(len(p) for p in by_duals) <= cap
    # the moment binding the combined programme most has its inputs in
    top = int(np.argmax(duals[0]))
    assert len(pairs[top]) == 0 or by_duals[top].tolist() == pairs[top].tolist()
    closures = [bounds._closure_extra(graph, droppables, excesses, windows, kept) for kept in (by_single, by_duals)]
    found = cost_lower_bound(graph, budget, integer_time_s=None)
    assert found == pytest.approx(graph.total_cost + max(max(closures), bounds._combined_extra(
        graph, droppables, excesses, windows), max(singles)))
    assert found <= _optimum(graph, budget) * (1 + 1e-9)
