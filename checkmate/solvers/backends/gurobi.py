"""Gurobi through gurobipy directly (matrix API, MIP starts).

pip's gurobipy carries a size-limited licence (2000 variables, 2000 linear constraints); a model over
the limit fails with error 10010, which becomes a one-line BackendUnavailableError naming HiGHS.
"""

from __future__ import annotations

import functools
import time

import numpy as np

from checkmate.errors import BackendUnavailableError, SolverError
from checkmate.solvers.backends.base import (DEFAULT_FALLBACK, FEASIBLE, INFEASIBLE, OPTIMAL, Backend, BackendResult,
                                             require_package, split_rows)
from checkmate.solvers.types import PROVEN_MIP_GAP

__all__ = ["GurobiBackend", "size_limited_licence_refuses"]

_SIZE_LIMIT_ERRNO = 10010   # GRB_ERROR_SIZE_LIMIT_EXCEEDED
# The size-limited licence's caps (variables; linear constraints), from Gurobi's licence terms.
_SIZE_LIMIT = 2000


@functools.lru_cache(maxsize=1)
def _licence_is_size_limited() -> bool:
    """Whether this gurobipy refuses a model just over the size-limited licence's caps."""
    import gurobipy as gp

    env = gp.Env(empty=True)
    env.setParam("OutputFlag", 0)
    env.start()
    try:
        m = gp.Model(env=env)
        m.addMVar(_SIZE_LIMIT + 1)
        m.optimize()
        return False
    except gp.GurobiError as exc:
        return exc.errno == _SIZE_LIMIT_ERRNO
    finally:
        env.dispose()


def size_limited_licence_refuses(model) -> bool:
    try:
        import gurobipy  # noqa: F401
    except ImportError:
        return False
    too_big = model.num_cols > _SIZE_LIMIT or model.num_rows > _SIZE_LIMIT
    return too_big and _licence_is_size_limited()


class GurobiBackend(Backend):
    name = "gurobi"
    label = "gurobi"
    supports_mip_start = True

    def check_available(self) -> None:
        gp = require_package("gurobipy", "gurobipy", self.name)
        try:
            env = gp.Env(empty=True)
            env.setParam("OutputFlag", 0)
            env.start()
            env.dispose()
        except gp.GurobiError as exc:
            raise BackendUnavailableError(f"gurobipy found no usable licence ({exc}); use {DEFAULT_FALLBACK}") from None

    def status_map(self):
        from gurobipy import GRB

        stopped = (GRB.TIME_LIMIT, GRB.INTERRUPTED, GRB.NODE_LIMIT, GRB.ITERATION_LIMIT, GRB.SOLUTION_LIMIT,
                   GRB.WORK_LIMIT)
        # every column is bounded: "or unbounded" can only be infeasible
        return {GRB.OPTIMAL: OPTIMAL, GRB.INFEASIBLE: INFEASIBLE, GRB.INF_OR_UNBD: INFEASIBLE,
                **{status: FEASIBLE for status in stopped}}

    def solve(self, model, *, time_limit_s=None, mip_gap=PROVEN_MIP_GAP, threads=None, verbose=False, mip_start=None,
              **optional):
        self.refuse_unsupported(**optional)
        import gurobipy as gp
        from gurobipy import GRB

        env = gp.Env(empty=True)
        env.setParam("OutputFlag", 1 if verbose else 0)
        env.start()
        try:
            m = gp.Model(env=env)
            if time_limit_s is not None:
                m.Params.TimeLimit = float(max(time_limit_s, 0.01))
            m.Params.MIPGap = float(mip_gap)
            if model.proof_abs_gap is not None:
                m.Params.MIPGapAbs = float(model.proof_abs_gap)
            if threads:
                m.Params.Threads = int(threads)
            vtype = np.where(model.integer, GRB.INTEGER, GRB.CONTINUOUS)
            lo = np.where(np.isfinite(model.col_lo), model.col_lo, -GRB.INFINITY)
            hi = np.where(np.isfinite(model.col_hi), model.col_hi, GRB.INFINITY)
            x = m.addMVar(model.num_cols, lb=lo, ub=hi, vtype=vtype)
            m.setObjective(model.c @ x + float(model.offset), GRB.MINIMIZE)
            A = model.A.tocsr()
            rows = split_rows(model)
            for mask, sense, rhs in ((rows.equal, "=", model.row_hi), (rows.upper, "<", model.row_hi),
                                     (rows.lower, ">", model.row_lo)):
                if mask.any():
                    m.addMConstr(A[mask], x, sense, rhs[mask])
            if mip_start is not None and model.integer.any():
                x.Start = np.asarray(mip_start, dtype=np.float64)
            start = time.perf_counter()
            try:
                m.optimize()
            except gp.GurobiError as exc:
                if exc.errno == _SIZE_LIMIT_ERRNO:
                    raise BackendUnavailableError(
                        f"gurobipy's size-limited licence refuses this model ({model.num_cols} variables, "
                        f"{model.num_rows} rows); use {DEFAULT_FALLBACK}") from None
                raise SolverError(f"Gurobi failed: {exc}") from None
            seconds = time.perf_counter() - start
            status = m.Status
            has_solution = m.SolCount > 0
            values = np.array(x.X, dtype=np.float64) if has_solution else None
            objective = float(m.ObjVal) if has_solution else None
            is_mip = bool(model.integer.any())
            bound = None
            if is_mip:
                try:
                    bound = float(m.ObjBound)
                except (gp.GurobiError, AttributeError):
                    bound = None
            elif status == GRB.OPTIMAL:
                bound = objective
            out = self.outcome(status, has_solution, f"Gurobi stopped with status code {status}")
            return BackendResult(out, values, objective, bound, solver="gurobi", message=f"status {status}",
                                 seconds=seconds)
        finally:
            env.dispose()
