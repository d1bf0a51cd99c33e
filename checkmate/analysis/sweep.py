"""Budget sweeps: every strategy over a grid of memory budgets (the Checkmate paper's budget-sweep figure).

The grid runs from the smallest budget at which any of the swept strategies finds a schedule (the
feasibility frontier) up to the checkpoint-all peak, where no strategy needs to recompute anything.
Each (strategy, budget) solve is independent, so they run in parallel (:mod:`.executors`).

Strategies that ignore the budget (checkpoint-all, Chen sqrt(n), ...) produce the same schedule at
every budget: they are solved once and their row at each budget says whether that schedule fits.

Every row carries the strategy's own lower bound (if it proves one) and the best lower bound that any
strategy of the sweep proved at its budget (the MILP's or the LP relaxation's), with the gap of the
row's cost to the latter, so a baseline's distance from optimal can be read off the same table.

With a cache directory, every solve's row is kept as it finishes (:mod:`.point_cache`), keyed by the
graph's content, the strategy, the budget and the solver options: a sweep that was interrupted, or
rerun with more strategies, solves only the points it has no row for.
"""

from __future__ import annotations

import csv
import hashlib
import json
import logging
import math
import numbers
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from checkmate import __version__
from checkmate.analysis.executors import EXECUTORS, executor_session, run_tasks
from checkmate.analysis.point_cache import PointCache
from checkmate.analysis.plots import plot_budget_sweep
from checkmate.analysis.sweep_data import CSV_COLUMNS, SweepResult, SweepRow
from checkmate.bounds import checkpoint_all_peak, largest_working_set_bytes
from checkmate.errors import InfeasibleBudgetError, InvalidArgumentError, OutputPathError, SolverError
from checkmate.graph import Graph, graph_from_dict
from checkmate.io import StagedOutputs
from checkmate.simulate import check_graph
from checkmate.solvers import solve
from checkmate.solvers.minimum_budget import sweep_frontier_budget
from checkmate.solvers.registry import STRATEGIES, get_strategy

__all__ = ["SweepRow", "SweepResult", "sweep", "budget_grid", "sweep_frontier_budget",
           "available_strategies", "default_strategies", "write_sweep", "read_sweep_csv", "load_sweep_json",
           "check_consistency", "CSV_COLUMNS", "SweepInterrupted", "write_sweep_rows", "payload_digest",
           "sweep_point_key"]

logger = logging.getLogger("checkmate.sweep")

# Strategies a sweep runs when none are named: the paper's baselines and Checkmate's own two.
_DEFAULT_ORDER = ("checkpoint_all", "chen_sqrtn", "chen_greedy", "griewank_logn", "checkmate_lp_rounding",
                  "checkmate_milp", "lower_bound_lp")

# Strategies whose rows define what "the MILP" means in consistency checks.
EXACT_STRATEGY = "checkmate_milp"
# Relative slack for comparing costs computed as float sums in different orders.
_COST_RTOL = 1e-9


# ------------------------------------------------------------------------------------ strategies
def available_strategies() -> list[str]:
    """Registered strategies whose implementation can be imported here."""
    names = []
    for name, spec in STRATEGIES.items():
        try:
            spec.fn
        except (ImportError, AttributeError):
            continue
        names.append(name)
    return names


def default_strategies() -> list[str]:
    available = set(available_strategies())
    return [name for name in _DEFAULT_ORDER if name in available]


def _check_strategies(names: Sequence[str]) -> list[str]:
    out = []
    for name in names:
        spec = get_strategy(name)  # raises InvalidArgumentError for unknown names
        try:
            spec.fn
        except (ImportError, AttributeError):
            raise InvalidArgumentError(f"strategy {name!r} is not available in this installation") from None
        if name not in out:
            out.append(name)
    if not out:
        raise InvalidArgumentError("no strategies to sweep")
    return out


# ------------------------------------------------------------------------------------ solving
@dataclass(frozen=True)
class _Task:
    strategy: str
    budget_bytes: int
    solver: str | None
    time_limit_s: float | None
    threads: int | None
    mip_gap: float | None


def _solve_task(graph_payload: Any, task: _Task) -> dict:
    """Worker entry point: one solve, every outcome turned into a row-like dict."""
    graph = graph_payload if isinstance(graph_payload, Graph) else graph_from_dict(graph_payload)
    # the sweep draws its own bar; a status line per solve (from worker processes) would garble it
    options: dict[str, Any] = {"progress": False}
    if task.threads is not None:
        options["threads"] = task.threads
    if task.mip_gap is not None:
        options["mip_gap"] = task.mip_gap
    start = time.perf_counter()
    try:
        r = solve(graph, task.budget_bytes, strategy=task.strategy, solver=task.solver,
                  time_limit_s=task.time_limit_s, **options)
    except InfeasibleBudgetError as exc:
        return {"strategy": task.strategy, "budget_bytes": task.budget_bytes, "feasible": False,
                "compute_cost": None, "peak_memory_bytes": None, "lower_bound": None, "optimal": False,
                "solve_seconds": time.perf_counter() - start, "status": "infeasible", "solver": task.solver,
                "min_feasible_budget_bytes": exc.min_feasible_budget_bytes}
    except SolverError as exc:
        return {"strategy": task.strategy, "budget_bytes": task.budget_bytes, "feasible": None,
                "compute_cost": None, "peak_memory_bytes": None, "lower_bound": None, "optimal": False,
                "solve_seconds": time.perf_counter() - start, "status": f"solver failed: {exc}",
                "solver": task.solver, "min_feasible_budget_bytes": None}
    return {"strategy": task.strategy, "budget_bytes": task.budget_bytes, "feasible": True,
            "compute_cost": r.compute_cost, "peak_memory_bytes": r.peak_memory_bytes,
            "lower_bound": r.lower_bound, "optimal": r.optimal, "solve_seconds": r.solve_seconds,
            "status": r.status, "solver": r.solver, "min_feasible_budget_bytes": None}


def payload_digest(graph_payload: dict) -> str:
    """A graph's identity for caching: the hash of its canonical JSON (names, costs, bytes, edges)."""
    text = json.dumps(graph_payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def sweep_point_key(digest: str, task: _Task) -> dict:
    """Everything one solve's row depends on. The package version is part of it, so that rows
    computed by another release read as misses rather than as answers of the code running now."""
    return {"point": "sweep", "graph": digest, "strategy": task.strategy, "budget_bytes": task.budget_bytes,
            "solver": task.solver, "time_limit_s": task.time_limit_s, "threads": task.threads,
            "mip_gap": task.mip_gap, "checkmate": __version__}


def _number(value: Any, *, integral: bool = False, positive: bool = False) -> bool:
    """A finite, non-negative JSON number (an int when ``integral``; above zero when ``positive``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if integral and not isinstance(value, int):
        return False
    return math.isfinite(value) and value >= 0 and (value > 0 or not positive)


def valid_cached_row(row: Any, task: _Task) -> bool:
    """Whether a row read from the cache is one that :func:`_solve_task` could have returned for
    ``task``: every field of the right type and range, and consistent with the task and itself. A
    damaged or hand-edited file would otherwise crash the sweep or copy nonsense into its CSV."""
    if not isinstance(row, dict):
        return False
    feasible = row.get("feasible")
    cost, peak, bound = row.get("compute_cost"), row.get("peak_memory_bytes"), row.get("lower_bound")
    minimum = row.get("min_feasible_budget_bytes")
    checks = [
        row.get("strategy") == task.strategy,
        isinstance(row.get("budget_bytes"), int) and not isinstance(row.get("budget_bytes"), bool)
        and row["budget_bytes"] == task.budget_bytes,
        feasible is True or feasible is False,  # failures are never stored
        cost is None or _number(cost),
        peak is None or _number(peak, integral=True),
        bound is None or _number(bound),
        isinstance(row.get("optimal"), bool),
        _number(row.get("solve_seconds")),
        isinstance(row.get("status"), str),
        row.get("solver") is None or isinstance(row.get("solver"), str),
        minimum is None or _number(minimum, integral=True, positive=True),
    ]
    if not all(checks):
        return False
    if feasible:
        # a schedule has both a cost and a peak; a bound-only strategy has neither
        return (cost is None) == (peak is None) and (cost is not None or STRATEGIES[task.strategy].bound_only)
    return cost is None and peak is None and row["optimal"] is False


def _run_points(tasks: Sequence[_Task], payload: dict, cache: PointCache, digest: str, into: list[Any],
                **run: Any) -> list[Any]:
    """Rows of ``tasks`` into ``into`` (in task order): cached rows are read, the others solved and stored
    as each finishes, so an interruption loses at most the solves then running."""
    missing = []
    for index, t in enumerate(tasks):
        found = cache.get(sweep_point_key(digest, t), lambda row, t=t: valid_cached_row(row, t))
        if found is None:
            missing.append(index)
        else:
            cache.hits += 1
            into[index] = found
    if cache.directory is not None and len(missing) < len(tasks):
        logger.info("%d of %d solves read from %s", len(tasks) - len(missing), len(tasks), cache.directory)

    def keep(position: int, row: dict) -> None:
        index = missing[position]
        into[index] = row
        cache.misses += 1
        # A solver failure may be passing (memory, a killed worker): it is solved again next time.
        if row["feasible"] is not None:
            cache.put(sweep_point_key(digest, tasks[index]), row)

    run_tasks(_solve_task, [tasks[i] for i in missing], shared=payload, on_result=keep, **run)
    return into


def budget_grid(low_bytes: int, high_bytes: int, count: int) -> list[int]:
    """``count`` budgets evenly spaced from ``low_bytes`` to ``high_bytes``, both included, no repeats."""
    if count < 1:
        raise InvalidArgumentError(f"a sweep needs at least one budget, got {count}")
    if high_bytes <= low_bytes or count == 1:
        return [int(max(low_bytes, high_bytes))]
    step = (high_bytes - low_bytes) / (count - 1)
    grid = sorted({int(round(low_bytes + i * step)) for i in range(count)})
    grid[0], grid[-1] = int(low_bytes), int(high_bytes)
    return grid


def _is_bound_only(name: str) -> bool:
    return STRATEGIES[name].bound_only


def sweep(graph: Graph, strategies: Sequence[str] | None = None, *, budgets: int | Sequence[int] = 10,
          solver: str | None = None, time_limit_s: float | None = None, mip_gap: float | None = None,
          executor: str = "process", workers: int | None = None, progress: bool = False,
          cache_dir: str | os.PathLike | None = None) -> SweepResult:
    """Solve ``graph`` with every strategy at every budget of a grid.

    ``budgets`` is either the number of grid points (from the minimum feasible budget to the
    checkpoint-all peak) or an explicit list of budgets in bytes. ``cache_dir`` keeps each solve's
    row there as it finishes and reads back the rows it already has instead of solving again.
    """
    with executor_session(executor, workers):  # one Ray start for the frontier and the grid
        return _sweep(graph, strategies, budgets=budgets, solver=solver, time_limit_s=time_limit_s,
                      mip_gap=mip_gap, executor=executor, workers=workers, progress=progress, cache_dir=cache_dir)


def _sweep(graph: Graph, strategies: Sequence[str] | None, *, budgets: int | Sequence[int], solver: str | None,
           time_limit_s: float | None, mip_gap: float | None, executor: str, workers: int | None, progress: bool,
           cache_dir: str | os.PathLike | None) -> SweepResult:
    if executor not in EXECUTORS:
        raise InvalidArgumentError(f"unknown executor {executor!r}; choose one of: {', '.join(EXECUTORS)}")
    budgets = _check_sweep_arguments(graph, strategies, budgets, workers)
    names = _check_strategies(strategies if strategies is not None else default_strategies())
    start = time.perf_counter()
    payload = graph.to_dict()
    cache = PointCache(cache_dir)
    digest = payload_digest(payload) if cache_dir is not None else ""
    # Solver threads stay at the backend default: HiGHS runs its MIP search on one thread regardless.
    threads = None
    peak_all = checkpoint_all_peak(graph)
    trivial = largest_working_set_bytes(graph)
    unaware = [s for s in names if not STRATEGIES[s].budget_aware]
    aware = [s for s in names if STRATEGIES[s].budget_aware]

    def task(name: str, budget: int) -> _Task:
        return _Task(name, int(budget), solver, time_limit_s, threads, mip_gap)

    # Budget-unaware strategies: one solve each, at a budget nothing exceeds (their peak is their minimum).
    unlimited = max(peak_all, trivial) * 1024
    probe_tasks = [task(s, unlimited) for s in unaware]
    explicit = not isinstance(budgets, int)
    if not explicit:
        probe_tasks += [task(s, trivial) for s in aware if not _is_bound_only(s)]
    probe_rows = _run_points(probe_tasks, payload, cache, digest, [None] * len(probe_tasks), executor=executor,
                             workers=workers, progress=progress,
                             desc=f"{graph.name}: frontier")  # interrupted here: no row yet
    probes = {t.strategy: row for t, row in zip(probe_tasks, probe_rows)}

    if explicit:
        grid = sorted({int(b) for b in budgets})  # type: ignore[union-attr]
        if not grid or grid[0] <= 0:
            raise InvalidArgumentError("explicit sweep budgets must be positive byte counts")
        low = sweep_frontier_budget(graph, unaware, probes)
    else:
        low = sweep_frontier_budget(graph, names, probes)
        grid = budget_grid(low, max(low, peak_all), int(budgets))

    known = {(t.strategy, t.budget_bytes): row for t, row in zip(probe_tasks, probe_rows)
             if t.budget_bytes != unlimited}
    solve_tasks = [task(s, b) for s in aware for b in grid if (s, b) not in known]
    solved: list[Any] = [None] * len(solve_tasks)
    try:
        _run_points(solve_tasks, payload, cache, digest, solved, executor=executor, workers=workers,
                    progress=progress, desc=f"{graph.name}: sweep")
    except KeyboardInterrupt:
        known.update({(t.strategy, t.budget_bytes): row for t, row in zip(solve_tasks, solved) if row is not None})
        raise SweepInterrupted(_finish_rows(graph, _grid_rows(names, grid, unaware, probes, known))) from None
    known.update({(t.strategy, t.budget_bytes): row for t, row in zip(solve_tasks, solved)})
    rows = _finish_rows(graph, _grid_rows(names, grid, unaware, probes, known))
    return SweepResult(graph.name, graph.n, grid, names, rows, peak_all, low, trivial, graph.total_cost,
                       time.perf_counter() - start,
                       {"executor": executor, "solver": solver, "time_limit_s": time_limit_s, "mip_gap": mip_gap,
                        "cached_solves": cache.hits, "solves": cache.misses})


def _check_sweep_arguments(graph: Any, strategies: Any, budgets: Any, workers: Any) -> int | list[int]:
    """Wrong argument types, refused as checkmate errors before any work; returns ``budgets`` (a list
    when it is a sequence, so that an iterator is read once)."""
    check_graph(graph)
    if strategies is not None and (isinstance(strategies, str) or not all(isinstance(s, str) for s in strategies)):
        raise InvalidArgumentError(f"strategies must be a list of strategy names, got {strategies!r}"[:200])
    integral = lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool)  # noqa: E731
    if workers is not None and (not integral(workers) or workers < 1):
        raise InvalidArgumentError(f"workers must be a positive integer or None, got {workers!r}")
    if integral(budgets):
        return int(budgets)
    if not isinstance(budgets, (str, bytes)) and isinstance(budgets, Iterable):
        listed = list(budgets)
        if all(map(integral, listed)):
            return [int(b) for b in listed]
    raise InvalidArgumentError(f"budgets must be a number of grid points or a list of byte counts, got "
                               f"{budgets!r}"[:200])


class SweepInterrupted(KeyboardInterrupt):
    """A sweep stopped by Ctrl-C; ``rows`` are the grid cells whose solve had finished, complete."""

    def __init__(self, rows: list[SweepRow]):
        super().__init__(f"sweep interrupted after {len(rows)} complete rows")
        self.rows = rows


def _grid_rows(names, grid, unaware, probes, known) -> list[dict]:
    """The raw rows of the grid, strategy by strategy, leaving out cells not solved (yet)."""
    raw: list[dict] = []
    for name in names:
        for b in grid:
            if name in unaware:
                raw.append(_unaware_row(probes[name], b))
            elif (name, b) in known:
                raw.append(known[(name, b)])
    return raw


def _unaware_row(probe: dict, budget: int) -> dict:
    row = dict(probe, budget_bytes=budget)
    if probe["feasible"]:
        peak = int(probe["peak_memory_bytes"])
        if peak > budget:
            row.update(feasible=False, status="infeasible", min_feasible_budget_bytes=peak)
            row.update(compute_cost=None, peak_memory_bytes=None)
    return row


def _finish_rows(graph: Graph, raw: list[dict]) -> list[SweepRow]:
    """Attach the best bound known at each budget and derived fields."""
    best_bound: dict[int, float] = {}
    for row in raw:
        lb = row.get("lower_bound")
        if lb is not None and row["feasible"] is not False:
            best_bound[row["budget_bytes"]] = max(best_bound.get(row["budget_bytes"], -math.inf), float(lb))
    total = graph.total_cost
    rows = []
    for row in raw:
        cost = row["compute_cost"]
        bound = best_bound.get(row["budget_bytes"])
        own = row.get("lower_bound")
        if own is not None:
            own = float(own)
            bound = max(own, bound) if bound is not None else own
        gap = None
        if cost is not None and bound is not None:
            gap = 0.0 if cost <= 0 else max(0.0, (cost - bound) / cost)
        rows.append(SweepRow(
            graph=graph.name, strategy=row["strategy"], budget_bytes=int(row["budget_bytes"]),
            feasible=row["feasible"], compute_cost=cost, baseline_cost=total,
            overhead=None if cost is None else (cost / total if total > 0 else 1.0),  # as SolveResult.overhead
            peak_memory_bytes=row["peak_memory_bytes"], lower_bound=own, best_lower_bound=bound, gap=gap,
            solve_seconds=row["solve_seconds"], optimal=bool(row["optimal"]), status=str(row["status"]),
            solver=row.get("solver"), min_feasible_budget_bytes=row.get("min_feasible_budget_bytes")))
    return rows


# ------------------------------------------------------------------------------------ checks
def check_consistency(rows: Iterable[SweepRow], *, exact: str = EXACT_STRATEGY, rtol: float = 0.0) -> list[str]:
    """What a correct sweep guarantees, as a list of violations (empty when consistent).

    Wherever ``exact`` (the MILP) reached a proven optimum: its cost is at most every other
    strategy's cost at the same budget, and it does not increase with the budget; and no
    schedule's cost is below a proven lower bound. ``rtol`` is the relative slack allowed (the MILP's
    optimality gap when it is solved to a gap rather than exactly).
    """
    rows = list(rows)
    problems = []
    slack = rtol + _COST_RTOL
    exact_rows = {r.budget_bytes: r for r in rows if r.strategy == exact and r.feasible and r.compute_cost is not None}
    for r in rows:
        if r.compute_cost is None or not r.feasible:
            continue
        if r.best_lower_bound is not None and r.compute_cost < r.best_lower_bound * (1 - slack) - 1e-12:
            problems.append(f"{r.strategy} at {r.budget_bytes} B costs {r.compute_cost:.6g}, below the proven "
                            f"lower bound {r.best_lower_bound:.6g}")
        e = exact_rows.get(r.budget_bytes)
        if e is not None and e.optimal and r.strategy != exact and e.compute_cost > r.compute_cost * (1 + slack):
            problems.append(f"{exact} at {r.budget_bytes} B costs {e.compute_cost:.6g}, more than "
                            f"{r.strategy} ({r.compute_cost:.6g})")
        if e is None and r.strategy != exact:
            er = next((x for x in rows if x.strategy == exact and x.budget_bytes == r.budget_bytes), None)
            if er is not None and er.feasible is False:
                problems.append(f"{exact} reports no schedule at {r.budget_bytes} B, but {r.strategy} found one")
    ordered = sorted(exact_rows.values(), key=lambda r: r.budget_bytes)
    for a, b in zip(ordered, ordered[1:]):
        if a.optimal and b.optimal and b.compute_cost > a.compute_cost * (1 + slack):
            problems.append(f"{exact} overhead rises from {a.overhead:.4f} at {a.budget_bytes} B to "
                            f"{b.overhead:.4f} at {b.budget_bytes} B")
    return problems


# ------------------------------------------------------------------------------------ files
def _csv_value(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return value


def write_sweep(result: SweepResult, out_dir: str | os.PathLike, *, stem: str = "sweep", plot: bool = True,
                title: str | None = None) -> dict[str, Path]:
    """Write ``<stem>.csv``, ``<stem>.json`` (grid and metadata) and, with ``plot``, ``<stem>.png``.

    The files are staged beside their targets and renamed together once all are written
    (:class:`checkmate.io.StagedOutputs`): a failure leaves every earlier file as it was.
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise OutputPathError(f"cannot write the sweep into {str(out)!r}: it is not a directory")
    paths = {"csv": out / f"{stem}.csv", "json": out / f"{stem}.json"}

    with StagedOutputs() as staged:
        staged.stage(paths["csv"], lambda tmp: _write_csv(result.rows, tmp))
        staged.stage(paths["json"], lambda tmp: tmp.write_text(json.dumps(result.to_json_dict(), indent=1) + "\n"))
        if plot:
            paths["png"] = out / f"{stem}.png"
            staged.stage(paths["png"], lambda tmp: _plot_into(result, tmp, title))
        staged.commit()
    return paths


def _write_csv(rows: Sequence[SweepRow], path: Path) -> None:
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(CSV_COLUMNS)
        for row in rows:
            writer.writerow([_csv_value(getattr(row, c)) for c in CSV_COLUMNS])


def write_sweep_rows(rows: Sequence[SweepRow], path: str | os.PathLike) -> Path:
    """Write ``rows`` as a sweep CSV at ``path``, atomically (the partial result of an interrupted sweep)."""
    with StagedOutputs() as staged:
        staged.stage(path, lambda tmp: _write_csv(rows, tmp))
        staged.commit()
    return Path(path)


def _plot_into(result: SweepResult, tmp: Path, title: str | None) -> None:
    # the staged file has a .tmp suffix; the figure's format is that of its final name
    plot_budget_sweep(result, tmp, title=title, image_format="png")


def _parse_csv_field(name: str, text: str) -> Any:
    if text == "":
        return None
    if name in ("feasible", "optimal"):
        return text == "True"
    if name in ("budget_bytes", "peak_memory_bytes", "min_feasible_budget_bytes"):
        return int(text)
    if name in ("compute_cost", "baseline_cost", "overhead", "lower_bound", "best_lower_bound", "gap",
                "solve_seconds"):
        return float(text)
    return text


def read_sweep_csv(path: str | os.PathLike) -> list[SweepRow]:
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        missing = set(CSV_COLUMNS) - set(reader.fieldnames or ())
        if missing:
            raise InvalidArgumentError(f"{path}: not a sweep CSV (missing columns {sorted(missing)})")
        rows = []
        for raw in reader:
            values = {k: _parse_csv_field(k, raw[k]) for k in CSV_COLUMNS}
            values["optimal"] = bool(values["optimal"])
            values["status"] = values["status"] or ""
            rows.append(SweepRow(**values))
    return rows


def load_sweep_json(path: str | os.PathLike) -> SweepResult:
    """Read back the ``<stem>.json`` written by :func:`write_sweep` (for re-plotting without re-solving)."""
    try:
        data = json.loads(Path(path).read_text())
        rows = [SweepRow(**{k: r.get(k) for k in CSV_COLUMNS}) for r in data["rows"]]
        return SweepResult(data["graph"], data["nodes"], list(data["budgets"]), list(data["strategies"]), rows,
                           data["checkpoint_all_peak_bytes"], data["min_feasible_budget_bytes"],
                           data["trivial_bound_bytes"], data["baseline_cost"], data.get("wall_seconds", 0.0),
                           data.get("meta", {}))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InvalidArgumentError(f"{path}: not a sweep JSON file ({exc})") from None
