"""The strategy registry: every strategy's name, where it lives and what kind it is; option checking.

Implementations are named by ``"module:function"`` and imported on first use, so that choosing a
baseline never loads the MILP's solvers.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from checkmate.errors import InvalidArgumentError
from checkmate.solvers.backends import backend_names
from checkmate.solvers.types import MilpOptions, SolveOptions, StrategyKind, StrategySpec, option_names

__all__ = ["STRATEGIES", "get_strategy", "strategy_names", "baseline_specs", "check_solver_name",
           "make_options"]

_B = "checkmate.solvers.baselines"
_M = "checkmate.solvers.milp"
_BASE = StrategyKind.BASELINE
_SOLVER = StrategyKind.SOLVER
STRATEGIES: dict[str, StrategySpec] = {
    spec.name: spec
    for spec in [
        StrategySpec("checkpoint_all", f"{_B}:checkpoint_all", False,
                     "keep every value until its last use; each node computed once (no recomputation)", _BASE),
        StrategySpec("checkpoint_last_node", f"{_B}:checkpoint_last_node", False,
                     "keep only the previous stage's value; recompute everything else on demand", _BASE),
        StrategySpec("chen_sqrtn", f"{_B}:chen_sqrtn", False,
                     "Chen et al.: checkpoint every sqrt(n)-th articulation point", _BASE),
        StrategySpec("chen_greedy", f"{_B}:chen_greedy", True,
                     "Chen et al.: greedy segments over articulation points, segment size searched to fit", _BASE),
        StrategySpec("chen_sqrtn_linearized", f"{_B}:chen_sqrtn_linearized", False,
                     "Chen sqrt(n) over all forward nodes, treating the graph as a chain", _BASE),
        StrategySpec("chen_greedy_linearized", f"{_B}:chen_greedy_linearized", True,
                     "Chen greedy over all forward nodes, treating the graph as a chain", _BASE),
        StrategySpec("griewank_logn", f"{_B}:griewank_logn", True,
                     "binomial checkpointing (revolve) over the articulation-point chain", _BASE),
        StrategySpec("checkmate_milp", f"{_M}:checkmate_milp", True,
                     "Checkmate's MILP: the cheapest schedule that fits, with a proven bound", _SOLVER),
        StrategySpec("checkmate_lp_rounding", f"{_M}:checkmate_lp_rounding", True,
                     "LP relaxation of the MILP, rounded to a schedule that fits", _SOLVER),
        StrategySpec("lower_bound_lp", f"{_M}:lower_bound_lp", True,
                     "LP relaxation's bound on the cost of any schedule that fits (no schedule)", _SOLVER,
                     bound_only=True),
        StrategySpec("hierarchical", "checkmate.solvers.hierarchical:hierarchical", True,
                     "blocks of the graph solved once each by a small MILP, combined by dynamic "
                     "programming: near-optimal on deep models, thousands of nodes in minutes", _SOLVER),
        StrategySpec("auto", "checkmate.solvers.auto:auto", True,
                     "the exact MILP on small graphs, the hierarchical strategy on large ones, "
                     "never worse than the best classic baseline", _SOLVER),
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


def baseline_specs() -> list[StrategySpec]:
    """The registered baselines, in registry order."""
    return [spec for spec in STRATEGIES.values() if spec.kind is StrategyKind.BASELINE]


def check_solver_name(solver: str | None) -> None:
    """Reject an unknown solver name up front, whatever the strategy (baselines use no solver, but a
    misspelt name is still a mistake worth reporting). Only the name is checked: no solver is loaded."""
    if solver is None:
        return
    names = backend_names()
    if not isinstance(solver, str) or solver.strip().lower() not in {name.lower() for name in names}:
        raise InvalidArgumentError(f"unknown solver {solver!r}; choose one of: {', '.join(names)}")


def make_options(solver: str | None = None, time_limit_s: float | None = None, **options: Any) -> SolveOptions:
    """:class:`SolveOptions` from ``solve``'s keyword arguments.

    Every strategy accepts every known option and reads those that apply to it (so one set of options
    can be passed to several strategies, as sweeps do); an unknown name is refused with the valid ones.
    """
    shared, milp = option_names()
    unknown = sorted(set(options) - set(shared) - set(milp))
    if unknown:
        raise InvalidArgumentError(
            f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; valid options: "
            f"solver, time_limit_s, {', '.join(shared)}; for the MILP and LP strategies: {', '.join(milp)}")
    _check_positive_finite("time_limit_s", time_limit_s, allow_none=True)
    if "mip_gap" in options:
        gap = options["mip_gap"]
        if isinstance(gap, bool) or not isinstance(gap, numbers.Real) or not 0 <= float(gap) < 1:
            raise InvalidArgumentError(f"mip_gap must be a number in [0, 1), got {gap!r}")
    for name in ("seed",):
        value = options.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= int(value) < 2**31:
            raise InvalidArgumentError(f"{name} must be an integer in [0, 2^31), got {value!r}")
    # flags: only a real yes/no (numpy's included); "yes" or 5 is a mistake, not a truthy value
    verbose = options.get("verbose", False)
    if not isinstance(verbose, (bool, np.bool_)) and (not isinstance(verbose, numbers.Integral) or verbose < 0):
        raise InvalidArgumentError(f"verbose must be True, False or a level (0, 1, 2), got {verbose!r}")
    for name, allow_none in (("progress", True), ("race", True), ("root_lp", False),
                             ("exact_free", False), ("integral_s_only", False), ("exclusive_rows", True),
                             ("flow_rows", False), ("residency_rows", False), ("improve_start", False)):
        if name in options:
            value = options[name]
            if not (isinstance(value, (bool, np.bool_)) or (allow_none and value is None)):
                raise InvalidArgumentError(f"{name} must be True or False{' or None' if allow_none else ''}, "
                                           f"got {value!r}")
            if value is not None:
                options[name] = bool(value)
    fraction = options.get("working_set_fraction")
    if fraction is not None and (isinstance(fraction, bool) or not isinstance(fraction, numbers.Real)
                                 or not math.isfinite(float(fraction)) or float(fraction) < 0):
        raise InvalidArgumentError(f"working_set_fraction must be a non-negative number or None, got {fraction!r}")
    threads = options.get("threads")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, numbers.Integral) or threads <= 0):
        raise InvalidArgumentError(f"threads must be a positive integer or None, got {threads!r}")
    milp_options = MilpOptions(**{k: v for k, v in options.items() if k in milp})
    return SolveOptions(solver=solver, time_limit_s=time_limit_s, milp=milp_options,
                        **{k: v for k, v in options.items() if k in shared})



def _check_positive_finite(name: str, value: Any, *, allow_none: bool) -> None:
    if value is None and allow_none:
        return
    if (isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value))
            or float(value) <= 0):
        raise InvalidArgumentError(f"{name} must be a positive, finite number of seconds, got {value!r}")
