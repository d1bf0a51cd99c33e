"""Branch and bound racing the CP-SAT model in a child process: exact answers, and no child left behind."""

import os
import pickle
import signal
import subprocess
import sys
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cases import brute_force_optimum, random_dags, training_chain, trivial_memory_lower_bound
from checkmate.schedule import Schedule
from checkmate.simulate import simulate
from checkmate.solvers import SolveOptions, checkpoint_all_peak
from checkmate.solvers import candidates, milp, race, rounding, staged
from checkmate.solvers.cp_schedule import CpSatChild, cp_sat_available
from checkmate.solvers.candidates import schedule_from_retain
from checkmate.solvers.milp import checkmate_milp
from checkmate.solvers.types import MilpOptions

pytestmark = pytest.mark.skipif(not cp_sat_available(), reason="OR-Tools is not installed")

RACE = SolveOptions(milp=MilpOptions(race=True))
ALONE = SolveOptions(milp=MilpOptions(race=False))
# A unit chain at a budget where HiGHS alone needs seconds (5.9 s) and the CP-SAT model under two.
HARD_CHAIN = (lambda: training_chain(10, cost=2.0, mem=3), 13, 62.0)


def _children_of(pid: int) -> set[int]:
    """Process ids whose parent is ``pid`` (Linux /proc), zombies left out."""
    out = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == str(pid) and fields[0] != "Z":
            out.add(int(entry))
    return out


def _children() -> set[int]:
    """Process ids whose parent is this process."""
    return _children_of(os.getpid())


needs_proc = pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc to list child processes")


def _solve_in_child(graph, budget, **request):
    with CpSatChild(graph, budget) as child:
        child.solve(hint_retain=None, time_limit_s=60.0, mip_gap=0.0, abs_gap=None, **request)
        return child.wait(90.0)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_dags(min_nodes=2, max_nodes=5), st.floats(0.0, 1.0))
def test_cp_model_agrees_with_brute_force(graph, where):
    low, high = trivial_memory_lower_bound(graph), checkpoint_all_peak(graph)
    budget = max(1, int(low + where * (high - low)))
    best = brute_force_optimum(graph, budget)
    outcome = _solve_in_child(graph, budget)
    if best is None:
        assert outcome.status == "infeasible"
        return
    assert outcome.status == "optimal"
    schedule = schedule_from_retain(graph, outcome.retain)
    sim = simulate(graph, schedule)
    assert sim.valid and sim.peak_memory_bytes <= budget
    assert sim.compute_cost == pytest.approx(best[0]) and outcome.cost == pytest.approx(best[0])


def test_race_returns_the_proven_optimum():
    make, budget, optimum = HARD_CHAIN
    graph = make()
    raced = checkmate_milp(graph, budget, RACE)
    assert raced.optimal and "proven by" in raced.status
    sim = simulate(graph, raced.schedule)
    assert sim.valid and sim.peak_memory_bytes <= budget and sim.compute_cost == optimum


@pytest.mark.parametrize("layers,fraction", [(6, 0.2), (8, 0.3)])
def test_race_and_highs_alone_agree(layers, fraction):
    graph = training_chain(layers, cost=2.0, mem=3)
    low, high = trivial_memory_lower_bound(graph), checkpoint_all_peak(graph)
    budget = int(low + fraction * (high - low))
    raced, alone = checkmate_milp(graph, budget, RACE), checkmate_milp(graph, budget, ALONE)
    assert raced.optimal and alone.optimal
    assert simulate(graph, raced.schedule).compute_cost == simulate(graph, alone.schedule).compute_cost


def test_race_is_off_on_small_graphs_by_default(monkeypatch):
    started = []
    monkeypatch.setattr(race, "CpSatChild", lambda *a: started.append(a) or CpSatChild(*a))
    graph = training_chain(6, cost=2.0, mem=3)
    checkmate_milp(graph, trivial_memory_lower_bound(graph) + 3, SolveOptions())
    assert started == []


@needs_proc
def test_no_child_left_after_the_time_limit():
    graph = training_chain(16)
    before = _children()
    started = time.perf_counter()
    out = checkmate_milp(graph, 5, SolveOptions(time_limit_s=2.0, milp=MilpOptions(race=True)))
    assert time.perf_counter() - started < 10.0
    assert out.schedule is not None and simulate(graph, out.schedule).peak_memory_bytes <= 5
    assert _children() <= before


@needs_proc
def test_ctrl_c_during_the_race_kills_the_child(monkeypatch):
    def interrupted(race):
        raise KeyboardInterrupt

    monkeypatch.setattr(staged, "race_proved", interrupted)
    monkeypatch.setattr(race, "race_proved", interrupted)
    before = _children()
    with pytest.raises(KeyboardInterrupt):
        checkmate_milp(training_chain(16), 5, RACE)
    assert _children() <= before


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@needs_proc
def test_sigint_to_checkmate_solve_while_racing_says_interrupted(tmp_path):
    """A real Ctrl-C (SIGINT) to `checkmate solve` while branch and bound races CP-SAT: the command
    stops with exit status 130 and 'interrupted', not a solver error, and its child is gone."""
    from checkmate.graph import save_graph

    path = tmp_path / "chain40.json"
    save_graph(training_chain(40), path)   # at 8 units branch and bound runs for minutes
    proc = subprocess.Popen([sys.executable, "-m", "checkmate", "solve", str(path), "--budget", "8",
                             "--strategy", "checkmate_milp", "--time-limit", "120"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        kids: set[int] = set()
        waited = time.perf_counter()
        while not kids and time.perf_counter() - waited < 60 and proc.poll() is None:
            time.sleep(0.2)
            kids = _children_of(proc.pid)
        assert kids, "the race's child never started"
        time.sleep(4.0)   # into the LP, the local search or branch and bound
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "solver failed" not in err
    time.sleep(0.5)
    assert not any(_alive(k) for k in kids)


def test_child_exits_when_its_caller_stops_listening():
    graph = training_chain(16)
    child = CpSatChild(graph, 5)
    try:
        child.solve(hint_retain=None, time_limit_s=600.0, mip_gap=0.0, abs_gap=None)
        assert child.delivered(60.0)
        child._proc.stdin.close()   # what the caller's death looks like from the child
        assert child._proc.wait(timeout=30) == 0
    finally:
        child.close()


def test_a_graph_larger_than_the_pipe_does_not_wait_for_the_childs_imports(monkeypatch):
    """The child reads its input once its imports are done; sending it a graph bigger than a pipe's
    buffer must not hold the caller (and its time limit) until then."""
    from checkmate.solvers import cp_schedule

    graph = training_chain(400)
    assert len(pickle.dumps(("graph", graph, 5))) > 1 << 16
    slow_start = "import time; time.sleep(20)\n" + cp_schedule._CHILD_START
    monkeypatch.setattr(cp_schedule, "_CHILD_START", slow_start)
    started = time.perf_counter()
    with CpSatChild(graph, checkpoint_all_peak(graph)) as child:
        assert child.solve(hint_retain=None, time_limit_s=5.0, mip_gap=0.0, abs_gap=None)
        assert time.perf_counter() - started < 10.0
        assert not child.delivered(0.0)         # the child is still asleep
        assert child.result() is None


def test_hint_is_taken_whole():
    graph = training_chain(6, cost=2.0, mem=3)
    budget = trivial_memory_lower_bound(graph) + 3
    alone = checkmate_milp(graph, budget, ALONE)
    with CpSatChild(graph, budget) as child:
        child.solve(hint_retain=alone.schedule.retain, time_limit_s=60.0, mip_gap=0.0, abs_gap=None)
        outcome = child.wait(90.0)
    assert outcome.status == "optimal"
    assert outcome.cost == pytest.approx(simulate(graph, alone.schedule).compute_cost)
    assert isinstance(schedule_from_retain(graph, outcome.retain), Schedule)


class _FakeChild:
    """Stands in for :class:`CpSatChild` in ``beside_race``: answers what the test sets."""

    def __init__(self):
        self.answer = None

    def result(self):
        return self.answer

    def wait(self, timeout_s=None):
        time.sleep(min(timeout_s or 0.0, 0.01))
        return self.answer


def _proof():
    from checkmate.solvers.cp_schedule import CpSatOutcome

    return CpSatOutcome(None, "optimal", 1.0, 1.0, 0.0)


def test_the_childs_proof_ends_the_wait_without_waiting_for_branch_and_bound():
    child, release, saw = _FakeChild(), threading.Event(), []

    def branch_and_bound(stop):
        child.answer = _proof()     # the child proves while branch and bound is busy
        release.wait(30)            # and branch and bound looks at its stop flag only later
        saw.append(stop())
        return "branch and bound's result"

    assert race.beside_race(child, branch_and_bound) is None
    assert saw == []                # returned while branch and bound was still running
    release.set()
    for _ in range(3000):
        if saw:
            break
        time.sleep(0.01)
    assert saw == [True]            # and branch and bound was told to stop


def test_beside_the_race_branch_and_bound_answers_and_fails_as_it_would_alone():
    child = _FakeChild()
    assert race.beside_race(child, lambda stop: ("done", stop())) == ("done", False)

    def fails(stop):
        raise ValueError("solver failed")

    with pytest.raises(ValueError, match="solver failed"):
        race.beside_race(child, fails)
    from checkmate.solvers.cp_schedule import CpSatOutcome

    child.answer = CpSatOutcome(None, "feasible", 2.0, 1.0, 0.0)   # stopped without a proof
    assert race.beside_race(child, lambda stop: ("done", stop())) == ("done", False)


def test_local_search_stops_when_told():
    graph = training_chain(10, cost=2.0, mem=3)
    budget = 13
    start = min((c for c in candidates.baseline_candidates(graph, budget, SolveOptions()) if c.peak_bytes <= budget),
                key=lambda c: c.cost)
    improved = rounding.improve_by_holding(graph, start, budget)
    assert improved.cost < start.cost      # there is something to improve
    assert rounding.improve_by_holding(graph, start, budget, stop=lambda: True) is start


def test_a_proof_during_the_local_search_skips_branch_and_bound(monkeypatch):
    make, budget, optimum = HARD_CHAIN
    graph = make()
    real = staged.improve_by_holding
    solves = []

    def slow_local_search(graph, candidate, budget_bytes, *, deadline=None, stop=None):
        assert stop is not None             # the race is on: the local search can be stopped
        for _ in range(6000):               # run on until the child has proved
            if stop():
                break
            time.sleep(0.01)
        return real(graph, candidate, budget_bytes, deadline=deadline, stop=stop)

    monkeypatch.setattr(staged, "improve_by_holding", slow_local_search)
    backend_type = type(milp.get_backend("highs"))
    real_solve = backend_type.solve
    monkeypatch.setattr(backend_type, "solve",
                        lambda self, model, **kw: solves.append(model.integer.any()) or real_solve(self, model, **kw))
    out = checkmate_milp(graph, budget, RACE)
    assert out.optimal and "proven by CP-SAT, racing HiGHS" in out.status and "LP bound" not in out.status
    assert simulate(graph, out.schedule).compute_cost == optimum
    assert not any(solves)                  # only the LP ran: no branch and bound


_STRAGGLER_SCRIPT = r"""
import sys, time
sys.path[:0] = sys.argv[1:2]
from cases import training_chain
from checkmate.solvers import SolveOptions, race, staged
from checkmate.solvers.cp_schedule import CpSatOutcome

class Proved:
    def result(self):
        return CpSatOutcome(None, "optimal", 1.0, 1.0, 0.0)
    def wait(self, timeout_s=None):
        return self.result()

graph = training_chain(10, cost=2.0, mem=3)
backend = staged.get_backend("highs")
form = staged.build_model(graph, 13, SolveOptions(), backend)

def branch_and_bound(stop):
    def slow_stop():            # HiGHS' callback, busy in Python for a while (as at the interpreter's exit)
        end = time.perf_counter() + 1.0
        while time.perf_counter() < end:
            pass
        return stop()
    return backend.solve(form.model, threads=1, stop=slow_stop, time_limit_s=30)

assert race.beside_race(Proved(), branch_and_bound) is None
print("returned", flush=True)
"""


def test_the_process_exits_cleanly_while_branch_and_bound_is_still_stopping(tmp_path):
    """The caller returns at the child's proof while HiGHS runs on to its next callback; a process that
    ends right then must wait for it, not abort inside HiGHS."""
    script = tmp_path / "straggler.py"
    script.write_text(_STRAGGLER_SCRIPT)
    here = os.path.dirname(os.path.abspath(__file__))
    run = subprocess.run([sys.executable, str(script), here], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "returned" in run.stdout
