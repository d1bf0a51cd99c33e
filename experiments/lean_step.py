"""What a generated step that recomputes nothing runs beside the plain step, and what it costs.

For each model ``checkmate.tf2.compile`` builds the ``checkpoint_all`` step (budget 100%), and its
generated gradients step is set against the plain traced step users write: a ``tf.GradientTape`` step
in a ``tf.function``, Grappler on (experiments/wall_clock.py's ``tape_step``):

* the graphs TF executed, after Grappler: ops by type, data and control edges, and the op types whose
  counts differ;
* before any optimization: the ops of the generated function beyond those of the traced step it was
  rewritten from (a function's own arguments, output identities and control output aside);
* wall and process CPU time, interleaved in one process, median of ``--repeats`` rounds, beside a
  control: a second instance of the plain step, whose ratio to the first is what the measurement
  cannot tell from 1 (CPU time is the robust one on a shared machine);
* TF's profiler trace, ``--trace-runs`` runs of each step in turn: the time of each executed op type
  per run (the sum of its ops' durations), the total, and the op types whose time differs most.

``--previous-codegen FILE`` also times the step generated from the same plan by another version of
``checkmate/tf2/codegen.py`` (``git show <rev>:checkmate/tf2/codegen.py > FILE``) in the same rounds.

``--plan-budgets 60%`` also compiles a plan that recomputes (strategy ``auto``, FLOPs costs) and reports
what its generated step runs for the plan's order beyond the recomputations, its gates (a private
variable read or constant, or an ``EnsureShape``, that carries an anchor so that the op stays fusable),
how many ran after Grappler and their time in the profiler trace, beside the step's time ratio.

Models: ``resmlp`` and ``cnn`` (experiments/wall_clock.py), ``densenet121`` (keras.applications,
64x64, batch 8, 10 classes, random weights). Results: experiments/results/<label>.{md,meta.json}.

    python experiments/lean_step.py --models resmlp,cnn,densenet121 --repeats 21 --label lean_step
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = ("resmlp", "cnn", "densenet121")
_GEN, _PLAIN, _CONTROL, _PREVIOUS = "generated", "plain", "control", "previous"
_TOP_TYPES = 4       # op types listed per model where the profiler's times differ most


def build(name: str):
    """(model, loss, input spec, label spec, batch (x, y))."""
    import tensorflow as tf

    import wall_clock

    keras = wall_clock._keras()
    if name == "densenet121":
        keras.utils.set_random_seed(0)
        model = keras.applications.DenseNet121(weights=None, input_shape=(64, 64, 3), classes=10)
        xs, ys, classes = tf.TensorSpec((8, 64, 64, 3), tf.float32), tf.TensorSpec((8,), tf.int32), 10
        loss = keras.losses.SparseCategoricalCrossentropy()        # its head ends in a softmax
    else:
        model, _, xs, ys, classes = wall_clock.build(name)
        loss = wall_clock.loss_fn()
    return model, loss, xs, ys, wall_clock.random_batch(xs, ys, classes)


def executed_structure(run) -> dict:
    """Ops by type, data and control edges of the graphs TF executed in ``run()`` (a function's first
    call: TF reports the graphs when it instantiates a function)."""
    from checkmate.tf2 import _compat

    graphs = _compat.executed_graph_defs(run)
    types = collections.Counter(nd.op for g in graphs for nd in g.node)
    data = sum(1 for g in graphs for nd in g.node for t in nd.input if not t.startswith("^"))
    control = sum(1 for g in graphs for nd in g.node for t in nd.input if t.startswith("^"))
    return {"types": types, "ops": sum(types.values()), "data": data, "control": control, "graphs": len(graphs)}


def added_before_optimization(fn) -> collections.Counter:
    """Ops of the generated function beyond the traced step's, less the function's own: one argument
    per feed, one identity per output and the control output's NoOp."""
    generated = collections.Counter(op.type for op in fn.concrete_function.graph.get_operations())
    plain = collections.Counter(op.type for op in fn.lowered.function.graph.get_operations())
    own = collections.Counter({"Placeholder": len(fn.rewritten.feed_names), "Identity": len(fn.rewritten.output_names),
                               "NoOp": 1})
    return (generated - plain) - own


def op_type_times(fns: dict, args, runs: int, known: set) -> tuple[dict, dict]:
    """``({name: {op type: microseconds per run}}, {name: microseconds per run of the gate ops})`` from
    one profiler trace of ``runs`` rounds, each step once per round (the starting one rotating), each
    run inside a marker telling its ops apart. Only events of the executed op types ``known`` count
    (not the function call's own event, which spans the run, nor the runtime's). Gate ops: the
    generated step's own ops that carry the plan's order (their names end in a gate suffix)."""
    from checkmate.tf2.codegen import _DONE_SUFFIX, _GATE_SUFFIX
    from checkmate.tf2 import _compat

    names = list(fns)

    def body():
        for r in range(runs):
            for k in range(len(names)):
                name = names[(r + k) % len(names)]
                with _compat.profiler_marker(f"lean_step_{name}"):
                    out = fns[name](*args)
                    tf_first(out).numpy()

    space = _compat.profiler_trace(body)
    marks: list[tuple[float, float, str]] = []
    events: list[tuple[float, float, str, bool]] = []
    for plane in space.planes:
        if plane.name.startswith("/device:"):
            continue
        labels = {k: v.name for k, v in plane.event_metadata.items()}
        for line in plane.lines:
            base_us = line.timestamp_ns * 1e-3
            for ev in line.events:
                label = labels.get(ev.metadata_id, "")
                start, duration = base_us + ev.offset_ps * 1e-6, ev.duration_ps * 1e-6
                if label.startswith("lean_step_"):
                    marks.append((start, start + duration, label[len("lean_step_"):]))
                elif label.rpartition(":")[2] in known:
                    op_name, _, kind = label.rpartition(":")
                    events.append((start, duration, kind, _GATE_SUFFIX in op_name or _DONE_SUFFIX in op_name))
    marks.sort()
    out = {name: collections.Counter() for name in names}
    gates = {name: 0.0 for name in names}
    starts = [m[0] for m in marks]
    import bisect

    for start, duration, kind, gate in events:
        k = bisect.bisect_right(starts, start) - 1
        if k >= 0 and start <= marks[k][1]:
            out[marks[k][2]][kind] += duration / runs
            if gate:
                gates[marks[k][2]] += duration / runs
    return out, gates


def tf_first(out):
    import tensorflow as tf

    return tf.nest.flatten(out)[0]


def run(name: str, repeats: int, trace_runs: int, previous=None) -> dict:
    import keras

    import checkmate.tf2 as ct
    import wall_clock
    from checkmate.tf2.codegen import generate
    from checkmate.tf2.timing import interleaved_times

    model, loss, xs, ys, (x, y) = build(name)
    step = ct.compile(model, loss, keras.optimizers.SGD(), xs, ys, budget="100%", strategy="checkpoint_all",
                      cost_model="flops")
    fresh = generate(step.lowered, step.schedule)          # not called yet: its first call reports its graphs
    flat = fresh.flat_args(x, y)
    plain, control = wall_clock.tape_step(model, loss), wall_clock.tape_step(model, loss)
    row = {"model": name, "nodes": step.graph.n, "order": fresh.rewritten.describe_order(),
           "variables": len(step.lowered.function.graph.captures)}
    structure_gen = executed_structure(lambda: fresh.call_flat(*flat))
    structure_plain = executed_structure(lambda: plain(x, y))
    diff = {k: structure_gen["types"][k] - structure_plain["types"][k]
            for k in set(structure_gen["types"]) | set(structure_plain["types"])
            if structure_gen["types"][k] != structure_plain["types"][k]}
    row.update(ops=(structure_plain["ops"], structure_gen["ops"]),
               data=(structure_plain["data"], structure_gen["data"]),
               control=(structure_plain["control"], structure_gen["control"]), type_diff=diff,
               added=dict(added_before_optimization(fresh)))
    fns = {_GEN: step.function.call_flat, _PLAIN: lambda *a: plain(*a), _CONTROL: lambda *a: control(*a)}
    if previous is not None:
        fns[_PREVIOUS] = previous.generate(step.lowered, step.schedule).call_flat
        before = previous.generate(step.lowered, step.schedule)
        row["previous_added"] = dict(added_before_optimization(before))
        row["previous_ops"] = executed_structure(lambda: before.call_flat(*flat))["ops"]
    names = list(fns)
    row["load_before"] = os.getloadavg()
    wall, cpu = interleaved_times([fns[k] for k in names], *flat, repeats=repeats)
    row["load_after"] = os.getloadavg()
    row["wall_ms"] = {k: w * 1e3 for k, w in zip(names, wall)}
    row["cpu_ms"] = {k: c * 1e3 for k, c in zip(names, cpu)}
    if trace_runs > 0:
        known = set(structure_gen["types"]) | set(structure_plain["types"])
        times, _ = op_type_times({k: fns[k] for k in (_GEN, _PLAIN, _CONTROL)}, flat, trace_runs, known)
        row["trace_ms"] = {k: sum(v.values()) * 1e-3 for k, v in times.items()}
        gap = {t: times[_GEN][t] - times[_PLAIN][t] for t in set(times[_GEN]) | set(times[_PLAIN])}
        row["trace_gap"] = sorted(gap.items(), key=lambda kv: -abs(kv[1]))[:_TOP_TYPES]
        ctl = {t: times[_CONTROL][t] - times[_PLAIN][t] for t in set(times[_CONTROL]) | set(times[_PLAIN])}
        row["trace_control_gap"] = sorted(ctl.items(), key=lambda kv: -abs(kv[1]))[:_TOP_TYPES]
    print(f"{name}: {row}", flush=True)
    return row


def gate_names(names) -> int:
    """How many of the op names are the generated step's gates (value, variable-read and constant
    gates, and the EnsureShape an anchor waits for instead of a computation's last op)."""
    from checkmate.tf2.codegen import _DONE_SUFFIX, _GATE_SUFFIX

    return sum(1 for n in names if _GATE_SUFFIX in n or _DONE_SUFFIX in n)


def run_plan(name: str, budget: str, repeats: int, trace_runs: int, time_limit_s: float) -> dict:
    """A plan that recomputes (``budget``, strategy ``auto``): what the generated step runs for the
    plan's order beyond the recomputations themselves, the gates, and what they cost."""
    import keras

    import checkmate.tf2 as ct
    import wall_clock
    from checkmate.tf2 import _compat
    from checkmate.tf2.codegen import generate
    from checkmate.tf2.timing import interleaved_times

    from checkmate.errors import InfeasibleBudgetError

    model, loss, xs, ys, (x, y) = build(name)
    try:
        step = ct.compile(model, loss, keras.optimizers.SGD(), xs, ys, budget=budget, cost_model="flops",
                          time_limit_s=time_limit_s)
    except InfeasibleBudgetError as exc:      # a budget below the model's minimum is a row, not a crash
        print(f"{name} {budget}: {exc}", flush=True)
        return {"model": name, "budget": budget, "status": str(exc).split(";")[0]}
    fresh = generate(step.lowered, step.schedule)
    flat = fresh.flat_args(x, y)
    plain = wall_clock.tape_step(model, loss)
    graphs = _compat.executed_graph_defs(lambda: fresh.call_flat(*flat))
    executed = [nd.name for g in graphs for nd in g.node]
    plain_ops = executed_structure(lambda: plain(x, y))["ops"]
    row = {"model": name, "budget": budget, "strategy": step.strategy,
           "recomputations": int(step.schedule.recompute.sum()) - step.graph.n,
           "predicted": step.predicted.overhead, "order": fresh.rewritten.describe_order(),
           "ops": (plain_ops, len(executed)),
           "gates_emitted": gate_names(nd.name for nd in fresh.rewritten.graph_def.node),
           "gates_executed": gate_names(executed)}
    row["load_before"] = os.getloadavg()
    wall, cpu = interleaved_times([step.function.call_flat, lambda *a: plain(*a)], *flat, repeats=repeats)
    row["load_after"] = os.getloadavg()
    row["wall_ratio"], row["cpu_ratio"] = wall[0] / wall[1], cpu[0] / cpu[1]
    row["plain_ms"] = wall[1] * 1e3
    if trace_runs > 0:
        known = {nd.op for g in graphs for nd in g.node}
        times, gates = op_type_times({_GEN: step.function.call_flat}, flat, trace_runs, known)
        row["trace_ms"] = sum(times[_GEN].values()) * 1e-3
        row["gates_ms"] = gates[_GEN] * 1e-3
    print(f"{name} {budget}: {row}", flush=True)
    return row


def render_plans(rows: list[dict]) -> list[str]:
    lines = ["", "Recomputing plans (strategy `auto`, FLOPs costs): the ops the generated step runs for the plan's "
             "order beyond the recomputations, its gates (a private variable read or constant, or an EnsureShape "
             "that carries an anchor so that the op itself stays fusable, or that an anchor waits for instead of a "
             "computation's last op), emitted and executed (after Grappler), and their summed op time per run "
             "against all ops' time per run in the profiler trace. Executed ops are counted over the graphs TF "
             "reports for a call, as above.", "",
             "| model | budget | recomputations | predicted | order | executed ops plain / generated "
             "| gates emitted / executed | gates' op time / all ops' time (ms per run) | generated wall / CPU "
             "| plain ms wall | load average before / after |", "|" + "---|" * 11]
    for row in rows:
        if "status" in row:
            lines.append(f"| {row['model']} | {row['budget']} | {row['status']} |" + " |" * 8)
            continue
        trace = (f"{row['gates_ms']:.3f} / {row['trace_ms']:.1f}" if "trace_ms" in row else "-")
        lines.append(f"| {row['model']} | {row['budget']} | {row['recomputations']} | {row['predicted']:.3f}x | "
                     f"{row['order']} | {row['ops'][0]} / {row['ops'][1]} | {row['gates_emitted']} / "
                     f"{row['gates_executed']} | {trace} | {row['wall_ratio']:.3f}x / {row['cpu_ratio']:.3f}x | "
                     f"{row['plain_ms']:.1f} | " + " ".join(f"{v:.1f}" for v in row["load_before"]) + " / "
                     + " ".join(f"{v:.1f}" for v in row["load_after"]) + " |")
    return lines


def _ratio(row: dict, key: str, name: str) -> str:
    values = row[key]
    return f"{values[name] / values[_PLAIN]:.3f}x" if name in values else "-"


def _gaps(items) -> str:
    return ", ".join(f"{t} {us / 1e3:+.2f}" for t, us in items) or "-"


def render(rows: list[dict], meta: dict, previous: bool, plans: list[dict] = ()) -> str:
    lines = ["# A generated step that recomputes nothing, against the plain step", "",
             f"Command: `{meta['command']}`  ",
             f"Device: {meta['device']}; started {meta['started']} UTC, {meta['seconds']:.0f} s.", "",
             "The plain step is a `tf.GradientTape` step in a `tf.function` (Grappler on); the control is a second "
             "instance of it. Ratios are to the plain step: medians of the interleaved rounds, wall and process CPU "
             "time. Executed: the graphs TF ran after Grappler (ops, data edges, control edges), plain / generated, "
             "counted over the graphs TF reports for a call (two for each step here).",
             ""]
    head = ["model", "nodes", "variables", "executed ops", "data edges", "control edges", "op types that differ",
            "ops added before optimization", "generated wall / CPU", "control wall / CPU"]
    if previous:
        head += ["previous codegen: ops added before optimization", "previous codegen: executed ops",
                 "previous codegen wall / CPU"]
    head += ["plain ms wall / CPU", "load average before / after"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row["model"], str(row["nodes"]), str(row["variables"]), "{} / {}".format(*row["ops"]),
                 "{} / {}".format(*row["data"]), "{} / {}".format(*row["control"]),
                 ", ".join(f"{k} {v:+d}" for k, v in sorted(row["type_diff"].items())) or "none",
                 ", ".join(f"{k} {v}" for k, v in sorted(row["added"].items())) or "none",
                 f"{_ratio(row, 'wall_ms', _GEN)} / {_ratio(row, 'cpu_ms', _GEN)}",
                 f"{_ratio(row, 'wall_ms', _CONTROL)} / {_ratio(row, 'cpu_ms', _CONTROL)}"]
        if previous:
            cells += [", ".join(f"{k} {v}" for k, v in sorted(row["previous_added"].items())) or "none",
                      str(row["previous_ops"])]
            cells.append(f"{_ratio(row, 'wall_ms', _PREVIOUS)} / {_ratio(row, 'cpu_ms', _PREVIOUS)}")
        cells += [f"{row['wall_ms'][_PLAIN]:.1f} / {row['cpu_ms'][_PLAIN]:.1f}",
                  " ".join(f"{v:.1f}" for v in row["load_before"]) + " / "
                  + " ".join(f"{v:.1f}" for v in row["load_after"])]
        lines.append("| " + " | ".join(cells) + " |")
    traced = [row for row in rows if "trace_ms" in row]
    if traced:
        lines += ["", "Profiler trace: the executed ops' summed durations per run (ms), and the op types whose time "
                  "differs most from the plain step's (ms per run), for the generated step and for the control.", "",
                  "| model | ops' time plain / generated / control | generated - plain, by op type "
                  "| control - plain, by op type |", "|---|---|---|---|"]
        for row in traced:
            t = row["trace_ms"]
            lines.append(f"| {row['model']} | {t[_PLAIN]:.2f} / {t[_GEN]:.2f} / {t[_CONTROL]:.2f} | "
                         f"{_gaps(row['trace_gap'])} | {_gaps(row['trace_control_gap'])} |")
    if plans:
        lines += render_plans(plans)
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--repeats", type=int, default=21, help="interleaved timing rounds (median)")
    p.add_argument("--trace-runs", type=int, default=5, help="profiled runs of each step (0: no trace)")
    p.add_argument("--previous-codegen", type=Path, default=None, metavar="FILE",
                   help="also time the step generated by this version of checkmate/tf2/codegen.py")
    p.add_argument("--plan-budgets", default="", metavar="B,...",
                   help="also a recomputing plan of each model at these budgets (e.g. 50%%): its gates and their cost")
    p.add_argument("--time-limit", type=float, default=20.0, metavar="S", help="solver limit of a recomputing plan")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--label", default="lean_step", help="file stem of the results")
    args = p.parse_args(argv)
    started = time.time()
    from common import write_run_report
    from step_order import load_codegen

    previous = load_codegen(args.previous_codegen) if args.previous_codegen else None
    names = [m for m in args.models.split(",") if m]
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        p.error(f"unknown model(s) {', '.join(unknown)}: expected some of {', '.join(MODELS)}")
    rows = [run(name, args.repeats, args.trace_runs, previous) for name in names]
    plans = [run_plan(name, budget, args.repeats, args.trace_runs, args.time_limit)
             for name in names for budget in args.plan_budgets.split(",") if budget]
    argv = sys.argv[1:] if argv is None else list(argv)
    path = write_run_report(args.out, args.label, "lean_step.py", argv, started,
                            lambda meta: render(rows, meta, previous is not None, plans))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
