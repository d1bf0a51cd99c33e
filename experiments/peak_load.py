"""Measured step peaks against the plan, on an idle and on a loaded machine, tensors apart from allocator chunks.

For each model of experiments/wall_clock.py and each budget, one plan is compiled (``checkmate.tf2.compile``
with the budget and, by default, the FLOP cost model, so that the schedule does not depend on the machine's
load; ``--cost-model profile`` plans with profiled costs, as compile does by default; ``100%``
is ``checkpoint_all``) and three steps are run: the plain traced step, the generated step as compiled (its
default order) and, for a plan that recomputes, the same plan generated with no order at all (``none``: TF's
executor picks the order), which shows what the order holds. Every run is read from TF's allocation log
(``TF_CPP_VMODULE=log_memory=2``, experiments/step_order.py): ``tensors``, the most bytes the kernels asked
for at once (what the plan predicts), and ``chunks``, the most bytes of the allocator's chunks at once (what
the allocator's peak statistic, and so a measured step peak, counts).

Each step is run ``--runs`` times in each of three phases, in this order:

* ``idle``: nothing started by this script (other processes on the machine keep running);
* ``load``: ``--load`` background processes spinning a matrix product (started here, killed after);
* ``history``: under the same load, after the steps of another model (``--history``, its plain and
  checkpoint-all steps) have run in the process: the allocator's free chunks are then those another
  model's tensors left, as in a process that compiles and times several models one after another.

Results: experiments/results/peak_load.{csv,md,meta.json}.

    python experiments/peak_load.py --models resmlp,transformer --budgets 100%,70%,50% --runs 8
    python experiments/peak_load.py --quick --out /tmp/peak_load
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")   # byte-exact CPU allocator statistics

from common import write_csv, write_run_report  # noqa: E402
from step_order import logged_step_peaks, start_memory_log  # noqa: E402

RESULTS = HERE / "results"
PHASES = ("idle", "load", "history")
FIELDS = ["model", "budget", "strategy", "recomputations", "step", "phase", "runs", "predicted_step_peak_bytes",
          "tensor_peak_max_bytes", "chunk_peak_min_bytes", "chunk_peak_median_bytes", "chunk_peak_max_bytes",
          "load_average", "status"]
# One background process: a matrix product in a loop, one BLAS thread (the load is the number of processes).
SPIN = ("import os\nos.environ['OPENBLAS_NUM_THREADS'] = os.environ['OMP_NUM_THREADS'] = '1'\n"
        "import numpy as np\na = np.random.default_rng(0).random((384, 384))\n"
        "while True:\n    a = a @ a\n    a /= abs(a).max()\n")


class Load:
    """``count`` spinning background processes while the ``with`` block runs."""

    def __init__(self, count: int):
        self.count = count
        self.procs: list[subprocess.Popen] = []

    def __enter__(self):
        self.procs = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(self.count)]
        time.sleep(1.0)          # let them start before the first measured run
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
            p.wait()
        self.procs = []


def measure(fn, flat, runs: int) -> dict:
    """Tensor and chunk peaks of ``runs`` logged runs of ``fn`` (each after a warm-up run)."""
    logged = [logged_step_peaks(fn, *flat) for _ in range(runs)]
    chunks = [r["chunk_peak_bytes"] for r in logged]
    return {"runs": runs, "tensor_peak_max_bytes": max(r["tensor_peak_bytes"] for r in logged),
            "chunk_peak_min_bytes": min(chunks), "chunk_peak_median_bytes": int(statistics.median(chunks)),
            "chunk_peak_max_bytes": max(chunks), "load_average": round(os.getloadavg()[0], 1)}


def compile_steps(name: str, budgets, time_limit_s: float, cost_model: str = "flops") -> list[dict]:
    """Per budget: the compiled plan's steps (name -> flat function) and the row fields they share."""
    import keras
    import checkmate.tf2 as ct
    from checkmate.tf2.codegen import generate
    from wall_clock import build, loss_fn, random_batch

    model, _, xs, ys, classes = build(name)
    x, y = random_batch(xs, ys, classes)
    out = []
    for budget in budgets:
        base = {"model": name, "budget": budget}
        options = {"strategy": "checkpoint_all"} if budget == "100%" else {"time_limit_s": time_limit_s}
        try:
            step = ct.compile(model, loss_fn(), keras.optimizers.SGD(), xs, ys, budget=budget, cost_model=cost_model,
                              **options)
        except Exception as exc:     # an infeasible budget is a row of the table
            out.append({"base": {**base, "status": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"}})
            continue
        flat = step.function.flat_args(x, y)
        steps = {"plain": step.lowered.function, step.function.rewritten.order: step.function.call_flat}
        if step.schedule.recompute_count:
            steps["none"] = generate(step.lowered, step.schedule, "none").call_flat
        base.update(strategy=step.strategy, recomputations=int(step.schedule.recompute_count),
                    predicted_step_peak_bytes=int(step.predicted.step_peak_bytes))
        out.append({"base": base, "steps": steps, "flat": flat})
        print(f"{name} {budget}: {step.strategy}, {base['recomputations']} recomputations, predicted step peak "
              f"{base['predicted_step_peak_bytes'] / 2 ** 20:.1f} MiB", flush=True)
    return out


def run_history(name: str) -> None:
    """Run another model's plain and checkpoint-all steps a few times in this process."""
    import keras
    import checkmate.tf2 as ct
    from wall_clock import build, loss_fn, random_batch

    model, _, xs, ys, classes = build(name)
    x, y = random_batch(xs, ys, classes)
    step = ct.compile(model, loss_fn(), keras.optimizers.SGD(), xs, ys, budget="100%", strategy="checkpoint_all",
                      cost_model="flops")
    step.measure_time(x, y, repeats=5)


def markdown(rows: list[dict], meta: dict) -> str:
    mib = lambda v: "-" if v in (None, "") else f"{float(v) / 2 ** 20:.1f}"   # noqa: E731

    def ratio(v, pred):
        return "-" if v in (None, "") or not pred else f"{float(v) / float(pred):.3f}"

    lines = ["# Measured step peaks against the plan, idle and loaded", "",
             f"Command: `{meta['command']}`  ", f"Device: {meta['device']}; started {meta['started']} UTC, "
             f"{meta['seconds']:.0f} s.", "",
             "Step peaks in MiB above the parameters and batch, from TF's allocation log of each run: `tensors` is "
             "the most bytes the kernels asked for at once (the largest over the runs), `chunks` the most bytes of "
             "the allocator's chunks at once (min / median / max over the runs; what a measured peak counts). "
             "Ratios are to the plan's predicted step peak. `load` is the 1-minute load average after the phase.",
             "",
             "| model | budget | recomp. | step | phase | pred. | tensors | chunks min / med / max | tensors / pred. "
             "| chunks max / pred. | load |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("status") != "ok":
            lines.append(f"| {r['model']} | {r['budget']} | {r.get('status')} |  |  |  |  |  |  |  |  |")
            continue
        pred = r["predicted_step_peak_bytes"]
        lines.append(f"| {r['model']} | {r['budget']} | {r['recomputations']} | {r['step']} | {r['phase']} | "
                     f"{mib(pred)} | {mib(r['tensor_peak_max_bytes'])} | {mib(r['chunk_peak_min_bytes'])} / "
                     f"{mib(r['chunk_peak_median_bytes'])} / {mib(r['chunk_peak_max_bytes'])} | "
                     f"{ratio(r['tensor_peak_max_bytes'], pred) if r['step'] != 'plain' else '-'} | "
                     f"{ratio(r['chunk_peak_max_bytes'], pred) if r['step'] != 'plain' else '-'} | "
                     f"{r['load_average']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="resmlp,transformer")
    p.add_argument("--budgets", default="100%,70%,50%")
    p.add_argument("--runs", type=int, default=8, help="logged runs of each step in each phase")
    p.add_argument("--load", type=int, default=4, help="background processes spinning in the load phases")
    p.add_argument("--history", default="unet", help="the model whose steps run before the history phase")
    p.add_argument("--time-limit", type=float, default=30.0, metavar="S", help="the solver's time limit per compile")
    p.add_argument("--cost-model", default="flops", choices=("flops", "profile"),
                   help="the plans' cost model (default flops: a schedule that does not depend on the load)")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--label", default="peak_load", help="file stem of the results")
    p.add_argument("--quick", action="store_true", help="the residual MLP at 50%% only, 2 runs per phase")
    args = p.parse_args(argv)
    if args.quick:
        args.models, args.budgets, args.runs = "resmlp", "50%", 2

    start_memory_log()        # before TF starts: it reads TF_CPP_VMODULE once
    started = time.time()
    plans = [plan for name in args.models.split(",")
             for plan in compile_steps(name, args.budgets.split(","), args.time_limit, args.cost_model)]
    rows = [dict(plan["base"]) for plan in plans if "steps" not in plan]
    for phase in PHASES:
        if phase == "history":
            run_history(args.history)
        with Load(args.load if phase != "idle" else 0):
            for plan in plans:
                for step_name, fn in plan.get("steps", {}).items():
                    row = {**plan["base"], "step": step_name, "phase": phase, **measure(fn, plan["flat"], args.runs),
                           "status": "ok"}
                    rows.append(row)
                    pred = row["predicted_step_peak_bytes"]
                    print(f"{row['model']} {row['budget']} {step_name} {phase}: tensors "
                          f"{row['tensor_peak_max_bytes'] / pred:.3f}x, chunks {row['chunk_peak_min_bytes'] / pred:.3f}-"
                          f"{row['chunk_peak_max_bytes'] / pred:.3f}x the plan (load {row['load_average']})", flush=True)
    order = {ph: k for k, ph in enumerate(PHASES)}
    rows.sort(key=lambda r: (args.models.split(",").index(r["model"]), args.budgets.split(",").index(r["budget"]),
                             {"plain": 0, "none": 2}.get(r.get("step"), 1), order.get(r.get("phase"), -1)))
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / f"{args.label}.csv", rows, FIELDS)
    write_run_report(args.out, args.label, "peak_load.py", sys.argv[1:] if argv is None else argv, started,
                     lambda meta: markdown(rows, meta))
    print(f"wrote {args.out / args.label}.{{csv,md,meta.json}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
