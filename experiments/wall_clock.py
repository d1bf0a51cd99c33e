"""Predicted against measured step time, and checkmate against the heuristics users would pick instead.

Five models that no test or other experiment uses (a decoder-only transformer, a residual MLP, a
diffusion-style U-Net with GroupNorm/SiLU and skip concatenations, a residual CNN, a DenseNet-style CNN
whose layers read the concatenation of every earlier output of their block), each compiled by
``checkmate.tf2.compile`` with a budget only (every other argument at its default: profiled costs,
``strategy="auto"``). For each budget the compiled step's gradients are timed against the plain
traced ``tf.GradientTape`` step (Grappler on, as users run it), interleaved in one process, median of
``--repeats`` (CompiledStep.measure_time); the predicted overhead is what ``compile`` predicts for the
step time (``Prediction.time_overhead``: the recomputed copies priced in the generated step's own
trace), beside the schedule's cost over the plain cost at the profiled prices (``plan_overhead``, what
the solver minimized). ``100%`` is ``checkpoint_all`` (nothing recomputed).

``--compare`` adds, per model, what users would otherwise use, each timed interleaved with the plain
step and measured for its step peak (bytes allocated above the parameters and batch):

* ``keras.RematScope(mode="activations")`` (the model built inside the scope; in Keras 3 on
  TensorFlow only this mode runs inside a ``tf.function``);
* ``tf.recompute_grad`` around each block (the blocks of a chain; the U-Net's residual blocks);
* ``chen_sqrtn`` (checkmate's baseline, through the same code generator);
* checkmate at each heuristic's step peak (plus the parameters and batch) as its budget, the peak
  measured in turn with the plain step; where checkmate's step then measures above the heuristic's
  (the two in turn), it is solved again for a budget lower by the difference (up to three budgets).

``--check`` is the fidelity check: it exits with status 1 when checkpoint_all costs more than
``--max-identity-ratio`` (1.05) times the plain step, or when a measured ratio at a budget below 100%
is more than ``--tolerance`` (8%) away from the predicted overhead. Results go to
experiments/results/wall_clock.csv (and wall_clock_compare.csv) with the command in the .meta.json.

``--trace-copies`` runs, instead of the table, a look inside each plan below 100%: the plain and the
generated step traced in turn, each recomputed node's copies against the profile's price and the plain
step's own trace (``<label>_copies.csv`` and ``.md``).

``--counters`` adds, per row, the per-call medians of the process's page faults and context switches
of the generated and the plain step (CompiledStep functions called in turn,
checkmate.tf2.timing.interleaved_counters) and the load average when the row was measured.
``--threads N`` runs TF with N intra-op and N inter-op threads (the profile is cached per intra-op
setting), to see what running ops side by side is worth. ``--cache-reuse`` runs, instead of the table,
a look at what a value's place in the cache is worth: a backward op (a weight gradient, a layer
normalization) timed reading an input written after 64 MiB were streamed through the caches (as a
recomputed value is read) and an equal one written before (as a value kept since the forward pass
is read in a step whose peak is past the last-level cache), at the residual MLP's and the
transformer's shapes (``<label>_cache_reuse.csv`` and ``.md``).

``--compare-only`` runs only the comparison, for ``--models``, and replaces those models' rows of
an earlier run's comparison (the .meta.json and the table then name both commands).

    python experiments/wall_clock.py --compare --check
    python experiments/wall_clock.py --models resmlp --budgets 100%,50% --repeats 9 --check
    python experiments/wall_clock.py --compare-only --models resmlp --repeats 31
    python experiments/wall_clock.py --trace-copies --models resmlp --budgets 70%,50% --label copies
    python experiments/wall_clock.py --models resmlp --counters --threads 1 --label one_thread
    python experiments/wall_clock.py --cache-reuse --repeats 61 --label cache
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")   # byte-exact CPU allocator statistics
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from common import write_csv  # noqa: E402

RESULTS = HERE / "results"
DEFAULT_BUDGETS = ("100%", "70%", "50%")
FIELDS = ["model", "nodes", "budget", "strategy", "predicted_overhead", "plan_overhead", "measured_ratio", "measured_cpu_ratio",
          "ratio_error", "predicted_step_peak_bytes", "measured_step_peak_bytes", "plain_step_peak_bytes",
          "step_ms", "plain_ms", "recomputations", "cost_model", "compile_s", "load_1min", "step_minor_faults",
          "plain_minor_faults", "step_major_faults", "plain_major_faults", "step_voluntary_switches",
          "plain_voluntary_switches", "status"]
COMPARE_FIELDS = ["model", "method", "budget_bytes", "measured_step_peak_bytes", "peak_alone_bytes", "plain_step_peak_bytes",
                  "measured_ratio", "measured_cpu_ratio", "predicted_overhead", "step_ms", "plain_ms", "budget_tries",
                  "rival_ratio", "rival_cpu_ratio", "status"]


# ------------------------------------------------------------------------------------------ models
def _keras():
    import keras
    return keras


def _seq(*layers_):
    """A block as a function of a tensor, calling ``layers_`` in turn (shared by the functional model
    and the forward pass that wraps blocks in tf.recompute_grad, so both use the same variables)."""
    def apply(h, training=None):
        for layer in layers_:
            h = layer(h, training=training)
        return h
    return apply


def _chain(parts):
    """A chain of blocks as a forward pass: the first part (stem) and the last (head) run plainly,
    ``wrap`` (e.g. ``tf.recompute_grad``) goes around every block between them."""
    def forward(x, training=None, wrap=None):
        for k, part in enumerate(parts):
            if wrap is not None and 0 < k < len(parts) - 1:
                x = wrap(lambda t, p=part: p(t, training=training))(x)
            else:
                x = part(x, training=training)
        return x
    return forward


def _residual(inner, *post):
    def apply(h, training=None):
        out = h + inner(h, training=training)
        for layer in post:
            out = layer(out, training=training)
        return out
    return apply


def decoder_transformer(batch=8, seq=64, width=64, heads=4, blocks=6, vocab=96):
    """Decoder-only transformer: causal self-attention and GELU feed-forward blocks, pre-norm."""
    keras = _keras()
    layers = keras.layers
    keras.utils.set_random_seed(1)

    def block(b):
        ln1 = layers.LayerNormalization(name=f"b{b}_ln1")
        attn = layers.MultiHeadAttention(heads, width // heads, name=f"b{b}_attn")
        ln2 = layers.LayerNormalization(name=f"b{b}_ln2")
        ff1 = layers.Dense(4 * width, activation="gelu", name=f"b{b}_ff1")
        ff2 = layers.Dense(width, name=f"b{b}_ff2")

        def apply(x, training=None):
            h = ln1(x)
            x = x + attn(h, h, use_causal_mask=True, training=training)
            return x + ff2(ff1(ln2(x)))
        return apply

    chain = ([_seq(layers.Dense(width, name="embed"))] + [block(b) for b in range(blocks)]
             + [_seq(layers.LayerNormalization(name="ln_f"), layers.Dense(vocab, name="logits"))])
    import tensorflow as tf
    return _chain(chain), (tf.TensorSpec((batch, seq, width)), tf.TensorSpec((batch, seq), tf.int32)), vocab


def residual_mlp(batch=2048, width=128, blocks=16, classes=10):
    keras = _keras()
    layers = keras.layers
    keras.utils.set_random_seed(2)

    def block(b):
        return _residual(_seq(layers.LayerNormalization(name=f"b{b}_ln"),
                              layers.Dense(2 * width, activation="relu", name=f"b{b}_up"),
                              layers.Dense(width, name=f"b{b}_down")))

    chain = ([_seq(layers.Dense(width, name="stem"))] + [block(b) for b in range(blocks)]
             + [_seq(layers.Dense(classes, name="logits"))])
    import tensorflow as tf
    return _chain(chain), (tf.TensorSpec((batch, 64)), tf.TensorSpec((batch,), tf.int32)), classes


def residual_cnn(batch=16, size=32, filters=32, blocks=6, classes=10):
    keras = _keras()
    layers = keras.layers
    keras.utils.set_random_seed(3)

    def block(b):
        return _residual(_seq(layers.Conv2D(filters, 3, padding="same", activation="relu", name=f"b{b}_c1"),
                              layers.Conv2D(filters, 3, padding="same", name=f"b{b}_c2"),
                              layers.BatchNormalization(name=f"b{b}_bn")),
                         layers.Activation("relu", name=f"b{b}_out"))

    chain = ([_seq(layers.Conv2D(filters, 3, padding="same", name="stem"))] + [block(b) for b in range(blocks)]
             + [_seq(layers.GlobalAveragePooling2D(name="gap"), layers.Dense(classes, name="logits"))])
    import tensorflow as tf
    return _chain(chain), (tf.TensorSpec((batch, size, size, 3)), tf.TensorSpec((batch,), tf.int32)), classes


def diffusion_unet(batch=4, size=32, base=16, levels=3, classes=3):
    """Diffusion-style U-Net: GroupNorm + SiLU residual conv blocks, downsampling, long skip
    concatenations into the decoder; per-pixel logits. Not a chain: its blocks are the residual conv
    blocks, each of which the forward pass can wrap in ``tf.recompute_grad``."""
    keras = _keras()
    layers = keras.layers
    keras.utils.set_random_seed(4)

    def res_block(in_ch, ch, name):
        conv = [layers.GroupNormalization(groups=4, name=f"{name}_gn1"), layers.Activation("silu", name=f"{name}_act1"),
                layers.Conv2D(ch, 3, padding="same", name=f"{name}_conv1"),
                layers.GroupNormalization(groups=4, name=f"{name}_gn2"), layers.Activation("silu", name=f"{name}_act2"),
                layers.Conv2D(ch, 3, padding="same", name=f"{name}_conv2")]
        skip = layers.Conv2D(ch, 1, name=f"{name}_skip") if in_ch != ch else None
        add = layers.Add(name=f"{name}_add")

        def apply(x, training=None):
            h = _seq(*conv)(x, training=training)
            return add([skip(x) if skip is not None else x, h])
        return apply

    # the layers are made once, here, so that the functional model and the wrapped forward pass share them
    stem = layers.Conv2D(base, 3, padding="same", name="stem")
    down, pools, channels = [], [], base
    for d in range(levels):
        down.append(res_block(channels, base * 2 ** d, f"down{d}"))
        channels = base * 2 ** d
        if d < levels - 1:
            pools.append(layers.Conv2D(channels, 3, strides=2, padding="same", name=f"down{d}_pool"))
    mid = res_block(channels, channels, "mid")
    ups, upsamples, concats = {}, {}, {}
    for d in reversed(range(levels)):
        if d < levels - 1:
            upsamples[d] = layers.UpSampling2D(name=f"up{d}_upsample")
        concats[d] = layers.Concatenate(name=f"up{d}_concat")
        ups[d] = res_block(channels + base * 2 ** d, base * 2 ** d, f"up{d}")
        channels = base * 2 ** d
    head = _seq(layers.GroupNormalization(groups=4, name="out_gn"), layers.Activation("silu", name="out_act"),
                layers.Conv2D(classes, 1, name="logits"))

    def forward(x, training=None, wrap=None):
        """The U-Net on ``x``; ``wrap`` (e.g. ``tf.recompute_grad``) around each residual block."""
        def run(block, h):
            return block(h, training=training) if wrap is None else wrap(lambda t: block(t, training=training))(h)

        x = stem(x)
        skips = []
        for d in range(levels):
            x = run(down[d], x)
            skips.append(x)
            if d < levels - 1:
                x = pools[d](x)
        x = run(mid, x)
        for d in reversed(range(levels)):
            if d < levels - 1:
                x = upsamples[d](x)
            x = concats[d]([x, skips[d]])
            x = run(ups[d], x)
        return head(x, training=training)

    import tensorflow as tf
    return forward, (tf.TensorSpec((batch, size, size, 3)), tf.TensorSpec((batch, size, size), tf.int32)), classes


def dense_cnn(batch=16, size=32, growth=12, layers_per_block=4, blocks=3, classes=10):
    """DenseNet-style CNN: in each dense block every BN-ReLU-conv layer reads the concatenation of
    all earlier outputs; 1x1 conv and pooling between blocks. The blocks are the dense blocks."""
    keras = _keras()
    layers = keras.layers
    keras.utils.set_random_seed(5)

    def dense_block(b):
        parts = [(layers.BatchNormalization(name=f"b{b}_l{k}_bn"), layers.Activation("relu", name=f"b{b}_l{k}_relu"),
                  layers.Conv2D(growth, 3, padding="same", name=f"b{b}_l{k}_conv"),
                  layers.Concatenate(name=f"b{b}_l{k}_cat")) for k in range(layers_per_block)]

        def apply(x, training=None):
            for bn, relu, conv, cat in parts:
                x = cat([x, conv(relu(bn(x, training=training)))])
            return x
        return apply

    def transition(b):
        return _seq(layers.Conv2D(2 * growth, 1, name=f"t{b}_conv"), layers.AveragePooling2D(2, name=f"t{b}_pool"))

    chain = [_seq(layers.Conv2D(2 * growth, 3, padding="same", name="stem"))]
    for b in range(blocks):
        chain.append(dense_block(b))
        if b < blocks - 1:
            chain.append(transition(b))
    chain.append(_seq(layers.GlobalAveragePooling2D(name="gap"), layers.Dense(classes, name="logits")))
    import tensorflow as tf
    return _chain(chain), (tf.TensorSpec((batch, size, size, 3)), tf.TensorSpec((batch,), tf.int32)), classes


MODELS = {"transformer": decoder_transformer, "resmlp": residual_mlp, "unet": diffusion_unet, "cnn": residual_cnn,
          "dense": dense_cnn}


def build(name: str, remat_scope: bool = False):
    """(one flat Keras model, its forward pass ``forward(x, training=None, wrap=None)`` over the same
    layers with ``wrap`` around each block, input spec, label spec, classes). ``remat_scope``: built
    inside ``keras.RematScope(mode="activations")``."""
    import contextlib

    keras = _keras()
    with keras.RematScope(mode="activations") if remat_scope else contextlib.nullcontext():
        forward, (xs, ys), classes = MODELS[name]()
        inp = keras.Input(xs.shape[1:], name="image" if name == "unet" else None)
        model = keras.Model(inp, forward(inp), name="diffusion_unet" if name == "unet" else name)
    return model, forward, xs, ys, classes


# ------------------------------------------------------------------------------------------ steps
def loss_fn():
    return _keras().losses.SparseCategoricalCrossentropy(from_logits=True)


def tape_step(model, loss, blocks_forward=None):
    """The plain traced step users write (Grappler on): loss and gradients under a GradientTape;
    ``blocks_forward``: the model's forward pass (:func:`build`), run with ``tf.recompute_grad``
    around each block."""
    import tensorflow as tf

    variables = model.trainable_variables

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            if blocks_forward is None:
                pred = model(x, training=True)
            else:
                pred = blocks_forward(x, training=True, wrap=tf.recompute_grad)
            value = loss(y, pred)
        return (value, *tape.gradient(value, variables))

    return step


def random_batch(xs, ys, classes, seed=0):
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    x = tf.constant(rng.standard_normal(xs.shape.as_list()), xs.dtype)
    y = tf.constant(rng.integers(0, classes, size=ys.shape.as_list()), ys.dtype)
    return x, y


def step_peak(fn, *args, repeats=None):
    """The largest step peak of ``repeats`` runs (default: three) after a warm-up: the BFC allocator's
    chunks, and with them a measured peak, vary from run to run (one step measured 23.7, 25.2 and 25.2
    MiB), and checkmate checks a plan for a byte budget the same way (checkmate.tf2.step.VERIFY_PEAK_REPEATS)."""
    from checkmate.tf2.memory import measure_step
    from checkmate.tf2.step import VERIFY_PEAK_REPEATS

    return int(measure_step(fn, *args, repeats=repeats or VERIFY_PEAK_REPEATS, reduce="max").peak_bytes)


# Runs whose largest peak is a method's peak in the comparison. The executor runs whatever is ready,
# so a step whose recomputations no control edge orders (tf.recompute_grad's) reaches different peaks
# from run to run: the residual MLP's measured 26.4 to 37.2 MiB over ten runs; three runs miss the high
# ones, and the budget checkmate gets would depend on luck.
COMPARE_PEAK_RUNS = 9
# Budgets checkmate gets at one heuristic's peak: when its step measures above the heuristic's (in turn,
# the same history), the next budget is lower by the difference.
COMPARE_BUDGET_TRIES = 3


def interleaved_peaks(fns, *args, rounds: int = COMPARE_PEAK_RUNS) -> list[int]:
    """The largest step peak of each of ``fns`` over ``rounds`` rounds, one run of each per round (each
    round starting one function further on). The BFC allocator's chunks depend on the allocation
    history: a residual MLP plan checked at 26.8 MiB when compiled measured 29.7 MiB (nine runs) after
    the steps timed before and beside it had run, where a plan for the same budget measured at most
    25.3 MiB in twenty runs in a process that ran no other step. Measured in turn, every step's peak
    comes from the same history."""
    from checkmate.tf2.memory import measure_step

    peaks = [0] * len(fns)
    for r in range(max(1, rounds)):
        for k in [(r + j) % len(fns) for j in range(len(fns))]:
            peaks[k] = max(peaks[k], int(measure_step(fns[k], *args, warmup=0, repeats=1).peak_bytes))
    return peaks


def solve_at_or_below(solve, peaks_in_turn, budget: int, resident: int, tries: int = None):
    """A plan whose step measures at or below a heuristic's peak: ``solve(budget)`` compiles a plan,
    ``peaks_in_turn(step)`` measures its peak and the heuristic's, in turn; while the plan's is above,
    the budget is lowered by the difference and solved again, :data:`COMPARE_BUDGET_TRIES` budgets at
    most. Returns ``(step, budget, log, error)``: the last plan solved (None when the first budget
    failed, with ``error``), its budget, and one entry per budget (above ``resident``)."""
    step, used, log, error = None, budget, [], None
    for _ in range(tries or COMPARE_BUDGET_TRIES):
        try:
            candidate = solve(budget)
        except Exception as exc:    # an infeasible lower budget: the plan before it is the answer
            log.append(f"{budget - resident}: {type(exc).__name__}")
            if step is None:
                used, error = budget, exc
            break
        step, used = candidate, budget
        ours, theirs = peaks_in_turn(step)
        log.append(f"{budget - resident}: {ours} vs {theirs}")
        if ours <= theirs:
            break
        budget -= ours - theirs
    return step, used, log, error


# ------------------------------------------------------------------------------------------ runs
def run_budgets(name: str, budgets, repeats: int, time_limit_s=None, counters: bool = False) -> list[dict]:
    import checkmate.tf2 as ct
    from checkmate.tf2.timing import interleaved_counters, preserved_state
    from checkmate.tf2.step import cost_model_description

    keras = _keras()
    model, _, xs, ys, classes = build(name)
    x, y = random_batch(xs, ys, classes)
    loss = loss_fn()
    plain_peak = None
    rows = []
    for budget in budgets:
        row = {"model": name, "budget": budget}
        options = {"strategy": "checkpoint_all"} if budget == "100%" else (
            {"time_limit_s": time_limit_s} if time_limit_s else {})
        started = time.perf_counter()
        try:
            step = ct.compile(model, loss, keras.optimizers.SGD(), xs, ys, budget=budget, **options)
        except Exception as exc:    # an infeasible budget is a result of the table, not a crash
            row.update(status=f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
            rows.append(row)
            print(f"{name} {budget}: {row['status']}", flush=True)
            continue
        row["compile_s"] = round(time.perf_counter() - started, 2)
        if plain_peak is None:
            plain_peak = step_peak(step.lowered.function, x, y)
        measured = step.measure_time(x, y, repeats=repeats)
        ratio = measured.ratio
        predicted = step.predicted.time_overhead
        row.update(nodes=step.graph.n, strategy=step.strategy,
                   predicted_overhead=round(predicted, 4), plan_overhead=round(step.predicted.overhead, 4),
                   measured_ratio=round(ratio, 4),
                   measured_cpu_ratio=round(measured.cpu_ratio, 4) if measured.cpu_ratio else None,
                   ratio_error=round(ratio / predicted - 1.0, 4),
                   predicted_step_peak_bytes=step.predicted.step_peak_bytes,
                   measured_step_peak_bytes=step_peak(step.function.call_flat, x, y),
                   plain_step_peak_bytes=plain_peak, step_ms=round(measured.step_seconds * 1e3, 3),
                   plain_ms=round(measured.plain_seconds * 1e3, 3), recomputations=step.predicted.recompute_count,
                   cost_model=cost_model_description(step.lowered), load_1min=round(os.getloadavg()[0], 2),
                   status="ok")
        if counters:
            import tensorflow as tf

            args, _ = step.lowered.function.structured_input_signature
            flat = step.function.flat_args(x, y)
            with preserved_state(step.model.variables, []):     # BatchNorm statistics, as measure_time
                generated, plain = interleaved_counters(
                    [step.function.call_flat, lambda *f: step.lowered.function(*tf.nest.pack_sequence_as(args, f))],
                    *flat, repeats=repeats)
            row.update(step_minor_faults=generated.minor_faults, plain_minor_faults=plain.minor_faults,
                       step_major_faults=generated.major_faults, plain_major_faults=plain.major_faults,
                       step_voluntary_switches=generated.voluntary_switches,
                       plain_voluntary_switches=plain.voluntary_switches)
        rows.append(row)
        print(f"{name} {budget}: predicted {predicted:.3f}x measured {ratio:.3f}x (cpu {measured.cpu_ratio:.3f}x) "
              f"peak {row['measured_step_peak_bytes'] / 2 ** 20:.1f} MiB of plain {plain_peak / 2 ** 20:.1f} MiB "
              f"[{row['compile_s']} s compile, {step.graph.n} nodes]", flush=True)
    return rows


def run_compare(name: str, repeats: int, time_limit_s=None) -> list[dict]:
    """The heuristics, then checkmate at each one's step peak (plus parameters and batch), measured in turn
    with the plain step; a plan that measures above the heuristic is solved again for less (see
    :data:`COMPARE_BUDGET_TRIES`)."""
    import checkmate.tf2 as ct
    from checkmate.tf2.measure import interleaved_times
    from checkmate.tf2.step import resident_bytes

    keras = _keras()
    loss = loss_fn()
    model, forward, xs, ys, classes = build(name)
    x, y = random_batch(xs, ys, classes)
    plain = tape_step(model, loss)
    plain_peak = step_peak(plain, x, y, repeats=COMPARE_PEAK_RUNS)
    rows = []

    steps = []

    def record(method, fn, budget_bytes=None, predicted=None, rival=None):
        # checkmate's step is timed in one loop with the heuristic it is set against (``rival``) as well as
        # the plain step: the two times then share the machine's state (this machine's speed moves between
        # minutes; the transformer's tf.recompute_grad measured 1.167x and 1.349x in two runs)
        timed = [fn, plain] + ([rival] if rival is not None else [])
        walls, cpus = interleaved_times(timed, x, y, repeats=repeats)
        (t, base), (c, cbase) = walls[:2], cpus[:2]
        alone = step_peak(fn, x, y, repeats=COMPARE_PEAK_RUNS)
        steps.append(fn)
        row = {"model": name, "method": method, "budget_bytes": budget_bytes,
               "measured_step_peak_bytes": alone, "peak_alone_bytes": alone, "plain_step_peak_bytes": plain_peak,
               "measured_ratio": round(t / base, 4), "measured_cpu_ratio": round(c / cbase, 4),
               "predicted_overhead": None if predicted is None else round(predicted, 4),
               "step_ms": round(t * 1e3, 3), "plain_ms": round(base * 1e3, 3), "status": "ok"}
        if rival is not None:
            row.update(rival_ratio=round(walls[2] / base, 4), rival_cpu_ratio=round(cpus[2] / cbase, 4))
        rows.append(row)
        print(f"{name} {method}: peak {row['measured_step_peak_bytes'] / 2 ** 20:.1f} MiB "
              f"(plain {plain_peak / 2 ** 20:.1f}), time {row['measured_ratio']:.3f}x (cpu {row['measured_cpu_ratio']:.3f}x)"
              + (f", predicted {predicted:.3f}x" if predicted is not None else "")
              + (f"; the heuristic in the same loop {row['rival_ratio']:.3f}x (cpu {row['rival_cpu_ratio']:.3f}x)"
                 if rival is not None else ""), flush=True)
        return row

    heuristics = []
    scoped, _, _, _, _ = build(name, remat_scope=True)
    scoped.set_weights(model.get_weights())
    heuristics.append(record("keras.RematScope(activations)", tape_step(scoped, loss)))
    heuristics.append(record("tf.recompute_grad per block", tape_step(model, loss, blocks_forward=forward)))
    chen = ct.compile(model, loss, keras.optimizers.SGD(), xs, ys, budget="100%", strategy="chen_sqrtn")
    heuristics.append(record("chen_sqrtn", chen.function.call_flat, predicted=chen.predicted.time_overhead))
    resident = resident_bytes(chen.lowered)
    heuristic_fns = list(steps)
    # the heuristics' peaks measured in turn with the plain step (the same allocation history as the
    # table's figure): a peak right after a step's own timing can be above it (chen_sqrtn's on the U-Net
    # measured 11.6 MiB after its timing and 10.3 MiB in turn), and a budget from it gave checkmate more
    targets = interleaved_peaks([plain, *heuristic_fns], x, y)[1:]
    for h, fn, target in zip(heuristics, heuristic_fns, targets):
        method = f"checkmate at {h['method']}'s peak"

        def solve(budget):
            return ct.compile(model, loss, keras.optimizers.SGD(), xs, ys, budget=budget,
                              **({"time_limit_s": time_limit_s} if time_limit_s else {}))

        def peaks_in_turn(step):
            ours, theirs = interleaved_peaks([step.function.call_flat, fn], x, y)
            p = step.predicted
            print(f"{name} {method}: planned for {(p.planned_budget_bytes - p.resident_bytes) / 2 ** 20:.2f} MiB of "
                  f"{(p.budget_bytes - resident) / 2 ** 20:.2f} MiB above the parameters and batch, predicted peak "
                  f"{p.step_peak_bytes / 2 ** 20:.2f} MiB, {step.strategy}: {step.result.status}; measured in turn "
                  f"with the heuristic {ours / 2 ** 20:.2f} MiB against {theirs / 2 ** 20:.2f} MiB", flush=True)
            return ours, theirs

        step, used, tries, error = solve_at_or_below(solve, peaks_in_turn, int(target + resident), resident)
        if step is None:
            rows.append({"model": name, "method": method, "budget_bytes": used, "budget_tries": "; ".join(tries),
                         "status": f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"})
            print(f"{name} {method}: {rows[-1]['status']}", flush=True)
            continue
        record(method, step.function.call_flat, used, step.predicted.time_overhead, rival=fn)
        rows[-1]["budget_tries"] = "; ".join(tries)
    # every step's peak again, all of them in turn (the same allocation history): the table's figure
    peaks = interleaved_peaks([plain, *steps], x, y)
    measured = [r for r in rows if r.get("status") == "ok"]
    for row, peak in zip(measured, peaks[1:]):
        row.update(measured_step_peak_bytes=peak, plain_step_peak_bytes=peaks[0])
        print(f"{name} {row['method']}: peak {peak / 2 ** 20:.1f} MiB measured in turn with the others "
              f"({row['peak_alone_bytes'] / 2 ** 20:.1f} MiB after its own timing; plain {peaks[0] / 2 ** 20:.1f})",
              flush=True)
    return rows


COPIES_FIELDS = ["model", "budget", "kind", "nodes", "copies", "profile_cost_share", "plain_share", "first_share",
                 "copy_share", "copy_over_plain", "plain_side_by_side", "copy_side_by_side", "predicted_overhead",
                 "plain_priced_overhead", "traced_step_ratio", "measured_ratio", "measured_cpu_ratio"]
# Traced runs of each step per round, and rounds (the plain and the generated step in turn).
COPIES_RUNS = 21
COPIES_ROUNDS = 3


# (model, op, shape of the value read): the residual MLP's block activations (2048 x 128 and x 256,
# 1-2 MiB) and the transformer's (8 x 64 x 64 and x 256, 128-512 KiB)
CACHE_REUSE_CASES = (("resmlp", "weight_gradient", (2048, 128), 256), ("resmlp", "layer_norm", (2048, 128), None),
                     ("resmlp", "weight_gradient", (2048, 256), 128),
                     ("transformer", "weight_gradient", (512, 64), 256), ("transformer", "layer_norm", (512, 64), None),
                     ("transformer", "weight_gradient", (512, 256), 64))
CACHE_REUSE_FIELDS = ["model", "op", "value_shape", "value_kib", "hot_us", "cold_us", "cold_over_hot", "hot_cpu_us",
                      "cold_cpu_us", "cpu_cold_over_hot", "repeats", "load_1min"]
EVICT_BYTES = 64 * 2 ** 20     # twice the test machine's 32 MiB L3


def cache_reuse(repeats: int) -> list[dict]:
    """Each case's op timed on a value just written (hot) and on one evicted from the caches (cold),
    in alternating order, medians of ``repeats`` each in wall and process CPU time."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    flood = tf.Variable(tf.zeros((EVICT_BYTES // 4,)))

    @tf.function
    def evict():
        flood.assign_add(tf.ones_like(flood))     # reads and writes 64 MiB: what was cached is gone
        return flood[0]

    @tf.function
    def produce(x):
        return tf.nn.relu(x * 1.0001)             # a fresh value, written as a forward op writes it

    @tf.function
    def layer_norm(h):
        mean, var = tf.nn.moments(h, axes=[-1], keepdims=True)
        return (h - mean) * tf.math.rsqrt(var + 1e-3)

    rows = []
    for model, op, shape, other in CACHE_REUSE_CASES:
        x = tf.constant(rng.standard_normal(shape), tf.float32)
        if op == "weight_gradient":
            grad = tf.constant(rng.standard_normal((shape[0], other)), tf.float32)
            fn = tf.function(lambda h, g=grad: tf.matmul(h, g, transpose_a=True))
        else:
            fn = layer_norm

        spare = produce(x + 1.0)

        def sample(hot: bool):
            # Both cases run the same ops; they differ only in which of two equal values the timed op
            # reads: the one written before the flood or the one written after it. The op first runs
            # once on a third value, so that its code, its other operand and the threads are warm alike.
            early = produce(x)
            early.numpy()
            evict().numpy()
            late = produce(x)
            late.numpy()
            fn(spare).numpy()
            start, cpu_start = time.perf_counter(), time.process_time()
            fn(late if hot else early).numpy()
            return time.perf_counter() - start, time.process_time() - cpu_start

        for _ in range(3):
            sample(True), sample(False)
        got = {True: [], False: []}
        for r in range(repeats):
            for hot in ((True, False) if r % 2 else (False, True)):
                got[hot].append(sample(hot))
        (hot_s, hot_cpu), (cold_s, cold_cpu) = (np.median(np.asarray(got[k]), axis=0) for k in (True, False))
        rows.append({"model": model, "op": op, "value_shape": "x".join(map(str, shape)),
                     "value_kib": int(np.prod(shape)) * 4 // 1024, "hot_us": round(hot_s * 1e6, 1),
                     "cold_us": round(cold_s * 1e6, 1), "cold_over_hot": round(cold_s / hot_s, 3),
                     "hot_cpu_us": round(hot_cpu * 1e6, 1), "cold_cpu_us": round(cold_cpu * 1e6, 1),
                     "cpu_cold_over_hot": round(cold_cpu / hot_cpu, 3) if hot_cpu > 0 else None,
                     "repeats": repeats, "load_1min": round(os.getloadavg()[0], 2)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def cache_reuse_markdown(rows: list[dict], meta: dict) -> str:
    lines = ["# A value read from the cache against one read from memory", "",
             f"Command: `{meta['command']}`  ", f"Device: {meta['device']}; started {meta['started']} UTC, "
             f"{meta['seconds']:.0f} s.", "",
             "Each op timed on an input written after 64 MiB were streamed through the caches (hot: as a "
             "recomputed value is read right after its recomputation) and on an equal one written before them "
             "(cold: as a value kept since the forward pass is read when the step's peak is past the last-level "
             "cache); in both cases the op ran once on a third value just before, so its code, its other operand "
             "and the threads were warm. Alternating, medians.", "",
             "| model | op | value | KiB | hot us | cold us | cold / hot | CPU cold / hot | load |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['op']} | {r['value_shape']} | {r['value_kib']} | {r['hot_us']} | "
                     f"{r['cold_us']} | {_fmt(r['cold_over_hot'])} | {_fmt(r['cpu_cold_over_hot'])} | "
                     f"{r['load_1min']} |")
    return "\n".join(lines) + "\n"


def _kind(layer: str) -> str:
    """A node's kind: its name with the block numbers taken out (``b3_up`` -> ``b#_up``)."""
    import re

    return re.sub(r"\d+", "#", layer)


def trace_copies(name: str, budgets, repeats: int, time_limit_s=None) -> list[dict]:
    """Where a plan's recomputations spend their time: the plain step and the generated step, each
    traced in turn (COPIES_ROUNDS rounds of COPIES_RUNS runs, checkmate.tf2.profiling.trace_op_groups),
    every node of the plain step against its first copy and its recomputed copies in the generated
    step. Per node kind (the same layer in every block), shares are of the plain step's traced time
    (mean over the runs); ``*_side_by_side`` is the ops' own durations over their share of the wall
    time (1: they ran alone). One row per model and budget (kind ``all``) adds the predicted overhead,
    the overhead the plain trace's times predict for the same plan, the generated step's traced time
    over the plain step's, and the measured ratios (CompiledStep.measure_time)."""
    import numpy as np

    import checkmate.tf2 as ct
    from checkmate.tf2.codegen import IMPORT_SCOPE, copy_name
    from checkmate.tf2.profiling import trace_op_groups

    keras = _keras()
    model, _, xs, ys, classes = build(name)
    x, y = random_batch(xs, ys, classes)
    loss = loss_fn()
    rows = []
    for budget in budgets:
        if budget == "100%":
            continue
        step = ct.compile(model, loss, keras.optimizers.SGD(), xs, ys, budget=budget,
                          **({"time_limit_s": time_limit_s} if time_limit_s else {}))
        lowered, graph = step.lowered, step.graph
        counts = step.schedule.recompute.sum(axis=0).astype(int)
        costs = np.asarray([nd.cost for nd in graph.nodes], dtype=float)
        concrete = step.function.concrete_function
        names = {op.name for op in concrete.graph.get_operations()}
        groups, where = [], []
        for i, ops in enumerate(lowered.node_ops):
            for k in range(counts[i]):
                groups.append([n for n in (f"{IMPORT_SCOPE}/{copy_name(op, k)}" for op in ops) if n in names])
                where.append((i, k))
        plain_ex, plain_busy, plain_run, gen_ex, gen_busy, gen_run = [], [], [], [], [], []
        for _ in range(COPIES_ROUNDS):
            ex, busy, run = trace_op_groups(lowered.function, [x, y], lowered.node_ops, runs=COPIES_RUNS)
            plain_ex.append(ex), plain_busy.append(busy), plain_run.append(run)
            ex, busy, run = trace_op_groups(concrete, [x, y], groups, runs=COPIES_RUNS)
            gen_ex.append(ex), gen_busy.append(busy), gen_run.append(run)
        plain = np.concatenate(plain_ex).mean(axis=0)
        plain_b = np.concatenate(plain_busy).mean(axis=0)
        gen = np.concatenate(gen_ex).mean(axis=0)
        gen_b = np.concatenate(gen_busy).mean(axis=0)
        total = plain.sum()
        first = np.zeros(graph.n)
        copy = np.zeros(graph.n)
        copy_b = np.zeros(graph.n)
        for g, (i, k) in enumerate(where):
            if k == 0:
                first[i] += gen[g]
            else:
                copy[i] += gen[g]
                copy_b[i] += gen_b[g]
        measured = step.measure_time(x, y, repeats=repeats)
        extra = counts - 1
        summary = {"model": name, "budget": budget, "kind": "all", "nodes": int((extra > 0).sum()),
                   "copies": int(extra.sum()),
                   "profile_cost_share": round(float((extra * costs).sum() / costs.sum()), 4),
                   "plain_share": round(float((extra * plain).sum() / total), 4),
                   "first_share": round(float(first[extra > 0].sum() / total), 4),
                   "copy_share": round(float(copy.sum() / total), 4),
                   "copy_over_plain": round(float(copy.sum() / max((extra * plain).sum(), 1e-9)), 3),
                   "plain_side_by_side": round(float(plain_b[extra > 0].sum() / max(plain[extra > 0].sum(), 1e-9)), 2),
                   "copy_side_by_side": round(float(copy_b.sum() / max(copy.sum(), 1e-9)), 2),
                   "predicted_overhead": round(step.predicted.time_overhead, 4),
                   "plain_priced_overhead": round(1.0 + float((extra * plain).sum() / total), 4),
                   "traced_step_ratio": round(float(np.median(np.concatenate(gen_run))
                                                    / np.median(np.concatenate(plain_run))), 4),
                   "measured_ratio": round(measured.ratio, 4),
                   "measured_cpu_ratio": round(measured.cpu_ratio, 4) if measured.cpu_ratio else None}
        rows.append(summary)
        print(f"{name} {budget}: recomputations priced {summary['profile_cost_share']:.4f} of the step by the "
              f"profile, {summary['plain_share']:.4f} by the plain trace, took {summary['copy_share']:.4f} in the "
              f"generated step's trace ({summary['copy_side_by_side']:.2f} ops side by side); predicted "
              f"{summary['predicted_overhead']:.3f}x, traced {summary['traced_step_ratio']:.3f}x, measured "
              f"{summary['measured_ratio']:.3f}x (cpu {summary['measured_cpu_ratio']})", flush=True)
        kinds: dict[str, list[int]] = {}
        for i in np.flatnonzero(extra > 0):
            kinds.setdefault(_kind(graph.nodes[i].name), []).append(int(i))
        for kind, members in sorted(kinds.items(), key=lambda kv: -float((extra[kv[1]] * plain[kv[1]]).sum())):
            m = np.asarray(members)
            rows.append({"model": name, "budget": budget, "kind": kind, "nodes": len(m), "copies": int(extra[m].sum()),
                         "profile_cost_share": round(float((extra[m] * costs[m]).sum() / costs.sum()), 4),
                         "plain_share": round(float((extra[m] * plain[m]).sum() / total), 4),
                         "first_share": round(float(first[m].sum() / total), 4),
                         "copy_share": round(float(copy[m].sum() / total), 4),
                         "copy_over_plain": round(float(copy[m].sum() / max((extra[m] * plain[m]).sum(), 1e-9)), 3),
                         "plain_side_by_side": round(float(plain_b[m].sum() / max(plain[m].sum(), 1e-9)), 2),
                         "copy_side_by_side": round(float(copy_b[m].sum() / max(copy[m].sum(), 1e-9)), 2)})
    return rows


def copies_markdown(rows: list[dict], meta: dict) -> str:
    lines = ["# Where the recomputations' time goes", "", f"Command: `{meta['command']}`  ",
             f"Device: {meta['device']}; started {meta['started']} UTC, {meta['seconds']:.0f} s.", "",
             "The plain step and the generated step traced in turn "
             f"({COPIES_ROUNDS} rounds of {COPIES_RUNS} runs each). Shares are of the plain step's traced time "
             "(each node's mean exclusive time over the runs): the profile's price of the recomputations (its "
             "costs), the plain trace's price of the same recomputations, the time of the first copies and of "
             "the recomputed copies in the generated step's trace. Side by side: the ops' own durations over "
             "their share of the wall time (1: they ran alone).", "",
             "| model | budget | kind | nodes | recomputations | profile | plain trace | first copies | recomputed "
             "copies | recomputed / plain | side by side, plain | side by side, recomputed |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['budget']} | {r['kind']} | {r['nodes']} | {r['copies']} | "
                     f"{float(r['profile_cost_share']):.2%} | {float(r['plain_share']):.2%} | "
                     f"{float(r['first_share']):.2%} | {float(r['copy_share']):.2%} | {float(r['copy_over_plain']):.3f} | "
                     f"{r['plain_side_by_side']} | {r['copy_side_by_side']} |")
    lines += ["", "| model | budget | predicted | priced by the plain trace | traced, generated / plain | measured | CPU |",
              "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["kind"] == "all":
            lines.append(f"| {r['model']} | {r['budget']} | {_fmt(r['predicted_overhead'])} | "
                         f"{_fmt(r['plain_priced_overhead'])} | {_fmt(r['traced_step_ratio'])} | "
                         f"{_fmt(r['measured_ratio'])} | {_fmt(r['measured_cpu_ratio'])} |")
    return "\n".join(lines) + "\n"


def _fmt(value, pattern="{:.3f}x") -> str:
    if value in (None, ""):
        return "-"
    return pattern.format(float(value))


def markdown(rows: list[dict], compare: list[dict], meta: dict) -> str:
    """The results as Markdown tables (written beside the CSVs)."""
    mib = "{:.1f}"
    lines = ["# Predicted against measured step time", ""]
    if meta.get("device"):      # a comparison run alone (--compare-only under a new label) has no run of its own
        lines += [f"Command: `{meta['command']}`  ", f"Device: {meta['device']}; started {meta['started']} UTC, "
                  f"{meta['seconds']:.0f} s.", ""]
    for again in meta.get("compare_reruns", ()):
        if meta.get("device"):
            lines += [f"Comparison rows of {', '.join(again['models'])} replaced by `{again['command']}`, started "
                      f"{again['started']} UTC, {again['seconds']:.0f} s.", ""]
        else:
            lines += [f"Comparison of {', '.join(again['models'])}: `{again['command']}`  ",
                      f"Device: {again['device']}; started {again['started']} UTC, {again['seconds']:.0f} s.", ""]
    lines += [
             "Ratios are to the plain traced GradientTape step (Grappler on), interleaved in one process, "
             "median of the repeats; CPU is the same ratio in process CPU time (robust to other processes "
             "on a shared machine). Predicted: the step-time ratio compile predicts (the recomputations "
             "priced in the generated step's own trace); plan's cost: the schedule's cost at the plain "
             "step's profiled prices (what the solver minimized). Peaks are step peaks in MiB (above "
             "parameters and batch)."]
    counted = any(r.get("step_minor_faults") not in (None, "") for r in rows)
    if counted:
        lines += ["", "Faults and switches: the per-call medians of the process's minor page faults and voluntary "
                  "context switches, generated step / plain step (--counters); load: the 1-minute load average "
                  "when the row was measured."]
    extra_head = " faults / call | switches / call | load |" if counted else ""
    if rows:
        lines += ["", "| model | budget | strategy | nodes | predicted | plan's cost | measured | CPU | error "
                  "| peak (pred.) | peak (meas.) | plain peak | compile s |" + extra_head,
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|---|" if counted else "")]
    for r in rows:
        if r.get("status") != "ok":
            lines.append(f"| {r['model']} | {r['budget']} | {r.get('status')} |  |  |  |  |  |  |  |  |  |  |"
                         + ("  |  |  |" if counted else ""))
            continue
        extra = ""
        if counted:
            extra = (f" {_fmt(r.get('step_minor_faults'), '{:.0f}')} / {_fmt(r.get('plain_minor_faults'), '{:.0f}')} | "
                     f"{_fmt(r.get('step_voluntary_switches'), '{:.0f}')} / "
                     f"{_fmt(r.get('plain_voluntary_switches'), '{:.0f}')} | {_fmt(r.get('load_1min'), '{:.1f}')} |")
        lines.append(
            f"| {r['model']} | {r['budget']} | {r['strategy']} | {r['nodes']} | {_fmt(r['predicted_overhead'])} | "
            f"{_fmt(r.get('plan_overhead'))} | {_fmt(r['measured_ratio'])} | {_fmt(r['measured_cpu_ratio'])} | {_fmt(r['ratio_error'], '{:+.1%}')} | "
            f"{mib.format(float(r['predicted_step_peak_bytes']) / 2 ** 20)} | "
            f"{mib.format(float(r['measured_step_peak_bytes']) / 2 ** 20)} | "
            f"{mib.format(float(r['plain_step_peak_bytes']) / 2 ** 20)} | {r['compile_s']} |" + extra)
    if compare:
        retried = any(r.get("budget_tries") not in (None, "") for r in compare)
        rivals = any(r.get("rival_ratio") not in (None, "") for r in compare)
        how = ("Checkmate's budget is each heuristic's step peak measured in turn with the plain step, plus the "
               "parameters and batch; where checkmate's step then measured above the heuristic's (the two in "
               f"turn), the budget was lowered by the difference and solved again (at most {COMPARE_BUDGET_TRIES} "
               "budgets; the CSV's budget_tries lists each budget above the parameters and batch with the two "
               "peaks). " if retried else
               "Checkmate's budget is each heuristic's measured step peak (after its own timing) plus the "
               "parameters and batch. ")
        lines += ["", "## Against the heuristics, at the same measured memory", "",
                  how + "Measured peak: the largest of every step's peaks measured in turn, one "
                  "run each per round (the same allocation history); after own timing: the largest of the "
                  "step's runs right after its timing (\"-\" where a run did not record it)."
                  + (" The heuristic in the same loop: the heuristic's step timed again in one loop with checkmate's "
                     "and the plain step (wall, CPU), the figure to set checkmate's beside." if rivals else ""), "",
                  "| model | method | measured peak | after own timing | plain peak | measured | CPU | predicted |"
                  + (" heuristic in the same loop |" if rivals else ""),
                  "|---|---|---|---|---|---|---|---|" + ("---|" if rivals else "")]
        for r in compare:
            if r.get("status") != "ok":
                lines.append(f"| {r['model']} | {r['method']} | {r.get('status')} |  |  |  |  |  |"
                             + ("  |" if rivals else ""))
                continue
            alone = r.get("peak_alone_bytes")
            lines.append(f"| {r['model']} | {r['method']} | {mib.format(float(r['measured_step_peak_bytes']) / 2 ** 20)} | "
                         f"{'-' if alone in (None, '') else mib.format(float(alone) / 2 ** 20)} | "
                         f"{mib.format(float(r['plain_step_peak_bytes']) / 2 ** 20)} | {_fmt(r['measured_ratio'])} | "
                         f"{_fmt(r['measured_cpu_ratio'])} | {_fmt(r['predicted_overhead'])} |"
                         + ((" - |" if r.get("rival_ratio") in (None, "") else
                             f" {_fmt(r['rival_ratio'])} ({_fmt(r.get('rival_cpu_ratio'))}) |") if rivals else ""))
    return "\n".join(lines) + "\n"


FINDINGS = "## Findings"


def write_markdown(path: Path, tables: str) -> None:
    """Write the tables, keeping a hand-written section headed ``## Findings`` of the earlier file."""
    kept = ""
    if path.exists():
        old = path.read_text()
        if FINDINGS in old:
            kept = "\n" + old[old.index(FINDINGS):]
    path.write_text(tables + kept)


def check(rows: list[dict], tolerance: float, identity: float) -> list[str]:
    failures = []
    for row in rows:
        if row.get("status") != "ok":
            continue
        where = f"{row['model']} at {row['budget']}"
        if row["budget"] == "100%":
            if row["measured_ratio"] > identity:
                failures.append(f"{where}: checkpoint_all runs at {row['measured_ratio']:.3f}x the plain step "
                                f"(bar {identity:.2f}x)")
        elif abs(row["ratio_error"]) > tolerance:
            failures.append(f"{where}: measured {row['measured_ratio']:.3f}x, predicted "
                            f"{row['predicted_overhead']:.3f}x ({row['ratio_error']:+.1%}, bar {tolerance:.0%})")
    return failures


def _read_csv(path: Path) -> list[dict]:
    import csv

    if not path.exists():
        return []
    with open(path) as fh:
        return [{k: (None if v == "" else v) for k, v in r.items()} for r in csv.DictReader(fh)]


def _numbers(rows: list[dict]) -> list[dict]:
    for r in rows:
        for k in ("predicted_overhead", "measured_ratio", "ratio_error"):
            if r.get(k) is not None:
                r[k] = float(r[k])
    return rows


def rerun_compare(args, names: list[str], command: str, started: float) -> int:
    """--compare-only: the comparison of ``names`` again, its rows in place of theirs in the earlier
    run's comparison (in that run's model order; models it did not have come last)."""
    fresh = []
    for name in names:
        fresh += run_compare(name, args.repeats, args.time_limit)
    old = _read_csv(args.out / f"{args.label}_compare.csv")
    order = list(dict.fromkeys([r["model"] for r in old] + names))
    merged = [r for m in order for r in (fresh if m in names else old) if r["model"] == m]
    write_csv(args.out / f"{args.label}_compare.csv", merged, COMPARE_FIELDS)
    meta_path = args.out / f"{args.label}.meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {
        "command": command, "device": "", "seconds": 0.0, "started": ""}
    reruns = [r for r in meta.get("compare_reruns", []) if not set(r["models"]) <= set(names)]
    from checkmate.tf2.profiling import device_description

    reruns.append({"command": command, "models": names, "device": device_description(),
                   "seconds": round(time.time() - started, 1),
                   "started": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started))})
    meta["compare_reruns"] = reruns
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")
    rows = _numbers(_read_csv(args.out / f"{args.label}.csv"))
    write_markdown(args.out / f"{args.label}.md", markdown(rows, merged, meta))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--budgets", default=",".join(DEFAULT_BUDGETS))
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--time-limit", type=float, default=None, metavar="S",
                   help="the solver's time limit per compile (default: checkmate's own default)")
    p.add_argument("--compare", action="store_true", help="also the heuristics, at the same measured memory")
    p.add_argument("--compare-only", action="store_true",
                   help="only the comparison, for --models; their rows replace those of the earlier comparison")
    p.add_argument("--check", action="store_true", help="exit 1 when predicted and measured time drift apart")
    p.add_argument("--trace-copies", action="store_true",
                   help="instead of the table: trace the plain and the generated step of each plan below 100%% and "
                        "compare the recomputed copies' time with the profile's price (<label>_copies.csv, .md)")
    p.add_argument("--counters", action="store_true",
                   help="add each row's page faults and context switches per call (generated and plain step) and the "
                        "load average")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="run TF with N intra-op and N inter-op threads (default: TF's own)")
    p.add_argument("--cache-reuse", action="store_true",
                   help="instead of the table: time backward ops on an input in cache and on one evicted from it "
                        "(<label>_cache_reuse.csv, .md)")
    p.add_argument("--tolerance", type=float, default=0.08)
    p.add_argument("--max-identity-ratio", type=float, default=1.05)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--label", default="wall_clock", help="file stem of the results")
    p.add_argument("--table-only", action="store_true",
                   help="rewrite the Markdown table (and run --check) from the CSVs of an earlier run")
    args = p.parse_args(argv)
    if args.table_only:
        rows = _numbers(_read_csv(args.out / f"{args.label}.csv"))
        compare = _read_csv(args.out / f"{args.label}_compare.csv")
        meta = json.loads((args.out / f"{args.label}.meta.json").read_text())
        write_markdown(args.out / f"{args.label}.md", markdown(rows, compare, meta))
        failures = check(rows, args.tolerance, args.max_identity_ratio) if args.check else []
        for line in failures:
            print(f"FIDELITY: {line}", file=sys.stderr)
        return 1 if failures else 0
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        p.error(f"unknown model(s) {unknown}: expected some of {', '.join(MODELS)}")
    budgets = [b.strip() for b in args.budgets.split(",") if b.strip()]
    started = time.time()
    command = "python experiments/wall_clock.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.threads:
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    if args.compare_only:
        return rerun_compare(args, names, command, started)
    if args.cache_reuse:
        from checkmate.tf2.profiling import device_description

        reuse = cache_reuse(args.repeats)
        write_csv(args.out / f"{args.label}_cache_reuse.csv", reuse, CACHE_REUSE_FIELDS)
        meta = {"command": command, "device": device_description(), "seconds": round(time.time() - started, 1),
                "started": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started))}
        write_markdown(args.out / f"{args.label}_cache_reuse.md", cache_reuse_markdown(reuse, meta))
        return 0
    if args.trace_copies:
        from checkmate.tf2.profiling import device_description

        copies = [r for name in names for r in trace_copies(name, budgets, args.repeats, args.time_limit)]
        write_csv(args.out / f"{args.label}_copies.csv", copies, COPIES_FIELDS)
        meta = {"command": command, "device": device_description(), "seconds": round(time.time() - started, 1),
                "started": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started))}
        write_markdown(args.out / f"{args.label}_copies.md", copies_markdown(copies, meta))
        return 0
    rows, compare = [], []
    for name in names:
        rows += run_budgets(name, budgets, args.repeats, args.time_limit, counters=args.counters)
        if args.compare:
            compare += run_compare(name, args.repeats, args.time_limit)
    write_csv(args.out / f"{args.label}.csv", rows, FIELDS)
    if compare:
        write_csv(args.out / f"{args.label}_compare.csv", compare, COMPARE_FIELDS)
    from checkmate.tf2.profiling import device_description

    meta = {"command": command,
            "device": device_description(), "seconds": round(time.time() - started, 1),
            "started": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started))}
    (args.out / f"{args.label}.meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    write_markdown(args.out / f"{args.label}.md", markdown(rows, compare, meta))
    if args.check:
        failures = check(rows, args.tolerance, args.max_identity_ratio)
        for line in failures:
            print(f"FIDELITY: {line}", file=sys.stderr)
        return 1 if failures else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
