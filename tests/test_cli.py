import json
import subprocess
import sys

import pytest

from cases import training_chain, unet_like
from checkmate import load_schedule, replay_plan, save_graph, simulate
from checkmate.cli import main
from checkmate.solvers import checkpoint_all_peak

JSON_FIELDS = {"graph", "nodes", "strategy", "solver", "budget_bytes", "feasible", "optimal", "compute_cost",
               "baseline_cost", "overhead", "peak_memory_bytes", "lower_bound", "gap", "solve_seconds", "status"}


@pytest.fixture
def graph_file(tmp_path):
    g = unet_like()
    path = tmp_path / "g.json"
    save_graph(g, path)
    return g, path


def run_cli(*args):
    proc = subprocess.run([sys.executable, "-m", "checkmate", *map(str, args)], capture_output=True, text=True,
                          timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def test_strategies_lists_every_name(capsys):
    assert main(["strategies"]) == 0
    out = capsys.readouterr().out
    for name in ["checkpoint_all", "checkpoint_last_node", "chen_sqrtn", "chen_greedy", "chen_sqrtn_linearized",
                 "chen_greedy_linearized", "griewank_logn", "checkmate_milp", "checkmate_lp_rounding", "lower_bound_lp"]:
        assert name in out


def test_solve_json_and_out(graph_file, tmp_path, capsys):
    g, path = graph_file
    out_path = tmp_path / "sched.json"
    assert main(["solve", str(path), "--budget", "100%", "--strategy", "checkpoint_all", "--json",
                 "--out", str(out_path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert JSON_FIELDS <= set(doc)
    assert doc["feasible"] is True and doc["nodes"] == g.n and doc["strategy"] == "checkpoint_all"
    assert doc["compute_cost"] == pytest.approx(g.total_cost) and doc["overhead"] == pytest.approx(1.0)
    assert doc["peak_memory_bytes"] == checkpoint_all_peak(g) and doc["budget_bytes"] == checkpoint_all_peak(g)
    schedule = load_schedule(out_path, g)
    assert replay_plan(g, schedule.plan).peak_memory_bytes == doc["peak_memory_bytes"]


def test_solve_human_output(graph_file, capsys):
    _, path = graph_file
    assert main(["solve", str(path), "--budget", "10GiB", "--strategy", "checkpoint_all"]) == 0
    out = capsys.readouterr().out
    assert "compute cost" in out and "peak memory" in out


def test_exit_codes_and_one_line_errors(graph_file, tmp_path):
    g, path = graph_file
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "checkmate-graph/1", "nodes": [{"id": 0, "cost": 1, "mem": 1}], "edges": [[0, 5]]')
    code, out, err = run_cli("solve", bad, "--budget", "1GiB")
    assert code == 2 and err.count("\n") == 1 and "malformed JSON" in err and "Traceback" not in err
    bad.write_text('{"format": "checkmate-graph/1", "nodes": [{"id": 0, "cost": 1, "mem": 1}], "edges": [[0, 5]]}')
    code, out, err = run_cli("solve", bad, "--budget", "1GiB")
    assert code == 2 and err.count("\n") == 1 and "node 5" in err
    code, out, err = run_cli("solve", path, "--budget", "10%", "--strategy", "checkpoint_all")
    assert code == 3 and err.count("\n") == 1 and "minimum feasible budget" in err
    assert str(checkpoint_all_peak(g)) in err
    code, out, err = run_cli("solve", path, "--budget", "lots")
    assert code == 2 and err.count("\n") == 1
    code, out, err = run_cli("solve", path, "--budget", "50%", "--strategy", "nope")
    assert code == 2 and "unknown strategy" in err
    code, out, err = run_cli("solve", tmp_path / "missing.json", "--budget", "50%")
    assert code == 2 and err.count("\n") == 1
    code, out, err = run_cli("solve", path)
    assert code == 2 and "--budget" in err


def test_infeasible_json_names_minimum(graph_file, capsys):
    g, path = graph_file
    assert main(["solve", str(path), "--budget", "10%", "--strategy", "checkpoint_all", "--json"]) == 3
    doc = json.loads(capsys.readouterr().out)
    assert doc["feasible"] is False and doc["min_feasible_budget_bytes"] == checkpoint_all_peak(g)


def test_mip_gap_flag(graph_file, capsys):
    """--mip-gap reaches the solver; the default is exact on integral costs; a bad gap is a usage error."""
    _, path = graph_file
    assert main(["solve", str(path), "--budget", "70%", "--strategy", "checkmate_milp", "--json"]) == 0
    exact = json.loads(capsys.readouterr().out)
    assert exact["optimal"] is True and exact["status"].startswith("optimal")
    assert exact["lower_bound"] == exact["compute_cost"]
    assert main(["solve", str(path), "--budget", "70%", "--strategy", "checkmate_milp", "--mip-gap", "50%",
                 "--json"]) == 0
    loose = json.loads(capsys.readouterr().out)
    assert loose["optimal"] == loose["status"].startswith("optimal")
    assert loose["optimal"] or "within" in loose["status"]
    with pytest.raises(SystemExit) as err:
        main(["solve", str(path), "--budget", "70%", "--mip-gap", "2"])
    assert err.value.code == 2
