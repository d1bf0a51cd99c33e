"""How many nodes of a big keras.applications step the default profiling measures, in how long, and
how well the plan's predicted overhead then matches the measured step time.

Two routes of :func:`checkmate.tf2.profiling.profile_nodes`, each with a fresh, empty cache and the
default time budget: ``alone`` (``trace=False``: one small program per node, largest estimates first)
and ``trace`` (the default: the whole plain step under TF's profiler, per-op times attributed to
nodes). Per model (random init, ``--size`` pixels, batch ``--batch``, the default ``level="auto"``):

1. nodes measured and the share of the estimated cost they hold, profiling seconds, per route;
2. with ``--all``: every node measured alone without a time bound, against the trace: the
   correlation of the per-node costs (Pearson, and on their logarithms), the ratio of their totals,
   and each route's total against the measured plain step;
3. ``checkmate.tf2.compile`` at ``--budget`` with each route (fresh caches): the compile's seconds,
   and with ``--time-ratio``: the predicted overhead against the measured step-time ratio, both plans
   and the plain step timed interleaved in one process (``--repeats`` rounds, medians).

    python experiments/profile_coverage.py --models ResNet50V2,NASNetMobile --all ResNet50V2 \\
        --time-ratio ResNet50V2 --budget "50% activations" --repeats 15
"""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
import time

import common


def build(name: str, size: int):
    import keras

    keras.utils.set_random_seed(0)
    return getattr(keras.applications, name)(weights=None, input_shape=(size, size, 3), classes=10)


def profile_route(lowered, trace: bool, time_budget_s):
    from checkmate.tf2 import profiling

    started = time.perf_counter()
    result = profiling.profile_nodes(lowered.function, lowered.node_ops, lowered.input_names, lowered.label_names,
                                     cache_dir=tempfile.mkdtemp(prefix="checkmate-profile-"), progress=False,
                                     trace=trace, time_budget_s=time_budget_s)
    return result, time.perf_counter() - started


def compile_route(model, specs, budget: str, trace: bool):
    """``checkmate.tf2.compile`` with the default profiling switched to one route, in a fresh cache."""
    import keras

    import checkmate.tf2
    from checkmate.tf2 import profiling

    os.environ["CHECKMATE_CACHE_DIR"] = tempfile.mkdtemp(prefix="checkmate-compile-")
    original = profiling.profile_nodes
    profiling.profile_nodes = functools.partial(original, trace=trace)
    try:
        started = time.perf_counter()
        step = checkmate.tf2.compile(model, keras.losses.SparseCategoricalCrossentropy(), keras.optimizers.SGD(0.01),
                                     *specs, budget=budget)
        return step, time.perf_counter() - started
    finally:
        profiling.profile_nodes = original


def main(argv=None) -> int:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--models", default="ResNet50V2,NASNetMobile")
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--budget", default="50% activations")
    p.add_argument("--all", default="", help="models whose every node is also measured alone, without a bound")
    p.add_argument("--time-ratio", default="", help="models whose compiled steps are timed against the plain step")
    p.add_argument("--no-compile", action="store_true", help="skip compiling (profiling only)")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--stem", default="profile_coverage")
    args = p.parse_args(argv)
    if args.quick:
        args.size, args.models = 32, "ResNet50V2"

    import keras
    import numpy as np
    import tensorflow as tf

    from checkmate.tf2 import profiling, timing
    from checkmate.tf2.lowering import lower

    started_all = time.perf_counter()
    rows = []
    for name in [m for m in args.models.split(",") if m]:
        model = build(name, args.size)
        specs = (tf.TensorSpec((args.batch, args.size, args.size, 3)), tf.TensorSpec((args.batch,), tf.int32))
        loss = keras.losses.SparseCategoricalCrossentropy()
        t0 = time.perf_counter()
        lowered = lower(model, loss, *specs, level="auto", cost_model="flops", progress=False)
        row = {"model": name, "size": args.size, "batch": args.batch, "nodes": lowered.graph.n,
               "level": lowered.level, "lower_s": round(time.perf_counter() - t0, 2)}
        results = {}
        for route, trace in (("alone", False), ("trace", True)):
            result, seconds = profile_route(lowered, trace, profiling.DEFAULT_TIME_BUDGET_S)
            results[route] = result
            row[f"{route}_measured"] = lowered.graph.n - result.estimated
            row[f"{route}_share"] = round(result.measured_share, 4)
            row[f"{route}_profile_s"] = round(seconds, 2)
            print(json.dumps({"model": name, "route": route, "measured": row[f"{route}_measured"],
                              "of": lowered.graph.n, "share": result.measured_share, "seconds": seconds}), flush=True)
        if name in args.all.split(","):
            full, seconds = profile_route(lowered, False, None)
            a, b = np.asarray(full.costs), np.asarray(results["trace"].costs)
            xs, ys = timing.random_batch(lowered, model)
            step_s = timing.time_step_s(lowered.function, *xs, *ys, steps=args.repeats)
            row.update({"all_alone_measured": lowered.graph.n - full.estimated, "all_alone_s": round(seconds, 2),
                        "pearson": round(float(np.corrcoef(a, b)[0, 1]), 4),
                        "pearson_log": round(float(np.corrcoef(np.log(a), np.log(b))[0, 1]), 4),
                        "trace_over_alone_total": round(float(b.sum() / a.sum()), 4),
                        "step_ms": round(step_s * 1e3, 2),
                        "alone_total_over_step": round(float(a.sum() * 1e-6 / step_s), 4),
                        "trace_total_over_step": round(float(b.sum() * 1e-6 / step_s), 4)})
            print(json.dumps({k: row[k] for k in row if k.startswith(("all_", "pearson", "trace_over", "step_",
                                                                        "alone_total", "trace_total"))}), flush=True)
        if not args.no_compile:
            steps = {}
            for route, trace in (("alone", False), ("trace", True)):
                step, seconds = compile_route(model, specs, args.budget, trace)
                steps[route] = step
                row[f"{route}_compile_s"] = round(seconds, 1)
                row[f"{route}_predicted"] = round(step.predicted.overhead, 4)
                print(json.dumps({"model": name, "route": route, "compile_s": seconds,
                                  "predicted": step.predicted.overhead}), flush=True)
            if name in args.time_ratio.split(","):
                x, y = timing.random_batch(steps["trace"].lowered, model)
                flat = steps["trace"].function.flat_args(x, y)
                state = list(model.non_trainable_variables)
                before = [tf.identity(v) for v in state]
                try:
                    (alone_s, trace_s, plain_s), _ = timing.interleaved_times(
                        [steps["alone"].function.call_flat, steps["trace"].function.call_flat,
                         steps["trace"].lowered.function], *flat, repeats=args.repeats)
                finally:
                    for v, value in zip(state, before):
                        v.assign(value)
                row.update({"alone_measured_ratio": round(alone_s / plain_s, 4),
                            "trace_measured_ratio": round(trace_s / plain_s, 4), "plain_ms": round(plain_s * 1e3, 2),
                            "repeats": args.repeats})
                print(json.dumps({k: row[k] for k in row if "ratio" in k or k == "plain_ms"}), flush=True)
        rows.append(row)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    columns = ["model", "size", "batch", "nodes", "level", "lower_s", "alone_measured", "alone_share",
               "alone_profile_s", "trace_measured", "trace_share", "trace_profile_s", "alone_compile_s",
               "trace_compile_s", "alone_predicted", "alone_measured_ratio", "trace_predicted",
               "trace_measured_ratio", "plain_ms", "repeats", "all_alone_measured", "all_alone_s", "pearson",
               "pearson_log", "trace_over_alone_total", "step_ms", "alone_total_over_step", "trace_total_over_step"]
    common.write_csv(out / f"{args.stem}.csv", rows, columns)
    headings = [("model", "model"), ("nodes", "nodes"), ("alone_measured", "measured alone"),
                ("alone_profile_s", "profiling s"), ("trace_measured", "measured, trace"),
                ("trace_share", "share of estimate"), ("trace_profile_s", "profiling s, trace"),
                ("alone_compile_s", "compile s, alone"), ("trace_compile_s", "compile s, trace"),
                ("alone_predicted", "predicted, alone"), ("alone_measured_ratio", "measured, alone"),
                ("trace_predicted", "predicted, trace"), ("trace_measured_ratio", "measured, trace")]
    (out / f"{args.stem}.md").write_text(common.markdown_table(rows, headings) + "\n")
    common.write_meta(out / f"{args.stem}.meta.json", "quick" if args.quick else "full",
                      {"budget": args.budget, "repeats": args.repeats}, started_all)
    if not args.no_readme:
        common.finish(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
