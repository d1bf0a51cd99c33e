"""Classic rematerialization baselines, all with the strategy signature of :mod:`checkmate.solvers`.

Each baseline decides what to keep (S); :func:`~checkmate.schedule.minimal_recompute` derives R.

The segment-based strategies (Chen et al.'s sqrt(n) and greedy checkpointing, Griewank's binomial
checkpointing) share one way of writing their decisions down as hold intervals, value ``i`` held on
entry to stages ``lo..hi``:

* a backward value is held until its last reader (gradients are never recomputed);
* a forward value is held until its last forward reader ran (the forward pass itself);
* the forward nodes are cut into segments at chosen boundary nodes. A segment's values are dropped
  after the forward pass and recomputed once, in the stage of the segment's first backward consumer,
  then held while backward nodes still read them. A segment whose backward use starts right where
  its forward use ends (the one ending in the loss) is simply kept;
* snapshot values (Chen's checkpoints, revolve's snapshots) are held over the intervals the policy
  gives.

:func:`_finish` turns any such S into a valid schedule for any DAG: it adds the holds of outputs,
drops holds that no later computation reads (less memory, same or lower cost), and holds every
non-recomputable value over the whole span in which something may need it, so that it runs once.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

import numpy as np

from checkmate._deadline import check_deadline
from checkmate.bounds import InputIndex, checkpoint_all_schedule, drop_holds_unread_by, last_use_stage
from checkmate.budgets import format_bytes
from checkmate.errors import InfeasibleBudgetError, InvalidArgumentError, TimeLimitError
from checkmate.schedule import Schedule, minimal_recompute
from checkmate.simulate import peak_memory_bytes
from checkmate.solvers.types import SolveOptions, StrategyOutput

if TYPE_CHECKING:  # pragma: no cover
    from checkmate.graph import Graph

__all__ = ["checkpoint_all", "checkpoint_all_schedule", "last_use_stage", "checkpoint_last_node",
           "checkpoint_last_node_schedule", "chen_sqrtn", "chen_sqrtn_linearized", "chen_sqrtn_schedule",
           "chen_greedy", "chen_greedy_linearized", "chen_greedy_checkpoint_sets", "segment_schedule",
           "griewank_logn", "griewank_schedule", "revolve_table", "revolve_snapshots"]


def checkpoint_all(graph: "Graph", budget_bytes: int, options: SolveOptions) -> StrategyOutput:
    return StrategyOutput(checkpoint_all_schedule(graph))


# ------------------------------------------------------------------------------- making S valid
def _finish(graph: "Graph", retain: np.ndarray, edges: InputIndex | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Make any retention matrix valid for ``graph``; returns ``(R, S)``.

    Steps: hold outputs from their computation to the end; drop holds nothing reads (repeated to a
    fixed point, as each drop can make more computations, hence reads, unnecessary); then hold each
    non-recomputable value from its computation to the last stage that would otherwise recompute it.
    That repair is contiguous from the value's own stage, so it creates no new computation of it (and
    removes others'), and a last drop pass cannot create one either: the result is always valid.
    """
    n = graph.n
    edges = edges or InputIndex(graph)
    lower = np.tri(n, k=-1, dtype=bool)
    S = np.asarray(retain, dtype=bool) & lower
    S |= lower & graph.output[None, :]
    fixed_nodes = np.flatnonzero(~graph.recomputable)
    for repair_round in range(2):
        R = minimal_recompute(graph, S)
        while True:
            trimmed = drop_holds_unread_by(graph, S, R, edges)
            if np.array_equal(trimmed, S):
                break
            S, R_before = trimmed, R
            R = minimal_recompute(graph, S)
            if np.array_equal(R, R_before):
                break  # same reads, and dropping is idempotent for fixed reads: a fixed point
        if repair_round == 1 or not fixed_nodes.size:
            return R, S
        repaired = False
        for k in fixed_nodes:
            again = np.flatnonzero(R[k + 1:, k])
            if again.size:
                S[k + 1: k + 2 + int(again[-1]), k] = True
                repaired = True
        if not repaired:
            return R, S
    raise AssertionError("unreachable")  # pragma: no cover


def _schedule(graph: "Graph", R: np.ndarray, S: np.ndarray, strategy: str) -> Schedule:
    return Schedule.from_matrices(graph, R, S, strategy=strategy)


def _hold_matrix(n: int, cols: Iterable[int], los: Iterable[int], his: Iterable[int]) -> np.ndarray:
    """S with ``S[lo..hi, col]`` set for every interval (empty when ``lo > hi``)."""
    S = np.zeros((n, n), dtype=bool)
    for col, lo, hi in zip(cols, los, his):
        if lo <= hi:
            S[max(lo, 0): hi + 1, col] = True
    return S


# ------------------------------------------------------------------------------- checkpoint last
def checkpoint_last_node_schedule(graph: "Graph") -> Schedule:
    """Hold only the previous stage's value (plus outputs, plus non-recomputable values while anything
    may still need them); everything else is recomputed from the inputs on demand."""
    n = graph.n
    retain = np.eye(n, k=-1, dtype=bool)
    R, S = _finish(graph, retain)
    return _schedule(graph, R, S, "checkpoint_last_node")


def checkpoint_last_node(graph: "Graph", budget_bytes: int, options: SolveOptions) -> StrategyOutput:
    return StrategyOutput(checkpoint_last_node_schedule(graph))


# ------------------------------------------------------------------------------- segments
class _Segments:
    """Per-graph facts the segment policies need, computed once per search."""

    def __init__(self, graph: "Graph"):
        n = graph.n
        self.graph = graph
        self.n = n
        self.edges = InputIndex(graph)
        bwd = graph.backward
        self.forward = np.array(graph.forward_nodes, dtype=np.int64)
        self.rank = np.full(n, -1, dtype=np.int64)
        self.rank[self.forward] = np.arange(self.forward.size)
        users = graph.users
        self.last_reader = np.array([max(us) if us else i for i, us in enumerate(users)], dtype=np.int64)
        self.last_forward_reader = np.array(
            [max((u for u in us if not bwd[u]), default=i) for i, us in enumerate(users)], dtype=np.int64)
        self.first_backward_reader = np.array(
            [min((u for u in us if bwd[u]), default=n) for i, us in enumerate(users)], dtype=np.int64)
        # Holds every policy shares: backward values to their last reader, forward values to their
        # last forward reader.
        ids = np.arange(n)
        self.base_hi = np.where(bwd, self.last_reader, self.last_forward_reader)
        self.base = _hold_matrix(n, ids, ids + 1, self.base_hi)

    def retain(self, segment_of_rank: np.ndarray, snapshot_cols: Iterable[int] = (),
               snapshot_los: Iterable[int] = (), snapshot_his: Iterable[int] = (),
               pinned: np.ndarray | None = None, just_in_time: bool = False) -> np.ndarray:
        """S for forward nodes cut into segments (``segment_of_rank[r]``: the segment of the forward
        node of rank ``r``); ``pinned`` forward nodes are held as snapshots only (not segment values).

        A segment's values are recomputed once in the backward pass. By default (Chen et al.'s scheme)
        all of them when the segment's backward starts. ``just_in_time``: each when it is first needed,
        by a backward reader or by the recomputation of another segment value, so that the values read
        late in the segment's backward are not resident through its beginning: the same computations,
        each value held for a part of the time it is held otherwise."""
        fwd = self.forward
        cols = list(snapshot_cols)
        los = list(snapshot_los)
        his = list(snapshot_his)
        if fwd.size:
            members = np.ones(fwd.size, dtype=bool) if pinned is None else ~pinned[fwd]
            seg = segment_of_rank
            count = int(seg.max()) + 1
            first_use = np.full(count, self.n, dtype=np.int64)
            np.minimum.at(first_use, seg[members], self.first_backward_reader[fwd[members]])
            forward_end = np.full(count, -1, dtype=np.int64)
            np.maximum.at(forward_end, seg, self.last_forward_reader[fwd])
            # No gap between forward and backward use (the segment of the loss): keep it whole.
            seamless = first_use <= forward_end + 1
            nodes = fwd[members]
            s = seg[members]
            if just_in_time:
                lo, hi = self._just_in_time_holds(nodes, seamless[s])
            else:
                lo = np.where(seamless[s], nodes + 1, np.maximum(first_use[s], nodes) + 1)
                hi = self.last_reader[nodes]
            cols.extend(nodes.tolist())
            los.extend(lo.tolist())
            his.extend(hi.tolist())
        return self.base | _hold_matrix(self.n, cols, los, his)

    def _just_in_time_holds(self, nodes: np.ndarray, seamless: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """First and last held stage of each segment value when each is recomputed once, where it is
        first needed: after its first backward reader, or with the earliest recomputed value that
        reads it; it is then held to its last reader and to the recomputation of the last value that
        reads it (a value of a segment without a gap between forward and backward is held from its
        computation)."""
        graph = self.graph
        lo = np.where(seamless, nodes + 1, np.maximum(self.first_backward_reader[nodes], nodes) + 1)
        start = dict(zip(nodes.tolist(), lo.tolist()))
        end = dict(zip(nodes.tolist(), self.last_reader[nodes].tolist()))
        recomputed = {v for v, whole in zip(nodes.tolist(), seamless.tolist()) if not whole}
        bwd = graph.backward
        for v in sorted(recomputed, reverse=True):       # readers before the values they read
            for u in graph.users[v]:
                if not bwd[u] and u in recomputed:
                    # u is recomputed in stage start[u] - 1, from v
                    start[v] = min(start[v], start[u])
                    end[v] = max(end[v], start[u] - 1)
        return (np.array([start[v] for v in nodes.tolist()], dtype=np.int64),
                np.array([end[v] for v in nodes.tolist()], dtype=np.int64))

    def evaluate(self, retain: np.ndarray) -> tuple[float, int, np.ndarray, np.ndarray]:
        """(cost, peak bytes, R, S) of the valid schedule made from ``retain``."""
        R, S = _finish(self.graph, retain, self.edges)
        cost = float(R.sum(axis=0) @ self.graph.cost)
        return cost, peak_memory_bytes(self.graph, R, S), R, S

    # -- Chen et al.: fixed checkpoints ------------------------------------------------------------
    def checkpoint_retain(self, checkpoints: Iterable[int]) -> np.ndarray:
        """Checkpoints are held from their computation on (later dropped after their last reader by
        :func:`_finish`); the forward nodes between consecutive checkpoints form the segments."""
        chosen = sorted(set(int(c) for c in checkpoints), key=lambda v: self.rank[v])
        pinned = np.zeros(self.n, dtype=bool)
        pinned[chosen] = True
        segment_of_rank = np.cumsum(pinned[self.forward])
        n = self.n
        return self.retain(segment_of_rank, chosen, [c + 1 for c in chosen], [n - 1] * len(chosen), pinned)


def segment_schedule(graph: "Graph", checkpoints: Iterable[int], strategy: str = "") -> Schedule:
    """The schedule of Chen et al.'s segment scheme for a given checkpoint set (any forward nodes)."""
    seg = _Segments(graph)
    R, S = _finish(graph, seg.checkpoint_retain(checkpoints), seg.edges)
    return _schedule(graph, R, S, strategy)


def _linear_candidates(graph: "Graph") -> tuple[int, ...]:
    """Every forward node but the last (usually the loss, needed by the first backward node anyway)."""
    return graph.forward_nodes[:-1]


def _sqrtn_checkpoints(candidates: Sequence[int]) -> list[int]:
    # With c candidates cut into segments of k, memory is about c/k checkpoints plus one segment of
    # k values being recomputed: c/k + k is smallest at k = sqrt(c). ceil keeps k >= 1 and makes
    # the checkpoint count floor(c/k) <= sqrt(c).
    if not candidates:
        return []
    k = math.ceil(math.sqrt(len(candidates)))
    return [v for idx, v in enumerate(candidates) if (idx + 1) % k == 0]


def chen_sqrtn_schedule(graph: "Graph", *, linearized: bool = False) -> Schedule:
    candidates = _linear_candidates(graph) if linearized else graph.articulation_points()
    name = "chen_sqrtn_linearized" if linearized else "chen_sqrtn"
    return segment_schedule(graph, _sqrtn_checkpoints(candidates), name)


def chen_sqrtn(graph: "Graph", budget_bytes: int, options: SolveOptions) -> StrategyOutput:
    return StrategyOutput(chen_sqrtn_schedule(graph))


def chen_sqrtn_linearized(graph: "Graph", budget_bytes: int, options: SolveOptions) -> StrategyOutput:
    return StrategyOutput(chen_sqrtn_schedule(graph, linearized=True))


def chen_greedy_checkpoint_sets(graph: "Graph", candidates: Sequence[int]) -> list[tuple[int, ...]]:
    """Every distinct checkpoint set of Chen et al.'s greedy segmentation, over all thresholds b.

    The greedy walk adds each forward node's bytes to a running total and, at a candidate whose
    total exceeds b, checkpoints it and restarts the total. For b in [b0, b1) the walk makes the same
    decisions, where b1 is the smallest total at which it checkpointed: so the thresholds visited
    are exactly one per interval, starting below every total (all candidates checkpointed) and
    ending at the first b above every total (no checkpoints).
    """
    forward = graph.forward_nodes
    sizes = [int(graph.mem[v]) for v in forward]
    is_candidate = np.zeros(graph.n, dtype=bool)
    is_candidate[list(candidates)] = True
    flags = [bool(is_candidate[v]) for v in forward]
    seen: set[tuple[int, ...]] = set()
    sets: list[tuple[int, ...]] = []
    threshold = -1
    while True:
        check_deadline()  # one pass per set: thousands of passes over thousands of nodes on long chains
        total = 0
        chosen = []
        next_threshold = None
        for v, size, flag in zip(forward, sizes, flags):
            total += size
            if flag and total > threshold:
                chosen.append(v)
                next_threshold = total if next_threshold is None else min(next_threshold, total)
                total = 0
        key = tuple(chosen)
        if key not in seen:
            seen.add(key)
            sets.append(key)
        if next_threshold is None:
            return sets
        threshold = next_threshold


def _infeasible(strategy: str, budget_bytes: int, min_peak: int, what: str) -> InfeasibleBudgetError:
    return InfeasibleBudgetError(
        f"{strategy}: no {what} fits the budget of {format_bytes(budget_bytes)} ({budget_bytes} bytes); "
        f"the smallest peak it reaches is {format_bytes(min_peak)} ({min_peak} bytes): give at least that",
        budget_bytes=budget_bytes, min_feasible_budget_bytes=min_peak, strategy=strategy)


# Members of a family always evaluated. Each takes a few milliseconds on a 350-node graph, and 24 keep a
# whole search (with its bisections) to about a tenth of a second there.
_COARSE_POINTS = 24


def _search_family(size: int, evaluate: Callable[[int], tuple[float, int, np.ndarray, np.ndarray]],
                   budget_bytes: int, strategy: str, what: str) -> tuple[np.ndarray, np.ndarray]:
    """The cheapest member of an ordered family of schedules whose peak fits ``budget_bytes``.

    Members ``0..size-1`` are ordered from the most to the least memory-hungry setting (cost tends
    to grow with the index, the peak tends to shrink, then grow again once segments get long).
    Families can have hundreds of members and each costs a few milliseconds to evaluate, so the
    search evaluates an evenly spread sample (always the same, whatever the budget), then, between
    each sampled member that does not fit and the next one that does, bisects for the first member
    that fits (the cheaper side of the gap). If nothing fits, the members around the smallest
    sampled peak are searched too (a bracketing descent), and the smallest peak seen is reported.
    That refinement does not depend on the budget, so the reported peak is exactly the smallest
    budget at which this search returns a schedule: with it, the same sample and the same descent
    reach that member, and with any less nothing it evaluates fits. Families of at most
    ``_COARSE_POINTS`` members are searched exhaustively. When the caller's deadline passes
    (:mod:`checkmate._deadline`), the cheapest member found to fit so far is returned, and
    :class:`~checkmate.errors.TimeLimitError` raised if none has been.
    """
    results: dict[int, tuple[float, int, np.ndarray, np.ndarray]] = {}

    def get(index: int) -> tuple[float, int, np.ndarray, np.ndarray]:
        if index not in results:
            results[index] = evaluate(index)
        return results[index]

    def fits(index: int) -> bool:
        return get(index)[1] <= budget_bytes

    try:
        _search(size, get, fits, budget_bytes, results)
    except TimeLimitError:
        # The time limit came first: the cheapest member found to fit so far is the answer, if any.
        if not any(peak <= budget_bytes for _, peak, _, _ in results.values()):
            raise
    fitting = [(cost, peak, index) for index, (cost, peak, _, _) in results.items() if peak <= budget_bytes]
    if not fitting:
        min_peak = min(peak for _, peak, _, _ in results.values())
        raise _infeasible(strategy, budget_bytes, min_peak, what)
    _, _, index = min(fitting)
    return results[index][2], results[index][3]


def _search(size: int, get: Callable[[int], tuple], fits: Callable[[int], bool], budget_bytes: int,
            results: dict) -> None:
    """The evaluations of :func:`_search_family`, into ``results``."""
    sample = sorted(set(np.linspace(0, size - 1, min(size, _COARSE_POINTS)).round().astype(int).tolist()))
    for a, b in zip(sample, sample[1:]):
        if not fits(a) and fits(b):
            lo, hi = a, b  # invariant: lo does not fit, hi fits
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    for index in sample:
        get(index)
    if not any(peak <= budget_bytes for _, peak, _, _ in results.values()):
        # Descend to a local minimum of the peak between the sampled neighbours of the smallest
        # sampled peak, halving the bracket on each side: O(log) evaluations, budget-independent.
        def peak_of(index: int) -> tuple[int, int]:
            return get(index)[1], index

        best = min(sample, key=peak_of)
        position = sample.index(best)
        lo = sample[max(0, position - 1)]
        hi = sample[min(len(sample) - 1, position + 1)]
        while best - lo > 1 or hi - best > 1:
            if best - lo > 1:
                probe = (lo + best) // 2
                if peak_of(probe) < peak_of(best):
                    best, hi = probe, best
                else:
                    lo = probe
            if hi - best > 1:
                probe = (best + hi + 1) // 2
                if peak_of(probe) < peak_of(best):
                    best, lo = probe, best
                else:
                    hi = probe


def _chen_greedy(graph: "Graph", budget_bytes: int, linearized: bool) -> StrategyOutput:
    name = "chen_greedy_linearized" if linearized else "chen_greedy"
    candidates = _linear_candidates(graph) if linearized else graph.articulation_points()
    seg = _Segments(graph)
    # Ordered by threshold: most checkpoints (most memory, least recomputation) first.
    family = chen_greedy_checkpoint_sets(graph, candidates)
    R, S = _search_family(len(family), lambda i: seg.evaluate(seg.checkpoint_retain(family[i])),
                          budget_bytes, name, "greedy segmentation")
    return StrategyOutput(_schedule(graph, R, S, name))


def chen_greedy(graph: "Graph", budget_bytes: int, options: SolveOptions) -> StrategyOutput:
    return _chen_greedy(graph, budget_bytes, linearized=False)


def chen_greedy_linearized(graph: "Graph", budget_bytes: int, options: SolveOptions) -> StrategyOutput:
    return _chen_greedy(graph, budget_bytes, linearized=True)


# ------------------------------------------------------------------------------- Griewank / revolve
def revolve_table(steps: int, snapshots: int) -> tuple[np.ndarray, np.ndarray]:
    """Dynamic programme of binomial checkpointing, in the form our stage model needs.

    States ``y_0 .. y_m`` of a chain, ``y_j`` one step after ``y_{j-1}``; ``y_0`` is always available
    at no memory (our chains start from graph inputs). The backward pass needs ``y_m, y_{m-1}, ..,
    y_1`` in that order, each materialised when its turn comes. ``cost[m, s]`` is the fewest step
    evaluations that achieve this (the first sweep included) with ``s`` extra snapshot slots::

        cost[0, s] = 0
        cost[m, 0] = m + cost[m-1, 0]                       (no slot: from y_0 for every turn)
        cost[m, s] = min over 1 <= k <= m of  k + cost[m-k, s-1] + cost[k-1, s]

    (advance to ``y_k`` and snapshot it; serve the turns above ``k`` from it with one slot fewer;
    ``y_k``'s own turn is then free; serve the turns below from ``y_0`` with all slots; ``k = m``
    is "no snapshot"). ``split[m, s]`` is the optimal ``k`` (the largest on ties: snapshots taken
    as late as possible hold memory for less time).
    """
    cost = np.zeros((steps + 1, snapshots + 1), dtype=np.int64)
    split = np.zeros((steps + 1, snapshots + 1), dtype=np.int64)
    for m in range(1, steps + 1):
        if not m % 64:
            check_deadline()
        cost[m, 0] = m + cost[m - 1, 0]
        split[m, 0] = m
        if snapshots:
            k = np.arange(1, m + 1)
            # rows: k = 1..m; columns: s = 1..snapshots
            total = k[:, None] + cost[m - k, :-1] + cost[k - 1, 1:]
            best_from_end = np.argmin(total[::-1], axis=0)
            split[m, 1:] = m - best_from_end
            cost[m, 1:] = total[m - 1 - best_from_end, np.arange(snapshots)]
    return cost, split


def revolve_snapshots(steps: int, snapshots: int, split: np.ndarray | None = None) -> list[tuple[int, int]]:
    """The snapshots of the optimal binomial schedule: ``(state j, host)`` pairs, ``y_j`` being taken
    while advancing for the turn of state ``host`` (``host = steps + 1``: during the first forward
    sweep) and held until ``y_j``'s own turn. Snapshots are retaken during recompute sweeps, so the
    set held changes from turn to turn, following the revolve recursion.
    """
    if split is None:
        split = revolve_table(steps, snapshots)[1]
    taken: list[tuple[int, int]] = []
    # Explicit stack of (base, m, s, host): serve the turns of y_{base+m} .. y_{base+1} from y_base.
    stack = [(0, steps, snapshots, steps + 1)]
    while stack:
        base, m, s, host = stack.pop()
        while m > 0:
            k = int(split[m, s]) if s > 0 else m
            if k < m:
                taken.append((base + k, host))
                # The turns above k run first (pushed last, popped first) from the new snapshot;
                # afterwards the turns below k are served from y_base, advancing at turn base+k-1.
                stack.append((base, k - 1, s, base + k - 1))
                base, m, s = base + k, m - k, s - 1
            else:
                m -= 1
                host = base + m
    return taken


def _chain_states(graph: "Graph") -> list[int]:
    """The articulation-point chain: the first forward node, every articulation point and the last
    forward node, each of them separating what comes before it from what comes after.

    A forward graph without articulation points is a one-step chain (from its first to its last
    node): binomial checkpointing then degenerates to keeping everything, which is still a valid
    answer rather than an error.
    """
    forward = graph.forward_nodes
    if not forward:
        raise InvalidArgumentError(
            f"griewank_logn needs forward nodes to checkpoint, and every node of graph {graph.name!r} is "
            "marked backward; try checkpoint_all or checkmate_milp")
    return sorted(set([forward[0], *graph.articulation_points(), forward[-1]]))


class _Revolve:
    """Griewank's binomial checkpointing over the articulation-point chain, for any slot count."""

    def __init__(self, graph: "Graph", max_cells: int = 40_000_000):
        self.seg = _Segments(graph)
        seg = self.seg
        self.states = _chain_states(graph)
        self.steps = len(self.states)
        state_rank = seg.rank[self.states]
        # segment j (1-based) = forward nodes with rank in (rank(y_{j-1}), rank(y_j)]
        self.segment_of_rank = np.searchsorted(state_rank, np.arange(seg.forward.size), side="left")
        # The DP is O(steps^2 * slots); beyond max_cells the extra slots would only shave off the
        # last few recomputations of very long chains, while costing seconds to tabulate.
        self.max_snapshots = max(0, min(self.steps - 1, max_cells // max(1, self.steps * self.steps)))
        self.cost, self.split = revolve_table(self.steps, self.max_snapshots)
        # turn[j]: the stage of state y_j's turn, its segment's first backward consumer (kept in
        # revolve order: y_steps first).
        first_use = np.full(self.steps, seg.n, dtype=np.int64)
        np.minimum.at(first_use, self.segment_of_rank, seg.first_backward_reader[seg.forward])
        self.turn = np.zeros(self.steps + 2, dtype=np.int64)
        latest = -1
        for j in range(self.steps, 0, -1):
            latest = max(latest, int(first_use[j - 1]))
            self.turn[j] = min(latest, seg.n - 1)

    def retain(self, snapshots: int) -> np.ndarray:
        cols, los, his = [], [], []
        for j, host in revolve_snapshots(self.steps, snapshots, self.split):
            node = self.states[j - 1]
            start = node if host == self.steps + 1 else max(node, int(self.turn[host]))
            cols.append(node)
            los.append(start + 1)
            his.append(int(self.turn[j]))
        return self.seg.retain(self.segment_of_rank, cols, los, his)


def griewank_schedule(graph: "Graph", snapshots: int) -> Schedule:
    """The binomial-checkpointing schedule with ``snapshots`` slots (clipped to what can help)."""
    rev = _Revolve(graph)
    R, S = _finish(graph, rev.retain(min(snapshots, rev.max_snapshots)), rev.seg.edges)
    return _schedule(graph, R, S, "griewank_logn")


def griewank_logn(graph: "Graph", budget_bytes: int, options: SolveOptions) -> StrategyOutput:
    rev = _Revolve(graph)
    # Most snapshot slots (most memory, least recomputation) first.
    top = rev.max_snapshots
    R, S = _search_family(top + 1, lambda i: rev.seg.evaluate(rev.retain(top - i)), budget_bytes,
                          "griewank_logn", "snapshot count")
    return StrategyOutput(_schedule(graph, R, S, "griewank_logn"))
