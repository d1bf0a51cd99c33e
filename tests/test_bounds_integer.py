"""The recomputation bound's programme solved in integers: never above a proven optimum, never below
the fractional programme, and on skip and dense graphs the gain that the fractional one misses."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from cases import brute_force_optimum, random_dags
from checkmate import synthetic
from checkmate.bounds import checkpoint_all_peak, cost_lower_bound, largest_working_set_bytes
from checkmate.errors import InfeasibleBudgetError
from checkmate.solvers import parse_budget, solve
from quality_graphs import dense_blocks, long_skip_unet
from test_auto_skips import diffusion_unet

FRACTIONS = (0.85, 0.7, 0.55)


def _both(graph, budget):
    return (cost_lower_bound(graph, budget, integer_time_s=None),
            cost_lower_bound(graph, budget, integer_time_s=30.0))


def _against_brute_force(graph):
    peak = checkpoint_all_peak(graph)
    for budget in sorted({b for b in (int(peak * f) for f in FRACTIONS) if b >= 1}):
        best = brute_force_optimum(graph, budget)
        fractional, integer = _both(graph, budget)
        if best is None:
            continue
        assert integer <= best[0] + 1e-9
        assert integer >= fractional - 1e-9


# fixed examples (derandomize): the same graphs on every run
@settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(random_dags(max_nodes=5))
def test_integer_bound_never_exceeds_the_brute_force_optimum(graph):
    _against_brute_force(graph)


@pytest.mark.slow
@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(random_dags(min_nodes=4, max_nodes=6))
def test_integer_bound_never_exceeds_the_brute_force_optimum_on_more_graphs(graph):
    _against_brute_force(graph)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(8))
def test_integer_bound_never_exceeds_the_milp_optimum_on_random_training_graphs(seed):
    graph = synthetic.random_forward(7 + seed % 3, seed=seed)
    peak = checkpoint_all_peak(graph)
    floor = largest_working_set_bytes(graph)
    checked = 0
    for fraction in FRACTIONS:
        budget = int(floor + fraction * (peak - floor))
        try:
            exact = solve(graph, budget, strategy="checkmate_milp", mip_gap=1e-9, time_limit_s=60)
        except InfeasibleBudgetError:
            continue
        assert exact.optimal
        fractional, integer = _both(graph, budget)
        assert fractional - 1e-9 <= integer <= exact.compute_cost + 1e-9
        checked += 1
    assert checked >= 1


@pytest.mark.parametrize("make, budget", [(lambda: long_skip_unet(), "70%"), (lambda: long_skip_unet(), "60%"),
                                          (lambda: dense_blocks(2, 4), "60%"), (lambda: dense_blocks(2, 4), "50%")])
def test_integer_bound_closes_most_of_the_gap_to_the_optimum_on_skip_and_dense_graphs(make, budget):
    # the fractional programme drops the cheapest value per byte in part; a schedule drops it whole
    graph = make()
    budget_bytes = parse_budget(budget, graph)
    exact = solve(graph, budget_bytes, strategy="checkmate_milp", mip_gap=1e-9, time_limit_s=120)
    assert exact.optimal
    fractional, integer = _both(graph, budget_bytes)
    optimum = exact.compute_cost
    assert integer <= optimum + 1e-9
    assert fractional < optimum - 1e-3 * graph.total_cost
    # the integer bound takes at least a fifth of what the fractional one leaves to the optimum (all
    # of it on the dense blocks and the U-Net at 70%, 29% at 60%)
    assert integer - fractional >= 0.2 * (optimum - fractional)


def test_integer_bound_on_a_diffusion_unet_at_30_percent():
    # 106 nodes: fractionally 1.1737x, in integers 1.1840x; the flat MILP's own bound after 120 s is
    # 1.1878x (too slow for a test), which the integer bound must not pass
    graph = diffusion_unet(levels=2, blocks=1)
    budget = parse_budget("30%", graph)
    fractional, integer = _both(graph, budget)
    assert integer >= fractional + 0.005 * graph.total_cost
    assert integer <= 1.1878 * graph.total_cost


def test_a_short_integer_time_limit_keeps_a_valid_bound():
    # cut off by its limit, the branch and bound's dual bound is what it proved by then: never below
    # the fractional bound (the larger is kept), never above the full integer solve
    graph = diffusion_unet(levels=2, blocks=1)
    budget = parse_budget("30%", graph)
    fractional, integer = _both(graph, budget)
    quick = cost_lower_bound(graph, budget, integer_time_s=1e-3)
    assert fractional - 1e-9 <= quick <= integer + 1e-9


def test_the_integer_solve_stops_by_the_callers_deadline(monkeypatch):
    # within a caller's time limit the branch and bound gets no more than what is left of it
    import time

    import scipy.optimize

    from checkmate._deadline import deadline_scope

    limits = []
    real = scipy.optimize.milp

    def recording(*args, options=None, **kwargs):
        limits.append(options["time_limit"])
        return real(*args, options=options, **kwargs)

    monkeypatch.setattr(scipy.optimize, "milp", recording)
    graph = diffusion_unet(levels=2, blocks=1)
    budget = parse_budget("30%", graph)
    cost_lower_bound(graph, budget, integer_time_s=60.0)
    assert limits == [60.0]
    with deadline_scope(time.perf_counter() + 5.0):
        cost_lower_bound(graph, budget, integer_time_s=60.0)
    assert len(limits) == 2 and 0 < limits[1] <= 5.0


def test_programmes_beyond_the_size_cap_are_not_solved_in_integers(monkeypatch):
    from checkmate import bounds

    graph = diffusion_unet(levels=2, blocks=1)
    budget = parse_budget("30%", graph)
    fractional, integer = _both(graph, budget)
    assert integer > fractional
    monkeypatch.setattr(bounds, "INTEGER_BOUND_MAX_NONZEROS", 0)
    assert cost_lower_bound(graph, budget, integer_time_s=30.0) == fractional
