"""Budget sweeps: the grid, the rows, the CSV/PNG files, the CLI, the executors, and the consistency
the paper's figure relies on (the MILP at most every baseline, never worse with more memory)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from cases import assert_valid_schedule, training_chain, trivial_memory_lower_bound, unet_like
from checkmate import synthetic
from checkmate.analysis.max_batch import BatchGraphFamily, cost_limit, forward_cost, max_batch_size
from checkmate.analysis.sweep import (
    CSV_COLUMNS,
    SweepRow,
    available_strategies,
    budget_grid,
    check_consistency,
    read_sweep_csv,
    sweep,
    write_sweep,
)
from checkmate.bounds import largest_working_set_bytes
from checkmate.cli import main
from checkmate.graph import save_graph
from checkmate.solvers import checkpoint_all_peak, solve

AVAILABLE = set(available_strategies())
BASELINES = [s for s in ("checkpoint_all", "chen_sqrtn", "chen_greedy", "griewank_logn", "checkpoint_last_node")
             if s in AVAILABLE]
needs_milp = pytest.mark.skipif("checkmate_milp" not in AVAILABLE, reason="checkmate.solvers.milp not available")
# Exact optimum for the consistency checks: the default 0.5% relative gap could let a baseline win by a hair.
TIGHT_GAP = 1e-7


def test_budget_grid_endpoints_and_order():
    grid = budget_grid(100, 1000, 10)
    assert grid[0] == 100 and grid[-1] == 1000 and len(grid) == 10
    assert grid == sorted(set(grid))
    assert budget_grid(100, 103, 10) == [100, 101, 102, 103]
    assert budget_grid(500, 500, 5) == [500]
    assert budget_grid(10, 20, 1) == [20]


def test_working_set_bound_matches_the_test_helper():
    for g in (training_chain(5), unet_like(3), synthetic.resnet(3)):
        assert largest_working_set_bytes(g) == trivial_memory_lower_bound(g)


def test_sweep_rows_cover_grid_and_fit_their_budgets():
    g = unet_like(3)
    result = sweep(g, BASELINES, budgets=6, executor="serial")
    assert result.budgets[-1] == checkpoint_all_peak(g)
    assert result.budgets[0] >= trivial_memory_lower_bound(g)
    assert len(result.rows) == len(BASELINES) * len(result.budgets)
    for row in result.rows:
        assert row.strategy in BASELINES and row.budget_bytes in result.budgets
        if row.feasible:
            assert row.peak_memory_bytes <= row.budget_bytes
            assert row.overhead == pytest.approx(row.compute_cost / g.total_cost)
        else:
            assert row.compute_cost is None and row.min_feasible_budget_bytes > row.budget_bytes
    ca = result.rows_for("checkpoint_all")
    assert [r.feasible for r in ca] == [False] * (len(ca) - 1) + [True]
    assert ca[-1].overhead == pytest.approx(1.0)
    # The grid starts where the first strategy fits.
    assert any(r.feasible for r in result.rows if r.budget_bytes == result.budgets[0])


def test_explicit_budget_list():
    g = training_chain(6)
    peak = checkpoint_all_peak(g)
    result = sweep(g, ["checkpoint_all"], budgets=[peak, peak - 1, peak + 5], executor="serial")
    assert result.budgets == [peak - 1, peak, peak + 5]
    assert [r.feasible for r in result.rows_for("checkpoint_all")] == [False, True, True]


def test_process_executor_matches_serial():
    g = synthetic.random_forward(14, seed=3)
    names = BASELINES + (["checkmate_lp_rounding"] if "checkmate_lp_rounding" in AVAILABLE else [])
    serial = sweep(g, names, budgets=5, executor="serial")
    parallel = sweep(g, names, budgets=5, executor="process", workers=2)
    assert serial.budgets == parallel.budgets
    key = lambda r: (r.strategy, r.budget_bytes, r.feasible, r.compute_cost, r.peak_memory_bytes)  # noqa: E731
    assert sorted(map(key, serial.rows)) == sorted(map(key, parallel.rows))


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is not installed (pip install 'checkmate[ray]')")
def test_ray_executor_matches_serial():
    g = training_chain(8)
    serial = sweep(g, BASELINES, budgets=4, executor="serial")
    remote = sweep(g, BASELINES, budgets=4, executor="ray", workers=2)
    key = lambda r: (r.strategy, r.budget_bytes, r.feasible, r.compute_cost)  # noqa: E731
    assert sorted(map(key, serial.rows)) == sorted(map(key, remote.rows))


def test_files_round_trip(tmp_path):
    g = unet_like(3)
    result = sweep(g, BASELINES, budgets=4, executor="serial")
    paths = write_sweep(result, tmp_path / "out", title="unet")
    header = paths["csv"].read_text().splitlines()[0].split(",")
    assert tuple(header) == CSV_COLUMNS
    for column in ("strategy", "budget_bytes", "feasible", "compute_cost", "overhead", "peak_memory_bytes",
                   "lower_bound", "gap", "solve_seconds"):
        assert column in header
    assert read_sweep_csv(paths["csv"]) == result.rows
    data = paths["png"].read_bytes()
    assert data[:4] == b"\x89PNG" and len(data) > 10_000


def test_check_consistency_flags_a_violation():
    def row(strategy, budget, cost, optimal=True):
        return SweepRow("g", strategy, budget, True, cost, 10.0, cost / 10, budget, None, None, None, 0.0, optimal,
                        "ok")

    good = [row("checkmate_milp", 1, 12.0), row("checkmate_milp", 2, 11.0), row("chen_sqrtn", 1, 13.0)]
    assert check_consistency(good) == []
    worse_than_baseline = good + [row("chen_greedy", 2, 10.5)]
    assert any("more than chen_greedy" in p for p in check_consistency(worse_than_baseline))
    rising = [row("checkmate_milp", 1, 11.0), row("checkmate_milp", 2, 12.0)]
    assert any("rises" in p for p in check_consistency(rising))


@needs_milp
@pytest.mark.parametrize("make_graph", [
    pytest.param(lambda: training_chain(8), id="chain8"),
    pytest.param(lambda: unet_like(3), id="unet3"),
    pytest.param(lambda: synthetic.resnet(1, mem=4, cost=1.0), id="resnet1"),
    # Its tightest budget alone takes the MILP about a minute to prove optimal.
    pytest.param(lambda: synthetic.resnet(2, mem=4, cost=1.0), id="resnet2", marks=pytest.mark.slow),
])
def test_milp_sweep_is_consistent(make_graph):
    g = make_graph()
    names = BASELINES + [s for s in ("checkmate_lp_rounding", "checkmate_milp", "lower_bound_lp") if s in AVAILABLE]
    result = sweep(g, names, budgets=6, executor="process", workers=2, mip_gap=TIGHT_GAP)
    assert check_consistency(result.rows) == []
    milp = result.rows_for("checkmate_milp")
    assert all(r.feasible and r.optimal for r in milp), [(r.budget_bytes, r.status) for r in milp]
    by_budget = {}
    for r in result.rows:
        if r.feasible and r.compute_cost is not None:
            by_budget.setdefault(r.budget_bytes, []).append(r)
    for m in milp:
        for other in by_budget[m.budget_bytes]:
            assert m.compute_cost <= other.compute_cost * (1 + 1e-9), (other.strategy, m.budget_bytes)
    overheads = [r.overhead for r in milp]
    assert all(b <= a * (1 + 1e-9) for a, b in zip(overheads, overheads[1:])), overheads
    assert milp[-1].overhead == pytest.approx(1.0)
    # The MILP fits at the grid's smallest budget, which is where the first strategy fits.
    assert milp[0].budget_bytes == result.budgets[0]
    # Every reported schedule is valid when re-solved independently.
    r = solve(g, milp[0].budget_bytes, strategy="checkmate_milp", mip_gap=TIGHT_GAP)
    assert_valid_schedule(g, r.schedule, milp[0].budget_bytes)
    if "lower_bound_lp" in AVAILABLE:
        for row in result.rows_for("lower_bound_lp"):
            milp_row = next(m for m in milp if m.budget_bytes == row.budget_bytes)
            own_lp = row.lower_bound
            assert own_lp is not None and own_lp <= milp_row.compute_cost * (1 + 1e-6)


# ------------------------------------------------------------------------------------ CLI
def test_cli_sweep(tmp_path, capsys):
    g = unet_like(3)
    save_graph(g, tmp_path / "g.json")
    out = tmp_path / "sweep"
    code = main(["sweep", str(tmp_path / "g.json"), "--out", str(out), "--budgets", "4", "--strategies",
                 ",".join(BASELINES), "--executor", "serial"])
    assert code == 0, capsys.readouterr().err
    for name in ("sweep.csv", "sweep.png", "sweep.json"):
        assert (out / name).stat().st_size > 0
    rows = read_sweep_csv(out / "sweep.csv")
    budgets = json.loads((out / "sweep.json").read_text())["budgets"]
    assert 1 <= len(budgets) <= 4 and len(rows) == len(budgets) * len(BASELINES)
    assert "checkpoint_all" in capsys.readouterr().out


@pytest.mark.parametrize("argv, fragment", [
    (["--strategies", "nope"], "unknown strategy"),
    (["--model", "vgg16"], "either GRAPH.json or --model"),
    (["--batch-size", "4"], "--batch-size applies to --model only"),
])
def test_cli_sweep_bad_input(tmp_path, capsys, argv, fragment):
    save_graph(training_chain(3), tmp_path / "g.json")
    code = main(["sweep", str(tmp_path / "g.json"), "--out", str(tmp_path / "o"), "--executor", "serial"] + argv)
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and "\n" not in err


def test_cli_sweep_needs_a_graph(tmp_path, capsys):
    assert main(["sweep", "--out", str(tmp_path / "o")]) == 2
    assert main(["sweep", "--model", "vgg16", "--out", str(tmp_path / "o")]) == 2
    assert "--batch-size" in capsys.readouterr().err


# ------------------------------------------------------------------------------------ max batch (no TF)
def _family(batch: int):
    # Activations grow with the batch; 3 MiB of weights do not.
    g = synthetic.unet(3, base_mem=batch << 20)
    return type(g)(g.nodes, g.edges, name=f"unet-b{batch}", fixed_mem=3 << 20)


def test_affine_family_is_exact_for_batch_linear_sizes():
    fam = BatchGraphFamily(_family(1), 1, _family(4), 4, name="unet")
    for b in (2, 3, 7, 33):
        assert list(fam(b).mem) == list(_family(b).mem)
        assert fam(b).fixed_mem == 3 << 20


def test_max_batch_search_finds_the_boundary():
    limit = 1 << 30
    res = max_batch_size(_family, limit, "checkpoint_all")
    b = res.max_batch_size
    assert b > 1
    assert checkpoint_all_peak(_family(b)) <= limit < checkpoint_all_peak(_family(b + 1))
    assert max_batch_size(_family, 1 << 20, "checkpoint_all").max_batch_size == 0


def test_cost_limit_is_one_extra_forward_pass():
    g = training_chain(5)
    assert cost_limit(g) == pytest.approx(g.total_cost + forward_cost(g))
    assert forward_cost(g) == pytest.approx(5.0)


def _small_family(batch: int):
    g = synthetic.unet(2, convs_per_level=1, base_mem=batch << 20)
    return type(g)(g.nodes, g.edges, name=f"unet2-b{batch}", fixed_mem=3 << 20)


@needs_milp
def test_max_batch_milp_beats_checkpoint_all_on_synthetic_unet():
    limit = 64 << 20
    ca = max_batch_size(_small_family, limit, "checkpoint_all")
    milp = max_batch_size(_small_family, limit, "checkmate_milp", start_batch=ca.max_batch_size, mip_gap=0.01,
                          time_limit_s=60)
    assert milp.max_batch_size > ca.max_batch_size
    final = next(p for p in milp.probes if p.batch_size == milp.max_batch_size)
    assert final.fits and final.compute_cost <= final.cost_limit * (1 + 1e-9)


@needs_milp
@pytest.mark.slow
def test_approximation_experiment_quick(tmp_path):
    import csv
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, str(repo / "experiments" / "approximation.py"), "--quick", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=1800, cwd=repo)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = list(csv.DictReader(open(tmp_path / "approximation.csv")))
    assert {r["kind"] for r in rows} >= {"chain", "synthetic"}
    for r in rows:
        if r["milp_optimal"] == "True" and r["integrality_gap"]:
            assert float(r["integrality_gap"]) >= 1 - 1e-6  # the LP bounds the MILP from below
        if r["rounding_ratio"]:
            assert float(r["rounding_ratio"]) >= 1 - 1e-3  # rounding never beats the (near-)optimum
    assert (tmp_path / "approximation.png").stat().st_size > 10_000
    assert "## c. Integrality gap" in (tmp_path / "README.md").read_text()


def test_sweep_json_round_trip(tmp_path):
    from checkmate.analysis.sweep import load_sweep_json

    result = sweep(unet_like(3), BASELINES, budgets=3, executor="serial")
    paths = write_sweep(result, tmp_path, plot=False)
    back = load_sweep_json(paths["json"])
    assert back.rows == result.rows and back.budgets == result.budgets
    assert back.min_feasible_budget_bytes == result.min_feasible_budget_bytes
