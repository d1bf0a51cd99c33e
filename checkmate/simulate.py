"""The one memory model (docs/design.md §3), shared by the solvers' accounting, the simulator and
codegen.

A schedule has ``n`` stages. Stage ``t`` computes node ``t`` for the first time and may recompute
nodes ``< t``; ``R[t, i]`` says node ``i`` runs in stage ``t`` and ``S[t, i]`` that value ``i`` is
resident on entry to stage ``t``. Inside a stage the computed nodes run in id (topological) order.
While node ``k`` runs, memory holds the fixed bytes, the values held on entry that are not freed yet,
the values computed earlier in the stage that are not freed yet, and ``k``'s own output.

A value is freed right after its last use inside the stage unless it is held into stage ``t+1``
(``S[t+1, i]``) or is a function output (outputs stay until the end). A value held on entry that the
stage never uses and does not hold into ``t+1`` is freed at the end of the stage.

:func:`walk` is the single implementation of these rules. The executable plan of a
:class:`~checkmate.schedule.Schedule` is produced by it, :func:`simulate` reports from it, and the
MILP's ``U``/``FREE`` accounting encodes the same rules (tests check that they agree).
:func:`replay_plan` is deliberately naive: it replays a plan op by op so anyone can check a reported
peak without trusting how the plan was made.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Protocol, Sequence

import numpy as np

from checkmate._deadline import check_deadline
from checkmate.errors import InvalidArgumentError, InvalidScheduleError

if TYPE_CHECKING:  # pragma: no cover
    from checkmate.graph import Graph

__all__ = ["check_graph", "simulate", "walk", "replay_plan", "SimulationResult", "TimelineStep", "PlanReplay",
           "validate_schedule", "peak_memory_bytes", "Matrices"]


class Matrices(Protocol):
    """What the simulator reads of a schedule (:class:`checkmate.schedule.Schedule` is one): the
    memory model is defined on (R, S) alone, so it sits below the Schedule type, which it produces
    plans for."""

    @property
    def recompute(self) -> np.ndarray: ...

    @property
    def retain(self) -> np.ndarray: ...


@dataclass(frozen=True)
class TimelineStep:
    """Memory in use while ``node`` runs in ``stage`` (fixed bytes included)."""

    stage: int
    node: int
    memory_bytes: int
    recompute: bool


@dataclass(frozen=True)
class SimulationResult:
    peak_memory_bytes: int
    compute_cost: float
    timeline: tuple[TimelineStep, ...]
    recompute_count: int
    violations: tuple[str, ...] = field(default_factory=tuple)

    @property
    def valid(self) -> bool:
        return not self.violations

    @property
    def peak_step(self) -> TimelineStep:
        return max(self.timeline, key=lambda s: s.memory_bytes)


@dataclass(frozen=True)
class PlanReplay:
    peak_memory_bytes: int
    compute_cost: float
    compute_count: int


_MAX_VIOLATIONS = 20  # enough to diagnose; a badly broken schedule would otherwise list n^2 lines


def walk(graph: "Graph", recompute: np.ndarray, retain: np.ndarray) -> Iterator[tuple]:
    """Yield the events of executing ``(R, S)`` under the memory model, in order.

    Events: ``("compute", t, k, memory_bytes)``, ``("free", t, i)`` and, for anything that breaks
    the rules, ``("violation", t, message)``. The walk carries on past violations so that all of
    them can be reported.
    """
    n = graph.n
    R = np.asarray(recompute, dtype=bool)
    S = np.asarray(retain, dtype=bool)
    if R.shape != (n, n) or S.shape != (n, n):
        yield ("violation", -1, f"R and S must be {n}x{n} matrices, got {R.shape} and {S.shape}")
        return
    mem = graph.mem
    deps = graph.deps
    output = graph.output
    recomputable = graph.recomputable
    fixed = int(graph.fixed_mem)

    upper_r = np.argwhere(np.triu(R, 1))
    for t, i in upper_r[:3]:
        yield ("violation", int(t), f"stage {t} computes node {i}, which is ahead of the frontier")
    upper_s = np.argwhere(np.triu(S, 0))
    for t, i in upper_s[:3]:
        yield ("violation", int(t), f"value {i} is held on entry to stage {t}, before it was ever computed")
    both = np.argwhere(R & S)
    for t, i in both[:3]:
        yield ("violation", int(t), f"stage {t} computes node {i} while its value is already resident")

    for t in range(n):
        check_deadline()  # a walk is O(n) array work per stage: long on graphs of many thousand nodes
        computed = np.flatnonzero(R[t, : t + 1])
        if not R[t, t]:
            yield ("violation", t, f"stage {t} does not compute node {t}")
        held = np.flatnonzero(S[t, :t])
        keep_next = S[t + 1] if t + 1 < n else np.zeros(n, dtype=bool)

        last_use: dict[int, int] = {}
        for k in computed:
            last_use[int(k)] = int(k)
            for d in deps[k]:
                last_use[d] = int(k)

        # Residency as a boolean row, not a set: a stage may hold thousands of values (checkpoint-all
        # holds every earlier one), and building a set of them per stage made the walk quadratic in
        # Python on large graphs; the row costs one array operation per stage.
        resident = np.zeros(n, dtype=bool)
        resident[held] = True
        current = fixed + int(mem[held].sum())
        frees_after: dict[int, list[int]] = {}
        for i, k in last_use.items():
            if not keep_next[i] and not output[i]:
                frees_after.setdefault(k, []).append(i)

        for k in computed:
            k = int(k)
            if k != t and not recomputable[k]:
                yield ("violation", t, f"stage {t} recomputes node {k} ({graph.nodes[k].name}), which must run exactly once")
            missing = [d for d in deps[k] if not resident[d]]
            if missing:
                yield ("violation", t, f"stage {t}: node {k} ({graph.nodes[k].name}) runs while its input(s) "
                                       f"{missing[:5]} are not resident")
            if not resident[k]:
                resident[k] = True
                current += int(mem[k])
            yield ("compute", t, k, current)
            for i in sorted(frees_after.get(k, ())):
                if resident[i]:
                    resident[i] = False
                    current -= int(mem[i])
                    yield ("free", t, i)
        for i in np.flatnonzero(resident & ~keep_next & ~output):
            i = int(i)
            resident[i] = False
            current -= int(mem[i])
            yield ("free", t, i)
        if t + 1 < n:
            for i in np.flatnonzero(keep_next[: t + 1] & ~resident[: t + 1]):
                yield ("violation", t, f"value {i} is held into stage {t + 1} but is not resident at the end of stage {t}")
            for i in np.flatnonzero(output[: t + 1] & ~keep_next[: t + 1]):
                yield ("violation", t, f"output {i} ({graph.nodes[i].name}) is not held into stage {t + 1}")


def peak_memory_bytes(graph: "Graph", recompute: np.ndarray, retain: np.ndarray) -> int:
    """The peak that :func:`walk` reports for a VALID ``(R, S)``, computed with array operations.

    For searches that rank many candidate schedules, where a walk per candidate would dominate the
    run time. The rules are :func:`walk`'s, restated as intervals (:func:`stage_peak_bytes`).
    Invalid schedules give meaningless numbers; the schedule a search keeps is validated by
    :func:`simulate` as usual. Tests check that both peaks agree.
    """
    check_deadline()  # each call is seconds of array work on graphs of many thousand nodes
    during = stage_peak_bytes(graph, recompute, retain)
    return int(graph.fixed_mem) + (int(during.max()) if during.size else 0)


class ReadIndex:
    """The graph's input lists flattened once, for the array replays of :func:`stage_peak_bytes`."""

    def __init__(self, graph: "Graph"):
        self.in_degree = np.fromiter((len(d) for d in graph.deps), dtype=np.int64, count=graph.n)
        self.inputs = np.fromiter((d for ds in graph.deps for d in ds), dtype=np.int64,
                                  count=int(self.in_degree.sum()))
        self.first_input = np.cumsum(self.in_degree) - self.in_degree


def stage_peak_bytes(graph: "Graph", recompute: np.ndarray, retain: np.ndarray, stages: np.ndarray | None = None,
                     *, index: ReadIndex | None = None) -> np.ndarray:
    """For each stage of ``stages`` (all by default, in increasing order), the most bytes resident
    while one of its nodes runs, above the fixed memory, in a VALID ``(R, S)``.

    While node ``k`` runs in stage ``t``, value ``i`` is resident iff it was held on entry to ``t`` or
    computed in ``t`` at a position ``<= k``, and it has not been freed yet. Only a value computed or
    read in the stage, not held into ``t+1`` and not an output is freed inside it, right after its
    last use (the last node of the stage that is or reads it); every other value stays to the end of
    the stage. A stage's figure depends only on its rows of R and S and the next row of S, so a
    search that changes a few rows replays only the stages next to them.
    """
    n = graph.n
    index = index or ReadIndex(graph)
    R = np.asarray(recompute, dtype=bool)
    S = np.asarray(retain, dtype=bool)
    rows = np.arange(n) if stages is None else np.asarray(stages, dtype=np.int64)
    mem = graph.mem
    # Computed cells (t, k), and for each input d of k the read (t, d) at position k.
    row_of, comp_k = np.nonzero(R if stages is None else R[rows])
    comp_t = rows[row_of]
    in_degree = index.in_degree
    reads = in_degree[comp_k]
    offsets = np.arange(int(reads.sum())) - np.repeat(np.cumsum(reads) - reads, reads)
    read_value = index.inputs[np.repeat(index.first_input[comp_k], reads) + offsets]
    read_t = np.repeat(comp_t, reads)
    # For each touched cell t * n + i (i computed or read in stage t), its last use: the last node of
    # stage t that is i itself or reads i. Sorted by cell, then position, the last entry of each cell
    # is its last use; this needs memory for the touched cells only, not an n^2 table (800 MB at
    # 10,000 nodes). Only values computed or read in a stage can be freed inside it; every other
    # value held on entry stays for the whole stage (unused ones are freed at its end).
    cell = np.concatenate([read_t * n + read_value, comp_t * n + comp_k])
    position = np.concatenate([np.repeat(comp_k, reads), comp_k])
    order = np.lexsort((position, cell))
    cell, position = cell[order], position[order]
    last_of_cell = np.ones(cell.size, dtype=bool)
    last_of_cell[:-1] = cell[1:] != cell[:-1]
    touched, touched_last_use = cell[last_of_cell], position[last_of_cell]
    t_idx, i_idx = np.divmod(touched, n)
    keep_next = np.zeros(touched.size, dtype=bool)
    inner = t_idx < n - 1
    keep_next[inner] = S[t_idx[inner] + 1, i_idx[inner]]
    freed = ~keep_next & ~graph.output[i_idx]
    # Events at (stage, position): +mem where a value is computed, -mem just after its last use.
    # Memory while k runs in t = bytes held on entry + every event of stage t at a position <= k.
    width = n + 1
    key = np.concatenate([comp_t * width + comp_k, t_idx[freed] * width + touched_last_use[freed] + 1])
    weight = np.concatenate([mem[comp_k], -mem[i_idx[freed]]])
    order = np.argsort(key, kind="stable")
    key = key[order]
    running = np.concatenate([[0], np.cumsum(weight[order])])
    upto = np.searchsorted(key, comp_t * width + comp_k, side="right")
    stage_start = np.searchsorted(key, comp_t * width, side="left")
    held_bytes = _held_bytes(S, mem) if stages is None else _held_bytes_of_rows(S, mem, rows)
    during = held_bytes[row_of] + running[upto] - running[stage_start]
    # the most of each stage (the cells come row by row; a valid stage computes at least its node)
    out = np.zeros(rows.size, dtype=np.int64)
    if during.size:
        starts = np.flatnonzero(np.concatenate([[True], row_of[1:] != row_of[:-1]]))
        out[row_of[starts]] = np.maximum.reduceat(during, starts)
    return out


def _held_bytes_of_rows(S: np.ndarray, mem: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Bytes held on entry to each stage of ``rows`` (``S[t, i]`` for ``i < t``), exactly, in integers."""
    block = S[rows] & (np.arange(S.shape[1])[None, :] < rows[:, None])
    return block.astype(np.int64) @ np.asarray(mem, dtype=np.int64)


# Rows of S multiplied at a time in _held_bytes: as int64 they take rows * n * 8 bytes (40 MB at
# 10,000 nodes), where the whole matrix would take 800 MB.
_HELD_ROWS_PER_BLOCK = 512


def _held_bytes(S: np.ndarray, mem: np.ndarray) -> np.ndarray:
    """Bytes held on entry to each stage (``S[t, i]`` for ``i < t``), exactly, in integers."""
    n = S.shape[0]
    mem = np.asarray(mem, dtype=np.int64)
    held = np.zeros(n, dtype=np.int64)
    for lo in range(0, n, _HELD_ROWS_PER_BLOCK):
        hi = min(n, lo + _HELD_ROWS_PER_BLOCK)
        block = np.tril(S[lo:hi], lo - 1)  # row r is stage lo + r: only i < lo + r count
        held[lo:hi] = block.astype(np.int64) @ mem
    return held


def check_graph(graph: Any) -> None:
    """Raise :class:`InvalidArgumentError` unless ``graph`` is a :class:`~checkmate.graph.Graph`."""
    from checkmate.graph import Graph

    if not isinstance(graph, Graph):
        hint = "; load a graph file with checkmate.load_graph" if isinstance(graph, (str, os.PathLike)) else ""
        raise InvalidArgumentError(f"expected a checkmate Graph, got {type(graph).__name__}{hint}")


def _check_matrices(graph: "Graph", schedule: Any) -> None:
    try:
        shapes = {np.shape(schedule.recompute), np.shape(schedule.retain)}
    except AttributeError:
        raise InvalidArgumentError(f"expected a Schedule (R and S matrices), got {type(schedule).__name__}") from None
    if shapes != {(graph.n, graph.n)}:
        raise InvalidScheduleError(f"the schedule's matrices have shapes {sorted(shapes)}; the graph has {graph.n} "
                                   "nodes")


def simulate(graph: "Graph", schedule: Matrices) -> SimulationResult:
    """Replay ``schedule`` on ``graph``: peak bytes, compute cost, timeline and rule violations."""
    check_graph(graph)
    _check_matrices(graph, schedule)
    timeline: list[TimelineStep] = []
    violations: list[str] = []
    cost = 0.0
    graph_cost = graph.cost
    for event in walk(graph, schedule.recompute, schedule.retain):
        if event[0] == "compute":
            _, t, k, current = event
            timeline.append(TimelineStep(t, k, current, k != t))
            cost += float(graph_cost[k])
        elif event[0] == "violation" and len(violations) < _MAX_VIOLATIONS:
            violations.append(event[2])
    peak = max((s.memory_bytes for s in timeline), default=int(graph.fixed_mem))
    return SimulationResult(
        peak_memory_bytes=int(peak),
        compute_cost=cost,
        timeline=tuple(timeline),
        recompute_count=sum(1 for s in timeline if s.recompute),
        violations=tuple(violations),
    )


def validate_schedule(graph: "Graph", schedule: Matrices) -> SimulationResult:
    """Simulate and raise :class:`InvalidScheduleError` listing the first violations, if any."""
    result = simulate(graph, schedule)
    if not result.valid:
        raise InvalidScheduleError("invalid schedule: " + "; ".join(result.violations[:5]))
    return result


def replay_plan(graph: "Graph", plan: Sequence[tuple[str, int]]) -> PlanReplay:
    """Replay an explicit ``[("compute", i) | ("free", i), ...]`` plan, independently of R and S.

    Raises :class:`InvalidScheduleError` if an op runs without its inputs, a resident value is
    computed again, a free names a value not resident, a node is never computed or an output is
    freed. Memory while an op runs counts its own output (allocated before the op starts).
    """
    check_graph(graph)
    if plan is None or isinstance(plan, (str, bytes)) or not isinstance(plan, Iterable):
        raise InvalidScheduleError(f"a plan is a list of [action, node] pairs, got {type(plan).__name__}")
    resident: set[int] = set()
    current = int(graph.fixed_mem)
    peak = current
    cost = 0.0
    count = 0
    seen = np.zeros(graph.n, dtype=bool)
    for step, entry in enumerate(plan):
        try:
            action, i = entry
            i = int(i)
        except (TypeError, ValueError):
            raise InvalidScheduleError(f"plan step {step}: {entry!r} is not an [action, node] pair") from None
        if not 0 <= i < graph.n:
            raise InvalidScheduleError(f"plan step {step}: node {i} does not exist")
        if action == "compute":
            missing = [d for d in graph.deps[i] if d not in resident]
            if missing:
                raise InvalidScheduleError(f"plan step {step}: computes {i} without its inputs {missing[:5]}")
            if i in resident:
                raise InvalidScheduleError(f"plan step {step}: computes {i}, which is already resident")
            resident.add(i)
            current += int(graph.mem[i])
            peak = max(peak, current)
            cost += float(graph.cost[i])
            count += 1
            seen[i] = True
        elif action == "free":
            if i not in resident:
                raise InvalidScheduleError(f"plan step {step}: frees {i}, which is not resident")
            if graph.output[i]:
                raise InvalidScheduleError(f"plan step {step}: frees output {i}")
            resident.remove(i)
            current -= int(graph.mem[i])
        else:
            raise InvalidScheduleError(f"plan step {step}: unknown action {action!r}")
    never = np.flatnonzero(~seen)
    if never.size:
        raise InvalidScheduleError(f"the plan never computes node(s) {never[:5].tolist()}")
    return PlanReplay(peak_memory_bytes=peak, compute_cost=cost, compute_count=count)
