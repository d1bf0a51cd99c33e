"""The exchanges of holds (``hold_and_repair``) never repeat an exchange on one schedule, end by
themselves at a schedule that no single exchange improves, and end at once when a target cost is met."""

from __future__ import annotations

import time

import numpy as np
import pytest

import checkmate.solvers.rounding as rounding
from checkmate.bounds import checkpoint_all_schedule
from checkmate.simulate import simulate
from checkmate.solvers import parse_budget
from checkmate.solvers.rounding import hold_and_repair, improve_by_holding, repair_to_budget

from cases import assert_valid_schedule, exchanges_with_and_without_memo
from quality_graphs import long_skip_unet


@pytest.fixture(scope="module")
def skip_unet_at_half():
    """The 54-node long-skip U-Net at 50%: holds dropped from checkpoint-all, then refined (1.39x)."""
    graph = long_skip_unet()
    budget = parse_budget("50%", graph)
    dropped = repair_to_budget(graph, checkpoint_all_schedule(graph), budget)
    return graph, budget, improve_by_holding(graph, dropped, budget)


def _recording_repairs(monkeypatch) -> list[bytes]:
    """The schedules the exchanges hand to the repair, packed (one per exchange tried in full)."""
    seen: list[bytes] = []
    real = rounding.repair_to_budget

    def recording(graph, schedule, budget_bytes, **kwargs):
        seen.append(np.packbits(schedule.retain).tobytes())
        return real(graph, schedule, budget_bytes, **kwargs)

    monkeypatch.setattr(rounding, "repair_to_budget", recording)
    return seen


def test_exchanges_end_by_themselves_at_a_local_optimum_without_repeating_one(monkeypatch, skip_unet_at_half):
    # drawn with replacement, the search tried its 400 exchanges (the limit given) in 18 s and
    # reached 1.1323x; without repeats it ends after under a hundred, at 1.1304x
    graph, budget, start = skip_unet_at_half
    seen = _recording_repairs(monkeypatch)
    found = hold_and_repair(graph, start, budget, deadline=time.perf_counter() + 300, tries=400, cost_draws=0.5)
    assert_valid_schedule(graph, found.schedule, budget)
    assert found.cost == pytest.approx(simulate(graph, found.schedule).compute_cost)
    assert found.cost < start.cost * 0.85
    assert len(seen) < 200
    # one schedule is repaired once: an exchange is repeated only on a schedule changed since
    repeats = len(seen) - len(set(seen))
    assert repeats <= 5
    # a local optimum: from it no exchange gains, whatever order they are tried in
    seen.clear()
    again = hold_and_repair(graph, found, budget, deadline=time.perf_counter() + 300, tries=400, seed=7)
    assert again is found
    recomputations = int(np.count_nonzero(np.tril(found.schedule.recompute, -1)))
    assert 0 < len(seen) <= recomputations
    assert len(set(seen)) == len(seen)


def test_exchanges_end_once_the_target_cost_is_met(monkeypatch, skip_unet_at_half):
    graph, budget, start = skip_unet_at_half
    seen = _recording_repairs(monkeypatch)
    # met already: nothing is tried
    assert hold_and_repair(graph, start, budget, deadline=time.perf_counter() + 300, target_cost=start.cost) is start
    assert seen == []
    full = hold_and_repair(graph, start, budget, deadline=time.perf_counter() + 300, cost_draws=0.5)
    tried_in_full = len(seen)
    seen.clear()
    # a target halfway: the search stops at the first schedule that meets it, before the full search's end
    target = (start.cost + full.cost) / 2
    found = hold_and_repair(graph, start, budget, deadline=time.perf_counter() + 300, cost_draws=0.5,
                            target_cost=target)
    assert full.cost <= found.cost <= target
    assert len(seen) < tried_in_full
    assert_valid_schedule(graph, found.schedule, budget)


def test_auto_exchanges_stop_at_the_target_gap_of_the_proven_bound(monkeypatch, skip_unet_at_half):
    # auto's exchanges are told the cost at which the schedule is within its target gap of the bound
    import checkmate.solvers.auto as auto_module
    from checkmate.solvers.types import StrategyOutput, relative_gap

    graph, budget, start = skip_unet_at_half
    given = []

    def recording(graph_, candidate, budget_bytes, *, deadline, **kwargs):
        given.append(kwargs)
        return candidate

    monkeypatch.setattr(auto_module, "hold_and_repair", recording)
    lower = start.cost * 0.9
    auto_module._refine(graph, budget, StrategyOutput(start.schedule, status="ok"), start.cost * 1.5, None,
                        lower, time.perf_counter() + 600)
    assert len(given) == 1
    target = given[0]["target_cost"]
    assert relative_gap(target, lower) == pytest.approx(auto_module.AUTO_TARGET_GAP)


def test_auto_computes_the_memory_bound_once_with_the_hierarchical_plan(monkeypatch):
    # the plan's bound and auto's are the same programme: seconds on graphs of hundreds of nodes
    import checkmate
    import checkmate.bounds as bounds_module
    import checkmate.solvers.auto as auto_module
    import checkmate.solvers.hierarchical as hierarchical_module
    from quality_graphs import dense_blocks

    graph = dense_blocks(blocks=3, layers=8)
    assert auto_module.AUTO_HIERARCHICAL_FIRST_MIN_NODES <= graph.n <= auto_module.AUTO_MILP_MAX_NODES
    budget = parse_budget("50%", graph)
    calls = []

    def counting(*args, **kwargs):
        calls.append(args[1])
        return bounds_module.cost_lower_bound(*args, **kwargs)

    monkeypatch.setattr(auto_module, "cost_lower_bound", counting)
    monkeypatch.setattr(hierarchical_module, "cost_lower_bound", counting)
    result = checkmate.solve(graph, budget, strategy="auto", time_limit_s=20)
    assert result.lower_bound is not None
    assert calls == [budget]


def test_the_repair_searches_again_only_the_stages_a_drop_changes(monkeypatch):
    # every recomputation the repair derives from the rows a drop changed is the minimal one of the
    # whole matrix, and the repair lands where it does with each drop rebuilt in full
    from checkmate.bounds import prune_unused_holds
    from checkmate.schedule import minimal_recompute
    from checkmate.simulate import stage_peak_bytes

    graph = long_skip_unet()
    budget = parse_budget("50%", graph)
    real_drop, real_for = rounding._drop_hold, rounding._recomputed_for
    searched, closed = [], []

    def checking(graph_, R, S, peaks, forced, t, i, index):
        out = real_drop(graph_, R, S, peaks, forced, t, i, index)
        assert np.array_equal(out[0], minimal_recompute(graph_, out[1]))
        return out

    def counting(graph_, R, S2, forced, i, reading):
        out = real_for(graph_, R, S2, forced, i, reading)
        closed.append(out is not None)
        searched.append(len(reading))
        return out

    def rebuilt(graph_, R, S, peaks, forced, t, i, index):
        raw = np.array(S)
        end = t
        while end < graph_.n and raw[end, i]:
            raw[end, i] = False
            end += 1
        S2 = prune_unused_holds(graph_, raw | forced)
        R2 = minimal_recompute(graph_, S2)
        added = float(graph_.cost @ R2.sum(axis=0)) - float(graph_.cost @ R.sum(axis=0))
        return R2, S2, stage_peak_bytes(graph_, R2, S2, index=index), added

    monkeypatch.setattr(rounding, "_drop_hold", checking)
    monkeypatch.setattr(rounding, "_recomputed_for", counting)
    fast = repair_to_budget(graph, checkpoint_all_schedule(graph), budget)
    # the stages a drop searches again are the few that read the value, not the whole hold
    assert len(closed) > 20 and all(closed) and 0 < max(searched) < graph.n
    monkeypatch.setattr(rounding, "_drop_hold", rebuilt)
    full = repair_to_budget(graph, checkpoint_all_schedule(graph), budget)
    assert fast is not None and full is not None
    assert np.array_equal(fast.schedule.retain, full.schedule.retain) and fast.cost == full.cost
    assert_valid_schedule(graph, fast.schedule, budget)


def test_the_move_memo_changes_nothing_but_the_work(monkeypatch, skip_unet_at_half):
    # the exchanges keep each refinement move's cost and budget verdict while the rows it reads are
    # unchanged: the search must land on the very schedule it reaches when every move is costed again,
    # and the memo must have served moves (else this compares a search with itself)
    graph, budget, start = skip_unet_at_half
    with_memo, without, served = exchanges_with_and_without_memo(monkeypatch, graph, start, budget, tries=60, seed=3)
    assert served > 50
    assert with_memo.cost < start.cost
    assert np.array_equal(with_memo.schedule.retain, without.schedule.retain)
    assert with_memo.cost == without.cost
    assert_valid_schedule(graph, with_memo.schedule, budget)


def test_the_array_replay_of_the_repair_and_refinement_is_the_full_replay(skip_unet_at_half):
    # the exchanges repair and refine without a full replay of each result: the cost and peak of the
    # array replay must be the simulator's, on the same schedules
    graph, budget, start = skip_unet_at_half
    for pct in ("80%", "65%", "50%"):
        b = parse_budget(pct, graph)
        full = repair_to_budget(graph, checkpoint_all_schedule(graph), b)
        fast = repair_to_budget(graph, checkpoint_all_schedule(graph), b, replay=False)
        assert np.array_equal(full.schedule.retain, fast.schedule.retain)
        sim = simulate(graph, fast.schedule)
        assert sim.valid and fast.peak_bytes == sim.peak_memory_bytes <= b
        assert fast.cost == pytest.approx(sim.compute_cost, rel=1e-12)
        refined = improve_by_holding(graph, full, b)
        quick = improve_by_holding(graph, fast, b, replay=False)
        assert refined.cost < full.cost
        assert np.array_equal(refined.schedule.retain, quick.schedule.retain)
        sim = simulate(graph, quick.schedule)
        assert sim.valid and quick.peak_bytes == sim.peak_memory_bytes <= b
        assert quick.cost == pytest.approx(sim.compute_cost, rel=1e-12)
