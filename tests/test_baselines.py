"""The classic baselines: checkpoint-all/last, Chen et al.'s sqrt(n) and greedy segmentations (over
articulation points and linearized), and Griewank's binomial checkpointing. Every schedule goes through
the one validator; expected numbers on the tiny cases are derived by hand in the comments."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cases import (assert_valid_schedule, brute_force_optimum, diamond, random_dags, skip_connection,
                   training_chain)
from checkmate.errors import InfeasibleBudgetError, InvalidArgumentError
from checkmate.graph import Graph
from checkmate.schedule import Schedule, minimal_recompute
from checkmate.simulate import peak_memory_bytes, simulate
from checkmate.solvers import STRATEGIES, solve
from checkmate.solvers.baselines import (_finish, checkpoint_all_schedule, chen_greedy_checkpoint_sets,
                                         chen_sqrtn_schedule, griewank_schedule, revolve_snapshots,
                                         revolve_table)

BASELINES = ["checkpoint_all", "checkpoint_last_node", "chen_sqrtn", "chen_greedy", "chen_sqrtn_linearized",
             "chen_greedy_linearized", "griewank_logn"]
BUDGET_AWARE = [name for name in BASELINES if STRATEGIES[name].budget_aware]
PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def run(graph: Graph, strategy: str, budget) -> tuple[float, int]:
    result = solve(graph, budget, strategy=strategy)
    sim = assert_valid_schedule(graph, result.schedule, result.budget_bytes)
    assert sim.compute_cost == pytest.approx(result.compute_cost)
    return sim.compute_cost, sim.peak_memory_bytes


@st.composite
def dags_with_fixed_nodes(draw, max_nodes: int = 12):
    """random_dags, with some nodes marked non-recomputable (they must run exactly once) and, in some
    graphs, arbitrary backward flags (forward and backward nodes interleaved, or all of one kind)."""
    graph = draw(random_dags(max_nodes=max_nodes))
    fixed = draw(st.lists(st.booleans(), min_size=graph.n, max_size=graph.n))
    if draw(st.booleans()):
        backward = draw(st.lists(st.booleans(), min_size=graph.n, max_size=graph.n))
    else:
        backward = graph.backward.tolist()
    nodes = [replace(node, recomputable=not flag, backward=bwd)
             for node, flag, bwd in zip(graph.nodes, fixed, backward)]
    return Graph(nodes, graph.edges, name="random-fixed")


# ------------------------------------------------------------------------------------------ hand-checked
# training_chain(4), unit cost and size: f0 f1 f2 f3(loss) are stages 0-3, g3 g2 g1 g0 stages 4-7;
# g_j reads g_{j+1} and f_j; g0 is the output. Articulation points: f1, f2.
def test_chain4_checkpoint_all():
    # Each node once: cost 8. At g3 (stage 4) f0..f3 and g3 are all resident: peak 5.
    assert run(training_chain(4), "checkpoint_all", 100) == (8.0, 5)


def test_chain4_checkpoint_last_node():
    # Forward 4. g3 reads the held f3 (1). g2 recomputes f0 f1 f2 from nothing (3+1), g1 recomputes
    # f0 f1 (2+1), g0 recomputes f0 (1+1): 4 + 1 + 4 + 3 + 2 = 14. At most the held gradient, two
    # chain values in flight and the new gradient: peak 3.
    assert run(training_chain(4), "checkpoint_last_node", 100) == (14.0, 3)


def test_chain4_chen_sqrtn():
    # 2 candidates, k = ceil(sqrt 2) = 2: checkpoint f2. Segment {f0, f1} is dropped after the forward
    # pass and recomputed once at g1 (its first backward reader): cost 8 + 2 = 10. Segment {f3} (the
    # loss) is kept. Peak 4 at g1: g2, recomputed f0 (held for g0) and f1, and g1 itself.
    schedule = chen_sqrtn_schedule(training_chain(4))
    assert schedule.recompute[6, [0, 1]].all() and schedule.recompute_count == 2
    assert run(training_chain(4), "chen_sqrtn", 100) == (10.0, 4)


def test_chain4_chen_greedy():
    # Greedy thresholds give {f1, f2}, {f1}, {f2} and {}. {} keeps the single segment (the loss's) whole:
    # checkpoint-all, (8, 5). {f1, f2} and {f1} both only recompute f0 for g0: (9, 4) (g3 sees f1 f2 f3
    # g3). {f2} is sqrt(n)'s (10, 4).
    graph = training_chain(4)
    assert chen_greedy_checkpoint_sets(graph, graph.articulation_points()) == [(1, 2), (1,), (2,), ()]
    assert run(graph, "chen_greedy", 5) == (8.0, 5)
    assert run(graph, "chen_greedy", 4) == (9.0, 4)
    with pytest.raises(InfeasibleBudgetError) as info:
        solve(graph, 3, strategy="chen_greedy")
    assert info.value.min_feasible_budget_bytes == 4


def test_chain4_griewank():
    # States y1..y4 = f0..f3 (y0: nothing, free). s = 2 slots: the DP snapshots f1 and f2 in the first
    # sweep; the turns of f3, f2, f1 are free and f0 is recomputed once: cost 9, and at g3 f1 f2 f3 g3
    # are resident: peak 4. s = 0: every turn recomputes from scratch, 1+2+3 extra steps -> cost 14,
    # peak 3 (as checkpoint_last_node). Nothing runs in 2: a gradient, its input and a chain value.
    graph = training_chain(4)
    assert run(graph, "griewank_logn", 4) == (9.0, 4)
    assert run(graph, "griewank_logn", 3) == (14.0, 3)
    with pytest.raises(InfeasibleBudgetError) as info:
        solve(graph, 2, strategy="griewank_logn")
    assert info.value.min_feasible_budget_bytes == 3
    assert "3 bytes" in str(info.value)


def test_diamond():
    # a l r j | gj gl gr ga with sizes 4 6 2 4 | 4 6 2 4. No articulation point, so Chen's sqrt(n) has
    # one segment, the loss's, kept whole: checkpoint-all, cost 13, peak 22 at gl (a l r gj gl).
    graph = diamond()
    assert graph.articulation_points() == ()
    assert run(graph, "checkpoint_all", "100%") == (13.0, 22)
    assert run(graph, "chen_sqrtn", "100%") == (13.0, 22)
    # Linearized: candidates a l r, k = 2, checkpoint l. {a} is dropped after r and recomputed for ga
    # (+2); {r, j} runs straight into the backward pass and is kept. Peak 18 at gl (l r gj gl).
    assert run(graph, "chen_sqrtn_linearized", "100%") == (15.0, 18)
    # Without articulation points the chain is one step (a -> j): binomial checkpointing keeps it all.
    assert run(graph, "griewank_logn", "100%") == (13.0, 22)


def test_skip_connection_chen_sqrtn():
    # x c1 c2 add loss | gadd gc2 gc1 gx, sizes 8 (loss 1), costs 1 4 4 1 1 | 1 4 4 1 = 21. The only
    # articulation point is add: checkpoint it. {x, c1, c2} is recomputed at gc2 minus c2 (nothing in
    # the backward pass reads it): x + c1 = 5 more, cost 26. Peak 32 at gc2 (gadd x c1 gc2).
    assert run(skip_connection(), "chen_sqrtn", "100%") == (26.0, 32)


# ------------------------------------------------------------------------------------------ properties
def free_after_last_use_peak(graph: Graph) -> int:
    """Each node once, in id order; a value stays from its computation to its last reader (outputs: to
    the end). Written out directly, not through the simulator."""
    n = graph.n
    last = [max(users) if users else i for i, users in enumerate(graph.users)]
    peak = 0
    for k in range(n):
        resident = sum(int(graph.mem[i]) for i in range(k + 1) if graph.output[i] or last[i] >= k)
        peak = max(peak, resident)
    return int(graph.fixed_mem) + peak


@PROPERTY
@given(random_dags())
def test_checkpoint_all_peak_is_free_after_last_use(graph):
    sim = assert_valid_schedule(graph, checkpoint_all_schedule(graph))
    assert sim.peak_memory_bytes == free_after_last_use_peak(graph)
    assert sim.compute_cost == pytest.approx(float(graph.cost.sum()))
    assert sim.recompute_count == 0


@PROPERTY
@given(dags_with_fixed_nodes(), st.floats(0.05, 1.2), st.sampled_from(BASELINES))
def test_every_baseline_fits_or_names_a_budget_that_does(graph, fraction, strategy):
    budget = max(1, int(fraction * free_after_last_use_peak(graph)))
    try:
        run(graph, strategy, budget)
    except InvalidArgumentError:
        assert strategy == "griewank_logn" and not graph.articulation_points()
    except InfeasibleBudgetError as exc:
        least = exc.min_feasible_budget_bytes
        assert least is not None and least > budget
        _, peak = run(graph, strategy, least)
        assert peak <= least
        with pytest.raises(InfeasibleBudgetError) as again:  # and it is the least such budget
            solve(graph, least - 1, strategy=strategy)
        assert again.value.min_feasible_budget_bytes == least


@settings(max_examples=15, deadline=None)
@given(random_dags(max_nodes=5), st.floats(0.3, 1.1))
def test_budget_aware_baselines_never_beat_the_optimum(graph, fraction):
    budget = max(1, int(fraction * free_after_last_use_peak(graph)))
    optimum = brute_force_optimum(graph, budget)
    for strategy in BUDGET_AWARE:
        try:
            cost, _ = run(graph, strategy, budget)
        except (InfeasibleBudgetError, InvalidArgumentError):
            continue
        assert optimum is not None
        assert cost >= optimum[0] - 1e-9


def test_budget_aware_baselines_never_beat_the_optimum_six_nodes():
    # training_chain(3) has 6 nodes; brute force enumerates all 2^15 retention matrices (~10 s, so one
    # budget: three values of 3 bytes, where every schedule must recompute something).
    graph = training_chain(3, cost=2.0, mem=3)
    optimum, _ = brute_force_optimum(graph, 9)
    costs = [run(graph, strategy, 9)[0] for strategy in BUDGET_AWARE]
    assert min(costs) >= optimum - 1e-9
    assert optimum > graph.total_cost


@PROPERTY
@given(dags_with_fixed_nodes(), st.data())
def test_any_retention_matrix_is_made_valid(graph, data):
    # The segment policies rely on _finish to make whatever they keep a valid schedule on any DAG:
    # outputs held, non-recomputable values computed exactly once.
    n = graph.n
    bits = data.draw(st.lists(st.booleans(), min_size=n * n, max_size=n * n))
    R, S = _finish(graph, np.array(bits, dtype=bool).reshape(n, n))
    assert np.array_equal(R, minimal_recompute(graph, S))
    assert_valid_schedule(graph, Schedule.from_matrices(graph, R, S))


@PROPERTY
@given(dags_with_fixed_nodes(), st.data())
def test_fast_peak_equals_the_simulator(graph, data):
    n = graph.n
    bits = data.draw(st.lists(st.booleans(), min_size=n * n, max_size=n * n))
    S = np.array(bits, dtype=bool).reshape(n, n) & np.tri(n, k=-1, dtype=bool)
    S[:, graph.output] |= np.tri(n, k=-1, dtype=bool)[:, graph.output]
    schedule = Schedule.from_retain(graph, S)
    sim = simulate(graph, schedule)
    if sim.valid:
        assert peak_memory_bytes(graph, schedule.recompute, schedule.retain) == sim.peak_memory_bytes


def test_fast_peak_keeps_outputs_read_in_the_last_stage():
    # x (10 bytes, an output) -> y -> z. The last stage recomputes y, which reads x: x must stay (it
    # is an output), so z runs with x, y and z resident: 12 bytes, not the 11 of freeing x after y.
    from checkmate.graph import GraphBuilder

    b = GraphBuilder("outputs")
    x = b.add_node("x", 1, 10, output=True)
    y = b.add_node("y", 1, 1, [x])
    b.add_node("z", 1, 1, [y], output=True)
    graph = b.build()
    S = np.zeros((3, 3), dtype=bool)
    S[1:, x] = True
    schedule = Schedule.from_retain(graph, S)
    assert schedule.recompute[2, y]
    assert simulate(graph, schedule).peak_memory_bytes == 12
    assert peak_memory_bytes(graph, schedule.recompute, schedule.retain) == 12


def reference_minimal_recompute(graph: Graph, S: np.ndarray) -> np.ndarray:
    """Node by node from t down: needed if it is t, newly held into t+1, or an unheld input of a needed node."""
    n = graph.n
    R = np.zeros((n, n), dtype=bool)
    for t in range(n):
        for k in range(t, -1, -1):
            if k == t or (t + 1 < n and S[t + 1, k] and not S[t, k]):
                R[t, k] = True
            if R[t, k]:
                for d in graph.deps[k]:
                    if not S[t, d]:
                        R[t, d] = True
    return R


@PROPERTY
@given(random_dags(), st.data())
def test_minimal_recompute_matches_the_definition(graph, data):
    n = graph.n
    bits = data.draw(st.lists(st.booleans(), min_size=n * n, max_size=n * n))
    S = np.array(bits, dtype=bool).reshape(n, n)
    assert np.array_equal(minimal_recompute(graph, S), reference_minimal_recompute(graph, S))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=12), st.data())
def test_greedy_sets_are_all_threshold_outcomes(sizes, data):
    # Run the greedy walk at every threshold that can make a difference (each integer from -1 to the
    # total: sizes are whole) and compare the distinct outcomes with the enumeration.
    from checkmate.graph import GraphBuilder

    b = GraphBuilder("sizes")
    prev = None
    for i, size in enumerate(sizes):
        prev = b.add_node(f"f{i}", 1, size, [] if prev is None else [prev])
    graph = b.build()
    candidates = sorted(data.draw(st.sets(st.sampled_from(range(len(sizes))))))
    expected = []
    for threshold in range(-1, sum(sizes) + 1):
        total, chosen = 0, []
        for v, size in enumerate(sizes):
            total += size
            if v in candidates and total > threshold:
                chosen.append(v)
                total = 0
        if tuple(chosen) not in expected:
            expected.append(tuple(chosen))
    assert chen_greedy_checkpoint_sets(graph, candidates) == expected


# ------------------------------------------------------------------------------------------ Chen sqrt(n)
@pytest.mark.parametrize("layers", [16, 25, 50, 100, 200, 400])
def test_chen_sqrtn_memory_grows_as_sqrt_n(layers):
    # Unit chain: about sqrt(n) checkpoints plus one segment of about sqrt(n) recomputed values, plus the
    # incoming gradient, the new gradient and the value being read: peak <= 2 sqrt(n) + 3, i.e. at most
    # c * sqrt(n) with c = 2.75 for n >= 16.
    graph = training_chain(layers)
    sim = assert_valid_schedule(graph, chen_sqrtn_schedule(graph))
    assert sim.peak_memory_bytes <= 2 * math.sqrt(layers) + 3
    assert sim.peak_memory_bytes <= 2.75 * math.sqrt(layers)
    baseline = simulate(graph, checkpoint_all_schedule(graph)).peak_memory_bytes
    assert baseline == layers + 1
    if layers >= 100:
        assert sim.peak_memory_bytes * 4 <= baseline
    # About one extra forward pass: every forward value outside the checkpoints and the loss's segment
    # is recomputed exactly once, gradients never.
    forward = list(graph.forward_nodes)
    schedule = chen_sqrtn_schedule(graph)
    counts = schedule.recompute[:, forward].sum(axis=0)
    assert counts.max() <= 2
    extra = int(counts.sum()) - layers
    assert layers - 3 * math.sqrt(layers) <= extra <= layers
    assert schedule.recompute_count == extra


# ------------------------------------------------------------------------------------------ Griewank
def binomial_repetitions(steps: int, snapshots: int) -> int:
    """Griewank & Walther's minimal number of forward steps to reverse ``steps`` steps with
    ``snapshots`` snapshots (the initial state occupying one): t*l - C(s+t, t-1), where t is the unique
    integer with C(s+t-1, s) < l <= C(s+t, s)."""
    t = 1
    while not math.comb(snapshots + t - 1, snapshots) < steps <= math.comb(snapshots + t, snapshots):
        t += 1
    return t * steps - math.comb(snapshots + t, t - 1)


def test_revolve_dp_is_the_closed_form():
    # Our DP has m chain states after a free y0 and s extra slots; Griewank's model has l steps and
    # snapshots that include the initial state: l = m + 1 and snapshots = s + 1 (the state read before
    # each adjoint step shifts by one, and our free y0 is their stored x0).
    cost, _ = revolve_table(40, 12)
    for m in range(1, 41):
        for s in range(13):
            assert cost[m, s] == binomial_repetitions(m + 1, s + 1), (m, s)


@pytest.mark.parametrize("layers", [3, 4, 6, 9, 15, 24])
def test_griewank_recomputations_on_chains_match_the_closed_form(layers):
    # Mapping onto the stage model: training_chain(L) has forward states f0..f_{L-1} (y1..yL; y0 is
    # "nothing", as f0 reads no value), and g_j needs f_j in its stage. Reversal materializes
    # yL, ..., y1 in turn, which is Griewank's reversal of an (L+1)-step chain whose states x1..xL
    # are ours and whose stored x0 is our free y0: the forward evaluations (first computations
    # included) are binomial_repetitions(L+1, s+1), and the first computations are L of them.
    graph = training_chain(layers)
    forward = list(graph.forward_nodes)
    cost, _ = revolve_table(layers, layers - 1)
    for slots in range(layers):
        schedule = griewank_schedule(graph, slots)
        assert_valid_schedule(graph, schedule)
        recomputed = int(schedule.recompute[:, forward].sum()) - len(forward)
        assert recomputed == binomial_repetitions(layers + 1, slots + 1) - layers, slots
        assert recomputed == cost[layers, slots] - layers
        assert schedule.recompute_count == recomputed  # gradients are never recomputed


@pytest.mark.parametrize("steps,slots", [(1, 0), (5, 1), (10, 2), (20, 3), (33, 4), (12, 11)])
def test_revolve_snapshots_never_exceed_the_slots(steps, slots):
    taken = revolve_snapshots(steps, slots)
    # Turns run from y_steps down to y_1; a snapshot of y_j taken at the turn of `host` (steps + 1: the
    # first sweep) is held from then until y_j's own turn.
    for turn in range(steps, 0, -1):
        alive = [j for j, host in taken if host >= turn >= j]
        assert len(alive) <= slots
    assert len({j for j, _ in taken}) <= len(taken)


def test_griewank_memory_is_snapshots_plus_a_constant_on_chains():
    # With s slots the peak on a unit chain is s snapshots + three values (as in the chain4 case).
    graph = training_chain(20)
    for slots in range(6):
        assert simulate(graph, griewank_schedule(graph, slots)).peak_memory_bytes == slots + 3


@pytest.mark.parametrize("layers", [20, 60])
def test_griewank_budget_search_picks_the_fewest_recomputations_that_fit(layers):
    # 60 layers give 60 slot counts: more than the search samples, so this also covers its bisection.
    # Exhaustive reference: every slot count's schedule, its peak, and its closed-form cost.
    graph = training_chain(layers)
    family = [(2 * layers + binomial_repetitions(layers + 1, slots + 1) - layers,
               simulate(graph, griewank_schedule(graph, slots)).peak_memory_bytes) for slots in range(layers)]
    for budget in (3, 4, 5, 8, 17):
        cost, _ = run(graph, "griewank_logn", budget)
        assert cost == min(c for c, peak in family if peak <= budget)
    with pytest.raises(InfeasibleBudgetError) as info:
        solve(graph, 2, strategy="griewank_logn")
    assert info.value.min_feasible_budget_bytes == 3


@pytest.mark.parametrize("strategy", ["chen_greedy_linearized", "griewank_logn"])
def test_sampled_searches_report_the_least_budget_they_accept(strategy):
    # A residual network with several hundred nodes: both families exceed the sampled members.
    from checkmate.synthetic import resnet

    graph = resnet(30, mem=1, cost=1.0)
    with pytest.raises(InfeasibleBudgetError) as info:
        solve(graph, 1, strategy=strategy)
    least = info.value.min_feasible_budget_bytes
    _, peak = run(graph, strategy, least)
    assert peak <= least
    with pytest.raises(InfeasibleBudgetError):
        solve(graph, least - 1, strategy=strategy)
