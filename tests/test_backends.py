"""Backends: names, status translation, MIP starts, licence refusals, and agreement on the optimum."""

import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

from cases import SMALL_CASES, trivial_memory_lower_bound
from checkmate import solve
from checkmate.errors import BackendUnavailableError, InfeasibleBudgetError, InvalidArgumentError, SolverError
from checkmate.solvers import SolveOptions, checkpoint_all_peak
from checkmate.solvers.backends import (FEASIBLE, INFEASIBLE, NO_SOLUTION, OPTIMAL, backend_names,
                                        get_backend)
from checkmate.solvers.formulation import build_formulation
from checkmate.solvers.sparse_model import SparseModel

try:
    import gurobipy  # noqa: F401

    HAVE_GUROBI = True
except ImportError:
    HAVE_GUROBI = False


def usable(name):
    try:
        get_backend(name)
        return True
    except BackendUnavailableError:
        return False


MILP_BACKENDS = [name for name in ["highs", "cvxpy", "SCIPY", "gurobi", "ortools"] if usable(name)]


@pytest.fixture
def ran_elsewhere(request) -> bool:
    """True when this test has run, and passed, in a fresh process instead of here.

    CP-SAT refuses to run beside TensorFlow (clashing native libraries), and under pytest-xdist a
    worker may already have imported TensorFlow for other tests: an OR-Tools case then runs in a new
    interpreter that has not (tests/tf2/test_ortools_guard.py checks the refusal itself)."""
    params = getattr(getattr(request.node, "callspec", None), "params", {})
    if "ortools" not in params.values() or "tensorflow" not in sys.modules:
        return False
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                          request.node.nodeid], cwd=str(request.config.rootpath), capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "1 passed" in run.stdout, run.stdout[-3000:]
    return True


def knapsack(capacity):
    """max 3a + 4b + 5c s.t. 2a + 3b + 4c <= capacity, binaries (as a minimisation)."""
    A = sp.csr_matrix(np.array([[2.0, 3.0, 4.0]]))
    return SparseModel(c=np.array([-3.0, -4.0, -5.0]), offset=10.0, A=A, row_lo=np.array([-np.inf]),
                       row_hi=np.array([float(capacity)]), col_lo=np.zeros(3), col_hi=np.ones(3),
                       integer=np.ones(3, dtype=bool), integral_rows=True)


def test_unknown_solver_lists_the_choices():
    with pytest.raises(InvalidArgumentError) as err:
        get_backend("no-such-solver")
    for name in ("highs", "cvxpy", "gurobi", "HIGHS"):
        assert name in str(err.value)
    with pytest.raises(InvalidArgumentError):
        solve(SMALL_CASES["diamond"](), "90%", "checkmate_milp", solver="no-such-solver")


def test_names_resolve():
    assert get_backend(None).name == "highs"
    assert get_backend("cvxpy").label == "cvxpy/HIGHS"
    assert get_backend("HIGHS").label == "cvxpy/HIGHS"
    assert set(["highs", "cvxpy", "gurobi", "ortools"]) <= set(backend_names())


def test_a_cvxpy_solver_that_is_not_installed_is_unavailable_not_unknown():
    import cvxpy

    missing = [s for s in ("GLPK_MI", "CBC", "SCIP", "CPLEX", "MOSEK") if s not in cvxpy.installed_solvers()]
    if not missing:
        pytest.skip("every listed cvxpy MILP solver is installed")
    with pytest.raises(BackendUnavailableError) as err:
        get_backend(missing[0])
    assert "highs" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("name", MILP_BACKENDS)
def test_knapsack_status_and_values(name, ran_elsewhere):
    if ran_elsewhere:
        return
    backend = get_backend(name)
    try:
        res = backend.solve(knapsack(5), mip_gap=0.0, threads=1)
    except BackendUnavailableError:
        pytest.skip(f"{name} refuses this model here")
    assert res.status == OPTIMAL
    assert np.allclose(np.round(res.x), [1, 1, 0])
    assert res.objective == pytest.approx(10.0 - 7.0)
    assert res.bound == pytest.approx(3.0, abs=1e-6)


@pytest.mark.parametrize("name", MILP_BACKENDS)
def test_infeasible_model_is_reported_infeasible(name, ran_elsewhere):
    if ran_elsewhere:
        return
    model = knapsack(5)
    model.row_lo = np.array([20.0])   # 2a + 3b + 4c >= 20 cannot hold
    model.row_hi = np.array([np.inf])
    res = get_backend(name).solve(model, mip_gap=0.0, threads=1)
    assert res.status == INFEASIBLE and res.x is None or res.status == INFEASIBLE


@pytest.mark.parametrize("name", [n for n in MILP_BACKENDS if n != "ortools"])
def test_lp_relaxation(name):
    res = get_backend(name).solve(knapsack(5).relaxed(), threads=1)
    assert res.status == OPTIMAL
    # fractional knapsack: a = b = 1 (ratio 1.5, 1.33), then nothing left for c
    assert res.objective == pytest.approx(3.0)
    assert res.bound == pytest.approx(res.objective)


def test_time_limit_without_a_solution_is_not_infeasible():
    """A time limit reached before any solution is 'no_solution' (or 'feasible'), never 'infeasible'."""
    from checkmate import synthetic

    graph = synthetic.unet(4)
    form = build_formulation(graph, int(0.5 * checkpoint_all_peak(graph)))
    res = get_backend("highs").solve(form.model, time_limit_s=0.01, threads=1,
                                     solver_options={"mip_heuristic_effort": 0.0})
    assert res.status in (NO_SOLUTION, FEASIBLE, OPTIMAL)
    if res.status == NO_SOLUTION:
        assert res.x is None


def test_highs_uses_the_mip_start():
    graph = SMALL_CASES["unet3"]()
    from checkmate.solvers.baselines import checkpoint_all_schedule

    form = build_formulation(graph, checkpoint_all_peak(graph))
    start = checkpoint_all_schedule(graph)
    x0 = form.encode(start.recompute, start.retain)
    res = get_backend("highs").solve(form.model, time_limit_s=5, threads=1, mip_start=x0,
                                     solver_options={"mip_max_nodes": 0, "mip_heuristic_effort": 0.0})
    assert res.x is not None
    assert form.model.cost_of(res.x) == pytest.approx(graph.total_cost)


@pytest.mark.skipif(not HAVE_GUROBI, reason="gurobipy is not installed")
def test_gurobi_size_limited_licence_is_one_line_and_names_the_fallback():
    from checkmate import synthetic
    from checkmate.solvers.backends.gurobi import _licence_is_size_limited

    if not _licence_is_size_limited():
        pytest.skip("this gurobipy has a full licence")
    graph = synthetic.unet(3)
    with pytest.raises(BackendUnavailableError) as err:
        solve(graph, "80%", "checkmate_milp", solver="gurobi")
    message = str(err.value)
    assert "size-limited" in message and "solver='highs'" in message and "\n" not in message
    assert isinstance(err.value, SolverError) and not isinstance(err.value, InfeasibleBudgetError)
    with pytest.raises(BackendUnavailableError):
        solve(graph, "80%", "checkmate_milp", solver="GUROBI")   # the same refusal through cvxpy


def _agreeing_backends():
    return [n for n in MILP_BACKENDS if n != "highs"]


@pytest.mark.parametrize("name", sorted(SMALL_CASES))
def test_backends_agree_on_the_optimum(name):
    graph = SMALL_CASES[name]()
    low, high = trivial_memory_lower_bound(graph), checkpoint_all_peak(graph)
    compared = 0
    for budget in sorted({int(low + f * (high - low)) for f in (0.3, 0.6, 1.0)}):
        try:
            ref = solve(graph, budget, "checkmate_milp", solver="highs")
        except InfeasibleBudgetError:
            for other in _agreeing_backends():
                with pytest.raises((InfeasibleBudgetError, BackendUnavailableError)):
                    solve(graph, budget, "checkmate_milp", solver=other)
            continue
        for other in _agreeing_backends():
            try:
                r = solve(graph, budget, "checkmate_milp", solver=other)
            except BackendUnavailableError:   # e.g. the size-limited Gurobi licence
                continue
            # integral costs: every backend's default solve is exact, so the costs are equal
            assert r.compute_cost == ref.compute_cost, other
            assert r.optimal and ref.optimal
            compared += 1
    if not compared and _agreeing_backends():
        pytest.skip("no other backend accepted these models")


@pytest.mark.skipif(not HAVE_GUROBI, reason="gurobipy is not installed")
def test_gurobi_agrees_within_its_licence():
    """A graph small enough for the size-limited licence: gurobipy and HiGHS find the same optimum."""
    graph = SMALL_CASES["chain4"]()
    budget = int(0.75 * checkpoint_all_peak(graph))
    try:
        g = solve(graph, budget, "checkmate_milp", solver="gurobi")
    except BackendUnavailableError:
        pytest.skip("gurobipy refuses even this model")
    h = solve(graph, budget, "checkmate_milp", solver="highs")
    assert g.compute_cost == h.compute_cost and g.optimal and h.optimal


def test_solve_options_threads_and_verbose_are_accepted(capfd):
    graph = SMALL_CASES["chain4"]()
    r = solve(graph, "80%", "checkmate_milp", threads=1, verbose=True)
    assert r.optimal
    assert "HiGHS" in capfd.readouterr().out


def test_highs_solves_from_another_thread_and_back():
    """Branch and bound beside a race runs HiGHS in a worker thread; solves before and after it, in the
    caller's thread, with the same or another thread count, still run (HiGHS' shared task scheduler
    belongs to the thread that made it)."""
    import threading

    backend = get_backend("highs")
    statuses = [backend.solve(knapsack(5), mip_gap=0.0).status]
    worker = threading.Thread(target=lambda: statuses.append(backend.solve(knapsack(5), mip_gap=0.0,
                                                                            threads=1).status))
    worker.start()
    worker.join()
    statuses.append(backend.solve(knapsack(5), mip_gap=0.0, threads=1).status)
    statuses.append(backend.solve(knapsack(5), mip_gap=0.0).status)
    assert statuses == [OPTIMAL] * 4
