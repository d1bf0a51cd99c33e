"""The ``auto`` strategy on real models' graphs and long-skip graphs, with and without its repair and
refinement passes.

Graphs (no TensorFlow needed to run this script):

* ``experiments/results/graphs/real/{gpt2,llama,bert,vit,densenet121}.json``: the graphs
  ``RematModel`` plans for KerasHub's GPT2CausalLM, LlamaCausalLM, BertTextClassifier and
  ViTImageClassifier and keras.applications' DenseNet121 (64x64), at the configurations of
  ``experiments/realworld.py``, batch 8, ``level="auto"``, profiled costs (written by the
  ``--extract`` mode of this script, which needs TensorFlow and keras-hub);
* ``experiments/results/graphs/real/qwenmoe.json``: the graph ``RematModel`` plans for KerasHub's
  QwenMoeCausalLM (4 experts, top 2, a shared expert) at ``experiments/realworld.py``'s
  configuration, batch 8, ``level="auto"``, profiled on an AMD EPYC (``--extract qwenmoe``);
* ``experiments/results/graphs/real/{inceptionresnetv2,qwen3moe}.json``: the graphs
  ``checkmate.tf2.compile`` and ``RematModel`` planned, with their defaults, for keras.applications'
  InceptionResNetV2 (75x75, 10 classes, SGD with momentum) and KerasHub's Qwen3MoeCausalLM (2 layers,
  hidden 256, 4 experts, top 2, sequences of 128), batch 8, profiled on an Intel Xeon (not written by
  ``--extract``: these models are not in ``experiments/realworld.py``); their time limits are the
  ones compile and RematModel chose for them (150 s and 57 s);
* the diffusion-style U-Nets of ``tests/test_auto_skips.py`` (4 levels of residual blocks whose
  outputs are concatenated into the decoder): 2 blocks a level (326 nodes) and 3 (446 nodes).

For each graph and budget (a percentage of checkpoint-all's peak), ``auto`` runs under a time limit
twice, interleaved: ``before`` with the repair and refinement passes switched off (among them the
drops of holds from checkpoint-all on graphs of up to 500 nodes), ``after`` as it is (``--variants``
also offers ``no_late_repair``: auto without the repair of a refused hierarchical plan's programmes
further above the budget once a schedule is known). Each row gives
the overhead (compute cost over one plain step), the proven lower bound auto reports (in the same
unit) and the gap to it, the seconds taken, or the minimum budget auto names when it refuses, and the
one-minute load average when the run started (the machine is shared: it says how much of the time
limit the run had).

Writes experiments/results/solver_quality.csv and solver_quality.md.

    python experiments/solver_quality.py                       # every graph (~30 min on 2 loaded cores)
    python experiments/solver_quality.py --graphs gpt2,vit --time-limit 20
    python experiments/solver_quality.py --graphs qwenmoe,qwen3moe --variants no_late_repair,after --name solver_quality_late
    python experiments/solver_quality.py --extract gpt2,llama,bert,vit,densenet121   # needs TensorFlow
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from common import RESULTS, markdown_table, write_csv, write_meta  # noqa: E402

REAL = RESULTS / "graphs" / "real"
# graph -> (budgets, time limit in seconds): the first-plan limit of RematModel for the transformers,
# longer ones for the dense graph and compile's default (150 s) for the long-skip U-Nets (at 60 s on
# two loaded cores the 446-node one ran out of time before the drops from checkpoint-all finished)
CASES = {
    "gpt2": (("50%",), 20.0),
    "llama": (("50%",), 20.0),
    "bert": (("50%",), 20.0),
    "vit": (("50%",), 20.0),
    "densenet121": (("60%", "55%", "50%"), 120.0),
    "inceptionresnetv2": (("50% activations",), 150.0),
    "qwen3moe": (("50%",), 57.0),
    "qwenmoe": (("50%",), 60.0),
    "nasnetmobile": (("70%", "50%"), 60.0),
    "unet326": (("50%", "40%", "30%"), 150.0),
    "unet446": (("50%", "40%", "30%"), 150.0),
}
VARIANTS = ("before", "after", "no_late_repair")
FIELDS = ["graph", "nodes", "budget", "variant", "time_limit_s", "load_1min", "seconds", "overhead", "bound",
          "gap_to_bound", "min_budget_pct", "status"]


def load(name: str):
    from checkmate.graph import load_graph

    if name.startswith("unet"):
        sys.path.insert(0, str(HERE.parent / "tests"))
        from test_auto_skips import diffusion_unet

        return diffusion_unet(blocks=2 if name == "unet326" else 3)
    return load_graph(REAL / f"{name}.json")


def run(graph, budget: str, variant: str, time_limit_s: float) -> dict:
    import checkmate
    import checkmate.solvers.auto as auto_module
    from checkmate.bounds import checkpoint_all_peak
    from checkmate.errors import InfeasibleBudgetError
    from checkmate.solvers import parse_budget
    from checkmate.solvers.types import relative_gap

    saved = auto_module._repair, auto_module._refine, auto_module.PLAN_LATE_REPAIR_MAX_EXCESS
    if variant == "before":
        auto_module._repair = lambda *a, **k: None
        auto_module._refine = lambda *a, **k: None
    elif variant == "no_late_repair":
        # a refused hierarchical plan's programmes more than PLAN_REPAIR_MAX_EXCESS above the budget
        # are not repaired once a schedule is known
        auto_module.PLAN_LATE_REPAIR_MAX_EXCESS = 0.0
    # the machine is shared: the load when the run starts says how much of the time limit it had
    row = {"graph": graph.name, "nodes": graph.n, "budget": budget, "variant": variant, "time_limit_s": time_limit_s,
           "load_1min": round(os.getloadavg()[0], 1)}
    started = time.perf_counter()
    try:
        r = checkmate.solve(graph, parse_budget(budget, graph), strategy="auto", time_limit_s=time_limit_s)
    except InfeasibleBudgetError as exc:
        minimum = exc.min_feasible_budget_bytes
        row.update(status="infeasible", min_budget_pct=(None if minimum is None else
                                                        round(100 * minimum / checkpoint_all_peak(graph), 1)))
    except checkmate.errors.TimeLimitError:
        row.update(status="time limit, no schedule")
    else:
        row.update(overhead=round(r.compute_cost / graph.total_cost, 4),
                   bound=None if r.lower_bound is None else round(r.lower_bound / graph.total_cost, 4),
                   gap_to_bound=f"{100 * relative_gap(r.compute_cost, r.lower_bound):.2f}%"
                   if r.lower_bound is not None else None, status=r.status.split(";")[0][:80])
    finally:
        auto_module._repair, auto_module._refine, auto_module.PLAN_LATE_REPAIR_MAX_EXCESS = saved
    row["seconds"] = round(time.perf_counter() - started, 1)
    return row


def extract(names: list[str]) -> None:
    """Write the graph RematModel plans for each model of ``experiments/realworld.py`` (its lowering
    and profiling; the solve is skipped)."""
    import realworld
    import tensorflow as tf

    import checkmate.tf2
    import checkmate.tf2.step as step_module
    from checkmate.graph import save_graph

    class _Lowered(Exception):
        pass

    REAL.mkdir(parents=True, exist_ok=True)
    original = step_module.solve_or_reuse
    for name in names:
        plain, other, kind = realworld.twins(name)
        x, y = realworld.batches(kind, 1)

        def capture(graph, planned, **_):
            save_graph(graph, REAL / f"{name}.json")
            raise _Lowered

        step_module.solve_or_reuse = capture
        try:
            trainer = checkmate.tf2.RematModel(other, budget="50%")
            if checkmate.tf2.losses.compile_arguments_of(other) is not None:
                trainer.compile()
            else:
                trainer.compile(other.optimizer, other.loss)
            first = tf.nest.map_structure(lambda a: tf.convert_to_tensor(a[:realworld.BATCH]), (x, y))
            trainer.compiled_step(*first)
        except _Lowered:
            print(f"wrote {REAL / (name + '.json')}", flush=True)
        finally:
            step_module.solve_or_reuse = original


BOUND_FIELDS = ["memory_bound_moments", "memory_bound_inputs", "memory_bound_integer", "memory_bound_s"]


def _memory_bounds(graph, budget: str) -> dict:
    """``cost_lower_bound`` at the budget without the inputs recomputations need, with them (its
    programme in fractions only) and as it is (that programme in integers as well), over the graph's
    total cost, and the seconds of the last."""
    from checkmate.bounds import cost_lower_bound
    from checkmate.solvers import parse_budget

    budget_bytes = parse_budget(budget, graph)
    moments = cost_lower_bound(graph, budget_bytes, recompute_inputs=False, integer_time_s=None)
    inputs = cost_lower_bound(graph, budget_bytes, integer_time_s=None)
    started = time.perf_counter()
    integer = cost_lower_bound(graph, budget_bytes)
    return {"memory_bound_moments": round(moments / graph.total_cost, 4),
            "memory_bound_inputs": round(inputs / graph.total_cost, 4),
            "memory_bound_integer": round(integer / graph.total_cost, 4),
            "memory_bound_s": round(time.perf_counter() - started, 2)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--graphs", default=",".join(CASES), help="comma-separated graphs (default: all)")
    p.add_argument("--time-limit", type=float, default=None, help="override every graph's time limit (seconds)")
    p.add_argument("--extract", default=None, help="lower these realworld.py models to graph files instead")
    p.add_argument("--name", default="solver_quality", help="output file stem")
    p.add_argument("--variants", default="before,after",
                   help="comma-separated runs of each graph and budget: before (no repair or refinement), "
                        "after (auto as it is), no_late_repair (auto without the late repair of a refused "
                        "hierarchical plan's programmes)")
    p.add_argument("--bounds", action="store_true",
                   help="only auto as it is (no run without repair), beside the memory bound without what "
                        "recomputations need (cost_lower_bound's recompute_inputs=False), with it in "
                        "fractions (integer_time_s=None) and as it is (in integers as well)")
    args = p.parse_args(argv)
    if args.extract:
        extract(args.extract.split(","))
        return 0
    unknown = [v for v in args.variants.split(",") if v not in VARIANTS]
    if unknown:
        p.error(f"unknown variant(s) {', '.join(unknown)}: one of {', '.join(VARIANTS)}")
    unknown = [g for g in args.graphs.split(",") if g not in CASES]
    if unknown:
        p.error(f"unknown graph(s) {', '.join(unknown)}: one of {', '.join(CASES)}")
    started = time.perf_counter()
    load_at_start = list(os.getloadavg())
    rows = []
    for name in args.graphs.split(","):
        budgets, limit = CASES[name]
        graph = load(name)
        for budget in budgets:
            for variant in (("after",) if args.bounds else args.variants.split(",")):
                row = run(graph, budget, variant, args.time_limit or limit)
                row["graph"] = name
                if args.bounds:
                    row.update(_memory_bounds(graph, budget))
                print(row, flush=True)
                rows.append(row)
    fields = FIELDS + (BOUND_FIELDS if args.bounds else [])
    write_csv(RESULTS / f"{args.name}.csv", rows, fields)
    command = "python experiments/solver_quality.py" + ("" if argv is None and len(sys.argv) == 1 else
                                                         " " + " ".join(sys.argv[1:] if argv is None else argv))
    columns = [("graph", "graph"), ("nodes", "nodes"), ("budget", "budget"), ("variant", "auto"),
               ("time_limit_s", "limit (s)"), ("load_1min", "load (1 min)"), ("seconds", "seconds"),
               ("overhead", "overhead"),
               ("bound", "proven bound"), ("gap_to_bound", "gap to bound"), ("min_budget_pct", "minimum named (% of ckpt-all)"),
               ("status", "status")]
    if args.bounds:
        columns[8:8] = [("memory_bound_moments", "memory bound, moments"),
                        ("memory_bound_inputs", "memory bound, + inputs"),
                        ("memory_bound_integer", "memory bound, in integers"), ("memory_bound_s", "its seconds")]
    (RESULTS / f"{args.name}.md").write_text(
        "# auto on real and long-skip graphs, before and after its repair and refinement passes\n\n"
        f"Command: `{command}`\n\n" + markdown_table(rows, columns) + "\n")
    write_meta(RESULTS / f"{args.name}.meta.json", "solver quality", started=started,
               extra={"load_average_start": load_at_start, "load_average_end": list(os.getloadavg())})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
