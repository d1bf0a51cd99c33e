"""Any MILP-capable cvxpy solver (HiGHS by default) on the sparse model.

The model enters cvxpy as one vector variable per kind (integral, continuous) and one sparse matrix
per row sense, so cvxpy's canonicalisation stays a handful of sparse products. cvxpy hands no initial
point to HiGHS, so this backend takes no MIP start (the caller keeps its own incumbent instead).
"""

from __future__ import annotations

import math
import time

import numpy as np

from checkmate.errors import BackendUnavailableError, SolverError
from checkmate.solvers.backends.base import (DEFAULT_FALLBACK, FEASIBLE, INFEASIBLE, OPTIMAL, Backend, BackendResult,
                                             quiet_stdout, require_package, split_rows)
from checkmate.solvers.backends.gurobi import size_limited_licence_refuses
from checkmate.solvers.types import PROVEN_MIP_GAP

__all__ = ["CvxpyBackend", "CVXPY_MILP_SOLVERS"]

# MILP-capable solvers cvxpy can drive, with how each takes a time limit t, a relative gap g, an
# absolute gap a (None: the solver's own) and threads th. GLPK_MI and SciPy take no absolute gap.
def _given(key, value):
    return {} if value is None else {key: value}


CVXPY_MILP_SOLVERS = {
    "HIGHS": lambda t, g, a, th: {**_given("time_limit", t), "mip_rel_gap": g, **_given("mip_abs_gap", a),
                                  **_given("threads", th)},
    "SCIPY": lambda t, g, a, th: {"scipy_options": {**_given("time_limit", t), "mip_rel_gap": g}},
    "GUROBI": lambda t, g, a, th: {**_given("TimeLimit", t), "MIPGap": g, **_given("MIPGapAbs", a),
                                   **_given("Threads", th)},
    "SCIP": lambda t, g, a, th: {"scip_params": {**_given("limits/time", t), "limits/gap": g,
                                                 **_given("limits/absgap", a)}},
    "GLPK_MI": lambda t, g, a, th: {**_given("tm_lim", None if t is None else int(t * 1000)), "mip_gap": g},
    "CBC": lambda t, g, a, th: {**_given("maximumSeconds", None if t is None else int(math.ceil(t))),
                                "allowableFractionGap": g, **_given("allowableGap", a)},
    "CPLEX": lambda t, g, a, th: {"cplex_params": {**_given("timelimit", t), "mip.tolerances.mipgap": g,
                                                   **_given("mip.tolerances.absmipgap", a)}},
    "MOSEK": lambda t, g, a, th: {"mosek_params": {**_given("MSK_DPAR_OPTIMIZER_MAX_TIME", t),
                                                   "MSK_DPAR_MIO_TOL_REL_GAP": g,
                                                   **_given("MSK_DPAR_MIO_TOL_ABS_GAP", a)}},
}


class CvxpyBackend(Backend):
    supports_mip_start = False

    def __init__(self, solver: str = "HIGHS"):
        self.solver = solver.upper()
        self.name = "cvxpy"
        self.label = f"cvxpy/{self.solver}"

    def check_available(self) -> None:
        cp = require_package("cvxpy", "cvxpy", self.label)
        if self.solver not in cp.installed_solvers():
            raise BackendUnavailableError(
                f"cvxpy's solver {self.solver} is not installed here; use {DEFAULT_FALLBACK}")

    def status_map(self):
        import cvxpy as cp

        # every column is bounded: "infeasible or unbounded" can only be infeasible
        infeasible_or_unbounded = getattr(cp.settings, "INFEASIBLE_OR_UNBOUNDED", "infeasible_or_unbounded")
        return {cp.OPTIMAL: OPTIMAL, cp.OPTIMAL_INACCURATE: OPTIMAL, cp.USER_LIMIT: FEASIBLE,
                cp.INFEASIBLE: INFEASIBLE, cp.INFEASIBLE_INACCURATE: INFEASIBLE, infeasible_or_unbounded: INFEASIBLE}

    def solve(self, model, *, time_limit_s=None, mip_gap=PROVEN_MIP_GAP, threads=None, verbose=False, mip_start=None,
              **optional):
        self.refuse_unsupported(**optional)
        import cvxpy as cp

        A = model.A.tocsc()
        integer = model.integer
        parts = []
        x_full = []
        cols = {}
        for flag in (True, False):
            idx = np.flatnonzero(integer == flag)
            if idx.size == 0:
                continue
            lo = model.col_lo[idx]
            hi = model.col_hi[idx]
            var = cp.Variable(idx.size, integer=flag, bounds=[lo, hi])
            parts.append((var, A[:, idx], model.c[idx]))
            cols[flag] = (idx, var)
            x_full.append(idx)
        lhs = sum(M @ v for v, M, _ in parts)
        objective = cp.Minimize(sum(c @ v for v, _, c in parts) + model.offset)
        cons = []
        rows = split_rows(model)
        A_rows = model.A.tocsr()
        for mask, kind in ((rows.equal, "eq"), (rows.upper, "le"), (rows.lower, "ge")):
            if not mask.any():
                continue
            sub = [(v, A_rows[mask][:, idx]) for (flag, (idx, v)) in cols.items()]
            expr = sum(M @ v for v, M in sub)
            if kind == "eq":
                cons.append(expr == model.row_hi[mask])
            elif kind == "le":
                cons.append(expr <= model.row_hi[mask])
            else:
                cons.append(expr >= model.row_lo[mask])
        problem = cp.Problem(objective, cons)
        is_mip = bool(integer.any())
        abs_gap = model.proof_abs_gap if is_mip else None
        opts = (CVXPY_MILP_SOLVERS[self.solver](time_limit_s, mip_gap, abs_gap, threads or None)
                if self.solver in CVXPY_MILP_SOLVERS else {})
        if not is_mip:
            opts = {k: v for k, v in opts.items() if k in ("time_limit", "TimeLimit", "threads", "Threads")}
        start = time.perf_counter()
        try:
            with quiet_stdout(not verbose):
                problem.solve(solver=self.solver, verbose=verbose, **opts)
        except cp.error.SolverError as exc:
            hint = self._licence_hint(model)
            if hint:
                raise BackendUnavailableError(f"{self.label} failed: {hint}") from None
            raise SolverError(f"{self.label} failed: {exc}") from None
        seconds = time.perf_counter() - start
        status = problem.status
        x = None
        if status in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE, cp.USER_LIMIT):
            values = [(idx, v.value) for idx, v in cols.values()]
            if all(val is not None for _, val in values):
                x = np.zeros(model.num_cols)
                for idx, val in values:
                    x[idx] = np.asarray(val).ravel()
        bound = None
        stats = problem.solver_stats.extra_stats if problem.solver_stats is not None else None
        if isinstance(stats, dict):
            dual, primal_ok = stats.get("mip_dual_bound"), True
        else:   # HiGHS' info record
            dual = getattr(stats, "mip_dual_bound", None)
            primal_ok = getattr(stats, "primal_solution_status", 2) == 2
        if x is not None and not primal_ok:
            x = None
        if is_mip and dual is not None and np.isfinite(dual):
            # cvxpy hands the constant term to the solver separately; the reported bound omits it
            bound = float(dual) + float(model.offset)
        if not is_mip and status == cp.OPTIMAL and x is not None:
            bound = float(model.c @ x + model.offset)
        objective_value = None if x is None else float(model.c @ x + model.offset)
        out = self.outcome(status, x is not None, f"{self.label} stopped with status {status!r}")
        return BackendResult(out, x, objective_value, bound, solver=self.label, message=str(status), seconds=seconds)

    def _licence_hint(self, model) -> str:
        if self.solver != "GUROBI":
            return ""
        if size_limited_licence_refuses(model):
            return (f"gurobipy's size-limited licence refuses this model ({model.num_cols} variables, "
                    f"{model.num_rows} rows); use {DEFAULT_FALLBACK}")
        return ""
