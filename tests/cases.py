"""Shared small graphs and the one schedule validator used by every strategy's tests
(docs/design.md §8)."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from checkmate.graph import Graph, GraphBuilder
from checkmate.schedule import Schedule
from checkmate.simulate import replay_plan, simulate


def assert_valid_schedule(graph: Graph, schedule: Schedule, budget_bytes: int | None = None):
    """Every rule of the memory model holds, the plan replays to the same peak and cost, and the
    schedule fits ``budget_bytes`` when given. Returns the simulation result."""
    n = graph.n
    R, S = schedule.recompute, schedule.retain
    assert R.shape == (n, n) and S.shape == (n, n)
    assert np.all(np.diag(R)), "every stage t must compute node t"
    assert not np.any(np.triu(R, 1)), "no stage may compute ahead of its frontier"
    assert not np.any(np.triu(S, 0)), "nothing may be held before it is first computed"
    assert not np.any(R & S), "R and S must be exclusive per cell"
    for i in np.flatnonzero(~graph.recomputable):
        assert R[:, i].sum() == 1, f"non-recomputable node {i} computed {R[:, i].sum()} times"
    sim = simulate(graph, schedule)
    assert sim.valid, sim.violations
    replay = replay_plan(graph, schedule.plan)
    assert replay.peak_memory_bytes == sim.peak_memory_bytes
    assert replay.compute_cost == sim.compute_cost
    assert replay.compute_count == int(R.sum())
    lower = trivial_memory_lower_bound(graph)
    assert sim.peak_memory_bytes >= lower, "no schedule can beat max_k(mem[k] + inputs of k)"
    if budget_bytes is not None:
        assert sim.peak_memory_bytes <= budget_bytes, (sim.peak_memory_bytes, budget_bytes)
    return sim


def trivial_memory_lower_bound(graph: Graph) -> int:
    """max_k (mem[k] + sum of mem of k's inputs) + fixed: what computing k alone needs."""
    return int(graph.fixed_mem + max(int(graph.mem[k]) + sum(int(graph.mem[d]) for d in graph.deps[k])
                                     for k in range(graph.n)))


def training_chain(layers: int, *, cost: float = 1.0, mem: int = 1, name: str | None = None) -> Graph:
    """A unit training chain: forward f0..f{L-1} (f{L-1} is the loss), backward g{L-1}..g0.

    g_j reads the upstream gradient and f_j (as Chen et al.'s model: each layer's backward needs that
    layer's forward value); g0 is the step's output.
    """
    b = GraphBuilder(name or f"chain{layers}")
    f = []
    for i in range(layers):
        f.append(b.add_node(f"f{i}", cost, mem, [f[-1]] if f else []))
    prev = f[-1]
    for j in reversed(range(layers)):
        deps = [prev, f[j]] if prev != f[j] else [prev]
        prev = b.add_node(f"g{j}", cost, mem, deps, backward=True, output=(j == 0))
    return b.build()


def diamond() -> Graph:
    b = GraphBuilder("diamond")
    a = b.add_node("a", 2, 4)
    l = b.add_node("left", 3, 6, [a])
    r = b.add_node("right", 1, 2, [a])
    j = b.add_node("join", 1, 4, [l, r])
    gj = b.add_node("g_join", 1, 4, [j], backward=True)
    gl = b.add_node("g_left", 2, 6, [gj, l], backward=True)
    gr = b.add_node("g_right", 1, 2, [gj, r], backward=True)
    b.add_node("g_a", 2, 4, [gl, gr, a], backward=True, output=True)
    return b.build()


def skip_connection() -> Graph:
    """A residual block: x -> c1 -> c2 -> add(x, c2) -> loss, and its backward."""
    b = GraphBuilder("skip")
    x = b.add_node("x", 1, 8)
    c1 = b.add_node("c1", 4, 8, [x])
    c2 = b.add_node("c2", 4, 8, [c1])
    add = b.add_node("add", 1, 8, [x, c2])
    loss = b.add_node("loss", 1, 1, [add])
    gadd = b.add_node("g_add", 1, 8, [loss], backward=True)
    gc2 = b.add_node("g_c2", 4, 8, [gadd, c1], backward=True)
    gc1 = b.add_node("g_c1", 4, 8, [gc2, x], backward=True)
    b.add_node("g_x", 1, 8, [gc1, gadd], backward=True, output=True)
    return b.build()


def unet_like(depth: int = 3) -> Graph:
    """An encoder-decoder with long skips (each encoder level feeds its decoder level)."""
    b = GraphBuilder(f"unet{depth}")
    enc = []
    prev = None
    size = 64
    for d in range(depth):
        prev = b.add_node(f"enc{d}", 2.0, size, [prev] if prev is not None else [])
        enc.append(prev)
        size //= 2
    mid = b.add_node("mid", 2.0, size, [prev])
    prev = mid
    dec = []
    for d in reversed(range(depth)):
        size *= 2
        prev = b.add_node(f"dec{d}", 2.0, size, [prev, enc[d]])
        dec.append(prev)
    loss = b.add_node("loss", 1.0, 1, [prev])
    grads = {}
    g = b.add_node("g_loss", 1.0, 64, [loss], backward=True)
    gdec = {}
    for idx, d in enumerate(range(depth)):
        node = dec[depth - 1 - d]
        g = b.add_node(f"g_dec{d}", 3.0, int(b._nodes[node].mem), [g, node], backward=True)
        gdec[d] = g
    g = b.add_node("g_mid", 3.0, int(b._nodes[mid].mem), [g, mid], backward=True)
    for d in reversed(range(depth)):
        g = b.add_node(f"g_enc{d}", 3.0, int(b._nodes[enc[d]].mem), [g, gdec[d], enc[d]], backward=True,
                       output=(d == 0))
    return b.build()


SMALL_CASES = {
    "chain4": lambda: training_chain(4),
    "chain8": lambda: training_chain(8, cost=2.0, mem=3),
    "diamond": diamond,
    "skip": skip_connection,
    "unet3": unet_like,
}


@st.composite
def random_dags(draw, min_nodes: int = 2, max_nodes: int = 12, max_mem: int = 20):
    """Hypothesis strategy: random DAGs in topological id order with random costs, sizes and flags."""
    n = draw(st.integers(min_nodes, max_nodes))
    b = GraphBuilder("random")
    for v in range(n):
        deps = []
        if v > 0:
            # always connect to an earlier node so the graph is mostly connected, plus a few extra edges
            deps.append(draw(st.integers(0, v - 1)))
            extra = draw(st.lists(st.integers(0, v - 1), max_size=2))
            deps.extend(extra)
        b.add_node(f"n{v}", draw(st.integers(1, 10)), draw(st.integers(0, max_mem)), sorted(set(deps)),
                   backward=v >= n // 2, output=(v == n - 1) or draw(st.booleans()) and draw(st.booleans()) and v >= n // 2)
    return b.build()


def brute_force_optimum(graph: Graph, budget_bytes: int) -> tuple[float, Schedule] | None:
    """The cheapest valid schedule within ``budget_bytes`` by enumerating every retention matrix.

    For a fixed S the minimal R is both cheapest and smallest in memory, so enumerating S alone is
    exhaustive over the stage model. Only for tiny graphs: 2^(n(n-1)/2) candidates.
    """
    import itertools

    from checkmate.schedule import minimal_recompute

    n = graph.n
    assert n <= 6, "brute force is for tiny graphs"
    cells = [(t, i) for t in range(1, n) for i in range(t)]
    best: tuple[float, Schedule] | None = None
    for bits in itertools.product((False, True), repeat=len(cells)):
        S = np.zeros((n, n), dtype=bool)
        for (t, i), on in zip(cells, bits):
            S[t, i] = on
        R = minimal_recompute(graph, S)
        schedule = Schedule.from_matrices(graph, R, S)
        sim = simulate(graph, schedule)
        if not sim.valid or sim.peak_memory_bytes > budget_bytes:
            continue
        if best is None or sim.compute_cost < best[0] - 1e-9:
            best = (sim.compute_cost, schedule)
    return best


def exchanges_with_and_without_memo(monkeypatch, graph: Graph, start, budget_bytes: int, *, tries: int, seed: int):
    """``hold_and_repair`` from ``start`` twice, with the same draws: first with its move memo (counting
    the moves it served), then with every move costed again. Returns (with memo, without, served)."""
    import time

    from checkmate.solvers import rounding

    served = []
    real_get = rounding._MoveMemo.get

    def counting(self, t, i):
        out = real_get(self, t, i)
        served.append(out is not None)
        return out

    monkeypatch.setattr(rounding._MoveMemo, "get", counting)
    with_memo = rounding.hold_and_repair(graph, start, budget_bytes, deadline=time.perf_counter() + 300, tries=tries,
                                         seed=seed, cost_draws=0.5)
    monkeypatch.setattr(rounding._MoveMemo, "get", lambda self, t, i: None)
    without = rounding.hold_and_repair(graph, start, budget_bytes, deadline=time.perf_counter() + 300, tries=tries,
                                       seed=seed, cost_draws=0.5)
    return with_memo, without, sum(served)
