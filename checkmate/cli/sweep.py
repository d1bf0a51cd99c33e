"""``checkmate sweep``: every strategy over a grid of budgets for a graph file or a zoo model; writes the
CSV, JSON and plot of :func:`checkmate.analysis.sweep.write_sweep` and prints a summary per strategy.

TensorFlow is imported only for ``--model``, when the command runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from checkmate.cli._common import (EXIT_OK, add_mip_gap, command, path, positive_float, positive_int, shape,
                                   strategy_list)
from checkmate.errors import InvalidArgumentError

__all__ = ["add_parser", "run", "PARTIAL_CSV"]

# Where an interrupted sweep keeps the rows it finished (sweep.csv stays the last complete sweep's).
PARTIAL_CSV = "sweep.partial.csv"


def add_parser(sub) -> None:
    p = sub.add_parser("sweep", help="every strategy over a grid of budgets: CSV + plot")
    p.add_argument("graph", type=path, nargs="?", metavar="GRAPH.json")
    p.add_argument("--model", metavar="NAME")
    p.add_argument("--batch-size", type=positive_int)
    p.add_argument("--input-shape", type=shape, default=None, metavar="H,W,C")
    p.add_argument("--level", choices=("layer", "op"), default="layer", help="with --model: graph granularity")
    p.add_argument("--cost-model", choices=("profile", "flops"), default="flops",
                   help="with --model: profiled op times on this device, or FLOP counts (default)")
    p.add_argument("--out", type=path, required=True, metavar="DIR")
    p.add_argument("--strategies", type=strategy_list, default=None)
    p.add_argument("--budgets", type=positive_int, default=10, metavar="N")
    p.add_argument("--time-limit", type=positive_float, default=None, metavar="S")
    p.add_argument("--solver", default=None)
    add_mip_gap(p)
    p.add_argument("--executor", choices=("process", "ray", "serial"), default="process")
    p.add_argument("--workers", type=positive_int, default=None)
    p.add_argument("--cache-dir", type=path, metavar="DIR", default=None,
                   help="keep each solve's result in DIR as it finishes and reuse those found there (same graph, "
                        "strategy, budget and solver options): an interrupted sweep run again solves only the "
                        "points it had not finished (default: no cache)")
    p.set_defaults(handler=command(run, tensorflow=lambda args: bool(args.model)))


def _graph_from_args(args: argparse.Namespace):
    from checkmate.graph import load_graph

    if args.graph and args.model:
        raise InvalidArgumentError("give either GRAPH.json or --model, not both")
    if args.graph:
        if args.batch_size is not None:
            raise InvalidArgumentError("--batch-size applies to --model only")
        return load_graph(args.graph)
    if not args.model:
        raise InvalidArgumentError("give a graph file or --model NAME --batch-size B")
    if args.batch_size is None:
        raise InvalidArgumentError("--model needs --batch-size")
    from checkmate.analysis.models import extract_graph

    return extract_graph(args.model, args.batch_size, input_shape=args.input_shape,
                         level=getattr(args, "level", "layer"), cost_model=getattr(args, "cost_model", "flops"))


def run(args: argparse.Namespace) -> int:
    from checkmate.analysis.sweep import SweepInterrupted, sweep, write_sweep, write_sweep_rows
    from checkmate.io import output_target, refuse_input_as_output
    from checkmate.solvers import format_bytes
    from checkmate.solvers.registry import STRATEGIES

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise InvalidArgumentError(f"--out {args.out!r} is not a directory")
    for name in ("sweep.csv", "sweep.json", "sweep.png"):
        refuse_input_as_output(out / name, args.graph)
        output_target(out / name)  # refuse unwritable targets before the solves, not after
    refuse_input_as_output(out / PARTIAL_CSV, args.graph)
    graph = _graph_from_args(args)
    try:
        result = sweep(graph, args.strategies, budgets=args.budgets, solver=args.solver,
                       time_limit_s=args.time_limit, mip_gap=args.mip_gap, executor=args.executor,
                       workers=args.workers, cache_dir=args.cache_dir,
                       progress=sys.stderr.isatty() or bool(os.environ.get("CHECKMATE_PROGRESS")))
    except SweepInterrupted as exc:
        # the finished solves are kept, apart from the complete sweep files of an earlier run
        if not exc.rows:
            raise KeyboardInterrupt() from None
        partial = write_sweep_rows(exc.rows, out / PARTIAL_CSV)
        resume = f"; run again to resume from {args.cache_dir}" if args.cache_dir else ""
        raise KeyboardInterrupt(f"{len(exc.rows)} complete rows written to {partial}{resume}") from None
    paths = write_sweep(result, args.out)
    print(f"graph {graph.name}: {graph.n} nodes; budgets {format_bytes(result.budgets[0])} .. "
          f"{format_bytes(result.budgets[-1])} ({len(result.budgets)} points); "
          f"{len(result.strategies)} strategies in {result.wall_seconds:.1f} s")
    width = max(len(s) for s in result.strategies)
    for name in result.strategies:
        rows = [r for r in result.rows_for(name) if r.feasible and r.overhead is not None]
        failed = sum(1 for r in result.rows_for(name) if r.feasible is None)
        if rows:
            first = rows[0]
            text = (f"feasible from {format_bytes(first.budget_bytes)}, overhead {first.overhead:.3f}x there, "
                    f"{rows[-1].overhead:.3f}x at {format_bytes(rows[-1].budget_bytes)}")
        elif STRATEGIES[name].bound_only:
            bounds = [r for r in result.rows_for(name) if r.lower_bound is not None]
            text = f"bounds at {len(bounds)} budgets"
        else:
            text = "no feasible budget in the grid"
        if failed:
            text += f"; solver failed at {failed} budgets"
        print(f"  {name:<{width}}  {text}")
    for kind in ("csv", "png", "json"):
        print(f"  {kind:<4} {paths[kind]}")
    return EXIT_OK
