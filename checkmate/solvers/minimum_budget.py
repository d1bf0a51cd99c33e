"""The smallest budget at which schedules exist, four ways, each for its own question.

* :func:`bracket_minimum_budget` (defined in :mod:`checkmate.solvers.bracket`; the MILP and LP
  strategies report it when a budget is infeasible): a bracket on the smallest budget at which ANY
  schedule exists, narrowed by MILP feasibility probes, with the schedule that fits its top;
* :func:`rounding_minimum_error` (defined in :mod:`checkmate.solvers.milp`): the least budget at
  which the LP rounding itself succeeds, named by the error ``solve`` raises for that strategy;
* :func:`strategy_minimum_budget`: the smallest budget at which ONE strategy finds a schedule, by
  bisection over :func:`checkmate.solve` (to a relative tolerance for budget-aware strategies; the
  strategy's own peak for the others);
* :func:`sweep_frontier_budget`: the left end of a budget sweep, read off the sweep's probe solves
  without solving anything more.

All of them start from the graph's memory facts in :mod:`checkmate.bounds`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from checkmate.bounds import checkpoint_all_peak, largest_working_set_bytes
from checkmate.errors import InfeasibleBudgetError
from checkmate.solvers import solve
from checkmate.solvers.bracket import MinimumBudget, bracket_minimum_budget
from checkmate.solvers.milp import rounding_minimum_error
from checkmate.solvers.registry import STRATEGIES, get_strategy

if TYPE_CHECKING:  # pragma: no cover
    from checkmate.graph import Graph

__all__ = ["MinimumBudget", "bracket_minimum_budget", "strategy_minimum_budget", "sweep_frontier_budget",
           "rounding_minimum_error"]


def strategy_minimum_budget(graph: "Graph", strategy: str, *, solver: str | None = None,
                            time_limit_s: float | None = None, rel_tol: float = 0.01, **options: Any) -> int:
    """The smallest budget at which ``strategy`` finds a schedule, within ``rel_tol`` (bisection).

    For a strategy that ignores the budget this is its own peak. For budget-aware ones the search
    runs between the working-set lower bound and checkpoint-all's peak.
    """
    hi = checkpoint_all_peak(graph)
    spec = get_strategy(strategy)
    if not spec.budget_aware:
        try:
            return int(solve(graph, hi * 64, strategy=strategy, solver=solver, time_limit_s=time_limit_s,
                             **options).peak_memory_bytes)
        except InfeasibleBudgetError as exc:
            if exc.min_feasible_budget_bytes is not None:
                return int(exc.min_feasible_budget_bytes)
            raise
    lo = largest_working_set_bytes(graph) - 1        # infeasible for every strategy
    best = None
    try:
        best = int(solve(graph, hi, strategy=strategy, solver=solver, time_limit_s=time_limit_s,
                         **options).peak_memory_bytes)
    except InfeasibleBudgetError:
        return hi
    hi = best
    while hi - lo > max(1, int(rel_tol * hi)):
        mid = (lo + hi) // 2
        try:
            r = solve(graph, mid, strategy=strategy, solver=solver, time_limit_s=time_limit_s, **options)
            hi = min(mid, int(r.peak_memory_bytes))
        except InfeasibleBudgetError:
            lo = mid
    return int(hi)


def sweep_frontier_budget(graph: "Graph", strategies: Sequence[str],
                          probes: Mapping[str, Mapping[str, Any]] | None = None) -> int:
    """The smallest budget at which one of ``strategies`` finds a schedule, from probe solves.

    ``probes`` maps each strategy to its solve at the working-set lower bound (budget-aware strategies)
    or at an unlimited budget (the others, whose peak is then their minimum), as a row with the keys
    ``feasible``, ``peak_memory_bytes``, ``compute_cost`` and ``min_feasible_budget_bytes``.
    Strategies that cannot tell their minimum (no ``min_feasible_budget_bytes``) do not contribute; if
    none can, the working-set lower bound is returned.
    """
    trivial = largest_working_set_bytes(graph)
    candidates = []
    for name, row in (probes or {}).items():
        spec = STRATEGIES[name]
        if row["feasible"] and row["peak_memory_bytes"] is not None:
            candidates.append(trivial if spec.budget_aware else int(row["peak_memory_bytes"]))
        elif row["feasible"] and row["compute_cost"] is None and spec.budget_aware:
            continue  # a bound-only strategy says nothing about schedules existing
        elif row["feasible"] is False and row.get("min_feasible_budget_bytes") is not None:
            candidates.append(int(row["min_feasible_budget_bytes"]))
    return max(trivial, min(candidates)) if candidates else trivial
