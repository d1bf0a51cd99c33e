"""The ``checkmate`` command.

Exit codes (DESIGN §5): 0 success, 2 bad input, 3 infeasible budget, 4 solver failure. Every error
path prints exactly one line on stderr; set ``CHECKMATE_DEBUG=1`` to see the traceback instead.
Commands that need TensorFlow import it only when they run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from typing import Callable, Iterator, Sequence

from checkmate.errors import (
    CheckmateError,
    InfeasibleBudgetError,
    InvalidArgumentError,
    InvalidGraphError,
    InvalidScheduleError,
    SolverError,
    UnsupportedOpError,
)

EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_INFEASIBLE = 3
EXIT_SOLVER = 4


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line with exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(p) for p in text.replace("x", ",").split(",") if p.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a shape like 224,224,3, got {text!r}") from None
    if not dims or any(d <= 0 for d in dims):
        raise argparse.ArgumentTypeError(f"expected a shape like 224,224,3, got {text!r}")
    return dims


def _strategy_list(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected a comma-separated list of strategy names")
    return names


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="checkmate", description="Optimal tensor rematerialization for TensorFlow 2.")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("strategies", help="list the scheduling strategies")
    p.add_argument("--json", action="store_true", help="print a JSON list")
    p.set_defaults(handler=_cmd_strategies)

    p = sub.add_parser("solve", help="schedule a graph file within a memory budget")
    p.add_argument("graph", metavar="GRAPH.json")
    p.add_argument("--budget", required=True, help="bytes, 2GiB, 1.5GB or 60%% (of the checkpoint-all peak)")
    p.add_argument("--strategy", default="checkmate_milp",
                   help="strategy name (see 'checkmate strategies'), or 'all' to compare every strategy")
    p.add_argument("--solver", default=None, help="MILP/LP backend: highs (default), cvxpy, gurobi, ortools, or a cvxpy solver name")
    p.add_argument("--time-limit", type=_positive_float, default=None, metavar="S", help="solver time limit in seconds")
    p.add_argument("--json", action="store_true", help="print one JSON object (DESIGN §5 fields)")
    p.add_argument("--out", default=None, metavar="SCHEDULE.json", help="write the schedule (checkmate-schedule/1)")
    p.set_defaults(handler=_cmd_solve)

    p = sub.add_parser("extract", help="lower a Keras model to a training graph file")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", metavar="NAME", help="a model of checkmate.tf2.zoo")
    src.add_argument("--keras-file", metavar="F.keras", help="a saved Keras model")
    p.add_argument("--batch-size", type=_positive_int, required=True)
    p.add_argument("--input-shape", type=_shape, default=None, metavar="H,W,C")
    p.add_argument("--level", choices=("layer", "op"), default="layer")
    p.add_argument("--cost-model", choices=("profile", "flops"), default="profile")
    p.add_argument("--out", required=True, metavar="GRAPH.json")
    p.set_defaults(handler=_lazy("checkmate.tf2.lowering", "cli_extract", tensorflow=True))

    p = sub.add_parser("compile", help="compile a zoo model for a budget, run it and report measured memory")
    p.add_argument("--model", required=True, metavar="NAME")
    p.add_argument("--batch-size", type=_positive_int, default=32)
    p.add_argument("--input-shape", type=_shape, default=None, metavar="H,W,C")
    p.add_argument("--budget", required=True)
    p.add_argument("--strategy", default=None,
                   help="one strategy, or a comma-separated list (default: checkpoint_all, chen_sqrtn, checkmate_milp)")
    p.add_argument("--solver", default=None)
    p.add_argument("--time-limit", type=_positive_float, default=None, metavar="S")
    p.add_argument("--level", choices=("layer", "op"), default="layer")
    p.add_argument("--steps", type=_positive_int, default=3, help="training steps to run and time")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_lazy("checkmate.tf2.compile", "cli_compile", tensorflow=True, counts_memory=True))

    p = sub.add_parser("sweep", help="every strategy over a grid of budgets: CSV + plot")
    p.add_argument("graph", nargs="?", metavar="GRAPH.json")
    p.add_argument("--model", metavar="NAME")
    p.add_argument("--batch-size", type=_positive_int)
    p.add_argument("--input-shape", type=_shape, default=None, metavar="H,W,C")
    p.add_argument("--level", choices=("layer", "op"), default="layer", help="with --model: graph granularity")
    p.add_argument("--cost-model", choices=("profile", "flops"), default="flops",
                   help="with --model: profiled op times on this device, or FLOP counts (default)")
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--strategies", type=_strategy_list, default=None)
    p.add_argument("--budgets", type=_positive_int, default=10, metavar="N")
    p.add_argument("--time-limit", type=_positive_float, default=None, metavar="S")
    p.add_argument("--solver", default=None)
    p.add_argument("--executor", choices=("process", "ray", "serial"), default="process")
    p.add_argument("--workers", type=_positive_int, default=None)
    p.set_defaults(handler=_lazy("checkmate.analysis.sweep", "cli_sweep",
                                       tensorflow=lambda args: bool(args.model)))

    p = sub.add_parser("max-batch", help="the largest batch size each strategy fits in a memory limit")
    p.add_argument("--model", required=True, metavar="NAME")
    p.add_argument("--memory", required=True, metavar="BYTES", help="bytes or 2GiB-style size")
    p.add_argument("--strategies", type=_strategy_list, default=None)
    p.add_argument("--input-shape", type=_shape, default=None, metavar="H,W,C")
    p.add_argument("--time-limit", type=_positive_float, default=None, metavar="S")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_lazy("checkmate.analysis.max_batch", "cli_max_batch", tensorflow=True,
                                 counts_memory=True))

    p = sub.add_parser("plot", help="draw a schedule's R/S matrices and memory curve")
    p.add_argument("schedule", metavar="SCHEDULE.json")
    p.add_argument("--graph", required=True, metavar="GRAPH.json")
    p.add_argument("--out", required=True, metavar="schedule.png")
    p.set_defaults(handler=_lazy("checkmate.analysis.plots", "cli_plot"))
    return parser


def _lazy(module: str, func: str, *, tensorflow: bool | Callable[[argparse.Namespace], bool] = False,
          counts_memory: bool = False) -> Callable[[argparse.Namespace], int]:
    def handler(args: argparse.Namespace) -> int:
        import importlib

        if counts_memory and "tensorflow" not in sys.modules:
            # Commands that measure peaks: TF's default CPU allocator leaves allocations under 256 KiB
            # uncounted; its BFC allocator counts every one. Read once, when TF starts; a value the
            # user set is kept.
            os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
        if tensorflow is True or (callable(tensorflow) and tensorflow(args)):
            _import_tensorflow_quietly()
        return getattr(importlib.import_module(module), func)(args)

    return handler


def _import_tensorflow_quietly() -> None:
    """Import TensorFlow with its C++ start-up log (written straight to fd 2) held back.

    TF 2.21 prints oneDNN and CUDA-probe notices before its logging is configured, so no environment
    variable silences them; they would bury the command's own messages. If the import fails, the held
    back text is shown with the error.
    """
    import tempfile

    if "tensorflow" in sys.modules:
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as held:
        os.dup2(held.fileno(), 2)
        try:
            import tensorflow as tf

            tf.constant(0.0)  # the device probe logs on first use; run it while fd 2 is held
        except BaseException:
            os.dup2(saved, 2)
            held.seek(0)
            sys.stderr.write(held.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


@contextlib.contextmanager
def _stdout_to_stderr(active: bool = True) -> Iterator[None]:
    """Send whatever is written to stdout meanwhile, by Python or by native code, to stderr.

    ``--json`` promises exactly one JSON object on stdout, but solver libraries print banners and
    logs straight to file descriptor 1 (HiGHS announces itself when a model is created). The C
    library's buffer is flushed before fd 1 is restored, so no held-back text lands on stdout later.
    """
    if not active:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        _flush_c_stdio()
        os.dup2(saved, 1)
        os.close(saved)


def _flush_c_stdio() -> None:
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):  # no C library to reach (not a POSIX build): nothing buffered there
        pass


# ------------------------------------------------------------------------------------ handlers
def _cmd_strategies(args: argparse.Namespace) -> int:
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
    return {"solver": args.solver, "time_limit_s": args.time_limit}


def _cmd_solve(args: argparse.Namespace) -> int:
    from checkmate.graph import load_graph
    from checkmate.schedule import save_schedule
    from checkmate.solvers import STRATEGIES, check_solver_name, format_bytes, parse_budget, solve

    if args.strategy != "all" and args.strategy not in STRATEGIES:
        raise InvalidArgumentError(f"unknown strategy {args.strategy!r}; choose one of: {', '.join(STRATEGIES)}, all")
    check_solver_name(args.solver)
    graph = load_graph(args.graph)
    budget_bytes = parse_budget(args.budget, graph)
    if args.strategy == "all":
        return _compare_all(graph, budget_bytes, args)
    try:
        with _stdout_to_stderr(args.json):
            result = solve(graph, budget_bytes, strategy=args.strategy, **_solve_kwargs(args))
    except InfeasibleBudgetError as exc:
        if args.json:
            print(json.dumps(_infeasible_json(graph, args.strategy, args.solver, budget_bytes, exc)))
        raise
    if args.out and result.schedule is not None:
        save_schedule(result.schedule, args.out)
    if args.json:
        print(json.dumps(result.to_json_dict()))
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
    return {"graph": graph.name, "nodes": graph.n, "strategy": strategy, "solver": solver,
            "budget_bytes": budget_bytes, "feasible": False, "optimal": False, "compute_cost": None,
            "baseline_cost": graph.total_cost, "overhead": None, "peak_memory_bytes": None,
            "lower_bound": None, "gap": None, "solve_seconds": None, "status": "infeasible",
            "min_feasible_budget_bytes": exc.min_feasible_budget_bytes}


def _compare_all(graph, budget_bytes: int, args: argparse.Namespace) -> int:
    """Run every strategy and print one comparison table (the demo's view)."""
    from checkmate.solvers import STRATEGIES, format_bytes, solve

    rows = []
    for name in STRATEGIES:
        try:
            with _stdout_to_stderr(args.json):
                r = solve(graph, budget_bytes, strategy=name, **_solve_kwargs(args))
            rows.append(r.to_json_dict())
        except InfeasibleBudgetError as exc:
            rows.append(_infeasible_json(graph, name, args.solver, budget_bytes, exc))
        except SolverError as exc:
            rows.append({"strategy": name, "feasible": None, "status": f"solver failed: {exc}"})
    if args.json:
        print(json.dumps(rows))
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


# ------------------------------------------------------------------------------------ entry point
def _exit_code_for(exc: BaseException) -> int:
    if isinstance(exc, InfeasibleBudgetError):
        return EXIT_INFEASIBLE
    if isinstance(exc, SolverError):
        return EXIT_SOLVER
    if isinstance(exc, (InvalidGraphError, InvalidScheduleError, InvalidArgumentError, UnsupportedOpError,
                        FileNotFoundError, IsADirectoryError, PermissionError)):
        return EXIT_BAD_INPUT
    if isinstance(exc, CheckmateError):
        return EXIT_BAD_INPUT
    return 1


def _describe(exc: BaseException) -> str:
    if isinstance(exc, InfeasibleBudgetError):
        text = str(exc)
        if exc.min_feasible_budget_bytes is not None and "minimum feasible budget" not in text:
            text += f"; minimum feasible budget: {exc.min_feasible_budget_bytes} bytes"
        return f"infeasible budget: {text}"
    if isinstance(exc, (FileNotFoundError, IsADirectoryError, PermissionError)):
        return f"{exc.strerror}: {exc.filename}"
    if isinstance(exc, SolverError):
        return f"solver failed: {exc}"
    if isinstance(exc, CheckmateError):
        return str(exc)
    return f"internal error: {type(exc).__name__}: {exc}"


def main(argv: Sequence[str] | None = None) -> int:
    # TensorFlow's C++ INFO/WARNING logs would bury the command's own one-line messages; a user who
    # wants them can set the variable explicitly.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        from checkmate import __version__

        print(__version__)
        return EXIT_OK
    if not getattr(args, "handler", None):
        parser.print_help()
        return EXIT_BAD_INPUT
    try:
        return int(args.handler(args) or 0)
    except KeyboardInterrupt:
        print("checkmate: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader of stdout went away (``checkmate ... | head``): nothing more can be shown there,
        # and Python would complain again when it flushes stdout at exit
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except Exception as exc:  # one line per error; CHECKMATE_DEBUG=1 shows the traceback
        if os.environ.get("CHECKMATE_DEBUG"):
            raise
        print(f"checkmate: {_describe(exc)}", file=sys.stderr)
        return _exit_code_for(exc)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
