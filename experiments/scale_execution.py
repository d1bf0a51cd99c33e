"""Deep transformers compiled with the defaults, then run: time to compile, predicted overhead,
gradients against plain training, and the measured step peak against the budget and the plan.

Two decoder-only transformers (pre-LN, causal multi-head attention, GELU MLP; batch 8, sequence 128,
width 256; the model of ``experiments/scale.py``), each compiled by ``checkmate.tf2.compile`` with
nothing but a budget in bytes (so ``strategy="auto"``, gradient nodes, the allocator headroom):

* 48 blocks at layer level, budget 1003.32 MiB (half the compact checkpoint-all peak);
* 12 blocks at op level, budget 264.44 MiB (half the compact checkpoint-all peak).

Columns: nodes, compile seconds (lowering, solving, code generation), the strategy ``auto`` chose,
predicted overhead, the largest gradient difference against the plain step, the measured step peak
(allocator, above the resident parameters and batch), the room the budget leaves above those
resident bytes, and measured / predicted.

    python experiments/scale_execution.py --quick   # 4 blocks (layer) and 2 blocks (op)
    python experiments/scale_execution.py           # the two models above
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")   # count every allocation on CPU
sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

MIB = 2**20
FULL = [(48, "layer", 1003.32), (12, "op", 264.44)]
QUICK = [(4, "layer", 100.0), (2, "op", 48.0)]
COLUMNS = ["blocks", "level", "nodes", "budget_bytes", "compile_seconds", "strategy", "status",
           "predicted_overhead", "max_grad_diff", "max_grad_rel_diff", "resident_bytes", "step_room_bytes",
           "predicted_step_peak_bytes", "measured_step_peak_bytes", "measured_over_predicted", "fits"]


def run(blocks: int, level: str, budget_mib: float) -> dict:
    import keras
    import tensorflow as tf

    import checkmate
    from checkmate.tf2.measure import max_gradient_difference, random_batch
    from checkmate.tf2.memory import default_device, measure_step
    from scale import decoder

    model = decoder(blocks)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    budget = int(budget_mib * MIB)
    start = time.perf_counter()
    step = checkmate.tf2.compile(model, loss, keras.optimizers.SGD(0.01), tf.TensorSpec((8, 128), tf.int32),
                                 tf.TensorSpec((8, 128), tf.int32), budget=budget, level=level)
    seconds = time.perf_counter() - start
    x, y = random_batch(step.lowered, model)
    measured = measure_step(step.function.call_flat, *(x + y), device=default_device()).peak_bytes
    diff_abs, diff_rel = max_gradient_difference(step, x, y)
    p = step.predicted
    room = budget - p.resident_bytes
    return {"blocks": blocks, "level": level, "nodes": step.graph.n, "budget_bytes": budget,
            "compile_seconds": seconds, "strategy": step.result.strategy, "status": step.result.status,
            "predicted_overhead": p.overhead, "max_grad_diff": diff_abs, "max_grad_rel_diff": diff_rel,
            "resident_bytes": p.resident_bytes, "step_room_bytes": room,
            "predicted_step_peak_bytes": p.step_peak_bytes, "measured_step_peak_bytes": measured,
            "measured_over_predicted": measured / p.step_peak_bytes if p.step_peak_bytes else None,
            "fits": measured <= room}


def main(argv=None) -> int:
    args = common.parser(__doc__.splitlines()[0]).parse_args(argv)
    started = time.perf_counter()
    rows = []
    for blocks, level, budget_mib in (QUICK if args.quick else FULL):
        row = run(blocks, level, budget_mib)
        rows.append(row)
        print(f"{blocks} blocks, {level}: {row['nodes']} nodes, compile {row['compile_seconds']:.0f} s, "
              f"{row['strategy']} overhead {row['predicted_overhead']:.3f}x, gradient difference "
              f"{row['max_grad_diff']:.2g}, measured/predicted {row['measured_over_predicted']:.3f}, "
              f"fits: {row['fits']}", flush=True)
    common.write_csv(args.out / "scale_execution.csv", rows, COLUMNS)
    common.write_meta(args.out / "scale_execution.meta.json", "quick" if args.quick else "full", None, started)
    common.finish(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
