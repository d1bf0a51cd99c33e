"""The status line of long solves: when it shows, what it says, and that it changes no result."""

import numpy as np
import pytest
import scipy.sparse as sp

from cases import training_chain, trivial_memory_lower_bound
from checkmate.solvers import SolveOptions
from checkmate.solvers import progress as progress_module
from checkmate.solvers.backends import OPTIMAL, get_backend
from checkmate.solvers.sparse_model import SparseModel
from checkmate.solvers.milp import checkmate_milp
from checkmate.solvers.types import MilpOptions


@pytest.fixture
def shown_at_once(monkeypatch):
    """The line shows from the first moment and redraws on every report."""
    monkeypatch.setattr(progress_module, "_DELAY_S", 0.0)
    monkeypatch.setattr(progress_module, "_REFRESH_S", 0.0)


def _knapsack_mip(items=40, seed=0):
    """A 0/1 knapsack that HiGHS needs branch and bound for (as a minimisation)."""
    rng = np.random.default_rng(seed)
    weight = rng.integers(10, 60, items).astype(float)
    value = weight + rng.integers(1, 10, items)
    A = sp.csr_matrix(weight[None, :])
    return SparseModel(c=-value, offset=0.0, A=A, row_lo=np.array([-np.inf]),
                       row_hi=np.array([float(weight.sum() // 2) + 0.5]), col_lo=np.zeros(items),
                       col_hi=np.ones(items), integer=np.ones(items, dtype=bool), integral_rows=True)


def test_wanted_follows_the_option_then_the_environment(monkeypatch):
    monkeypatch.delenv("CHECKMATE_PROGRESS", raising=False)
    assert progress_module.progress_wanted(True) and not progress_module.progress_wanted(False)
    # pytest captures stderr: not a terminal, so off unless the environment asks for it
    assert not progress_module.progress_wanted(None)
    monkeypatch.setenv("CHECKMATE_PROGRESS", "1")
    assert progress_module.progress_wanted(None)
    assert not progress_module.progress_wanted(False)


def test_line_says_phase_bounds_and_gap_then_goes(shown_at_once, capsys):
    with progress_module.SolveProgress(True, "checkmate_milp", cost_scale=2.0) as line:
        line.phase("branch and bound")
        line.bounds(50.0, 45.0)
        line.bounds(float("inf"), float("-inf"))   # nothing known yet: no numbers
    err = capsys.readouterr().err
    assert "checkmate_milp" in err and "branch and bound" in err
    assert "best 100, bound 90, gap 10.00%" in err
    assert err.endswith("\r") or err.rstrip(" ").endswith("\r")   # cleared, not left on screen


def test_short_or_disabled_solves_print_nothing(monkeypatch, capsys):
    monkeypatch.setattr(progress_module, "_DELAY_S", 60.0)
    with progress_module.SolveProgress(True, "checkmate_milp") as line:
        line.phase("LP relaxation")
        line.bounds(1.0, 0.5)
    with progress_module.SolveProgress(False, "checkmate_milp") as line:
        line.phase("LP relaxation")
    assert capsys.readouterr().err == ""


def test_highs_reports_bounds_from_branch_and_bound_without_changing_the_answer():
    model = _knapsack_mip()
    seen = []
    plain = get_backend("highs").solve(model, threads=1, mip_gap=0.0)
    watched = get_backend("highs").solve(model, threads=1, mip_gap=0.0, on_bounds=lambda b, lb: seen.append((b, lb)))
    assert plain.status == watched.status == OPTIMAL
    assert watched.objective == pytest.approx(plain.objective)
    assert seen, "branch and bound never reported"
    finite = [(b, lb) for b, lb in seen if np.isfinite(b) and np.isfinite(lb)]
    assert finite and all(lb <= b + 1e-9 for b, lb in finite)
    # the bound reported never passes the optimum, the incumbent never beats it
    assert all(lb <= plain.objective + 1e-6 and b >= plain.objective - 1e-6 for b, lb in finite)


def test_milp_with_the_line_shows_its_phases_and_returns_the_same_schedule(shown_at_once, capsys):
    graph = training_chain(6, cost=2.0, mem=3)
    budget = trivial_memory_lower_bound(graph) + 3
    options = dict(milp=MilpOptions(race=False))
    quiet = checkmate_milp(graph, budget, SolveOptions(progress=False, **options))
    assert capsys.readouterr().err == ""
    shown = checkmate_milp(graph, budget, SolveOptions(progress=True, **options))
    err = capsys.readouterr().err
    assert "checkmate_milp" in err and "LP relaxation" in err
    assert shown.optimal == quiet.optimal and shown.status == quiet.status
    assert np.array_equal(shown.schedule.retain, quiet.schedule.retain)


def test_the_line_leaves_highs_threads_as_they_were(monkeypatch):
    """Watching the bounds is not racing: HiGHS alone keeps its own thread count."""
    from checkmate.solvers.backends.highs import HighsBackend

    calls = []
    real = HighsBackend.solve

    def recording(self, model, **kwargs):
        if model.integer.any():
            calls.append((kwargs.get("threads"), "on_bounds" in kwargs))
        return real(self, model, **kwargs)

    monkeypatch.setattr(HighsBackend, "solve", recording)
    graph = training_chain(6, cost=2.0, mem=3)
    budget = trivial_memory_lower_bound(graph) + 3
    milp = MilpOptions(race=False, root_lp=False, improve_start=False)
    for shown in (False, True):
        checkmate_milp(graph, budget, SolveOptions(progress=shown, milp=milp))
    assert calls == [(None, False), (None, True)]
