"""The records of a budget sweep: one :class:`SweepRow` per (strategy, budget), gathered with the
grid and the graph's memory facts in a :class:`SweepResult`. Shared by :mod:`.sweep`, which makes
them, and :mod:`.plots`, which draws them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

__all__ = ["SweepRow", "SweepResult", "CSV_COLUMNS"]


@dataclass(frozen=True)
class SweepRow:
    """One (strategy, budget) cell of a sweep."""

    graph: str
    strategy: str
    budget_bytes: int
    feasible: bool | None          # None: the solver failed (see status)
    compute_cost: float | None
    baseline_cost: float
    overhead: float | None         # compute_cost / baseline_cost
    peak_memory_bytes: int | None
    lower_bound: float | None      # the strategy's own proven bound on the optimal cost, if it gives one
    best_lower_bound: float | None  # the best bound any strategy of the sweep proved at this budget
    gap: float | None              # (compute_cost - best_lower_bound) / compute_cost
    solve_seconds: float | None
    optimal: bool
    status: str
    solver: str | None = None
    min_feasible_budget_bytes: int | None = None


CSV_COLUMNS = tuple(f.name for f in fields(SweepRow))


@dataclass
class SweepResult:
    graph_name: str
    nodes: int
    budgets: list[int]
    strategies: list[str]
    rows: list[SweepRow]
    checkpoint_all_peak_bytes: int
    min_feasible_budget_bytes: int
    trivial_bound_bytes: int
    baseline_cost: float
    wall_seconds: float = 0.0
    meta: dict = field(default_factory=dict)

    def rows_for(self, strategy: str) -> list[SweepRow]:
        return sorted((r for r in self.rows if r.strategy == strategy), key=lambda r: r.budget_bytes)

    def to_json_dict(self) -> dict:
        from checkmate.solvers.types import json_native

        return json_native({
            "graph": self.graph_name,
            "nodes": self.nodes,
            "budgets": self.budgets,
            "strategies": self.strategies,
            "checkpoint_all_peak_bytes": self.checkpoint_all_peak_bytes,
            "min_feasible_budget_bytes": self.min_feasible_budget_bytes,
            "trivial_bound_bytes": self.trivial_bound_bytes,
            "baseline_cost": self.baseline_cost,
            "wall_seconds": self.wall_seconds,
            "meta": self.meta,
            "rows": [asdict(r) for r in self.rows],
        })
