"""The one memory model (DESIGN §3), shared by the solvers' accounting, the simulator and codegen.

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

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator, Sequence

import numpy as np

from checkmate.errors import InvalidScheduleError

if TYPE_CHECKING:  # pragma: no cover
    from checkmate.graph import Graph
    from checkmate.schedule import Schedule

__all__ = ["simulate", "walk", "replay_plan", "SimulationResult", "TimelineStep", "PlanReplay",
           "validate_schedule"]


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

        resident = set(int(i) for i in held)
        current = fixed + int(mem[held].sum())
        frees_after: dict[int, list[int]] = {}
        for i, k in last_use.items():
            if not keep_next[i] and not output[i]:
                frees_after.setdefault(k, []).append(i)

        for k in computed:
            k = int(k)
            if k != t and not recomputable[k]:
                yield ("violation", t, f"stage {t} recomputes node {k} ({graph.nodes[k].name}), which must run exactly once")
            missing = [d for d in deps[k] if d not in resident]
            if missing:
                yield ("violation", t, f"stage {t}: node {k} ({graph.nodes[k].name}) runs while its input(s) "
                                       f"{missing[:5]} are not resident")
            if k not in resident:
                resident.add(k)
                current += int(mem[k])
            yield ("compute", t, k, current)
            for i in sorted(frees_after.get(k, ())):
                if i in resident:
                    resident.remove(i)
                    current -= int(mem[i])
                    yield ("free", t, i)
        for i in sorted(resident):
            if not keep_next[i] and not output[i]:
                resident.remove(i)
                current -= int(mem[i])
                yield ("free", t, i)
        if t + 1 < n:
            for i in np.flatnonzero(keep_next[: t + 1]):
                if int(i) not in resident:
                    yield ("violation", t, f"value {i} is held into stage {t + 1} but is not resident at the end of stage {t}")
            for i in np.flatnonzero(output[: t + 1] & ~keep_next[: t + 1]):
                yield ("violation", t, f"output {i} ({graph.nodes[i].name}) is not held into stage {t + 1}")


def simulate(graph: "Graph", schedule: "Schedule") -> SimulationResult:
    """Replay ``schedule`` on ``graph``: peak bytes, compute cost, timeline and rule violations."""
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


def validate_schedule(graph: "Graph", schedule: "Schedule") -> SimulationResult:
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
