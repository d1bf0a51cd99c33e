"""What every solver backend shares: the result type and its statuses, the abstract :class:`Backend`
(capabilities, a status map, the one translation of a solver's status), the split of the model's
rows by sense, and the helpers for optional packages and noisy native libraries.
"""

from __future__ import annotations

import abc
import contextlib
import importlib
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np

from checkmate.errors import BackendUnavailableError, InvalidArgumentError, SolverError
from checkmate.solvers.types import PROVEN_MIP_GAP

if TYPE_CHECKING:  # pragma: no cover
    from checkmate.solvers.sparse_model import SparseModel

__all__ = ["BackendResult", "Backend", "RowSplit", "split_rows", "quiet_stdout", "require_package",
           "OPTIMAL", "FEASIBLE", "NO_SOLUTION", "INFEASIBLE", "DEFAULT_FALLBACK"]

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


class Backend(abc.ABC):
    """One solver: capability attributes, availability check, status map and :meth:`solve`.

    The capability flags say which of :meth:`solve`'s optional arguments a backend honours; callers
    read the flags (never the backend's name) and pass only what is supported. A backend given an
    argument it does not support refuses it (:meth:`refuse_unsupported`).
    """

    name = "backend"
    label = "backend"        # how results name the solver
    mip_capable = True
    lp_capable = True
    supports_mip_start = False       # mip_start: an incumbent to start branch and bound from
    needs_integral_rows = False
    supports_stop = False            # stop(): polled during branch and bound; True ends the solve
    reports_bounds = False           # on_bounds(best, bound): called during branch and bound
    supports_cutoff = False          # cutoff (prune above it) and target (stop at an incumbent at or below it)
    takes_solver_options = False     # solver_options: the solver's own options by name

    @abc.abstractmethod
    def check_available(self) -> None:
        """Raise :class:`BackendUnavailableError` if the solver cannot be used here."""

    @abc.abstractmethod
    def status_map(self) -> Mapping[Any, str]:
        """The solver's own final statuses that checkmate understands, each mapped to OPTIMAL,
        FEASIBLE (stopped by a limit: :meth:`outcome` makes it NO_SOLUTION without an incumbent),
        INFEASIBLE or NO_SOLUTION. Read once the solver's package is imported."""

    @abc.abstractmethod
    def solve(self, model: "SparseModel", *, time_limit_s: float | None = None, mip_gap: float = PROVEN_MIP_GAP,
              threads: int | None = None, verbose: bool = False, mip_start: np.ndarray | None = None,
              cutoff: float | None = None, target: float | None = None, stop: Callable[[], bool] | None = None,
              on_bounds: Callable[[float, float], None] | None = None,
              solver_options: Mapping[str, Any] | None = None) -> BackendResult:
        """Solve ``model`` (an LP when nothing is integral). The solver stops at the relative gap
        ``mip_gap`` or, when the model's objective moves in steps, at an absolute gap below one step
        (``model.proof_abs_gap``): either way the incumbent is then proven within that gap.

        Optional, where the capability flags say so (objective values in the model's units):
        ``cutoff``: no solution above it is wanted, so "infeasible" means none at or below it;
        ``target``: stop at the first incumbent at or below it; ``stop``: polled during branch and
        bound, the solve ends (feasible or no_solution) once it returns True; ``on_bounds(best,
        bound)``: called from there with the incumbent's objective and the proven bound (infinite
        while unknown); ``solver_options``: the solver's own options by name."""

    def refuse_unsupported(self, *, cutoff=None, target=None, stop=None, on_bounds=None,
                           solver_options=None) -> None:
        """Raise :class:`InvalidArgumentError` for an optional argument of :meth:`solve` that this
        backend does not support (see the capability flags)."""
        given = {"cutoff": (cutoff, self.supports_cutoff), "target": (target, self.supports_cutoff),
                 "stop": (stop, self.supports_stop), "on_bounds": (on_bounds, self.reports_bounds),
                 "solver_options": (solver_options, self.takes_solver_options)}
        refused = [name for name, (value, supported) in given.items() if value is not None and not supported]
        if refused:
            raise InvalidArgumentError(f"solver {self.label!r} does not support {', '.join(refused)}; "
                                       f"use {DEFAULT_FALLBACK}")

    def outcome(self, status: Any, has_solution: bool, unknown_message: str) -> str:
        """The status a result reports for the solver's ``status``; an unmapped status raises
        :class:`SolverError` with ``unknown_message``, and so does an optimum without a solution."""
        out = self.status_map().get(status)
        if out is None:
            raise SolverError(unknown_message)
        if out == FEASIBLE and not has_solution:
            return NO_SOLUTION
        if out == OPTIMAL and not has_solution:
            raise SolverError(f"{self.label} reported an optimum without a solution")
        return out


@dataclass(frozen=True)
class RowSplit:
    """Masks over the rows of a model by sense, for solvers that take one sense per constraint block."""

    equal: np.ndarray    # row_lo == row_hi: A x == row_hi
    upper: np.ndarray    # the others with a finite row_hi: A x <= row_hi
    lower: np.ndarray    # the others with a finite row_lo: A x >= row_lo (a ranged row is in both)


def split_rows(model: "SparseModel") -> RowSplit:
    equal = model.row_lo == model.row_hi
    return RowSplit(equal, ~equal & np.isfinite(model.row_hi), ~equal & np.isfinite(model.row_lo))


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


def require_package(module: str, package: str, name: str):
    """Import ``module`` or raise :class:`BackendUnavailableError` naming ``package`` and the fallback."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise BackendUnavailableError(
            f"solver {name!r} needs the {package!r} package, which is not installed "
            f"(pip install {package}); or use {DEFAULT_FALLBACK}") from None
