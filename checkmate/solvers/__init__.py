"""``solve()``, the one entry point of every strategy.

The registry (:mod:`checkmate.solvers.registry`), the option and result types
(:mod:`checkmate.solvers.types`) and the budget helpers (:mod:`checkmate.budgets`,
:mod:`checkmate.bounds`) are re-exported here.

Every strategy has the same signature, ``fn(graph, budget_bytes, options) -> StrategyOutput``, and
never sees a framework graph. ``solve`` parses the budget, runs the strategy, re-simulates whatever it
returned with the one memory model (:mod:`checkmate.simulate`) and refuses anything invalid or over
budget: no strategy is trusted on its own word.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from checkmate._deadline import deadline_scope
from checkmate.bounds import checkpoint_all_peak
from checkmate.budgets import format_bytes, parse_budget
from checkmate.errors import InfeasibleBudgetError, InvalidArgumentError, SolverError
from checkmate.simulate import check_graph, validate_schedule
from checkmate.solvers.model_size import MODEL_STRATEGIES, model_fits
from checkmate.solvers.registry import STRATEGIES, check_solver_name, get_strategy, make_options, strategy_names
from checkmate.solvers.types import (DEFAULT_TIME_LIMIT_S, MilpOptions, SolveOptions, StrategyKind, StrategyOutput,
                                     StrategySpec, json_native, native_float, native_int)

if TYPE_CHECKING:  # pragma: no cover
    from checkmate.graph import Graph
    from checkmate.schedule import Schedule

__all__ = ["solve", "SolveResult", "SolveOptions", "MilpOptions", "StrategyOutput", "StrategySpec", "StrategyKind",
           "STRATEGIES", "get_strategy", "strategy_names", "parse_budget", "checkpoint_all_peak", "format_bytes",
           "check_solver_name"]


# ------------------------------------------------------------------------------------------ solve
def _run_bounded(spec: StrategySpec, graph: "Graph", budget_bytes: int, opts: SolveOptions) -> StrategyOutput:
    """Run the strategy, unless its flat model cannot be built within the memory or time available
    (:mod:`checkmate.solvers.model_size`): then the MILP hands the graph to the hierarchical strategy,
    whose models are per segment, and the LP strategies fail with a :class:`SolverError`."""
    why = model_fits(graph, opts.time_limit_s) if spec.name in MODEL_STRATEGIES else None
    if why is None:
        try:
            return spec.fn(graph, budget_bytes, opts)
        except InfeasibleBudgetError as exc:
            if spec.name != "checkmate_lp_rounding":
                raise
            # the minimum it names must be one at which this strategy, not only the MILP, succeeds
            from checkmate.solvers.milp import rounding_minimum_error

            raise rounding_minimum_error(graph, exc, opts) from None
        except MemoryError:
            # what the estimate missed; the model's arrays are released as this unwinds
            raise SolverError(f"{spec.name} ran out of memory on a graph of {graph.n} nodes; try "
                              "strategy 'hierarchical' or a machine with more memory") from None
    if spec.name != "checkmate_milp":
        raise SolverError(f"{spec.name}: {why}; use --strategy hierarchical (or strategy='hierarchical')")
    with deadline_scope(_hard_deadline(STRATEGIES["hierarchical"], time.perf_counter(), opts.time_limit_s),
                        what="hierarchical"):
        out = STRATEGIES["hierarchical"].fn(graph, budget_bytes, opts)
    return replace(out, status=f"hierarchical, since {why}: {out.status}")


# Strategies without a solver (the baselines, and the hierarchical and auto strategies between their
# solver calls) are held to the time limit by deadline checks in their loops. The baselines have
# nothing to finish after it; the others stop their search at the limit themselves and then build and
# replay their best schedule, which is given this much more before they are cut short.
_FINISH_SHARE = 0.1
_FINISH_S = 2.0


def _hard_deadline(spec: StrategySpec, start: float, time_limit_s: float | None) -> float | None:
    if time_limit_s is None or (spec.kind is StrategyKind.SOLVER and spec.name not in ("hierarchical", "auto")):
        return None  # the MILP and LP strategies hand the limit to their solver
    if spec.kind is StrategyKind.BASELINE:
        return start + time_limit_s
    return start + time_limit_s * (1 + _FINISH_SHARE) + _FINISH_S


@dataclass(frozen=True)
class SolveResult:
    graph: str
    nodes: int
    strategy: str
    solver: str | None
    budget_bytes: int
    schedule: "Schedule | None"
    compute_cost: float | None
    baseline_cost: float
    peak_memory_bytes: int | None
    lower_bound: float | None
    optimal: bool
    solve_seconds: float
    status: str
    feasible: bool = True

    def __post_init__(self) -> None:
        # Strategies compute with numpy; a result holds plain Python values only, so that it serializes
        # with the standard json module and compares like the numbers it shows.
        for name, convert in (("nodes", int), ("budget_bytes", int), ("compute_cost", native_float),
                              ("baseline_cost", float), ("peak_memory_bytes", native_int),
                              ("lower_bound", native_float), ("optimal", bool), ("solve_seconds", float),
                              ("status", str), ("feasible", bool)):
            object.__setattr__(self, name, convert(getattr(self, name)))

    @property
    def overhead(self) -> float | None:
        if self.compute_cost is None:
            return None
        if self.baseline_cost <= 0:
            return 1.0  # a graph whose ops cost nothing: recomputing them adds nothing either
        return self.compute_cost / self.baseline_cost

    @property
    def gap(self) -> float | None:
        if self.lower_bound is None or self.compute_cost is None:
            return None
        if self.compute_cost <= 0:
            return 0.0
        return max(0.0, (self.compute_cost - self.lower_bound) / self.compute_cost)

    def to_json_dict(self) -> dict:
        return json_native({
            "graph": self.graph,
            "nodes": self.nodes,
            "strategy": self.strategy,
            "solver": self.solver,
            "budget_bytes": self.budget_bytes,
            "feasible": self.feasible,
            "optimal": self.optimal,
            "compute_cost": self.compute_cost,
            "baseline_cost": self.baseline_cost,
            "overhead": self.overhead,
            "peak_memory_bytes": self.peak_memory_bytes,
            "lower_bound": self.lower_bound,
            "gap": self.gap,
            "solve_seconds": self.solve_seconds,
            "status": self.status,
        })


def solve(graph: "Graph", budget: Any, strategy: str = "auto", solver: str | None = None,
          time_limit_s: float | None = None, **options: Any) -> SolveResult:
    """Find a schedule for ``graph`` within ``budget`` using ``strategy``.

    ``strategy="auto"`` (the default) is the exact MILP on small graphs and the hierarchical strategy
    on large ones, never worse than the best classic baseline. ``time_limit_s=None`` means
    :data:`~checkmate.solvers.types.DEFAULT_TIME_LIMIT_S` (ten minutes), never "without end".

    ``options`` are the fields of :class:`SolveOptions` (``mip_gap``, ``threads``, ``verbose``,
    ``seed``) and of :class:`MilpOptions` (read by the MILP and LP strategies); any other name raises
    :class:`InvalidArgumentError`.

    Raises :class:`InfeasibleBudgetError` (with the strategy's minimum feasible budget) when nothing
    fits, :class:`SolverError` when a solver fails, :class:`InvalidBudgetError` for a bad budget.
    """
    check_graph(graph)
    if not isinstance(strategy, str):
        raise InvalidArgumentError(f"strategy must be a name, got {type(strategy).__name__}")
    spec = get_strategy(strategy)
    check_solver_name(solver)
    budget_bytes = parse_budget(budget, graph)
    if time_limit_s is None:
        time_limit_s = DEFAULT_TIME_LIMIT_S
    opts = make_options(solver, time_limit_s, **options)
    start = time.perf_counter()
    with deadline_scope(_hard_deadline(spec, start, opts.time_limit_s), what=strategy):
        out = _run_bounded(spec, graph, budget_bytes, opts)
    seconds = time.perf_counter() - start
    if out.schedule is None:
        return SolveResult(graph.name, graph.n, strategy, out.solver, budget_bytes, None, None,
                           graph.total_cost, None, out.lower_bound, out.optimal, seconds, out.status)
    sim = validate_schedule(graph, out.schedule)
    if sim.peak_memory_bytes > budget_bytes:
        if spec.budget_aware:
            raise SolverError(f"{strategy} returned a schedule peaking at {sim.peak_memory_bytes} bytes, "
                              f"over the budget of {budget_bytes}")
        raise InfeasibleBudgetError(
            f"{strategy} needs {format_bytes(sim.peak_memory_bytes)} ({sim.peak_memory_bytes} bytes); "
            f"the budget is {format_bytes(budget_bytes)} ({budget_bytes} bytes)",
            budget_bytes=budget_bytes, min_feasible_budget_bytes=sim.peak_memory_bytes, strategy=strategy)
    schedule = out.schedule.with_meta(strategy=strategy, budget_bytes=budget_bytes)
    return SolveResult(graph.name, graph.n, strategy, out.solver, budget_bytes, schedule, sim.compute_cost,
                       graph.total_cost, sim.peak_memory_bytes, out.lower_bound, out.optimal, seconds, out.status)
