"""Memory facts of a graph that every strategy, the budget parser and the studies share.

Owned here: the checkpoint-all schedule and its peak (the reference of percentage budgets and the top
of every budget range), the working-set lower bound ``fixed + max_k (mem[k] + inputs of k)`` that no
schedule beats, and the two ways of dropping holds that nothing uses (which lower memory and never add
a computation). Everything here follows from the graph and the memory model alone; the searches for a
strategy's minimum budget, which need solving, are in :mod:`checkmate.solvers.minimum_budget`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from checkmate._deadline import check_deadline, seconds_left
from checkmate.schedule import Schedule
from checkmate.simulate import ReadIndex, simulate

if TYPE_CHECKING:  # pragma: no cover
    from checkmate.graph import Graph

__all__ = ["last_use_stage", "checkpoint_all_schedule", "checkpoint_all_peak", "largest_working_set_bytes",
           "peak_floor", "InputIndex", "prune_unused_holds", "drop_holds_unread_by", "cost_lower_bound",
           "COMBINED_BOUND_MAX_NONZEROS", "CLOSURE_BOUND_MAX_PAIRS", "INTEGER_BOUND_TIME_S",
           "INTEGER_BOUND_MAX_NONZEROS"]


# ------------------------------------------------------------------------------------------ bounds
def last_use_stage(graph: "Graph") -> np.ndarray:
    """For each value, the last stage whose first-time computation reads it (own stage if none).

    Output values are held to the end, so their last stage is ``n - 1``.
    """
    last = np.array([max(users) if users else i for i, users in enumerate(graph.users)], dtype=np.int64)
    last[graph.output] = graph.n - 1
    return last


def checkpoint_all_schedule(graph: "Graph") -> Schedule:
    """Keep every value from its computation until its last use: each node runs exactly once."""
    n = graph.n
    last = last_use_stage(graph)
    t = np.arange(n)[:, None]
    i = np.arange(n)[None, :]
    retain = (i < t) & (t <= last[None, :])
    return Schedule.from_retain(graph, retain, strategy="checkpoint_all")


def checkpoint_all_peak(graph: "Graph") -> int:
    """Peak bytes of the checkpoint-all schedule (the reference for percentage budgets).

    Computed without building the ``n x n`` schedule: in checkpoint-all, value ``i`` is held on entry
    to stages ``i+1 .. last_use_stage[i]``, and while node ``k`` runs memory holds the fixed bytes,
    those values and ``k``'s own output (what :func:`simulate` replays; the tests compare the two).
    """
    n = graph.n
    last = last_use_stage(graph)
    delta = np.zeros(n + 1, dtype=np.int64)
    np.add.at(delta, np.arange(n) + 1, graph.mem)
    np.add.at(delta, last + 1, -graph.mem)
    held = np.cumsum(delta)[:n]
    return int(graph.fixed_mem) + int((held + graph.mem).max(initial=0))


def largest_working_set_bytes(graph: "Graph") -> int:
    """``fixed + max_k (mem[k] + sum of k's inputs)``: computing ``k`` alone needs that much, so no
    schedule peaks lower (the trivial lower bound on every budget)."""
    need = graph.mem.astype(np.int64).copy()
    for k, deps in enumerate(graph.deps):
        need[k] += int(graph.mem[list(deps)].sum()) if deps else 0
    return int(graph.fixed_mem) + int(need.max(initial=0))


def peak_floor(graph: "Graph") -> tuple[int, int]:
    """``(bytes, node)``: no schedule of the graph (in its node order) peaks below ``bytes``.

    When node ``t`` first runs, its output, its inputs, the outputs computed before it and every value
    computed before it that a later node reads and that cannot be computed again (not recomputable)
    are resident, with the fixed bytes; ``node`` is the ``t`` where that is largest. Below this,
    :func:`cost_lower_bound` finds no schedule (the same moments, none of whose values may be
    dropped); at least :func:`largest_working_set_bytes`."""
    n = graph.n
    if n == 0:
        return int(graph.fixed_mem), -1
    mem = graph.mem.astype(np.int64)
    output = np.asarray(graph.output, dtype=bool)
    last_reader = np.array([max(users) if users else -1 for users in graph.users], dtype=np.int64)
    # outputs computed before t (an input of t that is an output counts there once)
    outputs_before = np.concatenate([[0], np.cumsum(np.where(output, mem, 0))])[:n]
    # non-recomputable values held across t: v < t < last_reader[v], not outputs
    kept = np.flatnonzero(~np.asarray(graph.recomputable, dtype=bool) & ~output & (last_reader > np.arange(n) + 1))
    delta = np.zeros(n + 1, dtype=np.int64)
    np.add.at(delta, kept + 1, mem[kept])
    np.add.at(delta, last_reader[kept], -mem[kept])
    held = np.cumsum(delta)[:n]
    need = int(graph.fixed_mem) + mem + outputs_before + held
    is_kept = np.zeros(n, dtype=bool)
    is_kept[kept] = True
    for t, deps in enumerate(graph.deps):
        for d in deps:
            # an input is resident as an input, counted once: not again as an output or a held value
            if not output[d] and not (is_kept[d] and t < last_reader[d]):
                need[t] += int(mem[d])
    t = int(np.argmax(need))
    return int(need[t]), t


# ------------------------------------------------------------------------------------------ holds
class InputIndex(ReadIndex):
    """The graph's inputs lists flattened (:class:`~checkmate.simulate.ReadIndex`), for array-wide
    "is value i read in stage t" queries."""

    def read_in_stage(self, R: np.ndarray) -> np.ndarray:
        """``used[t, i]``: some node computed in stage ``t`` reads value ``i``."""
        stage, node = np.nonzero(R)
        reads = self.in_degree[node]
        offsets = np.arange(int(reads.sum())) - np.repeat(np.cumsum(reads) - reads, reads)
        used = np.zeros(R.shape, dtype=bool)
        used[np.repeat(stage, reads), self.inputs[np.repeat(self.first_input[node], reads) + offsets]] = True
        return used


def prune_unused_holds(graph: "Graph", retain: np.ndarray, *, changed_rows: tuple[int, int] | None = None) -> np.ndarray:
    """Drop holds that nothing uses, re-deriving the minimal recomputation as it goes: ``S[t, i]``
    goes when stage ``t`` neither reads ``i`` (under the minimal recomputation of the pruned holds)
    nor holds it into ``t + 1``, and ``i`` is not an output.

    Such a hold only costs memory (the value sits there until the end of the stage). Going from the
    last stage back settles each stage once: a stage's needs depend only on its own S row and the
    next (already pruned), so one pass suffices.

    ``changed_rows=(low, high)``: ``retain`` is a pruned matrix (one this function returned) whose
    rows ``low..high`` were changed since. Rows after ``high`` and their successors are as they were,
    so they are settled already; the pass starts at ``high`` and stops at the first row below ``low``
    that it leaves as it was (every earlier stage then sees what it saw when it was pruned). The same
    result as the full pass, in a few rows' work where a search changes one column.
    """
    n = graph.n
    S = np.array(retain, dtype=bool)
    S &= np.tri(n, k=-1, dtype=bool)
    low, high = (0, n - 1) if changed_rows is None else (max(int(changed_rows[0]), 0), min(int(changed_rows[1]), n - 1))
    prune_rows(graph, S, low, high)
    return S


def prune_rows(graph: "Graph", S: np.ndarray, low: int, high: int, restore: np.ndarray | None = None,
               floor: int | None = None) -> int:
    """:func:`prune_unused_holds` in place on ``S`` (holds only below the diagonal), from row ``high``
    down to the first row below ``low`` that it leaves as it was; returns the lowest row it changed
    or read (``high + 1`` when none).

    ``restore``: holds put back into each row before it is settled (the holds every schedule must
    keep, that an earlier pass pruned where nothing used them): a row the pass stops at is settled
    with them as it was before, so the result is the full pass's on ``S | restore``.

    ``floor``: the pass stops after that row whatever it changed (the caller settles the rows below).
    """
    deps = graph.deps
    output = graph.output
    n = graph.n
    no_next = np.zeros(n, dtype=bool)
    lowest = high + 1
    for t in range(high, 0, -1):
        held = S[t]
        before = held.copy() if t < low else None
        if restore is not None:
            held[:t] |= restore[t, :t]
        keep_next = S[t + 1] if t + 1 < n else no_next
        # the stage's needed set, searched from its seeds through the inputs not held (the work is
        # proportional to the computations, not to t: the skips of a U-Net span most rows)
        held_bytes = held.tobytes()
        stack = [t, *np.flatnonzero(keep_next[: t + 1] & ~held[: t + 1]).tolist()]
        needed = set(stack)
        used: set[int] = set()
        while stack:
            for d in deps[stack.pop()]:
                used.add(d)
                if d not in needed and not held_bytes[d]:
                    needed.add(d)
                    stack.append(d)
        useless = held & ~keep_next & ~output
        if used:
            useless[list(used)] = False
        held[useless] = False
        lowest = t
        if t == floor or before is not None and np.array_equal(before, held):
            break
    return lowest


def drop_holds_unread_by(graph: "Graph", retain: np.ndarray, recompute: np.ndarray,
                         index: InputIndex | None = None) -> np.ndarray:
    """Keep ``S[t, i]`` only if value ``i`` is read in stage ``t`` or later while still held (or is
    an output), the reads being those of the GIVEN recomputation ``recompute``.

    Dropping the rest never adds a computation: nothing computed needed those holds. Unlike
    :func:`prune_unused_holds` the reads are not re-derived: a hold read only by a computation that
    becomes unnecessary once other holds are dropped survives, so callers repeat this with the new
    minimal recomputation until nothing changes.
    """
    check_deadline()  # seconds of array work on graphs of many thousand nodes
    index = index or InputIndex(graph)
    read = index.read_in_stage(recompute) | graph.output[None, :]
    S = np.asarray(retain)
    out = np.zeros_like(S)
    later = np.zeros(S.shape[1], dtype=bool)  # held into t+1 and read there or later
    for t in range(S.shape[0] - 1, 0, -1):
        later = S[t] & (read[t] | later)
        out[t] = later
    return out


# ------------------------------------------------------------------------------------------ cost bound
# The combined bound's linear programme is skipped beyond this many nonzeros (droppable values summed
# over the moments that need drops): about 10^7 nonzeros take HiGHS tens of seconds, and the bound of
# the single worst moment still holds.
COMBINED_BOUND_MAX_NONZEROS = 4_000_000
# The recomputations' inputs (:func:`_closure_extra`) enter the programme for the moments of largest
# single-moment bound first, until this many (value, input) pairs; the moments left out keep their
# plain rows, so the bound stays valid and at least the combined one. 20 000 pairs gave the bound of
# every moment on the 326- and 446-node U-Nets at 30-40% (0.3-0.5 s) and DenseNet121's best at 60% in
# 3 s (its 880 000 pairs did not solve in five minutes).
# Measured: experiments/results/README.md, section i.
CLOSURE_BOUND_MAX_PAIRS = 20_000
# The programme with the recomputations' inputs is solved once more in integers (every schedule's own
# drops, holds and recomputations are 0/1) for at most this long; the branch and bound's dual bound
# when it stops is the bound. A 106-node diffusion-style U-Net at 30%: 1.1737x in fractions, 1.1840x
# in integers in 0.1 s (the flat MILP's own bound after 120 s 1.1878x); the 326- and 446-node ones at
# 30%: 1.0483x to 1.0494x in 6 s and 1.0413x to 1.0417x in 1 s; DenseNet121 at 60% 1.0372x to
# 1.0375x at optimality in 24 s (2 loaded cores): the limit keeps the compile path's bound within
# seconds, and what the branch and bound proved by then still holds.
# Measured: experiments/results/README.md, section i.
INTEGER_BOUND_TIME_S = 5.0
# ... and only while the programme has at most this many nonzeros: the U-Nets' 114 000-138 000 gained
# 0.04-0.1% of the step in 1-6 s, DenseNet121's 383 000 at 60% 0.002% in 5 s and at 55% nothing, time
# taken from the compile path's plan twice (the plan's bound and auto's).
# Measured: experiments/results/README.md, section i.
INTEGER_BOUND_MAX_NONZEROS = 250_000
# The integer programme's rows are met by the solver only up to its feasibility tolerance (1e-6 on rows
# scaled to 1) and its dual bound only up to its optimality tolerance: each row's right-hand side and
# the bound returned are lowered by this relative margin, far more than either, so that no tolerance
# can lift the bound above the true integer optimum.
INTEGER_BOUND_MARGIN = 1e-5


def _moments(graph: "Graph", budget_bytes: int, *, closure: bool = False
             ) -> tuple[list[np.ndarray], list[float], list[np.ndarray]] | None:
    """For each moment a node first runs at which holding every value still needed exceeds the budget:
    the values that may be dropped then (recomputable, still read by a later node), the excess bytes
    that must be dropped, and each droppable value's *window* there (see :func:`_combined_extra`): a
    column number, one per value and span between two consecutive first-time readers of it. None when
    some moment cannot fit even with every droppable value dropped.

    ``closure=True`` adds a fourth list: per moment, the ``(v, u)`` pairs of :func:`_recompute_inputs`
    (a value ``v`` that may be computed again after the moment and an input ``u`` of it that nothing
    keeps resident then)."""
    n = graph.n
    # value v's windows are numbered from window_start[v]: window j spans from its j-th first-time
    # reader (its own computation for j = 0) to the next; readers_before[v] counts v's readers < t
    window_start = np.concatenate([[0], np.cumsum([len(u) + 1 for u in graph.users])[:-1]]).astype(np.int64)
    readers_before = np.zeros(n, dtype=np.int64)
    mem = graph.mem.astype(np.int64)
    last_reader = np.array([max(users) if users else -1 for users in graph.users], dtype=np.int64)
    output = graph.output
    order = np.arange(n)
    outputs_before = np.concatenate([[0], np.cumsum(np.where(output, mem, 0))])
    droppables: list[np.ndarray] = []
    excesses: list[float] = []
    windows: list[np.ndarray] = []
    pairs: list[np.ndarray] = []
    for t in range(1, n):
        prev_inputs = list(graph.deps[t - 1])
        if prev_inputs:
            readers_before[prev_inputs] += 1
        inputs = list(graph.deps[t])
        held_fixed = int(graph.fixed_mem) + int(mem[t]) + int(mem[inputs].sum()) + int(outputs_before[t])
        held_fixed -= int(mem[[d for d in inputs if output[d]]].sum())   # an input that is an output counts once
        # values alive after t: computed before t and read by a node after t (outputs are counted apart)
        alive = (order < t) & (last_reader > t) & ~output
        if inputs:
            alive[inputs] = False
        excess = held_fixed + int(mem[alive].sum()) - int(budget_bytes)
        if excess <= 0:
            continue
        droppable = np.flatnonzero(alive & graph.recomputable & (mem > 0))
        if int(mem[droppable].sum()) < excess:
            return None   # nothing fits: the budget is below what this moment needs
        droppables.append(droppable)
        excesses.append(float(excess))
        windows.append(window_start[droppable] + readers_before[droppable])
        if closure:
            # resident anyway at this moment, whatever is dropped: its inputs, the outputs so far,
            # the values that must be or cost nothing to be held, and everything not computed yet
            free = (order >= t) | output | (mem == 0) | (alive & ~graph.recomputable)
            if inputs:
                free[inputs] = True
            pairs.append(_recompute_inputs(graph, droppable, alive, free))
    if closure:
        return droppables, excesses, windows, pairs
    return droppables, excesses, windows


def _recompute_inputs(graph: "Graph", droppable: np.ndarray, alive: np.ndarray, free: np.ndarray) -> np.ndarray:
    """The inputs a recomputation after a moment needs that nothing else keeps resident at it.

    A value ``v`` computed again after the moment needs each input ``u`` present when it runs, so
    ``u`` was held from the moment on (its bytes count then) or is itself computed again after it.
    An input that is resident anyway (``free``) or still needed later (``alive``: held or computed
    again on its own account, which the moment's own rows already ask) adds nothing. The others are
    the values no longer needed, like the input of a skip connection's encoder layer long after the
    encoder ran: dropping the skip value does not free its bytes unless its input's are held, or the
    chain below it is computed again as well. Returns the ``(v, u)`` pairs, ``v`` droppable or such
    an input itself (following the chain while it is recomputable), as an ``(k, 2)`` array.
    """
    deps = graph.deps
    recomputable = graph.recomputable
    pairs: list[tuple[int, int]] = []
    seen: set[int] = set()
    stack = droppable.tolist()
    while stack:
        v = stack.pop()
        for u in deps[v]:
            if free[u] or alive[u]:
                continue
            pairs.append((v, u))
            if u not in seen:
                seen.add(u)
                if recomputable[u]:
                    stack.append(u)
    return np.asarray(pairs, dtype=np.int64).reshape(-1, 2)


def _knapsack_extra(graph: "Graph", droppable: np.ndarray, excess: float) -> float:
    """The least cost of dropping ``excess`` bytes out of ``droppable``, values taken in part allowed
    (the fractional knapsack: cheapest cost per byte first, the last one in part)."""
    sizes = graph.mem[droppable].astype(np.float64)
    costs = graph.cost[droppable]
    by_ratio = np.argsort(costs / sizes, kind="stable")
    sizes, costs = sizes[by_ratio], costs[by_ratio]
    freed = np.cumsum(sizes)
    whole = min(int(np.searchsorted(freed, excess)), len(sizes) - 1)  # items 0..whole-1 whole, `whole` in part
    before = float(freed[whole - 1]) if whole else 0.0
    return float(costs[:whole].sum()) + float(costs[whole]) * (excess - before) / float(sizes[whole])


def _combined_extra(graph: "Graph", droppables: list[np.ndarray], excesses: list[float],
                    windows: list[np.ndarray] | None = None, duals: list | None = None) -> float:
    """A lower bound on the recomputation every moment forces together (0 when it cannot be computed).

    A value ``v`` read for the first time by nodes ``r_1 < r_2 < ... < r_k`` has the *windows*
    ``(v, r_1], (r_1, r_2], ..., (r_{k-1}, r_k]`` (by the first-time runs of those nodes). At a moment
    ``t`` inside window ``j`` with ``v`` not resident, ``v`` is computed again after ``t`` and before
    ``r_{j+1}`` first runs, so within window ``j``; computations in different windows are different
    computations. Let ``x[v, j]`` be 1 when ``v`` is computed again within window ``j``. Every moment
    ``m`` needs ``sum(mem[v] * x[v, j(v, m)] for v droppable at m) >= excess[m]``, and the recomputation
    costs at least ``sum(cost[v] * x[v, j])``. Moments within one window share its column (one
    computation after the last of them serves them all): that is why the moments can be combined,
    and why the programme ``min cost @ x`` subject to those rows, ``0 <= x <= 1``, bounds every
    schedule's recomputation from below (its optimum is at most the cost of any schedule's own ``x``).
    A value dropped both before and after one of its readers is paid for twice: on transformer layers
    (attention scores and feed-forward values read again in the backward pass) this is most of the
    bound's gain over one column per value. ``windows=None``: one column per value (the weaker
    programme, whatever the window).

    The bound returned is not the solver's optimum but a value checked here by weak duality: for any
    ``y >= 0`` (one multiplier per row, HiGHS' duals clipped at 0) and ``z = max(0, A^T y - cost)``,
    every feasible ``x`` has ``cost @ x >= (A^T y - z) @ x >= y @ excess - sum(z)``. No solver
    tolerance can make it exceed the programme's optimum. It is at least as high as the single worst
    moment's fractional knapsack (that row alone) when the solver's duals are exact. ``duals``, when
    given, receives the multipliers ``y`` (one per moment: the moments that bind the programme).
    """
    if len(droppables) < 2 or sum(len(d) for d in droppables) > COMBINED_BOUND_MAX_NONZEROS:
        return 0.0
    try:
        import scipy.sparse as sp
        from scipy.optimize import linprog
    except ImportError:  # pragma: no cover - scipy is a dependency of the solvers
        return 0.0
    rows = np.repeat(np.arange(len(droppables)), [len(d) for d in droppables])
    values_of = np.concatenate(droppables)
    if windows is None:
        cols, column_value = values_of, np.arange(graph.n)
    else:
        # only the windows some moment uses become columns
        used, cols = np.unique(np.concatenate(windows), return_inverse=True)
        column_value = np.empty(len(used), dtype=np.int64)
        column_value[cols] = values_of
    excess = np.asarray(excesses, dtype=np.float64)
    # each row divided by its excess: coefficients of order one, the right-hand sides all 1
    values = graph.mem[values_of].astype(np.float64) / excess[rows]
    A = sp.csr_matrix((values, (rows, cols)), shape=(len(droppables), len(column_value)))
    cost = graph.cost[column_value].astype(np.float64)
    res = linprog(cost, A_ub=-A, b_ub=-np.ones(len(droppables)), bounds=(0.0, 1.0), method="highs")
    if res.status != 0 or res.ineqlin is None:
        return 0.0
    y = np.maximum(-np.asarray(res.ineqlin.marginals, dtype=np.float64), 0.0)
    z = np.maximum(A.T @ y - cost, 0.0)
    if duals is not None:
        duals.append(y)
    return max(float(y.sum()) - float(z.sum()), 0.0)


def _closure_extra(graph: "Graph", droppables: list[np.ndarray], excesses: list[float],
                   windows: list[np.ndarray], pairs: list[np.ndarray], *,
                   integer_time_s: float | None = None) -> float:
    """:func:`_combined_extra`'s programme with what a recomputation needs at each moment (0 when it
    cannot be computed).

    At moment ``m`` a value ``v`` not resident is computed again after it (``x[v, j]`` as there).
    Every input ``u`` of a value computed again after ``m`` is present when that runs: resident at
    ``m`` and held on, or computed again after ``m`` itself. For the inputs :func:`_recompute_inputs`
    lists (no longer needed at ``m``, so nothing else keeps them), that is one more variable per moment
    and input, ``h[m, u]`` (held at ``m``: its bytes count in ``m``'s row), and the rows

    * ``h[m, u] + r[m, u] >= d[m, v]`` where ``d[m, v] <= x[v, j(v, m)]`` says ``v`` is not resident at
      ``m`` (for a droppable ``v``) or ``r[m, v]`` that it is computed again after ``m`` (for such an
      input, whose only window left is the one after its last reader: ``r[m, u] <= x[u, last]``);
    * ``sum(mem[v] * d[m, v]) - sum(mem[u] * h[m, u]) >= excess[m]``.

    Every schedule gives a solution (its own drops, holds and recomputations, read as 0/1), so the
    optimum is at most its recomputation cost; the returned value is again checked by weak duality
    with every variable in ``[0, 1]``. Where a moment lists no such input this is the combined
    programme's row, so the optimum is at least :func:`_combined_extra`'s. On a U-Net this is what
    makes dropping a skip value expensive: its input, read last when the encoder ran, must be held
    or the encoder's chain computed again. ``integer_time_s``: the same programme is then solved in
    integers for up to that long (:func:`_integer_extra`), and the larger of the two bounds returned.
    """
    programme = _closure_programme(graph, droppables, excesses, windows, pairs)
    if programme is None:
        return 0.0
    from scipy.optimize import linprog

    cost, A, b = programme
    res = linprog(cost, A_ub=-A, b_ub=-b, bounds=(0.0, 1.0), method="highs")
    if res.status != 0 or res.ineqlin is None:
        return 0.0
    y = np.maximum(-np.asarray(res.ineqlin.marginals, dtype=np.float64), 0.0)
    z = np.maximum(A.T @ y - cost, 0.0)
    fractional = max(float(y @ b) - float(z.sum()), 0.0)
    if res.x is not None and np.all(np.minimum(res.x, 1.0 - res.x) <= 1e-9):
        return fractional   # the fractional optimum is integral already: the integer one is the same
    return max(fractional, _integer_extra(cost, A, b, integer_time_s))


def _integer_extra(cost: np.ndarray, A, b: np.ndarray, time_s: float | None) -> float:
    """A lower bound on ``min cost @ x`` subject to ``A @ x >= b`` over ``x`` in ``{0, 1}``: the dual
    bound of HiGHS' branch and bound after at most ``time_s`` seconds (0 when it has none, with
    ``time_s`` None or 0, or beyond :data:`INTEGER_BOUND_MAX_NONZEROS`).

    Every schedule gives such an ``x`` (its own drops, holds and recomputations, each either done or
    not), so the integer optimum bounds its recomputation as the fractional one does, and where a
    moment must drop whole values the fractional programme takes the cheapest per byte in part and
    the integer one cannot. The bound is the solver's, not checked by a dual as the fractional one
    is: the right-hand sides and the result are lowered by :data:`INTEGER_BOUND_MARGIN` (relative)
    against the solver's tolerances. Within a :func:`~checkmate._deadline.deadline_scope` it stops
    by the deadline as well.
    """
    if A.nnz > INTEGER_BOUND_MAX_NONZEROS:
        return 0.0
    left = seconds_left()   # within a caller's time limit the solve gets no more than is left of it
    time_s = time_s if left is None or not time_s else min(float(time_s), left)
    if not time_s or time_s <= 0 or not len(cost):
        return 0.0
    try:
        from scipy.optimize import Bounds, LinearConstraint, milp
    except ImportError:  # pragma: no cover - scipy is a dependency of the solvers
        return 0.0
    lowered = b - INTEGER_BOUND_MARGIN * np.abs(b)
    res = milp(cost, constraints=LinearConstraint(A, lb=lowered), integrality=np.ones(len(cost)),
               bounds=Bounds(0.0, 1.0), options={"time_limit": float(time_s), "disp": False})
    bound = getattr(res, "mip_dual_bound", None)
    # status 0: solved; 1: the time limit, with what the branch and bound proved by then
    if res.status not in (0, 1) or bound is None or not math.isfinite(float(bound)):
        return 0.0
    bound = float(bound)
    return max(bound - INTEGER_BOUND_MARGIN * abs(bound), 0.0)


def _closure_programme(graph: "Graph", droppables: list[np.ndarray], excesses: list[float],
                       windows: list[np.ndarray], pairs: list[np.ndarray]):
    """``(cost, A, b)`` of :func:`_closure_extra`'s programme ``min cost @ x, A @ x >= b, 0 <= x <= 1``
    (columns: the windows some moment uses, then the per-moment variables), or None when it is empty
    or larger than :data:`COMBINED_BOUND_MAX_NONZEROS`."""
    nonzeros = sum(len(d) for d in droppables) + 4 * sum(len(p) for p in pairs)
    if not droppables or nonzeros > COMBINED_BOUND_MAX_NONZEROS:
        return None
    try:
        import scipy.sparse as sp
    except ImportError:  # pragma: no cover - scipy is a dependency of the solvers
        return None
    mem = graph.mem.astype(np.float64)
    window_start = np.concatenate([[0], np.cumsum([len(u) + 1 for u in graph.users])[:-1]]).astype(np.int64)
    last_window = window_start + np.array([len(u) for u in graph.users], dtype=np.int64)
    # entries keyed by column: a window number >= 0 for x, -1 - k for the k-th per-moment variable
    row_of: list[int] = []
    key_of: list[int] = []
    value_of: list[float] = []
    rhs: list[float] = []
    aux = 0

    def entry(row: int, key: int, value: float) -> None:
        row_of.append(row)
        key_of.append(key)
        value_of.append(value)

    plain_rows: list[np.ndarray] = []   # the moments without listed inputs: their one row, in bulk
    plain_keys: list[np.ndarray] = []
    plain_values: list[np.ndarray] = []
    for droppable, excess, window, pair in zip(droppables, excesses, windows, pairs):
        check_deadline()
        memory_row = len(rhs)
        rhs.append(1.0)
        if not len(pair):
            plain_rows.append(np.full(len(droppable), memory_row, dtype=np.int64))
            plain_keys.append(window)
            plain_values.append(mem[droppable] / excess)
            continue
        sources = set(pair[:, 0].tolist())
        needed = sorted(set(pair[:, 1].tolist()))
        var: dict[int, int] = {}       # d[m, v] for a droppable v, r[m, u] for a listed input u
        held: dict[int, int] = {}      # h[m, u]
        for v, j in zip(droppable.tolist(), window.tolist()):
            if v in sources:
                var[v] = -1 - aux
                aux += 1
                entry(memory_row, var[v], mem[v] / excess)
                entry(len(rhs), j, 1.0)                 # x[v, j] - d[m, v] >= 0
                entry(len(rhs), var[v], -1.0)
                rhs.append(0.0)
            else:
                entry(memory_row, j, mem[v] / excess)
        for u in needed:
            held[u] = -1 - aux
            aux += 1
            entry(memory_row, held[u], -mem[u] / excess)
            if u in sources:
                var[u] = -1 - aux
                aux += 1
                entry(len(rhs), int(last_window[u]), 1.0)  # x[u, last] - r[m, u] >= 0
                entry(len(rhs), var[u], -1.0)
                rhs.append(0.0)
        for v, u in pair.tolist():
            row = len(rhs)
            rhs.append(0.0)
            entry(row, held[u], 1.0)
            if u in var:
                entry(row, var[u], 1.0)
            elif graph.recomputable[u]:
                entry(row, int(last_window[u]), 1.0)
            entry(row, var[v], -1.0)
    keys = np.concatenate([np.asarray(key_of, dtype=np.int64), *plain_keys])
    row_of = np.concatenate([np.asarray(row_of, dtype=np.int64), *plain_rows])
    value_of = np.concatenate([np.asarray(value_of, dtype=np.float64), *plain_values])
    is_x = keys >= 0
    used, x_cols = np.unique(keys[is_x], return_inverse=True)
    cols = np.empty(len(keys), dtype=np.int64)
    cols[is_x] = x_cols
    cols[~is_x] = len(used) + (-1 - keys[~is_x])
    # the value each window column computes again: window number -> value
    window_end = window_start[-1] + len(graph.users[-1]) + 1
    value_at = np.repeat(np.arange(graph.n), np.diff(np.concatenate([window_start, [window_end]])))
    cost = np.concatenate([graph.cost[value_at[used]].astype(np.float64), np.zeros(aux)])
    b = np.asarray(rhs, dtype=np.float64)
    A = sp.csr_matrix((value_of, (row_of, cols)), shape=(len(b), len(cost)))
    return cost, A, b


def cost_lower_bound(graph: "Graph", budget_bytes: int, *, recompute_inputs: bool = True,
                     integer_time_s: float | None = INTEGER_BOUND_TIME_S) -> float:
    """A lower bound on the compute cost of every schedule that fits ``budget_bytes``, at any scale.

    Every node runs at least once. Beyond that, look at the moment node ``t`` first runs: its output,
    its inputs, the outputs computed so far and the fixed bytes are resident, and so is every other
    value ``v < t`` that a later node reads, unless ``v`` is computed again after that moment, which
    costs at least ``cost[v]`` more. So the values dropped at that moment must free at least the
    bytes by which holding all of them would exceed the budget, and the cheapest way to do that is
    bounded below by the fractional knapsack (drop values in increasing cost per byte, the last one
    in part). Each moment gives a valid bound. The moments together give another
    (:func:`_combined_extra`: a linear programme over which values are computed again between which
    two of their readers, checked by its dual). A third adds that a value computed again after a
    moment needs its inputs then: those no longer needed at the moment are held (their bytes count
    there) or computed again as well (:func:`_closure_extra`, for the moments of largest single
    bound up to :data:`CLOSURE_BOUND_MAX_PAIRS` pairs, and where that leaves moments out, once more for
    the moments that bind the combined programme first; ``recompute_inputs=False`` leaves it out, for
    comparisons). That last programme is solved in integers as well, for up to ``integer_time_s``
    seconds (None or 0: not), since a schedule drops, holds and recomputes whole values; the branch
    and bound's dual bound when it stops counts. The result is ``sum(cost)`` plus the largest of
    these. Non-recomputable values cannot be dropped. Costs ``O(n^2 log n)`` at worst in array
    operations, two linear programmes and the integer one's time limit: on 2 loaded cores 0.1-0.6 s
    on diffusion-style U-Nets of 326 and 446 nodes, 4 s on DenseNet121's 1580 (the second choice of
    moments there: 2 s more at a load average of 5; 0.05 s and 0.2 s
    without the inputs), plus 1-6 s in integers on the U-Nets at 30% (DenseNet121's programme is
    beyond :data:`INTEGER_BOUND_MAX_NONZEROS`).

    Against proven optima (flat MILP, scratch script): the 54-node long-skip U-Net of
    ``tests/quality_graphs.py`` at 70% and 60% of checkpoint-all, 1.0137x and 1.0309x with the moments
    alone, 1.0225x and 1.0470x with the inputs, optima 1.0240x and 1.0523x (the flat LP relaxation
    1.0160x and 1.0353x). Where a skip value's inputs are read again by the backward pass (the
    diffusion-style U-Net's residual blocks) they are still needed at the moment and the inputs add
    nothing until the budget is low: on its 106-node version 1.0407x at 50% (the MILP's own bound after
    120 s 1.0443x), 1.1291x to 1.1737x at 30% and 1.1840x in integers (the MILP's bound 1.1885x, the
    LP relaxation 1.1779x).
    """
    base = float(graph.cost.sum())
    found = _moments(graph, budget_bytes, closure=recompute_inputs)
    if found is None:
        return math.inf
    droppables, excesses, windows = found[:3]
    check_deadline()
    singles = [_knapsack_extra(graph, d, e) for d, e in zip(droppables, excesses)]
    single = max(singles, default=0.0)
    duals: list[np.ndarray] = []
    combined = _combined_extra(graph, droppables, excesses, windows, duals=duals)
    if not recompute_inputs:
        return base + max(single, combined)
    pairs = found[3]
    kept = _worst_moments_pairs(pairs, singles)
    closure = _closure_extra(graph, droppables, excesses, windows, kept, integer_time_s=integer_time_s)
    if duals and sum(len(k) for k in kept) < sum(len(p) for p in pairs):
        # not every moment's inputs fit in the programme: the moments that bind the combined one
        # first is another valid choice, and neither is always the better (DenseNet121's graph at
        # 60%: 1.0383x against 1.0372x by single bound; at 55% 1.0535x against 1.0544x), so both are
        # solved (the second in fractions only: a second of HiGHS there) and the larger kept
        check_deadline()
        by_duals = _worst_moments_pairs(pairs, singles, priority=duals[0])
        if any(len(a) != len(b) for a, b in zip(by_duals, kept)):
            closure = max(closure, _closure_extra(graph, droppables, excesses, windows, by_duals))
    return base + max(single, combined, closure)


def _worst_moments_pairs(pairs: list[np.ndarray], singles: list[float],
                         priority: np.ndarray | None = None) -> list[np.ndarray]:
    """``pairs`` kept for the moments of largest single-moment bound, at most
    :data:`CLOSURE_BOUND_MAX_PAIRS` in all (empty for the others; ties kept in moment order).
    ``priority`` (one number per moment), when given, comes first: the largest first, ties by single
    bound."""
    kept = [np.empty((0, 2), dtype=np.int64)] * len(pairs)
    total = 0
    order = (np.argsort(-np.asarray(singles, dtype=np.float64), kind="stable") if priority is None else
             np.lexsort((np.arange(len(pairs)), -np.asarray(singles, dtype=np.float64),
                         -np.asarray(priority, dtype=np.float64))))
    for m in order.tolist():
        if total + len(pairs[m]) > CLOSURE_BOUND_MAX_PAIRS:
            continue
        kept[m] = pairs[m]
        total += len(pairs[m])
    return kept
