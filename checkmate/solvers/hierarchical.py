"""Hierarchical strategy: schedules for graphs far beyond the flat MILP, by blocks and dynamic programming.

The flat MILP has ``O(n^2)`` binaries and stops scaling at a few hundred nodes. Deep models are long
sequences of similar blocks, and this strategy exploits that structure in four steps:

1. **Segments.** The forward nodes are cut where few values cross: at articulation points (one value
   crosses) and, inside longer stretches, at the positions where the fewest bytes cross, so that no
   segment holds more than :data:`MAX_SEGMENT_FORWARD_NODES` forward nodes (a graph with no such
   structure is coarsened into capped chunks rather than refused). Every segment gets a signature
   (the costs, sizes, flags and local edges of its nodes); equal signatures are identical blocks.
2. **Menus.** A *group* is a run of consecutive segments that the backward pass recomputes together
   from the values the group keeps. Each distinct group is solved once, by a small MILP: which of its
   forward values to keep from the forward pass until their backward use, and which to recompute
   (once, where the group's backward first needs it), for a ladder of caps on the kept bytes. The Pareto
   points (kept bytes, recomputation cost) are the group's menu. Values that later groups read
   (the boundary) are always kept.
3. **Dynamic programme.** Along the sequence, choose the grouping and one menu option per group to
   minimise the total recomputation cost, subject to the memory of every group's forward and
   backward: the bytes kept by the groups before it plus its own working memory must fit the budget.
4. **Replay.** The choices become one retention matrix, turned into an ordinary schedule (minimal
   recomputation, useless holds dropped) and replayed by the simulator. The working-memory model of
   step 3 is calibrated on those replays: the programme is solved again with each group's observed
   working memory, and the budget it plans for is lowered until the replayed peak fits. Where no
   programme fits (one level of recomputation cannot reach the budget), the programme planned for
   the least peak reached, a little above the budget and far cheaper than the most frugal one, is
   repaired to the budget by dropping holds at the peak.

Each forward value is recomputed at most once, short of such a repair (one level of recomputation,
as in Chen et al.'s scheme, but with the kept set chosen per block by a MILP, as Checkmate does). The result carries a
lower bound: the cost of computing every node once plus the cheapest recomputation that the memory
at each node's first run forces (:func:`checkmate.bounds.cost_lower_bound`, at any scale), or the
LP relaxation of the flat MILP where that is affordable and higher; its ``status`` says which, and
what was done to the graph.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable

import numpy as np

from checkmate.bounds import cost_lower_bound
from checkmate._deadline import check_deadline, no_deadline
from checkmate.errors import CheckmateError, InfeasibleBudgetError, TimeLimitError
from checkmate.schedule import Schedule
from checkmate.simulate import walk
from checkmate.solvers.baselines import _Segments
from checkmate.solvers.milp import lower_bound_lp
from checkmate.solvers.types import SolveOptions, StrategyOutput, is_proven_optimal, relative_gap, within_words

if TYPE_CHECKING:  # pragma: no cover
    from checkmate.graph import Graph

__all__ = ["hierarchical", "hierarchical_schedule", "HierarchicalPlan", "find_segments", "group_menu",
           "MAX_SEGMENT_FORWARD_NODES", "MAX_GROUP_FORWARD_NODES"]

# A segment longer than this (forward nodes between two articulation points) is cut at the positions
# where the fewest bytes cross: the group MILPs stay small (two binaries per forward node).
MAX_SEGMENT_FORWARD_NODES = 48
# Groups (runs of segments recomputed together) span at most this many forward nodes and segments.
MAX_GROUP_FORWARD_NODES = 160
MAX_GROUP_SEGMENTS = 8
# Points on each group's menu: caps on its kept bytes, spread evenly between keeping only its boundary
# and keeping everything its backward reads.
MENU_CAPS = 12
# Resolution of the dynamic programme's memory axis (buckets of budget / this).
DP_BUCKETS = 1500
# Replays used to calibrate the programme's working-memory model and to settle its planning budget.
CALIBRATION_ROUNDS = 3
SETTLE_ROUNDS = 12
# Programme rounds that still run after the time limit when no schedule fits yet.
LATE_ROUNDS = 3
# Where no programme fits: rounds of the programme planned for the least peak reached (a start for a
# repair to the budget; see _relaxed_programme).
RELAXED_ROUNDS = 3
# That programme is repaired by this strategy itself (in its time left) where it peaks at most this
# share above the budget. Measured: experiments/results/solver_quality_hier.md.
RELAXED_REPAIR_MAX_EXCESS = 0.05
# Flat LP bound: computed up to this many nodes (its model has O(n^2) variables), within at most this
# share of the time limit. Measured: experiments/results/README.md, section i.
LP_BOUND_MAX_NODES = 160
LP_BOUND_TIME_FRACTION = 0.25
LP_BOUND_DEFAULT_TIME_S = 30.0
_MENU_TIME_LIMIT_S = 5.0
# Recompute each value a group does not keep where its backward first needs it (not all when the
# group's backward starts).
JUST_IN_TIME = True
# Share of the time limit for menus of groups longer than one segment (shortest groups first).
# Measured: experiments/results/README.md, section i.
MENU_TIME_FRACTION = 0.5


# ------------------------------------------------------------------------------------------ structure
@dataclass(frozen=True)
class _Structure:
    """Per-graph facts: forward ranks, readers, and the segments of the forward sequence."""

    forward: np.ndarray              # forward node ids in order
    rank: np.ndarray                 # rank[v] among forward nodes, -1 for backward nodes
    segments: tuple[tuple[int, int], ...]   # [lo, hi) ranges of forward ranks
    backward_readers: tuple[tuple[int, ...], ...]   # per node: its backward readers
    last_forward_reader_rank: np.ndarray   # per forward rank: the largest rank of a forward reader
    coarsened: bool                  # some segment was cut inside (no articulation point there)


def _crossing_bytes(graph: "Graph", forward: np.ndarray, rank: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per cut position r (between ranks r and r+1): bytes and count of forward values crossing it."""
    m = forward.size
    delta_bytes = np.zeros(m + 1, dtype=np.int64)
    delta_count = np.zeros(m + 1, dtype=np.int64)
    for r, v in enumerate(forward.tolist()):
        far = max((int(rank[u]) for u in graph.users[v] if rank[u] >= 0), default=r)
        if far > r:
            delta_bytes[r] += int(graph.mem[v])
            delta_bytes[far] -= int(graph.mem[v])
            delta_count[r] += 1
            delta_count[far] -= 1
    return np.cumsum(delta_bytes)[:m], np.cumsum(delta_count)[:m]


def find_segments(graph: "Graph", max_forward_nodes: int = MAX_SEGMENT_FORWARD_NODES) -> _Structure:
    """Cut the forward sequence at articulation points, and long stretches at their narrowest cuts."""
    forward = np.array(graph.forward_nodes, dtype=np.int64)
    rank = np.full(graph.n, -1, dtype=np.int64)
    rank[forward] = np.arange(forward.size)
    m = forward.size
    crossing_bytes, crossing_count = _crossing_bytes(graph, forward, rank)
    cuts = sorted({int(rank[a]) + 1 for a in graph.articulation_points()})
    bounds = [0, *[c for c in cuts if 0 < c < m], m]
    segments: list[tuple[int, int]] = []
    coarsened = False

    def split(lo: int, hi: int) -> None:
        nonlocal coarsened
        if hi - lo <= max_forward_nodes:
            segments.append((lo, hi))
            return
        # the narrowest cut (fewest bytes, then fewest values) in the middle half keeps both sides long
        window = range(lo + max(1, (hi - lo) // 4), hi - max(1, (hi - lo) // 4))
        best = min(window, key=lambda r: (int(crossing_bytes[r - 1]), int(crossing_count[r - 1]), abs(2 * r - lo - hi)))
        coarsened = True
        split(lo, best)
        split(best, hi)

    for lo, hi in zip(bounds, bounds[1:]):
        if hi > lo:
            split(lo, hi)
    readers = tuple(tuple(u for u in graph.users[v] if graph.backward[u]) for v in range(graph.n))
    last_fwd = np.array([max((int(rank[u]) for u in graph.users[v] if rank[u] >= 0), default=r)
                         for r, v in enumerate(forward.tolist())], dtype=np.int64)
    return _Structure(forward, rank, tuple(segments), readers, last_fwd, coarsened)


# ------------------------------------------------------------------------------------------ menus
@dataclass(frozen=True)
class MenuOption:
    kept_bytes: int                  # bytes held from the forward pass into the group's backward
    cost: float                      # recomputation cost
    keep: tuple[int, ...]            # local indices (positions in the group) of the kept values


@dataclass
class _Group:
    lo: int                          # first segment
    hi: int                          # one past the last segment
    nodes: np.ndarray                # forward node ids of the group, in order
    needed: np.ndarray               # bool per node: read by a backward node
    forced: np.ndarray               # bool per node: must be kept (read after the group, or not recomputable)
    local_inputs: tuple[tuple[int, ...], ...]   # per node: positions of its forward inputs inside the group
    seamless: bool                   # the group's backward starts right after its forward (holds the loss)

    def signature(self, graph: "Graph") -> tuple:
        return (tuple(float(c) for c in graph.cost[self.nodes]), tuple(int(b) for b in graph.mem[self.nodes]),
                tuple(self.needed.tolist()), tuple(self.forced.tolist()), self.local_inputs, self.seamless)


def _make_group(graph: "Graph", st: _Structure, lo: int, hi: int) -> _Group:
    r0, r1 = st.segments[lo][0], st.segments[hi - 1][1]
    nodes = st.forward[r0:r1]
    position = {int(v): p for p, v in enumerate(nodes.tolist())}
    needed = np.array([bool(st.backward_readers[v]) for v in nodes.tolist()], dtype=bool)
    forced = (st.last_forward_reader_rank[r0:r1] >= r1) | ~graph.recomputable[nodes] | graph.output[nodes]
    local_inputs = tuple(tuple(position[u] for u in graph.deps[v] if u in position) for v in nodes.tolist())
    first_bwd = min((min(st.backward_readers[v]) for v in nodes.tolist() if st.backward_readers[v]), default=graph.n)
    last_fwd_stage = max(int(st.forward[min(int(st.last_forward_reader_rank[r]), st.forward.size - 1)])
                         for r in range(r0, r1))
    seamless = first_bwd <= max(last_fwd_stage, int(nodes[-1])) + 1
    return _Group(lo, hi, nodes, needed, forced, local_inputs, seamless)


def group_menu(graph: "Graph", group: _Group, caps: int = MENU_CAPS) -> tuple[MenuOption, ...]:
    """The Pareto points (kept bytes, recomputation cost) of one group, each from a small MILP."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import lil_matrix

    nodes = group.nodes
    size = nodes.size
    mem = graph.mem[nodes].astype(np.float64)
    cost = graph.cost[nodes].astype(np.float64)
    everything = tuple(range(size))
    if group.seamless:
        return (MenuOption(int(mem[group.needed | group.forced].sum()), 0.0, everything),)
    free = group.needed & ~group.forced
    if not free.any():
        # nothing to choose: keep what must be kept
        return (MenuOption(int(mem[group.forced].sum()), 0.0, tuple(np.flatnonzero(group.forced).tolist())),)
    caps = min(caps, int(free.sum()) + 1)
    # variables: keep[0..size), recompute[size..2 size)
    lower: list[float] = []
    upper: list[float] = []
    A = lil_matrix((size * 2 + sum(len(d) for d in group.local_inputs) + 1, 2 * size))
    row = 0
    for p in range(size):
        if group.needed[p]:
            A[row, p] = 1.0
            A[row, size + p] = 1.0
            lower.append(1.0)
            upper.append(np.inf)
            row += 1
        for q in group.local_inputs[p]:
            # recomputing p needs each input inside the group kept or recomputed
            A[row, size + p] = 1.0
            A[row, q] = -1.0
            A[row, size + q] = -1.0
            lower.append(-np.inf)
            upper.append(0.0)
            row += 1
    budget_row = row
    A[row, :size] = mem
    lower.append(0.0)
    upper.append(np.inf)
    row += 1
    A = A[:row].tocsr()
    lb = np.zeros(2 * size)
    ub = np.ones(2 * size)
    lb[:size][group.forced] = 1.0
    ub[size:][group.forced | ~graph.recomputable[nodes]] = 0.0
    least = float(mem[group.forced].sum())
    most = float(mem[group.needed | group.forced].sum())
    # a tie-break towards fewer kept bytes, far below any cost difference
    scale = max(float(cost.sum()), 1.0)
    objective = np.concatenate([mem / max(most, 1.0) * 1e-6 * scale / max(size, 1), cost])
    options: dict[tuple[int, ...], MenuOption] = {}
    for cap in np.unique(np.linspace(least, most, caps)):
        upper[budget_row] = cap
        res = milp(objective, constraints=LinearConstraint(A, np.array(lower), np.array(upper)),
                   integrality=np.ones(2 * size), bounds=Bounds(lb, ub),
                   options={"time_limit": _MENU_TIME_LIMIT_S, "mip_rel_gap": 1e-6})
        if res.x is None:
            continue
        keep = np.round(res.x[:size]) > 0.5
        recompute = np.round(res.x[size:]) > 0.5
        option = MenuOption(int(mem[keep].sum()), float(cost[recompute].sum()), tuple(np.flatnonzero(keep).tolist()))
        options.setdefault(option.keep, option)
    full = MenuOption(int(most), 0.0, tuple(np.flatnonzero(group.needed | group.forced).tolist()))
    options.setdefault(full.keep, full)
    # Pareto filter: fewer bytes or less cost
    ordered = sorted(options.values(), key=lambda o: (o.kept_bytes, o.cost))
    pareto: list[MenuOption] = []
    for option in ordered:
        if not pareto or option.cost < pareto[-1].cost - 1e-9 * max(abs(pareto[-1].cost), 1.0):
            pareto.append(option)
    return tuple(pareto)


# ------------------------------------------------------------------------------------------ plan
@dataclass
class HierarchicalPlan:
    """What the strategy did, for reports and tests."""

    segments: int = 0
    groups: int = 0
    distinct_groups_solved: int = 0
    menu_solves: int = 0
    coarsened: bool = False
    calibrations: int = 0
    replays: int = 0
    notes: list[str] = field(default_factory=list)


class _Planner:
    def __init__(self, graph: "Graph", deadline: float | None):
        self.graph = graph
        self.deadline = deadline
        now = time.perf_counter()
        self.menu_deadline = None if deadline is None else now + MENU_TIME_FRACTION * max(deadline - now, 0.0)
        self.st = find_segments(graph)
        self.plan = HierarchicalPlan(segments=len(self.st.segments), coarsened=self.st.coarsened)
        self.groups: dict[tuple[int, int], _Group] = {}
        self.menus: dict[tuple, tuple[MenuOption, ...]] = {}
        self.group_menu: dict[tuple[int, int], tuple[MenuOption, ...]] = {}
        self.seg = _Segments(graph)
        self._candidate_groups()
        check_deadline()
        self._work = {key: self._working_estimate(g) for key, g in self.groups.items()}

    def _time_left(self) -> float:
        return math.inf if self.deadline is None else self.deadline - time.perf_counter()

    def _candidate_groups(self) -> None:
        """Every run of up to :data:`MAX_GROUP_SEGMENTS` segments (and :data:`MAX_GROUP_FORWARD_NODES`
        forward nodes) with its menu, shortest runs first; runs of two or more segments only while
        the menu share of the time limit lasts (single segments always: every programme needs them)."""
        segs = self.st.segments
        self.group_ends: list[list[int]] = [[] for _ in segs]
        growing = list(range(len(segs)))      # starts whose runs may still grow
        for length in range(1, MAX_GROUP_SEGMENTS + 1):
            still = []
            for lo in growing:
                check_deadline()  # thousands of segments on graphs of many thousand nodes
                hi = lo + length
                if hi > len(segs) or (length > 1 and segs[hi - 1][1] - segs[lo][0] > MAX_GROUP_FORWARD_NODES):
                    continue
                if length > 1 and self.menu_deadline is not None and time.perf_counter() > self.menu_deadline:
                    self.plan.notes.append(f"groups of up to {length - 1}-{length} segments within the time limit "
                                           f"(up to {MAX_GROUP_SEGMENTS} with more time)")
                    return
                group = _make_group(self.graph, self.st, lo, hi)
                self.groups[(lo, hi)] = group
                self.group_ends[lo].append(hi)
                key = group.signature(self.graph)
                if key not in self.menus:
                    self.menus[key] = group_menu(self.graph, group)
                    self.plan.distinct_groups_solved += 1
                    self.plan.menu_solves += 1
                self.group_menu[(lo, hi)] = self.menus[key]
                still.append(lo)
            growing = still

    def _working_estimate(self, group: _Group) -> int:
        """Bytes a group needs beyond what earlier groups keep: its own values read by its backward, the
        largest backward node with its gradient inputs, the resident outputs, and the fixed bytes."""
        graph = self.graph
        own = int(graph.mem[group.nodes[group.needed | group.forced]].sum())
        readers = sorted({u for v in group.nodes.tolist() for u in self.st.backward_readers[v]})
        widest = 0
        for k in readers:
            widest = max(widest, int(graph.mem[k]) + sum(int(graph.mem[d]) for d in graph.deps[k] if graph.backward[d]))
        last = max(readers, default=int(group.nodes[-1]))
        outputs = int(graph.mem[:last + 1][graph.output[:last + 1]].sum())
        return int(graph.fixed_mem) + own + widest + outputs

    # -------------------------------------------------------------------------------- programme
    def solve_dp(self, budget_bytes: int, work: dict[tuple[int, int], int]):
        """Cheapest grouping and options with kept(before g) + work(g) <= budget for every group g."""
        L = len(self.st.segments)
        unit = max(1, math.ceil(budget_bytes / DP_BUCKETS))
        buckets = budget_bytes // unit + 1
        best = np.full((L + 1, buckets), np.inf)
        # back-pointers: the group start, the prefix bucket before it and the option index
        back_lo = np.zeros((L + 1, buckets), dtype=np.int64)
        back_state = np.zeros((L + 1, buckets), dtype=np.int64)
        back_option = np.zeros((L + 1, buckets), dtype=np.int64)
        best[0, 0] = 0.0
        for lo in range(L):
            if not lo % 64:
                check_deadline()
            row = best[lo]
            reachable = np.flatnonzero(np.isfinite(row))
            if not reachable.size:
                continue
            for hi in self.group_ends[lo]:
                room = budget_bytes - work[(lo, hi)]
                if room < 0:
                    continue
                states = reachable[reachable <= room // unit]   # prefix bytes <= bucket * unit <= room
                if not states.size:
                    continue
                for index, option in enumerate(self.group_menu[(lo, hi)]):
                    dst = states + math.ceil(option.kept_bytes / unit)
                    ok = dst < buckets
                    src, dst = states[ok], dst[ok]
                    values = row[src] + option.cost
                    improve = values < best[hi, dst]
                    src, dst = src[improve], dst[improve]
                    best[hi, dst] = values[improve]
                    back_lo[hi, dst] = lo
                    back_state[hi, dst] = src
                    back_option[hi, dst] = index
        finals = np.flatnonzero(np.isfinite(best[L]))
        if not finals.size:
            return None
        state = int(finals[np.argmin(best[L, finals])])
        choice = []
        pos = L
        while pos > 0:
            glo, prev, index = int(back_lo[pos, state]), int(back_state[pos, state]), int(back_option[pos, state])
            choice.append(((glo, pos), index))
            pos, state = glo, prev
        return list(reversed(choice))

    # -------------------------------------------------------------------------------- replay
    def retain(self, choice) -> np.ndarray:
        segment_of_rank = np.zeros(self.st.forward.size, dtype=np.int64)
        keep_nodes: list[int] = []
        for g_index, ((lo, hi), index) in enumerate(choice):
            group = self.groups[(lo, hi)]
            r0, r1 = self.st.segments[lo][0], self.st.segments[hi - 1][1]
            segment_of_rank[r0:r1] = g_index
            option = self.group_menu[(lo, hi)][index]
            keep_nodes.extend(int(group.nodes[p]) for p in option.keep)
        pinned = np.zeros(self.graph.n, dtype=bool)
        pinned[keep_nodes] = True
        n = self.graph.n
        return self.seg.retain(segment_of_rank, keep_nodes, [v + 1 for v in keep_nodes], [n - 1] * len(keep_nodes),
                               pinned, just_in_time=JUST_IN_TIME)

    def evaluate(self, choice):
        self.plan.replays += 1
        return self.seg.evaluate(self.retain(choice))

    def observed_work(self, choice, R: np.ndarray, S: np.ndarray) -> dict[tuple[int, int], int]:
        """Each chosen group's working memory as replayed: the peak of its stages minus what earlier
        groups keep. Forward stages belong to the group of their node, backward stages to the group
        whose values they read (the latest such group)."""
        graph = self.graph
        sim_steps = _stage_peaks(graph, R, S)
        group_of_node = np.full(graph.n, -1, dtype=np.int64)
        kept_before = []
        total = 0
        for g_index, ((lo, hi), index) in enumerate(choice):
            group = self.groups[(lo, hi)]
            group_of_node[group.nodes] = g_index
            kept_before.append(total)
            total += self.group_menu[(lo, hi)][index].kept_bytes
        stage_group = np.full(graph.n, -1, dtype=np.int64)
        current = len(choice) - 1
        for t in range(graph.n):
            if not graph.backward[t]:
                stage_group[t] = group_of_node[t]
                continue
            owners = [group_of_node[d] for d in graph.deps[t] if group_of_node[d] >= 0]
            if owners:
                current = min(current, max(owners))
            stage_group[t] = current
        out = {}
        for g_index, (key, _) in enumerate(choice):
            stages = np.flatnonzero(stage_group == g_index)
            if stages.size:
                out[key] = int(sim_steps[stages].max()) - kept_before[g_index]
        return out


def _stage_peaks(graph: "Graph", R: np.ndarray, S: np.ndarray) -> np.ndarray:
    """Peak memory of each stage under the memory model (a replay, one walk)."""
    peaks = np.zeros(graph.n, dtype=np.int64)
    for event in walk(graph, R, S):
        if event[0] == "compute":
            _, t, _, current = event
            if current > peaks[t]:
                peaks[t] = current
    return peaks


def _relaxed_programme(planner: "_Planner", work: dict, target: int, consider: Callable) -> tuple | None:
    """Where no programme fits, the cheapest ones the programme finds for the least peak this strategy
    reaches (:data:`RELAXED_ROUNDS` rounds, each calibrated on the replay before it): the least-peak
    of them, ``(peak, cost, R, S)``, or None. Far cheaper than the frugal programme and a little above
    the budget, it is a start for a repair to the budget (InceptionResNetV2 at 50% of its activations:
    1.0099x at 1.005 the budget, repaired to 1.0142x, where auto repaired the frugal programme to
    1.243x; experiments/results/solver_quality_hier.md)."""
    found = None
    work = dict(work)
    try:
        for _ in range(RELAXED_ROUNDS):
            choice = planner.solve_dp(target, work)
            if choice is None:
                break
            cost, peak, R, S = consider(choice)
            if found is None or (peak, cost) < found[:2]:
                found = (peak, cost, R, S)
            work.update(planner.observed_work(choice, R, S))
    except TimeLimitError:
        pass
    return found


def _repaired(graph: "Graph", relaxed: tuple | None, budget_bytes: int, deadline: float | None) -> tuple | None:
    """``relaxed`` (:func:`_relaxed_programme`) repaired to the budget within the time limit, as
    ``(cost, peak, R, S)``, where it peaks at most :data:`RELAXED_REPAIR_MAX_EXCESS` above it; else None."""
    from checkmate.solvers.rounding import repair_to_budget

    if relaxed is None or relaxed[0] > budget_bytes * (1 + RELAXED_REPAIR_MAX_EXCESS):
        return None
    if deadline is not None and deadline - time.perf_counter() < 1.0:
        return None
    try:
        with no_deadline():
            start = Schedule.from_matrices(graph, relaxed[2], relaxed[3], strategy="hierarchical")
        found = repair_to_budget(graph, start, budget_bytes, deadline=deadline)
    except TimeLimitError:
        return None
    if found is None or found.peak_bytes > budget_bytes:
        return None
    return (float(found.cost), int(found.peak_bytes), found.schedule.recompute, found.schedule.retain)


def _frugal_choice(planner: "_Planner"):
    """Every segment its own group, each keeping as little as it can: the least memory this strategy plans."""
    return [((lo, lo + 1), 0) for lo in range(len(planner.st.segments))]


def hierarchical_schedule(graph: "Graph", budget_bytes: int, *, deadline: float | None = None,
                          plan: HierarchicalPlan | None = None,
                          progress: Callable[[float, float | None], None] | None = None,
                          closest: list | None = None) -> tuple[Schedule, float, int]:
    """The hierarchical strategy's schedule for ``budget_bytes``: ``(schedule, cost, peak)``.

    ``progress(elapsed_s, best_cost_or_None)`` is called after each replay. A ``KeyboardInterrupt``
    during the search returns the best schedule found so far (re-raised when there is none). Raises
    :class:`InfeasibleBudgetError` when no replayed programme fits; its minimum is the peak of the most
    frugal programme, at which this strategy always succeeds. ``closest``, when given, then receives
    starts for a repair to the budget, as ``(peak_bytes, schedule)``: the cheap programme planned for
    that least peak (:func:`_relaxed_programme`), then the least-peak programme replayed.
    """
    start = time.perf_counter()
    planner = _Planner(graph, deadline)
    if plan is not None:
        plan.__dict__.update(planner.plan.__dict__)
        planner.plan = plan
    best = None        # (cost, peak, R, S)
    frugal_peak = None
    relaxed = None     # the least-peak programme planned for the frugal peak: (peak, cost, R, S)
    nearest = None     # the least-peak programme replayed: (peak, cost, R, S)

    def consider(choice) -> tuple[float, int, np.ndarray, np.ndarray]:
        nonlocal best, nearest
        cost, peak, R, S = planner.evaluate(choice)
        if nearest is None or (peak, cost) < nearest[:2]:
            nearest = (peak, cost, R, S)
        if peak <= budget_bytes and (best is None or cost < best[0]):
            best = (cost, peak, R, S)
            planner.plan.groups = len(choice)
        if progress is not None:
            progress(time.perf_counter() - start, None if best is None else best[0])
        return cost, peak, R, S

    try:
        work = dict(planner._work)
        target = budget_bytes
        late_rounds = 0
        for round_index in range(CALIBRATION_ROUNDS + SETTLE_ROUNDS):
            if planner._time_left() <= 0:
                # Past the deadline (the menus took it all): a few programme rounds still run, each a
                # dynamic programme and one replay, so that the menus are not wasted on a fallback.
                late_rounds += 1
                if best is not None or late_rounds > LATE_ROUNDS:
                    break
            choice = planner.solve_dp(target, work)
            if choice is None:
                if round_index >= CALIBRATION_ROUNDS:
                    break
                # the working-memory estimate rules everything out: calibrate it on the frugal programme
                choice = _frugal_choice(planner)
            cost, peak, R, S = consider(choice)
            if round_index < CALIBRATION_ROUNDS:
                work.update(planner.observed_work(choice, R, S))
                planner.plan.calibrations += 1
                continue
            if peak <= budget_bytes:
                break
            target -= peak - budget_bytes
            if target <= 0:
                break
        if best is None:
            frugal_peak = consider(_frugal_choice(planner))[1]
            relaxed = _relaxed_programme(planner, work, frugal_peak, consider)
            repaired = _repaired(graph, relaxed, budget_bytes, deadline)
            if repaired is not None:
                best = repaired
                planner.plan.notes.append("no programme fits: the one planned for its least peak "
                                          f"({relaxed[0] / budget_bytes:.3f} of the budget) repaired to it "
                                          "(holds dropped at the peak, cheapest per byte first)")
    except KeyboardInterrupt:
        if best is None:
            raise
        planner.plan.notes.append("interrupted: the best schedule found so far")
    except TimeLimitError:
        # the caller's hard deadline (past the time limit and the late rounds) came during a replay
        if best is None:
            raise
        planner.plan.notes.append("time limit reached: the best schedule found so far")
    if best is None:
        if closest is not None:
            with no_deadline():
                for found in (relaxed, nearest):
                    if found is not None and not any(int(found[0]) == peak for peak, _ in closest):
                        closest.append((int(found[0]), Schedule.from_matrices(graph, found[2], found[3],
                                                                              strategy="hierarchical")))
        raise InfeasibleBudgetError(
            f"hierarchical: no schedule it plans fits {budget_bytes} bytes; the smallest peak it reaches is "
            f"{frugal_peak} bytes: give at least that, or use griewank_logn or checkpoint_last_node, "
            "which recompute more to use less memory",
            budget_bytes=budget_bytes, min_feasible_budget_bytes=frugal_peak, strategy="hierarchical")
    cost, peak, R, S = best
    with no_deadline():  # the schedule found is written out whatever the time
        return Schedule.from_matrices(graph, R, S, strategy="hierarchical"), cost, peak


def _lp_bound(graph: "Graph", budget_bytes: int, options: "SolveOptions", deadline: float | None) -> float | None:
    """The flat LP relaxation's bound where the graph is small enough for it, else None."""
    if graph.n > LP_BOUND_MAX_NODES:
        return None
    left = LP_BOUND_DEFAULT_TIME_S if deadline is None else LP_BOUND_TIME_FRACTION * (deadline - time.perf_counter())
    if left < 1.0:
        return None
    try:
        out = lower_bound_lp(graph, budget_bytes, replace(options, time_limit_s=left))
    except CheckmateError:  # a bound is a bonus: a solver that fails on it must not lose the schedule
        return None
    return out.lower_bound


def hierarchical(graph: "Graph", budget_bytes: int, options: "SolveOptions",
                 closest: list | None = None, memory_bound: Callable[[], float] | None = None) -> "StrategyOutput":
    """The strategy entry: the schedule, a lower bound and a status saying what was done. ``closest``:
    as :func:`hierarchical_schedule` takes it (the least-peak programme, when the budget is refused).
    ``memory_bound``: a caller's :func:`cost_lower_bound` at this budget, computed once for both (auto
    needs it too: seconds on graphs of hundreds of nodes)."""
    bound_of = memory_bound if memory_bound is not None else (lambda: cost_lower_bound(graph, budget_bytes))
    start = time.perf_counter()
    deadline = None if options.time_limit_s is None else start + float(options.time_limit_s)
    plan = HierarchicalPlan()
    reporter = (_ProgressLog(graph.total_cost, math.inf)
                if options.verbose or _logger.isEnabledFor(logging.INFO) else None)
    schedule, cost, peak = hierarchical_schedule(graph, budget_bytes, deadline=deadline, plan=plan,
                                                 progress=reporter, closest=closest)
    # the bound after the plan: seconds of CPU on graphs of thousands of nodes (2.5 s on NASNetMobile's
    # 2621), which a loaded machine took from the plan when it came first. Past this strategy's time
    # limit or the caller's deadline the plan is kept with the bound that costs nothing: every node
    # computed once (the caller's deadline is polled only between parts of the bound's work).
    memory_cut = deadline is not None and time.perf_counter() > deadline
    try:
        memory_bound = min(graph.total_cost if memory_cut else bound_of(), cost)
    except TimeLimitError:
        memory_bound, memory_cut = min(graph.total_cost, cost), True
    lp = _lp_bound(graph, budget_bytes, options, deadline)
    if lp is not None and lp > memory_bound:
        bound, bound_text = min(lp, cost), "bound from the LP relaxation"
    else:
        bound = memory_bound
        bound_text = ("bound from the bytes each node's first run leaves for the values still needed"
                      + ("" if graph.n <= LP_BOUND_MAX_NODES else
                         f" (the LP relaxation is not computed above {LP_BOUND_MAX_NODES} nodes)"))
        if memory_cut:
            bound_text = "bound: every node computed once (the time limit came before a closer one)"
    gap = relative_gap(cost, bound)
    optimal = is_proven_optimal(gap)
    parts = ["optimal" if optimal else within_words(gap),
             f"{plan.segments} segments" + (" (long stretches cut at their narrowest points)" if plan.coarsened else ""),
             f"{plan.distinct_groups_solved} distinct blocks solved", bound_text, *plan.notes]
    return StrategyOutput(schedule, lower_bound=bound, optimal=optimal, status="; ".join(parts), solver="highs")


_logger = logging.getLogger("checkmate")


class _ProgressLog:
    """Logs elapsed time and the best overhead so far, at most every couple of seconds."""

    INTERVAL_S = 2.0

    def __init__(self, baseline_cost: float, bound: float):
        self.baseline = baseline_cost
        self.bound = bound
        self.last = -math.inf

    def __call__(self, elapsed_s: float, best_cost: float | None) -> None:
        if elapsed_s - self.last < self.INTERVAL_S:
            return
        self.last = elapsed_s
        best = "none fits yet" if best_cost is None or self.baseline <= 0 else f"{best_cost / self.baseline:.4f}x"
        bound = f"{self.bound / self.baseline:.4f}x" if self.baseline > 0 and math.isfinite(self.bound) else "none"
        _logger.info("hierarchical: %.1f s, best overhead %s, bound %s", elapsed_s, best, bound)
