"""OR-Tools CP-SAT on the same sparse model.

CP-SAT works in exact integer arithmetic: every column becomes an integer variable (FREE cells are
0/1, which loses nothing: the FREE polytope is integral once R and S are) and every row must have
integral coefficients, which :func:`~checkmate.solvers.formulation.build_formulation` guarantees with
``integral_units=True``. The objective may be fractional (CP-SAT's floating-point objective).
The model goes straight into the protocol buffer, without per-term Python objects.
"""

from __future__ import annotations

import time

import numpy as np

from checkmate.errors import BackendUnavailableError, SolverError
from checkmate.solvers.backends.base import (DEFAULT_FALLBACK, FEASIBLE, INFEASIBLE, NO_SOLUTION, OPTIMAL, Backend,
                                             BackendResult, require_package)
from checkmate.solvers.types import PROVEN_MIP_GAP

__all__ = ["CpSatBackend"]

_INT_LIMIT = 2**53   # largest magnitude passed as an integer bound (CP-SAT itself takes int64)


class CpSatBackend(Backend):
    name = "ortools"
    label = "ortools/CP-SAT"
    supports_mip_start = True
    lp_capable = False
    needs_integral_rows = True

    def check_available(self) -> None:
        import sys

        # OR-Tools 9.x and TensorFlow 2.21 ship clashing native protobuf/abseil builds: CP-SAT
        # segfaults in a process that has loaded TensorFlow (observed with ortools 9.15). Refuse
        # cleanly instead of taking the process down.
        if "tensorflow" in sys.modules:
            raise BackendUnavailableError(
                "the OR-Tools backend cannot run in a process that has imported TensorFlow (their native "
                f"libraries clash); solve the graph file with 'checkmate solve --solver ortools' or use {DEFAULT_FALLBACK}")
        require_package("ortools.sat.python.cp_model", "ortools", self.name)

    def status_map(self):
        from ortools.sat.python import cp_model

        return {cp_model.OPTIMAL: OPTIMAL, cp_model.FEASIBLE: FEASIBLE, cp_model.INFEASIBLE: INFEASIBLE,
                cp_model.UNKNOWN: NO_SOLUTION}

    def solve(self, model, *, time_limit_s=None, mip_gap=PROVEN_MIP_GAP, threads=None, verbose=False, mip_start=None,
              **optional):
        self.refuse_unsupported(**optional)
        from ortools.sat.python import cp_model

        if not model.integer.any():
            raise SolverError(f"CP-SAT solves integer models only; for an LP use {DEFAULT_FALLBACK}")
        if not model.integral_rows:
            raise SolverError("CP-SAT needs integral rows; build the formulation with integral_units=True")
        cp = cp_model.CpModel()
        proto = cp.Proto()

        def bound(v, up):
            if not np.isfinite(v):
                return _INT_LIMIT if up else -_INT_LIMIT
            return int(np.floor(v + 1e-9)) if up else int(np.ceil(v - 1e-9))

        for lo, hi in zip(model.col_lo.tolist(), model.col_hi.tolist()):
            proto.variables.add().domain.extend([bound(lo, False), bound(hi, True)])
        A = model.A.tocsr()
        data = np.round(A.data).astype(np.int64).tolist()
        indices = A.indices.tolist()
        ptr = A.indptr.tolist()
        for r, (lo, hi) in enumerate(zip(model.row_lo.tolist(), model.row_hi.tolist())):
            lin = proto.constraints.add().linear
            lin.vars.extend(indices[ptr[r]:ptr[r + 1]])
            lin.coeffs.extend(data[ptr[r]:ptr[r + 1]])
            lin.domain.extend([bound(lo, False), bound(hi, True)])
        nz = np.flatnonzero(model.c)
        obj = proto.floating_point_objective
        obj.vars.extend(nz.tolist())
        obj.coeffs.extend(model.c[nz].tolist())
        obj.offset = float(model.offset)
        if mip_start is not None:
            proto.solution_hint.vars.extend(range(model.num_cols))
            proto.solution_hint.values.extend(np.round(mip_start).astype(np.int64).tolist())

        solver = cp_model.CpSolver()
        if time_limit_s is not None:
            solver.parameters.max_time_in_seconds = float(max(time_limit_s, 0.01))
        solver.parameters.relative_gap_limit = float(mip_gap)
        if model.proof_abs_gap is not None:
            solver.parameters.absolute_gap_limit = float(model.proof_abs_gap)
        solver.parameters.num_workers = int(threads) if threads else 2
        solver.parameters.log_search_progress = bool(verbose)
        start = time.perf_counter()
        status = solver.Solve(cp)
        seconds = time.perf_counter() - start
        response = solver.ResponseProto()
        has_solution = status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
        x = np.array(response.solution, dtype=np.float64) if has_solution else None
        objective = float(model.c @ x + model.offset) if has_solution else None
        bound_value = float(response.best_objective_bound) if has_solution or status == cp_model.UNKNOWN else None
        out = self.outcome(status, has_solution, f"CP-SAT stopped with status {solver.StatusName(status)}: "
                                                 f"{response.solution_info or 'invalid model'}")
        if out == FEASIBLE and ((objective - bound_value) / max(abs(objective), 1e-9) <= mip_gap + 1e-12
                                or model.proof_abs_gap is not None and objective - bound_value <= model.proof_abs_gap):
            out = OPTIMAL    # within the requested gap: solved, as the other backends report it
        return BackendResult(out, x, objective, bound_value, solver=self.label,
                             message=solver.StatusName(status), seconds=seconds)
