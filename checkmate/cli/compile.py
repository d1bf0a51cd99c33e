"""``checkmate compile``: compile a zoo model or a saved ``.keras`` model for a budget with each
strategy, run it, and report the predicted and measured peak memory, the step time and the gradients'
difference from the plain step. ``--save-plan`` writes the best strategy's plan, which
``RematModel(model, plan=path)`` and ``checkmate.tf2.compile(..., plan=path)`` train with, without solving.

TensorFlow is imported when the command runs, not when this module is imported.
"""

from __future__ import annotations

import argparse
import json
import sys

from checkmate.cli._common import (EXIT_INFEASIBLE, EXIT_OK, EXIT_SOLVER, add_mip_gap, command, positive_float,
                                   positive_int, shape, stdout_to_stderr)
from checkmate.cli.user_model import CUSTOM_OBJECTS_HELP, is_model_file, load_custom_objects, load_keras_file

__all__ = ["add_parser", "run", "exit_code", "DEFAULT_STRATEGIES"]

# Compared when --strategy is not given: no recomputation, the classic heuristic, the optimum.
DEFAULT_STRATEGIES = ("checkpoint_all", "chen_sqrtn", "auto")


def add_parser(sub) -> None:
    p = sub.add_parser("compile", help="compile a zoo model or a .keras file for a budget, run it and report "
                                       "measured memory")
    p.add_argument("--model", required=True, metavar="NAME",
                   help="a model of checkmate.tf2.zoo, or a saved .keras file compiled with its loss (any number "
                        "of inputs and outputs; input shapes from the model)")
    p.add_argument("--custom-objects", metavar="MODULE:ATTR", default=None, help=CUSTOM_OBJECTS_HELP)
    p.add_argument("--batch-size", type=positive_int, default=32)
    p.add_argument("--input-shape", type=shape, default=None, metavar="H,W,C")
    p.add_argument("--budget", required=True)
    p.add_argument("--strategy", default=None,
                   help="one strategy, or a comma-separated list (default: checkpoint_all, chen_sqrtn, auto)")
    p.add_argument("--solver", default=None)
    p.add_argument("--time-limit", type=positive_float, default=None, metavar="S")
    add_mip_gap(p)
    p.add_argument("--level", choices=("auto", "layer", "op"), default="auto",
                   help="graph granularity (default auto: nested models and composite layers looked into)")
    p.add_argument("--fused-batch-norm", action="store_true",
                   help="run BatchNormalization on TensorFlow's fused kernel (a smaller backward working set; "
                        "results equal Keras' to rounding)")
    p.add_argument("--steps", type=positive_int, default=3, help="training steps to run and time")
    p.add_argument("--save-plan", metavar="PLAN.json", default=None,
                   help="write the plan of the strategy with the least predicted overhead, for the step as "
                        "RematModel trains it (sample weights as an input): RematModel(model, plan=PLAN.json) "
                        "and checkmate.tf2.compile(..., plan=PLAN.json) train with it without solving")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=command(run, tensorflow=True, counts_memory=True))


def run(args: argparse.Namespace) -> int:
    """Lower a zoo model or a .keras file, profile, solve, generate, run and report per strategy."""
    from checkmate.io import output_target
    from checkmate.solvers import format_bytes, get_strategy
    from checkmate.tf2 import zoo
    from checkmate.tf2.lowering import lower
    from checkmate.tf2.measure import allocator_note, compare_strategies

    strategies = ([s.strip() for s in args.strategy.split(",") if s.strip()] if args.strategy
                  else list(DEFAULT_STRATEGIES))
    for name in strategies:
        get_strategy(name)
    if args.save_plan:
        output_target(args.save_plan)   # an unwritable path is refused before the model is built
    custom_objects = load_custom_objects(args.custom_objects)
    compiled: dict = {}
    # --json promises one JSON object on stdout; solver libraries print banners to fd 1.
    with stdout_to_stderr(args.json):
        if is_model_file(args.model):
            built = load_keras_file(args.model, args.batch_size, args.input_shape, custom_objects)
        else:
            built = zoo.build_model(args.model, args.batch_size, args.input_shape)
        loss, label_spec = built.loss, built.label_spec
        if args.save_plan:
            loss, label_spec = _as_remat_model_trains(built.model, loss, label_spec, args.batch_size)
        lowered = lower(built.model, loss, built.input_spec, label_spec, level=args.level,
                        gradient_nodes=True, cost_model="profile", progress=False,
                        fused_batch_norm=args.fused_batch_norm)
        report = compare_strategies(lowered, built.model, loss, strategies, args.budget, solver=args.solver,
                                    time_limit_s=args.time_limit, mip_gap=args.mip_gap, steps=args.steps,
                                    compiled=compiled)
    if args.save_plan:
        _save_best_plan(args, lowered, report, compiled)
    report["model"] = args.model
    report["batch_size"] = args.batch_size
    report["allocator_note"] = allocator_note(report["device"])
    if args.json:
        from checkmate.solvers.types import json_native

        # measurements come from numpy and TensorFlow: plain values, serialized whole before printing
        print(json.dumps(json_native(report), allow_nan=False))
        return exit_code(report["rows"])
    plain = report["plain"]
    print(f"{args.model} (batch {args.batch_size}, {report['level']} level, {report['nodes']} nodes) on "
          f"{report['device']}; parameters and batch {format_bytes(report['resident_bytes'])} not counted below")
    print(f"accounting: {report['accounting']}")
    print(f"cost model: {report['cost_model']}")
    for k, line in enumerate(lowered.metadata.get("split_layers") or ()):
        print(("split: " if k == 0 else "       ") + line)
    print(f"budget: {report['budget_reference']}")
    print(f"plain step: measured peak {format_bytes(plain['measured_peak_bytes'])} (checkpoint-all predicted "
          f"{format_bytes(plain['predicted_peak_bytes'])}, a budget of "
          f"{format_bytes(plain['checkpoint_all_budget_bytes'])} with parameters and batch), "
          f"{plain['step_seconds'] * 1e3:.1f} ms")
    if report["allocator_note"]:
        print(f"note: {report['allocator_note']}")
    # the measured step-time ratio (interleaved with the plain step) beside the predicted overhead
    header = (f"{'strategy':<22} {'pred. peak':>11} {'meas. peak':>11} {'meas/pred':>9} {'pred. ovh':>9} "
              f"{'time/plain':>10} {'max |dgrad|':>11}")
    print(header)
    for row in report["rows"]:
        if row["status"] == "infeasible":
            need = row["min_feasible_budget_bytes"]
            step_need = f" (step peak {format_bytes(need - report['resident_bytes'])})" if need is not None else ""
            print(f"{row['strategy']:<22} does not fit: needs a budget of {format_bytes(need)}{step_need}")
            continue
        if row["status"] != "ok":
            print(f"{row['strategy']:<22} {row['status']}")
            continue
        ratio = f"{row['measured_over_predicted']:.2f}" if row["measured_over_predicted"] is not None else "-"
        print(f"{row['strategy']:<22} {format_bytes(row['predicted_peak_bytes']):>11} "
              f"{format_bytes(row['measured_peak_bytes']):>11} {ratio:>9} {row['predicted_time_overhead']:>8.2f}x "
              f"{row['time_over_plain']:>9.2f}x {row['max_grad_diff']:>11.2e}")
    return exit_code(report["rows"])


def _as_remat_model_trains(model, loss, label_spec, batch_size: int):
    """The loss and label spec of the step ``RematModel`` compiles: labels paired with per-sample
    weights, each output's loss weighing and reducing its values as Keras does."""
    from checkmate.tf2 import losses
    from checkmate.tf2.keras_model import RematModel

    # RematModel differentiates Keras' own compiled loss: compile one for this model and loss (only
    # its loss is used here)
    trainer = RematModel(model)
    trainer.compile(loss=loss)
    return losses.step_loss(trainer), (label_spec, losses.weight_spec(None, batch_size))


def _save_best_plan(args: argparse.Namespace, lowered, report: dict, compiled: dict) -> None:
    """Write the plan of the strategy with the least predicted overhead (nothing when none fits: the
    exit code says why)."""
    from checkmate.tf2.plan_cache import save_plan

    ok = [row for row in report["rows"] if row["status"] == "ok" and row["strategy"] in compiled]
    if not ok:
        return
    best = min(ok, key=lambda row: row["predicted_overhead"])
    step = compiled[best["strategy"]]
    save_plan(args.save_plan, lowered.graph, step.result, model=args.model, batch_size=args.batch_size,
              level=args.level, fused_batch_norm=bool(args.fused_batch_norm), predictions=False,
              budget=str(args.budget), budget_bytes=int(step.predicted.budget_bytes))
    report["plan"] = {"path": args.save_plan, "strategy": best["strategy"],
                      "predicted_overhead": best["predicted_overhead"]}
    if not args.json:
        print(f"plan of {best['strategy']} ({best['predicted_overhead']:.3f}x) written to {args.save_plan}",
              file=sys.stderr)


def exit_code(rows: list[dict]) -> int:
    """Success when some strategy ran; else infeasible if every strategy was (naming the least budget
    any of them needs), solver failure otherwise; the failure is told in one line on stderr."""
    if any(row["status"] == "ok" for row in rows):
        return EXIT_OK
    needs = [row["min_feasible_budget_bytes"] for row in rows
             if row["status"] == "infeasible" and row.get("min_feasible_budget_bytes") is not None]
    if rows and all(row["status"] == "infeasible" for row in rows):
        least = f"; minimum feasible budget: {min(needs)} bytes" if needs else ""
        print(f"checkmate: infeasible budget: no strategy fits{least}", file=sys.stderr)
        return EXIT_INFEASIBLE
    print("checkmate: solver failed: no strategy produced a schedule", file=sys.stderr)
    return EXIT_SOLVER
