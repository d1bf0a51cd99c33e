"""The staged MILP driver: baselines, LP relaxation, rounding, local search, then branch and bound.

Every MILP answer in checkmate goes through :func:`solve_staged`: the exact strategy, the minimum
budget search (:mod:`checkmate.solvers.bracket`) and the max-batch study's yes/no probes
(:func:`checkmate.analysis.max_batch.decide_milp`). Each stage may end the solve:

1. the registered baselines give the first replayed schedules within the budget;
2. the LP relaxation gives a proven bound (or proves that nothing fits), and its rounding
   (:func:`~checkmate.solvers.rounding.round_relaxation`) usually a schedule within the gap already;
3. a local search (:func:`~checkmate.solvers.rounding.improve_by_holding`) lowers the cheapest few;
4. branch and bound, seeded with it as a MIP start where the backend takes one, possibly racing the
   CP-SAT model (:mod:`checkmate.solvers.race`), and solved once more a little below the budget when
   the solver's tolerances let a solution overshoot it by a few bytes.

Hooks turn the same stages into a decision: ``cutoff`` (no schedule above it is wanted; branch and
bound prunes above it, and "infeasible" then means nothing costs at most the cutoff), ``target``
(stop at the first schedule at or below it) and ``stop`` (a callable; the solve ends once it returns
True). The driver returns a :class:`StagedResult` naming the stage that ended it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

from checkmate.bounds import largest_working_set_bytes
from checkmate.errors import SolverError
from checkmate.solvers.backends import FEASIBLE, INFEASIBLE, NO_SOLUTION, OPTIMAL, Backend, BackendResult, get_backend
from checkmate.solvers.candidates import Candidate, baseline_candidates, evaluate, schedule_from_retain
from checkmate.solvers.cp_schedule import CpSatChild
from checkmate.solvers.formulation import CheckmateFormulation, build_formulation
from checkmate.solvers.sparse_model import cost_granularity
from checkmate.solvers.progress import SolveProgress
from checkmate.solvers.race import CP_LABEL, beside_race, cp_gap, race_proved, start_race
from checkmate.solvers.rounding import improve_by_holding, round_relaxation
from checkmate.solvers.types import PROVEN_MIP_GAP, SolveOptions, is_proven_optimal, relative_gap

if TYPE_CHECKING:  # pragma: no cover
    from checkmate.graph import Graph

__all__ = ["solve_staged", "StagedResult", "ProvenInfeasible", "build_model", "proven_bound", "solver_label",
           "BASELINES", "LP_RELAXATION", "ROUNDING", "LOCAL_SEARCH", "BRANCH_AND_BOUND"]

# The stages, as StagedResult.stage names the one that ended a solve.
BASELINES = "baselines"
LP_RELAXATION = "LP relaxation"
ROUNDING = "rounding"
LOCAL_SEARCH = "local search"
BRANCH_AND_BOUND = "branch and bound"

# Local search on the MIP start: at most this long, and this share of the time left (it lowers the
# cutoff branch and bound starts from; longer searches gained little next to branch and bound).
IMPROVE_TIME_S = 10.0
IMPROVE_FRACTION = 0.1
# ... on at most this many of the cheapest schedules found so far (of different costs): a refined start
# handed in can be the cheapest while a rounding refines to far less. Measured:
# experiments/results/README.md, section i.
IMPROVE_STARTS = 3


class ProvenInfeasible(Exception):
    """The LP relaxation or branch and bound proved that no schedule fits the budget (strategies turn
    it into :class:`~checkmate.errors.InfeasibleBudgetError`, with the minimum feasible budget)."""


@dataclass(frozen=True)
class StagedResult:
    """What :func:`solve_staged` found. Costs and bounds are in cost units."""

    best: Candidate | None             # the cheapest replayed schedule within the budget, if any
    bound: float | None                # proven lower bound on the cost of any schedule within the budget
    last: BackendResult | None         # branch and bound's last result (None: not run, or the race's proof first)
    proved_by: str | None              # with a race, the solver whose proof ended it (else None)
    stage: str                         # the stage that ended the solve (BASELINES ... BRANCH_AND_BOUND)
    lp_solved: bool = False            # the LP relaxation was solved to optimality
    none_within_cutoff: bool = False   # branch and bound proved that no schedule costs at most the cutoff


# ---------------------------------------------------------------------------------- helpers
def deadline_of(options: SolveOptions) -> float | None:
    """The ``time.perf_counter()`` at which ``options.time_limit_s`` runs out (None: no limit)."""
    return None if options.time_limit_s is None else time.perf_counter() + float(options.time_limit_s)


def remaining_s(deadline: float | None) -> float | None:
    """Seconds left until ``deadline`` (at least a hundredth, so a solver is never given zero)."""
    return None if deadline is None else max(deadline - time.perf_counter(), 0.01)


def build_model(graph: "Graph", budget_bytes: int, options: SolveOptions, backend: Backend) -> CheckmateFormulation:
    """The formulation as ``options.milp`` asks for it, in the row form ``backend`` needs."""
    milp = options.milp
    return build_formulation(graph, budget_bytes, exact_free=bool(milp.exact_free),
                             integral_s_only=bool(milp.integral_s_only),
                             integral_units=backend.needs_integral_rows,
                             exclusive_rows=milp.exclusive_rows,
                             flow_rows=bool(milp.flow_rows),
                             residency_rows=bool(milp.residency_rows),
                             working_set_fraction=milp.working_set_fraction)


def solver_label(backend: Backend) -> str:
    return getattr(backend, "label", backend.name)


def tolerance_bytes(graph: "Graph", budget_bytes: int) -> int:
    """Bytes that a solver's feasibility tolerance (about 1e-6 relative) may hide in a memory row."""
    return max(1, math.ceil(1e-6 * max(budget_bytes - int(graph.fixed_mem), 0)))


def proven_bound(form: CheckmateFormulation, bound: float | None) -> float | None:
    """A proven lower bound in cost units, raised to the next attainable cost when the costs share a
    step (every schedule's cost is then a multiple of it: see ``cost_granularity``)."""
    if bound is None or form.model.proof_abs_gap is None:
        return bound
    step = cost_granularity(form.graph.cost)
    tolerance = form.model.objective_tolerance * form.model.objective_scale
    # whole steps in cost units: exact for integral steps, where model units would leave 38.99999...
    return max(bound, step * math.ceil((bound - tolerance) / step))


def proof_abs_gap_cost(form: CheckmateFormulation) -> float | None:
    """The model's proof gap (one cost step less the bound's tolerance) in cost units, or None."""
    gap = form.model.proof_abs_gap
    return None if gap is None else gap * form.model.objective_scale


# ---------------------------------------------------------------------------------- the driver
def solve_staged(graph: "Graph", budget_bytes: int, options: SolveOptions, *, progress: SolveProgress | None = None,
                 cutoff: float | None = None, target: float | None = None,
                 stop: Callable[[], bool] | None = None, starts: Sequence[Candidate] = ()) -> StagedResult:
    """Run the stages (see the module docstring) until one answers, within ``options.time_limit_s``.

    Without hooks the solve ends once the best schedule is within ``options.mip_gap`` of the proven
    bound (or proven optimal: a gap below one cost step). With ``target`` it ends at the first
    schedule costing at most ``target``, or once the bound exceeds ``cutoff``; the CP-SAT race, which
    takes neither, is then not run. ``stop`` is polled by the local search and, where the backend
    supports it (``Backend.supports_stop``), by branch and bound.

    Branch and bound may race the CP-SAT model (``options.milp.race``; see
    :func:`~checkmate.solvers.race.race_wanted`): the child builds its model while the LP, its
    rounding and the local search run here, then starts from the best rounding; HiGHS runs on one
    thread, the first proof of optimality ends both, and the child is closed whatever happens.

    ``starts``: replayed schedules found elsewhere (a caller's repaired or refined schedule); those
    within the budget join the baselines' as incumbents, so the local search and branch and bound
    start from the best of them.

    Raises :class:`ProvenInfeasible` when the LP or the MILP proves that nothing fits and no schedule
    contradicts it, :class:`SolverError` when the solver fails or a proof is contradicted.
    """
    backend = get_backend(options.solver)
    backend.refuse_unsupported(cutoff=cutoff, target=target)
    if budget_bytes < largest_working_set_bytes(graph):
        raise ProvenInfeasible("some node's inputs and output alone exceed it")
    # the CP-SAT model takes neither a cutoff nor a target
    race = None if cutoff is not None or target is not None else start_race(graph, budget_bytes, options, backend)
    try:
        return _run_stages(graph, budget_bytes, options, backend, race,
                           SolveProgress(False, "") if progress is None else progress, cutoff, target, stop, starts)
    finally:
        if race is not None:
            race.close()


def _run_stages(graph: "Graph", budget_bytes: int, options: SolveOptions, backend: Backend,
                race: CpSatChild | None, progress: SolveProgress, cutoff: float | None, target: float | None,
                stop: Callable[[], bool] | None, starts: Sequence[Candidate] = ()) -> StagedResult:
    deadline = deadline_of(options)
    label = solver_label(backend)
    progress.phase("building the model")
    pool = [c for c in baseline_candidates(graph, budget_bytes, options) if c.peak_bytes <= budget_bytes]
    pool += [c for c in starts if c.peak_bytes <= budget_bytes]
    bound = None
    lp_solved = False

    def cheapest() -> Candidate | None:
        return min(pool, key=lambda c: c.cost) if pool else None

    def solved(cand: Candidate | None, lower: float | None) -> bool:
        """With a target: reached, or ruled out by the bound. Else: within the requested gap, or proven
        optimal (a gap below one cost step)."""
        if target is not None or cutoff is not None:
            return ((target is not None and cand is not None and cand.cost <= target)
                    or (cutoff is not None and lower is not None and lower > cutoff))
        gap = None if cand is None else relative_gap(cand.cost, lower)
        return gap is not None and (gap <= options.mip_gap + 1e-12 or is_proven_optimal(gap))

    def stopped() -> bool:
        return stop is not None and bool(stop())

    def ended(stage: str, last: BackendResult | None = None, proved_by: str | None = None,
              none_within_cutoff: bool = False) -> StagedResult:
        return StagedResult(cheapest(), bound, last, proved_by, stage, lp_solved, none_within_cutoff)

    # a decision a baseline answers needs no model (without hooks nothing is solved without a bound)
    if solved(cheapest(), None) or stopped():
        return ended(BASELINES)
    form = build_model(graph, budget_bytes, options, backend)
    progress.cost_scale = form.model.objective_scale
    # A backend without LPs (CP-SAT) gets its bound and first incumbents from HiGHS' LP on the same model.
    lp_backend = backend if backend.lp_capable else get_backend("highs")
    stage = BASELINES
    if options.milp.root_lp:
        progress.phase("LP relaxation")
        lp = lp_backend.solve(form.model.relaxed(), time_limit_s=remaining_s(deadline), mip_gap=options.mip_gap,
                              threads=options.threads, verbose=options.verbose)
        stage = LP_RELAXATION
        if lp.status == INFEASIBLE:
            if pool:
                raise SolverError(f"{label} reports the LP relaxation infeasible, yet the {pool[0].source} "
                                  f"schedule fits ({pool[0].peak_bytes} <= {budget_bytes} bytes); try another solver")
            raise ProvenInfeasible(f"even the LP relaxation is infeasible ({label})")
        if lp.status == OPTIMAL and lp.x is not None:
            lp_solved = True
            bound = proven_bound(form, lp.objective * form.model.objective_scale)
            if cutoff is not None and bound > cutoff:
                return ended(LP_RELAXATION)
            progress.phase("rounding the LP")
            pool += round_relaxation(graph, form, lp.x, budget_bytes, seed=options.seed, deadline=deadline)
            stage = ROUNDING

    res = None
    proved_by = None
    best = cheapest()
    # The child starts from the best rounding, beside the local search: its search climbs from the
    # bound, and the local search's better schedule did not make it faster.
    # Measured: experiments/results/README.md, section i.
    racing_cp = race is not None and not solved(best, bound) and race.solve(
        hint_retain=None if best is None else best.schedule.retain, time_limit_s=remaining_s(deadline),
        mip_gap=cp_gap(options.mip_gap), abs_gap=proof_abs_gap_cost(form),
        exact=options.mip_gap <= PROVEN_MIP_GAP)

    def race_or_stop() -> bool:
        return (racing_cp and race_proved(race)) or stopped()

    if best is not None and not solved(best, bound) and options.milp.improve_start and not stopped():
        left = remaining_s(deadline)
        budget_s = IMPROVE_TIME_S if left is None else min(IMPROVE_TIME_S, IMPROVE_FRACTION * left)
        progress.phase("local search" + (", racing CP-SAT" if racing_cp else ""))
        # the few cheapest schedules of different costs, each in its share of the time: a start found
        # elsewhere that is already refined can be the cheapest while a rounding refines to far less
        # (a 54-node U-Net at 50%: a refined start at 1.39x, a rounding refined to 1.16x)
        ranked: list[Candidate] = []
        for cand in sorted(pool, key=lambda c: c.cost):
            if len(ranked) == IMPROVE_STARTS:
                break
            if not ranked or cand.cost > ranked[-1].cost * (1 + 1e-9):
                ranked.append(cand)
        end = time.perf_counter() + budget_s
        for k, cand in enumerate(ranked):
            if k and stopped():
                break
            share = (end - time.perf_counter()) / (len(ranked) - k)
            # ended early by the child's proof: branch and bound is then skipped below
            found = improve_by_holding(graph, cand, budget_bytes, deadline=time.perf_counter() + share,
                                       stop=race_or_stop if (racing_cp or stop is not None) else None)
            pool.append(found)
            if found.cost < best.cost:
                best = found
        stage = LOCAL_SEARCH
    none_within_cutoff = False
    if not solved(best, bound) and not stopped():
        x0 = None
        # a start above the cutoff would be rejected by it
        if best is not None and backend.supports_mip_start and (cutoff is None or best.cost <= cutoff):
            x0 = form.encode(best.schedule.recompute, best.schedule.retain)
        solve_form = form
        over = None
        scale = form.model.objective_scale
        for attempt in range(0 if racing_cp and race_proved(race) else 2):
            racing = racing_cp and attempt == 0
            stage = BRANCH_AND_BOUND
            progress.phase("branch and bound" + (", racing CP-SAT" if racing else ""))
            threads = 1 if racing and options.threads is None else options.threads
            optional = {}
            if progress.enabled and backend.reports_bounds:
                optional["on_bounds"] = progress.bounds
            if cutoff is not None:
                optional["cutoff"] = cutoff / scale
            if target is not None:
                optional["target"] = target / scale

            def branch_and_bound(race_stop=None, model=solve_form.model, x0=x0, threads=threads, optional=optional):
                polls = [f for f in (race_stop, stop) if f is not None]
                if polls and backend.supports_stop:
                    optional = {**optional, "stop": lambda: any(f() for f in polls)}
                return backend.solve(model, time_limit_s=remaining_s(deadline), mip_gap=options.mip_gap,
                                     threads=threads, verbose=options.verbose, mip_start=x0, **optional)

            res = beside_race(race, branch_and_bound) if racing else branch_and_bound()
            if res is None:   # the child proved optimality first
                break
            if res.status == INFEASIBLE:
                if cutoff is not None:
                    # nothing at or below the cutoff; a lowered budget's answer says nothing of the real one
                    none_within_cutoff = solve_form is form
                    break
                if best is not None:
                    raise SolverError(f"{label} reports the budget infeasible, yet the {best.source} schedule "
                                      f"fits ({best.peak_bytes} <= {budget_bytes} bytes); try another solver")
                raise ProvenInfeasible(f"{label} proved it" + (" within its tolerances" if attempt else ""))
            over = None
            if res.x is not None:
                _, S = form.decode(res.x)
                cand = evaluate(graph, schedule_from_retain(graph, S), label)
                if cand is not None and cand.peak_bytes <= budget_bytes:
                    pool.append(cand)
                elif cand is not None:
                    over = cand.peak_bytes
            answered = solved(cheapest(), None) if target is not None else bool(pool)
            if over is None or answered or attempt or over - budget_bytes > tolerance_bytes(graph, budget_bytes):
                break
            # The solver's tolerances let a few bytes too many through (memory in float units, values far
            # apart in size): solve once more with the budget lowered by that tolerance.
            solve_form = form.with_budget(budget_bytes - max(over - budget_bytes, tolerance_bytes(graph, budget_bytes)))
            x0 = None
        outcome = None if race is None else race.result()
        if outcome is not None and outcome.retain is not None:
            cand = evaluate(graph, schedule_from_retain(graph, outcome.retain), CP_LABEL)
            if cand is not None and cand.peak_bytes <= budget_bytes:
                pool.append(cand)
        if cutoff is None and not pool and res is not None and res.status != NO_SOLUTION:
            raise SolverError(f"{label}'s solution does not fit when replayed ({over} > {budget_bytes} bytes)")
        # with a cutoff the answer must hold for the real budget: a lowered budget's bound is not one
        if res is not None and res.bound is not None and (cutoff is None or solve_form is form):
            mip_bound = proven_bound(form, res.bound * scale)
            bound = mip_bound if bound is None else max(bound, mip_bound)
        if outcome is not None and outcome.bound is not None and outcome.status in (OPTIMAL, FEASIBLE):
            cp_bound = proven_bound(form, outcome.bound)
            bound = cp_bound if bound is None else max(bound, cp_bound)
        if race is not None and res is not None and res.status == OPTIMAL:
            proved_by = "HiGHS"
        elif outcome is not None and outcome.status == OPTIMAL:
            proved_by = CP_LABEL
    return ended(stage, last=res, proved_by=proved_by, none_within_cutoff=none_within_cutoff)
