"""checkmate: optimal tensor rematerialization for TensorFlow 2.

The public API. Importing this package never imports TensorFlow; ``checkmate.tf2`` does, on first use.
"""

from __future__ import annotations

from checkmate.errors import (
    BackendUnavailableError,
    CheckmateError,
    InfeasibleBudgetError,
    InvalidArgumentError,
    InvalidBudgetError,
    InvalidGraphError,
    InvalidScheduleError,
    SolverError,
    UnsupportedOpError,
)
from checkmate.graph import Graph, GraphBuilder, Node, load_graph, save_graph
from checkmate.schedule import Schedule, load_schedule, minimal_recompute, save_schedule
from checkmate.simulate import SimulationResult, replay_plan, simulate, validate_schedule
from checkmate.solvers import SolveResult, parse_budget, solve, strategy_names

__version__ = "0.1.0"

__all__ = [
    "Graph", "GraphBuilder", "Node", "load_graph", "save_graph",
    "Schedule", "load_schedule", "save_schedule", "minimal_recompute",
    "simulate", "replay_plan", "validate_schedule", "SimulationResult",
    "solve", "SolveResult", "parse_budget", "strategy_names",
    "CheckmateError", "InvalidGraphError", "InvalidScheduleError", "InfeasibleBudgetError", "SolverError",
    "BackendUnavailableError", "UnsupportedOpError", "InvalidArgumentError", "InvalidBudgetError",
    "tf2", "__version__",
]


def __getattr__(name: str):
    # checkmate.tf2 pulls in TensorFlow (~2-3 s, ~670 MB): load it only when asked for.
    if name == "tf2":
        import importlib

        module = importlib.import_module("checkmate.tf2")
        globals()["tf2"] = module
        return module
    raise AttributeError(f"module 'checkmate' has no attribute {name!r}")
