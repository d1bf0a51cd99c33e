"""``checkmate strategies`` and ``checkmate solve``: list the scheduling strategies; schedule a graph file
within a memory budget, with one strategy or all of them side by side.

``solve --json`` prints the fields of docs/design.md §5 (:meth:`checkmate.solvers.SolveResult.to_json_dict`).
"""

from __future__ import annotations

import argparse
import json

from checkmate.cli._common import EXIT_OK, add_mip_gap, command, path, positive_float, stdout_to_stderr
from checkmate.errors import InfeasibleBudgetError, InvalidArgumentError, SolverError

__all__ = ["add_parsers", "run_strategies", "run_solve"]

# The keys of SolveResult.to_json_dict, named in the help so that scripts know what to read.
_JSON_FIELDS = ("graph, nodes, strategy, solver, budget_bytes, feasible, optimal, compute_cost, baseline_cost, "
                    "overhead, peak_memory_bytes, lower_bound, gap, solve_seconds, status")


def add_parsers(sub) -> None:
    p = sub.add_parser("strategies", help="list the scheduling strategies")
    p.add_argument("--json", action="store_true", help="print a JSON list")
    p.set_defaults(handler=command(run_strategies))

    p = sub.add_parser("solve", help="schedule a graph file within a memory budget")
    p.add_argument("graph", type=path, metavar="GRAPH.json")
    p.add_argument("--budget", required=True, help="bytes, 2GiB, 1.5GB or 60%% (of the checkpoint-all peak)")
    p.add_argument("--strategy", default="auto",
                   help="strategy name (see 'checkmate strategies'; default: auto, the exact MILP on small "
                        "graphs and the hierarchical strategy on large ones), or 'all' to compare every strategy")
    p.add_argument("--solver", default=None, help="MILP/LP backend: highs (default), cvxpy, gurobi, ortools, or a cvxpy solver name")
    p.add_argument("--time-limit", type=positive_float, default=None, metavar="S",
                   help="solver time limit in seconds (default: 600)")
    add_mip_gap(p)
    p.add_argument("--json", action="store_true",
                   help=f"print one JSON object with the fields {_JSON_FIELDS} (with --strategy all: a list "
                        "of them, one per strategy)")
    p.add_argument("--out", type=path, default=None, metavar="SCHEDULE.json",
                   help="write the schedule (checkmate-schedule/1); never the input graph file")
    p.set_defaults(handler=command(run_solve))


def run_strategies(args: argparse.Namespace) -> int:
    from checkmate.solvers import STRATEGIES

    if args.json:
        print(json.dumps([{"name": s.name, "budget_aware": s.budget_aware, "description": s.description}
                          for s in STRATEGIES.values()], indent=1))
        return EXIT_OK
    width = max(len(name) for name in STRATEGIES)
    for spec in STRATEGIES.values():
        print(f"{spec.name:<{width}}  {spec.description}")
    return EXIT_OK


def _solve_kwargs(args: argparse.Namespace) -> dict:
    gap = {} if args.mip_gap is None else {"mip_gap": args.mip_gap}
    return {"solver": args.solver, "time_limit_s": args.time_limit, **gap}


def run_solve(args: argparse.Namespace) -> int:
    from checkmate.graph import load_graph
    from checkmate.schedule import save_schedule
    from checkmate.solvers import STRATEGIES, check_solver_name, format_bytes, parse_budget, solve

    if args.strategy != "all" and args.strategy not in STRATEGIES:
        raise InvalidArgumentError(f"unknown strategy {args.strategy!r}; choose one of: {', '.join(STRATEGIES)}, all")
    check_solver_name(args.solver)
    if args.out:
        from checkmate.io import output_target, refuse_input_as_output

        refuse_input_as_output(args.out, args.graph)
        output_target(args.out)  # refuse an unwritable --out before solving; written only on success
    graph = load_graph(args.graph)
    budget_bytes = parse_budget(args.budget, graph)
    if args.strategy == "all":
        return _compare_all(graph, budget_bytes, args)
    try:
        with stdout_to_stderr(args.json):
            result = solve(graph, budget_bytes, strategy=args.strategy, **_solve_kwargs(args))
    except InfeasibleBudgetError as exc:
        if args.json:
            print(json.dumps(_infeasible_json(graph, args.strategy, args.solver, budget_bytes, exc), allow_nan=False))
        raise
    # the whole answer is serialized before any output is written: a result that cannot be shown
    # must not replace an earlier schedule file either
    text = json.dumps(result.to_json_dict(), allow_nan=False) if args.json else None
    if args.out and result.schedule is not None:
        save_schedule(result.schedule, args.out)
    if text is not None:
        print(text)
        return EXIT_OK
    print(f"graph {graph.name}: {graph.n} nodes, {len(graph.edges)} edges; budget {format_bytes(budget_bytes)}")
    print(f"strategy {result.strategy}" + (f" (solver {result.solver})" if result.solver else "") + f": {result.status}")
    if result.compute_cost is not None:
        print(f"  compute cost   {result.compute_cost:.6g}  ({result.overhead:.3f}x of {result.baseline_cost:.6g})")
        print(f"  peak memory    {format_bytes(result.peak_memory_bytes)}  ({result.peak_memory_bytes} bytes)")
    if result.lower_bound is not None:
        gap = result.gap
        print(f"  lower bound    {result.lower_bound:.6g}" + (f"  (gap {gap:.2%})" if gap is not None else ""))
    print(f"  optimal        {'yes (proven)' if result.optimal else 'not proven'}")
    print(f"  solve time     {result.solve_seconds:.3f} s")
    if args.out and result.schedule is not None:
        print(f"  schedule       written to {args.out}")
    return EXIT_OK


def _infeasible_json(graph, strategy, solver, budget_bytes, exc: InfeasibleBudgetError) -> dict:
    from checkmate.solvers.types import json_native

    return json_native({"graph": graph.name, "nodes": graph.n, "strategy": strategy, "solver": solver,
            "budget_bytes": budget_bytes, "feasible": False, "optimal": False, "compute_cost": None,
            "baseline_cost": graph.total_cost, "overhead": None, "peak_memory_bytes": None,
            "lower_bound": None, "gap": None, "solve_seconds": None, "status": "infeasible",
            "min_feasible_budget_bytes": exc.min_feasible_budget_bytes})


def _compare_all(graph, budget_bytes: int, args: argparse.Namespace) -> int:
    """Run every strategy and print one comparison table (the demo's view)."""
    from checkmate.solvers import STRATEGIES, format_bytes, solve

    rows = []
    for name in STRATEGIES:
        try:
            with stdout_to_stderr(args.json):
                r = solve(graph, budget_bytes, strategy=name, **_solve_kwargs(args))
            rows.append(r.to_json_dict())
        except InfeasibleBudgetError as exc:
            rows.append(_infeasible_json(graph, name, args.solver, budget_bytes, exc))
        except SolverError as exc:
            rows.append({"strategy": name, "feasible": None, "status": f"solver failed: {exc}"})
    if args.json:
        print(json.dumps(rows, allow_nan=False))
        return EXIT_OK
    print(f"graph {graph.name}: {graph.n} nodes, {len(graph.edges)} edges; budget {format_bytes(budget_bytes)}")
    print(f"{'strategy':<24} {'overhead':>9} {'peak memory':>14} {'lower bound':>12} {'seconds':>8}  status")
    for row in rows:
        overhead = f"{row['overhead']:.3f}x" if row.get("overhead") is not None else "-"
        bound = f"{row['lower_bound']:.4g}" if row.get("lower_bound") is not None else "-"
        secs = f"{row['solve_seconds']:.2f}" if row.get("solve_seconds") is not None else "-"
        status = row.get("status", "")
        if row.get("feasible") is False and row.get("min_feasible_budget_bytes") is not None:
            status = f"does not fit (needs {format_bytes(row['min_feasible_budget_bytes'])})"
        print(f"{row['strategy']:<24} {overhead:>9} {format_bytes(row.get('peak_memory_bytes')):>14} {bound:>12} "
              f"{secs:>8}  {status}")
    return EXIT_OK
