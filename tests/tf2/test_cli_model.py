"""`checkmate sweep --model` end to end: extraction, the budget grid, CSV and plot."""

import csv
import subprocess
import sys

import pytest

pytestmark = pytest.mark.tf


def test_sweep_from_a_zoo_model(tmp_path):
    out = tmp_path / "sweep"
    proc = subprocess.run([sys.executable, "-m", "checkmate", "sweep", "--model", "mlp", "--batch-size", "256",
                           "--out", str(out), "--strategies", "checkpoint_all,chen_greedy", "--budgets", "3",
                           "--executor", "serial"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader(open(out / "sweep.csv")))
    assert {r["strategy"] for r in rows} == {"checkpoint_all", "chen_greedy"}
    feasible = [r for r in rows if r["strategy"] == "chen_greedy" and r["feasible"].lower() == "true"]
    assert feasible, rows
    assert (out / "sweep.png").stat().st_size > 10_000


def test_sweep_needs_a_graph_or_a_model(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "checkmate", "sweep", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1


def test_compile_exits_3_when_no_strategy_fits():
    proc = subprocess.run([sys.executable, "-m", "checkmate", "compile", "--model", "mlp", "--batch-size", "8",
                           "--budget", "1KiB", "--strategy", "checkpoint_all,chen_sqrtn"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3, proc.stderr
    assert "minimum feasible budget" in proc.stderr and "does not fit" in proc.stdout
