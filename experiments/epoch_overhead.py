"""Where an epoch of ``RematModel.fit`` spends its time beyond plain Keras ``fit``: the step, or the trainer.

For each model (the KerasHub and keras.applications models of ``realworld.py``, same sizes, batch 8)
and each budget, a ``RematModel`` and a plain twin from the same weights are timed, all of the
following interleaved in one process (each round starts one further on), median of ``--repeats``,
in wall time and in the process's CPU time (which other jobs on a shared machine disturb less):

* ``fit``: one epoch of ``fit`` (``--steps`` batches) of each, as ``realworld.py`` times it, and of a
  control: a second plain model from the same weights, whose ratio to the plain one is what the same
  work measures twice here (the noise floor of every ratio);
* ``fit host``: the CPU time of the thread that calls ``fit`` during that epoch: the host's Python
  work (Keras' loop, callbacks, the data adapter, RematModel's batch handling, dispatching the train
  function), apart from TensorFlow's own threads, which run the step;
* ``fit outside``: the process CPU time of that epoch spent outside the calls of the train function
  (``fit``'s per-epoch setup and teardown, callbacks, the data adapter), measured by wrapping each
  model's train function during the timed epochs; the rest of the epoch is its batches;
* ``train function``: each model's train function called ``--steps`` times on a ``tf.data``
  iterator (what ``fit`` calls per batch, without its per-epoch setup and callbacks);
* ``step``: the compiled step's gradients against the plain traced step's (no optimizer, no
  metrics), ``--steps`` calls each on one batch: what the predicted overhead predicts;
* ``train``: the compiled step with its optimizer update, called eagerly ``--steps`` times (the
  train function without Keras' metrics and data);

Each side's wall time over its CPU time is reported too: where RematModel's exceeds the plain
model's at the same CPU time, the difference is time spent waiting (fewer ops run in parallel, or
the thread waited for the CPU), not work.
* ``train step``: each model's own ``train_step`` (Keras' for the plain model: forward, loss, tape,
  optimizer update, loss tracker) traced in one ``tf.function`` and called ``--steps`` times on one
  batch: what a batch costs without ``fit``'s data iterator.

Each part is reported by its median and its minimum over the rounds: on a loaded machine the
minimum is the steadier statistic for a fixed amount of work (other jobs only ever add time).

The budget ``checkpoint_all`` (100%, nothing recomputed: the generated step is the plain step's
graph) isolates the trainer: its epoch should cost what plain ``fit`` costs. ``default`` is the
budget ``realworld.py`` trains the model at (50% of checkpoint-all for transformers, 50% of the
activations for image models), any other value is passed to ``RematModel`` as it is.

Writes experiments/results/epoch_overhead.csv and epoch_overhead.md.

    python experiments/epoch_overhead.py                                   # gpt2, bert, vit (~20 min)
    python experiments/epoch_overhead.py --models gpt2 --budgets checkpoint_all --repeats 5
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from common import RESULTS, markdown_table, write_csv, write_meta  # noqa: E402

# parts timed for both models, each RematModel / plain; "train" is the compiled step's alone
PARTS = ("fit", "train_function", "train_step", "step")
STATISTICS = ("median", "min")
FIELDS = (["model", "budget", "strategy", "predicted_overhead", "recomputations", "order", "steps", "repeats",
           "load_average"]
          + [f"{part}_{side}_{unit}_{stat}" for part in PARTS for side in ("plain", "remat")
             for unit in ("wall_s", "cpu_s") for stat in STATISTICS]
          + [f"train_remat_{unit}_{stat}" for unit in ("wall_s", "cpu_s") for stat in STATISTICS]
          + [f"fit_control_{unit}_{stat}" for unit in ("wall_s", "cpu_s") for stat in STATISTICS]
          + [f"fit_{side}_host_cpu_s_{stat}" for side in ("plain", "remat", "control") for stat in STATISTICS]
          + [f"fit_{side}_outside_cpu_s_{stat}" for side in ("plain", "remat", "control") for stat in STATISTICS]
          + [f"{part}_{unit}_ratio_{stat}" for part in PARTS for unit in ("wall", "cpu") for stat in STATISTICS]
          + [f"fit_control_{unit}_ratio_{stat}" for unit in ("wall", "cpu") for stat in STATISTICS]
          + [f"fit_host_cpu_ratio_{stat}" for stat in STATISTICS]
          + [f"{part}_{side}_wall_over_cpu_median" for part in PARTS for side in ("plain", "remat")])


def run(name: str, budget: str, repeats: int, steps: int) -> dict:
    import numpy as np
    import tensorflow as tf

    import checkmate.tf2
    import realworld as rw

    plain, other, kind = rw.twins(name)
    control = rw.twins(name)[0]
    if budget == "checkpoint_all":
        # nothing recomputed; the plan is the same under any cost model, FLOPs skip the profiling
        trainer = checkmate.tf2.RematModel(other, budget="100%", strategy="checkpoint_all",
                                           compile_options={"cost_model": "flops"})
    else:
        given = rw.BUDGETS.get(name, "50%" if kind in rw.TRANSFORMERS else "50% activations") \
            if budget == "default" else budget
        trainer = checkmate.tf2.RematModel(other, budget=given)
    if checkmate.tf2.losses.compile_arguments_of(other) is not None:
        trainer.compile()
    else:
        trainer.compile(other.optimizer, other.loss)
    x, y = rw.batches(kind, steps, image=getattr(rw.model_entry(name)[0], "image_size", rw.IMAGE))
    for model in (plain, control, trainer):
        # traced, compiled, and (RematModel) its step measured after this first epoch: all left out
        model.fit(x, y, batch_size=rw.BATCH, epochs=1, shuffle=False, verbose=0)
    step = trainer.compiled_step()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(rw.BATCH).repeat()
    plain_batches, remat_batches = iter(dataset), iter(dataset)
    first = tf.nest.map_structure(lambda a: tf.convert_to_tensor(a[:rw.BATCH]), (x, y))
    flat = step.function.flat_args(first[0], (first[1], tf.ones((rw.BATCH,), tf.float32)))

    def wait(out):
        tf.nest.flatten(out)[0].numpy()

    def repeated(fn, *args):
        def go():
            for _ in range(steps):
                out = fn(*args)
            wait(out)
        return go

    def traced_train_step(model):
        # the model's own train_step on one batch in one tf.function, as fit's train function traces it
        data = first
        fn = tf.function(lambda: model.train_step(data), autograph=False)
        return lambda: fn()

    fns = {
        "fit_plain": lambda: plain.fit(x, y, batch_size=rw.BATCH, epochs=1, shuffle=False, verbose=0),
        "fit_remat": lambda: trainer.fit(x, y, batch_size=rw.BATCH, epochs=1, shuffle=False, verbose=0),
        "fit_control": lambda: control.fit(x, y, batch_size=rw.BATCH, epochs=1, shuffle=False, verbose=0),
        "train_function_plain": repeated(plain.train_function, plain_batches),
        "train_function_remat": repeated(trainer.train_function, remat_batches),
        "train_step_plain": repeated(traced_train_step(plain)),
        "train_step_remat": repeated(traced_train_step(trainer)),
        "step_plain": repeated(step.lowered.function, *flat),
        "step_remat": repeated(step.function.call_flat, *flat),
        "train_remat": repeated(step.train_flat_with_predictions, *flat),
    }
    for fn in fns.values():
        fn()
    # the process CPU time each epoch spends inside its model's train function (the batches)
    inside = {"plain": 0.0, "remat": 0.0, "control": 0.0}

    def batches_timed(side, model):
        own = model.train_function

        def timed(iterator):
            started = time.process_time()
            try:
                return own(iterator)
            finally:
                inside[side] += time.process_time() - started
        return timed

    for side, model in (("plain", plain), ("remat", trainer), ("control", control)):
        model.train_function = batches_timed(side, model)
    names = list(fns)
    wall: dict = {k: [] for k in names}
    cpu: dict = {k: [] for k in names}
    host: dict = {k: [] for k in names}
    outside: dict = {k: [] for k in inside}
    for r in range(repeats):
        for k in names[r % len(names):] + names[:r % len(names)]:
            inside.update((side, 0.0) for side in inside)
            t, c, h = time.perf_counter(), time.process_time(), time.thread_time()
            fns[k]()
            wall[k].append(time.perf_counter() - t)
            cpu[k].append(time.process_time() - c)
            host[k].append(time.thread_time() - h)
            if k.startswith("fit_"):
                outside[k[4:]].append(cpu[k][-1] - inside[k[4:]])
    statistic = {"median": lambda v: round(float(np.median(v)), 4), "min": lambda v: round(float(np.min(v)), 4)}
    row = {"model": name, "budget": budget if budget != "default" else given, "strategy": step.strategy,
           "predicted_overhead": round(step.predicted.overhead, 4), "recomputations": step.predicted.recompute_count,
           "order": step.function.rewritten.describe_order(), "steps": steps, "repeats": repeats,
           "load_average": " ".join(f"{v:.1f}" for v in os.getloadavg())}
    for k in names:
        for stat, f in statistic.items():
            row[f"{k}_wall_s_{stat}"] = f(wall[k])
            row[f"{k}_cpu_s_{stat}"] = f(cpu[k])
    for side in ("plain", "remat", "control"):
        for stat, f in statistic.items():
            row[f"fit_{side}_host_cpu_s_{stat}"] = f(host[f"fit_{side}"])
            row[f"fit_{side}_outside_cpu_s_{stat}"] = f(outside[side])
    for part in PARTS:
        for unit in ("wall", "cpu"):
            for stat in STATISTICS:
                row[f"{part}_{unit}_ratio_{stat}"] = round(row[f"{part}_remat_{unit}_s_{stat}"]
                                                           / row[f"{part}_plain_{unit}_s_{stat}"], 3)
        for side in ("plain", "remat"):
            row[f"{part}_{side}_wall_over_cpu_median"] = round(float(np.median(
                [w / c for w, c in zip(wall[f"{part}_{side}"], cpu[f"{part}_{side}"]) if c > 0])), 3)
    for unit in ("wall", "cpu"):
        for stat in STATISTICS:
            row[f"fit_control_{unit}_ratio_{stat}"] = round(row[f"fit_control_{unit}_s_{stat}"]
                                                            / row[f"fit_plain_{unit}_s_{stat}"], 3)
    for stat in STATISTICS:
        row[f"fit_host_cpu_ratio_{stat}"] = round(row[f"fit_remat_host_cpu_s_{stat}"]
                                                  / row[f"fit_plain_host_cpu_s_{stat}"], 3)
    print(row, flush=True)
    return row


COLUMNS = [("model", "model"), ("budget", "budget"), ("predicted", "predicted overhead"),
           ("fit", "epoch (fit) wall / CPU"), ("train_function", "train function wall / CPU"),
           ("train_step", "train step wall / CPU"), ("step", "step gradients wall / CPU"),
           ("control", "control epoch wall / CPU"), ("host", "epoch host thread CPU"),
           ("outside", "epoch CPU s outside the train function, plain / remat / control"),
           ("waiting", "wall / CPU time, plain / remat: epoch, train function, step gradients"),
           ("seconds", "epoch s, plain / remat (wall)"), ("load_average", "load average (1, 5, 15 min)"),
           ("order", "order")]


def write_markdown(path: Path, rows: list[dict], command: str, steps: int, repeats: int,
                   commit: str | None = None) -> None:
    def ratios(row, part):
        return " / ".join(f"{row[f'{part}_{unit}_ratio_min']:.3f}x (median {row[f'{part}_{unit}_ratio_median']:.3f}x)"
                          for unit in ("wall", "cpu"))

    shown = [{**row, "predicted": f"{row['predicted_overhead']:.3f}x ({row['recomputations']} recomputations)",
              **{part: ratios(row, part) for part in PARTS},
              **({"control": ratios(row, "fit_control"),
                  "host": (f"{row['fit_host_cpu_ratio_min']:.3f}x (median {row['fit_host_cpu_ratio_median']:.3f}x; "
                           f"{row['fit_plain_host_cpu_s_min']} / {row['fit_remat_host_cpu_s_min']} s)"),
                  "outside": " / ".join(f"{row[f'fit_{side}_outside_cpu_s_min']}" for side in ("plain", "remat", "control"))
                             + " (median " + " / ".join(f"{row[f'fit_{side}_outside_cpu_s_median']}"
                                                        for side in ("plain", "remat", "control")) + ")",
                  "waiting": ", ".join(f"{row[f'{part}_plain_wall_over_cpu_median']:.2f} / "
                                       f"{row[f'{part}_remat_wall_over_cpu_median']:.2f}"
                                       for part in ("fit", "train_function", "step"))}
                 if "fit_host_cpu_ratio_min" in row else {}),
              "seconds": f"{row['fit_plain_wall_s_min']} / {row['fit_remat_wall_s_min']}"} for row in rows]
    path.write_text(
        "# Where RematModel's epoch time goes, against plain Keras fit\n\n"
        f"Command: `{command}`" + (f" (commit {commit})" if commit else "")
        + f"\n\nRatios RematModel / plain of the minimum (and the median) of {repeats} interleaved runs of "
        f"{steps} batches each, wall time / process CPU time. The minimum is the statistic used: other jobs "
        "on a shared machine only ever add time to a fixed amount of work.\n\n"
        + markdown_table(shown, COLUMNS) + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="gpt2,bert,vit", help="models of realworld.py, comma-separated")
    p.add_argument("--budgets", default="checkpoint_all,default",
                   help="comma-separated: checkpoint_all (100%%, nothing recomputed), default (realworld.py's), or a budget")
    p.add_argument("--repeats", type=int, default=9, help="interleaved rounds (medians)")
    p.add_argument("--steps", type=int, default=6, help="batches per timed run")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--name", default="epoch_overhead", help="file stem of the results")
    args = p.parse_args(argv)
    import realworld as rw

    started = time.perf_counter()
    command = ("python experiments/epoch_overhead.py " + " ".join(sys.argv[1:] if argv is None else argv)).strip()
    commit = rw.source_commit()
    rows = []
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        if name not in rw.MODELS and name not in rw.EXTRA_MODELS:
            p.error(f"unknown model {name!r}: one of {', '.join([*rw.MODELS, *rw.EXTRA_MODELS])}")
        for budget in [b.strip() for b in args.budgets.split(",") if b.strip()]:
            rows.append(run(name, budget, args.repeats, args.steps))
            # written after each run, so that a long run leaves what it has measured
            write_csv(args.out / f"{args.name}.csv", rows, FIELDS)
            write_markdown(args.out / f"{args.name}.md", rows, command, args.steps, args.repeats, commit)
    write_meta(args.out / f"{args.name}.meta.json", "default", started=started,
               extra={"commit": commit} if commit else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
