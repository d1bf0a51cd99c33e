"""The MILP and LP strategies: ``checkmate_milp``, ``checkmate_lp_rounding`` and ``lower_bound_lp``.

All three share :mod:`checkmate.solvers.formulation` and a backend from
:mod:`checkmate.solvers.backends`. The exact strategy runs the staged driver
(:func:`checkmate.solvers.staged.solve_staged`) and words its verdict; the LP strategies solve the
relaxation and round it (:mod:`checkmate.solvers.rounding`) or report its bound. Every schedule
returned is rebuilt from S and replayed (:mod:`checkmate.solvers.candidates`). A budget that nothing
fits raises :class:`InfeasibleBudgetError` with the minimum feasible budget
(:mod:`checkmate.solvers.bracket`).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Sequence

from checkmate.bounds import checkpoint_all_peak, largest_working_set_bytes
from checkmate.errors import InfeasibleBudgetError, SolverError
from checkmate.solvers.backends import FEASIBLE, INFEASIBLE, NO_SOLUTION, OPTIMAL, get_backend
from checkmate.solvers.bracket import infeasible_error
from checkmate.solvers.candidates import Candidate
from checkmate.solvers.progress import SolveProgress, progress_wanted
from checkmate.solvers.race import CP_LABEL
from checkmate.solvers.rounding import round_relaxation
from checkmate.solvers.staged import (ProvenInfeasible, build_model, deadline_of, proven_bound, remaining_s,
                                      solve_staged, solver_label)
from checkmate.solvers.types import SolveOptions, StrategyOutput, is_proven_optimal, relative_gap, within_words

if TYPE_CHECKING:  # pragma: no cover
    from checkmate.graph import Graph

__all__ = ["checkmate_milp", "checkmate_lp_rounding", "lower_bound_lp", "rounding_minimum_error"]

# The LP rounding's own minimum: the search's whole time (as the MILP's bracket), each probe's share of
# what is left (a probe is one LP, its roundings and a short infeasibility check), and how close the
# bisection gets (relative) before it stops.
ROUNDING_MINIMUM_TIME_S = 30.0
ROUNDING_PROBE_SHARE = 0.25
ROUNDING_MINIMUM_RTOL = 1e-3


def _bound_below(cost: float, bound: float | None) -> float | None:
    """The bound capped at the schedule's cost, and equal to it when the two differ only by rounding."""
    if bound is None:
        return None
    return cost if bound >= cost - 1e-12 * abs(cost) else bound


def _verdict_status(gap: float | None, res, proven_by_lp: bool, race_proved: bool = False) -> str:
    """The status of a MILP result: ``optimal`` exactly when the flag is set, else how far off it may be.
    ``race_proved``: the raced CP-SAT model proved its answer within the requested gap."""
    if is_proven_optimal(gap):
        status = "optimal" if gap <= 1e-9 else f"optimal at the solver's tolerance (gap {100 * gap:.2g}%)"
        return status + (" (proven by the LP bound)" if proven_by_lp else "")
    within = "no proven bound" if gap is None else within_words(gap)
    if race_proved:
        return f"{within} (the requested mip_gap)"
    if res is not None and res.status in (FEASIBLE, NO_SOLUTION):
        return f"time limit, {within}"
    if res is None:   # branch and bound is skipped only when the LP bound meets the requested gap
        return f"{within} (proven by the LP bound; the requested mip_gap)"
    if res.status == OPTIMAL:
        return f"{within} (the requested mip_gap)"
    return f"{res.message}, {within}"


def checkmate_milp(graph: "Graph", budget_bytes: int, options: SolveOptions, *,
                   starts: Sequence[Candidate] = ()) -> StrategyOutput:
    """Solve the MILP; return the cheapest replayed schedule that fits, with the proven lower bound.

    Order of work: the baselines give a first incumbent; the LP relaxation gives a bound, and its
    rounding (:func:`round_relaxation`) usually an incumbent within the gap already, in which case the
    LP bound proves it and no branch and bound is needed. Otherwise the MILP runs for the remaining
    time, seeded with the best incumbent as a MIP start (where the backend takes one), with HiGHS
    racing the CP-SAT model of :mod:`checkmate.solvers.cp_schedule` (see :func:`solve_staged`); the incumbent
    is kept as the answer if the solver finds nothing better in time. The solver stops at the relative
    gap ``options.mip_gap`` (default 1e-4) or, with integral costs, once the gap is below their gcd.
    ``optimal`` is set only when the returned schedule is proven optimal at the solvers' tolerance: a
    relative gap of at most 1e-4 to the proven bound, the bound first raised to the next attainable
    cost when costs are integral (so a gap below one cost step proves the exact optimum). A looser
    result says ``within X% of the optimum`` in its status.

    ``options.milp`` (:class:`~checkmate.solvers.types.MilpOptions`): ``root_lp=False`` skips the LP-and-rounding phase (straight to the MILP);
    ``exact_free=True`` builds the model with the exact FREE definition; ``flow_rows=False`` leaves out
    the flow rows, ``residency_rows=False`` the residency rows, ``working_set_fraction`` picks the
    positions with a residency row and ``exclusive_rows=True`` adds ``R + S <= 1`` (see
    :func:`build_formulation`);
    ``improve_start=False`` skips the local search on the MIP start; ``race=True``/``False`` races
    CP-SAT whatever the graph's size, or never.
    """
    deadline = deadline_of(options)
    label = solver_label(get_backend(options.solver))
    with SolveProgress(progress_wanted(options.progress), "checkmate_milp") as progress:
        try:
            run = solve_staged(graph, budget_bytes, options, progress=progress, starts=starts)
        except ProvenInfeasible as why:
            progress.phase("no schedule fits: searching the minimum feasible budget")
            error = infeasible_error(graph, budget_bytes, options, "checkmate_milp", deadline, str(why))
        else:
            error = None
    if error is not None:
        mb = error.minimum
        if mb is not None and mb.feasible_bytes <= budget_bytes:
            # a proof "within tolerances" that the minimum-budget search contradicts with a replayed
            # schedule: return that schedule, without claiming anything about its cost
            return StrategyOutput(mb.schedule, lower_bound=None, optimal=False,
                                  status="schedule from the minimum-budget search (the solver's proof of "
                                         "infeasibility relied on its tolerances)", solver=label)
        raise error from None
    best, res, proved_by = run.best, run.last, run.proved_by
    if best is None:
        raise SolverError(f"{label} found no schedule within the time limit and no baseline fits "
                          f"{budget_bytes} bytes; raise time_limit_s or the budget")
    bound = _bound_below(best.cost, run.bound)
    gap = relative_gap(best.cost, bound)
    optimal = is_proven_optimal(gap)
    status = _verdict_status(gap, res, proven_by_lp=res is None and proved_by is None,
                             race_proved=proved_by == CP_LABEL)
    if proved_by is not None and optimal:
        other = "HiGHS" if proved_by == CP_LABEL else CP_LABEL
        status += f" (proven by {proved_by}, racing {other})"
    if best.source != label:
        status += f" (schedule from {best.source})"
    return StrategyOutput(best.schedule, lower_bound=bound, optimal=optimal, status=status, solver=label)


def _solve_relaxation(graph: "Graph", budget_bytes: int, options: SolveOptions, strategy: str):
    deadline = deadline_of(options)
    backend = get_backend(options.solver)
    label = solver_label(backend)
    if budget_bytes < largest_working_set_bytes(graph):
        raise infeasible_error(graph, budget_bytes, options, strategy, deadline,
                               "some node's inputs and output alone exceed it")
    form = build_model(graph, budget_bytes, options, backend)
    res = backend.solve(form.model.relaxed(), time_limit_s=remaining_s(deadline), mip_gap=options.mip_gap,
                        threads=options.threads, verbose=options.verbose)
    if res.status == INFEASIBLE:
        raise infeasible_error(graph, budget_bytes, options, strategy, deadline,
                               f"even the LP relaxation is infeasible ({label})")
    if res.status != OPTIMAL or res.x is None:
        raise SolverError(f"{label} did not solve the LP relaxation ({res.message or res.status}); "
                          "raise time_limit_s")
    return form, res, label, deadline


def lower_bound_lp(graph: "Graph", budget_bytes: int, options: SolveOptions) -> StrategyOutput:
    """The LP relaxation's optimum: no schedule within the budget costs less. When the node costs
    share a step (integers, or decimals with few places), the bound is raised to the next multiple
    of it that a schedule can cost, as the MILP's bounds are."""
    form, res, label, _ = _solve_relaxation(graph, budget_bytes, options, "lower_bound_lp")
    raw = res.objective * form.model.objective_scale
    bound = proven_bound(form, raw)
    status = "LP relaxation solved"
    if bound > raw:
        step = form.model.objective_granularity * form.model.objective_scale
        status += f" (its optimum {raw:.6g} raised to the next multiple of the cost step {step:.6g})"
    return StrategyOutput(None, lower_bound=bound, optimal=False, status=status, solver=label)


def checkmate_lp_rounding(graph: "Graph", budget_bytes: int, options: SolveOptions) -> StrategyOutput:
    """LP relaxation, then threshold and randomized rounding of S; the cheapest rounding that fits."""
    form, res, label, deadline = _solve_relaxation(graph, budget_bytes, options, "checkmate_lp_rounding")
    bound = res.objective * form.model.objective_scale
    found = round_relaxation(graph, form, res.x, budget_bytes, seed=options.seed, deadline=deadline)
    if not found:
        error = infeasible_error(graph, budget_bytes, options, "checkmate_lp_rounding", deadline,
                                 "no rounding of the LP relaxation fits")
        mb = error.minimum
        if mb is not None and mb.lower_bytes > budget_bytes:
            raise error      # proven: nothing fits, the LP was feasible only within its tolerances
        raise SolverError(f"no rounding of the LP relaxation fits {budget_bytes} bytes; "
                          "use checkmate_milp for this budget")
    best = min(found, key=lambda c: c.cost)
    bound = _bound_below(best.cost, proven_bound(form, bound))
    gap = relative_gap(best.cost, bound)
    optimal = is_proven_optimal(gap)
    verdict = "optimal" if optimal else within_words(gap)
    return StrategyOutput(best.schedule, lower_bound=bound, optimal=optimal,
                          status=f"{verdict} (LP rounding, {best.source})", solver=label)


def rounding_minimum_error(graph: "Graph", error: InfeasibleBudgetError, options: SolveOptions) -> InfeasibleBudgetError:
    """``error`` (from ``checkmate_lp_rounding``) naming the least budget at which the LP rounding
    itself succeeds, not merely one at which some schedule exists.

    The MILP's minimum can lie where the LP is feasible but no rounding fits; the search steps up from
    it (doubling the step) to a budget where the rounding succeeds, then bisects down to
    :data:`ROUNDING_MINIMUM_RTOL`, within :data:`ROUNDING_MINIMUM_TIME_S`. The budget it names has had
    a successful rounding solve. Without one in time the error names no minimum.
    """
    start = error.min_feasible_budget_bytes
    if start is None:
        return error
    deadline = time.perf_counter() + ROUNDING_MINIMUM_TIME_S

    def succeeds(budget: int) -> bool | None:
        left = deadline - time.perf_counter()
        if left <= 0:
            return None
        try:
            checkmate_lp_rounding(graph, budget, replace(options, time_limit_s=max(left * ROUNDING_PROBE_SHARE, 1.0)))
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
