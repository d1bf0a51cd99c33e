"""Predicted against measured step time on downloaded-style models through ``RematModel``.

The models of experiments/realworld.py (KerasHub tasks and keras.applications networks at small
random-init configurations, batch 8), each compiled by ``RematModel(model, budget=B)`` with nothing
else (``checkpoint_all`` for 100%), at 100%, 70% and 50%: of checkpoint-all's peak for transformers
and language models, of the activation memory (``"70% activations"``) for CNNs, whose weights
dominate the step at these sizes. For each, the compiled step's gradients are timed against the plain
traced step (``CompiledStep.measure_time``: interleaved in one process, median of ``--repeats``),
``--timings`` times, beside the step-time ratio compile predicts (``Prediction.time_overhead``, the
recomputations priced in the generated step's own trace) and the plan's cost at the plain step's
prices. ``--check`` applies experiments/wall_clock.py's fidelity check to every timing.

    python experiments/wall_clock_real.py --models gpt2,resnet50,vit --check
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from common import RESULTS, write_csv, write_run_report  # noqa: E402

FIELDS = ["model", "budget", "nodes", "level", "strategy", "predicted_overhead", "plan_overhead", "timing",
          "measured_ratio", "measured_cpu_ratio", "ratio_error", "step_ms", "plain_ms", "compile_s", "status"]


def run_model(name: str, repeats: int, timings: int) -> list[dict]:
    import tensorflow as tf

    import checkmate.tf2
    import realworld as rw

    _, other, kind = rw.twins(name)
    x, y = rw.batches(kind, 1, image=getattr(rw.model_entry(name)[0], "image_size", rw.IMAGE))
    first = tf.nest.map_structure(lambda a: tf.convert_to_tensor(a[:rw.BATCH]), (x, y))
    suffix = "" if kind in rw.TRANSFORMERS else " activations"
    rows = []
    for budget in ("100%", f"70%{suffix}", f"50%{suffix}"):
        trainer = checkmate.tf2.RematModel(other, budget=budget,
                                           **({"strategy": "checkpoint_all"} if budget == "100%" else {}))
        if checkmate.tf2.losses.compile_arguments_of(other) is not None:
            trainer.compile()
        else:
            trainer.compile(other.optimizer, other.loss)
        started = time.perf_counter()
        try:
            step = trainer.compiled_step(*first)
        except Exception as exc:    # an infeasible budget is a row of the table
            rows.append({"model": name, "budget": budget, "status": f"{type(exc).__name__}: {str(exc)[:160]}"})
            print(f"{name} {budget}: {rows[-1]['status']}", flush=True)
            continue
        compile_s = round(time.perf_counter() - started, 1)
        p = step.predicted
        for k in range(timings):
            m = step.measure_time(repeats=repeats)
            rows.append({"model": name, "budget": budget, "nodes": step.graph.n, "level": step.lowered.level,
                         "strategy": step.strategy, "predicted_overhead": round(p.time_overhead, 4),
                         "plan_overhead": round(p.overhead, 4), "timing": k + 1, "measured_ratio": round(m.ratio, 4),
                         "measured_cpu_ratio": round(m.cpu_ratio, 4) if m.cpu_ratio else None,
                         "ratio_error": round(m.ratio / p.time_overhead - 1.0, 4),
                         "step_ms": round(m.step_seconds * 1e3, 2), "plain_ms": round(m.plain_seconds * 1e3, 2),
                         "compile_s": compile_s, "status": "ok"})
            print(f"{name} {budget}: predicted {p.time_overhead:.3f}x (plan {p.overhead:.3f}x) measured "
                  f"{m.ratio:.3f}x (cpu {m.cpu_ratio:.3f}x) [{step.graph.n} nodes, {compile_s} s compile]", flush=True)
    return rows


def markdown(rows: list[dict], meta: dict) -> str:
    lines = ["# Predicted against measured step time: real models through RematModel", "",
             f"Command: `{meta['command']}`  ",
             f"Device: {meta['device']}; started {meta['started']} UTC, {meta['seconds']:.0f} s.", "",
             "Ratios are to the plain traced step (CompiledStep.measure_time: interleaved, median of the repeats); "
             "predicted: the step-time ratio compile predicts; plan's cost: the schedule's cost at the plain "
             "step's prices; one line per timing.", "",
             "| model | budget | nodes | level | strategy | predicted | plan's cost | measured | CPU | error | compile s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("status") != "ok":
            lines.append(f"| {r['model']} | {r['budget']} | {r['status']} |  |  |  |  |  |  |  |  |")
            continue
        lines.append(f"| {r['model']} | {r['budget']} | {r['nodes']} | {r['level']} | {r['strategy']} | "
                     f"{r['predicted_overhead']:.3f}x | {r['plan_overhead']:.3f}x | {r['measured_ratio']:.3f}x | "
                     f"{r['measured_cpu_ratio']:.3f}x | {r['ratio_error']:+.1%} | {r['compile_s']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    import wall_clock

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="gpt2,resnet50,vit")
    p.add_argument("--repeats", type=int, default=21)
    p.add_argument("--timings", type=int, default=2, help="timings of each compiled step")
    p.add_argument("--tolerance", type=float, default=0.08)
    p.add_argument("--max-identity-ratio", type=float, default=1.05)
    p.add_argument("--check", action="store_true")
    p.add_argument("--label", default="wall_clock_real")
    args = p.parse_args(argv)
    argv = list(sys.argv[1:] if argv is None else argv)
    started = time.time()
    rows = [r for name in args.models.split(",") for r in run_model(name, args.repeats, args.timings)]
    write_csv(RESULTS / f"{args.label}.csv", rows, FIELDS)
    write_run_report(RESULTS, args.label, "wall_clock_real.py", argv, started, lambda meta: markdown(rows, meta))
    if args.check:
        failures = wall_clock.check(rows, args.tolerance, args.max_identity_ratio)
        for f in failures:
            print("FIDELITY:", f)
        return 1 if failures else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
