"""``checkmate plot``: draw a schedule's R/S matrices above its memory curve
(:func:`checkmate.analysis.plots.plot_schedule`), after checking that it is valid for the graph.
"""

from __future__ import annotations

import argparse

from checkmate.cli._common import EXIT_OK, command, path
from checkmate.errors import InvalidScheduleError

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    p = sub.add_parser("plot", help="draw a schedule's R/S matrices and memory curve")
    p.add_argument("schedule", type=path, metavar="SCHEDULE.json")
    p.add_argument("--graph", type=path, required=True, metavar="GRAPH.json")
    p.add_argument("--out", type=path, required=True, metavar="schedule.png")
    p.set_defaults(handler=command(run))


def run(args: argparse.Namespace) -> int:
    from checkmate.analysis.plots import figure_format, plot_schedule
    from checkmate.graph import load_graph
    from checkmate.io import output_target, refuse_input_as_output
    from checkmate.schedule import load_schedule
    from checkmate.simulate import replay_plan, simulate
    from checkmate.solvers import format_bytes

    refuse_input_as_output(args.out, args.schedule, args.graph)
    figure_format(args.out)
    output_target(args.out)  # refuse a directory, device or read-only file before any work
    graph = load_graph(args.graph)
    schedule = load_schedule(args.schedule, graph)
    _check_node_ids(schedule, graph, args)
    sim = simulate(graph, schedule)
    if not sim.valid:
        raise InvalidScheduleError(f"{args.schedule} is not a valid schedule for {args.graph}: {sim.violations[0]}")
    # The plan is what an executor runs; it is checked on its own, not trusted to match R and S.
    try:
        replay_plan(graph, schedule.plan)
    except InvalidScheduleError as exc:
        raise InvalidScheduleError(f"{args.schedule}: its plan is not valid for {args.graph}: {exc}") from None
    out = plot_schedule(graph, schedule, args.out)
    print(f"{out}: {graph.name}, {schedule.strategy or 'schedule'}, peak {format_bytes(sim.peak_memory_bytes)}, "
          f"{sim.recompute_count} recomputations")
    return EXIT_OK


def _check_node_ids(schedule, graph, args: argparse.Namespace) -> None:
    """A schedule names each position's id in the graph file it was made for; another graph of the same
    size would otherwise be drawn with the wrong schedule."""
    if not schedule.node_ids:
        return
    written = [str(i) for i in schedule.node_ids]
    expected = [str(i) for i in graph.source_ids]
    if written != expected:
        at = next(k for k, (a, b) in enumerate(zip(written, expected)) if a != b)
        raise InvalidScheduleError(f"{args.schedule} was made for another graph than {args.graph}: position {at} "
                                   f"is node {written[at]!r} in the schedule, {expected[at]!r} in the graph")
