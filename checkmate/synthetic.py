"""Synthetic training graphs: chains, U-Nets, residual networks and random DAGs.

Used by the benchmarks and tests where a real model would only add TensorFlow time; the backward part
is derived from the forward part the way reverse-mode differentiation does it, so the graphs have the
shape (and the memory-to-compute profile) of real training graphs.
"""

from __future__ import annotations

import random
from typing import Sequence

from checkmate.graph import Graph, GraphBuilder

__all__ = ["training_graph", "chain", "unet", "resnet", "random_forward"]

ForwardSpec = Sequence[tuple[str, float, int, Sequence[int]]]  # (name, cost, mem, deps) in topological order


def training_graph(forward: ForwardSpec, *, name: str, fixed_mem: int = 0, backward_cost_factor: float = 2.0) -> Graph:
    """Append the reverse-mode backward pass to a forward graph whose last node is the loss.

    The gradient node of forward node ``v`` reads the gradients of ``v``'s users, ``v``'s own value
    and ``v``'s inputs (what a layer's backward needs); it costs ``backward_cost_factor`` times ``v``
    and is as large as ``v``. Gradients of source nodes are the step's outputs.
    """
    b = GraphBuilder(name, fixed_mem)
    users: dict[int, list[int]] = {i: [] for i in range(len(forward))}
    for i, (node_name, cost, mem, deps) in enumerate(forward):
        b.add_node(node_name, cost, mem, deps)
        for d in deps:
            users[d].append(i)
    loss = len(forward) - 1
    grad: dict[int, int] = {}
    for v in range(loss, -1, -1):
        node_name, cost, mem, deps = forward[v]
        if v != loss and not users[v]:
            continue  # a dead-end forward value gets no gradient
        g_deps = [grad[u] for u in users[v] if u in grad] + [v] + list(deps)
        grad[v] = b.add_node(f"grad_{node_name}", cost * backward_cost_factor, mem, sorted(set(g_deps)),
                             backward=True, output=not deps)
    return b.build()


def chain(layers: int, *, cost: float = 1.0, mem: int = 1 << 20, name: str | None = None) -> Graph:
    """A linear network of ``layers`` equal layers followed by a loss."""
    fwd = [(f"layer{i}", cost, mem, [i - 1] if i else []) for i in range(layers)]
    fwd.append(("loss", cost / 10, 4, [layers - 1]))
    return training_graph(fwd, name=name or f"chain{layers}")


def unet(depth: int = 4, *, base_mem: int = 64 << 20, base_cost: float = 10.0, convs_per_level: int = 2,
         name: str | None = None) -> Graph:
    """A U-Net: ``depth`` down levels, a bottleneck and ``depth`` up levels with long skips."""
    fwd: list[tuple[str, float, int, list[int]]] = []

    def add(nm: str, cost: float, mem: int, deps: list[int]) -> int:
        fwd.append((nm, cost, mem, deps))
        return len(fwd) - 1

    prev = None
    skips = []
    mem, cost, channels = base_mem, base_cost, 1
    for level in range(depth):
        for c in range(convs_per_level):
            prev = add(f"down{level}_conv{c}", cost * channels, mem * channels, [prev] if prev is not None else [])
        skips.append(prev)
        prev = add(f"down{level}_pool", cost / 4, mem * channels // 4, [prev])
        mem //= 4
        channels *= 2
    for c in range(convs_per_level):
        prev = add(f"bottleneck_conv{c}", cost * channels, mem * channels, [prev])
    for level in reversed(range(depth)):
        mem *= 4
        channels //= 2
        up = add(f"up{level}_upsample", cost, mem * channels, [prev])
        prev = add(f"up{level}_concat", cost / 10, 2 * mem * channels, [up, skips[level]])
        for c in range(convs_per_level):
            prev = add(f"up{level}_conv{c}", cost * channels, mem * channels, [prev])
    add("loss", cost / 10, 4, [prev])
    return training_graph(fwd, name=name or f"unet{depth}")


def resnet(blocks: int, *, mem: int = 16 << 20, cost: float = 5.0, name: str | None = None) -> Graph:
    """A residual network: a stem, then ``blocks`` blocks of conv-bn-relu-conv-bn + skip add."""
    fwd: list[tuple[str, float, int, list[int]]] = [("stem", cost, mem, [])]
    prev = 0
    for b in range(blocks):
        start = prev
        for part, c in (("conv1", cost), ("bn1", cost / 5), ("relu1", cost / 10), ("conv2", cost), ("bn2", cost / 5)):
            fwd.append((f"block{b}_{part}", c, mem, [prev]))
            prev = len(fwd) - 1
        fwd.append((f"block{b}_add", cost / 10, mem, [start, prev]))
        prev = len(fwd) - 1
    fwd.append(("loss", cost / 10, 4, [prev]))
    return training_graph(fwd, name=name or f"resnet{blocks}")


def random_forward(nodes: int, *, seed: int = 0, max_fan_in: int = 3, skip_prob: float = 0.3,
                   name: str | None = None) -> Graph:
    """A random forward DAG (each node reads its predecessor and, sometimes, earlier nodes) + backward."""
    rng = random.Random(seed)
    fwd: list[tuple[str, float, int, list[int]]] = []
    for i in range(nodes):
        deps = [i - 1] if i else []
        while i > 1 and len(deps) < max_fan_in and rng.random() < skip_prob:
            deps.append(rng.randrange(0, i - 1))
        fwd.append((f"op{i}", rng.uniform(1, 10), rng.randint(1, 64) << 16, sorted(set(deps))))
    fwd.append(("loss", 0.1, 4, [nodes - 1]))
    return training_graph(fwd, name=name or f"random{nodes}_s{seed}")
