"""How the generated step orders its computations: total against partial against none, same plan.

For each model of experiments/wall_clock.py and each budget, one plan is compiled (``checkmate.tf2.compile``
with a budget only) and its step is generated three times from the same schedule:

* ``total``: every computation anchored on the one before it in the plan;
* ``partial``: a computation waits only for what memory needs (the consumers of the frees before it
  that its moment needs, the earlier computations it cannot run beside within the plan's peak, and,
  for a recomputation, one computation its other copies do not wait for); the others run in dataflow
  order, parallel branches in parallel;
* ``none``: no anchor at all (TF's executor picks the order; recomputations may be merged back).

The three and the plain traced step are timed interleaved in one process (median of ``--repeats``, wall
and process CPU time), and each step's peak is measured (bytes allocated above the parameters and batch)
beside the plan's predicted peak. Each order's critical path (the longest path by the plan's node costs
through the data and control edges of its graph) is given as a ratio to the plain step's: a measure of
the parallelism the order keeps that does not depend on the machine's load. Results: experiments/results/step_order.{csv,md,meta.json}.

    python experiments/step_order.py --models transformer,resmlp,unet,cnn --budgets 70%,50%
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")   # byte-exact CPU allocator statistics
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from common import write_csv  # noqa: E402

RESULTS = HERE / "results"
ORDERS = ("total", "partial", "none")
FIELDS = ["model", "budget", "nodes", "recomputations", "predicted_overhead", "predicted_step_peak_bytes", "plain_step_peak_bytes"] + \
    [f"{o}_{what}" for o in ORDERS for what in ("wall_ratio", "cpu_ratio", "step_peak_bytes", "control_inputs",
                                                 "fused_ops", "critical_path_ratio")] + \
    ["plain_fused_ops", "plain_ms", "status"]


def fused_ops(fn, x, y) -> int:
    """Ops TF ran fused (Grappler's remapper, oneDNN: a matrix product or convolution with its bias add
    and activation) in one fresh run of ``fn``."""
    _, executed = fn._executed_names(x, y)
    return sum(1 for kind in executed.values() if "Fused" in kind or "WithBias" in kind)


def control_inputs(fn) -> int:
    return sum(1 for nd in fn.graph_def.node for t in nd.input if t.startswith("^"))


def run(name: str, budget: str, repeats: int, time_limit_s: float | None) -> dict:
    import keras
    import checkmate.tf2 as ct
    from checkmate.solvers.baselines import checkpoint_all_schedule
    from checkmate.tf2.codegen import generate
    from checkmate.tf2.timing import interleaved_times
    from wall_clock import build, loss_fn, random_batch, step_peak

    model, _, xs, ys, classes = build(name)
    x, y = random_batch(xs, ys, classes)
    row = {"model": name, "budget": budget}
    try:
        step = ct.compile(model, loss_fn(), keras.optimizers.SGD(), xs, ys, budget=budget,
                          **({"time_limit_s": time_limit_s} if time_limit_s else {}))
    except Exception as exc:      # an infeasible budget is a row of the table
        row["status"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
        return row
    schedule = step.schedule
    row.update(nodes=step.graph.n, recomputations=int(schedule.recompute_count),
               predicted_overhead=round(step.predicted.overhead, 4),
               predicted_step_peak_bytes=step.predicted.step_peak_bytes)
    if schedule.recompute_count == 0:
        row["status"] = "nothing recomputed"
        return row
    fns = {order: generate(step.lowered, schedule, order) for order in ORDERS}
    flat = fns["total"].flat_args(x, y)
    plain = step.lowered.function
    row["plain_step_peak_bytes"] = step_peak(plain, *flat)
    for order, fn in fns.items():
        row[f"{order}_step_peak_bytes"] = step_peak(fn.call_flat, *flat)
        row[f"{order}_control_inputs"] = control_inputs(fn)
        row[f"{order}_fused_ops"] = fused_ops(fn, x, y)
        row[f"{order}_critical_path_ratio"] = round(fn.rewritten.critical_path_ratio, 3)
    # what the plain step runs: the generated step of a plan that recomputes nothing executes its graph
    row["plain_fused_ops"] = fused_ops(generate(step.lowered, checkpoint_all_schedule(step.graph)), x, y)
    walls, cpus = interleaved_times([*(fn.call_flat for fn in fns.values()), plain], *flat, repeats=repeats)
    for k, order in enumerate(fns):
        row[f"{order}_wall_ratio"] = round(walls[k] / walls[-1], 4)
        row[f"{order}_cpu_ratio"] = round(cpus[k] / cpus[-1], 4)
    row["plain_ms"] = round(walls[-1] * 1e3, 3)
    row["status"] = "ok"
    return row


def markdown(rows: list[dict], meta: dict) -> str:
    mib = lambda v: "-" if v in (None, "") else f"{float(v) / 2 ** 20:.1f}"   # noqa: E731
    x = lambda v: "-" if v in (None, "") else f"{float(v):.3f}x"             # noqa: E731
    lines = ["# Total, partial and no order of the same plan", "",
             f"Command: `{meta['command']}`  ", f"Device: {meta['device']}; started {meta['started']} UTC, "
             f"{meta['seconds']:.0f} s.", "",
             "Ratios to the plain traced step, interleaved in one process, median of the repeats (wall / process "
             "CPU). Peaks in MiB above parameters and batch; `ctrl` counts control inputs in the GraphDef; "
             "`fused` counts the ops TF ran fused (plain step: in brackets); `path` is the order's critical path "
             "(by the plan's node costs, through data and control edges) over the plain step's.", "",
             "| model | budget | recomp. | predicted | peak pred. | plain peak | order | wall | CPU | peak | ctrl | fused "
             "| path |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("status") != "ok":
            lines.append(f"| {r['model']} | {r['budget']} | {r.get('status')} |  |  |  |  |  |  |  |  |  |  |")
            continue
        for order in ORDERS:
            lines.append(f"| {r['model']} | {r['budget']} | {r['recomputations']} | {x(r['predicted_overhead'])} | "
                         f"{mib(r['predicted_step_peak_bytes'])} | {mib(r['plain_step_peak_bytes'])} | {order} | "
                         f"{x(r[f'{order}_wall_ratio'])} | {x(r[f'{order}_cpu_ratio'])} | "
                         f"{mib(r[f'{order}_step_peak_bytes'])} | {r[f'{order}_control_inputs']} | "
                         f"{r.get(f'{order}_fused_ops', '-')} ({r.get('plain_fused_ops', '-')}) | "
                         f"{r.get(f'{order}_critical_path_ratio', '-')} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from wall_clock import MODELS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--budgets", default="70%,50%")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--time-limit", type=float, default=None, metavar="S",
                   help="the solver's time limit per compile (default: checkmate's own default)")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--label", default="step_order", help="file stem of the results")
    args = p.parse_args(argv)
    started = time.time()
    rows = []
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        if name not in MODELS:
            p.error(f"unknown model {name!r}: expected one of {', '.join(MODELS)}")
        for budget in [b.strip() for b in args.budgets.split(",") if b.strip()]:
            row = run(name, budget, args.repeats, args.time_limit)
            rows.append(row)
            print(json.dumps(row), flush=True)
    from checkmate.tf2.profiling import device_description

    write_csv(args.out / f"{args.label}.csv", rows, FIELDS)
    meta = {"command": "python experiments/step_order.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "device": device_description(), "seconds": round(time.time() - started, 1),
            "started": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started))}
    (args.out / f"{args.label}.meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    path = args.out / f"{args.label}.md"
    # a hand-written section headed "## Findings" of the earlier file is kept
    kept = ""
    if path.exists() and "## Findings" in path.read_text():
        old = path.read_text()
        kept = "\n" + old[old.index("## Findings"):]
    path.write_text(markdown(rows, meta) + kept)
    return 0


if __name__ == "__main__":
    sys.exit(main())
