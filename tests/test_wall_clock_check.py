"""The wall-clock fidelity check of experiments/wall_clock.py: which rows make it fail (no timing here)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))

import wall_clock  # noqa: E402


def row(budget, predicted, measured, model="m"):
    return {"model": model, "budget": budget, "status": "ok", "predicted_overhead": predicted,
            "measured_ratio": measured, "ratio_error": measured / predicted - 1.0}


def test_checkpoint_all_over_the_bar_fails():
    assert wall_clock.check([row("100%", 1.0, 1.049)], 0.08, 1.05) == []
    (failure,) = wall_clock.check([row("100%", 1.0, 1.06)], 0.08, 1.05)
    assert "checkpoint_all runs at 1.060x" in failure


def test_drift_beyond_the_tolerance_fails_either_way():
    assert wall_clock.check([row("70%", 1.10, 1.17), row("50%", 1.20, 1.12)], 0.08, 1.05) == []
    failures = wall_clock.check([row("70%", 1.10, 1.20), row("50%", 1.30, 1.15)], 0.08, 1.05)
    assert len(failures) == 2 and "70%" in failures[0] and "50%" in failures[1]


def test_rows_that_did_not_run_are_not_judged():
    assert wall_clock.check([{"model": "m", "budget": "50%", "status": "InfeasibleBudgetError: ..."}], 0.08, 1.05) == []
