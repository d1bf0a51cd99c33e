"""``solve()`` and the strategy registry.

Every strategy has the same signature, ``fn(graph, budget_bytes, options) -> StrategyOutput``, and
never sees a framework graph. ``solve`` parses the budget, runs the strategy, re-simulates whatever it
returned with the one memory model (:mod:`checkmate.simulate`) and refuses anything invalid or over
budget: no strategy is trusted on its own word.
"""

from __future__ import annotations

import importlib
import math
import re
import time
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Callable, Mapping

from checkmate.errors import InfeasibleBudgetError, InvalidArgumentError, InvalidBudgetError, SolverError
from checkmate.simulate import validate_schedule

if TYPE_CHECKING:  # pragma: no cover
    from checkmate.graph import Graph
    from checkmate.schedule import Schedule

__all__ = ["solve", "SolveResult", "SolveOptions", "StrategyOutput", "StrategySpec", "STRATEGIES",
           "get_strategy", "strategy_names", "parse_budget", "checkpoint_all_peak", "format_bytes",
           "check_solver_name"]


@dataclass(frozen=True)
class SolveOptions:
    """Knobs shared by all strategies; each strategy reads the ones that apply to it."""

    solver: str | None = None          # backend name for MILP/LP strategies ("cvxpy", "gurobi", ...)
    time_limit_s: float | None = None
    mip_gap: float = 0.005             # relative gap at which a MILP counts as solved (0.5%)
    threads: int | None = None
    verbose: bool = False
    seed: int = 0
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StrategyOutput:
    """What a strategy returns. ``schedule`` is None only for bound-only strategies."""

    schedule: "Schedule | None"
    lower_bound: float | None = None
    optimal: bool = False
    status: str = "ok"
    solver: str | None = None


@dataclass(frozen=True)
class StrategySpec:
    name: str
    target: str          # "module:function", imported on first use so heavy solvers load lazily
    budget_aware: bool
    description: str

    @property
    def fn(self) -> Callable[["Graph", int, SolveOptions], StrategyOutput]:
        module, func = self.target.split(":")
        return getattr(importlib.import_module(module), func)


_B = "checkmate.solvers.baselines"
_M = "checkmate.solvers.milp"
STRATEGIES: dict[str, StrategySpec] = {
    spec.name: spec
    for spec in [
        StrategySpec("checkpoint_all", f"{_B}:checkpoint_all", False,
                     "keep every value until its last use; each node computed once (no recomputation)"),
        StrategySpec("checkpoint_last_node", f"{_B}:checkpoint_last_node", False,
                     "keep only the previous stage's value; recompute everything else on demand"),
        StrategySpec("chen_sqrtn", f"{_B}:chen_sqrtn", False,
                     "Chen et al.: checkpoint every sqrt(n)-th articulation point"),
        StrategySpec("chen_greedy", f"{_B}:chen_greedy", True,
                     "Chen et al.: greedy segments over articulation points, segment size searched to fit"),
        StrategySpec("chen_sqrtn_linearized", f"{_B}:chen_sqrtn_linearized", False,
                     "Chen sqrt(n) over all forward nodes, treating the graph as a chain"),
        StrategySpec("chen_greedy_linearized", f"{_B}:chen_greedy_linearized", True,
                     "Chen greedy over all forward nodes, treating the graph as a chain"),
        StrategySpec("griewank_logn", f"{_B}:griewank_logn", True,
                     "binomial checkpointing (revolve) over the articulation-point chain"),
        StrategySpec("checkmate_milp", f"{_M}:checkmate_milp", True,
                     "Checkmate's MILP: the cheapest schedule that fits, with a proven bound"),
        StrategySpec("checkmate_lp_rounding", f"{_M}:checkmate_lp_rounding", True,
                     "LP relaxation of the MILP, rounded to a schedule that fits"),
        StrategySpec("lower_bound_lp", f"{_M}:lower_bound_lp", True,
                     "LP relaxation's bound on the cost of any schedule that fits (no schedule)"),
    ]
}


def strategy_names() -> list[str]:
    return list(STRATEGIES)


def get_strategy(name: str) -> StrategySpec:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise InvalidArgumentError(
            f"unknown strategy {name!r}; choose one of: {', '.join(STRATEGIES)}") from None


def check_solver_name(solver: str | None) -> None:
    """Reject an unknown solver name up front, whatever the strategy (baselines use no solver, but a
    misspelt name is still a mistake worth reporting). Only the name is checked: no solver is loaded."""
    if solver is None:
        return
    from checkmate.solvers.backends import backend_names

    names = backend_names()
    if not isinstance(solver, str) or solver.strip().lower() not in {name.lower() for name in names}:
        raise InvalidArgumentError(f"unknown solver {solver!r}; choose one of: {', '.join(names)}")


# ------------------------------------------------------------------------------------------ budgets
_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
}
_BUDGET_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z%]*)\s*$")


def checkpoint_all_peak(graph: "Graph") -> int:
    """Peak bytes of the checkpoint-all schedule (the reference for percentage budgets)."""
    from checkmate.simulate import simulate
    from checkmate.solvers.baselines import checkpoint_all_schedule

    return simulate(graph, checkpoint_all_schedule(graph)).peak_memory_bytes


def parse_budget(budget: Any, graph: "Graph | None" = None) -> int:
    """Bytes from ``123``, ``"2GiB"``, ``"1.5GB"``, ``"512MiB"`` or ``"60%"`` (of checkpoint-all's peak)."""
    if isinstance(budget, bool):
        raise InvalidBudgetError(f"invalid budget {budget!r}")
    if isinstance(budget, (int, float)) and not isinstance(budget, bool):
        value = float(budget)
        if not math.isfinite(value) or value <= 0:
            raise InvalidBudgetError(f"budget must be a positive number of bytes, got {budget!r}")
        if value < 1:
            raise _less_than_a_byte(budget, value)
        return int(value)
    if not isinstance(budget, str):
        raise InvalidBudgetError(f"invalid budget {budget!r}: give bytes, '2GiB', '1.5GB' or '60%'")
    match = _BUDGET_RE.match(budget)
    if not match:
        raise InvalidBudgetError(f"invalid budget {budget!r}: give bytes, '2GiB', '1.5GB' or '60%'")
    # Exact decimal arithmetic: in floating point "2.01GB" would come out one byte short.
    number, unit = Fraction(match.group(1)), match.group(2).lower()
    if number <= 0:
        raise InvalidBudgetError(f"budget must be positive, got {budget!r}")
    if unit == "%":
        if graph is None:
            raise InvalidBudgetError(f"a percentage budget ({budget}) needs a graph to refer to")
        return math.floor(checkpoint_all_peak(graph) * number / 100)
    if unit not in _UNITS:
        raise InvalidBudgetError(f"unknown unit {match.group(2)!r} in budget {budget!r} "
                                 "(use B, KB, MB, GB, KiB, MiB, GiB or %)")
    if number * _UNITS[unit] < 1:
        raise _less_than_a_byte(budget, number if unit == "" else None)
    return math.floor(number * _UNITS[unit])


def _less_than_a_byte(budget: Any, number: Any) -> InvalidBudgetError:
    message = f"budget {budget!r} is less than one byte"
    if number is not None:
        # a bare 0.6 is more likely meant as a fraction of the checkpoint-all peak than as 0.6 bytes
        message += f"; for a fraction of the checkpoint-all peak give a percentage, e.g. '{float(number) * 100:g}%'"
    return InvalidBudgetError(message)


def format_bytes(num: float | None) -> str:
    if num is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(num) < 1024 or unit == "TiB":
            return f"{num:.0f} {unit}" if unit == "B" else f"{num:.2f} {unit}"
        num /= 1024
    return f"{num} B"  # unreachable


# ------------------------------------------------------------------------------------------ solve
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

    @property
    def overhead(self) -> float | None:
        if self.compute_cost is None or self.baseline_cost <= 0:
            return None
        return self.compute_cost / self.baseline_cost

    @property
    def gap(self) -> float | None:
        if self.lower_bound is None or self.compute_cost is None:
            return None
        if self.compute_cost <= 0:
            return 0.0
        return max(0.0, (self.compute_cost - self.lower_bound) / self.compute_cost)

    def to_json_dict(self) -> dict:
        return {
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
        }


def solve(graph: "Graph", budget: Any, strategy: str = "checkmate_milp", solver: str | None = None,
          time_limit_s: float | None = None, **options: Any) -> SolveResult:
    """Find a schedule for ``graph`` within ``budget`` using ``strategy``.

    Raises :class:`InfeasibleBudgetError` (with the strategy's minimum feasible budget) when nothing
    fits, :class:`SolverError` when a solver fails, :class:`InvalidBudgetError` for a bad budget.
    """
    spec = get_strategy(strategy)
    check_solver_name(solver)
    budget_bytes = parse_budget(budget, graph)
    known = {f.name for f in SolveOptions.__dataclass_fields__.values()} - {"solver", "time_limit_s", "extra"}
    opts = SolveOptions(solver=solver, time_limit_s=time_limit_s,
                        **{k: v for k, v in options.items() if k in known},
                        extra={k: v for k, v in options.items() if k not in known})
    start = time.perf_counter()
    out = spec.fn(graph, budget_bytes, opts)
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
