"""From relaxed or rough schedules to good replayed ones: rounding the LP relaxation, repairing a
rounding that overshoots the budget, and a local search that trades recomputations for holds.

Every schedule here is rebuilt from S (:func:`~checkmate.solvers.candidates.schedule_from_retain`)
and replayed; nothing is scaled or trusted from a solver.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from checkmate._deadline import no_deadline
from checkmate.bounds import prune_unused_holds
from checkmate.errors import TimeLimitError
from checkmate.schedule import Schedule, minimal_recompute
from checkmate.simulate import peak_memory_bytes, simulate
from checkmate.solvers.candidates import Candidate, evaluate, forced_retention, schedule_from_retain

if TYPE_CHECKING:  # pragma: no cover
    from checkmate.graph import Graph
    from checkmate.solvers.formulation import CheckmateFormulation

__all__ = ["round_relaxation", "repair_to_budget", "improve_by_holding"]

# Random roundings tried after the threshold sweep.
RANDOM_ROUNDINGS = 64


def repair_to_budget(graph: "Graph", schedule: Schedule, budget_bytes: int, *,
                     deadline: float | None = None, lowest: list | None = None) -> Candidate | None:
    """Greedily drop holds until the replayed peak fits, or give up (None).

    ``lowest``, when given, receives the least-peak schedule reached (a :class:`Candidate`) when the
    repair gives up (no drop lowers the peak any more, or the deadline passed): the smallest budget
    this repair is known to meet.

    At each step the schedule's peak moment is inspected; for every value held on entry to that stage
    (and not forced), dropping the hold from that stage until the value is next recomputed is tried,
    and the drop with the least added cost per byte of peak removed is kept.

    The drops of holds that last since the value's first computation are tried in increasing
    ``cost[i] / mem[i]`` (after every other drop), and the search of a step stops at the first whose
    ratio is no better than the best score found: the schedules here have no useless holds, so such a
    dropped hold was read before the value is held again and the drop adds at least one computation
    of ``i`` (no recomputation of ``i`` before it becomes unneeded), while it frees at most ``mem[i]`` at
    the peak. The ratio bounds the score from below, and the drops left untried cannot win (the same
    choice as trying all, with many times fewer replays).
    """
    forced = forced_retention(graph)
    first = evaluate(graph, schedule, "repair")
    if first is None:
        return None
    # the candidates are replayed from their matrices (no plan is built): the schedule of the drop kept
    # at the end is built once
    # pruned once here, so that each drop below re-prunes only the rows it changes
    S = prune_unused_holds(graph, first.schedule.retain | forced)
    R = minimal_recompute(graph, S)
    sim = simulate(graph, _Matrices(R, S))
    if not sim.valid:
        return None
    cost, peak = sim.compute_cost, sim.peak_memory_bytes
    n = graph.n
    changed = False

    def give_up() -> None:
        """Hand the least-peak schedule reached to ``lowest`` (replayed whatever the deadline)."""
        if lowest is not None and changed:
            with no_deadline():
                lowest.append(evaluate(graph, Schedule.from_matrices(graph, R, S), "repair"))

    try:
        while peak > budget_bytes:
            if deadline is not None and time.perf_counter() > deadline:
                give_up()
                return None
            t = sim.peak_step.stage
            best, best_score = None, math.inf
            held = np.flatnonzero(S[t] & ~forced[t])
            # a hold that began with a recomputation may end with it: its drop can cost nothing, so it
            # is always tried; a hold since the value's first computation is bounded by its ratio
            since_first = np.array([bool(S[i + 1:t + 1, i].all()) for i in held.tolist()], dtype=bool)
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = np.where(graph.mem[held] > 0, graph.cost[held] / graph.mem[held].astype(np.float64), math.inf)
            ratio = np.where(since_first, ratio, -math.inf)
            for i in held[np.argsort(ratio, kind="stable")].tolist():
                if graph.mem[i] <= 0:
                    break
                if graph.cost[i] / float(graph.mem[i]) >= best_score and bool(S[i + 1:t + 1, i].all()):
                    break
                S2 = np.array(S)
                end = t
                while end < n and S2[end, i]:
                    S2[end, i] = False
                    end += 1
                S2 = prune_unused_holds(graph, S2 | forced, changed_rows=_changed_rows(forced, S, t, end - 1))
                R2 = minimal_recompute(graph, S2)
                # valid by construction (the minimal R of pruned holds): the array replay of the peak
                # suffices to rank it, and the drop kept is replayed in full below
                peak2 = peak_memory_bytes(graph, R2, S2)
                if peak2 >= peak:
                    continue
                score = (float(graph.cost[np.nonzero(R2)[1]].sum()) - cost) / (peak - peak2)
                if score < best_score:
                    best, best_score = (R2, S2), score
            if best is None:
                give_up()
                return None
            sim = simulate(graph, _Matrices(*best))
            if not sim.valid:
                return None
            (R, S), cost, peak, changed = best, sim.compute_cost, sim.peak_memory_bytes, True
    except TimeLimitError:   # a deadline scope around the caller
        give_up()
        raise
    if not changed:
        return first
    return evaluate(graph, Schedule.from_matrices(graph, R, S), "repair")


def _changed_rows(forced: np.ndarray, S: np.ndarray, low: int, high: int) -> tuple[int, int]:
    """The rows of ``S`` that a move changing rows ``low..high`` changes once the forced holds are put
    back (as every rebuild from S does): the pruning may have dropped some, and a move that makes a
    value be recomputed can need one again (a non-recomputable input of it)."""
    missing = np.flatnonzero((forced & ~S).any(axis=1))
    if missing.size:
        low, high = min(low, int(missing[0])), max(high, int(missing[-1]))
    return low, high


@dataclass(frozen=True)
class _Matrices:
    """An (R, S) pair that the simulator replays without building a plan first."""

    recompute: np.ndarray
    retain: np.ndarray


def improve_by_holding(graph: "Graph", candidate: Candidate, budget_bytes: int, *,
                       deadline: float | None = None, stop=None) -> Candidate:
    """Local search: replace recomputations by holds while the replayed peak still fits.

    A move takes one recomputation ``R[t, i]`` (``i < t``) and holds ``i`` instead, from the last
    stage before ``t`` in which it is resident up to ``t``; the schedule is rebuilt from S (minimal R,
    useless holds pruned) and replayed. Each round applies the move that lowers the cost most, until
    no move fits or the deadline passes. Rounded LP solutions and baselines at tight budgets
    recompute far more than needed; this gives the MILP a much lower cutoff to start from.

    A move's cost needs only its minimal R; the replay, which dominates the work, runs on the moves
    in increasing order of cost and stops at the first that fits, so a round replays few of them.
    ``stop`` (a callable), when given, ends the search as soon as it returns True (polled between moves).
    """
    current = candidate

    def over() -> bool:
        return (deadline is not None and time.perf_counter() > deadline) or (stop is not None and stop())

    forced = forced_retention(graph)
    cost = graph.cost

    def moved(R, S, t, i, settled):
        """(R, S) after holding ``i`` instead of recomputing it in stage ``t``. ``settled``: S is its
        own pruning, so only the rows the move changes are pruned again."""
        s = t - 1
        while s > i and not (R[s, i] or S[s, i]):
            s -= 1
        S2 = np.array(S)
        S2[s + 1:t + 1, i] = True
        S2 = (prune_unused_holds(graph, S2 | forced, changed_rows=_changed_rows(forced, S, s + 1, t)) if settled
              else prune_unused_holds(graph, S2 | forced))
        return minimal_recompute(graph, S2), S2

    while not over():
        R, S = current.schedule.recompute, current.schedule.retain
        settled = bool(np.array_equal(prune_unused_holds(graph, S | forced), S))
        tt, ii = np.nonzero(np.tril(R, -1))
        cheaper = current.cost - 1e-12 * abs(current.cost)
        # (cost, t, i) of each move that lowers the cost; the matrices are rebuilt for the few replayed
        # (keeping them all would take n^2 bytes per move on large graphs)
        moves = []
        for t, i in zip(tt.tolist(), ii.tolist()):
            if over():
                break
            R2, _ = moved(R, S, t, i, settled)
            move_cost = float(cost[np.nonzero(R2)[1]].sum())
            if move_cost < cheaper:
                moves.append((move_cost, len(moves), t, i))
        best = None
        for _, _, t, i in sorted(moves):
            if over():
                break
            R2, S2 = moved(R, S, t, i, settled)
            # the array replay of the peak rules most moves out; the one kept is replayed in full
            if peak_memory_bytes(graph, R2, S2) > budget_bytes:
                continue
            sim = simulate(graph, _Matrices(R2, S2))
            if sim.valid and sim.peak_memory_bytes <= budget_bytes and sim.compute_cost < cheaper:
                best = Candidate(Schedule.from_matrices(graph, R2, S2), sim.compute_cost, sim.peak_memory_bytes,
                                  current.source)
                break
        if best is None:
            break
        current = best
    if current is not candidate:
        current = Candidate(current.schedule, current.cost, current.peak_bytes, candidate.source + ", improved")
    return current


def round_relaxation(graph: "Graph", form: CheckmateFormulation, x: np.ndarray, budget_bytes: int, *,
                     seed: int = 0, samples: int = RANDOM_ROUNDINGS, repairs: int = 3,
                     deadline: float | None = None) -> list[Candidate]:
    """Round the relaxed S: a deterministic sweep over thresholds, then randomized rounding.

    Each rounded S becomes a schedule (forced holds added, useless ones pruned, minimal R); those whose
    replayed peak fits the budget are returned. If none fits, the ``repairs`` roundings that overshoot
    least are repaired by :func:`repair_to_budget` (still replayed: nothing is scaled or fudged).
    """
    S_frac = form.retain_values(x)
    lower = np.tri(graph.n, k=-1, dtype=bool)
    values = np.unique(S_frac[lower & (S_frac > 1e-6)])
    thresholds = np.unique(np.r_[values, np.linspace(0.05, 1.0, 20)])
    if thresholds.size > 60:   # keep the sweep short on big graphs: quantiles of the fractional values
        thresholds = np.unique(np.quantile(thresholds, np.linspace(0, 1, 60)))
    out: list[Candidate] = []
    over: list[Candidate] = []
    seen: set[bytes] = set()

    def consider(S: np.ndarray, source: str) -> None:
        key = np.packbits(S).tobytes()
        if key in seen:
            return
        seen.add(key)
        cand = evaluate(graph, schedule_from_retain(graph, S), source)
        if cand is None:
            return
        (out if cand.peak_bytes <= budget_bytes else over).append(cand)

    for tau in thresholds:
        if deadline is not None and time.perf_counter() > deadline:
            break
        consider(lower & (S_frac >= tau - 1e-9), f"threshold {tau:.3f}")
    rng = np.random.default_rng(seed)
    for s in range(samples):
        if deadline is not None and time.perf_counter() > deadline:
            break
        consider(lower & (rng.random(S_frac.shape) < S_frac), f"random #{s}")
    if not out:
        for cand in sorted(over, key=lambda c: (c.peak_bytes, c.cost))[:repairs]:
            fixed = repair_to_budget(graph, cand.schedule, budget_bytes, deadline=deadline)
            if fixed is not None:
                out.append(Candidate(fixed.schedule, fixed.cost, fixed.peak_bytes, cand.source + ", repaired"))
    return out
