"""Schedules read back from solvers, and the replayed candidates the MILP strategies choose among.

Whatever a solver answers, the schedule kept is rebuilt from its retention matrix S alone (forced
holds added, useless holds pruned, R re-derived as the minimal recomputation) and replayed by the
simulator: a :class:`Candidate` carries the replayed cost and peak, never the solver's own numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from checkmate.bounds import prune_unused_holds
from checkmate.errors import CheckmateError
from checkmate.schedule import Schedule, minimal_recompute
from checkmate.simulate import simulate
from checkmate.solvers.formulation import max_strict_descendant
from checkmate.solvers.registry import baseline_specs
from checkmate.solvers.types import SolveOptions

if TYPE_CHECKING:  # pragma: no cover
    from checkmate.graph import Graph

__all__ = ["Candidate", "evaluate", "forced_retention", "schedule_from_retain", "baseline_candidates"]


@dataclass(frozen=True)
class Candidate:
    """A replayed schedule: its cost and peak as the simulator measured them, and where it came from."""

    schedule: Schedule
    cost: float
    peak_bytes: int
    source: str


def evaluate(graph: "Graph", schedule: Schedule, source: str) -> Candidate | None:
    """The replayed candidate of ``schedule``, or None when the replay finds it invalid."""
    sim = simulate(graph, schedule)
    if not sim.valid:
        return None
    return Candidate(schedule, sim.compute_cost, sim.peak_memory_bytes, source)


def forced_retention(graph: "Graph") -> np.ndarray:
    """Cells every schedule must hold: outputs after they are computed; non-recomputable values while
    a descendant may still run (recomputing them is forbidden)."""
    n = graph.n
    t = np.arange(n)[:, None]
    i = np.arange(n)[None, :]
    forced = (i < t) & graph.output[None, :]
    maxdesc = max_strict_descendant(graph)
    forced |= (i < t) & ~graph.recomputable[None, :] & (t <= maxdesc[None, :])
    return forced


def schedule_from_retain(graph: "Graph", retain: np.ndarray) -> Schedule:
    """The schedule of a retention matrix: forced holds added, useless holds pruned, minimal R."""
    S = np.asarray(retain, dtype=bool) | forced_retention(graph)
    S = prune_unused_holds(graph, S)
    return Schedule.from_matrices(graph, minimal_recompute(graph, S), S)


def baseline_candidates(graph: "Graph", budget_bytes: int, options: SolveOptions) -> list[Candidate]:
    """Every registered baseline's schedule, replayed (those that fail or do not exist are skipped)."""
    out = []
    opts = SolveOptions(time_limit_s=options.time_limit_s, seed=options.seed)
    for spec in baseline_specs():
        try:
            result = spec.fn(graph, budget_bytes, opts)
        except (CheckmateError, AttributeError, ImportError, NotImplementedError):
            continue
        if result.schedule is None:
            continue
        cand = evaluate(graph, result.schedule, spec.name)
        if cand is not None:
            out.append(cand)
    return out
