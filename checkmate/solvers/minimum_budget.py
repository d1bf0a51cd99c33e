"""The smallest budget at which schedules exist, three ways, each for its own question.

* :func:`bracket_minimum_budget` (defined in :mod:`checkmate.solvers.milp`, whose strategies report
  it when a budget is infeasible): a bracket on the smallest budget at which ANY schedule exists,
  narrowed by MILP feasibility probes, with the schedule that fits its top;
* :func:`strategy_minimum_budget`: the smallest budget at which ONE strategy finds a schedule, by
  bisection over :func:`checkmate.solve` (to a relative tolerance for budget-aware strategies; the
  strategy's own peak for the others);
* :func:`sweep_frontier_budget`: the left end of a budget sweep, read off the sweep's probe solves
  without solving anything more.

All three start from the graph's memory facts in :mod:`checkmate.bounds`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from checkmate.bounds import checkpoint_all_peak, largest_working_set_bytes
from checkmate.errors import InfeasibleBudgetError
from checkmate.solvers import solve
from checkmate.solvers.milp import MinimumBudget, bracket_minimum_budget
from checkmate.solvers.registry import STRATEGIES, get_strategy

if TYPE_CHECKING:  # pragma: no cover
    from checkmate.graph import Graph

__all__ = ["MinimumBudget", "bracket_minimum_budget", "strategy_minimum_budget", "sweep_frontier_budget",
           "rounding_minimum_error"]

# The LP rounding's own minimum: the search's whole time (as the MILP's bracket), each probe's share of
# what is left (a probe is one LP, its roundings and a short infeasibility check), and how close the
# bisection gets (relative) before it stops.
ROUNDING_MINIMUM_TIME_S = 30.0
ROUNDING_PROBE_SHARE = 0.25
ROUNDING_MINIMUM_RTOL = 1e-3


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


def rounding_minimum_error(graph: "Graph", error: InfeasibleBudgetError, options: Any) -> InfeasibleBudgetError:
    """``error`` (from ``checkmate_lp_rounding``) naming the least budget at which the LP rounding
    itself succeeds, not merely one at which some schedule exists.

    The MILP's minimum can lie where the LP is feasible but no rounding fits; the search steps up from
    it (doubling the step) to a budget where the rounding succeeds, then bisects down to
    :data:`ROUNDING_MINIMUM_RTOL`, within :data:`ROUNDING_MINIMUM_TIME_S`. The budget it names has had
    a successful rounding solve. Without one in time the error names no minimum.
    """
    from dataclasses import replace

    from checkmate.errors import SolverError

    start = error.min_feasible_budget_bytes
    if start is None:
        return error
    fn = STRATEGIES["checkmate_lp_rounding"].fn
    deadline = time.perf_counter() + ROUNDING_MINIMUM_TIME_S

    def succeeds(budget: int) -> bool | None:
        left = deadline - time.perf_counter()
        if left <= 0:
            return None
        try:
            fn(graph, budget, replace(options, time_limit_s=max(left * ROUNDING_PROBE_SHARE, 1.0)))
            return True
        except (InfeasibleBudgetError, SolverError):
            return False

    top = max(int(start), checkpoint_all_peak(graph))
    failed = int(error.budget_bytes) if error.budget_bytes is not None else int(start) - 1
    found, probe, step = None, int(start), max(1, int(start * ROUNDING_MINIMUM_RTOL))
    while found is None:
        ok = succeeds(probe)
        if ok is None:
            break
        if ok:
            found = probe
        elif probe >= top:
            break
        else:
            failed, probe, step = probe, min(top, probe + step), step * 2
    if found is None:
        return InfeasibleBudgetError(
            f"{error} (no rounding of the LP relaxation was found to fit up to {probe} bytes; "
            "checkmate_milp schedules budgets from the minimum named)",
            budget_bytes=error.budget_bytes, min_feasible_budget_bytes=None, strategy=error.strategy)
    while found - failed > max(1, int(found * ROUNDING_MINIMUM_RTOL)):
        mid = (failed + found) // 2
        ok = succeeds(mid)
        if ok is None:
            break
        if ok:
            found = mid
        else:
            failed = mid
    if found == start:
        return error
    return InfeasibleBudgetError(
        f"no rounding of the LP relaxation fits in {error.budget_bytes} bytes; the least budget at which one "
        f"was found to fit is {found} bytes (checkmate_milp may fit less)",
        budget_bytes=error.budget_bytes, min_feasible_budget_bytes=found, strategy=error.strategy)
