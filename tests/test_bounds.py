"""Memory facts: the closed-form checkpoint-all peak equals the simulator's replay of that schedule."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cases import SMALL_CASES, random_dags
from checkmate import synthetic
from checkmate.bounds import checkpoint_all_peak, checkpoint_all_schedule
from checkmate.simulate import simulate


@settings(max_examples=80, deadline=None)
@given(random_dags(max_nodes=14))
def test_checkpoint_all_peak_matches_the_simulator(graph):
    assert checkpoint_all_peak(graph) == simulate(graph, checkpoint_all_schedule(graph)).peak_memory_bytes


def test_checkpoint_all_peak_on_training_graphs():
    graphs = [make() for make in SMALL_CASES.values()] + [synthetic.resnet(6), synthetic.unet(3),
                                                         synthetic.random_forward(60, seed=1)]
    for graph in graphs:
        assert checkpoint_all_peak(graph) == simulate(graph, checkpoint_all_schedule(graph)).peak_memory_bytes


@settings(max_examples=30, deadline=None)
@given(random_dags(max_nodes=5))
def test_cost_lower_bound_never_exceeds_the_brute_force_optimum(graph):
    from cases import brute_force_optimum
    from checkmate.bounds import cost_lower_bound

    peak = checkpoint_all_peak(graph)
    for budget in sorted({b for b in (peak, int(peak * 0.85), int(peak * 0.7)) if b >= 1}):
        best = brute_force_optimum(graph, budget)
        bound = cost_lower_bound(graph, budget)
        if best is None:
            continue
        assert bound <= best[0] + 1e-9
        assert bound >= graph.total_cost


def test_cost_lower_bound_below_the_milp_optimum_and_tight_at_the_checkpoint_all_peak():
    from checkmate.bounds import cost_lower_bound
    from checkmate.errors import InfeasibleBudgetError
    from checkmate.solvers import solve

    graphs = [make() for make in SMALL_CASES.values()] + [synthetic.resnet(3, mem=4), synthetic.chain(10, mem=8)]
    for graph in graphs:
        peak = checkpoint_all_peak(graph)
        assert cost_lower_bound(graph, peak) == graph.total_cost
        for budget in (int(peak * 0.8), int(peak * 0.6)):
            try:
                exact = solve(graph, budget, strategy="checkmate_milp", mip_gap=1e-9, time_limit_s=60)
            except InfeasibleBudgetError:
                continue
            assert cost_lower_bound(graph, budget) <= exact.compute_cost + 1e-9


@settings(max_examples=40, deadline=None)
@given(random_dags(max_nodes=5), st.lists(st.booleans(), min_size=5, max_size=5))
def test_no_schedule_peaks_below_the_floor(graph, recomputable):
    """peak_floor is a lower bound on every schedule's peak (brute force over the stage model, with
    some values that cannot be recomputed), and it is where cost_lower_bound starts to find one."""
    import math
    from dataclasses import replace

    from cases import brute_force_optimum
    from checkmate.bounds import cost_lower_bound, largest_working_set_bytes, peak_floor
    from checkmate.graph import Graph

    nodes = [replace(nd, recomputable=flag) for nd, flag in zip(graph.nodes, recomputable)]
    g = Graph(nodes, graph.edges, name=graph.name, fixed_mem=graph.fixed_mem)
    floor, node = peak_floor(g)
    assert 0 <= node < g.n
    assert floor >= largest_working_set_bytes(g)
    assert brute_force_optimum(g, floor - 1) is None
    assert cost_lower_bound(g, floor - 1) == math.inf
    assert cost_lower_bound(g, floor) < math.inf
    # checkpoint-all is a schedule: the floor never lies above its peak
    assert floor <= checkpoint_all_peak(g)
    if not any(recomputable[:g.n]):
        # nothing can be computed again: checkpoint-all is the only schedule, and the floor its peak
        assert floor == checkpoint_all_peak(g)
