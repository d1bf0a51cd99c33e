"""The repair of a schedule to a budget tries the drops of holds in increasing cost per byte and stops
early: it must choose exactly what trying every drop at the peak chooses."""

from __future__ import annotations

import math

import numpy as np
import pytest

from checkmate import synthetic
from checkmate.bounds import checkpoint_all_peak, checkpoint_all_schedule
from checkmate.simulate import simulate
from checkmate.solvers.candidates import evaluate, forced_retention, schedule_from_retain
from checkmate.solvers.rounding import repair_to_budget

from cases import assert_valid_schedule


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
