"""The exchanges of holds draw the recomputation to hold in proportion to its cost when asked (all of
the draws, or a share): a free recomputation is never worth an exchange."""

from __future__ import annotations

import numpy as np

from checkmate.bounds import checkpoint_all_peak
from checkmate.simulate import simulate
from checkmate.solvers import solve
from checkmate.solvers.candidates import Candidate
from checkmate.solvers.rounding import hold_and_repair
from checkmate.synthetic import training_graph
import checkmate.solvers.rounding as rounding


def _alternating_chain():
    # every other layer is free to compute again (a reshape, say)
    fwd = [(f"n{k}", 0.0 if k % 2 else 5.0, 4, [k - 1] if k else []) for k in range(12)]
    fwd.append(("loss", 1.0, 1, [11]))
    return training_graph(fwd, name="alternating")


def _drawn_costs(monkeypatch, cost_draws: float) -> list[float]:
    graph = _alternating_chain()
    budget = int(checkpoint_all_peak(graph) * 0.6)
    schedule = solve(graph, budget, strategy="checkpoint_last_node").schedule
    sim = simulate(graph, schedule)
    start = Candidate(schedule, sim.compute_cost, sim.peak_memory_bytes, "start")
    _, drawn_values = np.nonzero(np.tril(schedule.recompute, -1))
    assert {float(graph.cost[v]) for v in drawn_values} == {0.0, 5.0}
    picks: list[int] = []
    real = np.random.default_rng

    class Recording:
        def __init__(self, seed):
            self.rng = real(seed)

        def integers(self, n):
            picks.append(int(self.rng.integers(n)))
            return picks[-1]

        def random(self):
            return self.rng.random()

        def choice(self, n, p):
            picks.append(int(self.rng.choice(n, p=p)))
            return picks[-1]

    monkeypatch.setattr(rounding.np.random, "default_rng", Recording)
    for seed in range(20):
        # one exchange each: the draw is made on the starting schedule's recomputations
        hold_and_repair(graph, start, budget, deadline=float("inf"), seed=seed, tries=1, cost_draws=cost_draws)
    assert len(picks) == 20
    return [float(graph.cost[drawn_values[k]]) for k in picks]


def test_exchanges_by_cost_never_draw_a_free_recomputation(monkeypatch):
    assert all(cost > 0 for cost in _drawn_costs(monkeypatch, cost_draws=1.0))


def test_uniform_exchanges_do_draw_free_recomputations(monkeypatch):
    # the same seeds without the weights: what the weighting avoids happens
    assert any(cost == 0 for cost in _drawn_costs(monkeypatch, cost_draws=0.0))


def test_half_the_exchanges_by_cost_draw_free_recomputations_less_often(monkeypatch):
    free = sum(cost == 0 for cost in _drawn_costs(monkeypatch, cost_draws=0.5))
    assert 0 < free < sum(cost == 0 for cost in _drawn_costs(monkeypatch, cost_draws=0.0))
