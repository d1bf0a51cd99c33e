"""The smallest budget at which any schedule exists, bracketed by MILP feasibility probes.

Strategies report it when a budget is infeasible (:func:`infeasible_error`, carried by
:class:`~checkmate.errors.InfeasibleBudgetError`). The bracket is narrowed by bisection between
the least any schedule needs (:func:`~checkmate.bounds.peak_floor`) and the lowest baseline peak,
each probe a short feasibility solve of :func:`~checkmate.solvers.staged.solve_staged`. The budget it names always has
a replayed schedule, so it is always feasible; the message says whether it is proven minimal or only
how far the proven lower end lies below it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from checkmate.bounds import largest_working_set_bytes, peak_floor
from checkmate.errors import CheckmateError, InfeasibleBudgetError, SolverError
from checkmate.schedule import Schedule
from checkmate.solvers.candidates import Candidate, baseline_candidates
from checkmate.solvers.staged import ProvenInfeasible, remaining_s, solve_staged
from checkmate.solvers.types import SolveOptions

if TYPE_CHECKING:  # pragma: no cover
    from checkmate.graph import Graph

__all__ = ["MinimumBudget", "bracket_minimum_budget", "infeasible_error", "MIN_BUDGET_TIME_S"]

# Time the min-peak search may take when a budget turns out infeasible (bounded by the caller's limit).
MIN_BUDGET_TIME_S = 30.0


@dataclass(frozen=True)
class MinimumBudget:
    """``feasible_bytes``: a budget at which a (replayed) schedule exists; ``lower_bytes``: no schedule
    peaks lower; ``proven``: the two meet."""

    feasible_bytes: int
    lower_bytes: int
    proven: bool
    schedule: Schedule


def bracket_minimum_budget(graph: "Graph", options: SolveOptions, *, time_limit_s: float | None = None,
                           candidates: list[Candidate] | None = None) -> MinimumBudget:
    """Bracket the smallest budget at which a schedule exists, within ``time_limit_s``.

    The bracket starts at ``[peak_floor, lowest-peak baseline]`` (the floor at least
    ``max_k (mem[k] + inputs of k) + fixed``) and is
    narrowed by bisection, each probe a time-limited feasibility solve of the MILP (LP relaxation,
    rounding, then branch and bound stopping at the first schedule): a schedule found lowers the top
    to its replayed peak; a proof of infeasibility (LP or MILP) raises the bottom; a probe that times
    out ends the search below it. ``feasible_bytes`` always has a replayed schedule; it is the exact
    minimum when ``proven``.
    """
    limit = MIN_BUDGET_TIME_S if time_limit_s is None else float(time_limit_s)
    deadline = time.perf_counter() + limit
    lower = max(largest_working_set_bytes(graph), peak_floor(graph)[0])
    pool = list(candidates or []) + baseline_candidates(graph, 2**62, options)
    best = min(pool, key=lambda c: (c.peak_bytes, c.cost))
    floor = lower      # probes below this are pointless: proven infeasible or already timed out
    probe = lower      # the first probe asks whether the trivial bound is attainable
    while floor < best.peak_bytes:
        left = deadline - time.perf_counter()
        if left <= 0.5:
            break
        # a gap of 1: any schedule answers the probe
        opts = SolveOptions(solver=options.solver, time_limit_s=left / 3, mip_gap=1.0, threads=options.threads,
                            verbose=options.verbose, seed=options.seed)
        try:
            found = solve_staged(graph, probe, opts).best
        except ProvenInfeasible:
            lower = probe + 1
            found = None
        except SolverError:
            found = None
        if found is not None:
            best = min(best, found, key=lambda c: (c.peak_bytes, c.cost))
        floor = max(lower, probe + 1) if found is None else floor
        probe = (floor + best.peak_bytes) // 2
    lower = min(lower, best.peak_bytes)
    return MinimumBudget(best.peak_bytes, lower, lower >= best.peak_bytes, best.schedule)


def infeasible_error(graph: "Graph", budget_bytes: int, options: SolveOptions, strategy: str,
                     deadline: float | None, why: str) -> InfeasibleBudgetError:
    """The error for a budget that nothing fits, naming the minimum feasible budget (bracketed within
    what is left of the caller's time, at most ``MIN_BUDGET_TIME_S``)."""
    remaining = remaining_s(deadline)
    limit = MIN_BUDGET_TIME_S if remaining is None else min(MIN_BUDGET_TIME_S, remaining)
    try:
        mb = bracket_minimum_budget(graph, options, time_limit_s=limit)
        feasible = mb.feasible_bytes
        detail = (f"the minimum feasible budget is {feasible} bytes" if mb.proven else
                  f"a schedule fits in {feasible} bytes and none in less than {mb.lower_bytes}")
    except CheckmateError as exc:
        mb = None
        feasible = None
        detail = f"the minimum feasible budget could not be established ({exc})"
    return InfeasibleBudgetError(f"no schedule fits in {budget_bytes} bytes ({why}); {detail}",
                                 budget_bytes=budget_bytes, min_feasible_budget_bytes=feasible, strategy=strategy,
                                 minimum=mb)
