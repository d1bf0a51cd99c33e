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

from checkmate._deadline import check_deadline
from checkmate.schedule import Schedule
from checkmate.simulate import simulate

if TYPE_CHECKING:  # pragma: no cover
    from checkmate.graph import Graph

__all__ = ["last_use_stage", "checkpoint_all_schedule", "checkpoint_all_peak", "largest_working_set_bytes",
           "InputIndex", "prune_unused_holds", "drop_holds_unread_by", "cost_lower_bound"]


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


# ------------------------------------------------------------------------------------------ holds
class InputIndex:
    """The graph's inputs lists flattened, for array-wide "is value i read in stage t" queries."""

    def __init__(self, graph: "Graph"):
        self.in_degree = np.fromiter((len(d) for d in graph.deps), dtype=np.int64, count=graph.n)
        self.inputs = np.fromiter((d for ds in graph.deps for d in ds), dtype=np.int64,
                                  count=int(self.in_degree.sum()))
        self.first_input = np.cumsum(self.in_degree) - self.in_degree

    def read_in_stage(self, R: np.ndarray) -> np.ndarray:
        """``used[t, i]``: some node computed in stage ``t`` reads value ``i``."""
        stage, node = np.nonzero(R)
        reads = self.in_degree[node]
        offsets = np.arange(int(reads.sum())) - np.repeat(np.cumsum(reads) - reads, reads)
        used = np.zeros(R.shape, dtype=bool)
        used[np.repeat(stage, reads), self.inputs[np.repeat(self.first_input[node], reads) + offsets]] = True
        return used


def prune_unused_holds(graph: "Graph", retain: np.ndarray) -> np.ndarray:
    """Drop holds that nothing uses, re-deriving the minimal recomputation as it goes: ``S[t, i]``
    goes when stage ``t`` neither reads ``i`` (under the minimal recomputation of the pruned holds)
    nor holds it into ``t + 1``, and ``i`` is not an output.

    Such a hold only costs memory (the value sits there until the end of the stage). Going from the
    last stage back settles each stage once: a stage's needs depend only on its own S row and the
    next (already pruned), so one pass suffices.
    """
    n = graph.n
    S = np.array(retain, dtype=bool)
    S &= np.tri(n, k=-1, dtype=bool)
    deps = graph.deps
    output = graph.output
    for t in range(n - 1, 0, -1):
        held = S[t]
        keep_next = S[t + 1] if t + 1 < n else np.zeros(n, dtype=bool)
        need = np.zeros(t + 1, dtype=bool)
        need[t] = True
        need |= keep_next[: t + 1] & ~held[: t + 1]
        used = np.zeros(n, dtype=bool)
        for k in range(t, -1, -1):
            if need[k]:
                for d in deps[k]:
                    used[d] = True
                    if not held[d]:
                        need[d] = True
        useless = held & ~used & ~keep_next & ~output
        S[t, useless] = False
    return S


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
def cost_lower_bound(graph: "Graph", budget_bytes: int) -> float:
    """A lower bound on the compute cost of every schedule that fits ``budget_bytes``, at any scale.

    Every node runs at least once. Beyond that, look at the moment node ``t`` first runs: its output,
    its inputs, the outputs computed so far and the fixed bytes are resident, and so is every other
    value ``v < t`` that a later node reads, unless ``v`` is computed again after that moment, which
    costs at least ``cost[v]`` more. So the values dropped at that moment must free at least the
    bytes by which holding all of them would exceed the budget, and the cheapest way to do that is
    bounded below by the fractional knapsack (drop values in increasing cost per byte, the last one
    in part). Each moment gives a valid bound; the result is ``sum(cost)`` plus the largest of them.
    Non-recomputable values cannot be dropped. Costs ``O(n^2 log n)`` at worst, in array operations.
    """
    n = graph.n
    mem = graph.mem.astype(np.int64)
    cost = graph.cost
    last_reader = np.array([max(users) if users else -1 for users in graph.users], dtype=np.int64)
    output = graph.output
    base = float(cost.sum())
    best_extra = 0.0
    # values alive after t: computed before t and read by a node after t (outputs are counted apart)
    order = np.arange(n)
    outputs_before = np.concatenate([[0], np.cumsum(np.where(output, mem, 0))])
    for t in range(1, n):
        inputs = list(graph.deps[t])
        held_fixed = int(graph.fixed_mem) + int(mem[t]) + int(mem[inputs].sum()) + int(outputs_before[t])
        held_fixed -= int(mem[[d for d in inputs if output[d]]].sum())   # an input that is an output counts once
        alive = (order < t) & (last_reader > t) & ~output
        if inputs:
            alive[inputs] = False
        live_bytes = int(mem[alive].sum())
        excess = held_fixed + live_bytes - int(budget_bytes)
        if excess <= 0:
            continue
        droppable = alive & graph.recomputable & (mem > 0)
        sizes = mem[droppable].astype(np.float64)
        if sizes.sum() < excess:
            return math.inf   # nothing fits: the budget is below what this moment needs
        ratio = cost[droppable] / sizes
        by_ratio = np.argsort(ratio, kind="stable")
        sizes, costs = sizes[by_ratio], cost[droppable][by_ratio]
        freed = np.cumsum(sizes)
        whole = int(np.searchsorted(freed, excess))      # items 0..whole-1 whole, item `whole` in part
        extra = float(costs[:whole].sum())
        before = float(freed[whole - 1]) if whole else 0.0
        extra += costs[whole] * (excess - before) / sizes[whole]
        best_extra = max(best_extra, extra)
    return base + best_extra
