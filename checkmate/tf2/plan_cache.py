"""Solved schedules kept on disk, and plan files: a step is solved once per graph, budget and device.

A *plan* is a ``checkmate-schedule/1`` document with one more field, ``"checkmate_plan"``, that says
what it was solved for: the lowered graph's digests, the budget it was planned for, the strategy and
its options, the device, and the solver's answer (cost, bound, proof, status). Any tool that reads
schedules reads a plan; ``checkmate compile --save-plan`` writes one, and
``checkmate.tf2.compile(..., plan=path)`` or ``RematModel(..., plan=path)`` trains with it.

The schedule cache (:class:`ScheduleCache`) stores one plan per key under :func:`cache_dir`, beside
the profile cache: ``$CHECKMATE_CACHE_DIR/schedules`` (default ``~/.cache/checkmate/schedules``).
``$CHECKMATE_SCHEDULE_CACHE=0`` (or ``schedule_cache=False``) turns it off. Nothing read back is
trusted: an entry is used only after its plan replays on the graph at hand within the budget, and
an unreadable, foreign or no longer fitting entry is ignored (the step is solved again and the entry
replaced). Entries are written atomically, so a reader never sees half a file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from checkmate.errors import CheckmateError, InvalidArgumentError
from checkmate.io import atomic_write_json, read_text
from checkmate.schedule import SCHEDULE_FORMAT, Schedule
from checkmate.simulate import replay_plan, validate_schedule

if TYPE_CHECKING:  # pragma: no cover
    from checkmate.graph import Graph
    from checkmate.solvers import SolveResult

__all__ = ["PLAN_FIELD", "SCHEDULE_CACHE_ENV", "cache_dir", "cache_enabled", "graph_digest", "structure_digest",
           "plan_document", "save_plan", "read_plan", "plan_result", "ScheduleCache", "solve_key"]

_log = logging.getLogger("checkmate.tf2")

# The field a plan adds to a schedule document (readers of schedules ignore it).
PLAN_FIELD = "checkmate_plan"
# Bumped when what a plan records, or how a key is formed, changes: older entries are then ignored.
PLAN_VERSION = 1
SCHEDULE_CACHE_ENV = "CHECKMATE_SCHEDULE_CACHE"
_CACHE_DIR_ENV = "CHECKMATE_CACHE_DIR"     # shared with the profile cache (checkmate.tf2.profiling)
_OFF = ("0", "false", "no", "off")
# Solve options that change the answer's quality but not what a schedule must satisfy: a cached plan
# solved with other values is still a plan for the same graph and budget (see ScheduleCache.get).
_NOT_IN_KEY = ("time_limit_s", "verbose", "progress", "threads")


def cache_dir(path: "str | os.PathLike | None" = None) -> Path:
    """Where schedules are cached: ``path``, else ``$CHECKMATE_CACHE_DIR/schedules``, else
    ``~/.cache/checkmate/schedules``."""
    if path is not None:
        return Path(path)
    env = os.environ.get(_CACHE_DIR_ENV)
    root = Path(env) if env else Path.home() / ".cache" / "checkmate"
    return root / "schedules"


def cache_enabled(setting: "bool | str | os.PathLike | None" = None) -> bool:
    """Whether to use the schedule cache: ``setting`` when given (``False`` turns it off, a path
    moves it), else unless ``$CHECKMATE_SCHEDULE_CACHE`` is ``0``/``false``/``no``/``off``."""
    if setting is not None:
        return setting is not False
    return os.environ.get(SCHEDULE_CACHE_ENV, "").strip().lower() not in _OFF


def _hash(*arrays: Any, text: str = "") -> str:
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(str(a.dtype).encode() + str(a.shape).encode())
        h.update(a.tobytes())
    h.update(text.encode())
    return h.hexdigest()[:32]


def structure_digest(graph: "Graph") -> str:
    """What a schedule's validity depends on: the nodes' sizes and flags and the edges (not the costs,
    which the cost model and the device change, nor the fixed memory, which the budget check covers)."""
    flags = np.c_[graph.backward, graph.output, graph.recomputable].astype(np.uint8)
    edges = np.asarray(graph.edges, dtype=np.int64).reshape(-1, 2)
    return _hash(np.asarray(graph.mem, dtype=np.int64), flags, edges, text=str(graph.n))


def graph_digest(graph: "Graph") -> str:
    """Everything a solve's answer depends on in ``graph``: its structure, costs and fixed memory."""
    return _hash(np.asarray(graph.cost, dtype=np.float64),
                 text=f"{structure_digest(graph)}|{int(graph.fixed_mem)}")


def _plain(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return _plain(asdict(value))
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    return repr(value)


def solve_key(graph: "Graph", budget_bytes: int, strategy: str, solver: str | None, options: Mapping,
              device: str) -> dict:
    """The cache key of one solve: the graph's digest, the budget it is planned for, the strategy,
    the solver, the options that change what the strategy does, and the device."""
    kept = {k: v for k, v in options.items() if k not in _NOT_IN_KEY}
    return {"version": PLAN_VERSION, "graph_digest": graph_digest(graph), "budget_bytes": int(budget_bytes),
            "strategy": strategy, "solver": solver, "options": _plain(kept), "device": device}


def _key_name(key: Mapping) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:40]


def plan_document(graph: "Graph", result: "SolveResult", *, key: Mapping | None = None,
                  time_limit_s: float | None = None, **info: Any) -> dict:
    """The plan of ``result`` on ``graph``: its schedule document plus what it was solved for."""
    if result.schedule is None:
        raise InvalidArgumentError(f"{result.strategy} returned no schedule: there is no plan to write")
    doc = result.schedule.to_dict()
    doc[PLAN_FIELD] = {
        "version": PLAN_VERSION,
        "nodes": int(graph.n),
        "structure_digest": structure_digest(graph),
        "graph_digest": graph_digest(graph),
        "planned_budget_bytes": int(result.budget_bytes),
        "strategy": result.strategy,
        "solver": result.solver,
        "compute_cost": result.compute_cost,
        "baseline_cost": result.baseline_cost,
        "peak_memory_bytes": result.peak_memory_bytes,
        "lower_bound": result.lower_bound,
        "optimal": bool(result.optimal),
        "status": result.status,
        "solve_seconds": float(result.solve_seconds),
        "time_limit_s": time_limit_s,
        **({"key": dict(key)} if key is not None else {}),
        **_plain(info),
    }
    return doc


def save_plan(path: "str | os.PathLike", graph: "Graph", result: "SolveResult", **info: Any) -> Path:
    """Write the plan of ``result`` (atomically); ``info`` is recorded with it (batch size, model)."""
    return atomic_write_json(path, plan_document(graph, result, **info))


def read_plan(path: "str | os.PathLike") -> dict:
    """A plan file's document; :class:`InvalidArgumentError` naming the file when it is not one."""
    text = read_text(Path(path), "plan file", InvalidArgumentError)
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise InvalidArgumentError(f"{path}: not a plan file (malformed JSON: {exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != SCHEDULE_FORMAT or not isinstance(doc.get(PLAN_FIELD), dict):
        raise InvalidArgumentError(f"{path}: not a plan file (write one with checkmate compile --save-plan)")
    return doc


def plan_result(doc: Mapping, graph: "Graph", budget_bytes: int, *, source: str = "the plan") -> "SolveResult":
    """The :class:`~checkmate.solvers.SolveResult` of a plan on ``graph``, after checking that it was made
    for this graph's structure and that its plan replays on it within ``budget_bytes``.

    Raises :class:`InvalidArgumentError` saying what does not match.
    """
    from checkmate.solvers import SolveResult

    info = doc.get(PLAN_FIELD) if isinstance(doc, Mapping) else None
    if not isinstance(info, Mapping):
        raise InvalidArgumentError(f"{source} is not a plan")
    if info.get("nodes") != graph.n or info.get("structure_digest") != structure_digest(graph):
        raise InvalidArgumentError(
            f"{source} was made for another graph ({info.get('nodes')} nodes) than this step's "
            f"({graph.n} nodes): save the plan for the same model, batch size, level and options")
    try:
        schedule = Schedule.from_dict(doc, graph)
        sim = validate_schedule(graph, schedule)
        replay = replay_plan(graph, schedule.plan)
    except CheckmateError as exc:
        raise InvalidArgumentError(f"{source} does not replay on this step: {exc}") from None
    peak = max(int(sim.peak_memory_bytes), int(replay.peak_memory_bytes))
    if peak > budget_bytes:
        raise InvalidArgumentError(f"{source} peaks at {peak} bytes on this step, over its budget of "
                                   f"{budget_bytes} bytes")
    strategy = str(info.get("strategy") or schedule.strategy or "plan")
    lower = info.get("lower_bound")
    # the proof holds only for the costs it was solved with
    same_costs = info.get("graph_digest") == graph_digest(graph)
    return SolveResult(graph.name, graph.n, strategy, info.get("solver"), int(budget_bytes),
                       schedule.with_meta(strategy=strategy, budget_bytes=int(budget_bytes)),
                       float(sim.compute_cost), float(graph.total_cost), peak,
                       float(lower) if same_costs and isinstance(lower, (int, float)) else None,
                       bool(info.get("optimal")) and same_costs, 0.0, f"{source}: {info.get('status') or 'ok'}")


class ScheduleCache:
    """Plans by solve key (:func:`solve_key`), one JSON file each under :func:`cache_dir`."""

    def __init__(self, directory: "str | os.PathLike | None" = None):
        self.directory = cache_dir(directory)

    def path(self, key: Mapping) -> Path:
        return self.directory / f"{_key_name(key)}.json"

    def get(self, key: Mapping, graph: "Graph", budget_bytes: int,
            time_limit_s: float | None = None) -> "SolveResult | None":
        """The cached result for ``key`` if its plan replays on ``graph`` within ``budget_bytes``; else
        ``None``. A result that was not proven optimal is reused only when it was solved with at least
        ``time_limit_s``: a longer limit asks for a better answer."""
        path = self.path(key)
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError, RecursionError) as exc:
            _log.debug("schedule cache: ignoring %s (%s)", path, exc)
            return None
        info = doc.get(PLAN_FIELD) if isinstance(doc, dict) else None
        if not isinstance(info, dict) or info.get("key") != dict(key):
            _log.debug("schedule cache: ignoring %s (not a plan for this key)", path)
            return None
        # None is the solver's documented default limit, not "any"
        asked = _effective_limit(time_limit_s)
        solved_with = _effective_limit(info.get("time_limit_s"))
        if not info.get("optimal") and isinstance(solved_with, (int, float)) and solved_with < asked:
            _log.debug("schedule cache: %s was solved within %.0f s, %.0f s asked", path, solved_with, asked)
            return None
        try:
            result = plan_result(doc, graph, budget_bytes, source="the cached schedule")
        except InvalidArgumentError as exc:
            _log.info("schedule cache: solving again (%s)", exc)
            return None
        _log.info("schedule cache: reusing %s", path)
        # the strategy and status as first solved, with where it came from
        return _replace_status(result, info)

    def put(self, key: Mapping, graph: "Graph", result: "SolveResult", time_limit_s: float | None = None) -> None:
        """Store ``result`` for ``key``; a failure to write is logged, never raised (the cache is an
        optimisation)."""
        try:
            atomic_write_json(self.path(key), plan_document(graph, result, key=key, time_limit_s=time_limit_s))
        except (OSError, CheckmateError) as exc:
            _log.warning("schedule cache: could not write %s (%s)", self.path(key), exc)


def _effective_limit(time_limit_s: Any) -> Any:
    from checkmate.solvers.types import DEFAULT_TIME_LIMIT_S

    return DEFAULT_TIME_LIMIT_S if time_limit_s is None else time_limit_s


def _replace_status(result: "SolveResult", info: Mapping) -> "SolveResult":
    from dataclasses import replace

    status = str(info.get("status") or "ok")
    return replace(result, status=f"{status} (from the schedule cache)", optimal=bool(result.optimal),
                   solve_seconds=0.0)


def solve_or_reuse(graph: "Graph", budget_bytes: int, *, strategy: str, solver: str | None = None,
                   time_limit_s: float | None = None, plan: "str | os.PathLike | Mapping | None" = None,
                   schedule_cache: "bool | str | os.PathLike | None" = None, device: str | None = None,
                   **solve_options: Any) -> "SolveResult":
    """:func:`checkmate.solve` of ``graph`` within ``budget_bytes``, or the schedule of ``plan`` (a plan
    file or document, checked against the graph and the budget), or the schedule cache's answer for
    the same graph, budget, strategy, options and device (checked the same way; stored after a solve)."""
    from checkmate.solvers import solve

    if plan is not None:
        doc = plan if isinstance(plan, Mapping) else read_plan(plan)
        source = "the plan" if isinstance(plan, Mapping) else f"the plan {os.fspath(plan)}"
        result = plan_result(doc, graph, budget_bytes, source=source)
        _log.info("training with %s (no solve)", source)
        return result
    cache = None
    if cache_enabled(schedule_cache):
        if device is None:
            from checkmate.tf2.profiling import device_description

            device = device_description()
        directory = None if schedule_cache in (None, True) else schedule_cache
        cache = ScheduleCache(directory)
        key = solve_key(graph, budget_bytes, strategy, solver, solve_options, device)
        cached = cache.get(key, graph, budget_bytes, time_limit_s)
        if cached is not None:
            return cached
    result = solve(graph, budget_bytes, strategy=strategy, solver=solver, time_limit_s=time_limit_s, **solve_options)
    if cache is not None and result.schedule is not None:
        cache.put(key, graph, result, time_limit_s=time_limit_s)
    return result
