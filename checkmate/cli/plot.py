"""``checkmate plot``: draw a schedule's R/S matrices above its memory curve
(:func:`checkmate.analysis.plots.plot_schedule`), after checking that it is valid for the graph.
"""

from __future__ import annotations

import argparse

from checkmate.cli._common import EXIT_OK, command
from checkmate.errors import InvalidScheduleError

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    p = sub.add_parser("plot", help="draw a schedule's R/S matrices and memory curve")
    p.add_argument("schedule", metavar="SCHEDULE.json")
    p.add_argument("--graph", required=True, metavar="GRAPH.json")
    p.add_argument("--out", required=True, metavar="schedule.png")
    p.set_defaults(handler=command(run))


def run(args: argparse.Namespace) -> int:
    from checkmate.analysis.plots import plot_schedule
    from checkmate.graph import load_graph
    from checkmate.schedule import load_schedule
    from checkmate.simulate import simulate
    from checkmate.solvers import format_bytes

    graph = load_graph(args.graph)
    schedule = load_schedule(args.schedule, graph)
    sim = simulate(graph, schedule)
    if not sim.valid:
        raise InvalidScheduleError(f"{args.schedule} is not a valid schedule for {args.graph}: {sim.violations[0]}")
    out = plot_schedule(graph, schedule, args.out)
    print(f"{out}: {graph.name}, {schedule.strategy or 'schedule'}, peak {format_bytes(sim.peak_memory_bytes)}, "
          f"{sim.recompute_count} recomputations")
    return EXIT_OK
