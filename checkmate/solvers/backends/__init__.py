"""Solver backends for the backend-neutral :class:`~checkmate.solvers.formulation.SparseModel`.

Each backend is a small class with capability attributes, a lazy import and a status map (in the
manner of cvxpy's solver layer). All of them answer with a :class:`BackendResult` whose ``status`` is
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

import contextlib
import importlib
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from checkmate.errors import BackendUnavailableError, InvalidArgumentError

if TYPE_CHECKING:  # pragma: no cover
    from checkmate.solvers.formulation import SparseModel

__all__ = ["BackendResult", "Backend", "get_backend", "backend_names", "OPTIMAL", "FEASIBLE", "NO_SOLUTION",
           "INFEASIBLE", "DEFAULT_FALLBACK"]

OPTIMAL = "optimal"
FEASIBLE = "feasible"
NO_SOLUTION = "no_solution"
INFEASIBLE = "infeasible"

# What every "unavailable" message suggests: bundled with cvxpy's requirements, always installed.
DEFAULT_FALLBACK = "solver='highs' (HiGHS, installed with checkmate)"


@dataclass
class BackendResult:
    status: str
    x: np.ndarray | None = None
    objective: float | None = None   # c @ x + offset of the returned x, in model units
    bound: float | None = None       # proven lower bound on the optimum, in model units
    solver: str = ""
    message: str = ""
    seconds: float = 0.0


class Backend:
    """One solver. Subclasses set the attributes and implement :meth:`solve`."""

    name = "backend"
    label = "backend"        # how results name the solver
    mip_capable = True
    lp_capable = True
    supports_mip_start = False
    needs_integral_rows = False

    def check_available(self) -> None:
        """Raise :class:`BackendUnavailableError` if the solver cannot be used here."""

    def solve(self, model: "SparseModel", *, time_limit_s: float | None = None, mip_gap: float = 0.005,
              threads: int | None = None, verbose: bool = False,
              mip_start: np.ndarray | None = None) -> BackendResult:
        raise NotImplementedError


@contextlib.contextmanager
def quiet_stdout(enabled: bool = True):
    """Silence C-level writes to stdout (HiGHS prints a banner when its first instance is made, even
    with output off), so that ``--json`` output stays parseable."""
    if not enabled:
        yield
        return
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:   # no real stdout (embedded interpreters): nothing to protect
        yield
        return
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 1)
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _require(module: str, package: str, name: str):
    try:
        return importlib.import_module(module)
    except ImportError:
        raise BackendUnavailableError(
            f"solver {name!r} needs the {package!r} package, which is not installed "
            f"(pip install {package}); or use {DEFAULT_FALLBACK}") from None


_DIRECT = {
    "cvxpy": ("checkmate.solvers.backends.cvxpy_backend", "CvxpyBackend"),
    "highs": ("checkmate.solvers.backends.highs", "HighsBackend"),
    "gurobi": ("checkmate.solvers.backends.gurobi", "GurobiBackend"),
    "ortools": ("checkmate.solvers.backends.ortools_backend", "CpSatBackend"),
}


def backend_names() -> list[str]:
    """Accepted names: the direct backends and the MILP-capable cvxpy solvers cvxpy knows of."""
    from checkmate.solvers.backends.cvxpy_backend import CVXPY_MILP_SOLVERS

    return list(_DIRECT) + sorted(CVXPY_MILP_SOLVERS)


def get_backend(name: str | None) -> Backend:
    """The backend called ``name`` (see the module docstring); unknown names list the choices."""
    if name is None:
        name = "highs"
    if not isinstance(name, str):
        raise InvalidArgumentError(f"solver must be a name, got {name!r}; choose one of: {', '.join(backend_names())}")
    from checkmate.solvers.backends.cvxpy_backend import CVXPY_MILP_SOLVERS, CvxpyBackend

    key = name.strip()
    # lower case names the direct backends, upper case cvxpy's solvers ("highs" vs "HIGHS")
    if key in _DIRECT or (key.lower() in _DIRECT and key.upper() not in CVXPY_MILP_SOLVERS):
        module, cls = _DIRECT[key.lower()]
        backend = getattr(importlib.import_module(module), cls)()
    elif key.upper() in CVXPY_MILP_SOLVERS:
        backend = CvxpyBackend(key.upper())
    else:
        raise InvalidArgumentError(f"unknown solver {name!r}; choose one of: {', '.join(backend_names())}")
    backend.check_available()
    return backend
