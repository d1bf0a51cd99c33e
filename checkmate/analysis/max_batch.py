"""The largest batch size each strategy trains within a memory limit (the Checkmate paper's max-batch study).

Setting (as in the paper): a strategy "fits" batch size ``b`` when it finds a schedule for the
training graph at ``b`` whose peak memory is within the limit **and** whose compute cost is at most
one extra forward pass over a plain step (cost <= forward + backward + forward). Checkpoint-all fits
while its peak does; Chen's sqrt(n) recomputes each forward value at most once, so it meets the
cost bound by construction; the MILP fits exactly when its optimum is within the cost bound.

A MILP probe is a yes/no question, so it is answered as one (:func:`decide_milp`) instead of by a
full solve: yes as soon as any schedule within both limits is found (a baseline's, a rounding of the
LP relaxation, or an incumbent of branch and bound, which stops at the first one within the cost
limit), no as soon as a bound proves the cost limit unreachable (the LP relaxation's, or branch and
bound's with the cost limit as its cutoff). A probe that reaches its time limit without either is
*undecided*: it never counts as fitting, the search treats it as "does not fit", and the result
lists it (``MaxBatchResult.undecided``), so a reported size is then a proven lower bound on the
strategy's maximum rather than the maximum itself.

Search: doubling from a start size until a size does not fit, then bisection between the last size
that fitted and the first that did not. This assumes fitting is monotone in batch size, which holds
for every strategy here because every activation grows with the batch while the graph's structure
does not change. The MILP starts from the best size another strategy reached: every baseline's
schedule is a feasible point of the MILP (its replay is within both limits), so the MILP fits there.

Graphs per batch size (:class:`BatchGraphFamily`): the model is extracted at two batch sizes and
every node's bytes (and cost) are interpolated as an affine function of the batch size. For bytes
this is exact, not an approximation: with static shapes each tensor's size is either proportional
to the batch size (activations) or independent of it (parameter gradients, the fixed memory of
weights and optimizer state), and a sum of such terms is affine. Costs interpolate the same way
(exact for the FLOP cost model, a linear fit for profiled times). The final batch size of each
strategy is re-extracted and re-solved, so the reported result never rests on interpolation, and,
where the memory limit fits this machine, confirmed by running the compiled training step and
measuring its peak memory.

Every probe can be kept in a :class:`~checkmate.analysis.point_cache.PointCache`, keyed by the
model, input shape, memory limit, strategy, batch size, solver settings and a digest of the probed
graph, so an interrupted search resumes without solving again what it already answered.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import asdict, dataclass, fields
from typing import Any, Callable, Sequence

import numpy as np

from checkmate.analysis.models import extract_graph
from checkmate.analysis.point_cache import PointCache
from checkmate.bounds import largest_working_set_bytes
from checkmate.errors import InfeasibleBudgetError, InvalidArgumentError, InvalidGraphError, SolverError
from checkmate.graph import Graph, Node
from checkmate.solvers import get_strategy, solve
from checkmate.solvers.backends import get_backend
from checkmate.solvers.registry import make_options
from checkmate.solvers.staged import (BASELINES, BRANCH_AND_BOUND, LOCAL_SEARCH, LP_RELAXATION, ROUNDING,
                                      ProvenInfeasible, solve_staged)
from checkmate.solvers.types import json_native

__all__ = ["BatchProbe", "MaxBatchResult", "BatchGraphFamily", "forward_cost", "cost_limit", "probe_batch",
           "decide_milp", "probe_digest", "max_batch_size", "max_batch_sizes", "search_model", "DEFAULT_STRATEGIES",
           "DEFAULT_CONFIRM_MAX_BYTES"]

# The paper's four contenders.
DEFAULT_STRATEGIES = ("checkpoint_all", "chen_sqrtn", "chen_greedy", "checkmate_milp")
# Relative slack on the cost bound for float sums taken in different orders.
_COST_RTOL = 1e-9
# CLI defaults for MILP probes (see checkmate.cli.max_batch).
DEFAULT_PROBE_TIME_LIMIT_S = 120.0
PROBE_MIP_GAP = 0.02
# Upper end of the doubling search. The search doubles until memory binds; this bound only stops it on
# a graph whose memory barely grows with the batch (a small MLP fits 65536 samples in 200 MiB), and a
# result that reaches it says so (``MaxBatchResult.search_limit_reached``). 2**30 samples keep every
# byte count of a probed graph far inside int64.
MAX_SEARCH_BATCH = 1 << 30
# The largest memory limit whose final sizes are confirmed by running the compiled step here: the step
# needs about that much RAM (plus TensorFlow's own), and the machines these studies run on are shared.
DEFAULT_CONFIRM_MAX_BYTES = 8 * 10**9
# Strategies whose search starts at the best size the others reached: the MILP (every baseline schedule
# is a feasible point of it) and the scalable strategies that keep the best baseline as a floor.
_STARTS_FROM_BEST = ("checkmate_milp", "hierarchical", "auto")
# What a cached probe means; bumped when the meaning of a stored probe changes.
_PROBE_FORMAT = 3


def forward_cost(graph: Graph) -> float:
    return float(sum(graph.cost[i] for i in graph.forward_nodes))


def cost_limit(graph: Graph, extra_forward_passes: float = 1.0) -> float:
    """Cost of a plain step plus ``extra_forward_passes`` forward passes."""
    return graph.total_cost + extra_forward_passes * forward_cost(graph)


@dataclass(frozen=True)
class BatchProbe:
    batch_size: int
    fits: bool
    # "fits", "over memory", "over compute", "undecided: ..." (the time limit came first), "solver failed: ..."
    reason: str
    compute_cost: float | None = None
    cost_limit: float | None = None
    overhead: float | None = None
    peak_memory_bytes: int | None = None
    solve_seconds: float = 0.0
    # False when the probe ended without an answer: ``fits`` is then False, but the size may fit
    decided: bool = True
    lower_bound: float | None = None   # a proven lower bound on the cost within the memory limit, if any
    source: str = ""                   # what answered: the schedule found, or the bound that ruled it out
    cached: bool = False               # read from the probe cache, not solved in this run

    def to_json_dict(self) -> dict:
        out = asdict(self)
        out.pop("cached")
        return json_native(out)  # probes hold solver numbers: plain Python values for json

    @classmethod
    def from_json_dict(cls, data: dict) -> "BatchProbe":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class MaxBatchResult:
    model: str
    strategy: str
    memory_bytes: int
    max_batch_size: int              # 0 when not even batch size 1 fits
    probes: list[BatchProbe]
    final: BatchProbe | None = None  # the final size re-solved on a freshly extracted graph
    measured: dict | None = None     # measured peak of the compiled step at the final size, if run
    extra_forward_passes: float = 1.0
    seconds: float = 0.0
    # the largest size searched fitted: the true maximum may be larger (memory did not bind)
    search_limit_reached: bool = False
    search_limit: int = MAX_SEARCH_BATCH

    @property
    def undecided(self) -> list[int]:
        """Batch sizes whose probe ended without an answer (the time limit came first)."""
        return sorted({p.batch_size for p in self.probes if not p.decided}
                      | ({self.final.batch_size} if self.final is not None and not self.final.decided else set()))

    @property
    def is_lower_bound(self) -> bool:
        """Whether an undecided probe above the result leaves the true maximum possibly larger."""
        return any(b > self.max_batch_size for b in self.undecided)

    def to_json_dict(self) -> dict:
        out = asdict(self)
        out["probes"] = [p.to_json_dict() for p in self.probes]
        out["final"] = self.final.to_json_dict() if self.final else None
        out["undecided"] = self.undecided
        out["is_lower_bound"] = self.is_lower_bound
        return json_native(out)


def _probe_of(batch_size: int, limit: float, fits: bool, reason: str, start: float, *, cost: float | None = None,
              peak: int | None = None, base_cost: float | None = None, decided: bool = True,
              bound: float | None = None, source: str = "") -> BatchProbe:
    overhead = cost / base_cost if cost is not None and base_cost else None
    return BatchProbe(batch_size, fits, reason, cost, limit, overhead, peak, time.perf_counter() - start, decided,
                      bound, source)


def _within(cost: float, limit: float) -> bool:
    return cost <= limit * (1 + _COST_RTOL)


def probe_batch(graph: Graph, batch_size: int, memory_bytes: int, strategy: str, *,
                extra_forward_passes: float = 1.0, solver: str | None = None,
                time_limit_s: float | None = None, **options: Any) -> BatchProbe:
    """Does ``strategy`` fit ``graph`` (the training graph at ``batch_size``) in the paper's setting?

    The MILP on a backend that takes a cutoff (HiGHS, the default) is answered by :func:`decide_milp`;
    on other backends, by a full solve whose result counts as "over compute" only when its proven
    bound exceeds the cost limit (otherwise the probe is undecided).
    """
    limit = cost_limit(graph, extra_forward_passes)
    start = time.perf_counter()
    if strategy == "checkmate_milp" and get_backend(solver).supports_cutoff:
        return decide_milp(graph, batch_size, memory_bytes, limit, solver=solver, time_limit_s=time_limit_s,
                           **options)
    try:
        # the search draws its own bar: no status line per probe
        r = solve(graph, memory_bytes, strategy=strategy, solver=solver, time_limit_s=time_limit_s,
                  **{"progress": False, **options})
    except InfeasibleBudgetError:
        return _probe_of(batch_size, limit, False, "over memory", start)
    except SolverError as exc:
        # a solver that stops without a schedule has not shown that nothing fits
        return _probe_of(batch_size, limit, False, f"undecided: {exc}", start, decided=False)
    if r.compute_cost is None:
        raise InvalidArgumentError(f"{strategy} gives no schedule; it cannot be used in a max-batch search")
    kw = dict(cost=r.compute_cost, peak=r.peak_memory_bytes, base_cost=graph.total_cost, bound=r.lower_bound,
              source=r.status)
    if _within(r.compute_cost, limit):
        return _probe_of(batch_size, limit, True, "fits", start, **kw)
    if r.lower_bound is not None and _within(r.lower_bound, limit):
        # the solver stopped above the limit but could not rule a schedule within it out
        return _probe_of(batch_size, limit, False, "undecided: stopped above the cost limit, bound below it",
                         start, decided=False, **kw)
    return _probe_of(batch_size, limit, False, "over compute", start, **kw)


def decide_milp(graph: Graph, batch_size: int, memory_bytes: int, limit: float, *, solver: str | None = None,
                time_limit_s: float | None = None, **options: Any) -> BatchProbe:
    """Is there a schedule within ``memory_bytes`` whose cost is at most ``limit``?

    The MILP's staged driver (:func:`checkmate.solvers.staged.solve_staged`) with the cost limit as
    both its cutoff and its target, so that each stage may answer:

    1. every baseline's schedule within the memory limit: one within the cost limit answers yes;
    2. the LP relaxation: infeasible, or a bound above the cost limit, answers no; its roundings
       (and a short local search on the cheapest) may answer yes;
    3. branch and bound with the cost limit as both its cutoff (nodes whose bound exceeds it are
       pruned, so "infeasible" means no schedule within the limit) and its target (it stops at the
       first incumbent within the limit).

    Every yes rests on a replayed schedule within both limits. The time limit covers all three
    steps; reaching it without an answer gives an undecided probe. The backend must support a cutoff
    (``Backend.supports_cutoff``: HiGHS).
    """
    start = time.perf_counter()
    opts = make_options(solver, time_limit_s, **options)
    if memory_bytes < largest_working_set_bytes(graph):
        return _probe_of(batch_size, limit, False, "over memory", start,
                         source="some node's inputs and output alone exceed the limit")
    within = limit * (1 + _COST_RTOL)
    try:
        run = solve_staged(graph, memory_bytes, opts, cutoff=within, target=within)
    except ProvenInfeasible:
        return _probe_of(batch_size, limit, False, "over memory", start, source="LP relaxation infeasible")
    except SolverError as exc:
        # a solver that stops without a schedule has not shown that nothing fits
        return _probe_of(batch_size, limit, False, f"undecided: {exc}", start, decided=False)
    best, bound, base = run.best, run.bound, graph.total_cost
    cost = None if best is None else best.cost
    if best is not None and _within(best.cost, limit):
        source = {BASELINES: f"{best.source} schedule", ROUNDING: f"rounded LP relaxation ({best.source})",
                  LOCAL_SEARCH: f"{best.source} (local search)"}.get(run.stage, "branch and bound")
        return _probe_of(batch_size, limit, True, "fits", start, cost=best.cost, peak=best.peak_bytes,
                         base_cost=base, bound=None if run.stage == BASELINES else bound, source=source)
    if run.stage == LP_RELAXATION and bound is not None and not _within(bound, limit):
        return _probe_of(batch_size, limit, False, "over compute", start, bound=bound, cost=cost, base_cost=base,
                         source="LP relaxation's bound above the cost limit")
    if run.stage == BRANCH_AND_BOUND and (run.none_within_cutoff or (bound is not None and not _within(bound, limit))):
        # with the cutoff at the limit, "infeasible" says that no schedule costs at most the limit
        return _probe_of(batch_size, limit, False, "over compute" if best is not None or run.lp_solved else
                         "over memory", start, bound=bound, cost=cost, base_cost=base,
                         source="branch and bound: nothing within the cost limit")
    return _probe_of(batch_size, limit, False, f"undecided: time limit ({time_limit_s} s)", start, decided=False,
                     bound=bound, cost=cost, base_cost=base,
                     source="no schedule within the cost limit found, none ruled out")


def probe_digest(graph: Graph) -> str:
    """A short hash of everything a probe's answer depends on in ``graph``: sizes, costs, edges, flags."""
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(graph.mem, dtype=np.int64).tobytes())
    h.update(np.ascontiguousarray(graph.cost, dtype=np.float64).tobytes())
    h.update(np.asarray(graph.edges, dtype=np.int64).tobytes())
    h.update(np.packbits(np.c_[graph.backward, graph.output, graph.recomputable]).tobytes())
    h.update(str(int(graph.fixed_mem)).encode())
    return h.hexdigest()[:24]


def valid_cached_probe(data: Any, batch_size: Any) -> bool:
    """Whether a probe read from the cache has every field :class:`BatchProbe` needs, of the right type
    and range, for ``batch_size``: a damaged or hand-edited file reads as a miss, not as a crash."""
    def number(value: Any, optional: bool = True, integral: bool = False) -> bool:
        if value is None:
            return optional
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (integral and not isinstance(value, int)):
            return False
        return math.isfinite(value) and value >= 0

    if not isinstance(data, dict):
        return False
    return (isinstance(data.get("batch_size"), int) and not isinstance(data.get("batch_size"), bool)
            and data["batch_size"] > 0 and (batch_size is None or data["batch_size"] == batch_size)
            and isinstance(data.get("fits"), bool) and isinstance(data.get("reason"), str)
            and isinstance(data.get("decided", True), bool) and isinstance(data.get("source", ""), str)
            and all(number(data.get(k)) for k in ("compute_cost", "cost_limit", "overhead", "lower_bound",
                                                  "time_limit_s"))
            and number(data.get("peak_memory_bytes"), integral=True)
            and number(data.get("solve_seconds", 0.0), optional=False))


def _cached_probe(cache: PointCache | None, key: dict | None, graph: Graph, compute: Callable[[], BatchProbe]
                  ) -> BatchProbe:
    """The probe of ``key`` on ``graph`` from ``cache``, or computed and stored.

    The time limit is not part of the key: a decided probe holds whatever the limit, so a rerun with
    another limit reuses it; an undecided one is solved again when the new limit is longer.
    """
    if cache is None or key is None:
        return compute()
    time_limit_s = key.get("time_limit_s")
    full = {**{k: v for k, v in key.items() if k != "time_limit_s"}, "graph": probe_digest(graph),
            "format": _PROBE_FORMAT}
    found = cache.get(full, lambda probe: valid_cached_probe(probe, key.get("batch_size")))
    if found is not None:
        tried_s = found.get("time_limit_s")
        longer = tried_s is not None and (time_limit_s is None or time_limit_s > tried_s)
        if found.get("decided", True) or not longer:
            cache.hits += 1
            return BatchProbe.from_json_dict({**found, "cached": True})
    cache.misses += 1
    probe = compute()
    cache.put(full, {**probe.to_json_dict(), "time_limit_s": time_limit_s})
    return probe


def max_batch_size(graph_at: Callable[[int], Graph], memory_bytes: int, strategy: str, *,
                   extra_forward_passes: float = 1.0, max_batch: int = MAX_SEARCH_BATCH, solver: str | None = None,
                   time_limit_s: float | None = None, model: str = "", start_batch: int = 1,
                   cache: PointCache | None = None, cache_key: dict | None = None, progress: Any = None,
                   **options: Any) -> MaxBatchResult:
    """Doubling then bisection over batch sizes; ``graph_at(b)`` gives the training graph at ``b``.

    ``start_batch`` is where doubling starts (a size expected to fit, e.g. another strategy's result
    for a strategy that dominates it); if it does not fit, the search restarts from 1. ``cache``
    (with ``cache_key``, what besides the graph the answers depend on) keeps every probe; ``progress``
    is a tqdm bar advanced once per probe.
    """
    get_strategy(strategy)
    start = time.perf_counter()
    probes: dict[int, BatchProbe] = {}
    key = None if cache_key is None else {**cache_key, "strategy": strategy, "memory_bytes": int(memory_bytes),
                                          "extra_forward_passes": extra_forward_passes, "solver": solver,
                                          "time_limit_s": time_limit_s, "options": options}

    def fits(b: int) -> bool:
        if b not in probes:
            graph = graph_at(b)
            probes[b] = _cached_probe(cache, None if key is None else {**key, "batch_size": b}, graph,
                                      lambda: probe_batch(graph, b, memory_bytes, strategy,
                                                          extra_forward_passes=extra_forward_passes, solver=solver,
                                                          time_limit_s=time_limit_s, **options))
            if progress is not None:
                progress.set_postfix_str(f"{strategy} b={b}: {probes[b].reason[:40]}")
                progress.update(1)
        return probes[b].fits

    best = 0
    b = max(1, int(start_batch))
    if b > 1 and not fits(b):
        b = 1
    while b <= max_batch and fits(b):
        best = b
        b *= 2
    limit_reached = False
    if best and b > max_batch and best < max_batch:
        # the doubling overshot the bound: probe the bound itself before bisecting below it
        b = max_batch
        if fits(b):
            best, limit_reached = b, True
    elif best and b > max_batch:
        limit_reached = True
    if best and not limit_reached:
        lo, hi = best, b  # lo fits, hi does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid
        best = lo
    ordered = [probes[k] for k in sorted(probes)]
    return MaxBatchResult(model, strategy, int(memory_bytes), best, ordered,
                          extra_forward_passes=extra_forward_passes, seconds=time.perf_counter() - start,
                          search_limit_reached=limit_reached, search_limit=int(max_batch))


def max_batch_sizes(graph_at: Callable[[int], Graph], memory_bytes: int, strategies: Sequence[str] = DEFAULT_STRATEGIES,
                    **kwargs: Any) -> list[MaxBatchResult]:
    return [max_batch_size(graph_at, memory_bytes, s, **kwargs) for s in strategies]


# ------------------------------------------------------------------------------------ graph families
class BatchGraphFamily:
    """Training graphs of one model at any batch size, from two extractions of the same structure.

    Every node's ``mem`` and ``cost`` and the graph's ``fixed_mem`` are affine in the batch size:
    ``value(b) = value(b1) + (value(b2) - value(b1)) * (b - b1) / (b2 - b1)``. Bytes are rounded to
    whole bytes (exact for static shapes, see the module docstring); costs are clamped at zero.
    """

    def __init__(self, g1: Graph, b1: int, g2: Graph, b2: int, *, name: str | None = None):
        if b1 == b2:
            raise InvalidArgumentError("the two extractions must be at different batch sizes")
        if g1.n != g2.n or g1.edges != g2.edges or any(
                (a.backward, a.output, a.recomputable) != (c.backward, c.output, c.recomputable)
                for a, c in zip(g1.nodes, g2.nodes)):
            raise InvalidGraphError(f"graphs at batch sizes {b1} and {b2} differ in structure; "
                                    "they cannot be interpolated")
        self.g1, self.b1, self.g2, self.b2 = g1, int(b1), g2, int(b2)
        self.name = name or g1.name
        self._mem_slope = (g2.mem.astype(np.float64) - g1.mem) / (b2 - b1)
        self._cost_slope = (g2.cost - g1.cost) / (b2 - b1)
        self._fixed_slope = (g2.fixed_mem - g1.fixed_mem) / (b2 - b1)

    @classmethod
    def proportional(cls, graph: Graph, batch_size: int, *, name: str | None = None) -> "BatchGraphFamily":
        """Scale every node's bytes and cost in proportion to the batch size; ``fixed_mem`` stays.

        The cheaper alternative when only one extraction is possible; it overstates parameter
        gradients, which do not grow with the batch.
        """
        nodes = [Node(nd.id, nd.name, 0.0, 0, nd.backward, nd.output, nd.recomputable) for nd in graph.nodes]
        zero = Graph(nodes, graph.edges, name=graph.name, fixed_mem=graph.fixed_mem)
        return cls(zero, 0, graph, batch_size, name=name)

    def __call__(self, batch_size: int) -> Graph:
        b = int(batch_size)
        if b == self.b1:
            return _renamed(self.g1, f"{self.name}-b{b}")
        if b == self.b2:
            return _renamed(self.g2, f"{self.name}-b{b}")
        mem = np.rint(self.g1.mem + self._mem_slope * (b - self.b1)).astype(np.int64)
        cost = np.maximum(0.0, self.g1.cost + self._cost_slope * (b - self.b1))
        fixed = int(round(self.g1.fixed_mem + self._fixed_slope * (b - self.b1)))
        nodes = [Node(nd.id, nd.name, float(cost[i]), max(0, int(mem[i])), nd.backward, nd.output, nd.recomputable)
                 for i, nd in enumerate(self.g1.nodes)]
        return Graph(nodes, self.g1.edges, name=f"{self.name}-b{b}", fixed_mem=max(0, fixed))


def _renamed(graph: Graph, name: str) -> Graph:
    return Graph(graph.nodes, graph.edges, name=name, fixed_mem=graph.fixed_mem)


# ------------------------------------------------------------------------------------ models
def search_model(model: str, memory_bytes: int, strategies: Sequence[str] = DEFAULT_STRATEGIES, *,
                 input_shape: tuple[int, ...] | None = None, level: str = "layer", cost_model: str = "flops",
                 gradient_nodes: bool = False, reference_batches: tuple[int, int] = (1, 2), confirm: bool | None = None,
                 confirm_max_bytes: int = DEFAULT_CONFIRM_MAX_BYTES, solver: str | None = None,
                 time_limit_s: float | None = None, progress: bool = False, extra_forward_passes: float = 1.0,
                 cache: PointCache | None = None, fused_batch_norm: bool = False,
                 **options: Any) -> list[MaxBatchResult]:
    """The max-batch study for one zoo model: search on interpolated graphs, then re-extract and
    re-solve each strategy's final batch size. ``confirm`` (default: when the limit is at most
    ``confirm_max_bytes`` and fits this machine's free memory) runs the compiled step at each final
    size and records its measured peak; otherwise ``measured`` says that the size was only planned.
    Graphs are the compact layer graphs by default (``gradient_nodes``: see
    :func:`checkmate.tf2.lowering.lower`), which the MILP solves fastest across the many probes of the
    search. ``fused_batch_norm`` lowers BatchNormalization on TensorFlow's fused kernel (see
    :func:`checkmate.tf2.lowering.lower`). ``cache`` keeps every probe (see :func:`max_batch_size`)."""
    def extract(b: int) -> Graph:
        return extract_graph(model, b, input_shape=input_shape, level=level, cost_model=cost_model,
                             gradient_nodes=gradient_nodes, fused_batch_norm=fused_batch_norm)

    b1, b2 = reference_batches
    family = BatchGraphFamily(extract(b1), b1, extract(b2), b2, name=model)
    key = {"study": "max_batch", "model": model, "input_shape": list(input_shape) if input_shape else None,
           "level": level, "cost_model": cost_model, "gradient_nodes": gradient_nodes}
    if fused_batch_norm:   # only when set, so that the probes kept before the option existed still match
        key["fused_batch_norm"] = True
    results = []
    strategies = list(strategies)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(desc=f"{model}: max batch", unit="probe", leave=False)
    common = dict(extra_forward_passes=extra_forward_passes, solver=solver, time_limit_s=time_limit_s,
                  cache=cache, progress=bar, **options)
    for strategy in strategies:
        # Every baseline's schedule is a feasible point of the MILP, so the MILP fits wherever another
        # strategy does: start its (expensive) search from the best size found so far. The scalable
        # strategies start there too (a start that does not fit restarts the search from 1).
        dominating = strategy in _STARTS_FROM_BEST
        start = max((r.max_batch_size for r in results), default=1) if dominating else 1
        res = max_batch_size(family, memory_bytes, strategy, model=model, start_batch=start,
                             cache_key={**key, "graph_source": "interpolated"}, **common)
        res = _settle_on_real_graph(res, extract, memory_bytes, strategy, {**key, "graph_source": "extracted"},
                                    common)
        if res.max_batch_size > 0:
            why_not = _why_not_confirm(confirm, memory_bytes, confirm_max_bytes)
            if why_not is None:
                res.measured = _measure(model, res.max_batch_size, memory_bytes, strategy, input_shape, level,
                                        gradient_nodes, solver, time_limit_s, fused_batch_norm)
            else:
                res.measured = {"status": f"planned only: {why_not}"}
        results.append(res)
    if bar is not None:
        bar.close()
    return results


def _settle_on_real_graph(res: MaxBatchResult, extract, memory_bytes, strategy, key, common):
    """Re-solve the final size on a real extraction; if it does not fit there, step down until one does."""
    b = res.max_batch_size
    opts = {k: v for k, v in common.items() if k not in ("cache", "progress")}
    cache_key = {**key, "strategy": strategy, "memory_bytes": int(memory_bytes),
                 **{k: v for k, v in opts.items() if k in ("extra_forward_passes", "solver", "time_limit_s")},
                 "options": {k: v for k, v in opts.items()
                             if k not in ("extra_forward_passes", "solver", "time_limit_s")}}
    while b > 0:
        graph = extract(b)
        probe = _cached_probe(common.get("cache"), {**cache_key, "batch_size": b}, graph,
                              lambda: probe_batch(graph, b, memory_bytes, strategy, **opts))
        if common.get("progress") is not None:
            common["progress"].update(1)
        if probe.fits:
            res.final = probe
            break
        res.probes.append(probe)
        b -= 1
    if b != res.max_batch_size:
        res.search_limit_reached = False
    res.max_batch_size = b
    return res


def _available_memory_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _why_not_confirm(confirm: bool | None, memory_bytes: int, max_bytes: int) -> str | None:
    """None when the compiled step should run at the final size, else why it is only planned."""
    if confirm is not None:
        return None if confirm else "confirmation turned off"
    if memory_bytes > max_bytes:
        return f"the step needs up to {memory_bytes} bytes, over the {max_bytes} allowed for it here"
    available = _available_memory_bytes()
    # Leave room for TensorFlow itself (~1 GB) and the other processes on the machine.
    if available is None or memory_bytes * 2 >= available:
        return f"the step needs up to {memory_bytes} bytes and this machine has {available} available"
    return None


def _measure(model: str, batch_size: int, memory_bytes: int, strategy: str, input_shape, level, gradient_nodes,
             solver, time_limit_s, fused_batch_norm: bool = False) -> dict:
    """Run the compiled step at ``batch_size`` and report its measured peak (or why it could not run)."""
    try:
        from checkmate.analysis.models import measure_compiled_step
    except ImportError as exc:  # the execution pieces are optional for the search itself
        return {"status": f"not measured: {exc}"}
    try:
        # The search planned each size for the whole limit: run that same plan (no allocator headroom),
        # so the measured peak shows how far the allocator's rounding takes the real step past it.
        return measure_compiled_step(model, batch_size, memory_bytes, strategy, input_shape=input_shape,
                                     level=level, gradient_nodes=gradient_nodes, solver=solver,
                                     time_limit_s=time_limit_s, allocator_headroom=0.0,
                                     fused_batch_norm=fused_batch_norm)
    except Exception as exc:  # a failed confirmation is reported, not fatal to the search
        return {"status": f"not measured: {type(exc).__name__}: {exc}"}
