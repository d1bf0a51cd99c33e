"""Chen et al.'s deep-network result on this CPU: a deep residual network trained with checkpoint-all,
Chen's sqrt(n) checkpointing and the Checkmate MILP at the same memory budget.

Chen et al. (2016) report that sqrt(n) checkpointing cuts a 1000-layer ResNet's training memory from
48 GB to 7 GB for about 30% more time. Here every schedule is compiled to a rematerializing
TensorFlow step and *run*: the table reports the measured peak memory of the step (allocator
statistics, above the weights and batch resident before it) and its measured time, next to the
simulated peak and compute overhead of the schedule.

The network: a 3x3 convolution stem, then residual units ``x + conv(relu(conv(x)))`` (two conv
layers each, no BatchNorm), global pooling and a classifier. Units are grouped into Keras layers of
``units_per_block`` units, and the graph is built at that layer level: the MILP schedules blocks,
which keeps it tractable for 1000 layers; Chen's sqrt(n) checkpoints the same block boundaries.

Budget: the MILP gets exactly the peak of Chen's sqrt(n) schedule (simulated), so the two are compared
at equal memory; checkpoint-all runs at its own peak. The MILP runs to a 1% gap or its time limit,
whichever comes first; its row says whether it was proven optimal, and a result stopped by the gap or
the limit is reported with the gap it proved, never as optimal.

Each strategy's schedule is kept in the point cache (``--cache-dir``, default
``~/.cache/checkmate/points``; ``--no-cache`` to solve again), keyed by the graph's content, the
strategy, the budget and the solver options: a run interrupted while compiling or timing the steps
starts again without re-solving the MILP.

    python experiments/deep_resnet.py --quick   # 48 conv layers (24 units, 2 per block), batch 16, 16x16x16
    python experiments/deep_resnet.py           # 1000 conv layers (500 units, 5 per block), batch 32, 32x32x16, 600 s MILP limit

The quick setting writes ``deep_resnet.csv/.png/.meta.json``, the full one ``deep_resnet_full.*``.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

STRATEGIES = ("checkpoint_all", "chen_sqrtn", "checkmate_milp")
QUICK = {"units": 24, "units_per_block": 2, "batch": 16, "shape": (16, 16, 16), "repeats": 15}
FULL = {"units": 500, "units_per_block": 5, "batch": 32, "shape": (32, 32, 16), "repeats": 5}
COLUMNS = ["model", "layers", "blocks", "graph_nodes", "strategy", "budget_bytes", "simulated_peak_bytes",
           "resident_bytes", "simulated_step_peak_bytes",
           "simulated_overhead", "recomputations", "measured_peak_bytes", "memory_ratio", "step_seconds",
           "time_ratio", "solve_seconds", "optimal", "gap", "status"]


def build_model(units: int, units_per_block: int, shape, classes: int = 10):
    import keras

    class ResidualBlock(keras.layers.Layer):
        """``units`` residual units x + conv(relu(conv(x))), followed by a ReLU."""

        def __init__(self, units: int, filters: int, **kwargs):
            super().__init__(**kwargs)
            self.convs = [(keras.layers.Conv2D(filters, 3, padding="same", activation="relu"),
                           keras.layers.Conv2D(filters, 3, padding="same")) for _ in range(units)]

        def call(self, x):
            for first, second in self.convs:
                x = keras.activations.relu(x + second(first(x)))
            return x

    keras.utils.set_random_seed(0)
    inputs = keras.Input(shape)
    x = keras.layers.Conv2D(shape[-1], 3, padding="same", activation="relu", name="stem")(inputs)
    blocks = -(-units // units_per_block)
    for b in range(blocks):
        n = min(units_per_block, units - b * units_per_block)
        x = ResidualBlock(n, shape[-1], name=f"block{b}")(x)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    outputs = keras.layers.Dense(classes, name="logits")(x)
    return keras.Model(inputs, outputs, name=f"resnet{2 * units}"), blocks


def time_step(fn, x, y, repeats: int, warmup: bool = True) -> float:
    """Median wall time of ``fn(x, y)`` (after one warm-up call unless ``warmup`` is False)."""
    if warmup:
        fn(x, y)[0].numpy()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(x, y)[0].numpy()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# The MILP stops at this relative gap: at 1000 layers proving the last percent is what takes the time.
MILP_GAP = 0.01
QUICK_TIME_LIMIT_S, FULL_TIME_LIMIT_S = 120, 600


def solve_cached(cache, graph, digest: str, strategy: str, budget_bytes: int, time_limit_s: float):
    """``solve`` for one strategy of the table, through the point cache (the schedule and its figures)."""
    from checkmate import __version__
    from checkmate.schedule import Schedule
    from checkmate.solvers import SolveResult, solve

    options = {"mip_gap": MILP_GAP} if strategy == "checkmate_milp" else {}
    limit = time_limit_s if strategy == "checkmate_milp" else None
    key = {"point": "deep_resnet_solve", "graph": digest, "strategy": strategy, "budget_bytes": int(budget_bytes),
           "time_limit_s": limit, **options, "checkmate": __version__}
    found = cache.get(key)
    if found is not None:
        fields = dict(found["result"])
        return SolveResult(**fields, schedule=Schedule.from_dict(found["schedule"], graph)), True
    r = solve(graph, int(budget_bytes), strategy=strategy, time_limit_s=limit, **options)
    fields = {k: getattr(r, k) for k in ("graph", "nodes", "strategy", "solver", "budget_bytes", "compute_cost",
                                         "baseline_cost", "peak_memory_bytes", "lower_bound", "optimal",
                                         "solve_seconds", "status", "feasible")}
    cache.put(key, {"result": fields, "schedule": r.schedule.to_dict()})
    return r, False


def main(argv=None) -> int:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--units", type=int, default=None, help="residual units (2 conv layers each)")
    p.add_argument("--units-per-block", type=int, default=None)
    p.add_argument("--time-limit", type=float, default=None,
                   help=f"MILP time limit in seconds (quick {QUICK_TIME_LIMIT_S}, full {FULL_TIME_LIMIT_S})")
    common.add_cache_arguments(p)
    args = p.parse_args(argv)
    started = time.perf_counter()
    cfg = dict(QUICK if args.quick else FULL)
    if args.units:
        cfg["units"] = args.units
    if args.units_per_block:
        cfg["units_per_block"] = args.units_per_block
    time_limit = args.time_limit or (QUICK_TIME_LIMIT_S if args.quick else FULL_TIME_LIMIT_S)

    import keras
    import tensorflow as tf

    from checkmate.analysis.point_cache import PointCache
    from checkmate.analysis.sweep import payload_digest
    from checkmate.bounds import checkpoint_all_peak
    from checkmate.simulate import simulate
    from checkmate.solvers import format_bytes
    from checkmate.tf2.codegen import generate
    from checkmate.tf2.lowering import lower
    from checkmate.tf2.memory import measure_step
    from checkmate.tf2.step import CompiledStep

    model, blocks = build_model(cfg["units"], cfg["units_per_block"], cfg["shape"])
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x_spec = tf.TensorSpec((cfg["batch"], *cfg["shape"]), tf.float32)
    y_spec = tf.TensorSpec((cfg["batch"],), tf.int32)
    t0 = time.perf_counter()
    lowered = lower(model, loss, x_spec, y_spec, level="layer", cost_model="flops", name=model.name)
    graph = lowered.graph
    print(f"{model.name}: {2 * cfg['units']} conv layers in {blocks} blocks -> {graph.n} graph nodes "
          f"(lowered in {time.perf_counter() - t0:.1f} s)", flush=True)
    x = tf.random.normal(x_spec.shape, seed=0)
    y = tf.random.uniform(y_spec.shape, maxval=10, dtype=tf.int32, seed=1)

    cache = PointCache(common.point_cache_dir(args))
    digest = payload_digest(graph.to_dict())
    # Budgets in bytes, planned as given (no allocator headroom): checkpoint-all at its own peak, sqrt(n)
    # unconstrained (it ignores the budget), the MILP at exactly sqrt(n)'s peak.
    unlimited = 2**62
    sqrtn, _ = solve_cached(cache, graph, digest, "chen_sqrtn", unlimited, time_limit)
    budgets = {"checkpoint_all": checkpoint_all_peak(graph), "chen_sqrtn": unlimited,
               "checkmate_milp": sqrtn.peak_memory_bytes}
    rows, steps = [], {}
    for strategy in STRATEGIES:
        t0 = time.perf_counter()
        result, cached = solve_cached(cache, graph, digest, strategy, budgets[strategy], time_limit)
        print(f"  {strategy}: {'schedule from the cache' if cached else f'solved in {result.solve_seconds:.1f} s'}"
              f" ({result.status})", flush=True)
        step = CompiledStep(model, loss, keras.optimizers.SGD(0.01), lowered, result, generate(lowered, result.schedule))
        sim = simulate(graph, step.schedule)
        measured = measure_step(step.gradients, x, y, repeats=2)
        print(f"  {strategy}: compiled and measured in {time.perf_counter() - t0:.1f} s", flush=True)
        steps[strategy] = step
        rows.append({
            "model": model.name, "layers": 2 * cfg["units"], "blocks": blocks, "graph_nodes": graph.n,
            # A budget-unaware strategy was given an unlimited budget: report the peak it needs instead.
            "strategy": strategy,
            "budget_bytes": result.budget_bytes if strategy != "chen_sqrtn" else sim.peak_memory_bytes,
            "simulated_peak_bytes": sim.peak_memory_bytes, "resident_bytes": step.predicted.resident_bytes,
            "simulated_step_peak_bytes": step.predicted.step_peak_bytes,
            "simulated_overhead": sim.compute_cost / graph.total_cost,
            "recomputations": sim.recompute_count, "measured_peak_bytes": measured.peak_bytes,
            "solve_seconds": round(result.solve_seconds, 2), "optimal": result.optimal,
            "gap": result.gap, "status": result.status,
        })
    # Time the steps in turns rather than one after the other, so that load from other processes on a
    # shared machine falls on all of them alike; the median of each strategy's turns is reported.
    for fn in steps.values():
        fn.gradients(x, y)[0].numpy()
    turns = {s: [] for s in steps}
    for _ in range(cfg["repeats"]):
        for strategy, step in steps.items():
            turns[strategy].append(time_step(step.gradients, x, y, 1, warmup=False))
    for row in rows:
        row["step_seconds"] = statistics.median(turns[row["strategy"]])
        print(f"  {row['strategy']:<15} simulated {format_bytes(row['simulated_step_peak_bytes'])}, measured "
              f"{format_bytes(row['measured_peak_bytes'])}, {row['step_seconds'] * 1000:.0f} ms/step")
    base = rows[0]
    for r in rows:
        r["memory_ratio"] = r["measured_peak_bytes"] / base["measured_peak_bytes"]
        r["time_ratio"] = r["step_seconds"] / base["step_seconds"]

    args.out.mkdir(parents=True, exist_ok=True)
    stem = "deep_resnet" if args.quick else "deep_resnet_full"
    csv_path = common.write_csv(args.out / f"{stem}.csv", rows, COLUMNS)
    png_path = plot(rows, args.out / f"{stem}.png")
    common.write_meta(args.out / f"{stem}.meta.json", "quick" if args.quick else "full",
                      {**{k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()},
                       "time_limit_s": time_limit, "device": measured.device}, started)
    print(f"wrote {csv_path} and {png_path}")
    common.finish(args)
    return 0


def plot(rows, path: Path) -> Path:
    from checkmate.analysis.plots import label, pyplot, save_figure

    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    names = [label(r["strategy"]) for r in rows]
    mib = 2**20
    xs = range(len(rows))
    ax1.bar([i - 0.2 for i in xs], [r["simulated_step_peak_bytes"] / mib for r in rows], width=0.4,
            label="simulated")
    ax1.bar([i + 0.2 for i in xs], [r["measured_peak_bytes"] / mib for r in rows], width=0.4, label="measured")
    ax1.set_title("peak memory of the step, above weights and batch", fontsize=9)
    ax1.set_ylabel("peak memory (MiB)")
    ax2.bar(xs, [r["time_ratio"] for r in rows], color="tab:purple", label="measured")
    ax2.plot(xs, [r["simulated_overhead"] for r in rows], "ko", label="simulated overhead")
    ax2.set_ylabel("step time (x checkpoint-all)")
    for ax in (ax1, ax2):
        ax.set_xticks(list(xs))
        ax.set_xticklabels(names, fontsize=7, rotation=10)
        ax.legend(fontsize=7)
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(f"{rows[0]['model']}: {rows[0]['layers']} conv layers")
    out = save_figure(fig, path, 150)
    plt.close(fig)
    return out


if __name__ == "__main__":
    sys.exit(main())
