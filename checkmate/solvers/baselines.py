"""Classic rematerialization baselines, all with the strategy signature of :mod:`checkmate.solvers`.

Each baseline decides what to keep (S); :func:`~checkmate.schedule.minimal_recompute` derives R.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from checkmate.schedule import Schedule

if TYPE_CHECKING:  # pragma: no cover
    from checkmate.graph import Graph
    from checkmate.solvers import SolveOptions, StrategyOutput

__all__ = ["checkpoint_all", "checkpoint_all_schedule", "last_use_stage"]


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


def checkpoint_all(graph: "Graph", budget_bytes: int, options: "SolveOptions") -> "StrategyOutput":
    from checkmate.solvers import StrategyOutput

    return StrategyOutput(checkpoint_all_schedule(graph))
