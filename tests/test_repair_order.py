"""The repair of a schedule to a budget tries the drops of holds in increasing cost per byte and stops
early: it must choose exactly what trying every drop at the peak chooses."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from checkmate import synthetic
from checkmate.bounds import checkpoint_all_peak, checkpoint_all_schedule
from checkmate.simulate import simulate
from checkmate.solvers.candidates import evaluate, forced_retention, schedule_from_retain
from checkmate.solvers.rounding import repair_to_budget

from cases import assert_valid_schedule, exchanges_with_and_without_memo


def _repair_trying_every_drop(graph, schedule, budget_bytes):
    """Reference: at each step every hold at the peak is dropped in turn and the least added cost per
    byte of peak removed is kept."""
    forced = forced_retention(graph)
    current = evaluate(graph, schedule, "reference")
    while current.peak_bytes > budget_bytes:
        t = simulate(graph, current.schedule).peak_step.stage
        S = current.schedule.retain
        best, best_score = None, math.inf
        for i in np.flatnonzero(S[t] & ~forced[t]):
            S2 = np.array(S)
            end = t
            while end < graph.n and S2[end, i]:
                S2[end, i] = False
                end += 1
            cand = evaluate(graph, schedule_from_retain(graph, S2), "reference")
            if cand is None or cand.peak_bytes >= current.peak_bytes:
                continue
            score = (cand.cost - current.cost) / (current.peak_bytes - cand.peak_bytes)
            if score < best_score:
                best, best_score = cand, score
        if best is None:
            return None
        current = best
    return current


@pytest.mark.parametrize("make", [lambda: synthetic.unet(3), lambda: synthetic.random_forward(14, seed=2),
                                  lambda: synthetic.resnet(4, mem=4)])
def test_repair_chooses_as_trying_every_drop(make):
    graph = make()
    peak = checkpoint_all_peak(graph)
    compared = 0
    for fraction in (0.8, 0.6):
        budget = int(peak * fraction)
        reference = _repair_trying_every_drop(graph, checkpoint_all_schedule(graph), budget)
        found = repair_to_budget(graph, checkpoint_all_schedule(graph), budget)
        assert (found is None) == (reference is None)
        if found is None:
            continue
        assert_valid_schedule(graph, found.schedule, budget)
        assert np.array_equal(found.schedule.retain, reference.schedule.retain)
        assert found.cost == pytest.approx(reference.cost)
        compared += 1
    assert compared >= 1


@pytest.mark.parametrize("seed", range(4))
def test_pruning_the_changed_rows_equals_the_full_pass(seed):
    from checkmate.bounds import prune_unused_holds

    graph = synthetic.random_forward(16, seed=seed)
    rng = np.random.default_rng(seed)
    S = prune_unused_holds(graph, checkpoint_all_schedule(graph).retain | forced_retention(graph))
    for _ in range(12):
        held = np.argwhere(S & ~forced_retention(graph))
        if not len(held):
            break
        t, i = held[rng.integers(len(held))]
        end = t
        S2 = np.array(S)
        while end < graph.n and S2[end, i]:
            S2[end, i] = False
            end += 1
        S = prune_unused_holds(graph, S2, changed_rows=(t, end - 1))
        assert np.array_equal(S, prune_unused_holds(graph, S2))


@pytest.mark.slow
def test_repair_and_refinement_with_values_that_must_run_once():
    """GPT-2's graph has dropout states that are never recomputed: a drop that makes a value be
    recomputed may need such an input held again, which the rebuild from S restores. (About 35 s: the
    reference refinement replays every move of every round.)"""
    from pathlib import Path

    import checkmate
    from checkmate.errors import InfeasibleBudgetError
    from checkmate.graph import load_graph
    from checkmate.solvers import parse_budget
    from checkmate.solvers.registry import STRATEGIES
    from checkmate.solvers.rounding import improve_by_holding
    from checkmate.solvers.types import SolveOptions

    from test_milp import _improve_by_replaying_every_move

    graph = load_graph(Path(__file__).resolve().parents[1] / "experiments" / "results" / "graphs" / "real" / "gpt2.json")
    assert not graph.recomputable.all()
    budget = parse_budget("50%", graph)
    with pytest.raises(InfeasibleBudgetError) as info:
        checkmate.solve(graph, budget, strategy="chen_greedy_linearized")
    start = STRATEGIES["chen_greedy_linearized"].fn(graph, int(info.value.min_feasible_budget_bytes),
                                                    SolveOptions()).schedule
    found = repair_to_budget(graph, start, budget)
    reference = _repair_trying_every_drop(graph, start, budget)
    assert found is not None and reference is not None
    assert_valid_schedule(graph, found.schedule, budget)
    assert np.array_equal(found.schedule.retain, reference.schedule.retain)
    fast = improve_by_holding(graph, found, budget)
    slow = _improve_by_replaying_every_move(graph, found, budget)
    assert fast.cost == pytest.approx(slow.cost) and fast.cost < found.cost
    assert_valid_schedule(graph, fast.schedule, budget)


def _values_that_run_once(graph, rng):
    """The graph with a few forward values marked never to be recomputed (held by force while used)."""
    from checkmate.graph import graph_from_dict

    data = graph.to_dict()
    for node in data["nodes"]:
        if not node["backward"] and rng.random() < 0.2:
            node["recomputable"] = False
    return graph_from_dict(data)


def _pruned_starts(seed, rng, densities):
    """A random graph (with values that run once for odd seeds) and, per density of random holds, its
    pruned S with the forced holds, minimal R and stage peaks."""
    from checkmate.bounds import prune_unused_holds
    from checkmate.schedule import minimal_recompute
    from checkmate.simulate import ReadIndex, stage_peak_bytes

    graph = synthetic.random_forward(18, seed=seed, skip_prob=0.5)
    if seed % 2:
        graph = _values_that_run_once(graph, rng)
    forced = forced_retention(graph)
    index = ReadIndex(graph)
    lower = np.tri(graph.n, k=-1, dtype=bool)
    for density in densities:
        S = prune_unused_holds(graph, (rng.random((graph.n, graph.n)) < density) & lower | forced)
        R = minimal_recompute(graph, S)
        yield graph, forced, index, S, R, stage_peak_bytes(graph, R, S, index=index)


@pytest.mark.parametrize("seed", range(6))
def test_each_drop_equals_the_rebuild(seed):
    """The repair evaluates a drop by searching only the rows it changes (the hold's column back to the
    value's last read, the rows a pruning changes beyond it): the matrices, stage peaks and added cost
    must be those of the rebuild from S (forced holds back, full pruning, minimal R, full replay), from
    pruned schedules with random holds (holds that begin with a recomputation) and forced ones."""
    from checkmate.bounds import prune_unused_holds
    from checkmate.schedule import minimal_recompute
    from checkmate.simulate import peak_memory_bytes, stage_peak_bytes
    from checkmate.solvers import rounding
    from checkmate.solvers.rounding import _drop_hold

    rng = np.random.default_rng(seed)
    checked = 0
    paths = set()
    for graph, forced, index, S, R, peaks in _pruned_starts(seed, rng, (1.0, 0.6, 0.3)):
        assert graph.fixed_mem + peaks.max() == peak_memory_bytes(graph, R, S) == simulate(
            graph, schedule_from_retain(graph, S)).peak_memory_bytes
        stages = np.sort(rng.choice(graph.n, size=7, replace=False))
        assert np.array_equal(stage_peak_bytes(graph, R, S, stages, index=index), peaks[stages])
        for t, i in np.argwhere(S & ~forced).tolist():
            R2, S2, peaks2, added = _drop_hold(graph, R, S, peaks, forced, t, i, index)
            raw = np.array(S)
            end = t
            while end < graph.n and raw[end, i]:
                raw[end, i] = False
                end += 1
            users = list(graph.users[i])
            reading = t + np.flatnonzero(R[t:end][:, users].any(axis=1)) if users else np.zeros(0, dtype=np.int64)
            # the drop's recomputations found from the stages that read the value, or (a forced hold
            # pruned before is needed again) from the rows settled in full
            paths.add(rounding._recomputed_for(graph, R, raw, forced, i, reading) is None)
            S_ref = prune_unused_holds(graph, raw | forced)
            R_ref = minimal_recompute(graph, S_ref)
            assert np.array_equal(S2, S_ref), (t, i)
            assert np.array_equal(R2, R_ref), (t, i)
            assert np.array_equal(peaks2, stage_peak_bytes(graph, R_ref, S_ref, index=index)), (t, i)
            assert added == pytest.approx(float(graph.cost @ R_ref.sum(axis=0)) - float(graph.cost @ R.sum(axis=0)))
            checked += 1
    # values that run once (odd seeds) send some drops down the full path
    assert checked > 50 and paths == ({True, False} if seed % 2 else {False})


@pytest.mark.parametrize("seed", range(4))
def test_pruning_rows_with_the_forced_holds_put_back_equals_the_full_pass(seed):
    """A move that adds or drops holds in a few rows of a pruned S, settled from those rows down with the
    forced holds put back, gives the full pruning of the changed matrix with the forced holds."""
    from checkmate.bounds import prune_rows, prune_unused_holds

    rng = np.random.default_rng(seed)
    graph = _values_that_run_once(synthetic.random_forward(16, seed=seed, skip_prob=0.5), rng)
    forced = forced_retention(graph)
    assert (forced & ~graph.output[None, :]).any()
    lower = np.tri(graph.n, k=-1, dtype=bool)
    S = prune_unused_holds(graph, (rng.random((graph.n, graph.n)) < 0.5) & lower | forced)
    for _ in range(40):
        i = int(rng.integers(graph.n - 2))
        low = int(rng.integers(i + 1, graph.n - 1))
        high = int(rng.integers(low, graph.n - 1))
        S2 = np.array(S)
        S2[low:high + 1, i] = bool(rng.random() < 0.5)
        reference = prune_unused_holds(graph, S2 | forced)
        prune_rows(graph, S2, low, high, restore=forced)
        assert np.array_equal(S2, reference)
        S = S2


@pytest.mark.parametrize("seed", range(6))
def test_each_refinement_move_equals_the_rebuild(seed):
    """The refinement holds a recomputed value from its last stage resident instead: its pruning starts
    where the recomputation was and its costing searches only the stages whose needs can change. Both
    must be the rebuild's (forced holds back, full pruning, minimal R), from pruned schedules with random
    holds, on graphs with values that run once."""
    from checkmate.bounds import prune_unused_holds
    from checkmate.schedule import minimal_recompute
    from checkmate.simulate import stage_peak_bytes
    from checkmate.solvers.rounding import (_held_instead, _held_instead_rows, _hold_rows, _last_resident,
                                            _move_cost, _recompute_changed_stages)

    rng = np.random.default_rng(seed)
    checked = 0
    for graph, forced, index, S, R, peaks in _pruned_starts(seed, rng, (0.7, 0.4, 0.15)):
        stage_costs = (R * graph.cost[None, :]).sum(axis=1)
        for t, i in np.argwhere(np.tril(R, -1)).tolist():
            S2 = _held_instead(graph, forced, R, S, t, i, True)
            raw = np.array(S)
            raw[_last_resident(R, S, t, i) + 1:t + 1, i] = True
            S_ref = prune_unused_holds(graph, raw | forced)
            assert np.array_equal(S2, S_ref), (t, i)
            R_ref = minimal_recompute(graph, S_ref)
            found = _move_cost(graph, R, S, stage_costs, float(stage_costs.sum()), S2, t, i)
            assert found == pytest.approx(float(graph.cost @ R_ref.sum(axis=0)))
            # as a move is applied: the stages it can change searched and replayed, the rest's peaks
            # raised by the hold
            rows, gained = _hold_rows(R, S, S2, t, i)
            # the rows the move can change lie from the lowest one it reports up to t: comparing only
            # those gives the same rows
            S3, low = _held_instead_rows(graph, forced, R, S, t, i, True)
            assert np.array_equal(S3, S2) and np.array_equal(S2[:low], S[:low]) and np.array_equal(S2[t + 1:], S[t + 1:])
            rows3, gained3 = _hold_rows(R, S, S2, t, i, low)
            assert np.array_equal(rows3, rows) and np.array_equal(gained3, gained)
            stages = np.union1d(rows, rows[rows > 0] - 1)
            assert np.array_equal(_recompute_changed_stages(graph, R, S2, rows), R_ref), (t, i)
            peaks2 = np.array(peaks)
            peaks2[gained] += int(graph.mem[i])
            peaks2[stages] = stage_peak_bytes(graph, R_ref, S2, stages, index=index)
            assert np.array_equal(peaks2, stage_peak_bytes(graph, R_ref, S_ref, index=index)), (t, i)
            checked += 1
    assert checked > 30


def test_a_deferred_schedule_has_the_plan_of_one_built_at_once():
    """The local searches build schedules whose plan is derived when first read: it must be the plan
    that :meth:`Schedule.from_matrices` derives, also when read under an expired time limit."""
    from checkmate._deadline import deadline_scope
    from checkmate.schedule import Schedule

    rng = np.random.default_rng(3)
    for graph, forced, index, S, R, peaks in _pruned_starts(3, rng, (0.6,)):
        deferred = Schedule._deferred(graph, R, S)
        with deadline_scope(time.perf_counter() - 1.0):
            plan = deferred.plan
        assert plan == Schedule.from_matrices(graph, R, S).plan and len(plan) >= graph.n
        assert deferred == Schedule.from_matrices(graph, R, S)


@pytest.mark.parametrize("seed", [1, 4, 6, 8])
def test_the_exchanges_land_on_the_same_schedule_with_and_without_the_move_memo(seed, monkeypatch):
    """The exchanges keep refinement moves' costs under a hash of the rows each reads: on random graphs
    (values that run once for seed 1: forced holds put back by the pruning) the search must land on
    the schedule it reaches when every move is costed again."""
    from checkmate.solvers import parse_budget
    from checkmate.solvers.rounding import improve_by_holding

    rng = np.random.default_rng(seed)
    graph = synthetic.random_forward(40, seed=seed, skip_prob=0.4)
    if seed % 2:
        graph = _values_that_run_once(graph, rng)
    found = None
    for pct in ("60%", "70%", "80%"):
        budget = parse_budget(pct, graph)
        start = repair_to_budget(graph, checkpoint_all_schedule(graph), budget)
        if start is not None:
            found = (budget, improve_by_holding(graph, start, budget))
            break
    assert found is not None
    budget, start = found
    with_memo, without, served = exchanges_with_and_without_memo(monkeypatch, graph, start, budget, tries=40,
                                                                 seed=seed)
    assert served > 0 and with_memo.cost < start.cost     # the exchanges gained: schedules changed
    assert np.array_equal(with_memo.schedule.retain, without.schedule.retain)
    assert with_memo.cost == without.cost
    assert_valid_schedule(graph, with_memo.schedule, budget)
