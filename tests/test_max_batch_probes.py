"""The max-batch search's MILP probes: yes/no answers that agree with full solves, undecided probes
that never count as fitting, the MILP at least matching Chen's greedy, and the probe cache resuming
an interrupted search without solving again."""

from __future__ import annotations

import functools

import pytest

from checkmate import synthetic
from checkmate.analysis import max_batch as mb
from checkmate.analysis.max_batch import BatchGraphFamily, BatchProbe, decide_milp, max_batch_size
from checkmate.analysis.point_cache import PointCache
from checkmate.solvers import checkpoint_all_peak, solve
from checkmate.solvers.backends import NO_SOLUTION, BackendResult
from checkmate.solvers.backends.highs import HighsBackend

WEIGHTS_BYTES = 3 << 20


def _family() -> BatchGraphFamily:
    """A batch-affine U-Net-shaped graph: 1 MiB of activations per node and sample, fixed weights."""
    def at(batch: int):
        g = synthetic.unet(3, base_mem=batch << 20)
        return type(g)(g.nodes, g.edges, name=f"unet3-b{batch}", fixed_mem=WEIGHTS_BYTES)

    return BatchGraphFamily(at(1), 1, at(2), 2, name="unet3")


LIMIT_BYTES = 96 << 20


@functools.lru_cache(maxsize=None)
def _graph_between_bound_and_optimum():
    """A graph and budget where the LP bound is strictly below the MILP optimum (branch and bound decides)."""
    g = synthetic.unet(4, base_mem=1 << 20)
    budget = int(checkpoint_all_peak(g) * 0.6)
    optimum = solve(g, budget, strategy="checkmate_milp", time_limit_s=60)
    assert optimum.optimal
    bound = solve(g, budget, strategy="lower_bound_lp").lower_bound
    assert bound < optimum.compute_cost
    return g, budget, optimum.compute_cost, bound


def test_early_stopping_probe_agrees_with_a_full_solve():
    g, budget, optimum, bound = _graph_between_bound_and_optimum()
    # below the LP bound, between the bound and the optimum, just under it, at it
    for limit in (0.99 * bound, (bound + optimum) / 2, optimum * (1 - 1e-6), optimum):
        probe = decide_milp(g, 1, budget, limit, time_limit_s=60)
        assert probe.decided
        assert probe.fits == (optimum <= limit), (limit, probe)
        if probe.fits:   # a yes always carries a schedule within both limits
            assert probe.peak_memory_bytes <= budget and probe.compute_cost <= limit * (1 + 1e-9)
        else:
            assert probe.reason == "over compute"


def test_a_probe_that_reaches_its_time_limit_is_undecided_not_a_fit(monkeypatch):
    g, budget, optimum, bound = _graph_between_bound_and_optimum()
    solve_highs = HighsBackend.solve

    def no_answer(self, model, **kwargs):
        if model.integer.any():   # branch and bound stops at its limit with nothing found
            return BackendResult(NO_SOLUTION, message="time limit")
        return solve_highs(self, model, **kwargs)

    monkeypatch.setattr(HighsBackend, "solve", no_answer)
    probe = decide_milp(g, 1, budget, (bound + optimum) / 2, time_limit_s=60)
    assert not probe.fits and not probe.decided and probe.reason.startswith("undecided")
    # what the LP alone decides is still decided
    assert decide_milp(g, 1, budget, 0.99 * bound, time_limit_s=60).decided


def test_undecided_probes_are_not_counted_as_fits(monkeypatch):
    """A search whose probes above some size are undecided reports the largest decided fit, flagged
    as a lower bound, and lists the undecided sizes."""
    def probe(graph, batch_size, memory_bytes, strategy, **kwargs):
        if batch_size <= 5:
            return BatchProbe(batch_size, True, "fits", 1.0, 2.0, 1.0, 1)
        if batch_size <= 9:
            return BatchProbe(batch_size, False, "undecided: time limit", decided=False)
        return BatchProbe(batch_size, False, "over memory")

    monkeypatch.setattr(mb, "probe_batch", probe)
    res = max_batch_size(_family(), LIMIT_BYTES, "checkmate_milp")
    assert res.max_batch_size == 5
    assert res.undecided and all(6 <= b <= 9 for b in res.undecided)
    assert res.is_lower_bound
    assert res.to_json_dict()["is_lower_bound"] is True


def test_milp_batch_is_at_least_chen_greedys():
    family = _family()
    greedy = max_batch_size(family, LIMIT_BYTES, "chen_greedy")
    assert greedy.max_batch_size > 0
    milp = max_batch_size(family, LIMIT_BYTES, "checkmate_milp", start_batch=greedy.max_batch_size, time_limit_s=60)
    assert milp.max_batch_size >= greedy.max_batch_size
    assert not milp.undecided
    fit = next(p for p in milp.probes if p.batch_size == milp.max_batch_size)
    assert fit.fits and fit.peak_memory_bytes <= LIMIT_BYTES and fit.compute_cost <= fit.cost_limit * (1 + 1e-9)


def test_the_probe_cache_resumes_an_interrupted_search(tmp_path, monkeypatch):
    family = _family()
    key = {"study": "max_batch", "model": "unet3", "input_shape": None}
    solved: list[int] = []
    stop_after = None
    real_probe = mb.probe_batch

    def counting(graph, batch_size, *args, **kwargs):
        solved.append(batch_size)
        if stop_after is not None and len(solved) > stop_after:
            raise KeyboardInterrupt
        return real_probe(graph, batch_size, *args, **kwargs)

    monkeypatch.setattr(mb, "probe_batch", counting)
    uncached = max_batch_size(family, LIMIT_BYTES, "checkmate_milp", time_limit_s=60)
    total = len(solved)
    assert total >= 4

    # interrupted after 3 probes, then run again: only the rest is solved
    solved.clear()
    stop_after = 3
    with pytest.raises(KeyboardInterrupt):
        max_batch_size(family, LIMIT_BYTES, "checkmate_milp", time_limit_s=60, cache=PointCache(tmp_path),
                       cache_key=key)
    stop_after = None
    solved.clear()
    cache = PointCache(tmp_path)
    resumed = max_batch_size(family, LIMIT_BYTES, "checkmate_milp", time_limit_s=60, cache=cache, cache_key=key)
    assert len(solved) == total - 3 and cache.hits == 3
    assert resumed.max_batch_size == uncached.max_batch_size
    assert sum(p.cached for p in resumed.probes) == 3

    # a third run solves nothing; other settings (here the limit) are other points
    solved.clear()
    again = max_batch_size(family, LIMIT_BYTES, "checkmate_milp", time_limit_s=60, cache=PointCache(tmp_path),
                           cache_key=key)
    assert solved == [] and again.max_batch_size == uncached.max_batch_size
    assert [p.to_json_dict() for p in again.probes] == [p.to_json_dict() for p in resumed.probes]
    max_batch_size(family, LIMIT_BYTES + 1, "checkmate_milp", time_limit_s=60, cache=PointCache(tmp_path),
                   cache_key=key)
    assert solved



def test_cached_probes_outlive_a_change_of_time_limit_only_when_decided(tmp_path, monkeypatch):
    """A decided probe holds whatever the time limit; an undecided one is tried again with a longer one."""
    calls: list[tuple[int, float]] = []

    def probe(graph, batch_size, memory_bytes, strategy, *, time_limit_s=None, **kwargs):
        calls.append((batch_size, time_limit_s))
        if batch_size <= 4 or (batch_size <= 6 and time_limit_s >= 10):
            return BatchProbe(batch_size, True, "fits", 1.0, 2.0, 1.0, 1)
        if batch_size <= 6:   # sizes 5 and 6 need more than a short limit to decide
            return BatchProbe(batch_size, False, "undecided: time limit", decided=False)
        return BatchProbe(batch_size, False, "over memory")

    monkeypatch.setattr(mb, "probe_batch", probe)
    key = {"study": "max_batch", "model": "unet3", "input_shape": None}

    def search(time_limit_s):
        calls.clear()
        return max_batch_size(_family(), LIMIT_BYTES, "checkmate_milp", time_limit_s=time_limit_s,
                              cache=PointCache(tmp_path), cache_key=key)

    short = search(1.0)
    assert short.max_batch_size == 4 and short.is_lower_bound and calls
    assert search(1.0).max_batch_size == 4 and calls == []          # the same limit: nothing solved again
    longer = search(60.0)
    solved_again = {b for b, _ in calls} & {p.batch_size for p in short.probes}
    assert solved_again and solved_again <= set(short.undecided)    # of the earlier probes, only undecided ones
    assert longer.max_batch_size == 6 and not longer.is_lower_bound
    assert search(1.0).max_batch_size == 6 and calls == []          # decided now, whatever the limit
