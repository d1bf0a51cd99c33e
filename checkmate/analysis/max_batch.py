"""The largest batch size each strategy trains within a memory limit (the Checkmate paper's max-batch study).

Setting (as in the paper): a strategy "fits" batch size ``b`` when it finds a schedule for the
training graph at ``b`` whose peak memory is within the limit **and** whose compute cost is at most
one extra forward pass over a plain step (cost <= forward + backward + forward). Checkpoint-all fits
while its peak does; Chen's sqrt(n) recomputes each forward value at most once, so it meets the
cost bound by construction; the MILP minimises cost within the memory limit, so it fits exactly when
its optimum is within the cost bound.

Search: doubling from batch size 1 until a size does not fit, then bisection between the last size
that fitted and the first that did not. This assumes fitting is monotone in batch size, which holds
for every strategy here because every activation grows with the batch while the graph's structure
does not change.

Graphs per batch size (:class:`BatchGraphFamily`): the model is extracted at two batch sizes and
every node's bytes (and cost) are interpolated as an affine function of the batch size. For bytes
this is exact, not an approximation: with static shapes each tensor's size is either proportional
to the batch size (activations) or independent of it (parameter gradients, the fixed memory of
weights and optimizer state), and a sum of such terms is affine. Costs interpolate the same way
(exact for the FLOP cost model, a linear fit for profiled times). The final batch size of each
strategy is re-extracted and re-solved, so the reported result never rests on interpolation, and,
where the memory limit fits this machine, confirmed by running the compiled training step and
measuring its peak memory.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from checkmate.analysis.models import extract_graph
from checkmate.errors import InfeasibleBudgetError, InvalidArgumentError, InvalidGraphError, SolverError
from checkmate.graph import Graph, Node
from checkmate.solvers import get_strategy, solve

__all__ = ["BatchProbe", "MaxBatchResult", "BatchGraphFamily", "forward_cost", "cost_limit", "probe_batch",
           "max_batch_size", "max_batch_sizes", "DEFAULT_STRATEGIES"]

# The paper's four contenders.
DEFAULT_STRATEGIES = ("checkpoint_all", "chen_sqrtn", "chen_greedy", "checkmate_milp")
# Relative slack on the cost bound for float sums taken in different orders.
_COST_RTOL = 1e-9
# CLI defaults for MILP probes (see checkmate.cli.max_batch).
DEFAULT_PROBE_TIME_LIMIT_S = 120.0
PROBE_MIP_GAP = 0.02
# Upper end of the doubling search: beyond any batch size a single device holds for these models.
MAX_SEARCH_BATCH = 1 << 16


def forward_cost(graph: Graph) -> float:
    return float(sum(graph.cost[i] for i in graph.forward_nodes))


def cost_limit(graph: Graph, extra_forward_passes: float = 1.0) -> float:
    """Cost of a plain step plus ``extra_forward_passes`` forward passes."""
    return graph.total_cost + extra_forward_passes * forward_cost(graph)


@dataclass(frozen=True)
class BatchProbe:
    batch_size: int
    fits: bool
    reason: str                      # "fits", "over memory", "over compute", "solver failed: ..."
    compute_cost: float | None = None
    cost_limit: float | None = None
    overhead: float | None = None
    peak_memory_bytes: int | None = None
    solve_seconds: float = 0.0


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

    def to_json_dict(self) -> dict:
        out = asdict(self)
        out["probes"] = [asdict(p) for p in self.probes]
        out["final"] = asdict(self.final) if self.final else None
        return out


def probe_batch(graph: Graph, batch_size: int, memory_bytes: int, strategy: str, *,
                extra_forward_passes: float = 1.0, solver: str | None = None,
                time_limit_s: float | None = None, **options: Any) -> BatchProbe:
    """Does ``strategy`` fit ``graph`` (the training graph at ``batch_size``) in the paper's setting?"""
    limit = cost_limit(graph, extra_forward_passes)
    start = time.perf_counter()
    try:
        r = solve(graph, memory_bytes, strategy=strategy, solver=solver, time_limit_s=time_limit_s, **options)
    except InfeasibleBudgetError:
        return BatchProbe(batch_size, False, "over memory", cost_limit=limit,
                          solve_seconds=time.perf_counter() - start)
    except SolverError as exc:
        return BatchProbe(batch_size, False, f"solver failed: {exc}", cost_limit=limit,
                          solve_seconds=time.perf_counter() - start)
    if r.compute_cost is None:
        raise InvalidArgumentError(f"{strategy} gives no schedule; it cannot be used in a max-batch search")
    fits = r.compute_cost <= limit * (1 + _COST_RTOL)
    return BatchProbe(batch_size, fits, "fits" if fits else "over compute", r.compute_cost, limit, r.overhead,
                      r.peak_memory_bytes, r.solve_seconds)


def max_batch_size(graph_at: Callable[[int], Graph], memory_bytes: int, strategy: str, *,
                   extra_forward_passes: float = 1.0, max_batch: int = MAX_SEARCH_BATCH, solver: str | None = None,
                   time_limit_s: float | None = None, model: str = "", start_batch: int = 1,
                   **options: Any) -> MaxBatchResult:
    """Doubling then bisection over batch sizes; ``graph_at(b)`` gives the training graph at ``b``.

    ``start_batch`` is where doubling starts (a size expected to fit, e.g. another strategy's result
    for a strategy that dominates it); if it does not fit, the search restarts from 1.
    """
    get_strategy(strategy)
    start = time.perf_counter()
    probes: dict[int, BatchProbe] = {}

    def fits(b: int) -> bool:
        if b not in probes:
            probes[b] = probe_batch(graph_at(b), b, memory_bytes, strategy,
                                    extra_forward_passes=extra_forward_passes, solver=solver,
                                    time_limit_s=time_limit_s, **options)
        return probes[b].fits

    best = 0
    b = max(1, int(start_batch))
    if b > 1 and not fits(b):
        b = 1
    while b <= max_batch and fits(b):
        best = b
        b *= 2
    if best and b <= max_batch:
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
                          extra_forward_passes=extra_forward_passes, seconds=time.perf_counter() - start)


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
                 solver: str | None = None, time_limit_s: float | None = None, progress: bool = False,
                 extra_forward_passes: float = 1.0, **options: Any) -> list[MaxBatchResult]:
    """The max-batch study for one zoo model: search on interpolated graphs, then re-extract and
    re-solve each strategy's final batch size; ``confirm`` (default: when the limit fits this
    machine's free memory) runs the compiled step there and records its measured peak. Graphs are
    the compact layer graphs by default (``gradient_nodes``: see :func:`checkmate.tf2.lowering.lower`),
    which the MILP solves fastest across the many probes of the search."""
    def extract(b: int) -> Graph:
        return extract_graph(model, b, input_shape=input_shape, level=level, cost_model=cost_model,
                             gradient_nodes=gradient_nodes)

    b1, b2 = reference_batches
    family = BatchGraphFamily(extract(b1), b1, extract(b2), b2, name=model)
    results = []
    strategies = list(strategies)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(strategies), desc=f"{model}: max batch", unit="strategy", leave=False)
    for strategy in strategies:
        # Within the memory and compute limits the MILP is optimal, so it fits wherever any other
        # strategy does: start its (expensive) search from the best size found so far.
        start = max((r.max_batch_size for r in results), default=1) if strategy == "checkmate_milp" else 1
        res = max_batch_size(family, memory_bytes, strategy, extra_forward_passes=extra_forward_passes,
                             solver=solver, time_limit_s=time_limit_s, model=model, start_batch=start, **options)
        res = _settle_on_real_graph(res, extract, memory_bytes, strategy, extra_forward_passes, solver, time_limit_s,
                                    options)
        if _should_confirm(confirm, memory_bytes) and res.max_batch_size > 0:
            res.measured = _measure(model, res.max_batch_size, memory_bytes, strategy, input_shape, level,
                                    gradient_nodes, solver, time_limit_s)
        results.append(res)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return results


def _settle_on_real_graph(res: MaxBatchResult, extract, memory_bytes, strategy, extra, solver, time_limit_s,
                          options):
    """Re-solve the final size on a real extraction; if it does not fit there, step down until one does."""
    b = res.max_batch_size
    while b > 0:
        probe = probe_batch(extract(b), b, memory_bytes, strategy, extra_forward_passes=extra, solver=solver,
                            time_limit_s=time_limit_s, **options)
        if probe.fits:
            res.final = probe
            break
        res.probes.append(probe)
        b -= 1
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


def _should_confirm(confirm: bool | None, memory_bytes: int) -> bool:
    if confirm is not None:
        return confirm
    available = _available_memory_bytes()
    # Leave room for TensorFlow itself (~1 GB) and the other processes on the machine.
    return available is not None and memory_bytes * 2 < available


def _measure(model: str, batch_size: int, memory_bytes: int, strategy: str, input_shape, level, gradient_nodes,
             solver, time_limit_s) -> dict:
    """Run the compiled step at ``batch_size`` and report its measured peak (or why it could not run)."""
    try:
        from checkmate.analysis.models import measure_compiled_step
    except ImportError as exc:  # the execution pieces are optional for the search itself
        return {"status": f"not measured: {exc}"}
    try:
        return measure_compiled_step(model, batch_size, memory_bytes, strategy, input_shape=input_shape,
                                     level=level, gradient_nodes=gradient_nodes, solver=solver,
                                     time_limit_s=time_limit_s)
    except Exception as exc:  # a failed confirmation is reported, not fatal to the search
        return {"status": f"not measured: {type(exc).__name__}: {exc}"}
