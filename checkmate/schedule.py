"""Schedules: which node runs in which stage (``recompute``), which value is kept (``retain``), and the
executable plan with explicit frees that the memory model derives from them.

``recompute[t, i]`` is the paper's R and ``retain[t, i]`` its S (docs/design.md §3). Strategies
usually decide only what to keep; :func:`minimal_recompute` then derives the cheapest R that makes
those choices valid.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

import numpy as np

from checkmate._deadline import check_deadline, no_deadline
from checkmate.errors import InvalidArgumentError, InvalidScheduleError
from checkmate.io import atomic_write_json, read_text
from checkmate.simulate import walk

if TYPE_CHECKING:  # pragma: no cover
    from checkmate.graph import Graph

__all__ = ["Schedule", "minimal_recompute", "stage_needed", "load_schedule", "save_schedule", "SCHEDULE_FORMAT"]

SCHEDULE_FORMAT = "checkmate-schedule/1"

PlanStep = tuple[str, int]


def _derive_plan(graph: "Graph", R: np.ndarray, S: np.ndarray) -> tuple[PlanStep, ...]:
    """The compute and free steps of (R, S), in order, as the memory model's walk yields them."""
    plan: list[PlanStep] = []
    for event in walk(graph, R, S):
        if event[0] == "compute":
            plan.append(("compute", int(event[2])))
        elif event[0] == "free":
            plan.append(("free", int(event[2])))
    return tuple(plan)


def _frozen_bool(array: Any, n: int, what: str) -> np.ndarray:
    out = np.array(array, dtype=bool, copy=True)
    if out.shape != (n, n):
        raise InvalidScheduleError(f"{what} must be a {n}x{n} matrix, got shape {out.shape}")
    out.setflags(write=False)
    return out


@dataclass(frozen=True, eq=False)
class Schedule:
    """An (R, S) pair plus its executable plan.

    Build one with :meth:`from_matrices` (plan derived by the memory model) or :meth:`from_retain`
    (R derived as the minimal recomputation for the given S).
    """

    recompute: np.ndarray
    retain: np.ndarray
    # the plan; None until first read when built by _deferred (the local searches build and compare many
    # schedules whose plans are never read)
    _plan: tuple[PlanStep, ...] | None
    graph_name: str = ""
    strategy: str = ""
    budget_bytes: int | None = None
    # The graph file's id of each node index (Graph.source_ids): indices in R, S and the plan follow
    # the graph's topological order, which differs from the file's ids when those are not 0..n-1 in
    # a topological order. Written to schedule files so that they can be checked against the graph file.
    node_ids: tuple = ()
    _graph: Any = field(default=None, repr=False)

    @classmethod
    def from_matrices(cls, graph: "Graph", recompute: Any, retain: Any, *, strategy: str = "",
                      budget_bytes: int | None = None) -> "Schedule":
        R = _frozen_bool(recompute, graph.n, "recompute")
        S = _frozen_bool(retain, graph.n, "retain")
        # derived now, within the caller's time limit (millions of steps on large graphs)
        return cls(R, S, _derive_plan(graph, R, S), graph.name, strategy, budget_bytes, tuple(graph.source_ids))

    @classmethod
    def _deferred(cls, graph: "Graph", recompute: Any, retain: Any, *, strategy: str = "",
                  budget_bytes: int | None = None) -> "Schedule":
        """:meth:`from_matrices` with the plan derived when first read: the local searches build many
        schedules whose plans are never read."""
        R = _frozen_bool(recompute, graph.n, "recompute")
        S = _frozen_bool(retain, graph.n, "retain")
        return cls(R, S, None, graph.name, strategy, budget_bytes, tuple(graph.source_ids), graph)

    @property
    def plan(self) -> tuple[PlanStep, ...]:
        """The executable plan: ``("compute", i)`` and ``("free", i)`` steps, in order, as the memory
        model derives them from R and S."""
        if self._plan is None:
            with no_deadline():   # a finished schedule's plan, read wherever: never cut short
                plan = _derive_plan(self._graph, self.recompute, self.retain)
            object.__setattr__(self, "_plan", plan)
            object.__setattr__(self, "_graph", None)
        return self._plan

    @classmethod
    def from_retain(cls, graph: "Graph", retain: Any, *, strategy: str = "",
                    budget_bytes: int | None = None) -> "Schedule":
        S = np.array(retain, dtype=bool)
        return cls.from_matrices(graph, minimal_recompute(graph, S), S, strategy=strategy, budget_bytes=budget_bytes)

    @property
    def n(self) -> int:
        return self.recompute.shape[0]

    @property
    def compute_count(self) -> int:
        return int(self.recompute.sum())

    @property
    def recompute_count(self) -> int:
        """Computations beyond the first of each node."""
        return int(self.recompute.sum()) - self.n

    def with_meta(self, *, strategy: str | None = None, budget_bytes: int | None = None) -> "Schedule":
        return Schedule(self.recompute, self.retain, self._plan, self.graph_name,
                        self.strategy if strategy is None else strategy,
                        self.budget_bytes if budget_bytes is None else budget_bytes, self.node_ids, self._graph)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Schedule):
            return NotImplemented
        return (np.array_equal(self.recompute, other.recompute) and np.array_equal(self.retain, other.retain)
                and self.plan == other.plan)

    __hash__ = None  # type: ignore[assignment]

    def to_dict(self) -> dict:
        return {
            "format": SCHEDULE_FORMAT,
            "graph": self.graph_name,
            "strategy": self.strategy,
            "budget_bytes": self.budget_bytes,
            "recompute": np.argwhere(self.recompute).tolist(),
            "retain": np.argwhere(self.retain).tolist(),
            "plan": [list(step) for step in self.plan],
            **({"node_ids": list(self.node_ids)} if self.node_ids else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping, graph: "Graph | None" = None) -> "Schedule":
        if not isinstance(data, Mapping) or data.get("format") != SCHEDULE_FORMAT:
            raise InvalidScheduleError(f"not a {SCHEDULE_FORMAT} document")
        try:
            r_cells = np.array(data["recompute"], dtype=np.int64).reshape(-1, 2)
            s_cells = np.array(data["retain"], dtype=np.int64).reshape(-1, 2)
            plan = tuple((str(a), int(i)) for a, i in data["plan"])
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidScheduleError(f"malformed schedule document: {exc}") from None
        largest = max([int(r_cells.max(initial=-1)), int(s_cells.max(initial=-1))] + [i for _, i in plan] + [-1])
        n = graph.n if graph is not None else largest + 1
        if largest >= n or (r_cells.size and r_cells.min() < 0) or (s_cells.size and s_cells.min() < 0):
            raise InvalidScheduleError(f"schedule refers to node {largest}, but the graph has {n} nodes")
        R = np.zeros((n, n), dtype=bool)
        S = np.zeros((n, n), dtype=bool)
        R[r_cells[:, 0], r_cells[:, 1]] = True
        S[s_cells[:, 0], s_cells[:, 1]] = True
        budget = data.get("budget_bytes")
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float))):
            raise InvalidScheduleError(f"malformed schedule document: budget_bytes is {budget!r}")
        node_ids = data.get("node_ids") or ()
        if not isinstance(node_ids, (list, tuple)) or (node_ids and len(node_ids) != n):
            raise InvalidScheduleError(f"'node_ids' must list the file id of each of the {n} nodes")
        return cls(_frozen_bool(R, n, "recompute"), _frozen_bool(S, n, "retain"), plan,
                   str(data.get("graph", "")), str(data.get("strategy", "")),
                   None if budget is None else int(budget), tuple(node_ids))


def stage_needed(deps: Any, held: bytes, base: int, seeds: list[int]) -> set[int]:
    """The nodes one stage of :func:`minimal_recompute` computes: ``seeds`` (node ``t`` and the values
    held into ``t + 1`` but not on entry) and, closed under the inputs, every input not held on entry
    (``held[base + d]``: ``S[t, d]`` in the row-major bytes of S, ``base = t * n``)."""
    stack = list(seeds)
    needed = set(stack)
    while stack:
        for d in deps[stack.pop()]:
            if d not in needed and not held[base + d]:
                needed.add(d)
                stack.append(d)
    return needed


def minimal_recompute(graph: "Graph", retain: Any) -> np.ndarray:
    """The cheapest R that is valid for the retention matrix S.

    Stage ``t`` must compute node ``t``, every input of a computed node that is not held on entry,
    and every value held into ``t+1`` that is not held on entry; nothing else. The needed set of a
    stage is that closure, found by a depth-first search from its seeds that visits only needed
    nodes (the work is proportional to the computations, not to ``n^2``).
    """
    n = graph.n
    S = np.asarray(retain, dtype=bool)
    if S.shape != (n, n):
        raise InvalidScheduleError(f"retain must be a {n}x{n} matrix, got shape {S.shape}")
    deps = graph.deps
    # Seeds beyond node t: values held into t+1 (at most t) that are not held on entry to t.
    fresh = np.zeros((n, n), dtype=bool)
    fresh[:-1] = S[1:] & ~S[:-1]
    fresh &= np.tri(n, dtype=bool)
    seed_t, seed_i = np.nonzero(fresh)
    seeds: list[list[int]] = [[] for _ in range(n)]
    for t, i in zip(seed_t.tolist(), seed_i.tolist()):
        seeds[t].append(i)
    held = np.ascontiguousarray(S).view(np.uint8).tobytes()  # held[t * n + i] == S[t, i]
    cells: list[int] = []
    for t in range(n):
        if not t % 256:
            check_deadline()  # a strategy's time limit holds on graphs of many thousand nodes too
        base = t * n
        if not seeds[t] and all(held[base + d] for d in deps[t]):
            cells.append(base + t)  # the common case: only node t, all of its inputs resident
            continue
        cells.extend(base + k for k in stage_needed(deps, held, base, [t, *seeds[t]]))
    R = np.zeros((n, n), dtype=bool)
    R.flat[cells] = True
    return R


def save_schedule(schedule: Schedule, path: str | os.PathLike) -> None:
    if not isinstance(schedule, Schedule):
        raise InvalidArgumentError(f"save_schedule needs a Schedule (a result's .schedule), got "
                                   f"{type(schedule).__name__}")
    atomic_write_json(path, schedule.to_dict())


def load_schedule(path: str | os.PathLike, graph: "Graph | None" = None) -> Schedule:
    if not isinstance(path, (str, os.PathLike)) or os.fspath(path) == "":
        raise InvalidArgumentError(f"load_schedule needs the path of a schedule file, got {path!r}"[:200])
    path = Path(path)
    text = read_text(path, "schedule file", InvalidScheduleError)
    try:
        data = json.loads(text)
    except RecursionError:
        raise InvalidScheduleError(f"{path}: JSON nested too deeply to be a schedule file") from None
    except json.JSONDecodeError as exc:
        raise InvalidScheduleError(f"{path}: malformed JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    return Schedule.from_dict(data, graph)
