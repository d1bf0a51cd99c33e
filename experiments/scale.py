"""Scale: schedules for deep models, 500 to 10,000-node graphs.

Deep transformer stacks (decoder-only: pre-LN, causal multi-head attention, GELU MLP; batch 8,
sequence 128, width 256) and ResNet-50/101/152 (keras.applications, 64x64 inputs, batch 8) are
lowered at layer level (gradient nodes) and op level. On each graph, at its fixed bytes (weights,
their gradients, the batch) plus half of the rest of its checkpoint-all peak (or, where no baseline
reaches that, halfway between the least peak a baseline reaches and the checkpoint-all peak), every
strategy gets the same time limit: the hierarchical strategy, Chen et al.'s greedy
segmentation, binomial checkpointing (griewank_logn) and the flat MILP. Each solve runs in a child
process that is stopped at twice the limit (the flat MILP builds its O(n^2) model before its time
limit applies); the flat MILP is not attempted where its model would not fit in memory.

Columns: nodes, solve seconds, overhead (compute cost / checkpoint-all's), the lower bound and the
gap it proves, and the status.

    python experiments/scale.py --quick    # 4- and 12-block transformers, ResNet-50 at layer level
    python experiments/scale.py            # 12/24/48/96 blocks (layer), 12/24/48 (op), ResNet-50/101/152
    python experiments/scale.py --models resnet   # only those configurations, merged into scale.csv
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

STRATEGIES = ("hierarchical", "chen_greedy", "griewank_logn", "checkmate_milp")
QUICK = {"transformer": [(4, "layer"), (12, "layer"), (4, "op")], "resnet": [(50, "layer")], "time_limit_s": 120}
FULL = {"transformer": [(12, "layer"), (24, "layer"), (48, "layer"), (96, "layer"), (12, "op"), (24, "op"),
                        (48, "op")],
        "resnet": [(50, "layer"), (101, "layer"), (152, "layer"), (50, "op")], "time_limit_s": 600}
# The flat MILP's model has about 3 n^2 variables and rows with several nonzeros each; beyond this
# many nodes it needs more memory than this machine has before any time limit applies.
FLAT_MILP_MAX_NODES = 1500
# The budget: the fixed bytes plus this share of the checkpoint-all peak above them. (A share of the
# whole peak would fall below the weights of the ResNets at these input sizes.)
ACTIVATION_FRACTION = 0.5
COLUMNS = ["model", "level", "depth", "nodes", "strategy", "budget_bytes", "time_limit_s", "solve_seconds",
           "overhead", "lower_bound_overhead", "gap", "peak_bytes", "status"]
CACHE = Path(os.environ.get("CHECKMATE_SCALE_CACHE", Path.home() / ".cache" / "checkmate" / "scale"))


def decoder(blocks: int, seq: int = 128, width: int = 256, heads: int = 4, vocab: int = 512):
    import keras

    layers = keras.layers
    keras.utils.set_random_seed(0)
    tokens = keras.Input((seq,), dtype="int32", name="tokens")
    x = layers.Embedding(vocab, width, name="embed")(tokens)
    for b in range(blocks):
        h = layers.LayerNormalization(name=f"b{b}_ln1")(x)
        h = layers.MultiHeadAttention(heads, width // heads, name=f"b{b}_attn")(h, h, use_causal_mask=True)
        x = layers.Add(name=f"b{b}_res1")([x, h])
        h = layers.LayerNormalization(name=f"b{b}_ln2")(x)
        h = layers.Dense(4 * width, activation="gelu", name=f"b{b}_ff1")(h)
        h = layers.Dense(width, name=f"b{b}_ff2")(h)
        x = layers.Add(name=f"b{b}_res2")([x, h])
    x = layers.LayerNormalization(name="ln_f")(x)
    return keras.Model(tokens, layers.Dense(vocab, name="logits")(x), name=f"decoder{blocks}")


def graph_for(model: str, depth: int, level: str):
    """Lower (once; cached as a graph file) and load the graph of one configuration."""
    import checkmate

    path = CACHE / f"{model}{depth}_{level}.json"
    if path.exists():
        return checkmate.load_graph(path)
    import keras
    import tensorflow as tf

    from checkmate.tf2.lowering import lower

    if model == "transformer":
        net = decoder(depth)
        x_spec, y_spec = tf.TensorSpec((8, 128), tf.int32), tf.TensorSpec((8, 128), tf.int32)
    else:
        net = getattr(keras.applications, f"ResNet{depth}")(weights=None, input_shape=(64, 64, 3), classes=100)
        x_spec, y_spec = tf.TensorSpec((8, 64, 64, 3)), tf.TensorSpec((8,), tf.int32)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=model == "transformer")
    graph = lower(net, loss, x_spec, y_spec, level=level, gradient_nodes=level == "layer", progress=False).graph
    checkmate.save_graph(graph, path)
    return graph


def least_baseline_peak(graph) -> int:
    """The least peak that chen_greedy, griewank_logn or checkpoint_last_node reaches on ``graph``."""
    import checkmate

    peaks = []
    for name in ("chen_greedy", "griewank_logn", "checkpoint_last_node"):
        try:
            peaks.append(checkmate.solve(graph, graph.fixed_mem + 1, strategy=name).peak_memory_bytes)
        except checkmate.errors.InfeasibleBudgetError as exc:
            if exc.min_feasible_budget_bytes is not None:
                peaks.append(int(exc.min_feasible_budget_bytes))
    return min(peaks)


def budget_for(graph) -> int:
    """Fixed bytes plus ACTIVATION_FRACTION of the rest of the checkpoint-all peak; where no baseline
    reaches that, halfway between the least baseline peak and the checkpoint-all peak instead, so that
    every configuration has feasible schedules to compare."""
    from checkmate.bounds import checkpoint_all_peak

    peak = checkpoint_all_peak(graph)
    budget = graph.fixed_mem + int(ACTIVATION_FRACTION * (peak - graph.fixed_mem))
    frugal = least_baseline_peak(graph)
    return budget if budget >= frugal else frugal + (peak - frugal) // 2


def _solve_child(path: str, budget: int, strategy: str, time_limit_s: float, queue) -> None:
    import checkmate

    graph = checkmate.load_graph(path)
    start = time.perf_counter()
    try:
        result = checkmate.solve(graph, budget, strategy=strategy, time_limit_s=time_limit_s)
        queue.put({"solve_seconds": time.perf_counter() - start, "overhead": result.overhead,
                   "lower_bound_overhead": (result.lower_bound / graph.total_cost
                                            if result.lower_bound is not None else None),
                   "gap": result.gap, "peak_bytes": result.peak_memory_bytes, "status": result.status})
    except checkmate.errors.CheckmateError as exc:
        queue.put({"solve_seconds": time.perf_counter() - start, "status": f"{type(exc).__name__}: {exc}"[:200]})


def run_one(path: Path, nodes: int, budget: int, strategy: str, time_limit_s: float) -> dict:
    if strategy == "checkmate_milp" and nodes > FLAT_MILP_MAX_NODES:
        return {"status": f"not run: the flat model of {nodes} nodes does not fit in memory"}
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_solve_child, args=(str(path), budget, strategy, time_limit_s, queue))
    start = time.perf_counter()
    child.start()
    child.join(2 * time_limit_s + 60)
    if child.is_alive():
        child.kill()
        child.join()
        return {"solve_seconds": time.perf_counter() - start, "status": "stopped at twice the time limit"}
    return queue.get() if not queue.empty() else {"status": f"exited with code {child.exitcode}"}


def main(argv=None) -> int:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--time-limit", type=float, default=None, help="seconds per solve")
    p.add_argument("--models", choices=("transformer", "resnet"), default=None,
                   help="run only this family and merge its rows into an existing scale.csv")
    args = p.parse_args(argv)
    setting = QUICK if args.quick else FULL
    limit = args.time_limit or setting["time_limit_s"]
    started = time.perf_counter()
    CACHE.mkdir(parents=True, exist_ok=True)
    rows = []
    configs = [("transformer", d, lvl) for d, lvl in setting["transformer"]] + \
              [("resnet", d, lvl) for d, lvl in setting["resnet"]]
    if args.models:
        configs = [c for c in configs if c[0] == args.models]
        existing = args.out / "scale.csv"
        if existing.exists():
            rows = [r for r in common.read_csv(existing) if r["model"] != args.models]
    for model, depth, level in configs:
        graph = graph_for(model, depth, level)
        path = CACHE / f"{model}{depth}_{level}.json"
        budget = budget_for(graph)
        for strategy in STRATEGIES:
            row = {"model": model, "level": level, "depth": depth, "nodes": graph.n, "strategy": strategy,
                   "budget_bytes": budget, "time_limit_s": limit}
            row.update(run_one(path, graph.n, budget, strategy, limit))
            rows.append(row)
            print(f"{model}{depth} {level} ({graph.n} nodes) {strategy}: overhead {row.get('overhead')}, "
                  f"{row.get('solve_seconds', 0):.1f} s, {row.get('status')}", flush=True)
        common.write_csv(args.out / "scale.csv", rows, COLUMNS)
    common.write_csv(args.out / "scale.csv", rows, COLUMNS)
    plot(rows, args.out / "scale.png")
    common.write_meta(args.out / "scale.meta.json", "quick" if args.quick else "full",
                      {"time_limit_s": limit, "activation_fraction": ACTIVATION_FRACTION}, started)
    common.finish(args)
    return 0


def plot(rows, path: Path) -> Path:
    from checkmate.analysis.plots import label, pyplot, save_figure

    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    for strategy in STRATEGIES:
        pts = sorted((int(r["nodes"]), float(r["overhead"]), float(r["solve_seconds"])) for r in rows
                     if r["strategy"] == strategy and r.get("overhead") not in (None, ""))
        if not pts:
            continue
        ax1.plot([p[0] for p in pts], [p[1] for p in pts], "o", label=label(strategy))
        ax2.plot([p[0] for p in pts], [p[2] for p in pts], "o", label=label(strategy))
    ax1.set_ylabel("overhead (x checkpoint-all compute)")
    ax2.set_ylabel("solve time (s)")
    for ax in (ax1, ax2):
        ax.set_xscale("log")
        ax.set_xlabel("graph nodes")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    ax2.set_yscale("log")
    fig.suptitle("deep models at their fixed bytes plus half of the rest of their checkpoint-all peak")
    out = save_figure(fig, path, 150)
    plt.close(fig)
    return out


if __name__ == "__main__":
    sys.exit(main())
