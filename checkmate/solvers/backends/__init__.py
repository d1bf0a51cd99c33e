"""Solver backends for the backend-neutral :class:`~checkmate.solvers.sparse_model.SparseModel`.

Each backend is a small :class:`~checkmate.solvers.backends.base.Backend` subclass with capability
attributes, a lazy import and a status map (in the manner of cvxpy's solver layer). All of them answer with a :class:`BackendResult` whose ``status`` is
one of:

* ``"optimal"``      proven optimal within the requested relative MIP gap (or an LP optimum);
* ``"feasible"``     stopped (time limit) with an incumbent; ``bound`` says how far it may be off;
* ``"no_solution"``  stopped (time limit) before any solution was found: *not* a proof of anything;
* ``"infeasible"``   the solver proved that no solution exists.

Anything else — a crash, a numerical failure, a status the backend does not know — raises
:class:`~checkmate.errors.SolverError`; it is never reported as infeasibility. A missing package or a
licence that refuses the model raises :class:`~checkmate.errors.BackendUnavailableError` with a
one-line message naming what to use instead.

Names accepted by :func:`get_backend`:

``None`` or ``"highs"``  HiGHS through highspy directly: the default. The same solver cvxpy would
                         call, without cvxpy's canonicalisation (seconds on 300-node graphs) and
                         with the MIP start, which cvxpy does not pass on to HiGHS;
``"cvxpy"``              cvxpy with its default MILP solver, HiGHS;
``"gurobi"``             gurobipy directly;
``"ortools"``            OR-Tools CP-SAT (needs an integral model);
an upper-case cvxpy solver name (``"HIGHS"``, ``"SCIPY"``, ``"SCIP"``, ``"GLPK_MI"``, ``"CBC"``,
``"GUROBI"``, ...) selects that MILP-capable solver through cvxpy.
"""

from __future__ import annotations

from checkmate.errors import InvalidArgumentError
from checkmate.solvers.backends.base import (DEFAULT_FALLBACK, FEASIBLE, INFEASIBLE, NO_SOLUTION, OPTIMAL, Backend,
                                             BackendResult, RowSplit, quiet_stdout, split_rows)
from checkmate.solvers.backends.cvxpy_backend import CVXPY_MILP_SOLVERS, CvxpyBackend
from checkmate.solvers.backends.gurobi import GurobiBackend
from checkmate.solvers.backends.highs import HighsBackend
from checkmate.solvers.backends.ortools_backend import CpSatBackend

__all__ = ["BackendResult", "Backend", "RowSplit", "split_rows", "get_backend", "backend_names", "OPTIMAL",
           "FEASIBLE", "NO_SOLUTION", "INFEASIBLE", "DEFAULT_FALLBACK"]

# The backends reached by their own lower-case names. Their modules import their solver's package
# only inside solve(), so importing them here costs nothing.
_DIRECT: dict[str, type[Backend]] = {
    "cvxpy": CvxpyBackend,
    "highs": HighsBackend,
    "gurobi": GurobiBackend,
    "ortools": CpSatBackend,
}


def backend_names() -> list[str]:
    """Accepted names: the direct backends and the MILP-capable cvxpy solvers cvxpy knows of."""
    return list(_DIRECT) + sorted(CVXPY_MILP_SOLVERS)


def get_backend(name: str | None) -> Backend:
    """The backend called ``name`` (see the module docstring); unknown names list the choices."""
    if name is None:
        name = "highs"
    if not isinstance(name, str):
        raise InvalidArgumentError(f"solver must be a name, got {name!r}; choose one of: {', '.join(backend_names())}")
    key = name.strip()
    # lower case names the direct backends, upper case cvxpy's solvers ("highs" vs "HIGHS")
    if key in _DIRECT or (key.lower() in _DIRECT and key.upper() not in CVXPY_MILP_SOLVERS):
        backend = _DIRECT[key.lower()]()
    elif key.upper() in CVXPY_MILP_SOLVERS:
        backend = CvxpyBackend(key.upper())
    else:
        raise InvalidArgumentError(f"unknown solver {name!r}; choose one of: {', '.join(backend_names())}")
    backend.check_available()
    return backend
