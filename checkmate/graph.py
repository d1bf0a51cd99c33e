"""The data-flow graph every solver works on.

A :class:`Graph` is immutable. Its nodes are numbered ``0..n-1`` in a topological order (inputs of a
node always have smaller ids); node ``i`` produces one value of ``mem[i]`` bytes at compute cost
``cost[i]``. Graphs whose ids are not topological are relabelled (stable: the original order is kept
wherever the edges allow it), never rejected; the original ids stay available as ``source_ids``.

Files: the native ``checkmate-graph/1`` JSON and networkx node-link JSON (``cost_cpu``/``cost_ram``
attributes, ``links`` or ``edges`` key) are read; the native form is written (docs/design.md §4).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import networkx as nx
import numpy as np

from checkmate.errors import InvalidArgumentError, InvalidGraphError
from checkmate.io import atomic_write_json, read_text

__all__ = ["Node", "Graph", "GraphBuilder", "load_graph", "save_graph", "graph_from_dict", "GRAPH_FORMAT"]

GRAPH_FORMAT = "checkmate-graph/1"

# Byte counts are held in int64 arrays and summed there: every sum of sizes (and the fixed bytes) must
# stay below 2**63 for peaks to be exact.
_MAX_BYTES = 2**63 - 1


@dataclass(frozen=True)
class Node:
    """One operation of the graph and the value it produces."""

    id: int
    name: str
    cost: float
    mem: int
    backward: bool = False
    output: bool = False
    # False for ops whose re-execution would change results (reads of variables the step assigns,
    # stateful random ops): every solver computes such a node exactly once.
    recomputable: bool = True


def _check_number(value: Any, what: str, node_label: str, *, integral: bool) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InvalidGraphError(f"node {node_label}: {what} must be a number, got {value!r}")
    if isinstance(value, (float, np.floating)) and not math.isfinite(float(value)):
        raise InvalidGraphError(f"node {node_label}: {what} is {value!r}; it must be finite")
    if value < 0:
        raise InvalidGraphError(f"node {node_label}: {what} is negative ({value!r})")
    if integral:
        # compare as floats only for floats: an int above 2**53 has no exact float and is still whole
        if isinstance(value, (float, np.floating)) and float(value) != int(value):
            raise InvalidGraphError(f"node {node_label}: {what} must be a whole number of bytes, got {value!r}")
        if int(value) > _MAX_BYTES:
            raise InvalidGraphError(f"node {node_label}: {what} is {value!r} bytes, more than 2**63 - 1")
        return int(value)
    return float(value)


class Graph:
    """Immutable, topologically ordered data-flow graph.

    Parameters
    ----------
    nodes:
        The nodes; their ``id`` fields are the identifiers used by ``edges`` (any hashable ints).
    edges:
        ``(u, v)`` pairs meaning "the value of u is an input of v".
    name:
        A label carried into schedules and reports.
    fixed_mem:
        Bytes resident for the whole step (parameters, optimizer state), counted in every peak.
    """

    __slots__ = ("name", "fixed_mem", "nodes", "deps", "users", "source_ids",
                 "cost", "mem", "backward", "output", "recomputable", "_edges")

    def __init__(self, nodes: Sequence[Node], edges: Iterable[tuple[int, int]], *, name: str = "graph",
                 fixed_mem: int = 0):
        nodes = list(nodes)
        if not nodes:
            raise InvalidGraphError("the graph has no nodes")
        fixed = _check_number(fixed_mem, "fixed_mem", "(graph)", integral=True)
        by_id: dict[int, Node] = {}
        for node in nodes:
            if node.id in by_id:
                raise InvalidGraphError(f"duplicate node id {node.id!r} (names {by_id[node.id].name!r} and {node.name!r})")
            _check_number(node.cost, "cost", f"{node.id} ({node.name})", integral=False)
            _check_number(node.mem, "mem", f"{node.id} ({node.name})", integral=True)
            by_id[node.id] = node

        dg = nx.DiGraph()
        dg.add_nodes_from(by_id)
        for edge in edges:
            try:
                u, v = edge
                hash(u), hash(v)
            except (TypeError, ValueError):
                raise InvalidGraphError(f"edge {edge!r} is not a [source, target] pair of node ids") from None
            for end in (u, v):
                if end not in by_id:
                    raise InvalidGraphError(f"edge [{u!r}, {v!r}] refers to node {end!r}, which does not exist")
            if u == v:
                raise InvalidGraphError(f"edge [{u!r}, {v!r}] is a self-loop on node {u!r} ({by_id[u].name})")
            dg.add_edge(u, v)
        if not nx.is_directed_acyclic_graph(dg):
            cycle = nx.find_cycle(dg)
            path = " -> ".join(f"{u} ({by_id[u].name})" for u, _ in cycle) + f" -> {cycle[0][0]}"
            raise InvalidGraphError(f"the graph has a cycle: {path}")

        if fixed + sum(int(node.mem) for node in nodes) > _MAX_BYTES:
            raise InvalidGraphError("the node sizes and fixed_mem add up to more than 2**63 - 1 bytes")
        # Each node runs at most n times, so n * sum(cost) bounds the cost of any schedule.
        if not math.isfinite(len(nodes) * sum(float(node.cost) for node in nodes)):
            raise InvalidGraphError("the node costs are too large: the cost of a schedule would overflow")

        # Stable relabelling: among the nodes ready at each step, take the one listed first.
        position = {nid: pos for pos, nid in enumerate(by_id)}
        order = list(nx.lexicographical_topological_sort(dg, key=position.__getitem__))
        new_id = {old: new for new, old in enumerate(order)}

        self.name = str(name)
        self.fixed_mem = int(fixed)
        self.source_ids = tuple(order)
        self.nodes = tuple(
            replace(by_id[old], id=new_id[old], cost=float(by_id[old].cost), mem=int(by_id[old].mem),
                    backward=bool(by_id[old].backward), output=bool(by_id[old].output),
                    recomputable=bool(by_id[old].recomputable))
            for old in order
        )
        self.deps = tuple(tuple(sorted(new_id[u] for u in dg.predecessors(old))) for old in order)
        self.users = tuple(tuple(sorted(new_id[v] for v in dg.successors(old))) for old in order)
        self.cost = self._frozen(np.array([nd.cost for nd in self.nodes], dtype=np.float64))
        self.mem = self._frozen(np.array([nd.mem for nd in self.nodes], dtype=np.int64))
        self.backward = self._frozen(np.array([nd.backward for nd in self.nodes], dtype=bool))
        self.output = self._frozen(np.array([nd.output for nd in self.nodes], dtype=bool))
        self.recomputable = self._frozen(np.array([nd.recomputable for nd in self.nodes], dtype=bool))
        self._edges = tuple((u, v) for v in range(len(order)) for u in self.deps[v])

    @staticmethod
    def _frozen(array: np.ndarray) -> np.ndarray:
        array.setflags(write=False)
        return array

    # ----------------------------------------------------------------------------------- queries
    @property
    def n(self) -> int:
        return len(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def edges(self) -> tuple[tuple[int, int], ...]:
        """All ``(u, v)`` edges, grouped by target in id order."""
        return self._edges

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(nd.name for nd in self.nodes)

    @property
    def forward_nodes(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.n) if not self.backward[i])

    @property
    def backward_nodes(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.n) if self.backward[i])

    @property
    def total_cost(self) -> float:
        """Cost of computing every node once (the checkpoint-all cost)."""
        return float(self.cost.sum())

    def to_networkx(self) -> nx.DiGraph:
        dg = nx.DiGraph(name=self.name)
        for nd in self.nodes:
            dg.add_node(nd.id, name=nd.name, cost=nd.cost, mem=nd.mem, backward=nd.backward,
                        output=nd.output, recomputable=nd.recomputable)
        dg.add_edges_from(self._edges)
        return dg

    def articulation_points(self) -> tuple[int, ...]:
        """Forward nodes that separate the forward graph into a before and an after.

        A forward node ``a`` qualifies when every forward edge either stays on one side of it or
        starts at ``a`` itself: the classic segment boundaries of Chen et al.'s checkpointing. For a
        chain that is every interior node.
        """
        fwd = self.forward_nodes
        if not fwd:
            return ()
        # reach[j] = the largest forward id that any forward node <= j feeds
        rank = {v: r for r, v in enumerate(fwd)}
        furthest_from = [0] * len(fwd)
        for r, u in enumerate(fwd):
            furthest_from[r] = max((rank[v] for v in self.users[u] if v in rank), default=r)
        points = []
        reach_before = -1  # furthest target of edges leaving nodes strictly before rank r
        for r, u in enumerate(fwd):
            if 0 < r < len(fwd) - 1 and reach_before <= r:
                points.append(u)
            reach_before = max(reach_before, furthest_from[r])
        return tuple(points)

    def __repr__(self) -> str:
        return f"Graph(name={self.name!r}, n={self.n}, edges={len(self._edges)}, fixed_mem={self.fixed_mem})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Graph):
            return NotImplemented
        return (self.name, self.fixed_mem, self.nodes, self._edges) == (other.name, other.fixed_mem, other.nodes, other._edges)

    def __hash__(self) -> int:
        return hash((self.name, self.fixed_mem, self.nodes, self._edges))

    # ----------------------------------------------------------------------------------- files
    def to_dict(self) -> dict:
        return {
            "format": GRAPH_FORMAT,
            "name": self.name,
            "nodes": [
                {"id": nd.id, "name": nd.name, "cost": nd.cost, "mem": nd.mem, "backward": nd.backward,
                 "output": nd.output, **({} if nd.recomputable else {"recomputable": False})}
                for nd in self.nodes
            ],
            "edges": [list(e) for e in self._edges],
            "fixed_mem": self.fixed_mem,
        }


class GraphBuilder:
    """Incremental construction: ``add_node`` returns the id to use in later ``add_node(deps=...)``."""

    def __init__(self, name: str = "graph", fixed_mem: int = 0):
        self.name = name
        self.fixed_mem = fixed_mem
        self._nodes: list[Node] = []
        self._edges: list[tuple[int, int]] = []

    def add_node(self, name: str, cost: float, mem: int, deps: Iterable[int] = (), *, backward: bool = False,
                 output: bool = False, recomputable: bool = True) -> int:
        nid = len(self._nodes)
        self._nodes.append(Node(nid, name, cost, mem, backward, output, recomputable))
        self._edges.extend((int(d), nid) for d in deps)
        return nid

    def add_edge(self, u: int, v: int) -> None:
        self._edges.append((u, v))

    def build(self) -> Graph:
        return Graph(self._nodes, self._edges, name=self.name, fixed_mem=self.fixed_mem)


def _flag(value: Any, what: str, label: str) -> bool:
    if value is None:
        return False
    if isinstance(value, (bool, np.bool_)) or value in (0, 1):
        return bool(value)
    raise InvalidGraphError(f"node {label}: {what} must be true or false, got {value!r}")


def _node_id(raw: Any, index: int) -> int | str:
    """An id as files give it: an integer, or a string (networkx graphs are often keyed by name).

    Strings that spell an integer and integral floats are read as that integer, so that ``"3"``,
    ``3.0`` and ``3`` name the same node wherever they appear.
    """
    if isinstance(raw, bool) or raw is None:
        raise InvalidGraphError(f"node #{index} has no valid id (got {raw!r})")
    if isinstance(raw, (int, np.integer)):
        return int(raw)
    if isinstance(raw, (float, np.floating)) and math.isfinite(raw) and float(raw) == int(raw):
        return int(raw)
    if isinstance(raw, str):
        try:
            return int(raw)
        except ValueError:
            return raw
    raise InvalidGraphError(f"node #{index}: id {raw!r} is not an integer or a string")


def _edge_end(raw: Any, u: Any, v: Any) -> int | str:
    try:
        return _node_id(raw, 0)
    except InvalidGraphError:
        raise InvalidGraphError(f"edge [{u!r}, {v!r}]: endpoint {raw!r} is not a node id") from None


def _first_present(raw: Mapping, *keys: str) -> Any:
    """The value of the first key that is present and not null."""
    for key in keys:
        if raw.get(key) is not None:
            return raw[key]
    return None


def _edge_pair(raw: Any, key: str) -> tuple[Any, Any]:
    if isinstance(raw, Mapping):
        if "source" not in raw or "target" not in raw:
            raise InvalidGraphError(f"an entry of {key!r} lacks 'source' or 'target': {raw!r}")
        return raw["source"], raw["target"]
    if isinstance(raw, (list, tuple)) and len(raw) == 2:
        return raw[0], raw[1]
    raise InvalidGraphError(f"an entry of {key!r} is not a [source, target] pair: {raw!r}")


def graph_from_dict(data: Any, *, default_name: str = "graph") -> Graph:
    """Build a Graph from parsed JSON in either supported form (native or networkx node-link)."""
    if not isinstance(data, Mapping):
        raise InvalidGraphError("a graph file must hold a JSON object")
    fmt = data.get("format")
    if fmt is not None and fmt != GRAPH_FORMAT:
        raise InvalidGraphError(f"unknown graph format {fmt!r} (expected {GRAPH_FORMAT!r} or networkx node-link JSON)")
    raw_nodes = data.get("nodes")
    if not isinstance(raw_nodes, list):
        raise InvalidGraphError("the graph file has no 'nodes' list")
    present = [key for key in ("edges", "links") if data.get(key) is not None]
    if len(present) == 2 and data["edges"] and data["links"]:
        raise InvalidGraphError("the graph file has both 'edges' and 'links'; give the edges once")
    # with both keys, one of them is empty: read the other
    edge_key = next((key for key in present if data[key]), present[0] if present else None)
    if edge_key is None and ("edges" in data or "links" in data):
        raise InvalidGraphError(f"{'edges' if 'edges' in data else 'links'!r} must be a list, got null")
    raw_edges = data.get(edge_key, []) if edge_key else []
    if not isinstance(raw_edges, list):
        raise InvalidGraphError(f"{edge_key!r} must be a list")

    graph_attrs = data.get("graph") if isinstance(data.get("graph"), Mapping) else {}
    name = data.get("name") or graph_attrs.get("name") or default_name
    fixed_mem = data.get("fixed_mem", graph_attrs.get("fixed_mem", 0))
    if fixed_mem is None:
        fixed_mem = 0

    nodes = []
    for index, raw in enumerate(raw_nodes):
        if not isinstance(raw, Mapping):
            raise InvalidGraphError(f"node #{index} is not a JSON object")
        nid = _node_id(raw.get("id"), index)
        label = f"{nid}" + (f" ({raw['name']})" if raw.get("name") else "")
        cost = _first_present(raw, "cost", "cost_cpu")
        mem = _first_present(raw, "mem", "cost_ram")
        if cost is None:
            raise InvalidGraphError(f"node {label} has no 'cost' (or 'cost_cpu')")
        if mem is None:
            raise InvalidGraphError(f"node {label} has no 'mem' (or 'cost_ram')")
        cost = _check_number(cost, "cost", label, integral=False)
        mem = _check_number(mem, "mem", label, integral=True)
        nodes.append(Node(
            id=nid,
            name=str(raw["name"]) if raw.get("name") is not None else f"node{nid}",
            cost=cost,
            mem=mem,
            backward=_flag(raw.get("backward", raw.get("is_backwards")), "backward", label),
            output=_flag(raw.get("output"), "output", label),
            recomputable=not ("recomputable" in raw and not _flag(raw["recomputable"], "recomputable", label)),
        ))
    edges = []
    for raw in raw_edges:
        u, v = _edge_pair(raw, edge_key or "edges")
        edges.append((_edge_end(u, u, v), _edge_end(v, u, v)))
    return Graph(nodes, edges, name=str(name), fixed_mem=fixed_mem)


def load_graph(path: str | os.PathLike) -> Graph:
    """Read a graph file (native ``checkmate-graph/1`` or networkx node-link JSON)."""
    if not isinstance(path, (str, os.PathLike)) or os.fspath(path) == "":
        raise InvalidArgumentError(f"load_graph needs the path of a graph file, got {path!r}"[:200])
    path = Path(path)
    text = read_text(path, "graph file", InvalidGraphError)  # a leading byte-order mark is not an error
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidGraphError(f"{path}: malformed JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise InvalidGraphError(f"{path}: JSON nested too deeply to be a graph file") from None
    return graph_from_dict(data, default_name=path.stem)


def save_graph(graph: Graph, path: str | os.PathLike) -> None:
    """Write ``graph`` as native ``checkmate-graph/1`` JSON (atomically)."""
    if not isinstance(graph, Graph):
        raise InvalidArgumentError(f"save_graph needs a checkmate Graph, got {type(graph).__name__}")
    atomic_write_json(path, graph.to_dict())
