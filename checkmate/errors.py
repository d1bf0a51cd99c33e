"""Exception hierarchy.

"No solution exists" (:class:`InfeasibleBudgetError`) is kept apart from "the input is wrong"
(:class:`InvalidGraphError`) and from "a solver broke" (:class:`SolverError`): callers react to each
differently, and the CLI maps each to its own exit code.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CheckmateError",
    "InvalidGraphError",
    "InvalidScheduleError",
    "InfeasibleBudgetError",
    "SolverError",
    "BackendUnavailableError",
    "TimeLimitError",
    "UnsupportedOpError",
    "InvalidArgumentError",
    "InvalidBudgetError",
    "OutputPathError",
    "MissingDependencyError",
]


class CheckmateError(Exception):
    """Base class of every error raised on purpose by checkmate."""


class InvalidGraphError(CheckmateError, ValueError):
    """The graph (or graph file) is malformed: cycles, dangling edges, bad sizes, bad JSON."""


class InvalidScheduleError(CheckmateError, ValueError):
    """A schedule breaks the memory model's rules (an input not resident, a node never computed, ...)."""


class InfeasibleBudgetError(CheckmateError):
    """No schedule of the requested strategy fits the memory budget.

    ``min_feasible_budget_bytes`` is the smallest budget at which the strategy does find a schedule
    (``None`` only when even that could not be established). ``minimum`` is the MILP strategies'
    bracket on that budget (a :class:`checkmate.solvers.bracket.MinimumBudget`, with the schedule that
    fits it), ``None`` for the other strategies.
    """

    budget_bytes: int | None
    min_feasible_budget_bytes: int | None
    strategy: str | None
    minimum: Any

    def __init__(self, message: str, *, budget_bytes: int | None = None,
                 min_feasible_budget_bytes: int | None = None, strategy: str | None = None,
                 minimum: Any = None):
        super().__init__(message)
        self.budget_bytes = budget_bytes
        self.min_feasible_budget_bytes = min_feasible_budget_bytes
        self.strategy = strategy
        self.minimum = minimum


class SolverError(CheckmateError):
    """A solver failed, timed out without any schedule, or returned something unusable."""


class TimeLimitError(SolverError):
    """A strategy reached its time limit before it had a schedule to return."""


class BackendUnavailableError(SolverError):
    """The requested solver backend is not installed or not licensed for this problem."""


class UnsupportedOpError(CheckmateError):
    """A TensorFlow construct that checkmate cannot size or rematerialize (the message names the op)."""


class InvalidArgumentError(CheckmateError, ValueError):
    """A bad argument: unknown strategy or solver name, malformed option."""


class InvalidBudgetError(InvalidArgumentError):
    """A budget that cannot be parsed or is not positive."""


class MissingDependencyError(CheckmateError, ImportError):
    """An optional package that the requested work needs is not installed (the message says what to
    install): TensorFlow and Keras for ``checkmate.tf2``, matplotlib for plots."""


class OutputPathError(InvalidArgumentError):
    """An output path that cannot be written without destroying something: a directory, a device or
    other non-regular file, a read-only file, or a path under a file."""
