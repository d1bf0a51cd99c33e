"""Maximum batch size within a memory limit with at most one extra forward pass (Checkmate paper, Fig. 6).

For U-Net, FCN8, SegNet, ResNet50, VGG19 and MobileNet (and MobileNet again with its BatchNormalization
layers on TensorFlow's fused kernel, ``mobilenet+fused_bn``): the largest batch size that checkpoint-all,
Chen's sqrt(n), Chen's greedy and the Checkmate MILP each train within the memory limit, where a
strategy may spend at most one extra forward pass of compute (see :mod:`checkmate.analysis.max_batch`
for the search, the MILP's yes/no probes and how graphs at each batch size are obtained). The final
batch size of every strategy is re-extracted and re-solved; where the limit is small enough for this
machine (at most ``--confirm-max-bytes``), the compiled step is run at that size and its peak memory
measured, and each row says whether its final size was run or only planned.

    python experiments/max_batch.py --quick   # 32x32 / 64x64 inputs, limit = weights + 48 MiB, 4 models
    python experiments/max_batch.py           # the paper's setting: 16 GB, all 6 models, writes max_batch_full.*
    nohup nice python experiments/max_batch.py > max_batch_full.log 2>&1 &   # the same, in the background

The full setting uses the paper's inputs: U-Net, FCN8 and SegNet at 416x608, ResNet50, VGG19 and
MobileNet at 224x224, a 16 GB limit (a V100's memory) and a 120 s limit per MILP probe. On ResNet50,
whose flat MILP is too large for that limit, the hierarchical strategy is searched too and reported
under its own name (``FULL_EXTRA_STRATEGIES``); the MILP's row stays the MILP's. Every probe is
kept under ``--cache-dir`` (default ``~/.cache/checkmate/max_batch``): a run that is interrupted and
started again with the same settings reads the probes it already answered instead of solving them again
(``--no-cache`` turns this off).

The memory limit counts everything resident during the step: weights and the batch (the graph's
fixed memory) plus activations and gradients. At quick sizes a fixed absolute limit would be dominated
by the weights, so the quick setting gives each model its own weights plus the same activation
allowance.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

from checkmate.analysis.max_batch import DEFAULT_CONFIRM_MAX_BYTES, DEFAULT_STRATEGIES, search_model  # noqa: E402
from checkmate.analysis.point_cache import PointCache  # noqa: E402
from checkmate.solvers import format_bytes, parse_budget  # noqa: E402

MODELS = ("unet", "fcn8", "segnet", "resnet50", "vgg19", "mobilenet", "mobilenet+fused_bn")
# Rows of a zoo model lowered another way: "<model>+fused_bn" runs its BatchNormalization layers on
# TensorFlow's fused kernel (``lower(..., fused_batch_norm=True)``), as tf.keras did by default when
# the paper was written. Keras 3's separate batch-norm ops keep three activation-sized temporaries in
# the backward of each such layer, which sets MobileNet's working set (see the results README).
VARIANTS = {"+fused_bn": {"fused_batch_norm": True}}
QUICK_MODELS = ("unet", "segnet", "vgg19", "mobilenet")
QUICK_SHAPES = {"mobilenet+fused_bn": (32, 32, 3), "unet": (64, 64, 3), "fcn8": (64, 64, 3), "segnet": (64, 64, 3), "resnet50": (32, 32, 3),
                "vgg19": (32, 32, 3), "mobilenet": (32, 32, 3)}
# The paper's inputs: the segmentation models at 416x608, the classifiers at ImageNet's 224x224.
FULL_SHAPES = {"unet": (416, 608, 3), "fcn8": (416, 608, 3), "segnet": (416, 608, 3), "resnet50": (224, 224, 3),
               "vgg19": (224, 224, 3), "mobilenet": (224, 224, 3), "mobilenet+fused_bn": (224, 224, 3)}
QUICK_ALLOWANCE_BYTES = 48 << 20
FULL_LIMIT_BYTES = 16 * 10**9
# Per MILP probe. Most probes are answered in seconds (a baseline's schedule, the LP bound or its
# rounding); the limit bounds the few that need branch and bound, which stay undecided if it is reached.
QUICK_TIME_LIMIT_S = 20.0
FULL_TIME_LIMIT_S = 120.0
# The MILP's stopping gap for the solves that are not yes/no probes (the confirmation's compile).
MIP_GAP = 0.02
DEFAULT_CACHE_DIR = Path.home() / ".cache" / "checkmate" / "max_batch"
# Strategies added to the full setting's rows of one model, each reported under its own name. On
# ResNet50's 390-node layer graph (266,000 columns) the flat MILP's LP relaxation alone outlasts a
# probe's time limit (still unsolved after 5 minutes here), so its probes above Chen's greedy stay
# undecided; the hierarchical strategy is reported beside it.
FULL_EXTRA_STRATEGIES = {"resnet50": ("hierarchical",)}
COLUMNS = ["model", "input_shape", "memory_bytes", "nodes", "fixed_bytes", "checkpoint_all_bytes_per_sample",
           "working_set_bound_batch", "strategy", "max_batch_size", "ratio_vs_checkpoint_all",
           "final_peak_bytes", "final_overhead", "final_answered_by", "probes", "undecided_probes",
           "is_lower_bound", "cached_probes", "search_seconds", "probe_seconds", "final_size_run", "measured_peak_bytes",
           "measured_step_peak_bytes", "predicted_step_peak_bytes", "measured_status"]


def quick_limit(model: str, shape) -> int:
    """The model's fixed memory at batch size 1 (weights, batch) plus the activation allowance."""
    from checkmate.analysis.models import extract_graph

    name, options = zoo_name(model)
    return extract_graph(name, 1, input_shape=shape, **options).fixed_mem + QUICK_ALLOWANCE_BYTES


def zoo_name(model: str) -> tuple[str, dict]:
    """The zoo model behind a row name and the lowering options of its variant."""
    for suffix, options in VARIANTS.items():
        if model.endswith(suffix):
            return model[: -len(suffix)], dict(options)
    return model, {}


def graph_facts(model: str, shape, limit: int) -> dict:
    """What sets a model's batch sizes: its graph's nodes, the bytes resident whatever the batch
    (weights, their gradients; the batch of one sample is left out), checkpoint-all's bytes per sample,
    and the largest batch at which every node's inputs and output fit the limit together (with the
    resident bytes): no schedule of any strategy fits a larger one."""
    from checkmate.analysis.max_batch import BatchGraphFamily
    from checkmate.analysis.models import extract_graph
    from checkmate.bounds import largest_working_set_bytes
    from checkmate.solvers import checkpoint_all_peak

    name, options = zoo_name(model)
    g1, g2 = (extract_graph(name, b, input_shape=shape, **options) for b in (1, 2))
    per_sample = checkpoint_all_peak(g2) - checkpoint_all_peak(g1)
    family = BatchGraphFamily(g1, 1, g2, 2, name=model)
    # the same doubling and bisection as the search, on the working-set bound alone
    lo, hi = 0, 1
    while largest_working_set_bytes(family(hi)) <= limit:
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if largest_working_set_bytes(family(mid)) <= limit else (lo, mid)
    bound = lo
    return {"nodes": g1.n, "fixed_bytes": 2 * g1.fixed_mem - g2.fixed_mem,
            "checkpoint_all_bytes_per_sample": per_sample, "working_set_bound_batch": bound}


def result_rows(model: str, shape, limit: int, results, facts: dict | None = None) -> list[dict]:
    base = next((r.max_batch_size for r in results if r.strategy == "checkpoint_all"), 0)
    rows = []
    for r in results:
        measured = r.measured or {}
        status = measured.get("status", "")
        rows.append({
            "model": model, "input_shape": "x".join(map(str, shape)), "memory_bytes": limit, **(facts or {}),
            "strategy": r.strategy, "max_batch_size": r.max_batch_size,
            "ratio_vs_checkpoint_all": round(r.max_batch_size / base, 3) if base else None,
            "final_peak_bytes": r.final.peak_memory_bytes if r.final else None,
            "final_overhead": round(r.final.overhead, 4) if r.final and r.final.overhead else None,
            "final_answered_by": r.final.source if r.final else None,
            "probes": len(r.probes), "undecided_probes": " ".join(map(str, r.undecided)),
            "is_lower_bound": r.is_lower_bound,
            "cached_probes": sum(p.cached for p in r.probes) + bool(r.final and r.final.cached),
            "search_seconds": round(r.seconds, 1),
            # the solvers' own time, including that of probes read from the cache (solved in an earlier run)
            "probe_seconds": round(sum(p.solve_seconds for p in r.probes)
                                   + (r.final.solve_seconds if r.final else 0.0), 1),
            "final_size_run": "run" if "peak_memory_bytes" in measured else (
                "planned only" if status.startswith("planned only") else "run failed"),
            "measured_peak_bytes": measured.get("peak_memory_bytes"),
            "measured_step_peak_bytes": measured.get("measured_step_peak_bytes"),
            "predicted_step_peak_bytes": measured.get("predicted_step_peak_bytes"),
            "measured_status": status,
        })
    return rows


def main(argv=None) -> int:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--models", default=None, help=f"comma-separated subset of {','.join(MODELS)}")
    p.add_argument("--strategies", default=",".join(DEFAULT_STRATEGIES))
    p.add_argument("--time-limit", type=float, default=None, help="per-probe time limit in seconds")
    p.add_argument("--memory", default=None, help="override the memory limit (bytes or 16GB-style)")
    p.add_argument("--no-confirm", action="store_true", help="do not run the compiled step at the final sizes")
    p.add_argument("--confirm-max-bytes", default=str(DEFAULT_CONFIRM_MAX_BYTES),
                   help="run the compiled step only for limits up to this size (default 8 GB)")
    p.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR,
                   help=f"where every probe is kept, so a rerun resumes (default {DEFAULT_CACHE_DIR})")
    p.add_argument("--no-cache", action="store_true", help="solve every probe, keep none")
    args = p.parse_args(argv)
    started = time.perf_counter()
    models = args.models.split(",") if args.models else list(QUICK_MODELS if args.quick else MODELS)
    strategies = args.strategies.split(",")
    time_limit = args.time_limit or (QUICK_TIME_LIMIT_S if args.quick else FULL_TIME_LIMIT_S)
    cache = PointCache(None if args.no_cache else args.cache_dir)
    stem = "max_batch" if args.quick else "max_batch_full"
    shapes = QUICK_SHAPES if args.quick else FULL_SHAPES

    from tqdm.auto import tqdm

    rows, results_for_plot = [], []
    args.out.mkdir(parents=True, exist_ok=True)
    for model in tqdm(models, desc="max batch", unit="model"):
        shape = shapes[model]
        if args.memory:
            limit = parse_budget(args.memory)
        else:
            limit = quick_limit(model, shape) if args.quick else FULL_LIMIT_BYTES
        t0 = time.perf_counter()
        extra = () if args.quick else FULL_EXTRA_STRATEGIES.get(model, ())
        name, options = zoo_name(model)
        results = search_model(name, limit, strategies + [s for s in extra if s not in strategies],
                               input_shape=shape, time_limit_s=time_limit,
                               confirm=False if args.no_confirm else None,
                               confirm_max_bytes=parse_budget(args.confirm_max_bytes), progress=True, cache=cache,
                               mip_gap=MIP_GAP, **options)
        model_rows = result_rows(model, shape, limit, results, graph_facts(model, shape, limit))
        rows += model_rows
        tqdm.write(f"{model} {'x'.join(map(str, shape))}: limit {format_bytes(limit)}, "
                   f"{time.perf_counter() - t0:.0f} s")
        for row in model_rows:
            results_for_plot.append({k: row[k] for k in ("model", "strategy", "max_batch_size")})
            note = f"  undecided at {row['undecided_probes']}" if row["undecided_probes"] else ""
            tqdm.write(f"  {row['strategy']:<16} {row['max_batch_size']:>5}  {row['final_size_run']}{note}")
        # written after every model, so a long run shows its finished models as it goes
        common.write_csv(args.out / f"{stem}.csv", rows, COLUMNS)

    from checkmate.analysis.plots import plot_max_batch

    csv_path = common.write_csv(args.out / f"{stem}.csv", rows, COLUMNS)
    png_path = plot_max_batch(results_for_plot, args.out / f"{stem}.png",
                              title="largest batch size within the memory limit (<= 1 extra forward pass)")
    common.write_meta(args.out / f"{stem}.meta.json", "quick" if args.quick else "full",
                      {"models": models, "strategies": strategies, "time_limit_s": time_limit,
                       "memory_bytes": None if args.quick and not args.memory else
                       (parse_budget(args.memory) if args.memory else FULL_LIMIT_BYTES),
                       "input_shapes": {m: "x".join(map(str, shapes[m])) for m in models},
                       "quick_allowance_bytes": QUICK_ALLOWANCE_BYTES if args.quick else None,
                       "probe_cache": {"hits": cache.hits, "misses": cache.misses}}, started)
    print(f"wrote {csv_path} and {png_path}")
    common.finish(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
