"""How long a new user waits for the first batch of ``RematModel(model, budget=...)``, and how good the
plan it starts training with is against ``checkmate.tf2.compile``'s full default solve.

A small ViT (patch embedding, pre-norm transformer blocks, class head) whose layer-level graph has
300-500 nodes. With a fresh, empty cache directory:

1. ``RematModel(model, budget)``: seconds from ``fit`` to the end of the first batch (lowering,
   profiling and solving included), the plan's predicted overhead and its strategy line;
2. a second ``RematModel`` on a twin model in the same cache: the first batch without solving;
3. the same lowered step solved by ``compile_lowered`` with ``strategy="auto"`` and the default time
   limit (the full solve), and with each strategy/time limit given by ``--try``.

    python experiments/first_batch.py --blocks 4 --budget 50% --try hierarchical:30 --try auto:20
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time


def vit(blocks: int, size: int = 32, patch: int = 4, dim: int = 64, heads: int = 4, classes: int = 10, seed: int = 0):
    import keras

    keras.utils.set_random_seed(seed)
    layers = keras.layers
    inputs = keras.Input((size, size, 3), name="image")
    x = layers.Conv2D(dim, patch, strides=patch, name="patches")(inputs)
    x = layers.Reshape(((size // patch) ** 2, dim), name="tokens")(x)
    for b in range(blocks):
        h = layers.LayerNormalization(name=f"b{b}_ln1")(x)
        h = layers.MultiHeadAttention(heads, dim // heads, name=f"b{b}_mha")(h, h)
        x = layers.Add(name=f"b{b}_add1")([x, h])
        h = layers.LayerNormalization(name=f"b{b}_ln2")(x)
        h = layers.Dense(2 * dim, activation="gelu", name=f"b{b}_ff1")(h)
        h = layers.Dense(dim, name=f"b{b}_ff2")(h)
        x = layers.Add(name=f"b{b}_add2")([x, h])
    x = layers.LayerNormalization(name="ln")(x)
    x = layers.GlobalAveragePooling1D(name="pool")(x)
    outputs = layers.Dense(classes, name="head")(x)
    return keras.Model(inputs, outputs, name=f"vit{blocks}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--budget", default="50%")
    p.add_argument("--try", dest="tries", action="append", default=[], metavar="STRATEGY:SECONDS")
    p.add_argument("--no-full", action="store_true", help="skip the full default solve")
    p.add_argument("--verbose", action="store_true", help="log the lowering, solving and their times")
    p.add_argument("--cache-dir", default=None,
                   help="the checkmate cache directory (default: a fresh, empty one); give the same one to a "
                        "second run to time a process that finds the schedule cached")
    args = p.parse_args(argv)
    os.environ["CHECKMATE_CACHE_DIR"] = args.cache_dir or tempfile.mkdtemp(prefix="checkmate-first-batch-")
    import keras
    import numpy as np

    import checkmate
    from checkmate.tf2.step import compile_lowered

    rng = np.random.default_rng(0)
    x = rng.standard_normal((4 * args.batch, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, (4 * args.batch,)).astype("int32")
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    row: dict = {"blocks": args.blocks, "budget": args.budget, "batch": args.batch}

    class FirstBatch(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 0:
                row.setdefault("first_batch_s", time.perf_counter() - started)

    trainer = checkmate.tf2.RematModel(vit(args.blocks), budget=args.budget,
                                       compile_options={"verbose": True} if args.verbose else None)
    trainer.compile(keras.optimizers.Adam(1e-3), loss)
    started = time.perf_counter()
    trainer.fit(x, y, batch_size=args.batch, epochs=1, verbose=0, callbacks=[FirstBatch()])
    step = trainer.compiled_step()
    row.update(nodes=step.graph.n, overhead=step.predicted.overhead, strategy=step.result.status or step.strategy,
               solve_s=step.result.solve_seconds)
    print(json.dumps(row), flush=True)

    again = checkmate.tf2.RematModel(vit(args.blocks), budget=args.budget)
    again.compile(keras.optimizers.Adam(1e-3), loss)
    row2: dict = {}
    started = time.perf_counter()
    again.fit(x, y, batch_size=args.batch, epochs=1, verbose=0,
              callbacks=[keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: row2.setdefault(
                  "second_first_batch_s", time.perf_counter() - started))])
    row2["second_overhead"] = again.compiled_step().predicted.overhead
    print(json.dumps(row2), flush=True)

    lowered = step.lowered
    runs = [] if args.no_full else [("auto", None)]
    runs += [(t.split(":")[0], float(t.split(":")[1]) if ":" in t else None) for t in args.tries]
    for strategy, limit in runs:
        started = time.perf_counter()
        solved = compile_lowered(lowered, trainer.inner, step.loss, trainer.optimizer, budget=args.budget,
                                 strategy=strategy, time_limit_s=limit, schedule_cache=False)
        print(json.dumps({"strategy": strategy, "time_limit_s": limit, "seconds": time.perf_counter() - started,
                          "overhead": solved.predicted.overhead, "status": solved.result.status,
                          "optimal": bool(solved.result.optimal)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
