"""The file and command contracts of docs/design.md §4-§5, checked from the outside.

Everything here is checked the way a tool that does not trust checkmate would: graphs are written as
JSON (native and networkx node-link), the CLI's stdout is parsed as JSON, and schedules are replayed
by :func:`independent_peak` below, which shares no code with checkmate's simulator.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import networkx as nx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import checkmate
from checkmate.cli import main
from checkmate.solvers import parse_budget

JSON_FIELDS = ["graph", "nodes", "strategy", "solver", "budget_bytes", "feasible", "optimal", "compute_cost",
               "baseline_cost", "overhead", "peak_memory_bytes", "lower_bound", "gap", "solve_seconds", "status"]
BASELINES = ["checkpoint_all", "checkpoint_last_node", "chen_sqrtn", "chen_greedy", "chen_sqrtn_linearized",
             "chen_greedy_linearized", "griewank_logn"]
SOLVER_STRATEGIES = ["checkmate_milp", "checkmate_lp_rounding", "lower_bound_lp"]


# --------------------------------------------------------------------------- independent reference code
def independent_peak(nodes_by_id: dict, fixed_mem: int, plan) -> int:
    """Fixed bytes + every computed, not yet freed value; the peak is read after each compute."""
    resident: set = set()
    current = peak = fixed_mem
    for action, i in plan:
        if action == "compute":
            assert i not in resident, f"computes {i} while it is resident"
            resident.add(i)
            current += nodes_by_id[i]["mem"]
            peak = max(peak, current)
        else:
            assert action == "free", action
            resident.remove(i)
            current -= nodes_by_id[i]["mem"]
    return peak


def free_after_last_use_peak(doc: dict) -> int:
    """Peak of computing each node once in id order, freeing a value right after its last reader
    (outputs never). ``doc`` is a native graph document with topological ids 0..n-1."""
    n = len(doc["nodes"])
    mem = [node["mem"] for node in doc["nodes"]]
    last = list(range(n))
    for u, v in doc["edges"]:
        last[u] = max(last[u], v)
    for node in doc["nodes"]:
        if node.get("output"):
            last[node["id"]] = n
    return doc.get("fixed_mem", 0) + max(sum(mem[i] for i in range(k + 1) if last[i] >= k) for k in range(n))


def trivial_bound(doc: dict) -> int:
    mem = {node["id"]: node["mem"] for node in doc["nodes"]}
    inputs = {i: 0 for i in mem}
    for u, v in doc["edges"]:
        inputs[v] += mem[u]
    return doc.get("fixed_mem", 0) + max(mem[i] + inputs[i] for i in mem)


def check_cells_match_plan(schedule_doc: dict, n: int) -> None:
    """``recompute`` lists exactly the plan's computations, stage by stage (in node order inside a
    stage), and ``retain`` lists exactly the values resident between two stages."""
    cells = sorted(map(tuple, schedule_doc["recompute"]))
    plan = schedule_doc["plan"]
    assert [i for _, i in cells] == [i for action, i in plan if action == "compute"]
    assert sorted({t for t, _ in cells}) == list(range(n)), "every stage computes something"
    held = {}
    for t, i in map(tuple, schedule_doc["retain"]):
        held.setdefault(t, set()).add(i)
    resident: set = set()
    position, stage = 0, -1
    for action, i in plan:
        if action == "compute":
            t = cells[position][0]
            position += 1
            if t != stage:  # the first computation of stage t: what is resident came in from t-1
                assert resident == held.get(t, set()), (t, sorted(resident), sorted(held.get(t, set())))
                stage = t
            resident.add(i)
        else:
            resident.remove(i)
    assert stage == n - 1


def native(nodes, edges, *, name="t", fixed_mem=None, **extra) -> dict:
    doc = {"format": "checkmate-graph/1", "name": name, "nodes": nodes, "edges": edges, **extra}
    if fixed_mem is not None:
        doc["fixed_mem"] = fixed_mem
    return doc


def node(i, cost=1.0, mem=10, **attrs) -> dict:
    return {"id": i, "name": f"n{i}", "cost": cost, "mem": mem, **attrs}


def training_doc(layers=4, fixed_mem=7) -> dict:
    """A chain's forward f0..f{L-1} and backward g{L-1}..g0; sizes differ per layer."""
    nodes, edges = [], []
    for i in range(layers):
        nodes.append(node(i, cost=1.0 + i, mem=100 * (i + 1)))
        if i:
            edges.append([i - 1, i])
    prev = layers - 1
    for j in reversed(range(layers)):
        nid = len(nodes)
        nodes.append(node(nid, cost=2.0, mem=100 * (j + 1), backward=True, output=(j == 0)))
        edges.append([prev, nid])
        if prev != j:
            edges.append([j, nid])
        prev = nid
    return native(nodes, edges, name="train", fixed_mem=fixed_mem)


def write(tmp_path, doc, name="g.json") -> str:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(path)


def cli(capfd, *args):
    """Run the CLI in-process; stdout/stderr are captured at the file-descriptor level, so anything a
    native library prints is seen too."""
    try:
        code = main([str(a) for a in args])
    except SystemExit as exc:  # argparse's usage errors leave through sys.exit
        code = exc.code
    out, err = capfd.readouterr()
    return code, out, err


# --------------------------------------------------------------------------- graph reading
def test_native_variants_read():
    base = [node(0, mem=1024.0), node(1, cost=0, mem=0), node(2, mem=2**40), node(3, mem=5 * 2**33)]
    g = checkmate.graph.graph_from_dict(native(base, [[0, 1], [1, 2], [0, 3], [0, 3]], unknown={"x": 1}))
    assert g.mem.tolist() == [1024, 0, 2**40, 5 * 2**33]
    assert g.fixed_mem == 0 and g.cost.tolist() == [1.0, 0.0, 1.0, 1.0]
    assert g.deps == ((), (0,), (1,), (0,))  # the duplicate edge counts once
    assert checkmate.graph.graph_from_dict(native(base, [], fixed_mem=3.0)).fixed_mem == 3


def test_single_node_disconnected_and_several_sinks():
    one = checkmate.graph.graph_from_dict(native([node(0)], []))
    r = checkmate.solve(one, "100%", strategy="checkpoint_all")
    assert r.compute_cost == 1.0 and r.peak_memory_bytes == 10
    doc = native([node(0), node(1), node(2, mem=5), node(3), node(4, mem=3)], [[0, 1], [2, 3], [0, 4]])
    g = checkmate.graph.graph_from_dict(doc)
    for strategy in BASELINES:
        if strategy == "griewank_logn":
            continue  # needs an articulation-point chain; reported separately
        r = checkmate.solve(g, "100%", strategy=strategy)
        sim = checkmate.simulate(g, r.schedule)
        assert sim.valid and sim.peak_memory_bytes <= r.budget_bytes


@pytest.mark.parametrize("edges_key", [None, "edges", "links"])
def test_networkx_node_link_non_topological_ids(edges_key):
    G = nx.DiGraph(name="nl", fixed_mem=5)
    G.add_node(10, cost_cpu=1.0, cost_ram=100, backward=False, name="a")
    G.add_node(3, cost_cpu=2.0, cost_ram=50, backward=False, name="b")
    G.add_node(7, cost_cpu=3.0, cost_ram=20, backward=True, name="c")
    G.add_edge(7, 3)  # c feeds b although c is listed after it: ids and list order are not topological
    G.add_edge(10, 7)
    data = nx.node_link_data(G) if edges_key is None else nx.node_link_data(G, edges=edges_key)
    if edges_key is None:
        assert "edges" in data  # networkx 3.6's default key
    g = checkmate.graph.graph_from_dict(json.loads(json.dumps(data)))
    assert g.names == ("a", "c", "b") and g.source_ids == (10, 7, 3)
    assert g.deps == ((), (0,), (1,)) and g.fixed_mem == 5 and g.name == "nl"
    assert g.mem.tolist() == [100, 20, 50] and g.backward.tolist() == [False, True, False]


def test_networkx_string_ids_and_schedule_names_file_ids(tmp_path, capfd):
    G = nx.DiGraph()
    for name, mem in [("loss", 4), ("conv", 30), ("input", 8)]:
        G.add_node(name, cost_cpu=1.0, cost_ram=mem)
    G.add_edge("input", "conv")
    G.add_edge("conv", "loss")
    path = write(tmp_path, nx.node_link_data(G))
    g = checkmate.load_graph(path)
    assert g.source_ids == ("input", "conv", "loss") and g.mem.tolist() == [8, 30, 4]
    out_path = tmp_path / "s.json"
    code, out, _ = cli(capfd, "solve", path, "--budget", "100%", "--strategy", "checkpoint_all", "--json",
                       "--out", out_path)
    assert code == 0
    sched = json.loads(out_path.read_text())
    assert sched["node_ids"] == ["input", "conv", "loss"]
    by_file_id = {n["id"]: n for n in json.loads(open(path).read())["nodes"]}
    by_file_id = {k: {"mem": v["cost_ram"]} for k, v in by_file_id.items()}
    plan = [(a, sched["node_ids"][i]) for a, i in sched["plan"]]
    assert independent_peak(by_file_id, 0, plan) == json.loads(out)["peak_memory_bytes"]


BAD_GRAPHS = {
    "cycle": (native([node(0), node(1, name="b1"), node(2)], [[0, 1], [1, 2], [2, 1]]), ["1", "2", "cycle"]),
    "dangling": (native([node(0)], [[0, 5]]), ["5"]),
    "negative mem": (native([node(0), node(4, mem=-1)], []), ["4", "negative"]),
    "negative cost": (native([node(0, cost=-2)], []), ["0", "negative"]),
    "nan cost": (native([node(0), node(1, cost=float("nan"))], []), ["1"]),
    "infinite mem": (native([node(3, mem=float("inf"))], []), ["3"]),
    "fractional mem": (native([node(3, mem=1.5)], []), ["3"]),
    "mem over int64": (native([node(2, mem=2**63)], []), ["2"]),
    "sizes over int64": (native([node(0, mem=2**62), node(1, mem=2**62)], []), ["2**63"]),
    "duplicate ids": (native([node(6), node(6)], []), ["6", "duplicate"]),
    "empty": (native([], []), ["no nodes"]),
    "no nodes key": ({"edges": []}, ["nodes"]),
    "missing mem": (native([{"id": 9, "cost": 1.0}], []), ["9", "mem"]),
    "missing cost": (native([{"id": 9, "mem": 1}], []), ["9", "cost"]),
    "missing id": (native([{"cost": 1.0, "mem": 1}], []), ["id"]),
    "bad edge": (native([node(0), node(1)], [[0, 1, 2]]), ["[0, 1, 2]"]),
    "self loop": (native([node(0)], [[0, 0]]), ["0"]),
    "negative fixed_mem": (native([node(0)], [], fixed_mem=-1), ["fixed_mem"]),
    "bad flag": (native([node(8, output="yes")], []), ["8", "output"]),
    "not an object": ([1, 2], ["object"]),
    "costs overflow": (native([node(0, cost=1e308), node(1, cost=1e308)], []), ["cost"]),
}


@pytest.mark.parametrize("case", sorted(BAD_GRAPHS))
def test_invalid_graphs_name_the_culprit(case, tmp_path, capfd):
    doc, words = BAD_GRAPHS[case]
    with pytest.raises(checkmate.InvalidGraphError) as info:
        checkmate.graph.graph_from_dict(json.loads(json.dumps(doc)))
    for word in words:
        assert word in str(info.value), (word, str(info.value))
    code, out, err = cli(capfd, "solve", write(tmp_path, doc), "--budget", "1GiB", "--strategy", "checkpoint_all")
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("text", ['{"nodes": [', "", "\xff\xfe not json", "[" * 100000, "{\"nodes\": {}}"])
def test_unreadable_files_exit_2_in_one_line(text, tmp_path, capfd):
    path = tmp_path / "g.json"
    path.write_bytes(text.encode("latin-1"))
    code, out, err = cli(capfd, "solve", path, "--budget", "1GiB")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "internal error" not in err


def test_missing_file_and_directory_exit_2(tmp_path, capfd):
    for path in [tmp_path / "absent.json", tmp_path]:
        code, out, err = cli(capfd, "solve", path, "--budget", "1GiB")
        assert code == 2 and len(err.strip().splitlines()) == 1


def test_byte_order_mark_is_accepted(tmp_path):
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(native([node(0)], [])).encode())
    assert checkmate.load_graph(path).n == 1


def test_string_ids_that_spell_integers_match_integer_edges():
    g = checkmate.graph.graph_from_dict(native([node("1"), node(0.0)], [[1, "0"]]))
    assert g.source_ids == (1, 0) and g.deps == ((), (0,))


def test_both_edge_keys_with_edges_is_an_error():
    with pytest.raises(checkmate.InvalidGraphError, match="both"):
        checkmate.graph.graph_from_dict({"nodes": [node(0), node(1)], "edges": [[0, 1]],
                                          "links": [{"source": 1, "target": 0}]})
    g = checkmate.graph.graph_from_dict({"nodes": [node(0), node(1)], "edges": [],
                                         "links": [{"source": 0, "target": 1}]})
    assert g.deps == ((), (0,))


def test_null_name_and_null_cost_fall_back():
    g = checkmate.graph.graph_from_dict({"nodes": [{"id": 0, "name": None, "cost": None, "cost_cpu": 3,
                                                    "mem": None, "cost_ram": 4}], "edges": []})
    assert g.names == ("node0",) and g.cost.tolist() == [3.0] and g.mem.tolist() == [4]


# --------------------------------------------------------------------------- budgets
@pytest.mark.parametrize("text,expected", [
    ("2GiB", 2 * 2**30), ("1.5GB", 1_500_000_000), ("2.01GB", 2_010_000_000), ("4.35GB", 4_350_000_000),
    ("512MiB", 512 * 2**20), ("1407", 1407), (1407, 1407), ("1e3", 1000), (" 2 GiB ", 2 * 2**30),
])
def test_budget_strings_are_exact(text, expected):
    assert parse_budget(text) == expected


def test_percent_budget_is_exact_for_large_peaks():
    big = 2**53 + 12345
    g = checkmate.graph.graph_from_dict(native([node(0, mem=big)], []))
    assert parse_budget("11%", g) == big * 11 // 100
    assert parse_budget("60%", g) == big * 60 // 100


@pytest.mark.parametrize("budget", ["abc", "-5", "0", "1,000", "5 parsecs", "60%%"])
def test_bad_budgets_exit_2(budget, tmp_path, capfd):
    code, out, err = cli(capfd, "solve", write(tmp_path, training_doc()), "--budget", budget,
                         "--strategy", "checkpoint_all")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1


# --------------------------------------------------------------------------- solve --json / --out
def _check_solve_json(doc, out, strategy, sched_path):
    lines = out.strip().splitlines()
    assert len(lines) == 1, out
    row = json.loads(lines[0])
    assert set(JSON_FIELDS) <= set(row)
    assert row["strategy"] == strategy and row["nodes"] == len(doc["nodes"]) and row["graph"] == doc["name"]
    assert row["feasible"] is True and row["status"]
    assert math.isclose(row["baseline_cost"], sum(n["cost"] for n in doc["nodes"]))
    if row["compute_cost"] is None:
        assert strategy == "lower_bound_lp" and row["lower_bound"] is not None
        return row
    assert math.isclose(row["overhead"], row["compute_cost"] / row["baseline_cost"])
    assert row["peak_memory_bytes"] <= row["budget_bytes"]
    sched = json.loads(sched_path.read_text())
    assert sched["format"] == "checkmate-schedule/1" and sched["graph"] == doc["name"]
    assert sched["strategy"] == strategy and sched["budget_bytes"] == row["budget_bytes"]
    by_id = {n["id"]: n for n in doc["nodes"]}
    assert independent_peak(by_id, doc.get("fixed_mem", 0), sched["plan"]) == row["peak_memory_bytes"]
    cost = sum(by_id[i]["cost"] for a, i in sched["plan"] if a == "compute")
    assert math.isclose(cost, row["compute_cost"])
    check_cells_match_plan(sched, len(doc["nodes"]))
    if row["lower_bound"] is not None:
        assert row["lower_bound"] <= row["compute_cost"] + 1e-6
    return row


@pytest.mark.parametrize("strategy", BASELINES)
@pytest.mark.parametrize("budget", ["100%", "2GiB"])
def test_solve_json_and_schedule_replay_baselines(strategy, budget, tmp_path, capfd):
    doc = training_doc()
    sched_path = tmp_path / "s.json"
    code, out, err = cli(capfd, "solve", write(tmp_path, doc), "--budget", budget, "--strategy", strategy,
                         "--json", "--out", sched_path)
    assert code == 0, err
    row = _check_solve_json(doc, out, strategy, sched_path)
    assert row["budget_bytes"] == (parse_budget("2GiB") if budget == "2GiB" else free_after_last_use_peak(doc))


@pytest.mark.parametrize("strategy", SOLVER_STRATEGIES)
def test_solve_json_solver_strategies_keep_stdout_clean(strategy, tmp_path, capfd):
    doc = training_doc(3)
    sched_path = tmp_path / "s.json"
    code, out, err = cli(capfd, "solve", write(tmp_path, doc), "--budget", "80%", "--strategy", strategy,
                         "--json", "--out", sched_path, "--time-limit", "20")
    assert code == 0, err
    row = _check_solve_json(doc, out, strategy, sched_path)
    assert row["optimal"] in (True, False) and row["solver"]


@pytest.mark.parametrize("strategy", BASELINES + SOLVER_STRATEGIES)
def test_infeasible_budget_exit_3_names_minimum(strategy, tmp_path, capfd):
    doc = training_doc(3)
    path = write(tmp_path, doc)
    code, out, err = cli(capfd, "solve", path, "--budget", trivial_bound(doc) - 1, "--strategy", strategy,
                         "--time-limit", "20")
    assert code == 3 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "minimum feasible budget" in lines[0]
    minimum = int(re.search(r"minimum feasible budget\D*(\d+)", lines[0]).group(1))
    code, out, err = cli(capfd, "solve", path, "--budget", minimum, "--strategy", strategy, "--time-limit", "20")
    assert code == 0, err


@pytest.mark.parametrize("args", [["--strategy", "no_such_strategy"],
                                  ["--strategy", "checkpoint_all", "--solver", "no_such_solver"],
                                  ["--strategy", "checkmate_milp", "--solver", "no_such_solver"],
                                  ["--strategy", "checkpoint_all", "--time-limit", "-1"]])
def test_unknown_names_exit_2(args, tmp_path, capfd):
    code, out, err = cli(capfd, "solve", write(tmp_path, training_doc()), "--budget", "100%", *args)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1


def test_unavailable_solver_exits_4(tmp_path, capfd):
    from checkmate.solvers.backends.cvxpy_backend import CVXPY_MILP_SOLVERS

    import cvxpy

    missing = sorted(set(CVXPY_MILP_SOLVERS) - set(cvxpy.installed_solvers()))
    if not missing:
        pytest.skip("every cvxpy MILP solver is installed here")
    code, out, err = cli(capfd, "solve", write(tmp_path, training_doc(3)), "--budget", "80%",
                         "--strategy", "checkmate_milp", "--solver", missing[0], "--time-limit", "5")
    assert code == 4 and out == "" and len(err.strip().splitlines()) == 1


def test_strategies_command_lists_the_stable_names(capfd):
    code, out, _ = cli(capfd, "strategies", "--json")
    assert code == 0
    names = [row["name"] for row in json.loads(out)]
    assert set(BASELINES + SOLVER_STRATEGIES) <= set(names)


def test_real_entry_point_json_is_one_line(tmp_path):
    path = write(tmp_path, training_doc(3))
    exe = [sys.executable, "-m", "checkmate"]
    proc = subprocess.run(exe + ["solve", path, "--budget", "90%", "--strategy", "checkmate_milp", "--json",
                                 "--time-limit", "20"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.strip().splitlines()) == 1 and set(JSON_FIELDS) <= set(json.loads(proc.stdout))
    proc = subprocess.run(exe + ["solve", path, "--budget", "1", "--strategy", "checkpoint_all"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3 and len(proc.stderr.strip().splitlines()) == 1


# --------------------------------------------------------------------------- Python API
def test_import_does_not_load_tensorflow_or_solvers():
    code = ("import sys, checkmate; g = checkmate.Graph([checkmate.Node(0, 'a', 1.0, 8)], []); "
            "checkmate.solve(g, '100%', strategy='checkpoint_all'); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('tensorflow', 'keras', 'cvxpy', 'highspy', 'gurobipy', 'matplotlib')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_solve_result_fields_and_simulate():
    g = checkmate.graph.graph_from_dict(training_doc())
    r = checkmate.solve(g, budget="75%", strategy="checkpoint_last_node", solver=None, time_limit_s=5)
    for field in ("schedule", "compute_cost", "peak_memory_bytes", "lower_bound", "optimal", "solve_seconds"):
        assert hasattr(r, field)
    sim = checkmate.simulate(g, r.schedule)
    assert sim.peak_memory_bytes == r.peak_memory_bytes and sim.compute_cost == r.compute_cost
    assert r.peak_memory_bytes <= parse_budget("75%", g)


@pytest.mark.parametrize("strategy", BASELINES)
def test_infeasible_error_carries_a_budget_that_works(strategy):
    g = checkmate.graph.graph_from_dict(training_doc())
    b = checkmate.GraphBuilder("outputs")
    src = b.add_node("src", 1.0, 10)
    for k in range(4):
        b.add_node(f"out{k}", 1.0, 10, [src], output=True)
    for graph in (g, b.build()):
        try:
            checkmate.solve(graph, trivial_bound(graph.to_dict()) + 1, strategy=strategy)
            continue
        except checkmate.InfeasibleBudgetError as exc:
            minimum = exc.min_feasible_budget_bytes
        except checkmate.InvalidArgumentError:
            assert strategy == "griewank_logn"  # not applicable without an articulation chain
            continue
        assert isinstance(minimum, int)
        r = checkmate.solve(graph, minimum, strategy=strategy)
        assert r.peak_memory_bytes <= minimum


def test_unknown_solver_name_rejected_for_every_strategy():
    g = checkmate.graph.graph_from_dict(training_doc())
    with pytest.raises(checkmate.InvalidArgumentError):
        checkmate.solve(g, "100%", strategy="checkpoint_all", solver="no_such_solver")


def test_schedule_file_roundtrip_keeps_node_ids(tmp_path):
    doc = native([node(5), node(2)], [[5, 2]])
    g = checkmate.graph.graph_from_dict(doc)
    r = checkmate.solve(g, "100%", strategy="checkpoint_all")
    checkmate.save_schedule(r.schedule, tmp_path / "s.json")
    back = checkmate.load_schedule(tmp_path / "s.json", g)
    assert back == r.schedule and back.node_ids == (5, 2) and back.budget_bytes == r.budget_bytes
    bad = json.loads((tmp_path / "s.json").read_text())
    bad["budget_bytes"] = "lots"
    with pytest.raises(checkmate.InvalidScheduleError):
        checkmate.schedule.Schedule.from_dict(bad, g)


# --------------------------------------------------------------------------- memory model properties
@st.composite
def graph_docs(draw, max_nodes=9):
    n = draw(st.integers(1, max_nodes))
    nodes, edges = [], []
    for k in range(n):
        nodes.append(node(k, cost=draw(st.sampled_from([0.0, 1.0, 2.5, 7.0])),
                          mem=draw(st.sampled_from([0, 1, 8, 100, 2**33])),
                          backward=k >= n // 2, output=draw(st.booleans()) and draw(st.booleans())))
        for d in range(k):
            if draw(st.integers(0, 9)) < (6 if d == k - 1 else 2):
                edges.append([d, k])
    return native(nodes, edges, name="h", fixed_mem=draw(st.sampled_from([0, 5])))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph_docs())
def test_memory_model_properties(doc):
    g = checkmate.graph.graph_from_dict(doc)
    by_id = {n["id"]: n for n in doc["nodes"]}
    lower = trivial_bound(doc)
    ca = checkmate.solve(g, 10**18, strategy="checkpoint_all")
    assert ca.compute_cost == pytest.approx(sum(n["cost"] for n in doc["nodes"]))
    assert ca.peak_memory_bytes == free_after_last_use_peak(doc)
    for strategy in BASELINES:
        for budget in (10**18, "70%"):
            try:
                r = checkmate.solve(g, budget, strategy=strategy)
            except checkmate.InfeasibleBudgetError as exc:
                assert exc.min_feasible_budget_bytes >= lower
                continue
            except checkmate.InvalidArgumentError:
                assert strategy == "griewank_logn"
                continue
            sim = checkmate.simulate(g, r.schedule)
            assert sim.valid, sim.violations
            plan = [list(step) for step in r.schedule.plan]
            assert independent_peak(by_id, doc["fixed_mem"], plan) == r.peak_memory_bytes
            assert r.peak_memory_bytes >= lower
            assert r.compute_cost >= ca.compute_cost - 1e-9
            check_cells_match_plan(r.schedule.to_dict(), g.n)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph_docs(max_nodes=6))
def test_solver_strategies_on_random_graphs(doc):
    g = checkmate.graph.graph_from_dict(doc)
    by_id = {n["id"]: n for n in doc["nodes"]}
    for budget in ("100%", "70%"):
        costs = {}
        for strategy in BASELINES + SOLVER_STRATEGIES:
            try:
                r = checkmate.solve(g, budget, strategy=strategy, time_limit_s=10)
            except (checkmate.InfeasibleBudgetError, checkmate.InvalidArgumentError):
                continue
            costs[strategy] = r
            if r.schedule is not None:
                assert independent_peak(by_id, doc["fixed_mem"], [list(s) for s in r.schedule.plan]) \
                    == r.peak_memory_bytes <= r.budget_bytes
        milp = costs.get("checkmate_milp")
        if milp is not None and milp.optimal:
            for strategy, r in costs.items():
                if r.compute_cost is not None:
                    assert milp.compute_cost <= r.compute_cost + 1e-6, strategy
        if milp is not None and "lower_bound_lp" in costs:
            assert costs["lower_bound_lp"].lower_bound <= milp.compute_cost + 1e-6


def test_one_byte_short_of_a_large_minimum_is_infeasible_not_a_solver_failure():
    doc = native([node(0, mem=7), node(1, cost=2.0, mem=2**40, output=True), node(2, mem=0), node(3, mem=1)],
                 [[1, 2]])
    g = checkmate.graph.graph_from_dict(doc)
    with pytest.raises(checkmate.InfeasibleBudgetError) as info:
        checkmate.solve(g, 2**40, strategy="checkmate_milp", time_limit_s=10)
    assert info.value.min_feasible_budget_bytes == 2**40 + 1
