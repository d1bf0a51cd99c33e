"""Budget sweeps on VGG16, MobileNet and U-Net (the Checkmate paper's budget-sweep figure, Figure 5).

Each model's training step is lowered at layer level, then every strategy (checkpoint-all, Chen's
sqrt(n) and greedy, Griewank's log(n), the LP rounding, the MILP and the LP relaxation's bound) is
solved over a grid of budgets from the smallest feasible one to the checkpoint-all peak. Writes, per
model, ``<stem>_<model>.csv/.png/.json`` and the graph (``graphs/<model>[_full].json``), plus
``<stem>.png`` with all models side by side; the stem is ``budget_sweep`` (quick) or
``budget_sweep_full`` (full).

    python experiments/budget_sweep.py --quick   # batch 8 (U-Net 4), 128x128 (MobileNet 64x64), profiled costs, 6 budgets, 60 s limit
    python experiments/budget_sweep.py           # the paper's sizes: VGG16 batch 256 and MobileNet batch 512 at
                                                 # 224x224, U-Net batch 32 at 416x608; FLOP costs, 12 budgets, 300 s limit

The full setting is the paper's: VGG16 at batch 256, MobileNet at 512 and U-Net at 32. Its graphs are
*solved*, not run: lowering traces the training step without executing it, so graphs of 16-32 GiB
steps are built on this machine in seconds; they have the same nodes and edges as the quick graphs,
only their bytes (and FLOPs) scale. Their costs are FLOP counts, since profiling steps of that size
on this CPU would take hours (the paper profiled them on a V100). Each finished solve is kept in the
point cache (``--cache-dir``, default ``~/.cache/checkmate/points``), so an interrupted run started
again with the same arguments solves only what is missing; ``--no-cache`` recomputes everything.
A MILP solve that reaches the time limit is reported with the gap it proved, never as optimal.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

from checkmate.analysis.sweep import check_consistency, default_strategies, sweep, write_sweep  # noqa: E402
from checkmate.graph import save_graph  # noqa: E402

# Quick shapes are the smallest at which activations, not weights, set the memory range of the sweep.
QUICK = {"vgg16": (8, (128, 128, 3)), "mobilenet": (8, (64, 64, 3)), "unet": (4, (128, 128, 3))}
# The paper's batch sizes and input shapes.
FULL = {"vgg16": (256, (224, 224, 3)), "mobilenet": (512, (224, 224, 3)), "unet": (32, (416, 608, 3))}
TITLES = {"vgg16": "VGG16", "mobilenet": "MobileNet", "unet": "U-Net"}
QUICK_STEM, FULL_STEM = "budget_sweep", "budget_sweep_full"
# Per-solve limits: the quick MILPs prove their optimum within seconds; at the full setting a tight
# budget may need minutes, and a sweep of 3 x 12 budgets must finish within hours on two cores.
QUICK_TIME_LIMIT_S, FULL_TIME_LIMIT_S = 60, 300


def main(argv=None) -> int:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--models", default=None, help="comma-separated subset of vgg16,mobilenet,unet")
    p.add_argument("--budgets", type=int, default=None, help="grid points (quick 6, full 12)")
    p.add_argument("--time-limit", type=float, default=None,
                   help=f"per-solve time limit in seconds (quick {QUICK_TIME_LIMIT_S}, full {FULL_TIME_LIMIT_S})")
    p.add_argument("--cost-model", choices=("profile", "flops"), default=None,
                   help="node costs: profiled on this machine (quick default) or FLOP counts (full default)")
    p.add_argument("--executor", choices=("process", "ray", "serial"), default="process")
    p.add_argument("--replot", action="store_true", help="only redraw the combined figure from the JSON results")
    common.add_cache_arguments(p)
    args = p.parse_args(argv)
    started = time.perf_counter()
    setting = QUICK if args.quick else FULL
    stem = QUICK_STEM if args.quick else FULL_STEM
    models = args.models.split(",") if args.models else list(setting)
    points = args.budgets or (6 if args.quick else 12)
    time_limit = args.time_limit or (QUICK_TIME_LIMIT_S if args.quick else FULL_TIME_LIMIT_S)
    cost_model = args.cost_model or ("profile" if args.quick else "flops")

    if args.replot:
        from checkmate.analysis.sweep import load_sweep_json

        results = {m: load_sweep_json(args.out / f"{stem}_{m}.json") for m in models}
        print(f"redrew {plot_all(results, args.out / f'{stem}.png')}")
        common.finish(args)
        return 0

    from checkmate.analysis.models import extract_graph

    results = {}
    for model in models:
        batch, shape = setting[model]
        t0 = time.perf_counter()
        graph = extract_graph(model, batch, input_shape=shape, cost_model=cost_model)
        save_graph(graph, args.out / "graphs" / f"{model}{'' if args.quick else '_full'}.json")
        print(f"{model}: {graph.n} nodes at batch {batch}, {shape}; lowered ({cost_model} costs) in "
              f"{time.perf_counter() - t0:.1f} s")
        result = sweep(graph, default_strategies(), budgets=points, time_limit_s=time_limit,
                       executor=args.executor, workers=args.workers, progress=True,
                       cache_dir=common.point_cache_dir(args))
        result.meta.update({"model": model, "batch_size": batch, "input_shape": list(shape),
                            "cost_model": cost_model})
        paths = write_sweep(result, args.out, stem=f"{stem}_{model}",
                            title=f"{TITLES[model]} (batch {batch}, {shape[0]}x{shape[1]}): overhead vs. budget")
        problems = check_consistency(result.rows, rtol=0.005)
        print(f"  {len(result.rows)} rows ({result.meta['solves']} solved, {result.meta['cached_solves']} from the "
              f"cache) in {result.wall_seconds:.1f} s -> {paths['csv'].name}; "
              f"consistency: {'ok' if not problems else '; '.join(problems[:3])}")
        results[model] = result

    combined = plot_all(results, args.out / f"{stem}.png")
    common.write_meta(args.out / f"{stem}.meta.json", "quick" if args.quick else "full",
                      {"models": {m: {"batch_size": setting[m][0], "input_shape": list(setting[m][1])} for m in models},
                       "budgets": points, "time_limit_s": time_limit, "cost_model": cost_model}, started)
    print(f"wrote {combined}")
    common.finish(args)
    return 0


def plot_all(results, path: Path) -> Path:
    from checkmate.analysis.plots import plot_budget_sweep, pyplot, save_figure

    plt = pyplot()
    fig, axes = plt.subplots(1, len(results), figsize=(6.2 * len(results), 4.4), squeeze=False)
    legend = {}
    for ax, (model, result) in zip(axes[0], results.items()):
        plot_budget_sweep(result, None, ax=ax, title=TITLES.get(model, model))
        handles, labels = ax.get_legend_handles_labels()
        legend.update(zip(labels, handles))
        ax.get_legend().remove()
    # One legend for all panels, below them, so that no line is hidden behind it.
    fig.legend(list(legend.values()), list(legend.keys()), loc="lower center", ncol=5, fontsize=8,
               bbox_to_anchor=(0.5, -0.08))
    out = save_figure(fig, path, 150)
    plt.close(fig)
    return out


if __name__ == "__main__":
    sys.exit(main())
