"""Optimal schedules: the Checkmate MILP, its LP relaxation with rounding, and the LP lower bound.

All three share :mod:`checkmate.solvers.formulation` and a backend from
:mod:`checkmate.solvers.backends`. Whatever a solver answers, the schedule handed back is rebuilt from
its retention matrix S alone (useless holds pruned, R re-derived as the minimal recomputation) and
replayed by the simulator; a solution is only used if that replay fits the budget.

Minimum feasible budget (carried by :class:`InfeasibleBudgetError`): a bracket narrowed by bisection
(:func:`bracket_minimum_budget`) between ``max_k (mem[k] + inputs of k) + fixed`` and the lowest
baseline peak, each probe a short feasibility solve. The budget it names always has a replayed
schedule, so it is always feasible; the message says whether it is proven minimal or only how far
the proven lower end lies below it.
"""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from checkmate.bounds import largest_working_set_bytes, prune_unused_holds
from checkmate.errors import CheckmateError, InfeasibleBudgetError, SolverError
from checkmate.schedule import Schedule, minimal_recompute
from checkmate.simulate import simulate
from checkmate.solvers.backends import FEASIBLE, INFEASIBLE, NO_SOLUTION, OPTIMAL, Backend, get_backend
from checkmate.solvers.cp_schedule import CpSatChild, cp_sat_available
from checkmate.solvers.progress import SolveProgress, progress_wanted
from checkmate.solvers.formulation import (CheckmateFormulation, build_formulation, cost_granularity,
                                           max_strict_descendant)
from checkmate.solvers.registry import baseline_specs
from checkmate.solvers.types import (PROVEN_MIP_GAP, SolveOptions, StrategyOutput, is_proven_optimal,
                                    relative_gap, within_words)

if TYPE_CHECKING:  # pragma: no cover
    from checkmate.graph import Graph

__all__ = ["checkmate_milp", "checkmate_lp_rounding", "lower_bound_lp", "bracket_minimum_budget",
           "minimum_feasible_budget", "schedule_from_retain", "prune_retention", "MinimumBudget"]

# Time the min-peak search may take when a budget turns out infeasible (bounded by the caller's limit).
_MIN_BUDGET_TIME_S = 30.0
# Random roundings tried after the threshold sweep.
_RANDOM_ROUNDINGS = 64
# Local search on the MIP start (improve_by_holding): at most this long, and this share of the time left.
_IMPROVE_TIME_S = 10.0
_IMPROVE_FRACTION = 0.1
# Smallest graph whose branch and bound races CP-SAT by default. The child needs 1.5-3 s to start
# (Python, OR-Tools) and build its model; below this size HiGHS proves the optimum in less (a 16-node
# U-Net: 0.2-0.3 s at every tight budget), while unit training chains of 20 and 32 nodes already take
# HiGHS 5.9, 44 and 138 s where the race ends in 1.7, 3.8 and 11.6 s.
_RACE_MIN_NODES = 20
# CP-SAT stops at its first incumbent within the gap, where HiGHS usually has the exact optimum by
# then: at 1e-4 it returned U-Net (1.1x the minimum) 1.6e-6 above the optimum; at 1e-6 the optimum
# itself, in the same 6 s. Where its objective counts whole cost steps a proof is asked exact instead
# (see ``solve_cp_model``).
_CP_GAP_SHARE = 0.01
# How results name the CP-SAT model (its schedules and its proofs).
_CP_LABEL = "CP-SAT"


# ---------------------------------------------------------------------------------- schedules
def _forced_retention(graph: "Graph") -> np.ndarray:
    """Cells every schedule must hold: outputs after they are computed; non-recomputable values while
    a descendant may still run (recomputing them is forbidden)."""
    n = graph.n
    t = np.arange(n)[:, None]
    i = np.arange(n)[None, :]
    forced = (i < t) & graph.output[None, :]
    maxdesc = max_strict_descendant(graph)
    forced |= (i < t) & ~graph.recomputable[None, :] & (t <= maxdesc[None, :])
    return forced


# Pruning holds lives with the other memory facts; the MILP's name for it stays importable.
prune_retention = prune_unused_holds


def schedule_from_retain(graph: "Graph", retain: np.ndarray) -> Schedule:
    """The schedule of a retention matrix: forced holds added, useless holds pruned, minimal R."""
    S = np.asarray(retain, dtype=bool) | _forced_retention(graph)
    S = prune_unused_holds(graph, S)
    return Schedule.from_matrices(graph, minimal_recompute(graph, S), S)


@dataclass(frozen=True)
class _Candidate:
    schedule: Schedule
    cost: float
    peak_bytes: int
    source: str


def _evaluate(graph: "Graph", schedule: Schedule, source: str) -> _Candidate | None:
    sim = simulate(graph, schedule)
    if not sim.valid:
        return None
    return _Candidate(schedule, sim.compute_cost, sim.peak_memory_bytes, source)


def _baseline_candidates(graph: "Graph", budget_bytes: int, options: SolveOptions) -> list[_Candidate]:
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
        cand = _evaluate(graph, result.schedule, spec.name)
        if cand is not None:
            out.append(cand)
    return out


# ---------------------------------------------------------------------------------- options
def _deadline(options: SolveOptions) -> float | None:
    return None if options.time_limit_s is None else time.perf_counter() + float(options.time_limit_s)


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(deadline - time.perf_counter(), 0.01)


def _build(graph: "Graph", budget_bytes: int, options: SolveOptions, backend: Backend) -> CheckmateFormulation:
    milp = options.milp
    return build_formulation(graph, budget_bytes, exact_free=bool(milp.exact_free),
                             integral_s_only=bool(milp.integral_s_only),
                             integral_units=backend.needs_integral_rows,
                             exclusive_rows=milp.exclusive_rows,
                             flow_rows=bool(milp.flow_rows),
                             residency_rows=bool(milp.residency_rows),
                             working_set_fraction=milp.working_set_fraction)


def _solver_label(backend: Backend) -> str:
    return getattr(backend, "label", backend.name)


# ---------------------------------------------------------------------------------- minimum budget
@dataclass(frozen=True)
class MinimumBudget:
    """``feasible_bytes``: a budget at which a (replayed) schedule exists; ``lower_bytes``: no schedule
    peaks lower; ``proven``: the two meet."""

    feasible_bytes: int
    lower_bytes: int
    proven: bool
    schedule: Schedule


class _ProvenInfeasible(Exception):
    """The solver proved the budget infeasible (internal; strategies turn it into InfeasibleBudgetError)."""


def bracket_minimum_budget(graph: "Graph", options: SolveOptions, *, time_limit_s: float | None = None,
                           candidates: list[_Candidate] | None = None) -> MinimumBudget:
    """Bracket the smallest budget at which a schedule exists, within ``time_limit_s``.

    The bracket starts at ``[max_k (mem[k] + inputs of k) + fixed, lowest-peak baseline]`` and is
    narrowed by bisection, each probe a time-limited feasibility solve of the MILP (LP relaxation,
    rounding, then branch and bound stopping at the first schedule): a schedule found lowers the top
    to its replayed peak; a proof of infeasibility (LP or MILP) raises the bottom; a probe that times
    out ends the search below it. ``feasible_bytes`` always has a replayed schedule; it is the exact
    minimum when ``proven``.
    """
    limit = _MIN_BUDGET_TIME_S if time_limit_s is None else float(time_limit_s)
    deadline = time.perf_counter() + limit
    lower = largest_working_set_bytes(graph)
    pool = list(candidates or []) + _baseline_candidates(graph, 2**62, options)
    best = min(pool, key=lambda c: (c.peak_bytes, c.cost))
    floor = lower      # probes below this are pointless: proven infeasible or already timed out
    probe = lower      # the first probe asks whether the trivial bound is attainable
    while floor < best.peak_bytes:
        left = deadline - time.perf_counter()
        if left <= 0.5:
            break
        opts = SolveOptions(solver=options.solver, time_limit_s=left / 3, mip_gap=1.0, threads=options.threads,
                            verbose=options.verbose, seed=options.seed)
        try:
            found, _, _, _ = _solve_milp(graph, probe, opts)
        except _ProvenInfeasible:
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


# The name the bracket had first (tests and experiments import it).
minimum_feasible_budget = bracket_minimum_budget


def _infeasible(graph: "Graph", budget_bytes: int, options: SolveOptions, strategy: str,
                deadline: float | None, why: str) -> InfeasibleBudgetError:
    remaining = _remaining(deadline)
    limit = _MIN_BUDGET_TIME_S if remaining is None else min(_MIN_BUDGET_TIME_S, remaining)
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


def _tolerance_bytes(graph: "Graph", budget_bytes: int) -> int:
    """Bytes that a solver's feasibility tolerance (about 1e-6 relative) may hide in a memory row."""
    return max(1, math.ceil(1e-6 * max(budget_bytes - int(graph.fixed_mem), 0)))


def _proven_bound(form: CheckmateFormulation, bound: float | None) -> float | None:
    """A proven lower bound in cost units, raised to the next attainable cost when the costs share a
    step (every schedule's cost is then a multiple of it: see ``cost_granularity``)."""
    if bound is None or form.model.proof_abs_gap is None:
        return bound
    step = cost_granularity(form.graph.cost)
    tolerance = form.model.objective_tolerance * form.model.objective_scale
    # whole steps in cost units: exact for integral steps, where model units would leave 38.99999...
    return max(bound, step * math.ceil((bound - tolerance) / step))


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


# ---------------------------------------------------------------------------------- strategies
def _race_wanted(graph: "Graph", options: SolveOptions, backend: Backend) -> bool:
    """Whether branch and bound races the CP-SAT model (see :func:`_solve_milp`)."""
    if options.milp.race is False or backend.name != "highs" or options.mip_gap >= 1.0:
        return False
    if options.milp.race is None and (graph.n < _RACE_MIN_NODES or (os.cpu_count() or 1) < 2):
        return False
    return cp_sat_available()


def _solve_milp(graph: "Graph", budget_bytes: int, options: SolveOptions, progress: SolveProgress | None = None):
    """(best fitting candidate or None, proven bound or None, last backend result or None, the name of
    the solver whose proof the bound is when two raced, else None).

    Branch and bound by HiGHS may race the CP-SAT model of :mod:`checkmate.solvers.cp_schedule` in a
    child process (``options.milp.race``; by default on graphs of at least ``_RACE_MIN_NODES`` nodes
    on a machine with two cores or more, when OR-Tools is installed): the child builds its model
    while the LP, its rounding and the local search run here, then starts from the same incumbent;
    HiGHS runs on one thread, the first proof of optimality ends both, and the child is killed
    whatever happens (time limit, error, Ctrl-C).

    Raises :class:`_ProvenInfeasible` when the LP or the MILP proves that nothing fits and no
    candidate contradicts it, :class:`SolverError` when the solver fails or a proof is contradicted.
    """
    backend = get_backend(options.solver)
    if budget_bytes < largest_working_set_bytes(graph):
        raise _ProvenInfeasible("some node's inputs and output alone exceed it")
    race = None
    if _race_wanted(graph, options, backend):
        try:
            race = CpSatChild(graph, budget_bytes)
        except OSError:   # no child process here: HiGHS alone
            race = None
    try:
        return _solve_milp_with(graph, budget_bytes, options, backend, race,
                                SolveProgress(False, "") if progress is None else progress)
    finally:
        if race is not None:
            race.close()


def _race_proved(race: CpSatChild) -> bool:
    outcome = race.result()
    return outcome is not None and outcome.status == OPTIMAL


# How often the caller looks at the child's pipe while branch and bound runs beside it (seconds).
_RACE_POLL_S = 0.02


def _beside_race(race: CpSatChild, solve):
    """``solve(stop)`` (branch and bound, polling ``stop()`` from its callback) run in a thread while
    this thread watches the child: its result, or None as soon as the child proves optimality.

    HiGHS lets itself be interrupted only between nodes and cut rounds, at times seconds apart; its
    callback alone noticed the child's proof up to 1.8 s late (U-Net at 1.1x the minimum: 1.3 s of a
    4.4 s solve). HiGHS releases the interpreter lock while it runs, so this thread answers at once;
    HiGHS stops at its next callback, and the HiGHS backend lets no other solve start before it has
    (see ``backends.highs``). Only this thread reads the child's pipe. Ctrl-C here stops HiGHS too.
    """
    stop = threading.Event()
    box: dict = {}

    def work() -> None:
        try:
            box["result"] = solve(stop.is_set)
        except BaseException as exc:   # handed to the caller's thread
            box["error"] = exc

    # not a daemon: the interpreter waits for it at exit (a daemon thread still inside HiGHS when the
    # interpreter shuts down aborts the process from HiGHS' next callback)
    worker = threading.Thread(target=work, name="checkmate-branch-and-bound")
    worker.start()
    try:
        while worker.is_alive():
            if race.result() is None:
                race.wait(_RACE_POLL_S)
            else:
                worker.join(_RACE_POLL_S)
            if _race_proved(race):
                stop.set()
                return None
    except BaseException:
        stop.set()
        raise
    worker.join()
    if "error" in box:
        raise box["error"]
    return box["result"]


def _solve_milp_with(graph: "Graph", budget_bytes: int, options: SolveOptions, backend: Backend,
                     race: CpSatChild | None, progress: SolveProgress):
    deadline = _deadline(options)
    label = _solver_label(backend)
    progress.phase("building the model")
    form = _build(graph, budget_bytes, options, backend)
    progress.cost_scale = form.model.objective_scale
    pool = [c for c in _baseline_candidates(graph, budget_bytes, options) if c.peak_bytes <= budget_bytes]
    bound = None
    # A backend without LPs (CP-SAT) gets its bound and first incumbents from HiGHS' LP on the same model.
    lp_backend = backend if backend.lp_capable else get_backend("highs")
    if options.milp.root_lp:
        progress.phase("LP relaxation")
        lp = lp_backend.solve(form.model.relaxed(), time_limit_s=_remaining(deadline), mip_gap=options.mip_gap,
                           threads=options.threads, verbose=options.verbose)
        if lp.status == INFEASIBLE:
            if pool:
                raise SolverError(f"{label} reports the LP relaxation infeasible, yet the {pool[0].source} "
                                  f"schedule fits ({pool[0].peak_bytes} <= {budget_bytes} bytes); try another solver")
            raise _ProvenInfeasible(f"even the LP relaxation is infeasible ({label})")
        if lp.status == OPTIMAL and lp.x is not None:
            bound = _proven_bound(form, lp.objective * form.model.objective_scale)
            progress.phase("rounding the LP")
            pool += round_relaxation(graph, form, lp.x, budget_bytes, seed=options.seed, deadline=deadline)

    def solved(cand, lower):
        """Within the requested gap, or proven optimal (a gap below one cost step)."""
        gap = None if cand is None else relative_gap(cand.cost, lower)
        return gap is not None and (gap <= options.mip_gap + 1e-12 or is_proven_optimal(gap))

    res = None
    proved_by = None
    best = min(pool, key=lambda c: c.cost) if pool else None
    # The child starts from the best rounding, before the local search: its search climbs from the
    # bound, and the local search's better schedule did not make it faster (SegNet at 1.1x the
    # minimum: 12.3 s from the rounding, 12-19 s from the local search's schedule, 28 s from none),
    # so the two run side by side.
    racing_cp = race is not None and not solved(best, bound) and race.solve(
        hint_retain=None if best is None else best.schedule.retain, time_limit_s=_remaining(deadline),
        mip_gap=_cp_gap(options.mip_gap), abs_gap=_proof_abs_gap_cost(form),
        exact=options.mip_gap <= PROVEN_MIP_GAP)
    if best is not None and not solved(best, bound) and options.milp.improve_start:
        remaining = _remaining(deadline)
        budget_s = _IMPROVE_TIME_S if remaining is None else min(_IMPROVE_TIME_S, _IMPROVE_FRACTION * remaining)
        progress.phase("local search" + (", racing CP-SAT" if racing_cp else ""))
        # ended early by the child's proof: branch and bound is then skipped below
        best = improve_by_holding(graph, best, budget_bytes, deadline=time.perf_counter() + budget_s,
                                  stop=(lambda: _race_proved(race)) if racing_cp else None)
        pool.append(best)
    if not solved(best, bound):
        x0 = None
        if best is not None and backend.supports_mip_start:
            x0 = form.encode(best.schedule.recompute, best.schedule.retain)
        solve_form = form
        over = None
        for attempt in range(0 if racing_cp and _race_proved(race) else 2):
            racing = racing_cp and attempt == 0
            progress.phase("branch and bound" + (", racing CP-SAT" if racing else ""))
            threads = 1 if racing and options.threads is None else options.threads
            watch = {"on_bounds": progress.bounds} if progress.enabled and backend.name == "highs" else {}

            def branch_and_bound(stop=None, model=solve_form.model, x0=x0, threads=threads, watch=watch):
                return backend.solve(model, time_limit_s=_remaining(deadline), mip_gap=options.mip_gap,
                                     threads=threads, verbose=options.verbose, mip_start=x0,
                                     **({"stop": stop} if stop is not None else {}), **watch)

            res = _beside_race(race, branch_and_bound) if racing else branch_and_bound()
            if res is None:   # the child proved optimality first
                break
            if res.status == INFEASIBLE:
                if best is not None:
                    raise SolverError(f"{label} reports the budget infeasible, yet the {best.source} schedule "
                                      f"fits ({best.peak_bytes} <= {budget_bytes} bytes); try another solver")
                raise _ProvenInfeasible(f"{label} proved it" + (" within its tolerances" if attempt else ""))
            over = None
            if res.x is not None:
                _, S = form.decode(res.x)
                cand = _evaluate(graph, schedule_from_retain(graph, S), label)
                if cand is not None and cand.peak_bytes <= budget_bytes:
                    pool.append(cand)
                elif cand is not None:
                    over = cand.peak_bytes
            slack = _tolerance_bytes(graph, budget_bytes)
            if over is None or pool or attempt or over - budget_bytes > slack:
                break
            # The solver's tolerances let a few bytes too many through (memory in float units, values far
            # apart in size): solve once more with the budget lowered by that tolerance.
            solve_form = form.with_budget(budget_bytes - max(over - budget_bytes, slack))
            x0 = None
        outcome = None if race is None else race.result()
        if outcome is not None and outcome.retain is not None:
            cand = _evaluate(graph, schedule_from_retain(graph, outcome.retain), _CP_LABEL)
            if cand is not None and cand.peak_bytes <= budget_bytes:
                pool.append(cand)
        if not pool and res is not None and res.status != NO_SOLUTION:
            raise SolverError(f"{label}'s solution does not fit when replayed ({over} > {budget_bytes} bytes)")
        if res is not None and res.bound is not None:
            mip_bound = _proven_bound(form, res.bound * form.model.objective_scale)
            bound = mip_bound if bound is None else max(bound, mip_bound)
        if outcome is not None and outcome.bound is not None and outcome.status in (OPTIMAL, FEASIBLE):
            cp_bound = _proven_bound(form, outcome.bound)
            bound = cp_bound if bound is None else max(bound, cp_bound)
        best = min(pool, key=lambda c: c.cost) if pool else None
        if race is not None and res is not None and res.status == OPTIMAL:
            proved_by = "HiGHS"
        elif outcome is not None and outcome.status == OPTIMAL:
            proved_by = _CP_LABEL
    return best, bound, res, proved_by


def _cp_gap(mip_gap: float) -> float:
    """The relative gap CP-SAT is asked for: a proof is asked to ``_CP_GAP_SHARE`` of the gap (see there)."""
    return mip_gap * _CP_GAP_SHARE if mip_gap <= PROVEN_MIP_GAP else mip_gap


def _proof_abs_gap_cost(form: CheckmateFormulation) -> float | None:
    """The model's proof gap (one cost step less the bound's tolerance) in cost units, or None."""
    gap = form.model.proof_abs_gap
    return None if gap is None else gap * form.model.objective_scale


def checkmate_milp(graph: "Graph", budget_bytes: int, options: SolveOptions) -> StrategyOutput:
    """Solve the MILP; return the cheapest replayed schedule that fits, with the proven lower bound.

    Order of work: the baselines give a first incumbent; the LP relaxation gives a bound, and its
    rounding (:func:`round_relaxation`) usually an incumbent within the gap already, in which case the
    LP bound proves it and no branch and bound is needed. Otherwise the MILP runs for the remaining
    time, seeded with the best incumbent as a MIP start (where the backend takes one), with HiGHS
    racing the CP-SAT model of :mod:`checkmate.solvers.cp_schedule` (see :func:`_solve_milp`); the incumbent
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
    deadline = _deadline(options)
    label = _solver_label(get_backend(options.solver))
    with SolveProgress(progress_wanted(options.progress), "checkmate_milp") as progress:
        try:
            best, bound, res, proved_by = _solve_milp(graph, budget_bytes, options, progress)
        except _ProvenInfeasible as why:
            progress.phase("no schedule fits: searching the minimum feasible budget")
            error = _infeasible(graph, budget_bytes, options, "checkmate_milp", deadline, str(why))
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
    if best is None:
        raise SolverError(f"{label} found no schedule within the time limit and no baseline fits "
                          f"{budget_bytes} bytes; raise time_limit_s or the budget")
    bound = _bound_below(best.cost, bound)
    gap = relative_gap(best.cost, bound)
    optimal = is_proven_optimal(gap)
    status = _verdict_status(gap, res, proven_by_lp=res is None and proved_by is None,
                             race_proved=proved_by == _CP_LABEL)
    if proved_by is not None and optimal:
        other = "HiGHS" if proved_by == _CP_LABEL else _CP_LABEL
        status += f" (proven by {proved_by}, racing {other})"
    if best.source != label:
        status += f" (schedule from {best.source})"
    return StrategyOutput(best.schedule, lower_bound=bound, optimal=optimal, status=status, solver=label)


def _solve_relaxation(graph: "Graph", budget_bytes: int, options: SolveOptions, strategy: str):
    deadline = _deadline(options)
    backend = get_backend(options.solver)
    label = _solver_label(backend)
    if budget_bytes < largest_working_set_bytes(graph):
        raise _infeasible(graph, budget_bytes, options, strategy, deadline,
                          "some node's inputs and output alone exceed it")
    form = _build(graph, budget_bytes, options, backend)
    res = backend.solve(form.model.relaxed(), time_limit_s=_remaining(deadline), mip_gap=options.mip_gap,
                        threads=options.threads, verbose=options.verbose)
    if res.status == INFEASIBLE:
        raise _infeasible(graph, budget_bytes, options, strategy, deadline, f"even the LP relaxation is infeasible ({label})")
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
    bound = _proven_bound(form, raw)
    status = "LP relaxation solved"
    if bound > raw:
        step = form.model.objective_granularity * form.model.objective_scale
        status += f" (its optimum {raw:.6g} raised to the next multiple of the cost step {step:.6g})"
    return StrategyOutput(None, lower_bound=bound, optimal=False, status=status, solver=label)


def repair_to_budget(graph: "Graph", schedule: Schedule, budget_bytes: int, *,
                     deadline: float | None = None) -> _Candidate | None:
    """Greedily drop holds until the replayed peak fits, or give up (None).

    At each step the schedule's peak moment is inspected; for every value held on entry to that stage
    (and not forced), dropping the hold from that stage until the value is next recomputed is tried,
    and the drop with the least added cost per byte of peak removed is kept.
    """
    forced = _forced_retention(graph)
    current = _evaluate(graph, schedule, "repair")
    if current is None:
        return None
    n = graph.n
    while current.peak_bytes > budget_bytes:
        if deadline is not None and time.perf_counter() > deadline:
            return None
        t = simulate(graph, current.schedule).peak_step.stage
        S = current.schedule.retain
        best, best_score = None, math.inf
        for i in np.flatnonzero(S[t] & ~forced[t]):
            S2 = np.array(S)
            end = t
            while end < n and S2[end, i]:
                S2[end, i] = False
                end += 1
            cand = _evaluate(graph, schedule_from_retain(graph, S2), "repair")
            if cand is None or cand.peak_bytes >= current.peak_bytes:
                continue
            score = (cand.cost - current.cost) / (current.peak_bytes - cand.peak_bytes)
            if score < best_score:
                best, best_score = cand, score
        if best is None:
            return None
        current = best
    return current


@dataclass(frozen=True)
class _Matrices:
    """An (R, S) pair that the simulator replays without building a plan first."""

    recompute: np.ndarray
    retain: np.ndarray


def improve_by_holding(graph: "Graph", candidate: _Candidate, budget_bytes: int, *,
                       deadline: float | None = None, stop=None) -> _Candidate:
    """Local search: replace recomputations by holds while the replayed peak still fits.

    A move takes one recomputation ``R[t, i]`` (``i < t``) and holds ``i`` instead, from the last
    stage before ``t`` in which it is resident up to ``t``; the schedule is rebuilt from S (minimal R,
    useless holds pruned) and replayed. Each round applies the move that lowers the cost most, until
    no move fits or the deadline passes. Rounded LP solutions and baselines at tight budgets
    recompute far more than needed; this gives the MILP a much lower cutoff to start from.

    A move's cost needs only its minimal R; the replay, which dominates the work, runs on the moves
    in increasing order of cost and stops at the first that fits, so a round replays few of them.
    ``stop`` (a callable), when given, ends the search as soon as it returns True (polled between moves).
    """
    current = candidate

    def over() -> bool:
        return (deadline is not None and time.perf_counter() > deadline) or (stop is not None and stop())

    forced = _forced_retention(graph)
    cost = graph.cost

    def moved(R, S, t, i):
        """(R, S) after holding ``i`` instead of recomputing it in stage ``t``."""
        s = t - 1
        while s > i and not (R[s, i] or S[s, i]):
            s -= 1
        S2 = np.array(S)
        S2[s + 1:t + 1, i] = True
        S2 = prune_unused_holds(graph, S2 | forced)
        return minimal_recompute(graph, S2), S2

    while not over():
        R, S = current.schedule.recompute, current.schedule.retain
        tt, ii = np.nonzero(np.tril(R, -1))
        cheaper = current.cost - 1e-12 * abs(current.cost)
        # (cost, t, i) of each move that lowers the cost; the matrices are rebuilt for the few replayed
        # (keeping them all would take n^2 bytes per move on large graphs)
        moves = []
        for t, i in zip(tt.tolist(), ii.tolist()):
            if over():
                break
            R2, _ = moved(R, S, t, i)
            move_cost = float(cost[np.nonzero(R2)[1]].sum())
            if move_cost < cheaper:
                moves.append((move_cost, len(moves), t, i))
        best = None
        for _, _, t, i in sorted(moves):
            if over():
                break
            R2, S2 = moved(R, S, t, i)
            sim = simulate(graph, _Matrices(R2, S2))
            if sim.valid and sim.peak_memory_bytes <= budget_bytes and sim.compute_cost < cheaper:
                best = _Candidate(Schedule.from_matrices(graph, R2, S2), sim.compute_cost, sim.peak_memory_bytes,
                                  current.source)
                break
        if best is None:
            break
        current = best
    if current is not candidate:
        current = _Candidate(current.schedule, current.cost, current.peak_bytes, candidate.source + ", improved")
    return current


def round_relaxation(graph: "Graph", form: CheckmateFormulation, x: np.ndarray, budget_bytes: int, *,
                     seed: int = 0, samples: int = _RANDOM_ROUNDINGS, repairs: int = 3,
                     deadline: float | None = None) -> list[_Candidate]:
    """Round the relaxed S: a deterministic sweep over thresholds, then randomized rounding.

    Each rounded S becomes a schedule (forced holds added, useless ones pruned, minimal R); those whose
    replayed peak fits the budget are returned. If none fits, the ``repairs`` roundings that overshoot
    least are repaired by :func:`repair_to_budget` (still replayed: nothing is scaled or fudged).
    """
    S_frac = form.retain_values(x)
    lower = np.tri(graph.n, k=-1, dtype=bool)
    values = np.unique(S_frac[lower & (S_frac > 1e-6)])
    thresholds = np.unique(np.r_[values, np.linspace(0.05, 1.0, 20)])
    if thresholds.size > 60:   # keep the sweep short on big graphs: quantiles of the fractional values
        thresholds = np.unique(np.quantile(thresholds, np.linspace(0, 1, 60)))
    out: list[_Candidate] = []
    over: list[_Candidate] = []
    seen: set[bytes] = set()

    def consider(S: np.ndarray, source: str) -> None:
        key = np.packbits(S).tobytes()
        if key in seen:
            return
        seen.add(key)
        cand = _evaluate(graph, schedule_from_retain(graph, S), source)
        if cand is None:
            return
        (out if cand.peak_bytes <= budget_bytes else over).append(cand)

    for tau in thresholds:
        if deadline is not None and time.perf_counter() > deadline:
            break
        consider(lower & (S_frac >= tau - 1e-9), f"threshold {tau:.3f}")
    rng = np.random.default_rng(seed)
    for s in range(samples):
        if deadline is not None and time.perf_counter() > deadline:
            break
        consider(lower & (rng.random(S_frac.shape) < S_frac), f"random #{s}")
    if not out:
        for cand in sorted(over, key=lambda c: (c.peak_bytes, c.cost))[:repairs]:
            fixed = repair_to_budget(graph, cand.schedule, budget_bytes, deadline=deadline)
            if fixed is not None:
                out.append(_Candidate(fixed.schedule, fixed.cost, fixed.peak_bytes, cand.source + ", repaired"))
    return out


def checkmate_lp_rounding(graph: "Graph", budget_bytes: int, options: SolveOptions) -> StrategyOutput:
    """LP relaxation, then threshold and randomized rounding of S; the cheapest rounding that fits."""
    form, res, label, deadline = _solve_relaxation(graph, budget_bytes, options, "checkmate_lp_rounding")
    bound = res.objective * form.model.objective_scale
    found = round_relaxation(graph, form, res.x, budget_bytes, seed=options.seed, deadline=deadline)
    if not found:
        error = _infeasible(graph, budget_bytes, options, "checkmate_lp_rounding", deadline,
                            "no rounding of the LP relaxation fits")
        mb = error.minimum
        if mb is not None and mb.lower_bytes > budget_bytes:
            raise error      # proven: nothing fits, the LP was feasible only within its tolerances
        raise SolverError(f"no rounding of the LP relaxation fits {budget_bytes} bytes; "
                          "use checkmate_milp for this budget")
    best = min(found, key=lambda c: c.cost)
    bound = _bound_below(best.cost, _proven_bound(form, bound))
    gap = relative_gap(best.cost, bound)
    optimal = is_proven_optimal(gap)
    verdict = "optimal" if optimal else within_words(gap)
    return StrategyOutput(best.schedule, lower_bound=bound, optimal=optimal,
                          status=f"{verdict} (LP rounding, {best.source})", solver=label)
