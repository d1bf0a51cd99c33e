"""Budget sweeps on VGG16, MobileNet and U-Net (the Checkmate paper's budget-sweep figure).

Each model's training step is lowered at layer level and profiled on this machine (per-layer run
times), then every strategy is solved over a grid of budgets from the smallest feasible one to the
checkpoint-all peak. Writes, per model, ``budget_sweep_<model>.csv/.png/.json`` and the graph
(``graphs/<model>.json``), plus ``budget_sweep.png`` with all models side by side.

    python experiments/budget_sweep.py --quick   # batch 8 (U-Net 4), 128x128 (MobileNet 64x64), 6 budgets, 60 s limit
    python experiments/budget_sweep.py           # 224x224 (U-Net 416x608) inputs, 12 budgets, 30 min limit

The paper sweeps VGG16 at batch 256, MobileNet at 512 and U-Net at 32 on a V100. Profiling those
batch sizes on a CPU takes hours and tens of GB, so the full setting keeps the paper's input sizes
and uses batch sizes that fit this machine (VGG16 16, MobileNet 32, U-Net 4); overheads are ratios,
and the shape of the curves depends on the architecture, not the batch size.
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
FULL = {"vgg16": (16, (224, 224, 3)), "mobilenet": (32, (224, 224, 3)), "unet": (4, (416, 608, 3))}
TITLES = {"vgg16": "VGG16", "mobilenet": "MobileNet", "unet": "U-Net"}


def main(argv=None) -> int:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--models", default=None, help="comma-separated subset of vgg16,mobilenet,unet")
    p.add_argument("--budgets", type=int, default=None, help="grid points (quick 6, full 12)")
    p.add_argument("--time-limit", type=float, default=None, help="per-solve time limit in seconds")
    p.add_argument("--cost-model", choices=("profile", "flops"), default="profile")
    p.add_argument("--executor", choices=("process", "ray", "serial"), default="process")
    p.add_argument("--replot", action="store_true", help="only redraw budget_sweep.png from the JSON results")
    args = p.parse_args(argv)
    started = time.perf_counter()
    setting = QUICK if args.quick else FULL
    models = args.models.split(",") if args.models else list(setting)
    points = args.budgets or (6 if args.quick else 12)
    time_limit = args.time_limit or (60 if args.quick else 1800)

    if args.replot:
        from checkmate.analysis.sweep import load_sweep_json

        results = {m: load_sweep_json(args.out / f"budget_sweep_{m}.json") for m in models}
        print(f"redrew {plot_all(results, args.out / 'budget_sweep.png')}")
        common.finish(args)
        return 0

    from checkmate.analysis.models import extract_graph

    results = {}
    for model in models:
        batch, shape = setting[model]
        t0 = time.perf_counter()
        graph = extract_graph(model, batch, input_shape=shape, cost_model=args.cost_model)
        save_graph(graph, args.out / "graphs" / f"{model}.json")
        print(f"{model}: {graph.n} nodes at batch {batch}, {shape}; lowered and profiled in "
              f"{time.perf_counter() - t0:.1f} s")
        result = sweep(graph, default_strategies(), budgets=points, time_limit_s=time_limit,
                       executor=args.executor, workers=args.workers, progress=True)
        result.meta.update({"model": model, "batch_size": batch, "input_shape": list(shape),
                            "cost_model": args.cost_model})
        paths = write_sweep(result, args.out, stem=f"budget_sweep_{model}",
                            title=f"{TITLES[model]} (batch {batch}, {shape[0]}x{shape[1]}): overhead vs. budget")
        problems = check_consistency(result.rows, rtol=0.005)
        print(f"  {len(result.rows)} solves in {result.wall_seconds:.1f} s -> {paths['csv'].name}; "
              f"consistency: {'ok' if not problems else '; '.join(problems[:3])}")
        results[model] = result

    combined = plot_all(results, args.out / "budget_sweep.png")
    common.write_meta(args.out / "budget_sweep.meta.json", "quick" if args.quick else "full",
                      {"models": {m: {"batch_size": setting[m][0], "input_shape": list(setting[m][1])} for m in models},
                       "budgets": points, "time_limit_s": time_limit, "cost_model": args.cost_model}, started)
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
