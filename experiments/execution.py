"""Executing schedules for real: measured peak memory and step time against the predictions.

For each zoo model (at small input sizes), each strategy and several budgets, the rematerializing
step is generated, run and measured on the current device (GPU:0 if TF sees one, else CPU:0):

* predicted step peak: the simulator's peak minus the resident parameters and batch;
* measured step peak: the device allocator's peak during one gradient step above what was resident
  (checkmate.tf2.measure_peak_memory);
* predicted overhead (schedule cost / plain cost, profiled costs) and measured step time / plain;
* the max gradient difference to the plain step (relative to the largest gradient).

Budgets are fractions of the activation part of checkpoint-all's peak: resident + f * (peak - resident),
so that weight-heavy models get the same spread of budgets as activation-heavy ones.

Writes experiments/results/execution_<device>.csv and .png. Runs unchanged on a GPU.

    python experiments/execution.py                        # the default grid (~20 min on 2 CPU cores)
    python experiments/execution.py --models mlp --budgets 0.5,1.0 --strategies checkpoint_all,checkmate_milp
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from pathlib import Path

# Byte-exact CPU statistics: TF's default CPU allocator ignores allocations under 256 KiB. This must be
# set before TensorFlow is imported; it does not affect GPUs (which always use the BFC allocator).
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

RESULTS = Path(__file__).resolve().parent / "results"

# name -> (batch size, input shape). Sizes at which the step's peak is activation-dominated: at small
# inputs the paper's large models (VGG, U-Net with 64 base filters) are dominated by their parameter
# gradients, which no schedule can drop, and only budgets near 100% are feasible.
DEFAULT_MODELS = {
    "mlp": (8192, (64,)),
    "residual_cnn": (16, (64, 64, 3)),
    "unet": (2, (128, 128, 3)),
    "transformer": (8, (128, 64)),
}
DEFAULT_STRATEGIES = ("checkpoint_all", "chen_sqrtn", "chen_greedy", "griewank_logn", "checkmate_lp_rounding",
                      "checkmate_milp")
DEFAULT_BUDGETS = (0.5, 0.7, 0.85, 1.0)

FIELDS = ["device", "model", "batch_size", "input_shape", "level", "nodes", "strategy", "budget_fraction",
          "budget_bytes", "status", "min_feasible_budget_bytes", "resident_bytes", "predicted_peak_bytes",
          "measured_peak_bytes", "measured_over_predicted", "plain_predicted_peak_bytes",
          "plain_measured_peak_bytes", "measured_over_plain", "predicted_overhead", "step_seconds",
          "plain_step_seconds", "time_over_plain", "max_grad_rel_diff", "recomputations", "op_copies",
          "solve_seconds", "allocator"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(DEFAULT_MODELS),
                   help="comma list of zoo names; NAME:BATCH:H,W,C overrides the default size")
    p.add_argument("--strategies", default=",".join(DEFAULT_STRATEGIES))
    p.add_argument("--budgets", default=",".join(str(b) for b in DEFAULT_BUDGETS),
                   help="fractions of the activation part of checkpoint-all's peak")
    p.add_argument("--level", choices=("layer", "op"), default="layer")
    p.add_argument("--cost-model", choices=("profile", "flops"), default="profile")
    p.add_argument("--gradient-nodes", choices=("yes", "no"), default="yes",
                   help="layer-level accounting of parameter gradients (as checkmate.tf2.compile's gradient_nodes)")
    p.add_argument("--time-limit", type=float, default=20.0, help="MILP/LP time limit per solve (s)")
    p.add_argument("--steps", type=int, default=3, help="timed steps per configuration")
    p.add_argument("--out", type=Path, default=RESULTS)
    return p.parse_args(argv)


def model_list(text: str):
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        parts = item.split(":")
        name = parts[0]
        batch, shape = DEFAULT_MODELS.get(name, (None, None))
        if len(parts) > 1:
            batch = int(parts[1])
        if len(parts) > 2:
            shape = tuple(int(d) for d in parts[2].split(","))
        out.append((name, batch, shape))
    return out


def run(args) -> list[dict]:
    import tensorflow as tf  # noqa: F401  (after the allocator setting above)

    from checkmate.solvers import checkpoint_all_peak
    from checkmate.tf2 import zoo
    from checkmate.tf2.lowering import lower
    from checkmate.tf2.measure import compare_strategies, measure_plain, random_batch
    from checkmate.tf2.memory import default_device
    from checkmate.tf2.step import resident_bytes

    device = default_device()
    allocator = "bfc" if device.startswith("GPU") or os.environ.get("TF_CPU_ALLOCATOR_USE_BFC") == "true" else "default"
    strategies = [s for s in args.strategies.split(",") if s]
    fractions = [float(b) for b in args.budgets.split(",") if b]
    rows = []
    for name, batch, shape in model_list(args.models):
        start = time.time()
        built = zoo.build_model(name, batch, shape)
        gradient_nodes = args.gradient_nodes == "yes"
        lowered = lower(built.model, built.loss, built.input_spec, built.label_spec, level=args.level,
                        cost_model=args.cost_model, gradient_nodes=gradient_nodes, progress=False)
        x, y = random_batch(lowered, built.model)
        plain = measure_plain(lowered, x + y, steps=args.steps, device=device)
        resident = resident_bytes(lowered)
        ca = checkpoint_all_peak(lowered.graph)
        print(f"{name} batch {batch} {shape}: {lowered.graph.n} nodes, plain step peak "
              f"{plain['measured_peak_bytes'] / 2**20:.1f} MiB (predicted {plain['predicted_peak_bytes'] / 2**20:.1f}),"
              f" {plain['step_seconds'] * 1e3:.1f} ms", flush=True)
        for fraction in fractions:
            budget = int(resident + fraction * (ca - resident))
            report = compare_strategies(
                lowered, built.model, built.loss, strategies, budget, time_limit_s=args.time_limit,
                steps=args.steps, plain=plain)
            for r in report["rows"]:
                row = {k: None for k in FIELDS}
                row.update(device=device, model=name, batch_size=batch, input_shape="x".join(map(str, shape)),
                           level=args.level, nodes=lowered.graph.n, budget_fraction=fraction, budget_bytes=budget,
                           resident_bytes=resident, plain_predicted_peak_bytes=plain["predicted_peak_bytes"],
                           plain_measured_peak_bytes=plain["measured_peak_bytes"],
                           plain_step_seconds=plain["step_seconds"], allocator=allocator)
                row.update({k: v for k, v in r.items() if k in FIELDS})
                row["status"] = r["status"]
                rows.append(row)
                if r["status"] == "ok":
                    print(f"  {fraction:.2f} {r['strategy']:<22} predicted {r['predicted_peak_bytes'] / 2**20:7.2f} MiB"
                          f"  measured {r['measured_peak_bytes'] / 2**20:7.2f} MiB"
                          f"  ratio {r['measured_over_predicted']:.2f}  overhead {r['predicted_overhead']:.2f}x"
                          f"  time {r['time_over_plain']:.2f}x  dgrad {r['max_grad_rel_diff']:.1e}", flush=True)
                else:
                    print(f"  {fraction:.2f} {r['strategy']:<22} {r['status']}", flush=True)
        print(f"  [{time.time() - start:.0f} s]", flush=True)
    return rows


def write_csv(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok"]
    models = sorted({r["model"] for r in ok}, key=[r["model"] for r in ok].index)
    strategies = sorted({r["strategy"] for r in ok})
    colors = {s: plt.cm.tab10(k % 10) for k, s in enumerate(strategies)}
    fig, axes = plt.subplots(2, max(1, len(models)), figsize=(4.2 * max(1, len(models)), 8), squeeze=False)
    for col, model in enumerate(models):
        mine = [r for r in ok if r["model"] == model]
        ax = axes[0][col]
        top = 0.0
        for s in strategies:
            pts = [r for r in mine if r["strategy"] == s]
            if pts:
                px = [r["predicted_peak_bytes"] / 2**20 for r in pts]
                py = [r["measured_peak_bytes"] / 2**20 for r in pts]
                ax.scatter(px, py, color=colors[s], label=s, s=22)
                top = max(top, *px, *py)
        plain_mib = mine[0]["plain_measured_peak_bytes"] / 2**20
        top = max(top, plain_mib) * 1.08
        ax.plot([0, top], [0, top], color="gray", lw=0.8, ls="--", label="measured = predicted")
        ax.axhline(plain_mib, color="black", lw=0.8, ls=":", label="plain step, measured")
        ax.set_xlim(0, top)
        ax.set_ylim(0, top)
        ax.set_title(f"{model} (b={mine[0]['batch_size']}, {mine[0]['input_shape']})", fontsize=9)
        ax.set_xlabel("predicted step peak (MiB)")
        ax.set_ylabel("measured step peak (MiB)")
        ax = axes[1][col]
        for s in strategies:
            pts = [r for r in mine if r["strategy"] == s]
            if pts:
                ax.scatter([r["predicted_overhead"] for r in pts], [r["time_over_plain"] for r in pts],
                           color=colors[s], s=22)
        lim = max([1.05] + [r["predicted_overhead"] for r in mine] + [r["time_over_plain"] for r in mine]) * 1.05
        ax.plot([1, lim], [1, lim], color="gray", lw=0.8, ls="--")
        ax.set_xlabel("predicted overhead (x plain cost)")
        ax.set_ylabel("measured step time (x plain)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(6, len(labels)), fontsize=8)
    device = ok[0]["device"] if ok else "device"
    fig.suptitle(f"Rematerialized training steps on {device}: measured vs predicted", fontsize=11)
    fig.tight_layout(rect=(0, 0.06, 1, 0.96))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse_args(argv)
    rows = run(args)
    device = rows[0]["device"] if rows else "device"
    stem = f"execution_{device.split(':')[0].lower()}"
    write_csv(rows, args.out / f"{stem}.csv")
    plot(rows, args.out / f"{stem}.png")
    print(f"wrote {args.out / (stem + '.csv')} and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
