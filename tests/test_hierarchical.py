"""The hierarchical strategy and ``auto``: valid schedules, within the stated gap of the flat MILP's
optimum, identical blocks solved once, graphs without block structure handled."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from cases import SMALL_CASES, assert_valid_schedule, brute_force_optimum, random_dags
from checkmate import synthetic
from checkmate.errors import InfeasibleBudgetError
from checkmate.graph import GraphBuilder
from checkmate.schedule import Schedule
from checkmate.solvers import checkpoint_all_peak, solve
from checkmate.solvers import hierarchical as hier

SMALL = {**SMALL_CASES,
         "resnet3": lambda: synthetic.resnet(3, mem=4, cost=5.0),
         "unet3": lambda: synthetic.unet(3, base_mem=16, base_cost=10.0),
         "chain12": lambda: synthetic.chain(12, mem=8)}


def _budgets(graph):
    peak = checkpoint_all_peak(graph)
    return sorted({peak, int(peak * 0.8), int(peak * 0.65)})


@pytest.mark.parametrize("name", sorted(SMALL))
def test_within_stated_gap_of_the_milp_optimum(name):
    graph = SMALL[name]()
    for budget in _budgets(graph):
        try:
            exact = solve(graph, budget, strategy="checkmate_milp", mip_gap=1e-9, time_limit_s=60)
        except InfeasibleBudgetError:
            with pytest.raises(InfeasibleBudgetError):
                solve(graph, budget, strategy="hierarchical")
            continue
        assert exact.optimal
        try:
            result = solve(graph, budget, strategy="hierarchical")
        except InfeasibleBudgetError as exc:
            # one recomputation per block reaches less far than the MILP; the minimum it names works
            assert exc.min_feasible_budget_bytes > budget
            assert solve(graph, exc.min_feasible_budget_bytes, strategy="hierarchical").peak_memory_bytes \
                <= exc.min_feasible_budget_bytes
            continue
        assert_valid_schedule(graph, result.schedule, budget)
        tol = 1e-9 * max(1.0, exact.compute_cost)
        assert result.compute_cost >= exact.compute_cost - tol
        assert result.lower_bound <= exact.compute_cost + tol
        # the stated gap covers the distance to the optimum
        assert result.compute_cost - exact.compute_cost <= result.gap * result.compute_cost + tol
        assert not result.optimal or result.compute_cost <= exact.compute_cost + tol


def test_beats_chen_greedy_on_a_deep_network_and_states_its_bound():
    graph = synthetic.resnet(40)
    budget = int(checkpoint_all_peak(graph) * 0.5)
    result = solve(graph, budget, strategy="hierarchical")
    assert_valid_schedule(graph, result.schedule, budget)
    greedy = solve(graph, budget, strategy="chen_greedy")
    assert result.compute_cost <= greedy.compute_cost
    from checkmate.bounds import cost_lower_bound

    assert result.lower_bound == pytest.approx(min(cost_lower_bound(graph, budget), result.compute_cost))
    assert graph.total_cost <= result.lower_bound <= result.compute_cost
    assert "bound from the bytes each node's first run leaves" in result.status
    assert "distinct blocks solved" in result.status


def test_identical_blocks_are_solved_once(monkeypatch):
    solves = []
    real = hier.group_menu

    def counting(graph, group, *args, **kwargs):
        solves.append(group.signature(graph))
        return real(graph, group, *args, **kwargs)

    monkeypatch.setattr(hier, "group_menu", counting)
    counts = {}
    for blocks in (10, 30):
        solves.clear()
        graph = synthetic.resnet(blocks)
        plan = hier.HierarchicalPlan()
        hier.hierarchical_schedule(graph, int(checkpoint_all_peak(graph) * 0.5), plan=plan)
        assert len(solves) == len(set(solves)) == plan.distinct_groups_solved
        counts[blocks] = len(solves)
    # three times the blocks, the same distinct groups: the work does not grow with depth
    assert counts[30] == counts[10]


def test_graph_without_block_structure_is_coarsened():
    # every forward node reads the two before it: no articulation point anywhere
    fwd = [(f"op{i}", 1.0 + i % 3, 1 << 10, [j for j in (i - 1, i - 2) if j >= 0]) for i in range(100)]
    fwd.append(("loss", 0.1, 4, [99]))
    graph = synthetic.training_graph(fwd, name="dense")
    assert not graph.articulation_points() or len(graph.articulation_points()) < 3
    budget = int(checkpoint_all_peak(graph) * 0.6)
    result = solve(graph, budget, strategy="hierarchical")
    assert_valid_schedule(graph, result.schedule, budget)
    assert "cut at their narrowest points" in result.status


def test_graphs_without_backward_or_forward_nodes():
    forward_only = GraphBuilder("fwd")
    prev = None
    for i in range(6):
        prev = forward_only.add_node(f"f{i}", 1.0, 4, [] if prev is None else [prev], output=(i == 5))
    graph = forward_only.build()
    result = solve(graph, checkpoint_all_peak(graph), strategy="hierarchical")
    assert_valid_schedule(graph, result.schedule, checkpoint_all_peak(graph))
    backward_only = GraphBuilder("bwd")
    a = backward_only.add_node("a", 1.0, 4, backward=True)
    backward_only.add_node("b", 1.0, 4, [a], backward=True, output=True)
    graph = backward_only.build()
    result = solve(graph, "100%", strategy="hierarchical")
    assert_valid_schedule(graph, result.schedule)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_dags(max_nodes=5))
def test_random_dags_valid_and_never_below_the_brute_force_optimum(graph):
    peak = checkpoint_all_peak(graph)
    for budget in sorted({b for b in (peak, int(peak * 0.8)) if b >= 1}):
        try:
            result = solve(graph, budget, strategy="hierarchical")
        except InfeasibleBudgetError as exc:
            assert exc.min_feasible_budget_bytes is not None and exc.min_feasible_budget_bytes > budget
            continue
        assert_valid_schedule(graph, result.schedule, budget)
        best = brute_force_optimum(graph, budget)
        assert best is not None
        assert result.compute_cost >= best[0] - 1e-9
        assert result.lower_bound <= best[0] + 1e-9


def test_interrupt_returns_the_best_schedule_so_far():
    graph = synthetic.resnet(20)
    budget = int(checkpoint_all_peak(graph) * 0.6)
    calls = []

    def progress(elapsed, best_cost):
        calls.append(best_cost)
        if best_cost is not None:
            raise KeyboardInterrupt

    plan = hier.HierarchicalPlan()
    schedule, cost, peak = hier.hierarchical_schedule(graph, budget, plan=plan, progress=progress)
    assert peak <= budget
    assert any("interrupted" in note for note in plan.notes)
    assert_valid_schedule(graph, schedule, budget)


def test_auto_is_exact_on_small_graphs_and_never_worse_than_the_baselines():
    graph = SMALL["unet3"]()
    budget = int(checkpoint_all_peak(graph) * 0.8)
    result = solve(graph, budget, strategy="auto", mip_gap=1e-9)
    exact = solve(graph, budget, strategy="checkmate_milp", mip_gap=1e-9)
    assert result.compute_cost == pytest.approx(exact.compute_cost)
    big = synthetic.resnet(40)
    budget = int(checkpoint_all_peak(big) * 0.5)
    result = solve(big, budget, strategy="auto")
    assert_valid_schedule(big, result.schedule, budget)
    assert big.n > 160 and result.status.startswith(("hierarchical", "chen_greedy", "griewank_logn"))
    for baseline in ("chen_greedy", "griewank_logn"):
        try:
            assert result.compute_cost <= solve(big, budget, strategy=baseline).compute_cost + 1e-9
        except InfeasibleBudgetError:
            pass


@pytest.mark.slow  # the run at the named minimum searches up to solve's default limit: 5-8 minutes of one core
def test_auto_names_a_minimum_at_which_it_succeeds():
    graph = synthetic.resnet(40)
    with pytest.raises(InfeasibleBudgetError) as info:
        solve(graph, graph.fixed_mem + 1, strategy="auto")
    minimum = info.value.min_feasible_budget_bytes
    assert minimum is not None
    result = solve(graph, minimum, strategy="auto")
    assert_valid_schedule(graph, result.schedule, minimum)


def test_a_short_time_limit_builds_the_short_groups_first(monkeypatch):
    """Menus are built for runs of one segment, then two, ...: when the time limit's menu share runs
    out, the programme plans with the shorter runs (a valid schedule, the limit kept, and it says so)."""
    import time

    graph = synthetic.resnet(20)
    budget = int(checkpoint_all_peak(graph) * 0.5)
    full = hier.HierarchicalPlan()
    hier.hierarchical_schedule(graph, budget, plan=full)
    real = hier.group_menu
    lengths = []

    def slow(graph, group, *args, **kwargs):
        time.sleep(0.05)      # every menu takes a while, so that the share runs out part way
        lengths.append(group.nodes.size)
        return real(graph, group, *args, **kwargs)

    monkeypatch.setattr(hier, "group_menu", slow)
    started = time.perf_counter()
    result = solve(graph, budget, strategy="hierarchical", time_limit_s=0.6)
    assert time.perf_counter() - started < 5.0
    assert_valid_schedule(graph, result.schedule, budget)
    assert "within the time limit" in result.status
    assert 0 < len(lengths) < full.distinct_groups_solved


def _late_side_value_step():
    """A training step whose one segment holds a large value (``side``) that only the last backward
    node reads: recomputed with the segment when its backward starts, it is resident through it all."""
    b = GraphBuilder(name="late-side-value")
    x = b.add_node("x", cost=1.0, mem=4)
    f1 = b.add_node("f1", cost=1.0, mem=4, deps=[x])
    side = b.add_node("side", cost=1.0, mem=64, deps=[x])
    f2 = b.add_node("f2", cost=1.0, mem=4, deps=[f1, side])
    f3 = b.add_node("f3", cost=1.0, mem=4, deps=[f2])
    loss = b.add_node("loss", cost=1.0, mem=1, deps=[f3], backward=True, output=True)
    g3 = b.add_node("g3", cost=1.0, mem=4, deps=[loss, f3, f2], backward=True)
    g2 = b.add_node("g2", cost=1.0, mem=4, deps=[g3, f1], backward=True)
    b.add_node("g1", cost=1.0, mem=4, deps=[g2, side, x], backward=True, output=True)
    return b.build()


def _frugal(graph, just_in_time, monkeypatch):
    monkeypatch.setattr(hier, "JUST_IN_TIME", just_in_time)
    planner = hier._Planner(graph, None)
    return planner.evaluate(hier._frugal_choice(planner))


def test_values_are_recomputed_where_first_needed(monkeypatch):
    graph = _late_side_value_step()
    cost_all, peak_all, R_all, _ = _frugal(graph, False, monkeypatch)
    cost, peak, R, S = _frugal(graph, True, monkeypatch)
    side = next(i for i, node in enumerate(graph.nodes) if node.name == "side")
    g1 = next(i for i, node in enumerate(graph.nodes) if node.name == "g1")
    # the same computations, the side value's recomputation moved to its reader's stage
    assert cost == cost_all
    assert R.sum() == R_all.sum()
    assert R[g1, side] and not R_all[g1, side]
    assert peak < peak_all
    assert_valid_schedule(graph, Schedule.from_matrices(graph, R, S))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_dags(min_nodes=4, max_nodes=14))
def test_just_in_time_recomputes_no_more_than_at_the_segment_start(graph):
    """Each value a group does not keep is still recomputed at most once: no more work than
    recomputing the whole group when its backward starts, and a valid schedule."""
    planner = hier._Planner(graph, None)
    choice = hier._frugal_choice(planner)
    if not choice:
        return
    results = {}
    for jit in (False, True):
        hier.JUST_IN_TIME = jit
        try:
            results[jit] = planner.evaluate(choice)
        finally:
            hier.JUST_IN_TIME = True
    assert results[True][0] <= results[False][0] + 1e-9
    R, S = results[True][2], results[True][3]
    assert_valid_schedule(graph, Schedule.from_matrices(graph, R, S))


def test_a_budget_below_every_programme_is_met_by_repairing_the_one_planned_for_the_least_peak():
    """Where one level of recomputation cannot reach the budget, the programme planned for the least
    peak it reaches is repaired to it (holds dropped at the peak); far below, the least peak is named."""
    graph = synthetic.resnet(6, mem=4, cost=5.0)
    planner = hier._Planner(graph, None)
    frugal = planner.evaluate(hier._frugal_choice(planner))[1]
    budget = frugal - 1
    plan = hier.HierarchicalPlan()
    schedule, cost, peak = hier.hierarchical_schedule(graph, budget, plan=plan)
    assert peak <= budget
    assert any("repaired" in note for note in plan.notes)
    assert_valid_schedule(graph, schedule, budget)
    # the MILP proves no optimum of this graph within a minute; its proven bound is what the repaired
    # programme's cost cannot be below
    exact = solve(graph, budget, strategy="checkmate_milp", mip_gap=1e-9, time_limit_s=10)
    assert exact.lower_bound is not None and cost >= exact.lower_bound - 1e-9
    result = solve(graph, budget, strategy="hierarchical")
    assert "repaired" in result.status and result.peak_memory_bytes <= budget
    far = int(frugal / (1 + 2 * hier.RELAXED_REPAIR_MAX_EXCESS))
    with pytest.raises(InfeasibleBudgetError) as info:
        hier.hierarchical_schedule(graph, far)
    assert info.value.min_feasible_budget_bytes == frugal
