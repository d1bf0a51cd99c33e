"""The recomputation lower bound that combines every moment's memory shortfall: never above the exact
optimum, at least the worst single moment's, and checked by its own dual rather than the solver's word."""

from __future__ import annotations

import numpy as np
import pytest

from checkmate import synthetic
from checkmate.bounds import (_combined_extra, _knapsack_extra, _moments, checkpoint_all_peak,
                              cost_lower_bound)
from checkmate.errors import InfeasibleBudgetError
from checkmate.solvers import solve

GRAPHS = {
    "random10": lambda: synthetic.random_forward(10, seed=5),
    "random12": lambda: synthetic.random_forward(12, seed=3),
    "resnet3": lambda: synthetic.resnet(3, mem=4),
}
FRACTIONS = (0.8, 0.65, 0.5)


def _single_and_combined(graph, budget):
    droppables, excesses, windows = _moments(graph, budget)
    single = max((_knapsack_extra(graph, d, e) for d, e in zip(droppables, excesses)), default=0.0)
    return single, _combined_extra(graph, droppables, excesses, windows)


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_combined_bound_never_exceeds_the_exact_optimum(name):
    graph = GRAPHS[name]()
    peak = checkpoint_all_peak(graph)
    checked = 0
    for fraction in FRACTIONS:
        budget = int(peak * fraction)
        try:
            exact = solve(graph, budget, strategy="checkmate_milp", mip_gap=1e-9, time_limit_s=120)
        except InfeasibleBudgetError:
            continue
        assert exact.optimal
        assert cost_lower_bound(graph, budget) <= exact.compute_cost + 1e-9
        checked += 1
    assert checked >= 2


def test_combined_bound_is_stronger_than_any_single_moment_somewhere():
    # the random graphs' moments drop overlapping sets of values: together they force more
    # recomputation than the worst of them alone
    gains = []
    for make in GRAPHS.values():
        graph = make()
        peak = checkpoint_all_peak(graph)
        for fraction in FRACTIONS:
            budget = int(peak * fraction)
            if _moments(graph, budget) is None:
                continue
            single, combined = _single_and_combined(graph, budget)
            assert combined >= single * (1 - 1e-6) - 1e-9
            gains.append(combined - single)
            assert cost_lower_bound(graph, budget, recompute_inputs=False) == pytest.approx(
                graph.total_cost + max(single, combined))
            assert cost_lower_bound(graph, budget) >= graph.total_cost + max(single, combined) - 1e-9
    assert max(gains) > 1.0      # far above rounding on some graph and budget


def test_combined_bound_is_certified_below_the_programme_optimum():
    """The value returned comes from the dual multipliers: never above the LP's own optimum, solved
    here afresh as a dense programme with every row unscaled."""
    from scipy.optimize import linprog

    graph = synthetic.random_forward(12, seed=3)
    budget = int(checkpoint_all_peak(graph) * 0.65)
    droppables, excesses, windows = _moments(graph, budget)
    # one column per value and window between two of its readers, numbered as _moments numbers them
    columns = sum(len(u) + 1 for u in graph.users)
    A = np.zeros((len(droppables), columns))
    cost = np.zeros(columns)
    for row, (d, w) in enumerate(zip(droppables, windows)):
        A[row, w] = graph.mem[d]
        cost[w] = graph.cost[d]
    res = linprog(cost, A_ub=-A, b_ub=-np.asarray(excesses), bounds=(0, 1), method="highs")
    assert res.status == 0
    combined = _combined_extra(graph, droppables, excesses, windows)
    assert combined <= res.fun + 1e-9 * max(1.0, res.fun)
    assert combined == pytest.approx(res.fun, rel=1e-6)


def test_windows_number_the_readers_each_moment_lies_between():
    graph = synthetic.random_forward(14, seed=5)
    budget = int(checkpoint_all_peak(graph) * 0.5)
    droppables, excesses, windows = _moments(graph, budget)
    start = np.concatenate([[0], np.cumsum([len(u) + 1 for u in graph.users])[:-1]])
    # each row is a moment t (rows in increasing t): every droppable value's window is the count of
    # its readers before t, and a reader of it is still to come
    last_t = 0
    for d, w in zip(droppables, windows):
        j = w - start[d]
        fits = [t for t in range(last_t + 1, graph.n)
                if all(int(jv) == sum(u < t for u in graph.users[v]) < len(graph.users[v])
                       and t not in graph.users[v] for v, jv in zip(d.tolist(), j.tolist()))]
        assert fits, (d, j)
        last_t = fits[0]
    assert len(windows) > 1


@pytest.mark.parametrize("nodes, seed, fraction", [(14, 2, 0.4), (12, 2, 0.5)])
def test_a_value_dropped_on_both_sides_of_a_reader_is_paid_twice(nodes, seed, fraction):
    """One column per window is stronger than one per value where a value is dropped before and after
    one of its readers, and still never above the exact optimum."""
    graph = synthetic.random_forward(nodes, seed=seed)
    budget = int(checkpoint_all_peak(graph) * fraction)
    droppables, excesses, windows = _moments(graph, budget)
    per_value = _combined_extra(graph, droppables, excesses)
    per_window = _combined_extra(graph, droppables, excesses, windows)
    assert per_window > per_value * 1.05
    exact = solve(graph, budget, strategy="checkmate_milp", mip_gap=1e-9, time_limit_s=120)
    assert exact.optimal
    assert graph.total_cost + per_window <= exact.compute_cost + 1e-9
    assert cost_lower_bound(graph, budget) <= exact.compute_cost + 1e-9


def test_combined_bound_is_infinite_below_a_moments_needs():
    graph = synthetic.resnet(3, mem=4)
    assert cost_lower_bound(graph, 1) == float("inf")
