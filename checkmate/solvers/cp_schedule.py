"""The schedule problem as a CP-SAT model of its own, and the child process that solves it.

The MILP of :mod:`checkmate.solvers.formulation` handed to CP-SAT as it is (``solver='ortools'``) is
weak: CP-SAT stops at its time limit 0.2-12% from its bound on the tight benchmark budgets. This
model states the same problem the way CP-SAT handles well: the same frontier-advancing stages and the
same cells (``R[t, i]`` computed in stage ``t``, ``S[t, i]`` held on entry to it; the fixed cells of
:func:`~checkmate.solvers.formulation.build_formulation` are constants here too), booleans only, and
memory counted through liveness literals instead of FREE and U columns:

* ``N[t, i, j]`` (value ``i`` is still needed once its user ``j`` is reached in stage ``t``) is implied
  by ``R[t, j]`` and by ``N`` at the next user of ``i`` (or by ``S[t+1, i]`` after the last one;
  ``S[n, i]`` is the output flag: outputs stay to the end);
* while ``k`` runs in stage ``t`` the resident bytes are ``mem[k] R[t, k]``, every earlier value ``i < k``
  still needed (``N`` at its first user at or after ``k``, else ``S[t+1, i]``) and every later value
  ``k <= i < t`` held on entry (``S[t, i]``); their sum is at most the budget less the fixed bytes.

A row at a position that does not run is implied by the row at the next one that does, so no row
needs an enforcement literal. The model agrees with :func:`checkmate.simulate.simulate` on every
schedule in the form that schedules are read back in (holds nothing uses pruned, R the minimal
recomputation; see :func:`checkmate.solvers.candidates.schedule_from_retain`), and for any other (R, S) it
counts at least what the simulator counts of the read-back schedule, so its optimum is the MILP's.
Rows that hold of that form only (``R + S <= 1``; a recomputation is used later in its stage or held
on; a hold is used in its stage or held on) cut off the dominated solutions: they leave the optimum
as it is and shorten the search.

The objective is the cost of the recomputations: in whole cost steps when the node costs share one
(:func:`~checkmate.solvers.sparse_model.cost_granularity`), else over the mean cost (CP-SAT's
floating-point objective). It is solved by one CP-SAT worker with its LP at the highest
linearization level (at the default level the clauses stay out of the LP and nothing is proven on
the tight budgets), without CP-SAT's presolve (``_PRESOLVE``), searching upward from the
objective's lower bound (``_OBJECTIVE_LB_SEARCH``) and branching towards its best schedule so far
(``_EXPLOIT_BEST_SOLUTION``), without two of its cut families (``_SKIPPED_CUTS``), with the caller's
best schedule as a complete hint.

OR-Tools and TensorFlow load clashing native libraries, so the model is solved in a child process
(``python -m checkmate.solvers.cp_schedule``, at a lower priority: ``_CHILD_NICENESS``) that imports
neither TensorFlow nor the caller's main module: :class:`CpSatChild` starts it, the child builds the
model while the caller works on its start, then solves from the hint it is sent. The child exits
when its input closes (also when the caller dies) and is killed by :meth:`CpSatChild.close`.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import select
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from checkmate._lifetime import die_with_parent

if TYPE_CHECKING:  # pragma: no cover
    from checkmate.graph import Graph

__all__ = ["CpSatOutcome", "CpSatChild", "build_cp_model", "solve_cp_model", "cp_sat_available"]

# Every clause in CP-SAT's LP (only at level 2 do they enter it): the bound the proofs need.
# Measured: experiments/results/README.md, section i.
_LINEARIZATION_LEVEL = 2
# No presolve: the model is already booleans and rows, and the presolve cost more than it saved.
# Measured: experiments/results/README.md, section i.
_PRESOLVE = False
# Climb from the objective's lower bound: after cuts it lies within 1% of the optimum.
# Measured: experiments/results/README.md, section i.
_OBJECTIVE_LB_SEARCH = True
# Chvatal-Gomory and zero-half cuts cost more LP time than they return in bound.
# Measured: experiments/results/README.md, section i.
_SKIPPED_CUTS = ("add_cg_cuts", "add_zero_half_cuts")
# Branch towards the best schedule so far (at first the hint): faster over seeds.
# Measured: experiments/results/README.md, section i.
_EXPLOIT_BEST_SOLUTION = True
# One worker: the caller's HiGHS solve has the other core.
# Measured: experiments/results/README.md, section i.
_WORKERS = 1
# Below the caller's priority: full speed on a free core, little taken from HiGHS otherwise.
# Measured: experiments/results/README.md, section i.
_CHILD_NICENESS = 10
# Largest objective (in cost steps, every cell computed) kept integral: well inside int64, and exact
# in the doubles that CP-SAT's bound and the caller's arithmetic pass through.
_EXACT_OBJECTIVE_MAX = 2.0**53
# An exact proof in whole cost steps: CP-SAT stops once bound and incumbent are less than a step apart.
_EXACT_ABS_GAP_STEPS = 0.5


@dataclass
class CpSatOutcome:
    """What the child answers: ``retain`` (n x n bool) of its best schedule or None; ``status`` one of
    ``"optimal"``, ``"feasible"``, ``"no_solution"``, ``"infeasible"``; ``cost`` and ``bound`` in the
    graph's cost units (the bound proven by CP-SAT); ``seconds`` of the solve."""

    retain: np.ndarray | None
    status: str
    cost: float | None
    bound: float | None
    seconds: float
    error: str | None = None


def cp_sat_available() -> bool:
    """Whether OR-Tools can be imported by a child process (checked without importing it here)."""
    import importlib.util

    try:
        return importlib.util.find_spec("ortools") is not None
    except (ImportError, ValueError):
        return False


@dataclass
class _CpModel:
    model: Any
    r_var: dict          # (t, i) -> BoolVar
    s_var: dict
    n_def: list          # (N, literal after it, R literal of its user): in the order of decreasing user
    s_fixed: np.ndarray
    cost_scale: float
    offset: float
    integral: bool       # the objective counts whole cost steps (exact in CP-SAT's integers)


def build_cp_model(graph: "Graph", budget_bytes: int) -> _CpModel:
    """The CP-SAT model of ``graph`` under ``budget_bytes`` (see the module docstring)."""
    from ortools.sat.python import cp_model

    from checkmate.solvers.formulation import _cells, _mem_units
    from checkmate.solvers.sparse_model import cost_granularity

    _, mem, cap, _ = _mem_units(graph, budget_bytes, force_integral=True)
    cells = _cells(graph, mem, cap)
    n = graph.n
    mem = mem.astype(np.int64)
    cap = int(cap)
    m = cp_model.CpModel()
    r_var: dict = {}
    s_var: dict = {}
    for t, i in zip(*np.nonzero(cells.r_is_var)):
        r_var[int(t), int(i)] = m.NewBoolVar(f"R{t},{i}")
    for t, i in zip(*np.nonzero(cells.s_is_var)):
        s_var[int(t), int(i)] = m.NewBoolVar(f"S{t},{i}")

    def r_lit(t: int, i: int):
        return r_var.get((t, i), bool(cells.r_fixed[t, i]))

    def s_lit(t: int, i: int):
        if t >= n:
            return bool(graph.output[i])
        return s_var.get((t, i), bool(cells.s_fixed[t, i]))

    def clause(literals) -> None:
        """At least one of ``(literal, wanted value)`` holds; constants fold in."""
        out = []
        for x, want in literals:
            if isinstance(x, bool):
                if x == want:
                    return
                continue
            out.append(x if want else x.Not())
        if not out:
            raise _Infeasible
        m.Add(sum(out) >= 1)

    users = [sorted(u) for u in graph.users]
    runs = cells.r_is_var | cells.r_fixed
    for t in range(n):
        for k in range(t + 1):
            if runs[t, k]:
                for i in graph.deps[k]:
                    clause([(r_lit(t, k), False), (r_lit(t, i), True), (s_lit(t, i), True)])
        for i in range(t):
            r, held, kept = r_lit(t, i), s_lit(t, i), s_lit(t + 1, i)
            used = [(r_lit(t, j), True) for j in users[i] if j <= t]
            if t + 1 < n:
                clause([(kept, False), (held, True), (r, True)])
            # dominance: the read-back form never recomputes a resident value, recomputes only what
            # is used later in the stage or held on, and holds only what is used or held on
            clause([(r, False), (held, False)])
            clause([(r, False), (kept, True)] + used)
            clause([(held, False), (kept, True)] + used)

    n_def: list = []
    for t in range(n):
        # needed[i]: (user j, literal "i is needed from j on") for the users of i that may run in t
        needed: dict[int, list] = {}
        for i in range(t):
            chain = []
            after = s_lit(t + 1, i)
            for j in reversed([j for j in users[i] if j <= t and runs[t, j]]):
                r = r_lit(t, j)
                if after is True or r is True:
                    lit = True
                elif after is False:
                    lit = r
                elif r is False:
                    lit = after
                else:
                    lit = m.NewBoolVar(f"N{t},{i},{j}")
                    m.Add(lit >= after)
                    m.Add(lit >= r)
                    n_def.append((lit, after, r))
                chain.append((j, lit))
                after = lit
            chain.reverse()
            needed[i] = chain
        for k in range(t + 1):
            if not runs[t, k]:
                continue
            terms: list = []
            const = 0

            def add(size: int, lit) -> None:
                nonlocal const
                if size == 0 or lit is False:
                    return
                if lit is True:
                    const += size
                else:
                    terms.append((size, lit))

            for i in range(k):
                lit = s_lit(t + 1, i)
                for j, need in needed[i]:
                    if j >= k:
                        lit = need
                        break
                add(int(mem[i]), lit)
            add(int(mem[k]), r_lit(t, k))
            for i in range(k, t):
                add(int(mem[i]), s_lit(t, i))
            if const + sum(a for a, _ in terms) <= cap:
                continue
            if const > cap:
                raise _Infeasible
            m.Add(sum(a * x for a, x in terms) <= cap - const)

    cost = graph.cost.astype(np.float64)
    step = cost_granularity(cost)
    weight = None if step is None else np.round(cost / step).astype(np.int64)
    if weight is not None and float(weight.sum()) * n < _EXACT_OBJECTIVE_MAX:
        # whole cost steps: CP-SAT's own integer objective, exact (its floating-point objective is
        # scaled internally and called a schedule 1e-6 above the optimum optimal on U-Net)
        cost_scale = float(step)
        integral = True
        m.Minimize(sum(int(weight[i]) * x for (t, i), x in r_var.items() if weight[i] > 0))
    else:
        positive = cost[cost > 0]
        cost_scale = float(positive.mean()) if positive.size else 1.0
        integral = False
        m.Minimize(sum(float(cost[i] / cost_scale) * x for (t, i), x in r_var.items() if cost[i] > 0))
    return _CpModel(m, r_var, s_var, n_def, cells.s_fixed, cost_scale, float(cost.sum()), integral)


class _Infeasible(Exception):
    """The budget leaves no schedule (a constant row of the model is violated)."""


def solve_cp_model(cpm: _CpModel, graph: "Graph", *, hint_retain: np.ndarray | None = None,
                   time_limit_s: float | None = None,
                   mip_gap: float = 1e-4, abs_gap: float | None = None, exact: bool = False) -> CpSatOutcome:
    """Solve a built model: stop at the relative ``mip_gap`` or an absolute gap below ``abs_gap`` (cost
    units); with ``exact`` and an objective in whole cost steps, only at the optimum itself (CP-SAT's
    proof is in integers; the gaps are then not used). ``hint_retain`` becomes a complete hint (its
    minimal R and liveness)."""
    from ortools.sat.python import cp_model

    from checkmate.schedule import minimal_recompute

    m = cpm.model
    if hint_retain is not None:
        S = np.asarray(hint_retain, dtype=bool)
        R = minimal_recompute(graph, S)
        value: dict[int, tuple] = {}
        for (t, i), x in cpm.s_var.items():
            value[x.Index()] = (x, bool(S[t, i]))
        for (t, i), x in cpm.r_var.items():
            value[x.Index()] = (x, bool(R[t, i]))

        def val(lit) -> bool:
            return lit if isinstance(lit, bool) else value[lit.Index()][1]

        for lit, after, r in cpm.n_def:
            value[lit.Index()] = (lit, val(after) or val(r))
        m.ClearHints()
        for x, v in value.values():
            m.AddHint(x, v)
    solver = cp_model.CpSolver()
    params = solver.parameters
    params.num_workers = _WORKERS
    params.linearization_level = _LINEARIZATION_LEVEL
    params.cp_model_presolve = _PRESOLVE
    params.use_objective_lb_search = _OBJECTIVE_LB_SEARCH
    params.exploit_best_solution = _EXPLOIT_BEST_SOLUTION
    for name in _SKIPPED_CUTS:
        setattr(params, name, False)
    if time_limit_s is not None:
        params.max_time_in_seconds = float(max(time_limit_s, 0.01))
    if exact and cpm.integral:
        # a relative gap of 1e-6 stopped SegNet at 1.1x the minimum one input's cost above the optimum
        params.relative_gap_limit = 0.0
        params.absolute_gap_limit = _EXACT_ABS_GAP_STEPS
    else:
        params.relative_gap_limit = float(mip_gap)
        if abs_gap is not None:
            params.absolute_gap_limit = float(abs_gap) / cpm.cost_scale
    start = time.perf_counter()
    status = solver.Solve(m)
    seconds = time.perf_counter() - start
    names = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible", cp_model.INFEASIBLE: "infeasible"}
    name = names.get(status, "no_solution")
    if name in ("optimal", "feasible"):
        S = cpm.s_fixed.copy()
        for (t, i), x in cpm.s_var.items():
            S[t, i] = bool(solver.Value(x))
        cost = solver.ObjectiveValue() * cpm.cost_scale + cpm.offset
        bound = solver.BestObjectiveBound() * cpm.cost_scale + cpm.offset
        return CpSatOutcome(S, name, cost, min(bound, cost), seconds)
    bound = None
    if status == cp_model.UNKNOWN and np.isfinite(solver.BestObjectiveBound()):
        bound = solver.BestObjectiveBound() * cpm.cost_scale + cpm.offset
    return CpSatOutcome(None, name, None, bound, seconds)


# ---------------------------------------------------------------------------------- the child
class CpSatChild:
    """A child process that builds the CP-SAT model of ``graph`` at ``budget_bytes`` at once and
    solves it when :meth:`solve` sends the hint; :meth:`result` is its answer once there (else
    None, polled without blocking: POSIX pipes); :meth:`close` kills it. Use as a context manager so
    that it is gone whatever happens."""

    def __init__(self, graph: "Graph", budget_bytes: int):
        env = dict(os.environ)
        # the child imports this package from where the caller imported it
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        # The child ends with its caller even when the caller is killed outright: _CHILD_START arms
        # the parent-death signal before the child's imports (a second or more), and _child_main
        # watches the parent too.
        self._proc = subprocess.Popen([sys.executable, "-c", _CHILD_START, str(os.getpid())],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                      env=env)
        self._result: CpSatOutcome | None = None
        self._done = False
        # The child reads its stdin only once its imports are done (seconds on a loaded machine), and a
        # message larger than the pipe's buffer (a graph of a few hundred nodes) would block the caller
        # until then, outside any time limit: a thread of its own writes the messages, in order.
        self._outbox: list[bytes | None] = []
        self._outbox_ready = threading.Condition()
        self._broken = False
        self._unsent = 0
        self._writer = threading.Thread(target=self._write_loop, name="cp-sat-child-writer", daemon=True)
        self._writer.start()
        self._send(("graph", graph, int(budget_bytes)))

    def _write_loop(self) -> None:
        while True:
            with self._outbox_ready:
                while not self._outbox:
                    self._outbox_ready.wait()
                data = self._outbox.pop(0)
            if data is None:      # closed
                return
            try:
                self._proc.stdin.write(data)
                self._proc.stdin.flush()
            except (BrokenPipeError, OSError, ValueError):
                self._broken = True
                return
            finally:
                with self._outbox_ready:
                    self._unsent -= 1
                    self._outbox_ready.notify_all()

    def delivered(self, timeout_s: float | None = None) -> bool:
        """Whether every message sent so far is in the child's pipe, waiting up to ``timeout_s``."""
        with self._outbox_ready:
            return self._outbox_ready.wait_for(lambda: self._unsent == 0 or self._broken, timeout_s) and \
                not self._broken

    def _send(self, message) -> bool:
        """Queue ``message`` for the child; False when the child is gone already."""
        if self._broken or self._proc.poll() is not None:
            return False
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        with self._outbox_ready:
            self._outbox.append(data)
            self._unsent += 1
            self._outbox_ready.notify_all()
        return True

    def _read(self, timeout_s: float | None) -> None:
        """Take the answer if it is there within ``timeout_s`` (it is written in one piece)."""
        if self._done:
            return
        try:
            ready, _, _ = select.select([self._proc.stdout], [], [], timeout_s)
        except (OSError, ValueError):   # closed, or a platform whose pipes select cannot watch
            return
        if not ready:
            return
        self._done = True
        try:
            self._result = CpSatOutcome(**pickle.load(self._proc.stdout))
        except (EOFError, OSError, pickle.UnpicklingError, ValueError, TypeError):
            self._result = None

    def solve(self, *, hint_retain, time_limit_s, mip_gap, abs_gap, exact: bool = False) -> bool:
        """Ask for the solve (see :func:`solve_cp_model`); False when the child is gone already."""
        return self._send(("solve", None if hint_retain is None else np.asarray(hint_retain, dtype=bool),
                           time_limit_s, mip_gap, abs_gap, exact))

    @property
    def pid(self) -> int:
        return self._proc.pid

    def result(self) -> CpSatOutcome | None:
        """The answer, if the child has given it (never blocks)."""
        self._read(0.0)
        return self._result

    def wait(self, timeout_s: float | None = None) -> CpSatOutcome | None:
        """The answer, waiting up to ``timeout_s`` for it (None: as long as it takes)."""
        self._read(timeout_s)
        return self._result

    def close(self) -> None:
        """Kill the child (if still running) and reap it."""
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        with self._outbox_ready:          # the writer ends (a write in progress fails on the dead pipe)
            self._outbox.append(None)
            self._outbox_ready.notify_all()
        for pipe in (self._proc.stdin, self._proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass

    def __enter__(self) -> "CpSatChild":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


# The child's first lines, run before anything is imported: on Linux the kernel kills it (SIGKILL) as
# soon as its parent ends; if the parent ended before that was armed, it ends at once. Then the module
# runs as ``python -m checkmate.solvers.cp_schedule`` would run it.
_CHILD_START = """
import os, sys
if sys.platform.startswith("linux"):
    try:
        import ctypes
        ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL
    except (OSError, AttributeError):
        pass
if os.getppid() != int(sys.argv[1]):
    os._exit(1)
import runpy
runpy.run_module("checkmate.solvers.cp_schedule", run_name="__main__", alter_sys=True)
"""


def _exit_when_input_closes(stdin) -> None:
    """The caller closed our input or died: nothing will read an answer, so stop at once."""
    try:
        while stdin.read(1 << 16):
            pass
    finally:
        os._exit(0)


def _child_main() -> int:
    die_with_parent()  # the model build below runs before the input-closed watch starts
    if hasattr(os, "nice"):
        os.nice(_CHILD_NICENESS)
    stdin = sys.stdin.buffer
    # answers go to the real stdout; anything native code prints goes to stderr instead
    answer = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    try:
        kind, graph, budget_bytes = pickle.load(stdin)
    except (EOFError, pickle.UnpicklingError):
        return 0
    try:
        cpm = build_cp_model(graph, budget_bytes)
        failure = None
    except _Infeasible:
        cpm, failure = None, CpSatOutcome(None, "infeasible", None, None, 0.0)
    try:
        kind, hint, limit, gap, abs_gap, exact = pickle.load(stdin)
    except (EOFError, pickle.UnpicklingError):
        return 0
    threading.Thread(target=_exit_when_input_closes, args=(stdin,), daemon=True).start()
    if failure is not None:
        outcome = failure
    else:
        try:
            outcome = solve_cp_model(cpm, graph, hint_retain=hint, time_limit_s=limit, mip_gap=gap,
                                     abs_gap=abs_gap, exact=exact)
        except Exception as exc:   # reported to the caller, who falls back on HiGHS alone
            outcome = CpSatOutcome(None, "error", None, None, 0.0, error=f"{type(exc).__name__}: {exc}")
    # as a dict: the child runs as __main__, where the class would be looked up by the caller
    pickle.dump(dataclasses.asdict(outcome), answer, protocol=pickle.HIGHEST_PROTOCOL)
    answer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(_child_main())
