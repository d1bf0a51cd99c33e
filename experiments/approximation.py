"""Integrality gap and LP-rounding quality against the MILP (Checkmate paper, Section 5 and Table 2).

For each graph and budget: the MILP's optimal cost, the LP relaxation's lower bound and the cost of
the rounded LP schedule. Reported per cell:

* integrality gap = MILP optimum / LP bound (>= 1; 1 means the relaxation is tight),
* rounding ratio  = LP-rounding cost / MILP optimum (>= 1; how far the approximation is from optimal),
* whether LP rounding found a schedule at all (it can fail at tight budgets).

Graphs: unit training chains of several lengths (Chen et al.'s setting), synthetic U-Net and
residual training graphs, and real layer-level graphs of zoo models when TensorFlow is available.
Budgets: fractions of the way from the minimum feasible budget to the checkpoint-all peak.

    python experiments/approximation.py --quick     # chains 8/16, small U-Net and ResNet, VGG16, 3 budgets (~3 min)
    python experiments/approximation.py             # chains 8..64, synthetic and zoo graphs, 5 budgets
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

from checkmate import synthetic  # noqa: E402
from checkmate.analysis.sweep import sweep  # noqa: E402
from checkmate.bounds import largest_working_set_bytes  # noqa: E402
from checkmate.solvers import checkpoint_all_peak  # noqa: E402

STRATEGIES = ["checkmate_milp", "checkmate_lp_rounding", "lower_bound_lp", "chen_sqrtn"]
COLUMNS = ["graph", "kind", "nodes", "budget_fraction", "budget_bytes", "milp_cost", "milp_optimal", "lp_bound",
           "rounding_cost", "rounding_feasible", "integrality_gap", "rounding_ratio", "milp_seconds",
           "rounding_seconds", "lp_seconds"]


def graphs(quick: bool):
    if quick:
        for layers in (8, 16):
            yield "chain", synthetic.chain(layers)
        yield "synthetic", synthetic.unet(2, convs_per_level=1)
        yield "synthetic", synthetic.resnet(3)
        yield from real_graphs(quick=True)
        return
    for layers in (8, 16, 32, 64):
        yield "chain", synthetic.chain(layers)
    yield "synthetic", synthetic.unet(3)
    yield "synthetic", synthetic.resnet(8)
    yield from real_graphs()


def real_graphs(quick: bool = False):
    """Layer-level zoo graphs at moderate shapes (FLOP costs: the study is about the solvers)."""
    try:
        from checkmate.analysis.models import extract_graph
    except ImportError as exc:
        print(f"skipping real graphs: {exc}")
        return
    models = ((("vgg16", 8, (64, 64, 3)),) if quick else
              (("mobilenet", 32, (64, 64, 3)), ("vgg16", 32, (64, 64, 3)), ("unet", 4, (96, 96, 3))))
    for model, batch, shape in models:
        try:
            yield "real", extract_graph(model, batch, input_shape=shape, cost_model="flops")
        except Exception as exc:  # a model the front end cannot lower yet is reported, not fatal
            print(f"skipping {model}: {type(exc).__name__}: {exc}")


def budgets_for(graph, fractions):
    low = largest_working_set_bytes(graph)  # budgets below the MILP's own frontier are dropped later
    high = checkpoint_all_peak(graph)
    return [int(low + f * (high - low)) for f in fractions]


def main(argv=None) -> int:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--time-limit", type=float, default=None, help="per-solve time limit in seconds")
    args = p.parse_args(argv)
    started = time.perf_counter()
    fractions = (0.15, 0.4, 0.7) if args.quick else (0.05, 0.15, 0.3, 0.5, 0.75)
    time_limit = args.time_limit or (60 if args.quick else 1800)
    out_rows = []
    for kind, g in graphs(args.quick):
        budgets = budgets_for(g, fractions)
        t0 = time.perf_counter()
        result = sweep(g, STRATEGIES, budgets=budgets, time_limit_s=time_limit, executor="process",
                       workers=args.workers, mip_gap=1e-4)
        print(f"{g.name}: {g.n} nodes, {len(budgets)} budgets in {time.perf_counter() - t0:.1f} s")
        by = {(r.strategy, r.budget_bytes): r for r in result.rows}
        trivial, peak = largest_working_set_bytes(g), checkpoint_all_peak(g)
        for b in budgets:
            milp, rnd, lp = by[("checkmate_milp", b)], by[("checkmate_lp_rounding", b)], by[("lower_bound_lp", b)]
            if not milp.feasible:
                continue  # below the MILP's own frontier: nothing to compare
            lp_bound = lp.lower_bound
            row = {
                "graph": g.name, "kind": kind, "nodes": g.n,
                "budget_fraction": round((b - trivial) / (peak - trivial), 3) if peak > trivial else 1.0,
                "budget_bytes": b, "milp_cost": milp.compute_cost, "milp_optimal": milp.optimal,
                "lp_bound": lp_bound, "rounding_cost": rnd.compute_cost, "rounding_feasible": bool(rnd.feasible),
                "integrality_gap": (milp.compute_cost / lp_bound) if lp_bound else None,
                "rounding_ratio": (rnd.compute_cost / milp.compute_cost) if rnd.feasible else None,
                "milp_seconds": milp.solve_seconds, "rounding_seconds": rnd.solve_seconds,
                "lp_seconds": lp.solve_seconds,
            }
            out_rows.append(row)
    args.out.mkdir(parents=True, exist_ok=True)
    csv_path = common.write_csv(args.out / "approximation.csv", out_rows, COLUMNS)
    png_path = plot(out_rows, args.out / "approximation.png")
    common.write_meta(args.out / "approximation.meta.json", "quick" if args.quick else "full",
                      {"time_limit_s": time_limit, "fractions": list(fractions)}, started)
    print(f"wrote {csv_path} and {png_path}")
    common.finish(args)
    return 0


def plot(rows, path: Path) -> Path:
    from checkmate.analysis.plots import pyplot, save_figure

    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    graphs_seen = list(dict.fromkeys(r["graph"] for r in rows))
    for name in graphs_seen:
        rs = sorted((r for r in rows if r["graph"] == name), key=lambda r: r["budget_fraction"])
        xs = [r["budget_fraction"] for r in rs if r["integrality_gap"] is not None]
        ys = [r["integrality_gap"] for r in rs if r["integrality_gap"] is not None]
        ax1.plot(xs, ys, marker="o", label=name)
        xs = [r["budget_fraction"] for r in rs if r["rounding_ratio"] is not None]
        ys = [r["rounding_ratio"] for r in rs if r["rounding_ratio"] is not None]
        ax2.plot(xs, ys, marker="s", label=name)
        failed = [r["budget_fraction"] for r in rs if not r["rounding_feasible"]]
        if failed:
            ax2.scatter(failed, [1.0] * len(failed), marker="x", color="red", zorder=5)
    ax1.set_title("integrality gap: MILP optimum / LP bound")
    ax2.set_title("LP rounding: cost / MILP optimum (x: rounding found no schedule)")
    for ax in (ax1, ax2):
        ax.set_xlabel("budget (0 = lower bound on memory, 1 = checkpoint-all peak)")
        ax.axhline(1.0, color="0.6", linewidth=0.8)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    out = save_figure(fig, path, 150)
    plt.close(fig)
    return out


if __name__ == "__main__":
    sys.exit(main())
