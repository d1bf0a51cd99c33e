"""The types every strategy speaks: its options, what it returns and how it is registered.

Options are typed: :class:`SolveOptions` holds the knobs shared by all strategies, and each family of
strategies with settings of its own has a dataclass of them (:class:`MilpOptions` for the MILP and LP
strategies), reached as a field of :class:`SolveOptions`.
"""

from __future__ import annotations

import enum
import importlib
import math
import numbers
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from checkmate._deadline import check_deadline, deadline_scope, no_deadline

if TYPE_CHECKING:  # pragma: no cover
    from checkmate.graph import Graph
    from checkmate.schedule import Schedule

__all__ = ["DEFAULT_TIME_LIMIT_S", "MilpOptions", "SolveOptions", "StrategyOutput", "StrategyKind", "StrategySpec",
           "option_names", "PROVEN_MIP_GAP", "relative_gap", "is_proven_optimal", "within_words",
           "json_native", "native_float", "native_int", "deadline_scope", "check_deadline", "no_deadline"]

# The relative gap at which a MILP counts as solved and ``optimal`` is claimed: the default of HiGHS,
# Gurobi and SCIP, i.e. proven at the solver's own tolerance. (With integral costs an absolute gap
# below their gcd also proves the optimum: see SparseModel.proof_abs_gap.)
PROVEN_MIP_GAP = 1e-4


def relative_gap(cost: float, bound: float | None) -> float | None:
    """``(cost - bound) / cost``, at least 0; None without a bound."""
    if bound is None:
        return None
    return max(cost - bound, 0.0) / cost if cost > 0 else 0.0


def is_proven_optimal(gap: float | None) -> bool:
    """Whether a relative gap to a proven bound proves optimality at the solvers' tolerance."""
    return gap is not None and gap <= PROVEN_MIP_GAP + 1e-12


def within_words(gap: float) -> str:
    """What a result that is not proven optimal says of itself (a gap above 1e-4 never prints as 0.00%)."""
    return f"within {gap:.2%} of the optimum"


def native_float(value: Any) -> float | None:
    """``value`` as a Python float (None stays None): solvers and numpy hand back ``numpy.float64``,
    which the standard ``json`` module and plain ``isinstance(x, float)`` checks do not all accept."""
    return None if value is None else float(value)


def native_int(value: Any) -> int | None:
    return None if value is None else int(value)


def json_native(value: Any) -> Any:
    """``value`` with every numpy scalar and array, tuple and mapping turned into the Python types the
    ``json`` module writes (bool, int, float, str, None, list, dict with string keys). A float that is
    not finite becomes None: ``NaN`` and ``Infinity`` are not JSON, and no reader could trust them."""
    if isinstance(value, np.generic):  # numpy.bool, numpy.float64, numpy.int64, ...
        value = value.item()
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        as_float = float(value)
        return as_float if math.isfinite(as_float) else None
    if isinstance(value, dict):
        return {str(k): json_native(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return json_native(value.tolist())
    if isinstance(value, (list, tuple)):
        return [json_native(v) for v in value]
    raise TypeError(f"{type(value).__name__} is not JSON-native")


# What ``time_limit_s=None`` means: a solve never runs without end. Ten minutes lets the exact MILP
# prove the papers' layer graphs optimal and the hierarchical strategy handle 10,000-node graphs on a
# 2-core machine; pass a number to change it.
DEFAULT_TIME_LIMIT_S = 600.0


@dataclass(frozen=True)
class MilpOptions:
    """Settings of the MILP and LP strategies (see :func:`checkmate.solvers.milp.checkmate_milp` and
    :func:`checkmate.solvers.formulation.build_formulation`)."""

    root_lp: bool = True               # solve the LP relaxation and round it before branch and bound
    exact_free: bool = False           # the exact FREE definition (one row per FREE cell)
    integral_s_only: bool = False      # declare only S integral (R is re-derived anyway)
    exclusive_rows: bool | None = None  # add R + S <= 1 (None: only with exact_free)
    flow_rows: bool = True             # the flow rows (False: the published, weaker relaxation)
    residency_rows: bool = True        # the residency rows (knapsacks over the holds)
    working_set_fraction: float | None = None  # which positions get a residency row (None: the default)
    improve_start: bool = True         # local search on the MIP start
    race: bool | None = None           # race the CP-SAT model in a child (None: on larger graphs)


@dataclass(frozen=True)
class SolveOptions:
    """Knobs shared by all strategies; each strategy reads the ones that apply to it."""

    solver: str | None = None          # backend name for MILP/LP strategies ("cvxpy", "gurobi", ...)
    time_limit_s: float | None = None
    mip_gap: float = PROVEN_MIP_GAP    # relative gap at which the solver may stop (looser: not optimal)
    threads: int | None = None
    verbose: bool = False
    seed: int = 0
    progress: bool | None = None       # a status line on stderr during long MILP solves (None: when
                                       # stderr is a terminal or CHECKMATE_PROGRESS is set)
    milp: MilpOptions = field(default_factory=MilpOptions)


def option_names() -> tuple[list[str], list[str]]:
    """(shared option names, per-strategy option names) that ``solve(..., **options)`` accepts."""
    shared = [f.name for f in fields(SolveOptions) if f.name not in ("solver", "time_limit_s", "milp")]
    return shared, [f.name for f in fields(MilpOptions)]


@dataclass(frozen=True)
class StrategyOutput:
    """What a strategy returns. ``schedule`` is None only for bound-only strategies."""

    schedule: "Schedule | None"
    lower_bound: float | None = None
    optimal: bool = False
    status: str = "ok"
    solver: str | None = None

    def __post_init__(self) -> None:
        # solvers compute these with numpy; callers (and their JSON) get plain Python values
        object.__setattr__(self, "lower_bound", native_float(self.lower_bound))
        object.__setattr__(self, "optimal", bool(self.optimal))
        object.__setattr__(self, "status", str(self.status))


class StrategyKind(str, enum.Enum):
    """How a strategy finds its schedule."""

    BASELINE = "baseline"    # a fixed rule (no solver): its schedule is a starting point for the MILP
    SOLVER = "solver"        # an LP or MILP solved by a backend


@dataclass(frozen=True)
class StrategySpec:
    name: str
    target: str          # "module:function", imported on first use so heavy solvers load lazily
    budget_aware: bool
    description: str
    kind: StrategyKind = StrategyKind.BASELINE
    bound_only: bool = False     # returns a lower bound and no schedule

    @property
    def fn(self) -> Callable[["Graph", int, SolveOptions], StrategyOutput]:
        module, func = self.target.split(":")
        return getattr(importlib.import_module(module), func)
