"""Max-batch search on real (lowered) zoo models: graph families, the MILP's advantage, the CLI,
the measured confirmation, and the quick settings of the TF experiments."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorflow")

from checkmate.analysis.max_batch import BatchGraphFamily, cost_limit, search_model  # noqa: E402
from checkmate.analysis.models import extract_graph, measure_compiled_step  # noqa: E402
from checkmate.cli import main  # noqa: E402
from checkmate.solvers import checkpoint_all_peak  # noqa: E402

pytestmark = pytest.mark.tf

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("model, shape", [("residual_cnn", (16, 16, 3)), ("unet", (32, 32, 3))])
def test_affine_family_matches_fresh_extractions(model, shape):
    """Bytes are affine in the batch size, so two extractions predict every other one exactly."""
    g1, g2 = extract_graph(model, 1, input_shape=shape), extract_graph(model, 2, input_shape=shape)
    family = BatchGraphFamily(g1, 1, g2, 2, name=model)
    for b in (3, 5):
        real = extract_graph(model, b, input_shape=shape)
        predicted = family(b)
        assert np.array_equal(predicted.mem, real.mem)
        assert predicted.fixed_mem == real.fixed_mem
        assert predicted.edges == real.edges
        # FLOP costs are (nearly) linear in the batch size too: the interpolation is a close fit.
        assert np.allclose(predicted.cost, real.cost, rtol=1e-3)


def test_milp_fits_a_larger_batch_than_checkpoint_all_on_unet():
    """The paper's max-batch setting on U-Net: the MILP trains a larger batch in the same memory."""
    shape = (32, 32, 3)
    # parameters, batch and gradients (the compact graph's fixed_mem) at batch 1, plus 8 MiB
    limit = extract_graph("unet", 1, input_shape=shape).fixed_mem + (8 << 20)
    results = {r.strategy: r for r in search_model("unet", limit, ["checkpoint_all", "checkmate_milp"],
                                                   input_shape=shape, time_limit_s=10, confirm=False,
                                                   mip_gap=0.05)}
    ca, milp = results["checkpoint_all"], results["checkmate_milp"]
    assert ca.max_batch_size >= 1
    assert milp.max_batch_size > ca.max_batch_size
    # Final sizes are re-solved on freshly extracted graphs and meet both limits there.
    g = extract_graph("unet", milp.max_batch_size, input_shape=shape)
    assert milp.final.fits and milp.final.peak_memory_bytes <= limit
    assert milp.final.compute_cost <= cost_limit(g) * (1 + 1e-9)
    assert checkpoint_all_peak(extract_graph("unet", ca.max_batch_size + 1, input_shape=shape)) > limit


def test_confirmation_runs_the_compiled_step():
    # Large enough that the allocator tracks it: CPU statistics miss small allocations.
    m = measure_compiled_step("residual_cnn", 64, 640 << 20, "chen_sqrtn", input_shape=(32, 32, 3))
    assert m["status"] == "measured"
    assert m["measured_step_peak_bytes"] > 0 and m["predicted_step_peak_bytes"] > 0
    assert m["peak_memory_bytes"] == m["measured_step_peak_bytes"] + m["resident_bytes"]
    # The measured step follows the schedule's prediction (allocator slack and kernel temporaries aside).
    assert 0.5 * m["predicted_step_peak_bytes"] <= m["measured_step_peak_bytes"] <= 2 * m["predicted_step_peak_bytes"]


def test_cli_max_batch_json(capsys):
    code = main(["max-batch", "--model", "residual_cnn", "--input-shape", "16,16,3", "--memory", "3MiB",
                 "--strategies", "checkpoint_all,chen_sqrtn", "--json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    by = {d["strategy"]: d for d in data}
    assert set(by) == {"checkpoint_all", "chen_sqrtn"}
    assert by["chen_sqrtn"]["max_batch_size"] >= by["checkpoint_all"]["max_batch_size"] >= 1
    assert by["checkpoint_all"]["final"]["peak_memory_bytes"] <= 3 << 20


@pytest.mark.parametrize("argv", [["--memory", "50%"], ["--memory", "lots"], ["--strategies", "nope"]])
def test_cli_max_batch_bad_input(capsys, argv):
    base = ["max-batch", "--model", "residual_cnn", "--memory", "3MiB"]
    assert main(base + argv) == 2
    assert "\n" not in capsys.readouterr().err.strip()


def test_cli_max_batch_unknown_model(capsys):
    assert main(["max-batch", "--model", "nonexistent", "--memory", "1GiB"]) == 2
    assert "unknown model" in capsys.readouterr().err


def _run_experiment(script: str, out: Path, *extra: str, timeout: int = 1800):
    proc = subprocess.run([sys.executable, str(REPO / "experiments" / script), "--quick", "--out", str(out), *extra],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _assert_png(path: Path):
    data = path.read_bytes()
    assert data[:4] == b"\x89PNG" and len(data) > 10_000, path


@pytest.mark.slow
def test_budget_sweep_experiment_quick(tmp_path):
    _run_experiment("budget_sweep.py", tmp_path)
    from checkmate.analysis.sweep import check_consistency, read_sweep_csv

    for model in ("vgg16", "mobilenet", "unet"):
        rows = read_sweep_csv(tmp_path / f"budget_sweep_{model}.csv")
        assert check_consistency(rows, rtol=0.005) == [], model
        _assert_png(tmp_path / f"budget_sweep_{model}.png")
    _assert_png(tmp_path / "budget_sweep.png")
    assert "### vgg16" in (tmp_path / "README.md").read_text()


@pytest.mark.slow
def test_max_batch_experiment_quick(tmp_path):
    _run_experiment("max_batch.py", tmp_path, "--models", "unet,mobilenet")
    import csv

    rows = list(csv.DictReader(open(tmp_path / "max_batch.csv")))
    for model in ("unet", "mobilenet"):
        by = {r["strategy"]: int(r["max_batch_size"]) for r in rows if r["model"] == model}
        assert by["checkmate_milp"] >= max(by.values())
        assert by["checkmate_milp"] > by["checkpoint_all"], (model, by)
    _assert_png(tmp_path / "max_batch.png")


@pytest.mark.slow
def test_deep_resnet_experiment_quick(tmp_path):
    _run_experiment("deep_resnet.py", tmp_path)
    import csv

    rows = {r["strategy"]: r for r in csv.DictReader(open(tmp_path / "deep_resnet.csv"))}
    assert set(rows) == {"checkpoint_all", "chen_sqrtn", "checkmate_milp"}
    # At equal budget the MILP recomputes no more than sqrt(n) does, and both save memory.
    assert float(rows["checkmate_milp"]["simulated_overhead"]) <= float(rows["chen_sqrtn"]["simulated_overhead"]) + 1e-9
    assert int(rows["chen_sqrtn"]["simulated_step_peak_bytes"]) < int(rows["checkpoint_all"]["simulated_step_peak_bytes"])
    assert int(rows["chen_sqrtn"]["measured_peak_bytes"]) < int(rows["checkpoint_all"]["measured_peak_bytes"])
    _assert_png(tmp_path / "deep_resnet.png")
