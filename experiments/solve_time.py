"""Solve time, cost, overhead and gap of the optimal and approximate strategies, per solver backend.

Graphs: layer-level training graphs of the zoo's real Keras models (``results/graphs/keras/*.json``,
written by ``extract_graphs.py``: keras-vgg16, keras-unet, ...), synthetic graphs shaped like the
paper's models at the paper's sizes (VGG16, U-Net, FCN8, SegNet, MobileNet, ResNet50: 48-354 nodes;
activation sizes and FLOP-proportional costs of a 224x224 (U-Net, SegNet: 256x256) input),
synthetic chains and random DAGs of 50-1000 nodes, and any graph files given with --graph.

Budgets: fractions of the checkpoint-all peak, and multiples of the minimum feasible budget (found
with :func:`checkmate.solvers.bracket.bracket_minimum_budget`; cached in the results folder).

Each solve runs in a child process and is timed around ``checkmate.solve`` (model construction,
baselines and MIP start included, Python start-up excluded). Results: ``results/solve_time.csv``
(``solve_time_quick.csv`` with --quick) and a plot next to it.

    python experiments/solve_time.py --quick                 # a few minutes (make bench)
    python experiments/solve_time.py                         # the full table (hours on 2 cores)
    python experiments/solve_time.py --graph my_model.json --budgets 0.9,0.8 --strategies checkmate_milp
    python experiments/solve_time.py --only unet,segnet --budgets 1.1min,1.02min --options hierarchical_start=true
    python experiments/solve_time.py --only segnet --budgets 1.1min --label "before: commit abc1234" --out old.csv

``cpu_seconds`` is the processor time of the solving process (all threads) and of the child process it
races (see ``race`` in :class:`checkmate.solvers.types.MilpOptions`): on a shared machine it moves less
with the load than the wall-clock ``seconds``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import multiprocessing as mp
import os
import resource
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from checkmate.graph import Graph, load_graph  # noqa: E402
from checkmate.synthetic import chain, random_forward, training_graph  # noqa: E402

RESULTS = HERE / "results"
BYTES_PER_VALUE = 4      # float32 activations
BATCH = 8


# ------------------------------------------------------------------------------------------ graphs
class _Net:
    """Forward-graph builder with conv-like shapes; sizes in bytes, costs in MFLOPs."""

    def __init__(self):
        self.fwd: list[tuple[str, float, int, list[int]]] = []
        self.shape: dict[int, tuple[int, int, int]] = {}

    def add(self, name, shape, cost, deps):
        h, w, c = shape
        self.fwd.append((name, max(cost, 1e-3), BATCH * h * w * c * BYTES_PER_VALUE, list(deps)))
        self.shape[len(self.fwd) - 1] = shape
        return len(self.fwd) - 1

    def input(self, h, w, c):
        return self.add("input", (h, w, c), 0.01, [])

    def conv(self, name, x, c_out, k=3, stride=1, depthwise=False):
        h, w, c_in = self.shape[x]
        h, w = max(h // stride, 1), max(w // stride, 1)
        macs = h * w * k * k * (c_in if depthwise else c_in * c_out)
        return self.add(name, (h, w, c_in if depthwise else c_out), BATCH * macs * 2 / 1e6, [x])

    def pointwise(self, name, x, factor=1.0):
        """bn / relu / dropout / pad: same shape, cheap."""
        h, w, c = self.shape[x]
        return self.add(name, (h, w, c), BATCH * h * w * c * factor / 1e6, [x])

    def pool(self, name, x, stride=2):
        h, w, c = self.shape[x]
        return self.add(name, (max(h // stride, 1), max(w // stride, 1), c), BATCH * h * w * c / 1e6, [x])

    def up(self, name, x, c_out=None, stride=2):
        h, w, c = self.shape[x]
        c_out = c_out or c
        return self.add(name, (h * stride, w * stride, c_out), BATCH * h * w * c * c_out * 4 * 2 / 1e6, [x])

    def merge(self, name, xs, concat=False):
        h, w, c = self.shape[xs[0]]
        c = sum(self.shape[x][2] for x in xs) if concat else c
        return self.add(name, (h, w, c), BATCH * h * w * c / 1e6, xs)

    def dense(self, name, x, units):
        h, w, c = self.shape[x]
        return self.add(name, (1, 1, units), BATCH * h * w * c * units * 2 / 1e6, [x])

    def loss(self, x):
        self.fwd.append(("loss", 0.01, BYTES_PER_VALUE, [x]))

    def graph(self, name):
        return training_graph(self.fwd, name=name)


def vgg16() -> Graph:
    net = _Net()
    x = net.input(224, 224, 3)
    for block, (reps, ch) in enumerate([(2, 64), (2, 128), (3, 256), (3, 512), (3, 512)]):
        for r in range(reps):
            x = net.conv(f"block{block + 1}_conv{r + 1}", x, ch)
        x = net.pool(f"block{block + 1}_pool", x)
    x = net.add("flatten", (1, 1, 7 * 7 * 512), 0.01, [x])
    for i, units in enumerate([4096, 4096, 1000]):
        x = net.dense(f"fc{i + 1}", x, units)
    net.loss(x)
    return net.graph("vgg16")


def unet() -> Graph:
    net = _Net()
    x = net.input(256, 256, 3)
    skips = []
    ch = 64
    for level in range(4):
        x = net.conv(f"down{level}_conv1", x, ch)
        x = net.conv(f"down{level}_conv2", x, ch)
        skips.append(x)
        x = net.pool(f"down{level}_pool", x)
        ch *= 2
    x = net.conv("bottom_conv1", x, ch)
    x = net.pointwise("bottom_drop1", x)
    x = net.conv("bottom_conv2", x, ch)
    x = net.pointwise("bottom_drop2", x)
    for level in reversed(range(4)):
        ch //= 2
        x = net.up(f"up{level}_upconv", x, ch)
        x = net.merge(f"up{level}_concat", [x, skips[level]], concat=True)
        x = net.conv(f"up{level}_conv1", x, ch)
        x = net.conv(f"up{level}_conv2", x, ch)
    x = net.conv("head", x, 2, k=1)
    net.loss(x)
    return net.graph("unet")


def fcn8() -> Graph:
    net = _Net()
    x = net.input(224, 224, 3)
    pools = []
    for block, (reps, ch) in enumerate([(2, 64), (2, 128), (3, 256), (3, 512), (3, 512)]):
        for r in range(reps):
            x = net.conv(f"block{block + 1}_conv{r + 1}", x, ch)
        x = net.pool(f"block{block + 1}_pool", x)
        pools.append(x)
    x = net.conv("fc6", x, 4096, k=7)
    x = net.pointwise("drop6", x)
    x = net.conv("fc7", x, 4096, k=1)
    x = net.pointwise("drop7", x)
    x = net.conv("score_fr", x, 21, k=1)
    x = net.up("upscore2", x, 21)
    s4 = net.conv("score_pool4", pools[3], 21, k=1)
    x = net.merge("fuse_pool4", [x, s4])
    x = net.up("upscore_pool4", x, 21)
    s3 = net.conv("score_pool3", pools[2], 21, k=1)
    x = net.merge("fuse_pool3", [x, s3])
    x = net.up("upscore8", x, 21, stride=8)
    net.loss(x)
    return net.graph("fcn8")


def segnet() -> Graph:
    net = _Net()
    x = net.input(256, 256, 3)
    pools = []
    plan = [(2, 64), (2, 128), (3, 256), (3, 512), (3, 512)]
    for block, (reps, ch) in enumerate(plan):
        for r in range(reps):
            x = net.conv(f"enc{block + 1}_conv{r + 1}", x, ch)
        x = net.pool(f"enc{block + 1}_pool", x)
        pools.append(x)
    for block, (reps, ch) in reversed(list(enumerate(plan))):
        x = net.up(f"dec{block + 1}_unpool", x, net.shape[x][2])
        # max-unpooling reads the pooling indices of its encoder level
        net.fwd[x] = (net.fwd[x][0], net.fwd[x][1], net.fwd[x][2], net.fwd[x][3] + [pools[block]])
        for r in range(reps):
            out_ch = ch if r < reps - 1 or block == 0 else plan[block - 1][1]
            x = net.conv(f"dec{block + 1}_conv{r + 1}", x, out_ch)
    x = net.conv("head", x, 12, k=1)
    net.loss(x)
    return net.graph("segnet")


def mobilenet() -> Graph:
    net = _Net()
    x = net.input(224, 224, 3)
    x = net.conv("conv1", x, 32, stride=2)
    x = net.pointwise("conv1_bn", x)
    x = net.pointwise("conv1_relu", x)
    blocks = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2)] + [(512, 1)] * 5 + [(1024, 2), (1024, 1)]
    for b, (ch, stride) in enumerate(blocks):
        if stride == 2:
            x = net.pointwise(f"pad_{b + 1}", x, 0.1)
        x = net.conv(f"conv_dw_{b + 1}", x, 0, stride=stride, depthwise=True)
        x = net.pointwise(f"conv_dw_{b + 1}_bn", x)
        x = net.pointwise(f"conv_dw_{b + 1}_relu", x)
        x = net.conv(f"conv_pw_{b + 1}", x, ch, k=1)
        x = net.pointwise(f"conv_pw_{b + 1}_bn", x)
        x = net.pointwise(f"conv_pw_{b + 1}_relu", x)
    x = net.pool("global_pool", x, stride=7)
    x = net.pointwise("reshape_1", x, 0.1)
    x = net.pointwise("dropout", x)
    x = net.dense("conv_preds", x, 1000)
    x = net.pointwise("reshape_2", x, 0.1)
    x = net.pointwise("act_softmax", x)
    net.loss(x)
    return net.graph("mobilenet")


def resnet50() -> Graph:
    net = _Net()
    x = net.input(224, 224, 3)
    x = net.pointwise("conv1_pad", x, 0.1)
    x = net.conv("conv1", x, 64, k=7, stride=2)
    x = net.pointwise("bn_conv1", x)
    x = net.pointwise("conv1_relu", x)
    x = net.pool("pool1", x)
    for stage, (blocks, ch) in enumerate([(3, 64), (4, 128), (6, 256), (3, 512)]):
        for b in range(blocks):
            stride = 2 if b == 0 and stage > 0 else 1
            name = f"res{stage + 2}{'abcdef'[b]}"
            shortcut = x
            y = net.conv(f"{name}_branch2a", x, ch, k=1, stride=stride)
            y = net.pointwise(f"{name}_bn2a", y)
            y = net.pointwise(f"{name}_relu2a", y)
            y = net.conv(f"{name}_branch2b", y, ch)
            y = net.pointwise(f"{name}_bn2b", y)
            y = net.pointwise(f"{name}_relu2b", y)
            y = net.conv(f"{name}_branch2c", y, 4 * ch, k=1)
            y = net.pointwise(f"{name}_bn2c", y)
            if b == 0:
                shortcut = net.conv(f"{name}_branch1", x, 4 * ch, k=1, stride=stride)
                shortcut = net.pointwise(f"{name}_bn1", shortcut)
            x = net.merge(f"{name}_add", [y, shortcut])
            x = net.pointwise(f"{name}_relu", x)
    x = net.pool("avg_pool", x, stride=7)
    x = net.dense("fc1000", x, 1000)
    net.loss(x)
    return net.graph("resnet50")


MODEL_GRAPHS = {"vgg16": vgg16, "unet": unet, "fcn8": fcn8, "segnet": segnet, "mobilenet": mobilenet,
                "resnet50": resnet50}


def synthetic_graphs(quick: bool) -> dict:
    layers = [25, 64] if quick else [25, 64, 125, 250, 500]
    out = {f"chain{2 * L + 2}": (lambda L=L: chain(L, name=f"chain{2 * L + 2}")) for L in layers}
    sizes = [] if quick else [25, 50]
    for n in sizes:
        out[f"random{2 * n + 2}"] = lambda n=n: random_forward(n, seed=1, name=f"random{2 * n + 2}")
    return out


# Budgets per graph in the full run: the performance bar's (90%, 80% and 1.1x the minimum for the
# 45-80-node models; 90%/80% for MobileNet; 80% for ResNet50), tighter ones for the synthetic graphs.
FULL_BUDGETS = {"vgg16": "0.9,0.8,1.1min", "unet": "0.9,0.8,1.1min", "fcn8": "0.9,0.8,1.1min",
                "segnet": "0.9,0.8,1.1min", "mobilenet": "0.9,0.8", "resnet50": "0.8"}
FULL_BUDGETS.update({f"keras-{k}": v for k, v in FULL_BUDGETS.items()})
KERAS_GRAPHS = RESULTS / "graphs" / "keras"
QUICK_KERAS = ["keras-unet"]
SYNTHETIC_BUDGETS = "0.8,0.4"
# Strategies compared besides checkmate_milp on HiGHS, on graphs up to this many nodes, each with at
# most COMPARE_TIME_LIMIT_S seconds (the full table would otherwise take most of a day on 2 cores).
COMPARE_UP_TO_NODES = 80
COMPARE_TIME_LIMIT_S = 120.0
COMPARE = [("checkmate_milp", "cvxpy"), ("checkmate_milp", "ortools"), ("checkmate_lp_rounding", "highs"),
           ("lower_bound_lp", "highs"), ("chen_greedy", None), ("griewank_logn", None)]


# ------------------------------------------------------------------------------------------ runs
def _cpu_seconds() -> float:
    """Processor seconds of this process (all threads) and of its finished children (the CP-SAT
    process that branch and bound races)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def _child(graph_dict, budget_bytes, strategy, solver, time_limit_s, options, queue):
    from checkmate.graph import graph_from_dict
    from checkmate.solvers import solve

    graph = graph_from_dict(graph_dict)
    started = time.perf_counter()
    started_cpu = _cpu_seconds()
    try:
        r = solve(graph, budget_bytes, strategy, solver=solver, time_limit_s=time_limit_s,
                  **{"threads": 2, **options})
        queue.put({"seconds": time.perf_counter() - started, "cpu_seconds": _cpu_seconds() - started_cpu,
                   "cost": r.compute_cost, "overhead": r.overhead,
                   "gap": r.gap, "lower_bound": r.lower_bound, "optimal": r.optimal, "status": r.status,
                   "peak_bytes": r.peak_memory_bytes, "solver": r.solver})
    except Exception as exc:  # recorded, not fatal: the table shows which runs failed and why
        queue.put({"seconds": time.perf_counter() - started, "status": f"{type(exc).__name__}: {exc}"[:200]})


def run_one(graph: Graph, budget_bytes: int, strategy: str, solver: str | None, time_limit_s: float,
            options: dict | None = None) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(graph.to_dict(), budget_bytes, strategy, solver, time_limit_s,
                                            dict(options or {}), queue))
    proc.start()
    try:
        result = queue.get(timeout=time_limit_s * 1.5 + 120)
    except Exception:
        result = {"seconds": math.nan, "status": "no answer (killed)"}
    proc.join(timeout=10)
    if proc.is_alive():
        proc.kill()
    return result


def min_budgets(graphs: dict, time_limit_s: float, cache_path: Path) -> dict:
    """Minimum feasible budgets, cached (graph name + size -> bytes, proven flag)."""
    from checkmate.solvers import SolveOptions
    from checkmate.solvers.bracket import bracket_minimum_budget

    cache = json.loads(cache_path.read_text()) if cache_path.exists() else {}
    for name, graph in graphs.items():
        key = f"{graph.name}:{graph.n}:{len(graph.edges)}:{int(graph.mem.sum())}"
        if key not in cache:
            mb = bracket_minimum_budget(graph, SolveOptions(threads=2), time_limit_s=time_limit_s)
            cache[key] = {"bytes": mb.feasible_bytes, "lower": mb.lower_bytes, "proven": mb.proven}
            cache_path.write_text(json.dumps(cache, indent=1))
        graph_min = cache[key]
        graphs[name] = (graph, graph_min)
    return graphs


# cpu_seconds: processor time of the solving process, all its threads (on a shared machine it moves less
# with the load than the wall-clock seconds do).
FIELDS = ["graph", "nodes", "edges", "strategy", "solver", "budget", "budget_bytes", "seconds", "cpu_seconds", "cost",
          "overhead", "gap", "optimal", "lower_bound", "peak_bytes", "status", "options"]


def parse_options(spec: str | None) -> dict:
    """'mip_gap=0.01,hierarchical_start=true' -> {"mip_gap": 0.01, "hierarchical_start": True}."""
    out: dict = {}
    for part in (spec or "").split(","):
        if not part.strip():
            continue
        key, _, text = part.partition("=")
        text = text.strip()
        lowered = text.lower()
        if lowered in ("true", "false"):
            value: object = lowered == "true"
        else:
            try:
                value = int(text)
            except ValueError:
                try:
                    value = float(text)
                except ValueError:
                    value = text
        out[key.strip()] = value
    return out


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    series: dict[str, list] = {}
    for r in rows:
        if r.get("cost") in (None, ""):
            continue
        key = f"{r['strategy']} [{r['solver']}]"
        series.setdefault(key, []).append(r)
    for key, rs in sorted(series.items()):
        xs = [int(r["nodes"]) for r in rs]
        axes[0].scatter(xs, [float(r["seconds"]) for r in rs], label=key, s=18)
        gaps = [100 * float(r["gap"]) if r.get("gap") not in (None, "") else math.nan for r in rs]
        axes[1].scatter(xs, gaps, label=key, s=18)
    axes[0].set(xscale="log", yscale="log", xlabel="nodes", ylabel="solve seconds (wall, incl. model build)",
                title="solve time")
    axes[1].set(xscale="log", xlabel="nodes", ylabel="gap to lower bound [%]", title="optimality gap")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parse_budget_spec(spec: str) -> list[tuple[str, str, float]]:
    """'0.9,0.8,1.1min' -> [("90%", "frac", .9), ("80%", "frac", .8), ("1.1x min", "min", 1.1)]."""
    out = []
    for part in spec.split(","):
        part = part.strip()
        if part.endswith("min"):
            k = float(part[:-3])
            out.append((f"{k:g}x min", "min", k))
        else:
            f = float(part)
            out.append((f"{100 * f:g}%", "frac", f))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a few graphs and budgets (minutes)")
    ap.add_argument("--graph", action="append", default=[], help="graph file(s) to add (JSON)")
    ap.add_argument("--no-keras", action="store_true", help="leave out results/graphs/keras/*.json")
    ap.add_argument("--only", default=None, help="comma-separated graph names to run")
    ap.add_argument("--budgets", default=None, help="e.g. 0.9,0.8,1.1min (fractions of checkpoint-all, multiples of min)")
    ap.add_argument("--strategies", default=None, help="comma-separated strategy[:solver] entries")
    ap.add_argument("--time-limit", type=float, default=None, help="seconds per solve")
    ap.add_argument("--options", default=None,
                    help="solve() options for every run, e.g. mip_gap=0.005,hierarchical_start=true")
    ap.add_argument("--label", default=None,
                    help="name of the variant in the CSV's options column (default: the --options text)")
    ap.add_argument("--out", default=None, help="CSV path")
    args = ap.parse_args(argv)
    options = parse_options(args.options)

    from checkmate.solvers import checkpoint_all_peak

    quick = args.quick
    time_limit = args.time_limit or (60.0 if quick else 600.0)
    graphs: dict[str, Graph] = {}
    model_names = ["vgg16", "unet"] if quick else list(MODEL_GRAPHS)
    for name in model_names:
        graphs[name] = MODEL_GRAPHS[name]()
    if not args.no_keras:
        for path in sorted(KERAS_GRAPHS.glob("*.json")):
            g = load_graph(path)
            if not quick or g.name in QUICK_KERAS:
                graphs[g.name] = g
    for name, make in synthetic_graphs(quick).items():
        graphs[name] = make()
    for path in args.graph:
        g = load_graph(path)
        graphs[g.name] = g
    if args.only:
        keep = set(args.only.split(","))
        graphs = {k: v for k, v in graphs.items() if k in keep}

    if args.strategies:
        fixed_runs = [tuple(x.split(":")) if ":" in x else (x, None) for x in args.strategies.split(",")]
    else:
        fixed_runs = None

    def runs_for(graph):
        if fixed_runs:
            return fixed_runs
        if quick:
            return [("checkmate_milp", "highs"), ("checkmate_lp_rounding", "highs"), ("chen_greedy", None)]
        return [("checkmate_milp", "highs")] + (COMPARE if graph.n <= COMPARE_UP_TO_NODES else [])

    def budgets_for(name):
        if args.budgets:
            return parse_budget_spec(args.budgets)
        if quick:
            return parse_budget_spec("0.9,0.8")
        return parse_budget_spec(FULL_BUDGETS.get(name, SYNTHETIC_BUDGETS))

    RESULTS.mkdir(parents=True, exist_ok=True)
    suffix = "_quick" if quick else ""
    out_path = Path(args.out) if args.out else RESULTS / f"solve_time{suffix}.csv"
    need_min = {k: g for k, g in graphs.items() if any(kind == "min" for _, kind, _ in budgets_for(k))}
    with_min = {k: (g, None) for k, g in graphs.items()}
    with_min.update(min_budgets(need_min, min(time_limit, 120.0), RESULTS / "solve_time_min_budgets.json"))

    rows = []
    with open(out_path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=FIELDS)
        writer.writeheader()
        for name, (graph, gmin) in with_min.items():
            peak = checkpoint_all_peak(graph)
            for label, kind, value in budgets_for(name):
                if kind == "min":
                    budget = int(gmin["bytes"] * value)
                    label = label + ("" if gmin["proven"] else " (min not proven)")
                else:
                    budget = int(peak * value)
                for strategy, solver in runs_for(graph):
                    limit = time_limit
                    if not quick and not fixed_runs and (strategy, solver) in COMPARE:
                        limit = min(time_limit, COMPARE_TIME_LIMIT_S)
                    res = run_one(graph, budget, strategy, solver, limit, options)
                    row = {"graph": name, "nodes": graph.n, "edges": len(graph.edges), "strategy": strategy,
                           "solver": res.get("solver") or solver or "-", "budget": label, "budget_bytes": budget,
                           **{k: res.get(k) for k in FIELDS[7:-1]}, "options": args.label or args.options or ""}
                    rows.append(row)
                    writer.writerow(row)
                    fh.flush()
                    gap = row["gap"]
                    print(f"{name:>10} n={graph.n:<4} {label:>16} {strategy:>22} {str(row['solver']):>14} "
                          f"{row['seconds']:8.2f}s  gap={'-' if gap is None else f'{100 * gap:.2f}%':>7}  "
                          f"{row['status']}", flush=True)
    plot(rows, out_path.with_suffix(".png"))
    print(f"wrote {out_path} and {out_path.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
