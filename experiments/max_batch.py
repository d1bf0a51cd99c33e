"""Maximum batch size within a memory limit with at most one extra forward pass (Checkmate paper, Fig. 6).

For U-Net, FCN8, SegNet, ResNet50, VGG19 and MobileNet: the largest batch size that checkpoint-all,
Chen's sqrt(n), Chen's greedy and the Checkmate MILP each train within the memory limit, where a
strategy may spend at most one extra forward pass of compute (see :mod:`checkmate.analysis.max_batch`
for the search and for how graphs at each batch size are obtained). The final batch size of every
strategy is re-extracted and re-solved; where the limit fits this machine, the compiled step is run
at that size and its peak memory measured.

    python experiments/max_batch.py --quick   # 32x32 / 64x64 inputs, limit = weights + 48 MiB, 4 models
    python experiments/max_batch.py           # the zoo's default input sizes, 16 GB limit (a V100), all 6

The memory limit counts everything resident during the step: weights and the batch (the graph's
fixed memory) plus activations and gradients. The paper used 16 GB GPUs; at quick sizes a fixed
absolute limit would be dominated by the weights, so the quick setting gives each model its own
weights plus the same activation allowance.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

from checkmate.analysis.max_batch import DEFAULT_STRATEGIES, search_model  # noqa: E402
from checkmate.solvers import format_bytes  # noqa: E402

MODELS = ("unet", "fcn8", "segnet", "resnet50", "vgg19", "mobilenet")
QUICK_MODELS = ("unet", "segnet", "vgg19", "mobilenet")
QUICK_SHAPES = {"unet": (64, 64, 3), "fcn8": (64, 64, 3), "segnet": (64, 64, 3), "resnet50": (32, 32, 3),
                "vgg19": (32, 32, 3), "mobilenet": (32, 32, 3)}
QUICK_ALLOWANCE_BYTES = 48 << 20
FULL_LIMIT_BYTES = 16 * 10**9
COLUMNS = ["model", "input_shape", "memory_bytes", "strategy", "max_batch_size", "ratio_vs_checkpoint_all",
           "final_peak_bytes", "final_overhead", "probes", "search_seconds", "measured_peak_bytes",
           "measured_step_peak_bytes", "predicted_step_peak_bytes", "measured_status"]


def quick_limit(model: str, shape) -> int:
    """The model's fixed memory at batch size 1 (weights, batch) plus the activation allowance."""
    from checkmate.analysis.models import extract_graph

    return extract_graph(model, 1, input_shape=shape).fixed_mem + QUICK_ALLOWANCE_BYTES


def main(argv=None) -> int:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--models", default=None, help=f"comma-separated subset of {','.join(MODELS)}")
    p.add_argument("--strategies", default=",".join(DEFAULT_STRATEGIES))
    p.add_argument("--time-limit", type=float, default=None, help="per-solve time limit in seconds")
    p.add_argument("--memory", default=None, help="override the memory limit (bytes or 16GB-style)")
    p.add_argument("--no-confirm", action="store_true", help="do not run the compiled step at the final sizes")
    args = p.parse_args(argv)
    started = time.perf_counter()
    models = args.models.split(",") if args.models else list(QUICK_MODELS if args.quick else MODELS)
    strategies = args.strategies.split(",")
    # Probes only need a schedule within both limits, not a proof of optimality (see max_batch.py).
    time_limit = args.time_limit or (20 if args.quick else 600)

    rows, results_for_plot = [], []
    for model in models:
        shape = QUICK_SHAPES[model] if args.quick else None
        if args.memory:
            from checkmate.solvers import parse_budget

            limit = parse_budget(args.memory)
        else:
            limit = quick_limit(model, shape) if args.quick else FULL_LIMIT_BYTES
        t0 = time.perf_counter()
        results = search_model(model, limit, strategies, input_shape=shape, time_limit_s=time_limit,
                               confirm=False if args.no_confirm else None, mip_gap=0.02)
        base = next((r.max_batch_size for r in results if r.strategy == "checkpoint_all"), 0)
        print(f"{model} {shape or 'default shape'}: limit {format_bytes(limit)}, {time.perf_counter() - t0:.0f} s")
        for r in results:
            measured = r.measured or {}
            rows.append({
                "model": model, "input_shape": "x".join(map(str, shape)) if shape else "default",
                "memory_bytes": limit, "strategy": r.strategy, "max_batch_size": r.max_batch_size,
                "ratio_vs_checkpoint_all": round(r.max_batch_size / base, 3) if base else None,
                "final_peak_bytes": r.final.peak_memory_bytes if r.final else None,
                "final_overhead": round(r.final.overhead, 4) if r.final and r.final.overhead else None,
                "probes": len(r.probes), "search_seconds": round(r.seconds, 1),
                "measured_peak_bytes": measured.get("peak_memory_bytes"),
                "measured_step_peak_bytes": measured.get("measured_step_peak_bytes"),
                "predicted_step_peak_bytes": measured.get("predicted_step_peak_bytes"),
                "measured_status": measured.get("status", "not run (limit exceeds this machine)"),
            })
            results_for_plot.append({"model": model, "strategy": r.strategy, "max_batch_size": r.max_batch_size})
            print(f"  {r.strategy:<16} {r.max_batch_size:>5}  {measured.get('status', '')}")

    from checkmate.analysis.plots import plot_max_batch

    args.out.mkdir(parents=True, exist_ok=True)
    csv_path = common.write_csv(args.out / "max_batch.csv", rows, COLUMNS)
    png_path = plot_max_batch(results_for_plot, args.out / "max_batch.png",
                              title="largest batch size within the memory limit (<= 1 extra forward pass)")
    common.write_meta(args.out / "max_batch.meta.json", "quick" if args.quick else "full",
                      {"models": models, "strategies": strategies, "time_limit_s": time_limit,
                       "quick_allowance_bytes": QUICK_ALLOWANCE_BYTES if args.quick else None}, started)
    print(f"wrote {csv_path} and {png_path}")
    common.finish(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
