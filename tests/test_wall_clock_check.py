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


def full_row(budget, **extra):
    r = row(budget, 1.10, 1.05)
    r.update(strategy="auto", nodes=10, measured_cpu_ratio=1.04, predicted_step_peak_bytes=2 ** 20,
             measured_step_peak_bytes=2 ** 20, plain_step_peak_bytes=2 ** 21, compile_s=1.0, **extra)
    return r


def test_the_table_shows_the_counters_only_when_they_were_counted():
    meta = {"command": "c", "device": "d", "started": "s", "seconds": 1.0}
    plain = wall_clock.markdown([full_row("70%")], [], meta)
    assert "faults / call" not in plain
    counted = wall_clock.markdown([full_row("70%", step_minor_faults=12.0, plain_minor_faults=3.0,
                                            step_voluntary_switches=40.0, plain_voluntary_switches=30.0,
                                            load_1min=6.25)], [], meta)
    header = next(line for line in counted.splitlines() if line.startswith("| model"))
    body = next(line for line in counted.splitlines() if line.startswith("| m |"))
    assert header.count("|") == body.count("|")
    assert "| 12 / 3 | 40 / 30 | 6.2 |" in body or "| 12 / 3 | 40 / 30 | 6.3 |" in body


class Plan:
    def __init__(self, budget):
        self.budget = budget


def test_checkmate_is_solved_again_below_a_heuristic_it_measured_above():
    # a plan measures 3 bytes above what it was given, the heuristic 100: the first budget (100 + 20
    # resident) measures 103, the next is lower by the 3 and measures 100, where it stops
    solved = []

    def solve(budget):
        solved.append(budget)
        return Plan(budget)

    step, used, log, error = wall_clock.solve_at_or_below(solve, lambda s: (s.budget - 20 + 3, 100), 120, 20)
    assert solved == [120, 117] and used == 117 and step.budget == 117 and error is None
    assert log == ["100: 103 vs 100", "97: 100 vs 100"]


def test_an_infeasible_lower_budget_keeps_the_plan_before_it():
    def solve(budget):
        if budget < 120:
            raise ValueError("infeasible")
        return Plan(budget)

    step, used, log, error = wall_clock.solve_at_or_below(solve, lambda s: (105, 100), 120, 20)
    assert step.budget == 120 and used == 120 and error is None and log[-1] == "95: ValueError"
    step, used, log, error = wall_clock.solve_at_or_below(solve, lambda s: (105, 100), 110, 20)
    assert step is None and used == 110 and isinstance(error, ValueError)


def test_the_budgets_tried_are_bounded():
    calls = []
    step, used, log, error = wall_clock.solve_at_or_below(lambda b: calls.append(b) or Plan(b),
                                                          lambda s: (s.budget, s.budget - 1), 1000, 0)
    assert len(calls) == wall_clock.COMPARE_BUDGET_TRIES and used == calls[-1] and len(log) == len(calls)


def compare_row(method, **extra):
    r = {"model": "m", "method": method, "status": "ok", "measured_step_peak_bytes": 2 ** 20,
         "peak_alone_bytes": 2 ** 20, "plain_step_peak_bytes": 2 ** 21, "measured_ratio": 1.1,
         "measured_cpu_ratio": 1.05, "predicted_overhead": None}
    r.update(extra)
    return r


def test_the_comparison_sets_each_plan_beside_its_heuristic_timed_in_the_same_loop():
    meta = {"command": "c", "device": "d", "started": "s", "seconds": 1.0}
    rows = [compare_row("tf.recompute_grad per block"),
            compare_row("checkmate at tf.recompute_grad per block's peak", predicted_overhead=1.08,
                        rival_ratio=1.2, rival_cpu_ratio=1.15),
            {"model": "m", "method": "checkmate at chen_sqrtn's peak", "status": "InfeasibleBudgetError: no"}]
    lines = wall_clock.markdown([], rows, meta).splitlines()
    header = next(line for line in lines if line.startswith("| model | method"))
    assert header.endswith("heuristic in the same loop |")
    body = [line for line in lines if line.startswith("| m |")]
    assert all(line.count("|") == header.count("|") for line in body)
    assert body[0].endswith("| - |") and body[1].endswith("| 1.200x (1.150x) |")
    # without the column where no row has the heuristic timed beside it (tables of earlier runs)
    old = wall_clock.markdown([], rows[:1], meta)
    assert "same loop" not in old
