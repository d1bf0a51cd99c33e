"""The default strategy: the exact MILP where it is fast, the hierarchical strategy beyond, and the best
classic baseline as a floor.

On graphs the flat MILP solves (up to :data:`AUTO_MILP_MAX_NODES` nodes) ``auto`` runs the cheap
baselines first (together they get at most :data:`FLOOR_TIME_SHARE` of the time limit, and one that
runs out of it is skipped), then the MILP within the time left. Beyond, the hierarchical plan is the
strong candidate and the baselines' quadratic schedules (seconds each on graphs of a few thousand
nodes) the weak ones: checkpoint-all runs first (if it fits nothing is recomputed), then the
hierarchical strategy with :data:`PLAN_FIRST_TIME_SHARE` of the time left, then the other baselines
in what it leaves, so that a machine that gives the solver less CPU cuts the baselines short, not the
plan. ``auto`` returns the cheapest replayed schedule that fits.

Every stage stops at the time limit; what runs after it is the replay and the checks of the result
found (:func:`checkmate.solve` cuts a strategy without a solver of its own at 10% of the limit plus
2 s past it). Its ``status`` names the strategy whose schedule it returns. When nothing fits,
the :class:`InfeasibleBudgetError` names the smallest budget at which one of them succeeds.

Two passes work on whole schedules whatever the graph's structure. When no baseline fits, the
schedules closest to the budget (each baseline's least peak, then checkpoint-all's) are *repaired*:
holds are dropped at the replayed peak, cheapest per byte first, until the peak fits
(:func:`~checkmate.solvers.rounding.repair_to_budget`). This finds schedules at budgets that every
structured strategy refuses (language models at 50% of checkpoint-all, where a vocabulary-sized
loss and wide feed-forward values make one level of recomputation per block too coarse), before
the MILP runs (beyond its sizes, after the plan and the baselines), so that a time limit never
leaves auto without a schedule that is cheap to find. On graphs of up to
:data:`AUTO_DROP_START_MAX_NODES` nodes, when no schedule is within :data:`AUTO_TARGET_GAP` of the
proven bound, checkpoint-all itself is repaired to the budget the same way and refined at once: long
skips and dense concatenations defeat the structured strategies, not this. It runs before the flat
MILP (which starts from the best schedule found), and beyond the flat MILP's sizes right after a
hierarchical plan that misses the target, before the quadratic baselines (in
:data:`EARLY_DROP_TIME_SHARE` of the time left), so that a time limit does not leave it none. When
nothing fits, the least peak that a repair reaches is among the minimums the error names. A
hierarchical plan that misses the budget (its menus cut short on a loaded machine, or one level of
recomputation short of it) hands over the programme it plans for its least peak and its least-peak
programme, which are repaired (cheapest first) and refined the same way in that share of the time
left. The time left at the end *refines* the best schedule: recomputations are replaced by holds while the peak
still fits (:func:`~checkmate.solvers.rounding.improve_by_holding`), and where that stops further
than :data:`AUTO_TARGET_GAP` from the bound (dense blocks, where every single hold left breaks the
budget), holds are exchanged for drops at the peak they raise
(:func:`~checkmate.solvers.rounding.hold_and_repair`) for up to :data:`EXCHANGE_TIME_FACTOR` times
:data:`REFINE_MAX_S` more; they end once within the target gap, or once no exchange of the schedule
gains.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
import time
from collections import OrderedDict

import numpy as np
from dataclasses import replace
from typing import TYPE_CHECKING

from checkmate._deadline import deadline_scope, no_deadline, seconds_left
from checkmate.bounds import INTEGER_BOUND_TIME_S, cost_lower_bound
from checkmate.errors import CheckmateError, InfeasibleBudgetError, SolverError, TimeLimitError
from checkmate.bounds import checkpoint_all_schedule, largest_working_set_bytes, peak_floor
from checkmate.simulate import simulate
from checkmate.solvers.candidates import Candidate, evaluate
from checkmate.solvers.registry import STRATEGIES
from checkmate.solvers.rounding import hold_and_repair, improve_by_holding, repair_to_budget
from checkmate.solvers.types import SolveOptions, StrategyOutput, relative_gap, within_words

if TYPE_CHECKING:  # pragma: no cover
    from checkmate.graph import Graph
    from checkmate.schedule import Schedule

__all__ = ["auto", "AUTO_MILP_MAX_NODES", "FLOOR_STRATEGIES", "AUTO_FLAT_FALLBACK_MAX_NODES", "AUTO_TARGET_GAP",
           "AUTO_DROP_START_MAX_NODES", "PLAN_FIRST_TIME_SHARE", "REPAIR_TIME_SHARE", "REPAIR_MAX_S",
           "REFINE_TIME_SHARE", "REFINE_MAX_S", "REFINE_MAX_NODES", "EARLY_DROP_TIME_SHARE",
           "PLAN_REPAIR_MAX_EXCESS", "PLAN_LATE_REPAIR_MAX_EXCESS", "EXCHANGE_COST_DRAWS", "EXCHANGE_TIME_FACTOR"]

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
# Up to this size, when no schedule is within AUTO_TARGET_GAP of the bound, the holds of checkpoint-all
# are dropped at the peak, cheapest per byte, until it fits (U-Nets of 326 and 446 nodes at 40-50%:
# 1.04x against 1.15-1.31x from the structured strategies). A drop searches and replays only the
# stages that read the value: from checkpoint-all on one core, DenseNet121's graph (1580 nodes) at
# 60% in 6 s, InceptionResNetV2's (2867) at 50% of its activations in 9 s, NASNetMobile's (2621) at
# 70% in 23 s. Beyond, a drop copies matrices of tens of MB, as the refinement's moves do.
# Measured: experiments/results/README.md, section i.
AUTO_DROP_START_MAX_NODES = 4000
# On graphs beyond the flat MILP whose plan misses AUTO_TARGET_GAP, the share of the time left that
# the drops from checkpoint-all may take before the rest of the floor runs (a drop that does not finish
# leaves the floor the other half). Measured: experiments/results/README.md, section i.
EARLY_DROP_TIME_SHARE = 0.5
# A refused hierarchical plan's least-peak programme is repaired only when it peaks at most this share
# above the budget: DenseNet121's graph at 60% on a loaded machine, 1.036x, repaired and refined to
# 1.079x; at 50%, 1.15x, the repair cannot meet the budget and its time left the floor's repair none
# (no minimum named). Measured: experiments/results/README.md, section i.
PLAN_REPAIR_MAX_EXCESS = 0.05
# ... and, once some schedule is known and none is within AUTO_TARGET_GAP of the bound, when it peaks
# at most this share above the budget (in the time left short of the refinement's reserve: the floor
# has run, and a repair that fails costs no answer): KerasHub's Qwen-MoE (479 nodes, an expert block's
# backward reads 28 MB of its own values) at 50%, the plan's least peak 1.24x the budget, repaired
# and refined to 1.184x (2.0% from the bound) against 1.241x from the drops from checkpoint-all;
# Qwen3-MoE and DenseNet121 (60%, 55%, 50%) unchanged. Measured: experiments/results/solver_quality_late.md.
PLAN_LATE_REPAIR_MAX_EXCESS = 0.5
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
# On graphs beyond the flat MILP, the share of the time left (after checkpoint-all) that the
# hierarchical strategy gets before the rest of the floor runs. It plans in about half of its limit
# (its menus of longer groups stop there) and needs that much of one core to plan at all: on a
# loaded machine the floor then runs in what it leaves. Measured: experiments/results/README.md, section i.
PLAN_FIRST_TIME_SHARE = 0.7
# When no baseline fits: the share of the time limit (from auto's start) by which the repair of the
# schedules closest to the budget must be done. GPT-2, Llama, BERT and ViT graphs of ~150 nodes at 50%
# repair in 1-15 s on a loaded 2-core machine. Measured: experiments/results/README.md, section i.
REPAIR_TIME_SHARE = 0.5
# ... and at most this long whatever the limit (solve's default limit is ten minutes): the repairs
# measured take 1-15 s, one still going after a minute is on a graph too large for it.
# Measured: experiments/results/README.md, section i.
REPAIR_MAX_S = 60.0
# The share of the time limit kept back from the main strategy for the refinement of the best
# schedule (when a schedule is already known; the main strategy otherwise gets all of it).
# Measured: experiments/results/README.md, section i.
REFINE_TIME_SHARE = 0.25
# The refinement copies several n x n matrices per move (16 MB each at 4000 nodes, 100 MB at 10,000):
# beyond this size one move could overrun the time limit, and the pass is skipped.
REFINE_MAX_NODES = 4000
# The refinement runs at most this long (with the time left), and the exchanges of holds after it,
# when it stops short of the target gap, as long again: most of its gains come in the first 10-20 s,
# and solve's default limit of ten minutes must not make every unproven answer wait longer.
# Measured: experiments/results/README.md, section i.
REFINE_MAX_S = 20.0
# The exchanges of holds after the refinement (only while it is short of AUTO_TARGET_GAP) run up to
# this many times REFINE_MAX_S (never past the time limit; they end once within the target, or once
# every exchange of the schedule failed): on the 326-node diffusion U-Net at 30% under a 150 s limit,
# 1.0694x (1.87% from the bound) after 115 s in all, against 1.0792x with a factor of 3; the search's
# gains on it come after 90 s or more of exchanges.
# Measured: experiments/results/README.md, section i.
EXCHANGE_TIME_FACTOR = 6.0
# The share of the exchanges' draws made in proportion to the recomputation's cost (the rest
# uniformly): by cost gained more on a diffusion U-Net, uniformly on DenseNet121's graph.
# Measured: experiments/results/README.md, section i.
EXCHANGE_COST_DRAWS = 0.5

_logger = logging.getLogger("checkmate")

# The least-peak schedule a refused budget's answer named, per graph (its memory structure), for the
# graphs solved last in this process: a solve at that budget (the minimum the error named) then
# starts with it, and gets it even when its own time-limited repair stops above it (a machine busy
# with other work). Peaks depend on sizes, edges and flags only, not costs.
_LEAST_PEAK_SCHEDULES: "OrderedDict[str, tuple[int, Schedule]]" = OrderedDict()
LEAST_PEAK_GRAPHS_KEPT = 16


def _memory_key(graph: "Graph") -> str:
    h = hashlib.sha256(f"{graph.n}|{int(graph.fixed_mem)}".encode())
    for part, dtype in ((graph.mem, np.int64), (graph.edges, np.int64), (graph.backward, np.uint8),
                        (graph.output, np.uint8), (graph.recomputable, np.uint8)):
        h.update(np.ascontiguousarray(np.asarray(part, dtype=dtype)).tobytes())
    return h.hexdigest()


def _remember_least_peak(graph: "Graph", fits: list) -> None:
    if not fits:
        return
    peak, schedule = min(fits, key=lambda f: f[0])
    key = _memory_key(graph)
    known = _LEAST_PEAK_SCHEDULES.get(key)
    if known is None or peak < known[0]:
        _LEAST_PEAK_SCHEDULES[key] = (int(peak), schedule)
    _LEAST_PEAK_SCHEDULES.move_to_end(key)
    while len(_LEAST_PEAK_SCHEDULES) > LEAST_PEAK_GRAPHS_KEPT:
        _LEAST_PEAK_SCHEDULES.popitem(last=False)


def _known_least_peak(graph: "Graph", budget_bytes: int) -> "Schedule | None":
    known = _LEAST_PEAK_SCHEDULES.get(_memory_key(graph))
    return known[1] if known is not None and known[0] <= budget_bytes else None


def auto(graph: "Graph", budget_bytes: int, options: "SolveOptions") -> "StrategyOutput":
    start = time.perf_counter()
    deadline = None if options.time_limit_s is None else start + float(options.time_limit_s)
    results: list[tuple[float, str, "StrategyOutput"]] = []
    minimums: list[int] = []
    timed_out: list[str] = []
    over: list[tuple[int, str, "Schedule"]] = []        # schedules that replayed above the budget
    fits: list[tuple[int, "Schedule"]] = []             # the repairs' least-peak schedules, with their peaks
    floor_minimums: list[tuple[int, str]] = []          # a floor strategy's least peak, when it refused
    memo: list[float] = []

    def memory_bound() -> float:
        """:func:`cost_lower_bound`, computed once: over a second of CPU on graphs of a few thousand
        nodes, and needed after the time limit for the answer's bound (never cut short there)."""
        if not memo:
            with no_deadline():
                memo.append(cost_lower_bound(graph, budget_bytes))
        return memo[0]

    def plan_bound() -> float:
        """:func:`memory_bound` as the hierarchical strategy computes its own bound: within its time
        limit (a :class:`TimeLimitError` reaches it). Kept for auto only when the integer programme had
        its whole time (one cut short is valid but weaker)."""
        if memo:
            return memo[0]
        left = seconds_left()
        found = cost_lower_bound(graph, budget_bytes)
        if left is None or left > INTEGER_BOUND_TIME_S + 1.0:
            memo.append(found)
        return found

    def attempt(name: str, opts: "SolveOptions", until: float | None = None, **extra) -> None:
        if name == "checkmate_milp" and results and "starts" not in extra:
            # the best schedule so far (a repaired one where every baseline refuses) is an incumbent:
            # without it the MILP starts from its own roundings, which on GPT-2's graph at 50% were
            # still at 2.09x after 600 s, against 1.43x repaired and refined
            cost, source, found = min(results, key=lambda r: r[0])
            with no_deadline():
                start_candidate = evaluate(graph, found.schedule, source)
            if start_candidate is not None:
                extra["starts"] = [start_candidate]
        if name == "hierarchical":
            extra.setdefault("memory_bound", plan_bound)
        try:
            with deadline_scope(until, what=name):
                out = STRATEGIES[name].fn(graph, budget_bytes, opts, **extra)
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
            over.append((sim.peak_memory_bytes, name, out.schedule))
            return
        results.append((sim.compute_cost, name, out))
        _logger.info("auto: %s fits at overhead %.4fx (%.1f s)", name,
                     sim.compute_cost / graph.total_cost if graph.total_cost > 0 else 1.0, time.perf_counter() - start)

    reserve = 0.0
    dropped_from: list[str] = []      # "checkpoint_all" once the drops from it have run to their end
    drops_reached: list = []          # the least-peak schedule of drops cut short by their time share

    def drop_from_checkpoint_all(share: float = 1.0) -> None:
        """Long skips and dense concatenations: drops of holds at the peak, cheapest per byte, from
        checkpoint-all (the repair above) land far closer to the bound than the structured strategies
        and, under a time limit, the flat MILP. Run when no schedule is within the target gap yet,
        within ``share`` of the time left (short of the refinement's reserve)."""
        if (graph.n > AUTO_DROP_START_MAX_NODES or budget_bytes < largest_working_set_bytes(graph)
                or dropped_from or any(r[1] == "checkpoint_all" for r in results)):
            return
        until = None if deadline is None else deadline - reserve
        # the time left is asked first: the bound takes seconds on graphs of thousands of nodes, and
        # is not cut short (a 3004-node graph at a limit of 8 s overran it by 10 s on a loaded machine)
        if until is not None and until - time.perf_counter() < AUTO_FALLBACK_MIN_SECONDS:
            return
        if not memo and results and until is not None:
            # the bound, not known yet, within the time the drops would have (7 s at 3964 nodes on an
            # idle core): where it cannot finish, neither could they
            try:
                with deadline_scope(until, what="the memory bound"):
                    found = cost_lower_bound(graph, budget_bytes)
            except TimeLimitError:
                _logger.info("auto: no time left for the memory bound that decides the drops from checkpoint-all")
                return
            memo.append(found)
        if not _short_of_bound(graph, memory_bound, results):
            return
        if until is not None:
            until = time.perf_counter() + share * (until - time.perf_counter())
        _logger.info("auto: no schedule within %.0f%% of the bound: holds dropped from checkpoint-all",
                     100 * AUTO_TARGET_GAP)
        # drops cut short by their share resume where they stopped (each drop lowers the peak: the
        # least-peak schedule reached is the one to go on from)
        resume = [(c.peak_bytes, "checkpoint_all", c.schedule) for c in drops_reached[-1:] if c is not None]
        reached: list = []
        dropped = _repair(graph, budget_bytes, [], resume, until, lowest=reached)
        if dropped is None and share < 1.0 and reached and (until is None or time.perf_counter() >= until):
            drops_reached[:] = reached[-1:]
        else:
            dropped_from.append("checkpoint_all")
        if dropped is not None:
            # refined at once: the drops alone recompute far more than needed (1.22x against 1.065x
            # refined on a 54-node U-Net at 60%), and the refinement takes seconds at these sizes
            refined = _refine(graph, budget_bytes, dropped[2], dropped[0], until)
            if refined is not None:
                dropped = (refined[0], dropped[1], refined[1])
        if dropped is not None and dropped[0] < min((r[0] for r in results), default=math.inf):
            results.append(dropped)
            _logger.info("auto: %s fits at overhead %.4fx (%.1f s)", dropped[2].status,
                         dropped[0] / graph.total_cost if graph.total_cost > 0 else 1.0, time.perf_counter() - start)

    base_opts = replace(options, time_limit_s=None)
    main = "checkmate_milp" if graph.n <= AUTO_MILP_MAX_NODES else "hierarchical"
    # On graphs beyond the flat MILP the hierarchical plan is the strong candidate and the floor's
    # quadratic baselines the weak ones: the plan runs first, after checkpoint-all (linear), so that
    # a machine that gives this process less CPU cuts the floor short, not the plan. When the floor
    # ran first under a wall-clock share, a loaded machine left the plan no time: EfficientNetV2B0
    # (894 nodes) got the Chen greedy's 1.20x instead of the plan's 1.04x, NASNetMobile (2621
    # nodes) no schedule at all. Measured: experiments/results/README.md, section i.
    plan_first = main == "hierarchical"
    floor = ("checkpoint_all",) if plan_first else FLOOR_STRATEGIES
    floor_until = None if deadline is None else start + FLOOR_TIME_SHARE * float(options.time_limit_s)
    for name in floor:
        known = len(minimums)
        attempt(name, base_opts, deadline if plan_first else floor_until)
        if len(minimums) > known:
            floor_minimums.append((minimums[-1], name))
    plan_repaired: list = []

    def repair_plan(closest: list, max_excess: float = PLAN_REPAIR_MAX_EXCESS, late: bool = False) -> None:
        """A refused hierarchical plan's starts (the programme planned for its least peak, then its
        least-peak programme), repaired to the budget (holds dropped at the peak) and refined at once,
        within :data:`EARLY_DROP_TIME_SHARE` of the time left short of the refinement's reserve: on a loaded machine the plan's menus for longer groups run out of
        time and its programmes miss the budget by a few percent (DenseNet121's graph at 60%: 1.036x
        the budget), where a repair and the refinement land far below the quadratic baselines
        (1.079x against the Chen greedy's 1.228x). ``late``: the starts above
        :data:`PLAN_REPAIR_MAX_EXCESS` (the early call's), least peak first (the fewest drops: on
        Qwen-MoE's graph at 50% the least-peak programme, 1.24x the budget, repaired and refined to
        1.202x, the cheaper start, 1.44x, to 1.274x)."""
        low = PLAN_REPAIR_MAX_EXCESS if late else -1.0
        starts = [(peak, schedule) for peak, schedule in closest
                  if budget_bytes * (1 + low) < peak <= budget_bytes * (1 + max_excess)]
        if late:
            starts.sort(key=lambda s: s[0])
        if not starts or any(r[1] == main for r in results + plan_repaired):
            return
        until = None if deadline is None else deadline - REFINE_TIME_SHARE * float(options.time_limit_s)
        if until is not None:
            until = time.perf_counter() + EARLY_DROP_TIME_SHARE * (until - time.perf_counter())
            if until - time.perf_counter() < AUTO_FALLBACK_MIN_SECONDS:
                return
        lowest: list = []
        repaired = None
        for peak, schedule in starts:     # the plan's cheapest start first, its least-peak one last
            repaired = _repair(graph, budget_bytes, [], [(peak, main, schedule)], until, lowest=lowest,
                               only_given=True)
            if repaired is not None:
                break
        if repaired is None:
            # the least peak it reached is a budget known to fit
            minimums.extend(c.peak_bytes for c in lowest if c is not None)
            fits.extend((c.peak_bytes, c.schedule) for c in lowest if c is not None)
            return
        refined = _refine(graph, budget_bytes, repaired[2], repaired[0], until)
        if refined is not None:
            repaired = (refined[0], repaired[1], refined[1])
        # kept out of ``results`` until the repairs of the floor's schedules have run (they run only
        # when no schedule fits): at 55% on DenseNet121's graph griewank_logn's repaired to 1.2575x,
        # the plan's closest programme to 1.2968x
        plan_repaired.append(repaired)
        _logger.info("auto: the hierarchical plan's closest programme fits at overhead %.4fx (%.1f s)",
                     repaired[0] / graph.total_cost if graph.total_cost > 0 else 1.0, time.perf_counter() - start)

    closest: list = []        # the refused hierarchical plan's starts: its programmes closest to the budget
    if plan_first and not _fits_without_recomputation(graph, results):
        left = None if deadline is None else PLAN_FIRST_TIME_SHARE * max(deadline - time.perf_counter(), 0.0)
        attempt(main, replace(options, time_limit_s=left), deadline, closest=closest)
        repair_plan(closest)
        if _short_of_target(graph, results, main):
            # long skips defeat the plan's segments: the drops from checkpoint-all come before the
            # quadratic baselines, which at a loaded machine's pace left them no time on a 446-node
            # U-Net (1.09x at 40% against 1.03x)
            # (half of the time left: a drop that does not finish leaves the floor the other half)
            reserve = 0.0 if deadline is None else REFINE_TIME_SHARE * float(options.time_limit_s)
            drop_from_checkpoint_all(EARLY_DROP_TIME_SHARE)
        # the rest of the floor in the time left, the refinement's share kept back once a plan is known
        for name in FLOOR_STRATEGIES[1:]:
            reserve = (0.0 if deadline is None or not (results or plan_repaired)
                       else REFINE_TIME_SHARE * float(options.time_limit_s))
            until = None if deadline is None else deadline - reserve
            if until is not None and time.perf_counter() >= until:
                _logger.info("auto: no time left for %s", name)
                timed_out.append(name)
                continue
            known = len(minimums)
            attempt(name, base_opts, until)
            if len(minimums) > known:
                floor_minimums.append((minimums[-1], name))
    best_floor = min(results, key=lambda r: r[0]) if results else None
    # below the largest working set no schedule exists, but the repair's least peak is still the
    # smallest budget known to fit (far below the floor's on long-skip graphs)
    if best_floor is None:
        repair_s = REPAIR_MAX_S if deadline is None else min(REPAIR_TIME_SHARE * float(options.time_limit_s),
                                                             REPAIR_MAX_S)
        repair_until = time.perf_counter() + repair_s if plan_first else start + repair_s
        repair_until = repair_until if deadline is None else min(repair_until, deadline)
        if plan_repaired and deadline is not None:
            # a schedule is known: the refinement's share stays kept back
            repair_until = min(repair_until, deadline - REFINE_TIME_SHARE * float(options.time_limit_s))
        lowest: list = []
        repaired = _repair(graph, budget_bytes, floor_minimums, over, repair_until, lowest=lowest)
        minimums.extend(c.peak_bytes for c in lowest if c is not None)
        fits.extend((c.peak_bytes, c.schedule) for c in lowest if c is not None)
        if repaired is not None:
            results.append(repaired)
            _logger.info("auto: %s fits at overhead %.4fx (%.1f s)", repaired[2].status,
                         repaired[0] / graph.total_cost if graph.total_cost > 0 else 1.0, time.perf_counter() - start)
    results.extend(plan_repaired)
    # the main strategy leaves time for the refinement when a schedule is known already
    reserve = 0.0 if deadline is None or not results else REFINE_TIME_SHARE * float(options.time_limit_s)
    left = None if deadline is None else max(deadline - reserve - time.perf_counter(), 1.0)
    if plan_first:
        drop_from_checkpoint_all()
        if (closest and results and not plan_repaired and _short_of_target(graph, results, main)
                and _short_of_bound(graph, memory_bound, results)):
            # the plan's programmes further above the budget, now that a schedule is known, in the time
            # the drops from checkpoint-all left (DenseNet121's graph at 55%: drops cut short by their share
            # resume first; repaired before them, the plan's programme won nothing and took their time)
            repair_plan(closest, PLAN_LATE_REPAIR_MAX_EXCESS, late=True)
            results.extend(plan_repaired)
    elif not _fits_without_recomputation(graph, results):
        # before the main strategy: its time limit must not leave the drops (a second on a 54-node
        # U-Net, where they and the refinement reach 1.065x against 1.36x from a repaired floor
        # schedule) no time, and the MILP starts from the best schedule found
        drop_from_checkpoint_all()
        if main == "checkmate_milp" and graph.n >= AUTO_HIERARCHICAL_FIRST_MIN_NODES:
            attempt("hierarchical", replace(options, time_limit_s=left), deadline)
            drop_from_checkpoint_all()
            left = None if deadline is None else deadline - reserve - time.perf_counter()
            if (_short_of_target(graph, results, "hierarchical") and _short_of_bound(graph, memory_bound, results)
                    and (left is None or left >= AUTO_FALLBACK_MIN_SECONDS)):
                attempt(main, replace(options, time_limit_s=left), deadline)
        else:
            attempt(main, replace(options, time_limit_s=left), deadline)
    if not _fits_without_recomputation(graph, results):
        if (main == "hierarchical" and graph.n <= AUTO_FLAT_FALLBACK_MAX_NODES and _short_of_target(graph, results, main)
                and _short_of_bound(graph, memory_bound, results)):
            left = None if deadline is None else deadline - reserve - time.perf_counter()
            if left is None or left >= AUTO_FALLBACK_MIN_SECONDS:
                _logger.info("auto: the hierarchical plan is missing or not within %.0f%% of its bound: flat MILP "
                             "with the time left", 100 * AUTO_TARGET_GAP)
                attempt("checkmate_milp", replace(options, time_limit_s=left), deadline)
    drop_from_checkpoint_all()
    if not results:
        # the least peak this answer names is a budget a later solve on this graph starts from
        _remember_least_peak(graph, fits + [(peak, schedule) for peak, _, schedule in over])
        earlier = _known_least_peak(graph, budget_bytes)
        if earlier is not None:
            with no_deadline():
                sim = simulate(graph, earlier)
            if sim.valid and sim.peak_memory_bytes <= budget_bytes:
                _logger.info("auto: the least-peak schedule of an earlier answer on this graph fits")
                results.append((sim.compute_cost, "least_peak",
                                StrategyOutput(earlier, status="the least-peak schedule an earlier refusal of a "
                                                                "smaller budget named")))
    if not results and timed_out:
        # a strategy that ran out of time may have fitted: the budget is not known to be infeasible,
        # and a minimum found by the others is only an upper bound
        known = (f"; the smallest budget known to fit is {min(minimums)} bytes" if minimums else "")
        raise TimeLimitError(f"auto: no strategy found a schedule within the time limit of {options.time_limit_s:g} s "
                             f"({', '.join(timed_out)} ran out of time){known}; raise the time limit")
    if not results:
        minimum = min(minimums) if minimums else None
        floor = peak_floor(graph)[0]
        raise InfeasibleBudgetError(
            f"auto: no schedule fits in {budget_bytes} bytes"
            + (f"; the minimum feasible budget found is {minimum} bytes" if minimum is not None else "")
            + ("; it is the least any schedule needs" if minimum is not None and floor >= minimum
               else f"; none fits in less than {floor} bytes"),
            budget_bytes=budget_bytes, min_feasible_budget_bytes=minimum, strategy="auto")
    cost, name, out = min(results, key=lambda r: (r[0], r[1] != main))
    # the memory at each node's first run forces a least recomputation (it includes every node once)
    bounds = [r[2].lower_bound for r in results if r[2].lower_bound is not None]
    # the hierarchical strategy's bound holds the memory bound already (at least its least with its
    # own cost, which is no less than ``cost``): not computed a second time after the time limit
    if not any(r[1] == "hierarchical" and r[2].lower_bound is not None for r in results):
        bounds.append(min(memory_bound(), cost))
    lower = max(bounds)
    if not out.optimal and cost > lower * (1 + 1e-12):
        until = time.perf_counter() + REFINE_MAX_S
        until = until if deadline is None else min(until, deadline)
        refined = _refine(graph, budget_bytes, out, cost, until, lower, deadline)
        if refined is not None:
            cost, out = refined
    status = f"{name}: {out.status}" if out.status and out.status != "ok" else name
    optimal = out.optimal or cost <= lower * (1 + 1e-12)
    if optimal and not out.optimal:
        status = f"{name}: optimal (its cost meets the proven lower bound)"
    elif not optimal and "within" not in status:
        status += f"; {within_words(relative_gap(cost, lower))}"
    return StrategyOutput(out.schedule, lower_bound=lower, optimal=optimal, status=status,
                          solver=out.solver)


def _repair(graph: "Graph", budget_bytes: int, minimums: list[tuple[int, str]],
            over: list[tuple[int, str, "Schedule"]], until: float | None,
            lowest: list | None = None, only_given: bool = False) -> tuple[float, str, "StrategyOutput"] | None:
    """The first schedule that :func:`repair_to_budget` brings within the budget, from the starts
    closest to it: each refusing floor strategy's least-peak schedule, then those that replayed above
    the budget (checkpoint-all's among them), lowest peak first; None when none is repaired in time.
    ``lowest`` receives, for each start the repair gave up on, the least-peak schedule it reached.
    ``only_given``: checkpoint-all is not tried after the starts given."""
    # one start per strategy: the schedule it returned where there is one (no second solve)
    by_name: dict[str, tuple[int, str, "Schedule | None"]] = {name: (peak, name, None) for peak, name in minimums}
    by_name.update({name: (peak, name, schedule) for peak, name, schedule in over})
    if not only_given:
        by_name.setdefault("checkpoint_all", (2 ** 62, "checkpoint_all", None))
    for peak, name, schedule in sorted(by_name.values(), key=lambda s: s[0]):
        if until is not None and time.perf_counter() >= until:
            return None
        try:
            with deadline_scope(until, what=f"the repair of {name}"):
                if schedule is None:
                    schedule = (checkpoint_all_schedule(graph) if name == "checkpoint_all" else
                                STRATEGIES[name].fn(graph, int(peak), SolveOptions()).schedule)
                if schedule is None:
                    continue
                found = repair_to_budget(graph, schedule, budget_bytes, deadline=until, lowest=lowest)
        except CheckmateError as exc:      # a deadline, or a start that does not exist at that budget
            _logger.info("auto: no repair of %s (%s)", name, exc)
            continue
        if found is not None and found.peak_bytes <= budget_bytes:
            return (found.cost, name, StrategyOutput(found.schedule, status="repaired to the budget (holds dropped "
                                                     "at the peak, cheapest per byte first)"))
    return None


def _refine(graph: "Graph", budget_bytes: int, out: "StrategyOutput", cost: float,
            until: float | None, lower: float | None = None,
            deadline: float | None = None) -> tuple[float, "StrategyOutput"] | None:
    """``out``'s schedule with recomputations replaced by holds while it fits, until ``until``; None
    when nothing was gained or no time is left. When ``lower`` (a proven bound) is given and the
    result is still further than :data:`AUTO_TARGET_GAP` from it, exchanges of holds
    (:func:`~checkmate.solvers.rounding.hold_and_repair`) follow for up to :data:`EXCHANGE_TIME_FACTOR`
    times :data:`REFINE_MAX_S` more,
    never past ``deadline``."""
    if out.schedule is None or graph.n > REFINE_MAX_NODES or (until is not None and until - time.perf_counter() < 0.5):
        return None
    with no_deadline():
        sim = simulate(graph, out.schedule)
    if not sim.valid or sim.peak_memory_bytes > budget_bytes:
        return None
    # the search polls ``until`` between its moves and keeps what it found: no scope that would cut
    # a move short and lose the rounds before it
    with no_deadline():
        better = improve_by_holding(graph, Candidate(out.schedule, sim.compute_cost, sim.peak_memory_bytes, "refine"),
                                    budget_bytes, deadline=until)
    exchange_until = time.perf_counter() + EXCHANGE_TIME_FACTOR * REFINE_MAX_S
    exchange_until = exchange_until if deadline is None else min(exchange_until, deadline)
    if (lower is not None and relative_gap(better.cost, min(lower, better.cost)) > AUTO_TARGET_GAP
            and exchange_until - time.perf_counter() >= 1.0):
        # the refinement stops where every single hold breaks the budget: on dense blocks a hold
        # exchanged for cheaper drops elsewhere goes on (a 160-node dense graph at 50%: 1.0457x
        # refined, the proven optimum 1.0358x after the exchanges). Half of the recomputations to hold
        # are drawn in proportion to their cost (scratch runs on two loaded cores, from auto's schedules:
        # the 326-node diffusion U-Net at 30%, 1.0792x to 1.0754x in 40 s by cost, to 1.0767x in 120 s
        # uniformly, 1.0754x in 40 s half and half; DenseNet121 at 60%, 1.0923x to 1.0787x in 40 s by
        # cost, 1.0761x uniformly)
        with no_deadline():
            better = hold_and_repair(graph, better, budget_bytes, deadline=exchange_until,
                                     cost_draws=EXCHANGE_COST_DRAWS, target_cost=lower / (1 - AUTO_TARGET_GAP))
    if better.cost >= cost * (1 - 1e-9):
        return None
    with no_deadline():
        check = simulate(graph, better.schedule)
    if not check.valid or check.peak_memory_bytes > budget_bytes or check.compute_cost >= cost:
        return None
    _logger.info("auto: refined to overhead %.4fx", check.compute_cost / graph.total_cost if graph.total_cost else 1.0)
    # the strategy's own distance to its bound no longer holds: auto states the refined one
    status = re.sub(r",?\s*within [0-9.]+% of the optimum;?\s*", " ", out.status if out.status != "ok" else "")
    # a schedule refined before (the drops from checkpoint-all are refined at once) says so once
    earlier = re.findall(r"refined \(recomputations replaced by holds that fit[^)]*\)", status)
    exchanged = better.source.endswith("exchanged") or any("exchanged" in e for e in earlier)
    status = re.sub(r";?\s*refined \(recomputations replaced by holds that fit[^)]*\)", " ", status)
    status = re.sub(r"\s+", " ", status).strip(" ;,")
    status = (status + "; " if status else "") + "refined (recomputations replaced by holds that fit"
    status += ", holds exchanged for cheaper drops)" if exchanged else ")"
    return check.compute_cost, replace(out, schedule=better.schedule, status=status, optimal=False)


def _short_of_bound(graph: "Graph", memory_bound, results: list) -> bool:
    """Whether no schedule found is within :data:`AUTO_TARGET_GAP` of the best proven lower bound
    (``memory_bound()``: :func:`cost_lower_bound` at the budget)."""
    if not results:
        return True
    cost = min(r[0] for r in results)
    lower = max([memory_bound(),
                 *(r[2].lower_bound for r in results if r[2].lower_bound is not None)])
    return relative_gap(cost, min(lower, cost)) > AUTO_TARGET_GAP


def _fits_without_recomputation(graph: "Graph", results: list) -> bool:
    """Whether a schedule found computes every node once (nothing can beat it)."""
    return any(r[0] <= graph.total_cost * (1 + 1e-12) for r in results)


def _short_of_target(graph: "Graph", results: list, main: str) -> bool:
    """Whether ``main`` found no schedule, or one further than :data:`AUTO_TARGET_GAP` from its bound."""
    found = [r for r in results if r[1] == main]
    if not found:
        return True
    cost, _, out = found[0]
    lower = out.lower_bound if out.lower_bound is not None else graph.total_cost
    return relative_gap(cost, lower) > AUTO_TARGET_GAP
