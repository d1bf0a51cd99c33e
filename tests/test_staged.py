"""The staged MILP driver: what it returns, where each hook ends it, and backend capabilities as flags."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

import checkmate
from checkmate import InvalidArgumentError, synthetic
from checkmate.simulate import simulate
from checkmate.solvers import SolveOptions, checkpoint_all_peak, solve
from checkmate.solvers.backends import get_backend
from checkmate.solvers.backends.cvxpy_backend import CvxpyBackend
from checkmate.solvers.formulation import build_formulation
from checkmate.solvers.staged import (BASELINES, BRANCH_AND_BOUND, LP_RELAXATION, ProvenInfeasible, StagedResult,
                                      solve_staged)
from checkmate.solvers.types import MilpOptions

ALONE = SolveOptions(time_limit_s=60, milp=MilpOptions(race=False))


@functools.lru_cache(maxsize=None)
def _tight_case():
    """A graph and budget where the LP bound is strictly below the optimum, with the optimum's cost."""
    graph = synthetic.unet(4, base_mem=1 << 20)
    budget = int(checkpoint_all_peak(graph) * 0.6)
    exact = solve(graph, budget, strategy="checkmate_milp", time_limit_s=60, race=False)
    assert exact.optimal
    return graph, budget, exact.compute_cost


def test_without_hooks_it_returns_a_replayed_optimum_and_its_proof():
    graph, budget, optimum = _tight_case()
    run = solve_staged(graph, budget, ALONE)
    assert isinstance(run, StagedResult)
    assert run.best.cost == pytest.approx(optimum) and run.bound == pytest.approx(optimum, rel=1e-4)
    sim = simulate(graph, run.best.schedule)
    assert sim.valid and sim.peak_memory_bytes <= budget and sim.compute_cost == run.best.cost
    assert run.lp_solved and not run.none_within_cutoff


def test_a_target_a_baseline_meets_ends_before_any_model_is_built(monkeypatch):
    graph, budget, _ = _tight_case()
    import checkmate.solvers.staged as staged

    monkeypatch.setattr(staged, "build_model", lambda *a, **k: pytest.fail("no model was needed"))
    run = solve_staged(graph, checkpoint_all_peak(graph), ALONE, target=graph.total_cost)
    assert run.stage == BASELINES and run.best.cost <= graph.total_cost and run.bound is None


def test_a_cutoff_below_the_lp_bound_ends_at_the_lp():
    graph, budget, optimum = _tight_case()
    lp = solve(graph, budget, strategy="lower_bound_lp").lower_bound
    run = solve_staged(graph, budget, ALONE, cutoff=lp * 0.99, target=lp * 0.99)
    assert run.stage == LP_RELAXATION and run.bound > lp * 0.99 and not run.none_within_cutoff


def test_a_cutoff_between_the_lp_bound_and_the_optimum_is_ruled_out_by_branch_and_bound():
    graph, budget, optimum = _tight_case()
    lp = solve(graph, budget, strategy="lower_bound_lp").lower_bound
    assert lp < optimum
    below = (lp + optimum) / 2
    run = solve_staged(graph, budget, ALONE, cutoff=below, target=below)
    assert run.stage == BRANCH_AND_BOUND
    assert run.none_within_cutoff or run.bound > below
    assert run.best is None or run.best.cost > below


def test_a_target_at_the_optimum_is_reached_with_a_replayed_schedule():
    graph, budget, optimum = _tight_case()
    run = solve_staged(graph, budget, ALONE, cutoff=optimum * (1 + 1e-9), target=optimum * (1 + 1e-9))
    assert run.best is not None and run.best.cost <= optimum * (1 + 1e-9)
    assert simulate(graph, run.best.schedule).peak_memory_bytes <= budget


def test_stop_ends_the_solve_at_once():
    graph, budget, _ = _tight_case()
    run = solve_staged(graph, budget, ALONE, stop=lambda: True)
    assert run.stage == BASELINES and run.last is None


def test_nothing_fits_is_a_proof_not_a_result():
    graph, _, _ = _tight_case()
    with pytest.raises(ProvenInfeasible):
        solve_staged(graph, 1, ALONE)


def test_hooks_a_backend_lacks_are_refused_by_name():
    backend = CvxpyBackend("HIGHS")
    assert not (backend.supports_cutoff or backend.supports_stop or backend.reports_bounds)
    highs = get_backend("highs")
    assert highs.supports_cutoff and highs.supports_stop and highs.reports_bounds and highs.takes_solver_options
    form = build_formulation(synthetic.unet(2), checkpoint_all_peak(synthetic.unet(2)))
    with pytest.raises(InvalidArgumentError, match="cutoff"):
        backend.solve(form.model, cutoff=1.0)
    with pytest.raises(InvalidArgumentError, match="cutoff"):
        solve_staged(synthetic.unet(2), checkpoint_all_peak(synthetic.unet(2)), SolveOptions(solver="cvxpy"),
                     cutoff=1.0)


def _name_checks(tree: ast.AST) -> list[int]:
    """Lines comparing something's ``.name`` with a solver's name (``backend.name == "highs"``)."""
    solvers = {"highs", "cvxpy", "gurobi", "ortools"}
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Attribute) and node.left.attr == "name":
            if any(isinstance(c, ast.Constant) and c.value in solvers for c in node.comparators):
                lines.append(node.lineno)
    return lines


def test_callers_read_capability_flags_not_backend_names():
    package = Path(checkmate.__file__).resolve().parent
    found = {str(path.relative_to(package)): lines for path in sorted(package.rglob("*.py"))
             if (lines := _name_checks(ast.parse(path.read_text())))}
    assert not found, f"backend name checks: {found}"
    assert _name_checks(ast.parse('if backend.name == "highs": pass')) == [1]
