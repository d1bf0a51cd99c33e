"""``checkmate max-batch``: the largest batch size each strategy trains within a memory limit
(:mod:`checkmate.analysis.max_batch`), as a table or a JSON list.

TensorFlow is imported when the command runs, not when this module is imported.
"""

from __future__ import annotations

import argparse
import json
import sys

from checkmate.cli._common import EXIT_INFEASIBLE, EXIT_OK, command, path, positive_float, shape, strategy_list
from checkmate.errors import InvalidArgumentError

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    p = sub.add_parser("max-batch", help="the largest batch size each strategy fits in a memory limit")
    p.add_argument("--model", required=True, metavar="NAME")
    p.add_argument("--memory", required=True, metavar="BYTES", help="bytes or 2GiB-style size")
    p.add_argument("--strategies", type=strategy_list, default=None)
    p.add_argument("--input-shape", type=shape, default=None, metavar="H,W,C")
    p.add_argument("--time-limit", type=positive_float, default=None, metavar="S", help="per MILP probe")
    p.add_argument("--cache-dir", type=path, default=None, metavar="DIR",
                   help="keep every probe here, so the same command run again resumes instead of solving again")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=command(run, tensorflow=True, counts_memory=True))


def run(args: argparse.Namespace) -> int:
    from checkmate.analysis.max_batch import (DEFAULT_PROBE_TIME_LIMIT_S, DEFAULT_STRATEGIES, PROBE_MIP_GAP,
                                              search_model)
    from checkmate.analysis.point_cache import PointCache
    from checkmate.solvers import format_bytes, get_strategy, parse_budget

    memory_bytes = parse_budget(args.memory)
    if "%" in str(args.memory):
        raise InvalidArgumentError("--memory must be an absolute size (bytes, 2GiB, 16GB), not a percentage")
    strategies = args.strategies or list(DEFAULT_STRATEGIES)
    for s in strategies:
        get_strategy(s)
    # A MILP probe only has to show that some schedule meets both limits or that none does, not to find
    # the optimum; a per-probe time limit bounds the few that need long branch and bound (they are then
    # reported as undecided, never as fitting).
    time_limit = args.time_limit if args.time_limit is not None else DEFAULT_PROBE_TIME_LIMIT_S
    cache = PointCache(args.cache_dir) if args.cache_dir else None
    results = search_model(args.model, memory_bytes, strategies, input_shape=args.input_shape,
                           time_limit_s=time_limit, progress=sys.stderr.isatty(), mip_gap=PROBE_MIP_GAP,
                           cache=cache)
    fits = any(r.max_batch_size > 0 for r in results)
    if args.json:
        print(json.dumps([r.to_json_dict() for r in results], allow_nan=False))
        return EXIT_OK if fits else _nothing_fits(memory_bytes, results)
    print(f"model {args.model}: memory limit {format_bytes(memory_bytes)}; at most one extra forward pass")
    base = next((r.max_batch_size for r in results if r.strategy == "checkpoint_all"), None)
    width = max(len(r.strategy) for r in results)
    for r in results:
        rel = f"  ({r.max_batch_size / base:.2f}x checkpoint-all)" if base else ""
        detail = ""
        if r.final is not None:
            detail = f"  peak {format_bytes(r.final.peak_memory_bytes)}, overhead {r.final.overhead:.3f}x"
        if r.measured and "peak_memory_bytes" in r.measured:
            detail += f"; measured peak {format_bytes(r.measured['peak_memory_bytes'])}"
        elif r.measured:
            detail += f"; {r.measured.get('status')}"
        if r.is_lower_bound:
            detail += (f"; at least: probes at {', '.join(map(str, r.undecided))} reached the time limit "
                       "undecided (raise --time-limit)")
        if r.search_limit_reached:
            detail += f"; memory did not bind up to the search limit {r.search_limit}: the maximum may be larger"
        print(f"  {r.strategy:<{width}}  max batch {r.max_batch_size:>6}{rel}{detail}")
    return EXIT_OK if fits else _nothing_fits(memory_bytes, results)


def _nothing_fits(memory_bytes: int, results) -> int:
    """Not even batch size 1 fits with any strategy: the infeasible-budget exit, with its one line."""
    print(f"checkmate: infeasible budget: no strategy ({', '.join(r.strategy for r in results)}) fits batch size 1 "
          f"in {memory_bytes} bytes", file=sys.stderr)
    return EXIT_INFEASIBLE
