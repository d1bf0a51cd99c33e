"""The default strategy: the exact MILP where it is fast, the hierarchical strategy beyond, and the best
classic baseline as a floor.

``auto`` runs the cheap baselines first (each answers in seconds on graphs of a few thousand nodes;
together they get at most :data:`FLOOR_TIME_SHARE` of the time limit, and one that runs out of it is
skipped), then the strategy that suits the graph's size within the time left, and returns the
cheapest replayed schedule that fits. Its ``status`` names the strategy whose schedule it returns. When nothing fits,
the :class:`InfeasibleBudgetError` names the smallest budget at which one of them succeeds.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from checkmate._deadline import deadline_scope, no_deadline
from checkmate.bounds import cost_lower_bound
from checkmate.errors import CheckmateError, InfeasibleBudgetError, SolverError, TimeLimitError
from checkmate.simulate import simulate
from checkmate.solvers.registry import STRATEGIES
from checkmate.solvers.types import SolveOptions, StrategyOutput, relative_gap, within_words

if TYPE_CHECKING:  # pragma: no cover
    from checkmate.graph import Graph

__all__ = ["auto", "AUTO_MILP_MAX_NODES", "FLOOR_STRATEGIES", "AUTO_FLAT_FALLBACK_MAX_NODES", "AUTO_TARGET_GAP"]

# Beyond this size the flat MILP's O(n^2) model is far slower than the hierarchical strategy.
# Measured: experiments/results/README.md, section i.
AUTO_MILP_MAX_NODES = 160
# Long skips cross every cut the hierarchical strategy can make: up to this size the flat MILP then
# gets the time left; beyond, it overran its time limit. Measured: experiments/results/README.md, section i.
AUTO_FLAT_FALLBACK_MAX_NODES = 2 * AUTO_MILP_MAX_NODES
# From this size the hierarchical strategy runs first: the flat MILP under a time limit can stop far
# from its bound. The MILP gets the time left only when that plan misses AUTO_TARGET_GAP. Measured: experiments/results/README.md, section i.
AUTO_HIERARCHICAL_FIRST_MIN_NODES = 80
# The hierarchical plan is good enough when it is within this share of its proven lower bound.
AUTO_TARGET_GAP = 0.02
# The fallback is not started with less time left than this.
AUTO_FALLBACK_MIN_SECONDS = 5.0
# The baselines that form the floor (the budget-aware ones search their whole family for the budget);
# the linearized Chen greedy fits U-Net budgets the others refuse. Measured: experiments/results/README.md, section i.
FLOOR_STRATEGIES = ("checkpoint_all", "chen_greedy", "chen_greedy_linearized", "griewank_logn",
                    "checkpoint_last_node")
# The share of the time limit the floor may take, all of its strategies together: the rest is left to
# the main strategy. (On graphs of many thousand nodes a baseline's quadratic schedule alone can take
# minutes; one that does not finish in its share is skipped.)
FLOOR_TIME_SHARE = 0.4

_logger = logging.getLogger("checkmate")


def auto(graph: "Graph", budget_bytes: int, options: "SolveOptions") -> "StrategyOutput":
    start = time.perf_counter()
    deadline = None if options.time_limit_s is None else start + float(options.time_limit_s)
    results: list[tuple[float, str, "StrategyOutput"]] = []
    minimums: list[int] = []
    timed_out: list[str] = []

    def attempt(name: str, opts: "SolveOptions", until: float | None = None) -> None:
        try:
            with deadline_scope(until, what=name):
                out = STRATEGIES[name].fn(graph, budget_bytes, opts)
        except InfeasibleBudgetError as exc:
            if exc.min_feasible_budget_bytes is not None:
                minimums.append(int(exc.min_feasible_budget_bytes))
            return
        except TimeLimitError:
            timed_out.append(name)
            _logger.info("auto: %s did not finish within its share of the time limit", name)
            return
        except SolverError as exc:
            _logger.info("auto: %s failed (%s)", name, exc)
            return
        except CheckmateError as exc:
            # a baseline that does not apply to this graph (griewank_logn on a graph of backward
            # nodes only, say): the others still answer
            _logger.info("auto: %s does not apply (%s)", name, exc)
            return
        if out.schedule is None:
            return
        with no_deadline():  # the check of a finished schedule is never cut short
            sim = simulate(graph, out.schedule)
        if not sim.valid:
            return
        if sim.peak_memory_bytes > budget_bytes:
            minimums.append(sim.peak_memory_bytes)
            return
        results.append((sim.compute_cost, name, out))
        _logger.info("auto: %s fits at overhead %.4fx (%.1f s)", name,
                     sim.compute_cost / graph.total_cost if graph.total_cost > 0 else 1.0, time.perf_counter() - start)

    base_opts = replace(options, time_limit_s=None)
    floor_until = None if deadline is None else start + FLOOR_TIME_SHARE * float(options.time_limit_s)
    for name in FLOOR_STRATEGIES:
        attempt(name, base_opts, floor_until)
    main = "checkmate_milp" if graph.n <= AUTO_MILP_MAX_NODES else "hierarchical"
    left = None if deadline is None else max(deadline - time.perf_counter(), 1.0)
    best_floor = min(results, key=lambda r: r[0]) if results else None
    if best_floor is None or best_floor[0] > graph.total_cost * (1 + 1e-12):
        if main == "checkmate_milp" and graph.n >= AUTO_HIERARCHICAL_FIRST_MIN_NODES:
            attempt("hierarchical", replace(options, time_limit_s=left))
            left = None if deadline is None else deadline - time.perf_counter()
            if _short_of_target(graph, results, "hierarchical") and (left is None or left >= AUTO_FALLBACK_MIN_SECONDS):
                attempt(main, replace(options, time_limit_s=left))
        else:
            attempt(main, replace(options, time_limit_s=left))
        if main == "hierarchical" and graph.n <= AUTO_FLAT_FALLBACK_MAX_NODES and _short_of_target(graph, results, main):
            left = None if deadline is None else deadline - time.perf_counter()
            if left is None or left >= AUTO_FALLBACK_MIN_SECONDS:
                _logger.info("auto: the hierarchical plan is missing or not within %.0f%% of its bound: flat MILP "
                             "with the time left", 100 * AUTO_TARGET_GAP)
                attempt("checkmate_milp", replace(options, time_limit_s=left))
    if not results and timed_out:
        # a strategy that ran out of time may have fitted: the budget is not known to be infeasible,
        # and a minimum found by the others is only an upper bound
        known = (f"; the smallest budget known to fit is {min(minimums)} bytes" if minimums else "")
        raise TimeLimitError(f"auto: no strategy found a schedule within the time limit of {options.time_limit_s:g} s "
                             f"({', '.join(timed_out)} ran out of time){known}; raise the time limit")
    if not results:
        minimum = min(minimums) if minimums else None
        raise InfeasibleBudgetError(
            f"auto: no schedule fits in {budget_bytes} bytes"
            + (f"; the minimum feasible budget found is {minimum} bytes" if minimum is not None else ""),
            budget_bytes=budget_bytes, min_feasible_budget_bytes=minimum, strategy="auto")
    cost, name, out = min(results, key=lambda r: (r[0], r[1] != main))
    status = f"{name}: {out.status}" if out.status and out.status != "ok" else name
    # the memory at each node's first run forces a least recomputation (it includes every node once)
    lower = max([min(cost_lower_bound(graph, budget_bytes), cost),
                 *(r[2].lower_bound for r in results if r[2].lower_bound is not None)])
    optimal = out.optimal or cost <= lower * (1 + 1e-12)
    if optimal and not out.optimal:
        status = f"{name}: optimal (its cost meets the proven lower bound)"
    elif not optimal and "within" not in status:
        status += f"; {within_words(relative_gap(cost, lower))}"
    return StrategyOutput(out.schedule, lower_bound=lower, optimal=optimal, status=status,
                          solver=out.solver)


def _short_of_target(graph: "Graph", results: list, main: str) -> bool:
    """Whether ``main`` found no schedule, or one further than :data:`AUTO_TARGET_GAP` from its bound."""
    found = [r for r in results if r[1] == main]
    if not found:
        return True
    cost, _, out = found[0]
    lower = out.lower_bound if out.lower_bound is not None else graph.total_cost
    return relative_gap(cost, lower) > AUTO_TARGET_GAP
