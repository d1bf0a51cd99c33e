"""Branch and bound racing the CP-SAT model: when to race, and the race's threading.

The CP-SAT model of :mod:`checkmate.solvers.cp_schedule` runs in a child process beside HiGHS' branch
and bound (the staged driver in :mod:`checkmate.solvers.staged` starts it and feeds it); the first
proof of optimality ends both. This module decides whether a solve races and runs branch and bound in
a worker thread so that the child's proof is taken at once.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

from checkmate.solvers.backends import OPTIMAL, Backend
from checkmate.solvers.cp_schedule import CpSatChild, cp_sat_available
from checkmate.solvers.types import PROVEN_MIP_GAP, SolveOptions

if TYPE_CHECKING:  # pragma: no cover
    from checkmate.graph import Graph

__all__ = ["RACE_MIN_NODES", "CP_LABEL", "race_wanted", "start_race", "race_proved", "beside_race", "cp_gap"]

# Below this size HiGHS proves the optimum before the child has started.
# Measured: experiments/results/README.md, section i.
RACE_MIN_NODES = 20
# CP-SAT stops at its first incumbent within the gap, so a proof asks it for less (exact where its
# objective counts whole cost steps: see ``solve_cp_model``). Measured: experiments/results/README.md, section i.
CP_GAP_SHARE = 0.01
# How results name the CP-SAT model (its schedules and its proofs).
CP_LABEL = "CP-SAT"


def race_wanted(graph: "Graph", options: SolveOptions, backend: Backend) -> bool:
    """Whether branch and bound races the CP-SAT model: ``options.milp.race`` when set, else on graphs
    of at least ``RACE_MIN_NODES`` nodes on a machine with two cores or more. Only a backend whose
    branch and bound can be stopped from outside (``Backend.supports_stop``) races, never for a
    feasibility probe (``mip_gap`` 1), and only when OR-Tools is installed."""
    if options.milp.race is False or not backend.supports_stop or options.mip_gap >= 1.0:
        return False
    if options.milp.race is None and (graph.n < RACE_MIN_NODES or (os.cpu_count() or 1) < 2):
        return False
    return cp_sat_available()


def start_race(graph: "Graph", budget_bytes: int, options: SolveOptions, backend: Backend) -> CpSatChild | None:
    """The child process that builds the CP-SAT model, when a race is wanted and a child can start."""
    if not race_wanted(graph, options, backend):
        return None
    try:
        return CpSatChild(graph, budget_bytes)
    except OSError:   # no child process here: HiGHS alone
        return None


def race_proved(race: CpSatChild) -> bool:
    """Whether the child has proved its answer optimal (at the gap it was asked for)."""
    outcome = race.result()
    return outcome is not None and outcome.status == OPTIMAL


def cp_gap(mip_gap: float) -> float:
    """The relative gap CP-SAT is asked for: a proof is asked to ``CP_GAP_SHARE`` of the gap (see there)."""
    return mip_gap * CP_GAP_SHARE if mip_gap <= PROVEN_MIP_GAP else mip_gap


# How often the caller looks at the child's pipe while branch and bound runs beside it (seconds): a
# proof is taken within this, where HiGHS' own callback noticed it up to seconds late.
# Measured: experiments/results/README.md, section i.
RACE_POLL_S = 0.02


def beside_race(race: CpSatChild, solve):
    """``solve(stop)`` (branch and bound, polling ``stop()`` from its callback) run in a thread while
    this thread watches the child: its result, or None as soon as the child proves optimality.

    HiGHS lets itself be interrupted only between nodes and cut rounds, at times seconds apart; its
    callback alone noticed the child's proof up to seconds late (see ``RACE_POLL_S``). HiGHS releases
    the interpreter lock while it runs, so this thread answers at once; HiGHS stops at its next
    callback, and the HiGHS backend lets no other solve start before it has (see ``backends.highs``).
    Only this thread reads the child's pipe. Ctrl-C here stops HiGHS too.
    """
    stop = threading.Event()
    box: dict = {}

    def work() -> None:
        try:
            box["result"] = solve(stop.is_set)
        except BaseException as exc:   # handed to the caller's thread
            box["error"] = exc

    # not a daemon: the interpreter waits for it at exit (a daemon thread still inside HiGHS when the
    # interpreter shuts down aborts the process from HiGHS' next callback)
    worker = threading.Thread(target=work, name="checkmate-branch-and-bound")
    worker.start()
    try:
        while worker.is_alive():
            if race.result() is None:
                race.wait(RACE_POLL_S)
            else:
                worker.join(RACE_POLL_S)
            if race_proved(race):
                stop.set()
                return None
    except BaseException:
        stop.set()
        raise
    worker.join()
    if "error" in box:
        raise box["error"]
    return box["result"]
