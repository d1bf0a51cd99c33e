"""HiGHS through highspy, without a modelling layer: the CSR model is handed over as arrays."""

from __future__ import annotations

import threading
import time

import numpy as np

from checkmate.errors import SolverError
from checkmate.solvers.backends.base import (FEASIBLE, INFEASIBLE, OPTIMAL, Backend, BackendResult, quiet_stdout,
                                             require_package)
from checkmate.solvers.types import PROVEN_MIP_GAP

__all__ = ["HighsBackend"]


# Six times HiGHS' share of heuristics: with the flow rows hard instances wait on incumbents.
# Measured: experiments/results/README.md, section i.
_MIP_DEFAULTS = {"mip_heuristic_effort": 0.3}
# A cutoff marks a yes/no question under a time limit, and MIP presolve ignores the limit.
# Measured: experiments/results/README.md, section i.
_CUTOFF_OPTIONS = {"presolve": "off"}


class HighsBackend(Backend):
    name = "highs"
    label = "highs"
    mip_capable = True
    supports_mip_start = True
    supports_stop = True
    reports_bounds = True
    supports_cutoff = True
    takes_solver_options = True

    def check_available(self) -> None:
        require_package("highspy", "highspy", self.name)

    def status_map(self):
        import highspy

        ms = highspy.HighsModelStatus
        stopped = (ms.kTimeLimit, ms.kIterationLimit, ms.kSolutionLimit, ms.kInterrupt, ms.kObjectiveBound,
                   ms.kObjectiveTarget)
        # every column is bounded, so "unbounded or infeasible" can only mean infeasible
        return {ms.kOptimal: OPTIMAL, ms.kInfeasible: INFEASIBLE, ms.kUnboundedOrInfeasible: INFEASIBLE,
                **{status: FEASIBLE for status in stopped}}

    def solve(self, model, *, time_limit_s=None, mip_gap=PROVEN_MIP_GAP, threads=None, verbose=False, mip_start=None,
              cutoff=None, target=None, stop=None, on_bounds=None, solver_options=None):
        """As :meth:`Backend.solve`. ``stop`` and ``on_bounds`` act from HiGHS' branch-and-bound
        interrupt callback, the only place where HiGHS can be stopped. ``cutoff`` and ``target`` are
        HiGHS' ``objective_bound`` and ``objective_target``; with a cutoff, MIP presolve is off (see
        ``_CUTOFF_OPTIONS``). ``solver_options`` are HiGHS options by name."""
        options = dict(solver_options or {})
        if cutoff is not None:
            options = {**_CUTOFF_OPTIONS, "objective_bound": float(cutoff), **options}
        if target is not None:
            options = {"objective_target": float(target), **options}
        # one solve at a time per process: a solve told to stop from another thread (a race) may run
        # on to its next callback, and HiGHS' task scheduler is shared by the process
        with _ONE_SOLVE_AT_A_TIME:
            return self._solve_once(model, time_limit_s, mip_gap, threads, verbose, mip_start, options or None,
                                    stop, on_bounds)

    def _solve_once(self, model, time_limit_s, mip_gap, threads, verbose, mip_start, solver_options, stop,
                    on_bounds):
        began = time.perf_counter()
        if on_bounds is not None or stop is not None:
            stop = _with_bounds(stop, on_bounds)
        result = self._solve(model, time_limit_s, mip_gap, threads, verbose, mip_start, solver_options, stop)
        if mip_start is not None and result.x is not None and result.objective is not None:
            # HiGHS 1.16 can report the optimum of its presolved model yet hand back the MIP start
            # after postsolve. Trust only what the returned vector achieves; when it falls short of
            # the reported objective, solve again without the start.
            achieved = float(model.c @ result.x + model.offset)
            if achieved > result.objective + 1e-6 * max(1.0, abs(result.objective)):
                left = None if time_limit_s is None else time_limit_s - (time.perf_counter() - began)
                if left is None or left > 0.05:
                    retry = self._solve(model, left, mip_gap, threads, verbose, None, solver_options, stop)
                    if retry.x is not None:
                        return retry
                result.objective = achieved
        return result

    def _solve(self, model, time_limit_s, mip_gap, threads, verbose, mip_start, solver_options, stop):
        import highspy

        inf = highspy.kHighsInf
        # the banner comes with the process's first instance only; later instances made outside the
        # main thread (branch and bound beside a race) leave stdout alone, which the caller's thread
        # may be writing to by then
        first = not _instance_made[0]
        with quiet_stdout(not verbose and (first or threading.current_thread() is threading.main_thread())):
            h = highspy.Highs()
        _instance_made[0] = True
        h.setOptionValue("output_flag", bool(verbose))
        if time_limit_s is not None:
            h.setOptionValue("time_limit", float(max(time_limit_s, 0.01)))
        h.setOptionValue("mip_rel_gap", float(mip_gap))
        if model.proof_abs_gap is not None:
            h.setOptionValue("mip_abs_gap", float(model.proof_abs_gap))
        _use_threads(highspy, h, threads)
        options = dict(_MIP_DEFAULTS) if model.integer.any() else {}
        options.update(solver_options or {})
        for key, value in options.items():
            if h.setOptionValue(key, value) != highspy.HighsStatus.kOk:
                raise SolverError(f"HiGHS rejected option {key}={value!r}")

        lp = highspy.HighsLp()
        lp.num_col_ = model.num_cols
        lp.num_row_ = model.num_rows
        lp.col_cost_ = model.c
        lp.offset_ = float(model.offset)
        lp.col_lower_ = np.where(np.isfinite(model.col_lo), model.col_lo, -inf)
        lp.col_upper_ = np.where(np.isfinite(model.col_hi), model.col_hi, inf)
        lp.row_lower_ = np.where(np.isfinite(model.row_lo), model.row_lo, -inf)
        lp.row_upper_ = np.where(np.isfinite(model.row_hi), model.row_hi, inf)
        A = model.A.tocsc()
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_ = A.indptr.astype(np.int32)
        lp.a_matrix_.index_ = A.indices.astype(np.int32)
        lp.a_matrix_.value_ = A.data
        is_mip = bool(model.integer.any())
        if is_mip:
            lp.integrality_ = [highspy.HighsVarType.kInteger if flag else highspy.HighsVarType.kContinuous
                               for flag in model.integer]
        status = h.passModel(lp)
        if status == highspy.HighsStatus.kError:
            raise SolverError("HiGHS refused the model (passModel failed)")
        if mip_start is not None and is_mip:
            sol = highspy.HighsSolution()
            sol.col_value = list(np.asarray(mip_start, dtype=np.float64))
            sol.value_valid = True
            h.setSolution(sol)

        start = time.perf_counter()
        run_status = h.run() if stop is None else _run_until(h, stop)
        seconds = time.perf_counter() - start
        model_status = h.getModelStatus()
        info = h.getInfo()
        name = h.modelStatusToString(model_status)
        if run_status == highspy.HighsStatus.kError and model_status not in (
                highspy.HighsModelStatus.kInfeasible, highspy.HighsModelStatus.kTimeLimit):
            raise SolverError(f"HiGHS failed: {name}")
        has_solution = info.primal_solution_status == 2  # kSolutionStatusFeasible
        x = np.array(h.getSolution().col_value, dtype=np.float64) if has_solution else None
        objective = float(info.objective_function_value) if has_solution else None
        if is_mip:
            bound = float(info.mip_dual_bound) if np.isfinite(info.mip_dual_bound) else None
        else:
            bound = objective
        out = self.outcome(model_status, has_solution, f"HiGHS stopped with status {name!r}")
        return BackendResult(out, x, objective, bound, solver="highs", message=name, seconds=seconds)


def _with_bounds(stop, on_bounds):
    """A ``stop(data_out)`` for :func:`_run_until`: polls ``stop()`` and reports the callback's bounds."""
    def check(data_out) -> bool:
        if on_bounds is not None:
            on_bounds(float(data_out.mip_primal_bound), float(data_out.mip_dual_bound))
        return bool(stop()) if stop is not None else False
    return check


def _run_until(h, stop):
    """Run HiGHS with ``stop(data_out)`` (the callback's data) polled from its branch-and-bound
    interrupt callback: HiGHS can only be stopped from there (highspy's run releases the interpreter
    lock, so another thread may decide meanwhile, but only the callback can act on it).

    Ctrl-C during the solve interrupts it there and is raised once HiGHS has returned. In the main
    thread SIGINT is only recorded while HiGHS runs (a KeyboardInterrupt raised inside the callback
    can escape into highspy's own code, which then reports a solve error and drops it); elsewhere a
    KeyboardInterrupt in the callback is caught as well as it can be.
    """
    import signal
    import threading

    interrupted = []

    def record(signum, frame) -> None:
        interrupted.append(True)

    def check(event) -> None:
        try:
            if interrupted or stop(event.data_out):
                event.interrupt()
        except KeyboardInterrupt:
            interrupted.append(True)
            event.interrupt()

    previous = None
    if threading.current_thread() is threading.main_thread() \
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        previous = signal.signal(signal.SIGINT, record)
    h.cbMipInterrupt.subscribe(check)
    try:
        status = h.run()
    finally:
        h.cbMipInterrupt.unsubscribe(check)
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    if interrupted:
        raise KeyboardInterrupt
    return status


_ONE_SOLVE_AT_A_TIME = threading.RLock()
_instance_made = [False]

# HiGHS runs every instance of a process on one global task scheduler, sized by the first solve;
# a later solve asking for another thread count, or made from another thread, fails with status
# "Not Set" (highspy 1.16). Reset the scheduler whenever either changes (solves in one process run
# one at a time).
_NOT_STARTED = object()
_scheduler_threads: list = [_NOT_STARTED]
_scheduler_owner: list = [None]


def _use_threads(highspy, h, threads) -> None:
    wanted = int(threads) if threads else None
    if wanted is not None:
        h.setOptionValue("threads", wanted)
    # the scheduler also belongs to the thread that made it: a solve from another thread (branch and
    # bound beside a race runs in a worker thread) with the same count failed with "Not Set" too
    here = threading.get_ident()
    if _scheduler_threads[0] is not _NOT_STARTED and (wanted != _scheduler_threads[0] or here != _scheduler_owner[0]):
        highspy.Highs.resetGlobalScheduler(True)
    _scheduler_threads[0] = wanted
    _scheduler_owner[0] = here
