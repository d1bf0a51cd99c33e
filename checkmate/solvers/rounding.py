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
from checkmate.bounds import prune_rows, prune_unused_holds
from checkmate.errors import TimeLimitError
from checkmate.schedule import Schedule, minimal_recompute, stage_needed
from checkmate.simulate import ReadIndex, simulate, stage_peak_bytes
from checkmate.solvers.candidates import Candidate, evaluate, forced_retention, schedule_from_retain

if TYPE_CHECKING:  # pragma: no cover
    from checkmate.graph import Graph
    from checkmate.solvers.formulation import CheckmateFormulation

__all__ = ["round_relaxation", "repair_to_budget", "improve_by_holding", "hold_and_repair"]

# Random roundings tried after the threshold sweep.
RANDOM_ROUNDINGS = 64


def repair_to_budget(graph: "Graph", schedule: Schedule, budget_bytes: int, *,
                     deadline: float | None = None, lowest: list | None = None,
                     replay: bool = True) -> Candidate | None:
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

    ``replay=False``: ``schedule`` is known valid (the minimal recomputation of its holds), and the
    result's cost and peak are those of the array replay of its stages, with no full replay of the
    start or of the result (the exchanges of :func:`hold_and_repair` replay the schedule they keep).
    """
    forced = forced_retention(graph)
    if replay:
        first = evaluate(graph, schedule, "repair")
    else:
        first = _array_candidate(graph, schedule.recompute, schedule.retain, schedule=schedule)
    if first is None:
        return None
    # the candidates are replayed from their matrices (no plan is built): the schedule of the drop kept
    # at the end is built once
    # pruned once here, so that each drop below re-prunes only the rows it changes
    S = prune_unused_holds(graph, first.schedule.retain | forced)
    R = minimal_recompute(graph, S)
    if not (np.array_equal(S, first.schedule.retain) and np.array_equal(R, first.schedule.recompute)):
        sim = simulate(graph, _Matrices(R, S))
        if not sim.valid:
            return None
    changed = False
    # each stage's peak, so that a drop replays only the stages next to the rows it changes
    index = ReadIndex(graph)
    stage_peak = stage_peak_bytes(graph, R, S, index=index)
    peak = int(graph.fixed_mem) + int(stage_peak.max())

    def give_up() -> None:
        """Hand the least-peak schedule reached to ``lowest`` (replayed whatever the deadline)."""
        if lowest is not None and changed:
            with no_deadline():
                lowest.append(evaluate(graph, Schedule._deferred(graph, R, S), "repair"))

    try:
        while peak > budget_bytes:
            if deadline is not None and time.perf_counter() > deadline:
                give_up()
                return None
            t = int(np.argmax(stage_peak))   # the first stage at the peak, as the replay's peak step
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
                # polled between the drops tried too: one step on DenseNet121's graph tries a hundred
                # drops of O(n^2) work each, seconds on a loaded core, past a caller's time limit
                if deadline is not None and time.perf_counter() > deadline:
                    give_up()
                    return None
                if graph.cost[i] / float(graph.mem[i]) >= best_score and bool(S[i + 1:t + 1, i].all()):
                    break
                R2, S2, peaks2, added = _drop_hold(graph, R, S, stage_peak, forced, t, i, index)
                peak2 = int(graph.fixed_mem) + int(peaks2.max())
                if peak2 >= peak:
                    continue
                score = added / (peak - peak2)
                if score < best_score:
                    best, best_score = (R2, S2, peaks2), score
            if best is None:
                give_up()
                return None
            # the drop's stage peaks are the replay's (tests check each drop against the rebuild)
            R, S, stage_peak = best
            peak, changed = int(graph.fixed_mem) + int(stage_peak.max()), True
    except TimeLimitError:   # a deadline scope around the caller
        give_up()
        raise
    if not changed:
        return first
    if not replay:
        return _array_candidate(graph, R, S, stage_peak=stage_peak)
    return evaluate(graph, Schedule._deferred(graph, R, S), "repair")


def _array_candidate(graph: "Graph", R: np.ndarray, S: np.ndarray, *, stage_peak: np.ndarray | None = None,
                     schedule: Schedule | None = None, source: str = "repair") -> Candidate:
    """The candidate of a valid ``(R, S)`` with the cost and peak of the array replay of its stages
    (``stage_peak`` when known)."""
    if stage_peak is None:
        stage_peak = stage_peak_bytes(graph, R, S)
    peak = int(graph.fixed_mem) + (int(stage_peak.max()) if stage_peak.size else 0)
    cost = float(graph.cost[np.nonzero(R)[1]].sum())
    return Candidate(schedule if schedule is not None else Schedule._deferred(graph, R, S), cost, peak, source)


def _drop_hold(graph: "Graph", R: np.ndarray, S: np.ndarray, stage_peak: np.ndarray, forced: np.ndarray,
               t: int, i: int, index: ReadIndex) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """The hold of value ``i`` dropped from stage ``t`` until it is next recomputed, in a pruned ``S``
    whose minimal recomputation is ``R`` and stage peaks ``stage_peak``: the new (R, S), stage peaks and
    added cost, as a rebuild (forced holds put back, useless holds pruned, minimal R, array replay)
    gives them, with only the rows the drop changes searched again.

    Below ``t`` the hold becomes useless back to the last stage that reads ``i`` (or holds it by force
    or computes it): in each stage between, only column ``i`` changes, nothing is recomputed, and the
    stage's peak drops by ``mem[i]`` (the value sat there throughout). From ``t`` on the same holds for
    every stage that does not read ``i``; a stage that reads it computes it again, with the inputs it
    needs that are neither held nor computed there (:func:`_recomputed_for`), and is replayed: a stage
    that reads more makes no hold useless, so nothing else changes, unless such an input is a forced
    hold that was pruned (the rows from ``t`` are then settled in full, with the forced holds put
    back). A hold that began with a recomputation in stage ``s`` ends with it: that stage's needs
    shrink, and the rows from ``s`` down are pruned again in full. Tests check every drop against the
    rebuild.
    """
    n = graph.n
    held_on = S[t:, i]
    end = n if held_on.all() else t + int(np.argmin(held_on))   # the first stage from t not holding i
    S2 = np.array(S)
    S2[t:end, i] = False
    users = list(graph.users[i])
    reading = t + np.flatnonzero(R[t:end][:, users].any(axis=1)) if users else np.zeros(0, dtype=np.int64)
    closures = _recomputed_for(graph, R, S2, forced, i, reading)
    if closures is None:
        # a recomputation needs a forced hold that was pruned: the stages that lose the hold are settled
        # with the forced holds put back, which changes nothing else unless such a hold returns
        prune_rows(graph, S2, t, end - 1, restore=forced, floor=t)
        others = S2[t] != S[t]
        others[i] = False
        R2 = None
    else:
        others = np.zeros(0, dtype=bool)
        R2 = np.array(R)
        for u, nodes in closures.items():
            R2[u, nodes] = True
    rows = [np.arange(t, end)]
    if others.any():
        low = t
        s = t - 1
    else:
        read = R[:t][:, users].any(axis=1) if users else np.zeros(t, dtype=bool)
        stays = ~S[:t, i] | read | bool(graph.output[i])
        kept = np.flatnonzero(stays)
        low = int(kept[-1]) + 1 if kept.size else 0      # rows low..t-1 lose the hold, nothing else
        S2[low:t, i] = False
        rows.append(np.arange(low, t))
        s = low - 1
    if s >= 0 and (low == t and others.any() or s > i and not S[s, i]):
        # row t changed beyond column i, or i was recomputed in stage s to be held from s + 1 (no
        # longer): the rows from s down settle anew, as far as they change
        lowest = prune_rows(graph, S2, s, s, restore=forced)
        rows.append(lowest + np.flatnonzero((S2[lowest:s + 1] != S[lowest:s + 1]).any(axis=1)))
        rows.append(np.array([s]))
    changed = np.unique(np.concatenate(rows))
    below = changed[changed < low]
    peaks2 = np.array(stage_peak)
    peaks2[low:t] -= int(graph.mem[i])
    if R2 is None:
        searched = np.union1d(np.arange(t, end), below)
        R2 = _recompute_changed_stages(graph, R, S2, searched)
    else:
        # the stages from t that do not read i only lose it (it sat there throughout); those that
        # read it compute it again, and are replayed
        peaks2[t:end] -= int(graph.mem[i])
        if below.size:
            R2 = _recompute_changed_stages(graph, R2, S2, below)
        searched = np.union1d(reading, np.union1d(below, below[below > 0] - 1))
    # the stages whose R or whose rows of S other than column i changed, and the one before the first
    replayed = np.union1d(np.union1d(searched, searched[searched > 0] - 1) if closures is None else searched,
                          [max(low - 1, 0)])
    peaks2[replayed] = stage_peak_bytes(graph, R2, S2, replayed, index=index)
    recounted = np.union1d(searched, searched[searched > 0] - 1) if closures is None else searched
    added = (float(graph.cost[np.nonzero(R2[recounted])[1]].sum())
             - float(graph.cost[np.nonzero(R[recounted])[1]].sum()))
    return R2, S2, peaks2, added


def _recomputed_for(graph: "Graph", R: np.ndarray, S2: np.ndarray, forced: np.ndarray, i: int,
                    reading: np.ndarray) -> dict[int, list[int]] | None:
    """For each stage of ``reading`` (stages that read ``i``, which ``S2`` no longer holds there), the
    nodes it computes in addition to its row of ``R``: ``i`` and, through the inputs neither held nor
    computed there already, the values it needs. Nothing else in those stages changes (a stage that
    reads more makes no hold useless). None when one of them needs a forced hold that the pruning
    took out (the caller then settles the rows in full)."""
    deps = graph.deps
    out: dict[int, list[int]] = {}
    for u in reading.tolist():
        held, done = S2[u].tobytes(), R[u].tobytes()
        nodes, stack = [i], [i]
        seen = {i}
        while stack:
            for d in deps[stack.pop()]:
                if d in seen or held[d] or done[d]:
                    continue
                if forced[u, d]:
                    return None
                seen.add(d)
                nodes.append(d)
                stack.append(d)
        out[u] = nodes
    return out


def _recompute_changed_stages(graph: "Graph", R: np.ndarray, S2: np.ndarray, changed: np.ndarray) -> np.ndarray:
    """:func:`~checkmate.schedule.minimal_recompute` of ``S2``, given ``R``, the minimal recomputation
    of a matrix that differs from ``S2`` in the rows ``changed`` only: a stage's needs depend only on
    its own row of S and the next, so only the stages next to a row that changed are searched again
    (a drop changes a few rows; the full search of every stage was a third of the repair's time on a
    446-node U-Net)."""
    R2 = np.array(R)
    for t in np.union1d(changed, changed[changed > 0] - 1).tolist():
        seeds = [t]
        if t + 1 < graph.n:
            seeds += np.flatnonzero(S2[t + 1, : t + 1] & ~S2[t, : t + 1]).tolist()
        R2[t] = False
        R2[t, list(stage_needed(graph.deps, S2[t].tobytes(), 0, seeds))] = True
    return R2


@dataclass(frozen=True)
class _Matrices:
    """An (R, S) pair that the simulator replays without building a plan first."""

    recompute: np.ndarray
    retain: np.ndarray


def improve_by_holding(graph: "Graph", candidate: Candidate, budget_bytes: int, *,
                       deadline: float | None = None, stop=None, columns: np.ndarray | None = None,
                       memo: "_MoveMemo | None" = None, replay: bool = True) -> Candidate:
    """Local search: replace recomputations by holds while the replayed peak still fits.

    A move takes one recomputation ``R[t, i]`` (``i < t``) and holds ``i`` instead, from the last
    stage before ``t`` in which it is resident up to ``t``; the schedule is rebuilt from S (minimal R,
    useless holds pruned) and replayed. Each round costs every move, then goes through those that
    lower the cost, cheapest result first: each is applied when, on the schedule as it is by then,
    it still lowers the cost and fits. Rounds repeat until no move is applied or the deadline passes.
    Rounded LP solutions and baselines at tight budgets recompute far more than needed; this gives
    the MILP a much lower cutoff to start from.

    A move's cost needs only the stages whose rows of S it changes (and the stages before them); the
    peak is replayed only for the moves that lower the cost, and the schedule returned in full.
    ``stop`` (a callable), when given, ends the search as soon as it returns True (polled between moves).
    ``columns``, when given, limits the moves to the recomputations of those values (a search after a
    change to a few values' holds of a schedule refined already). ``memo`` (a :class:`_MoveMemo` for
    this graph and budget), when given, keeps each move's cost, and whether it breaks the budget, from
    one round or call to the next while the rows of R and S it reads are unchanged: the exchanges
    refine schedules that differ from each other in a few rows. ``replay=False``: the schedule found
    is returned with the cost and peak of the array replay of its stages, not replayed in full (the
    exchanges replay the one they keep).
    """
    current = candidate

    def over() -> bool:
        return (deadline is not None and time.perf_counter() > deadline) or (stop is not None and stop())

    forced = forced_retention(graph)
    cost = graph.cost
    index = ReadIndex(graph)

    # the moves are valid by construction (the minimal R of pruned holds): the array replay of the
    # peak ranks them, and the schedule returned is replayed in full at the end
    R, S, current_cost = candidate.schedule.recompute, candidate.schedule.retain, candidate.cost
    moved_any = False
    while not over():
        settled = bool(np.array_equal(prune_unused_holds(graph, S | forced), S))
        minimal = minimal_recompute(graph, S)
        stage_costs = (minimal * cost[None, :]).sum(axis=1)
        total = float(stage_costs.sum())
        stage_peak = None     # the stage peaks of (minimal, S), once a move is replayed
        tt, ii = np.nonzero(np.tril(R, -1))
        if columns is not None:
            keep = np.isin(ii, columns)
            tt, ii = tt[keep], ii[keep]
        cheaper = current_cost - 1e-12 * abs(current_cost)
        # (cost, t, i) of each move that lowers the cost; the matrices are rebuilt for the few replayed
        # (keeping them all would take n^2 bytes per move on large graphs)
        moves = []
        if memo is not None:
            memo.sync(R, S)
        for t, i in zip(tt.tolist(), ii.tolist()):
            if over():
                break
            known = memo.get(t, i) if memo is not None and settled else None
            if known is not None:
                delta = known[0]
            else:
                S2, low = _held_instead_rows(graph, forced, R, S, t, i, settled)
                delta, first = _move_delta(graph, R, S, stage_costs, S2, t, i, low)
                if memo is not None and settled:
                    memo.put(t, i, min(low, first), delta)
            if total + delta < cheaper:
                moves.append((total + delta, len(moves), t, i))
        # the cheapest move that fits is taken; then the others, in the same order, each costed again
        # on the schedule as it now is and taken when it still lowers the cost and fits: one costing of
        # every move serves many moves (a U-Net at 40% of checkpoint-all took a hundred rounds of one
        # move each)
        taken = False
        for _, _, t, i in sorted(moves):
            if over():
                break
            if not R[t, i]:
                continue
            known = memo.get(t, i) if memo is not None and settled else None
            if known is not None and (known[1] or total + known[0] >= current_cost - 1e-12 * abs(current_cost)):
                continue      # the rows it reads are as they were when it was found not to fit or gain
            S2, low = _held_instead_rows(graph, forced, R, S, t, i, settled)
            # the stages next to the rows the move changed are searched and replayed again (the minimal
            # recomputation and the array replay of the rest are those of S)
            rows, gained = _hold_rows(R, S, S2, t, i, low)
            stages = np.union1d(rows, rows[rows > 0] - 1)
            R2 = _recompute_changed_stages(graph, minimal, S2, rows)
            cost2 = total + float(cost[np.nonzero(R2[stages])[1]].sum()) - float(cost[np.nonzero(minimal[stages])[1]].sum())
            if cost2 >= current_cost - 1e-12 * abs(current_cost):
                continue
            if stage_peak is None:
                stage_peak = stage_peak_bytes(graph, minimal, S, index=index)
            peaks2 = np.array(stage_peak)
            peaks2[gained] += int(graph.mem[i])
            peaks2[stages] = stage_peak_bytes(graph, R2, S2, stages, index=index)
            if int(graph.fixed_mem) + int(peaks2.max()) > budget_bytes:
                if (memo is not None and settled
                        and int(graph.fixed_mem) + int(peaks2[np.union1d(stages, gained)].max()) > budget_bytes):
                    # over the budget in the rows it changes: so it stays while they do
                    memo.put(t, i, min(low, int(stages[0])), cost2 - total, over=True)
                continue
            # a move's S is the pruning of itself with the forced holds: settled
            R, S, current_cost, taken, moved_any = R2, S2, cost2, True, True
            minimal, total, stage_peak, settled = R2, cost2, peaks2, True
            if memo is not None:
                memo.sync(R, S)
        if not taken:
            break
    if moved_any and not replay:
        found = _array_candidate(graph, R, S, stage_peak=stage_peak, source=candidate.source)
        if found.peak_bytes <= budget_bytes and found.cost < candidate.cost:
            current = found
    elif moved_any:
        with no_deadline():   # the check of the schedule found is never cut short
            sim = simulate(graph, _Matrices(R, S))
        if sim.valid and sim.peak_memory_bytes <= budget_bytes and sim.compute_cost < candidate.cost:
            current = Candidate(Schedule._deferred(graph, R, S), sim.compute_cost, sim.peak_memory_bytes,
                                candidate.source)
    if current is not candidate:
        current = Candidate(current.schedule, current.cost, current.peak_bytes, candidate.source + ", improved")
    return current


class _MoveMemo:
    """What the moves of :func:`improve_by_holding` (on one graph, at one budget) were found to cost,
    and which broke the budget in the rows they change, kept while the rows they read are unchanged.

    A move ``(t, i)`` on a settled ``(R, S)`` reads rows ``low..t + 1`` of R and S only (the last
    stage before ``t`` holding ``i``, the pruning down from ``t``, the stages next to the rows it
    changes and their next rows): each row's content is hashed, and an entry holds the hash of its
    rows' hashes; it is used while that matches. The local searches of :func:`hold_and_repair` refine
    one schedule after another that differ in a few rows, and cost each of their moves again.
    """

    def __init__(self, n: int):
        self.row_hash = np.zeros(n, dtype=np.int64)
        self.R: np.ndarray | None = None
        self.S: np.ndarray | None = None
        self.entries: dict[tuple[int, int], tuple[int, int, int, float, bool]] = {}

    def sync(self, R: np.ndarray, S: np.ndarray) -> None:
        """The rows' hashes for ``(R, S)`` (those of the rows that differ from the last pair synced)."""
        if self.S is None:
            rows = range(S.shape[0])
        elif R is self.R and S is self.S:
            return
        else:
            rows = np.flatnonzero((R != self.R).any(axis=1) | (S != self.S).any(axis=1)).tolist()
        for u in rows:
            self.row_hash[u] = hash((R[u].tobytes(), S[u].tobytes()))
        self.R, self.S = R, S

    def _key(self, low: int, t: int) -> int:
        return hash(self.row_hash[low:t + 2].tobytes())

    def get(self, t: int, i: int) -> tuple[float, bool] | None:
        """(cost change, breaks the budget) of the move on the pair synced last, or None if unknown."""
        entry = self.entries.get((t, i))
        if entry is None or entry[0] != self._key(entry[1], t):
            return None
        return entry[3], entry[4]

    def put(self, t: int, i: int, low: int, delta: float, over: bool = False) -> None:
        self.entries[(t, i)] = (self._key(low, t), low, t, delta, over)


def _last_resident(R: np.ndarray, S: np.ndarray, t: int, i: int) -> int:
    """The last stage before ``t`` in which ``i`` is computed or held (the hold starts after it)."""
    resident = np.flatnonzero(R[i + 1:t, i] | S[i + 1:t, i])
    return int(i + 1 + resident[-1]) if resident.size else i


def _held_instead(graph: "Graph", forced: np.ndarray, R: np.ndarray, S: np.ndarray, t: int, i: int,
                  settled: bool) -> np.ndarray:
    """S after holding ``i`` instead of recomputing it in stage ``t``. ``settled``: S is its own
    pruning, so only the rows the move changes are pruned again."""
    return _held_instead_rows(graph, forced, R, S, t, i, settled)[0]


def _held_instead_rows(graph: "Graph", forced: np.ndarray, R: np.ndarray, S: np.ndarray, t: int, i: int,
                       settled: bool) -> tuple[np.ndarray, int]:
    """:func:`_held_instead`, and the lowest row of S it can have changed (none above ``t``)."""
    s = _last_resident(R, S, t, i)
    S2 = np.array(S)
    S2[s + 1:t + 1, i] = True
    if not settled:
        return prune_unused_holds(graph, S2 | forced), 0
    # the stages between s and t only gain i, held into the next stage and read by none of them:
    # they are settled as they are. The pruning starts at t, where i is no longer recomputed (the
    # inputs held for it may be useless now), and goes down as far as rows change, with the forced
    # holds put back in each (a rebuild from S puts them back)
    lowest = prune_rows(graph, S2, t, t, restore=forced)
    return S2, min(lowest, s + 1)


def _hold_rows(R: np.ndarray, S: np.ndarray, S2: np.ndarray, t: int, i: int,
               low: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The rows of ``S2`` (a move of :func:`_held_instead` on ``S``) whose stages' needs can change, and
    the rows between that only gain the hold of ``i``: these stages hold ``i`` into the next one and
    none of them computes or reads it, so their needs are as they were and their peaks ``mem[i]``
    higher (when the next row too only gains the hold). ``low``: no row below it differs (rows
    above ``t`` never do), so only the rows from ``low`` to ``t`` are compared."""
    s = _last_resident(R, S, t, i)
    low = max(0, min(low, s + 1))
    diff = S2[low:t + 1] != S[low:t + 1]
    gained = np.zeros(S.shape[0], dtype=bool)
    gained[s + 1:t] = S2[s + 1:t, i] & ~S[s + 1:t, i]
    diff[s + 1 - low:t - low, i] &= ~gained[s + 1:t]
    differs = np.zeros(S.shape[0], dtype=bool)
    differs[low:t + 1] = diff.any(axis=1)
    changed = np.union1d(np.flatnonzero(differs), [s, t] if s >= 0 else [t])
    return changed, np.flatnonzero(gained & ~differs)


def _move_cost(graph: "Graph", R: np.ndarray, S: np.ndarray, stage_costs: np.ndarray, total: float,
               S2: np.ndarray, t: int, i: int, low: int = 0) -> float:
    """The minimal recomputation's cost under ``S2``: a stage's needs depend only on its own row
    of S and the next, so only the stages next to a row that changed are searched again, but for the
    stages between s and t that only gain the hold of ``i`` (:func:`_hold_rows`)."""
    return total + _move_delta(graph, R, S, stage_costs, S2, t, i, low)[0]


def _move_delta(graph: "Graph", R: np.ndarray, S: np.ndarray, stage_costs: np.ndarray,
                S2: np.ndarray, t: int, i: int, low: int = 0) -> tuple[float, int]:
    """:func:`_move_cost` less the cost before the move, and the lowest stage it searched again."""
    changed, _ = _hold_rows(R, S, S2, t, i, low)
    stages = np.union1d(changed, changed[changed > 0] - 1)
    return sum(_stage_cost(graph, S2, u) - stage_costs[u] for u in stages.tolist()), int(stages[0])


def hold_and_repair(graph: "Graph", candidate: Candidate, budget_bytes: int, *, deadline: float,
                    seed: int = 0, stop=None, tries: int | None = None, cost_draws: float = 0.0,
                    target_cost: float | None = None) -> Candidate:
    """Escape the local optimum of :func:`improve_by_holding`: hold one recomputed value up to its
    use whatever the budget, let :func:`repair_to_budget` drop holds at the peak that this raises
    (cheapest per byte first), refine the result, and keep it when it is cheaper; repeated, with the
    recomputation to hold drawn at random (seeded: the same graph and budget give the same result),
    until ``deadline``, ``stop()`` or (when given) ``tries`` exchanges tried. The refinement after an
    exchange first moves only the values whose holds it changed (``candidate`` is expected refined
    already), and all of them when that leaves it no cheaper.

    Where every single hold breaks the budget, a hold that saves much in exchange for drops that
    cost little elsewhere is still a gain: on DenseNet121's graph at 60% of checkpoint-all the
    refinement stops at 1.0735x, and these exchanges reached 1.064x in 150 s (a scratch run).
    ``cost_draws``: the share of the draws made in proportion to the recomputation's cost rather than
    uniformly (holding a free one saves nothing; the others keep the search wide). ``target_cost``:
    the search ends once a schedule costs no more (a caller's proven bound plus its target gap).
    A recomputation whose exchange failed is not drawn again until the schedule changes, and the
    search ends when every one has failed. ``candidate`` must fit.
    """
    forced = forced_retention(graph)
    rng = np.random.default_rng(seed)
    current = candidate

    def over() -> bool:
        return (time.perf_counter() > deadline or (stop is not None and stop())
                or (target_cost is not None and current.cost <= target_cost))

    tried = 0
    # the recomputations whose exchange failed on the current schedule: an exchange is determined by
    # the schedule and the recomputation held, so drawing one again before the schedule changes
    # repeats the same seconds of work (the 326-node diffusion U-Net at 30% drew the same few again
    # and again). Cleared when an exchange is kept; once every one failed, the schedule is a local
    # optimum of the exchanges and the search ends.
    failed: set[tuple[int, int]] = set()
    # two recomputations can give the same holds once the unused ones are pruned (the same value
    # recomputed twice in one span it is now held over): the same exchange, not repaired twice
    exchanged: set[bytes] = set()
    # the refinements below cost the moves of schedules that differ from the current one in a few rows
    memo = _MoveMemo(graph.n)
    while not over() and (tries is None or tried < tries):
        R, S = current.schedule.recompute, current.schedule.retain
        tt, ii = np.nonzero(np.tril(R, -1))
        untried = np.array([k for k, (t, i) in enumerate(zip(tt.tolist(), ii.tolist())) if (t, i) not in failed],
                           dtype=np.int64)
        if untried.size == 0:
            break
        tried += 1
        # every draw the same way for 0 and 1 (no second random number: the uniform draws stay those
        # of the same seed without the option)
        by_cost = cost_draws >= 1.0 or (cost_draws > 0.0 and rng.random() < cost_draws)
        if by_cost and float(graph.cost[ii[untried]].sum()) > 0:
            weights = graph.cost[ii[untried]].astype(np.float64)
            k = int(untried[int(rng.choice(untried.size, p=weights / weights.sum()))])
        else:
            k = int(untried[int(rng.integers(untried.size))])
        t, i = int(tt[k]), int(ii[k])
        failed.add((t, i))
        # held from the last stage before t in which it is resident (as a refinement move holds it)
        s = _last_resident(R, S, t, i)
        S2 = np.array(S)
        S2[s + 1:t + 1, i] = True
        S2 = prune_unused_holds(graph, S2 | forced)
        key = np.packbits(S2).tobytes()
        if key in exchanged:
            continue
        exchanged.add(key)
        # polled against ``deadline`` by the repair itself, which gives up (None) when it passes
        with no_deadline():
            repaired = repair_to_budget(graph, Schedule._deferred(graph, minimal_recompute(graph, S2), S2),
                                        budget_bytes, deadline=deadline, replay=False)
        if repaired is None or repaired.peak_bytes > budget_bytes:
            continue
        if np.array_equal(repaired.schedule.retain, S):
            # the repair dropped the very hold the exchange added: the schedule as it was, which the
            # refinement below cannot lower (it is refined already)
            continue
        # the drops recompute more than needed: the refinement takes back what fits, among the values
        # whose holds the exchange changed (the rest was refined already: a search of every
        # recomputation took 29 s of a 40 s exchange on DenseNet121's graph, against 1 s for these)
        changed = np.union1d(np.flatnonzero((repaired.schedule.retain != S).any(axis=0)), [i])
        narrow = improve_by_holding(graph, repaired, budget_bytes, deadline=deadline, stop=stop, columns=changed,
                                    memo=memo, replay=False)
        # not enough, or a gain: the peak the drops moved can free holds of other values too
        # (DenseNet121's graph at 60%: the whole search gained 1.0735x to 1.0673x in 20 s, these alone
        # nothing), and a schedule kept is refined in full, so that an exchange the repair undoes
        # leaves nothing to refine
        narrow = improve_by_holding(graph, narrow, budget_bytes, deadline=deadline, stop=stop, memo=memo,
                                    replay=False)
        repaired = narrow
        if repaired.cost < current.cost * (1 - 1e-9) and repaired.peak_bytes <= budget_bytes:
            current = Candidate(repaired.schedule, repaired.cost, repaired.peak_bytes, candidate.source)
            failed.clear()
            exchanged.clear()
    if current is not candidate:
        with no_deadline():   # the check of the schedule found is never cut short
            sim = simulate(graph, current.schedule)
        if not (sim.valid and sim.peak_memory_bytes <= budget_bytes and sim.compute_cost < candidate.cost):
            return candidate
        current = Candidate(current.schedule, sim.compute_cost, sim.peak_memory_bytes, candidate.source + ", exchanged")
    return current


def _stage_cost(graph: "Graph", S: np.ndarray, t: int) -> float:
    """The cost of stage ``t`` under the minimal recomputation of ``S`` (one row of
    :func:`~checkmate.schedule.minimal_recompute`, by the closure they share)."""
    seeds = [t]
    if t + 1 < graph.n:
        seeds += np.flatnonzero(S[t + 1, : t + 1] & ~S[t, : t + 1]).tolist()
    needed = stage_needed(graph.deps, S[t].tobytes(), 0, seeds)
    return float(graph.cost[list(needed)].sum())


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
