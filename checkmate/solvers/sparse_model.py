"""The backend-neutral sparse model every solver backend takes, and the accumulator that builds its rows.

``min c @ x + offset`` subject to ``row_lo <= A @ x <= row_hi`` and ``col_lo <= x <= col_hi``, some
columns integral: the form in which :mod:`checkmate.solvers.formulation` states the Checkmate MILP and
in which :mod:`checkmate.solvers.backends` hand it to a solver.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import scipy.sparse as sp

__all__ = ["SparseModel", "Rows", "cost_granularity"]

# How far below the truth a solver's proven bound may lie, relative to the objective: the 1e-6
# feasibility and optimality tolerances HiGHS, Gurobi and CP-SAT's LP share by default.
_BOUND_TOLERANCE = 1e-6
# Largest node cost still read as an exact integer: doubles hold every integer up to 2**53, and the
# sum of a schedule's costs must stay exact too, so leave a factor of 2**10 for the sum.
_EXACT_COST_MAX = 2.0**43
# Decimal places tried when looking for a common step of fractional costs (see cost_granularity).
_COST_DECIMALS = 6


@dataclass
class SparseModel:
    """``min c @ x + offset`` s.t. ``row_lo <= A @ x <= row_hi``, ``col_lo <= x <= col_hi``,
    ``x[integer]`` integral. ``objective_scale`` converts ``c @ x + offset`` back into cost units."""

    c: np.ndarray
    offset: float
    A: sp.csr_matrix
    row_lo: np.ndarray
    row_hi: np.ndarray
    col_lo: np.ndarray
    col_hi: np.ndarray
    integer: np.ndarray
    objective_scale: float = 1.0
    # Whether every row coefficient, bound and objective coefficient is integral (CP-SAT needs that).
    integral_rows: bool = False
    # The step between two attainable objective values, in model units, when there is one (integral
    # node costs: their gcd over ``objective_scale``); None when the costs have no common unit.
    objective_granularity: float | None = None

    @property
    def num_cols(self) -> int:
        return int(self.c.shape[0])

    @property
    def num_rows(self) -> int:
        return int(self.A.shape[0])

    def cost_of(self, x: np.ndarray) -> float:
        return float((self.c @ x + self.offset) * self.objective_scale)

    def max_violation(self, x: np.ndarray) -> float:
        """Largest violation of a row or a column bound by ``x`` (0 when feasible)."""
        ax = self.A @ x
        worst = 0.0
        if ax.size:
            worst = max(worst, float(np.max(self.row_lo - ax, initial=0.0)), float(np.max(ax - self.row_hi, initial=0.0)))
        worst = max(worst, float(np.max(self.col_lo - x, initial=0.0)), float(np.max(x - self.col_hi, initial=0.0)))
        return worst

    def relaxed(self) -> "SparseModel":
        return replace(self, integer=np.zeros_like(self.integer))

    @property
    def objective_tolerance(self) -> float:
        """How far a solver's proven bound may sit below the truth, in model units: the usual 1e-6
        feasibility tolerance, relative to the objective (at least the offset, every node once)."""
        return _BOUND_TOLERANCE * max(1.0, abs(float(self.offset)))

    @property
    def proof_abs_gap(self) -> float | None:
        """The absolute gap (model units) below which an incumbent is proven optimal: one objective
        step, less the bound's tolerance; None when the objective has no step or the tolerance
        swallows it (then only the relative gap can prove anything)."""
        if self.objective_granularity is None:
            return None
        gap = self.objective_granularity - self.objective_tolerance
        return gap if gap > 0 else None


def cost_granularity(cost: np.ndarray) -> float | None:
    """The step between attainable schedule costs when the node costs share one: their gcd when they
    are all integers, or integers after shifting the decimal point (up to ``_COST_DECIMALS`` places,
    so 2.5 and 0.75 give 0.25). Every schedule's cost is a multiple of it, so a gap below it proves
    optimality. None when the costs share no such step (profiled times at full precision)."""
    cost = np.asarray(cost, dtype=np.float64)
    positive = cost[cost > 0]
    if positive.size == 0:
        return None
    for places in range(_COST_DECIMALS + 1):
        scaled = positive * 10.0**places
        if scaled.max() > _EXACT_COST_MAX:
            return None
        whole = np.round(scaled)
        # a few units in the last place: the rounding error of the decimal shift, not a real fraction
        if np.all(np.abs(scaled - whole) <= 4 * np.spacing(whole)):
            return float(np.gcd.reduce(whole.astype(np.int64))) / 10.0**places
    return None


class Rows:
    """Accumulates COO triplets; terms on fixed cells are folded into the row bounds."""

    def __init__(self):
        self._r: list[np.ndarray] = []
        self._c: list[np.ndarray] = []
        self._v: list[np.ndarray] = []
        self._lo: list[np.ndarray] = []
        self._hi: list[np.ndarray] = []
        self._const_r: list[np.ndarray] = []
        self._const_v: list[np.ndarray] = []
        self.count = 0

    def new(self, count: int, lo: float, hi: float) -> np.ndarray:
        ids = np.arange(self.count, self.count + count, dtype=np.int64)
        self.count += count
        self._lo.append(np.full(count, lo, dtype=np.float64))
        self._hi.append(np.full(count, hi, dtype=np.float64))
        return ids

    def term(self, rows: np.ndarray, cols: np.ndarray, coef, fixed_value=None) -> None:
        """Add ``coef * x[cols]`` to ``rows``; where ``cols < 0`` the cell is fixed to ``fixed_value``."""
        rows = np.asarray(rows, dtype=np.int64)
        cols = np.asarray(cols, dtype=np.int64)
        coef = np.broadcast_to(np.asarray(coef, dtype=np.float64), rows.shape)
        var = cols >= 0
        self._r.append(rows[var])
        self._c.append(cols[var])
        self._v.append(coef[var])
        if fixed_value is not None and not np.all(var):
            fixed = np.broadcast_to(np.asarray(fixed_value, dtype=np.float64), rows.shape)[~var]
            self._const_r.append(rows[~var])
            self._const_v.append(coef[~var] * fixed)

    def build(self, num_cols: int) -> tuple[sp.csr_matrix, np.ndarray, np.ndarray]:
        lo = np.concatenate(self._lo) if self._lo else np.zeros(0)
        hi = np.concatenate(self._hi) if self._hi else np.zeros(0)
        if self._const_r:
            const = np.bincount(np.concatenate(self._const_r), weights=np.concatenate(self._const_v),
                                minlength=self.count)
            lo = lo - const
            hi = hi - const
        rows = np.concatenate(self._r) if self._r else np.zeros(0, dtype=np.int64)
        cols = np.concatenate(self._c) if self._c else np.zeros(0, dtype=np.int64)
        vals = np.concatenate(self._v) if self._v else np.zeros(0)
        A = sp.csr_matrix((vals, (rows, cols)), shape=(self.count, num_cols))
        A.sum_duplicates()
        A.eliminate_zeros()
        # Rows left without variables are either satisfied (dropped) or contradictory (kept, so that
        # the solver reports the model infeasible).
        empty = np.diff(A.indptr) == 0
        satisfied = empty & (lo <= 1e-9) & (hi >= -1e-9)
        keep = ~satisfied
        return A[keep], lo[keep], hi[keep]
