"""Schedule -> a rematerializing ``tf.function`` (docs/design.md §1, §6).

The plain training step (``LoweredGraph.function``) is rewritten at the GraphDef level:

* every ``("compute", i)`` step of ``Schedule.plan`` emits one copy of node ``i``'s ops. The first
  copy keeps the original op names (so the ops that run once, "static" ops, need no rewiring); copy
  ``k >= 1`` is named ``<op>__cm<k>``;
* each copy reads its inputs from the copy of the producing node that is current at that point of
  the plan (the plan guarantees it is resident); the function's outputs come from the last copies;
* control edges run the copies in plan order: every op of a copy without a data input inside its
  own copy waits for the sink ops of the computation before it in the plan. TF's executor frees a
  tensor once its last consumer has run; since the consumers of a copy are exactly the computations
  the plan runs before freeing that value, the order makes every value die where the plan frees it
  (or earlier: a value the plan holds until the end of a stage without using it dies at its last
  use). The anchors also make every copy differ from the others by a control input, so
  common-subexpression elimination cannot merge recomputations back (docs/design.md §6, trap 1).
  Grappler's remapper fuses no op that has a control input itself (an anchored convolution would run
  apart from its bias add and activation, an anchored ``Sigmoid`` apart from its swish ``Mul``), so an
  op takes its anchor through a gate instead: a private copy of the variable it reads (a matrix
  product's or convolution's kernel), else an ``EnsureShape`` of a value another computation produced,
  which every op of the copy reading that value reads instead (it passes the tensor on without a
  copy; an ``Identity`` would not do: Grappler's dependency optimizer removes an identity and moves its
  control inputs onto its consumers, before a fusion that needs constant folding first, such as Keras'
  ``silu`` ``x * sigmoid(1.0 * x)``, is made), else a private copy of a constant it reads. On the
  other end, an anchor waits for an ``EnsureShape`` of the sink op's output rather than for the op
  (the remapper fuses no convolution + bias add + add whose add has a control output), and a copy
  takes no anchor on a sink whose output it reads (a second consumer of a bias add stops that fusion too).
  Where the order joins two ops that oneDNN's layout pass merges into one (a filter gradient and its
  bias gradient; a convolution and its bias add), the second reads the shared tensor through an
  ``EnsureShape`` (:func:`_separate_merged_pairs`): merged, the pair would wait for itself.
  ``order="total"`` anchors every computation on the one before it. ``order="partial"`` makes a
  computation wait only for what memory needs (:func:`partial_waits`): for the consumers of the values
  the plan frees before it, where without those frees memory could exceed the plan's peak, and for the
  computations beside which its value (and a backward computation's temporaries) would exceed it; a
  recomputation also waits for one computation its node's other copies do not wait for. The others run
  in dataflow order, parallel branches (forward and backward) side by side; this is the default
  (``order="auto"``) for a plan that recomputes (experiments/step_order.py), up to
  ``PARTIAL_ORDER_MAX_COMPUTATIONS`` computations (beyond, the total order: the placement grows with their square). ``describe_order`` reports
  the critical path of the generated step (the longest path by the plan's node costs through data and
  control edges) against the plain step's: how much of the plain step's parallelism the order keeps.
  A plan that recomputes nothing gets no anchor
  at all (``order="none"``): it is then the plain step's graph, and runs as the plain step does.

The rewritten GraphDef is imported with ``tf.graph_util.import_graph_def`` inside a new
``tf.function``; the captured variables' handles are fed as captures of the new function (no op on
them). The generated function runs with Grappler on, as the plain step does (its fusions, layout and constant folding
keep the plan: a fused op takes one copy's ops together), except for the passes that break a plan,
which are switched off only while it runs and restored afterwards
(:data:`checkmate.tf2._compat.PLAN_BREAKING_PASSES`, :func:`checkmate.tf2._compat.grappler_disabled`).

Under a ``tf.distribute`` strategy the step is one replica's (traced in a replica context): each
replica imports the GraphDef inside ``strategy.run`` (:meth:`RematFunction.replica_call`), feeding
the handles of its own copies of the distributed variables, and the results are summed over the
replicas with ``strategy.reduce``.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import tensorflow as tf

from checkmate.errors import InvalidArgumentError, InvalidGraphError, InvalidScheduleError
from checkmate.schedule import Schedule
from checkmate.simulate import replay_plan, simulate
from checkmate.tf2 import _compat
from checkmate.tf2.lowered import LoweredGraph

__all__ = ["RematFunction", "generate", "rewrite_graph_def", "RewrittenGraph", "copy_name", "critical_path",
           "IMPORT_SCOPE", "PARTIAL_ORDER_MAX_COMPUTATIONS"]

_log = logging.getLogger("checkmate.tf2")

# Name scope the rewritten graph is imported under; op names in the executed graph start with it.
IMPORT_SCOPE = "checkmate_remat"
_COPY_SUFFIX = "__cm"
# Ops that read only their input's shape: their outputs are a few integers, so ordering them saves no
# memory, and an anchor on one can close a cycle once Grappler and oneDNN have fused the ops around it
# (TF 2.21 on CPU: a ShapeN anchored on a BiasAddGrad feeds the Conv2DBackpropFilter that the BiasAddGrad
# is then fused into). They are never anchored; TF's CSE may merge their identical copies.
SHAPE_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank"})
# Static inputs an anchor may go through instead of the op that reads them (see rewrite_graph_def):
# reading a variable or a constant once more costs nothing, while an op with a control input is not fused.
# A value computed by another node is gated by an EnsureShape of it (VALUE_GATE_OP).
GATE_OPS = frozenset({"ReadVariableOp", "Const"})
# TF 2.21: EnsureShape's kernel passes its input on as its output (no copy), and no Grappler pass removes
# it or moves its control inputs (the dependency optimizer bypasses Identity and IdentityN gates, putting
# their anchors back on the ops that read them).
VALUE_GATE_OP = "EnsureShape"
_GATE_SUFFIX = "__cmgate"
_DONE_SUFFIX = "__cmdone"      # the VALUE_GATE_OP an anchor on an op waits for (see rewrite_graph_def)
_WRITE_PREFIXES = ("Assign", "ResourceApply", "ResourceSparseApply", "ResourceScatter")


def _reads_written(node: Any, written: set) -> bool:
    """Whether ``node`` reads a variable in ``written`` (its first input is the variable's handle)."""
    return node.op == "ReadVariableOp" and bool(node.input) and _split_input(node.input[0])[1] in written


class _TensorDtypes:
    """The dtype and static shape of a tensor of the rewritten graph (a copy's tensor has its
    original's), by name."""

    _COPY = re.compile(re.escape(_COPY_SUFFIX) + r"\d+$")

    def __init__(self, graph: Any):
        self._graph = graph
        self._cache: dict[str, Any] = {}

    def __getitem__(self, tensor: str) -> int:
        return self.dtype(tensor).as_datatype_enum

    def _tensor(self, tensor: str) -> Any:
        op, _, idx = tensor.lstrip("^").partition(":")
        key = f"{self._COPY.sub('', op)}:{idx or '0'}"
        if key not in self._cache:
            self._cache[key] = self._graph.get_tensor_by_name(key)
        return self._cache[key]

    def dtype(self, tensor: str) -> Any:
        return self._tensor(tensor).dtype

    def shape(self, tensor: str) -> Any:
        return self._tensor(tensor).shape

    def has_output(self, op: str) -> bool:
        """Whether the op (of the rewritten graph) has an output."""
        try:
            self._tensor(f"{op}:0")
        except (KeyError, ValueError):
            return False
        return True

    def gateable(self, tensor: str) -> bool:
        """Whether an identity may stand for the tensor: not a resource handle or variant (a TensorList,
        an optional), which an identity would copy as a handle, not as a value."""
        return self.dtype(tensor) not in (tf.resource, tf.variant)


_probe_counter = 0


def copy_name(op_name: str, k: int) -> str:
    """Name of the ``k``-th computation of ``op_name`` (``k = 0`` keeps the original name)."""
    return op_name if k == 0 else f"{op_name}{_COPY_SUFFIX}{k}"


def _split_input(text: str) -> tuple[bool, str, str]:
    """``"^op"`` -> (True, "op", ""); ``"op:1"`` -> (False, "op", ":1"); ``"op"`` -> (False, "op", "")."""
    if text.startswith("^"):
        return True, text[1:], ""
    op, sep, idx = text.partition(":")
    return False, op, (sep + idx) if sep else ""


def _tensor_op(tensor_name: str) -> tuple[str, str]:
    op, sep, idx = tensor_name.partition(":")
    return op, idx if sep else "0"


@dataclass(frozen=True)
class RewrittenGraph:
    """The rewritten GraphDef plus the bookkeeping tests and reports need."""

    graph_def: Any                              # tf.compat.v1.GraphDef
    copies: tuple[int, ...]                     # computations of each node (= R[:, i].sum())
    copy_ops: Mapping[tuple[int, int], tuple[str, ...]]   # (node, k) -> op names of that copy
    op_copies: int                              # ops emitted for node computations, all copies
    output_names: tuple[str, ...]               # tensors returned: loss, gradients, then any predictions
    feed_names: tuple[str, ...]                 # placeholders fed: inputs, labels, then captures
    warnings: tuple[str, ...] = field(default_factory=tuple)
    order: str = "total"                        # the order emitted ("auto" resolved)
    anchored: int = 0                           # computations that wait for an anchor
    # longest path by the plan's node costs through data and control edges, of this graph and of the
    # plain step's (each node once, no control edge added), and the cost of all computations
    critical_path_cost: float = 0.0
    plain_critical_path_cost: float = 0.0
    total_cost: float = 0.0

    @property
    def critical_path_ratio(self) -> float:
        """Critical path of the generated step over the plain step's (1.0: parallel branches overlap
        as much as in the plain step; larger: the order serializes them)."""
        return self.critical_path_cost / self.plain_critical_path_cost if self.plain_critical_path_cost > 0 else 1.0

    def describe_critical_path(self) -> str:
        share = self.critical_path_cost / self.total_cost if self.total_cost > 0 else 1.0
        return (f"critical path {self.critical_path_ratio:.2f} of the plain step's "
                f"({share:.0%} of the total cost)")

    def describe_order(self) -> str:
        computations = sum(self.copies)
        if self.order == "none":
            head = "none: the plain step's executor order, no anchor"
        else:
            head = f"{self.order}: {self.anchored} of {computations} computations wait for the plan's order"
        return f"{head}; {self.describe_critical_path()}"


def critical_path(nodes: Sequence[Any], op_unit: Mapping[str, Any], unit_cost: Mapping[Any, float]) -> float:
    """Longest path through a GraphDef's ops, following data and control inputs, where the ops of one
    computation count as one unit of ``unit_cost[op_unit[op]]`` and every other op (a static op, a
    gate) costs nothing: the time a step needs with unlimited parallelism, by the plan's node costs.

    A unit starts once every op any of its ops reads (data or control) has finished."""
    names = {nd.name for nd in nodes}

    def unit(op: str) -> Any:
        return op_unit.get(op, ("op", op))

    preds: dict[Any, set] = {}
    for nd in nodes:
        u = unit(nd.name)
        here = preds.setdefault(u, set())
        for text in nd.input:
            src = _split_input(text)[1]
            if src in names and unit(src) != u:
                here.add(unit(src))
    users: dict[Any, list] = {u: [] for u in preds}
    for u, ps in preds.items():
        for p in ps:
            users[p].append(u)
    waiting = {u: len(ps) for u, ps in preds.items()}
    ready = [u for u, w in waiting.items() if w == 0]
    finish: dict[Any, float] = {}
    while ready:
        u = ready.pop()
        finish[u] = max((finish[p] for p in preds[u]), default=0.0) + float(unit_cost.get(u, 0.0))
        for v in users[u]:
            waiting[v] -= 1
            if waiting[v] == 0:
                ready.append(v)
    if len(finish) != len(preds):
        raise InvalidGraphError("the step's computations wait on each other in a cycle: no critical path")
    return max(finish.values(), default=0.0)


def _check_lowered(lowered: LoweredGraph, by_name: Mapping[str, Any]) -> None:
    graph = lowered.graph
    if len(lowered.node_ops) != graph.n:
        raise InvalidGraphError(f"node_ops lists {len(lowered.node_ops)} nodes; the graph has {graph.n}")
    for i, ops in enumerate(lowered.node_ops):
        if not ops:
            raise InvalidGraphError(f"node {i} ({graph.nodes[i].name}) stands for no TF op")
        for op in ops:
            if op not in by_name:
                raise InvalidGraphError(f"node {i} ({graph.nodes[i].name}) names op {op!r}, which is not in "
                                        "the function's graph")
            if lowered.op_node.get(op) != i:
                raise InvalidGraphError(f"op {op!r} is listed under node {i} but op_node maps it to "
                                        f"{lowered.op_node.get(op)!r}")
    deps = [set(d) for d in graph.deps]
    for i, ops in enumerate(lowered.node_ops):
        for op in ops:
            for text in by_name[op].input:
                ctrl, src, _ = _split_input(text)
                j = lowered.op_node.get(src)
                if ctrl or j is None or j == i:
                    continue
                if j not in deps[i]:
                    raise InvalidGraphError(
                        f"op {op!r} (node {i}, {graph.nodes[i].name}) reads {src!r} (node {j}, "
                        f"{graph.nodes[j].name}) but the graph has no edge {j} -> {i}")


def _gate_node(name: str, of: str, dtype: int, shape: Any, inputs: Sequence[str], taken: set) -> Any:
    """A :data:`VALUE_GATE_OP` named ``name`` (added to ``taken``) that passes on ``inputs[0]``, a
    tensor of op ``of`` of type ``dtype`` (a DataType enum) and ``shape`` (a TensorShapeProto), and
    waits for the control inputs after it."""
    if name in taken:
        raise InvalidGraphError(f"cannot name the gate of op {of!r}: {name!r} is taken")
    taken.add(name)
    node = tf.compat.v1.NodeDef()
    node.op = VALUE_GATE_OP
    node.name = name
    node.attr["T"].type = dtype
    node.attr["shape"].shape.CopyFrom(shape)
    node.input.extend(inputs)
    return node


# TF 2.21 on CPU with oneDNN: the layout pass (which runs after Grappler, whatever its options) merges
# a Conv2DBackpropFilter with the BiasAddGrad that reads the same gradient, a Conv2D with the BiasAdd
# that reads it and a Pad with the Conv2D that reads it, into one op, without looking at the paths
# between them. Where the plan's order puts another computation between the two (one waits for the
# first and the second for it), the merged op waits for itself: "N nodes in a cycle" when the step
# first runs. Such a pair is kept apart: the second op reads the shared tensor through a
# VALUE_GATE_OP, which the pass does not look through (that one pair is then not fused).
_ONEDNN_MERGES = (("Conv2DBackpropFilter", 2, "BiasAddGrad", 0),   # (op, its input, op, its input)
                  ("Conv2D", None, "BiasAdd", 0), ("Pad", None, "Conv2D", 0))


def _separate_merged_pairs(nodes: list, tensor_dtypes: "_TensorDtypes", taken: set) -> dict[str, str]:
    """Gate the second op of each pair in :data:`_ONEDNN_MERGES` that a path through other ops joins
    (see there); returns each gate's name with the op it gates. ``nodes`` is changed in place."""
    by_name = {nd.name: nd for nd in nodes}
    readers: dict[str, list] = {}
    users: dict[str, set[str]] = {}
    for nd in nodes:
        for text in nd.input:
            ctrl, src, _ = _split_input(text)
            users.setdefault(src, set()).add(nd.name)
            if not ctrl:
                readers.setdefault(src, []).append(nd)

    # topological positions: a path from a to b only passes ops placed before b
    indegree = {nd.name: 0 for nd in nodes}
    for src, us in users.items():
        if src in indegree:
            for u in us:
                indegree[u] += 1
    ready = [n for n, d in indegree.items() if d == 0]
    position: dict[str, int] = {}
    while ready:
        n = ready.pop()
        position[n] = len(position)
        for u in users.get(n, ()):
            indegree[u] -= 1
            if indegree[u] == 0:
                ready.append(u)
    if len(position) != len(nodes):
        return {}       # a cycle already: _check_acyclic names it

    def reaches(a: str, b: str, skip_direct: bool) -> bool:
        """A path from ``a`` to ``b`` (through another op when ``skip_direct``)."""
        limit = position[b]
        if position[a] >= limit:
            return False
        seen, todo = {a}, [u for u in users.get(a, ()) if not (skip_direct and u == b)]
        while todo:
            n = todo.pop()
            if n == b:
                return True
            if n not in seen and position[n] < limit:
                seen.add(n)
                todo.extend(users.get(n, ()))
        return False

    def gate_type(tensor: str) -> tuple[Any, Any] | None:
        """The dtype enum and shape of ``tensor`` (None where no gate may stand for it)."""
        _, src, _ = _split_input(tensor)
        made = by_name.get(src)
        if made is not None and made.op == VALUE_GATE_OP and (_GATE_SUFFIX in src or _DONE_SUFFIX in src):
            return made.attr["T"].type, made.attr["shape"].shape
        try:
            if not tensor_dtypes.gateable(tensor):
                return None
            return tensor_dtypes[tensor], tensor_dtypes.shape(tensor).as_proto()
        except (KeyError, ValueError):
            return None

    gated: dict[str, str] = {}
    for first_op, first_input, second_op, second_input in _ONEDNN_MERGES:
        for nd in nodes:
            if nd.op != second_op or len(nd.input) <= second_input or nd.input[second_input].startswith("^"):
                continue
            tensor = nd.input[second_input]
            _, src, _ = _split_input(tensor)
            if first_input is None:        # the second op reads the first one's output
                first = by_name.get(src)
                if first is None or first.op != first_op or not reaches(src, nd.name, True):
                    continue
            else:                          # both read the same tensor
                pair = [m for m in readers.get(src, ()) if m.op == first_op and len(m.input) > first_input
                        and _split_input(m.input[first_input])[1] == src]
                if not any(reaches(m.name, nd.name, False) or reaches(nd.name, m.name, False) for m in pair):
                    continue
            typed = gate_type(tensor)
            if typed is None:
                continue
            gate = _gate_node(f"{src}{_GATE_SUFFIX}_apart_{len(gated)}", src, typed[0], typed[1], [tensor], taken)
            nodes.append(gate)
            nd.input[second_input] = gate.name
            gated[gate.name] = nd.name
    return gated


def _check_acyclic(nodes: Sequence[Any]) -> None:
    """Fail here, naming an op, rather than deadlock in TF's executor.

    A static op that reads a node's first copy while a node computed earlier in the plan reads that
    static op would close a cycle through the control chain; the lowering must put such an op in a
    node (or add the edge) instead.
    """
    names = {nd.name for nd in nodes}
    preds: dict[str, set[str]] = {}
    for nd in nodes:
        preds[nd.name] = {_split_input(t)[1] for t in nd.input} & names
    users: dict[str, list[str]] = {n: [] for n in names}
    for n, ps in preds.items():
        for p in ps:
            users[p].append(n)
    indegree = {n: len(ps) for n, ps in preds.items()}
    ready = [n for n, d in indegree.items() if d == 0]
    done = 0
    while ready:
        n = ready.pop()
        done += 1
        for u in users[n]:
            indegree[u] -= 1
            if indegree[u] == 0:
                ready.append(u)
    if done != len(names):
        stuck = sorted(n for n, d in indegree.items() if d > 0)
        raise InvalidGraphError(
            f"the rewritten step would deadlock: {len(stuck)} op(s) wait on each other through the plan's "
            f"order, e.g. {stuck[:3]}; an op outside every node depends on a node and feeds another")


# A backward kernel's temporaries, counted as this many times its output while it may run early.
# Measured: experiments/results/README.md, section i.
BACKWARD_WORKSPACE_FACTOR = 1


def partial_waits(graph: Any, plan: Sequence[tuple[str, int]]) -> list[tuple[int, ...]]:
    """For each computation of ``plan`` (in plan order, frees skipped), the earlier computations it waits
    for in the partial order (their positions; empty: it runs as soon as its inputs exist).

    The model. A computation runs, in TF's executor, at any time after every computation it depends
    on (data, or a wait added here) and before every computation that depends on it; a value dies once
    its last consumer has run. The bound is taken at the moment each computation ``x`` runs (memory
    peaks when something is allocated), and ``anc(x)``, the computations ``x`` depends on (tracked
    exactly), are then done. A value live at that moment was computed by one of:

    1. a computation the plan runs before ``x`` and still holds at ``x``: counted in the plan's memory
       at ``x``;
    2. a computation the plan runs before ``x`` and frees before it, whose free may come late: some of
       its consumers are not in ``anc(x)`` (and may not have run). ``late(x)`` adds every such value
       (and the value of a computation whose free needs nothing but itself, it not in ``anc(x)``);
    3. a computation ``y`` the plan runs after ``x`` that runs early, before or beside ``x``: possible
       only if ``x`` is not in ``anc(y)``. When ``y`` is placed, its value (and its temporaries) is
       added to ``extra(t)`` of every earlier ``t`` not in ``anc(y)``; ``extra(t)`` also holds
       ``late(t)`` and ``t``'s own temporaries, and ``y`` is placed so that ``usage(t) + extra(t)``
       stays within the plan's peak at every such ``t``.

    A backward computation's temporaries (``BACKWARD_WORKSPACE_FACTOR`` times its value) count while
    it runs: at every earlier ``t`` it may run beside, at its own moment, and at every later ``x``
    that does not depend on it (as a value whose free needs nothing but itself, case 2). So the
    memory at the moment ``x`` runs is at most ``usage(x) + extra(x)``, with every term placed in it
    before or when the term's computation is placed, and checked against the plan's peak then; unlike
    a window that ends at the next anchor, nothing assumes that a later computation waits for ``x``,
    so a computation that no wait follows may run as late as it likes and its frees are still counted
    (case 2 at every later moment that does not depend on its consumers).

    "The plan's peak" is the largest ``usage(x)`` plus ``x``'s own temporaries (what the total order
    reaches by the same accounting). How ``x`` is placed: with no wait at all, unless (a) its own
    moment, ``usage(x) + late(x)`` with its temporaries, exceeds the plan's peak: then it waits for the consumers of the late frees
    ``late(x)`` counts, largest value first, until it fits (only the frees memory needs); or (b) some
    earlier computation ``t`` it does not depend on has ``usage(t) + extra(t)`` plus ``x``'s value and
    temporaries above the peak: then it waits for ``t`` (latest first; a wait brings that one's own
    ancestors along), so that it cannot run beside ``t``. Waiting for every violating ``t`` always
    succeeds, and so does (a): with every late free waited for, its moment is the plan's own. A recomputation always waits for at least one computation the plan runs
    after that node's previous copy and that the recomputation does not read (the one that ends first
    on the longest path): its control input then differs from the other copies', so that
    common-subexpression elimination cannot merge it back into them; and it is placed like the others,
    so it cannot run early where memory does not allow it. (Backward computations all left free
    measured 8.0-8.7 MB against 7.4 MB planned on a U-Net at 50% of its checkpoint-all peak; all
    chained, they cost the transformer's step 7-9% with nothing recomputed.)
    """
    mem = [int(m) for m in graph.mem]
    computes: list[int] = []
    usage_list: list[int] = []             # plan memory while each computation runs (its output counted)
    free_at: list[list[int]] = []          # nodes the plan frees right after each computation
    current = int(graph.fixed_mem)
    for action, i in plan:
        if action == "compute":
            current += mem[i]
            computes.append(i)
            usage_list.append(current)
            free_at.append([])
        else:
            current -= mem[i]
            if free_at:
                free_at[-1].append(i)
    n = len(computes)
    usage = np.asarray(usage_list, dtype=np.int64)
    # the plan's peak, with a backward computation's temporaries counted while it runs: the total
    # order's own bound, by the same accounting
    own_workspace = np.asarray([BACKWARD_WORKSPACE_FACTOR * mem[i] if graph.backward[i] else 0 for i in computes],
                               dtype=np.int64)
    limit = int((usage + own_workspace).max()) if n else 0
    nbytes = (n + 7) // 8 + 1

    def positions(mask: int, upto: int) -> np.ndarray:
        """The bitset as a boolean array over positions ``0 .. upto - 1``."""
        raw = np.frombuffer(mask.to_bytes(nbytes, "little"), dtype=np.uint8)
        return np.unpackbits(raw, bitorder="little")[:upto].astype(bool)

    extra = np.zeros(n, dtype=np.int64)    # bytes beyond the plan's usage that may be live at a position
    anc = [0] * n                          # bitset of the computations each one depends on
    consumers: dict[int, int] = {}         # position of a value -> bitset of its consumers so far
    readers_of: dict[int, list[int]] = {}  # the same, as a list
    latest: dict[int, int] = {}            # node -> plan position of its current copy
    pending: list[tuple[int, int]] = []    # (bitset that must be done for the value to be gone, bytes)
    waits: list[tuple[int, ...]] = []
    finish = [0.0] * n                     # longest path (by node costs) to each computation's end

    def late(mask: int) -> list[tuple[int, int]]:
        return [(need, b) for need, b in pending if need & mask != need]

    for c, i in enumerate(computes):
        data = [latest[d] for d in graph.deps[i] if d in latest]
        mask = 0
        for d in data:
            mask |= anc[d] | (1 << d)
        workspace = BACKWARD_WORKSPACE_FACTOR * mem[i] if graph.backward[i] else 0
        held = mem[i] + workspace
        chosen: set[int] = set()
        distinct = None

        def add(q: int) -> None:
            nonlocal mask
            if not (mask >> q) & 1:
                chosen.add(q)
                mask |= anc[q] | (1 << q)

        # its own moment: wait for the consumers of late frees, largest first, until they fit
        own = int(usage[c]) + workspace - limit
        pend = sorted(late(mask), key=lambda e: -e[1])
        for need, b in list(pend):
            if own + sum(b2 for _, b2 in pend) <= 0:
                break
            rest = need & ~mask
            while rest:
                add(rest.bit_length() - 1)
                rest = need & ~mask
            pend = [e for e in pend if e[0] & mask != e[0]]     # the waits may have ordered others too
        if i in latest:
            # a recomputation: a control input no other copy of the node has (see above)
            prev = latest[i]
            if not any(q > prev for q in chosen):
                distinct = min((q for q in range(prev + 1, c) if q not in data), key=lambda q: finish[q],
                               default=None)
                if distinct is not None:
                    add(distinct)
                    chosen.add(distinct)
        # running beside an earlier computation it does not depend on: wait for each one where its
        # value and temporaries do not fit (latest first; a wait brings that one's own ancestors along)
        while True:
            free = ~positions(mask, c)
            over = np.flatnonzero(free & (usage[:c] + extra[:c] + held > limit))
            if not over.size:
                break
            add(int(over[-1]))
        extra[:c][~positions(mask, c)] += held
        # A wait goes on a computation no other reads yet, else on its reader that ends first (which
        # orders it too): an anchor gates the sink's output, and a second consumer of a bias add stops
        # Grappler fusing it with the add that reads it (a residual block's convolution + bias + add).
        for q in list(chosen):
            r = q
            while readers_of.get(r):
                r = min(readers_of[r], key=lambda b: finish[b])
            if r != q:
                chosen.discard(q)
                chosen.add(r)
                mask |= anc[r] | (1 << r)
                if distinct == q:
                    distinct = r
        extra[c] += sum(b for _, b in late(mask)) + workspace
        # keep only the waits no other wait depends on
        kept = tuple(sorted(q for q in chosen if q == distinct
                            or not any((anc[r] >> q) & 1 for r in chosen if r != q)))
        waits.append(kept)
        anc[c] = mask
        finish[c] = max((finish[q] for q in chosen | set(data)), default=0.0) + float(graph.cost[i])
        for d in data:
            consumers[d] = consumers.get(d, 0) | (1 << c)
            readers_of.setdefault(d, []).append(c)
        if workspace:
            pending.append((1 << c, workspace))
        latest[i] = c
        for j in free_at[c]:
            p = latest[j]
            pending.append((consumers.get(p, 0) | (1 << p), mem[j]))
    return waits


def partial_anchors(graph: Any, plan: Sequence[tuple[str, int]]) -> list[bool]:
    """Which computations of ``plan`` (in plan order, frees skipped) wait for another in the partial
    order (:func:`partial_waits`)."""
    return [bool(w) for w in partial_waits(graph, plan)]


ORDERS = ("auto", "total", "partial", "none")
# order="auto" takes the total order for a plan of more computations than this: the partial order's
# placement (partial_waits) grows with their square (4 s for 3797 computations, 15 s for 6347 on a
# 3797-node graph; a plan of 2.3 million computations did not finish in 9 minutes)
PARTIAL_ORDER_MAX_COMPUTATIONS = 10000


def rewrite_graph_def(lowered: LoweredGraph, schedule: Schedule, order: str = "auto") -> RewrittenGraph:
    """Emit the GraphDef that executes ``schedule.plan`` (see the module docstring).

    ``order``: ``"total"`` anchors every computation on the plan step before it; ``"partial"`` only
    on what memory needs (:func:`partial_waits`); ``"none"`` nothing (the plain step's graph when
    nothing is recomputed; with recomputations TF may run them early or merge them back, and the
    step peaks near the plain one); ``"auto"`` (default): ``"none"`` for a schedule that recomputes
    nothing, else ``"partial"``.
    """
    if order not in ORDERS:
        raise InvalidArgumentError(f"unknown order {order!r}: expected one of {', '.join(ORDERS)}")
    if order == "auto":
        # the partial order: less time than the total one on most plans, at the same peak.
        # Measured: experiments/results/README.md, section i.
        computations = int(schedule.recompute.sum())
        order = ("none" if computations == lowered.graph.n else
                 "partial" if computations <= PARTIAL_ORDER_MAX_COMPUTATIONS else "total")
        if order == "total":
            _log.info("the plan runs %d computations: the total order (the partial one's placement grows "
                      "with their square)", computations)
    graph = lowered.graph
    if schedule.n != graph.n:
        raise InvalidScheduleError(f"the schedule is for {schedule.n} nodes; the graph has {graph.n}")
    replay_plan(graph, schedule.plan)   # raises on a plan that reads a value it has freed

    source = lowered.function.graph.as_graph_def()
    by_name = {nd.name: nd for nd in source.node}
    _check_lowered(lowered, by_name)
    # (before copy 0's ops are rewired in place below)
    costs = [float(nd.cost) for nd in graph.nodes]
    plain_path = critical_path(source.node, {op: (i, 0) for i, ops in enumerate(lowered.node_ops) for op in ops},
                               {(i, 0): costs[i] for i in range(graph.n)})
    # Copy 0 is rewired in place below; every copy is wired from the untouched original inputs.
    original_inputs = {nd.name: tuple(nd.input) for nd in source.node}
    op_node = lowered.op_node
    node_ops = lowered.node_ops

    taken = set(by_name)
    out_nodes = [nd for nd in source.node]          # copy 0 of every node and all static ops, unchanged
    position = {nd.name: pos for pos, nd in enumerate(out_nodes)}
    copies = [0] * graph.n
    current: dict[int, int] = {}                     # node -> index of its latest copy
    resident: set[int] = set()
    copy_ops: dict[tuple[int, int], tuple[str, ...]] = {}
    prev_sinks: list[str] = []
    warnings: list[str] = []
    emitted = 0
    waits = partial_waits(graph, schedule.plan) if order == "partial" else None
    sinks_of: list[list[str]] = []                   # plan position -> sink ops of that computation
    gates: list = []
    # variables the step writes (optimizer updates, BatchNorm statistics, dropout seeds): a read of one
    # must stay where it is, so it is never a gate (a later read would see the written value)
    written = {_split_input(nd.input[0])[1] for nd in source.node
               if nd.input and nd.op.startswith(_WRITE_PREFIXES)}
    # No gates under a tf.distribute strategy: with gated variable reads one worker of a
    # MultiWorkerMirroredStrategy computed other losses than Keras (tests/tf2/test_distribute.py), for a
    # reason not found yet; there the anchors stay on the ops themselves.
    gate_ops = GATE_OPS if lowered.distribution is None else frozenset()
    tensor_dtypes = _TensorDtypes(lowered.function.graph)
    sources: dict[str, str] = {}

    def anchor_source(sink: str) -> str:
        """What an anchor on ``sink`` waits for: a VALUE_GATE_OP reading its output, not the op itself.
        Grappler's remapper fuses no pattern whose root has a control output (Conv2D + BiasAdd + Add,
        the add of a residual block, when the add is the op a later computation waits for)."""
        if sink not in sources:
            sources[sink] = sink
            if gate_ops and tensor_dtypes.has_output(sink) and tensor_dtypes.gateable(sink):
                done = _gate_node(f"{sink}{_DONE_SUFFIX}", sink, tensor_dtypes[sink],
                                  tensor_dtypes.shape(sink).as_proto(), [sink], taken)
                out_nodes.append(done)
                sources[sink] = done.name
        return sources[sink]

    c = -1

    for step, (action, i) in enumerate(schedule.plan):
        if action == "free":
            resident.discard(i)
            continue
        c += 1
        if order == "total":
            anchor_sinks = prev_sinks
        elif order == "partial":
            anchor_sinks = [s for q in waits[c] for s in sinks_of[q]]
        else:
            anchor_sinks = []
        k = copies[i]
        copies[i] += 1
        names = {op: copy_name(op, k) for op in node_ops[i]}
        if k > 0:
            clash = [n for n in names.values() if n in taken]
            if clash:
                raise InvalidGraphError(f"cannot name the copy of op {clash[0]!r}: the name is taken")
            taken.update(names.values())
        members = set(node_ops[i])
        consumed_inside: set[str] = set()
        rewired_of: dict[str, list[str]] = {}
        entry_ops: list[str] = []               # ops that take the anchor: no data input inside the copy
        for op in node_ops[i]:
            rewired = []
            has_inner_input = False
            for text in original_inputs[op]:
                ctrl, src, suffix = _split_input(text)
                if src in members:
                    consumed_inside.add(src)
                    if not ctrl:
                        has_inner_input = True
                    rewired.append(("^" if ctrl else "") + names[src] + suffix)
                    continue
                j = op_node.get(src)
                if j is None:                        # static: run once, shared by every copy
                    rewired.append(text)
                    continue
                if j not in current:
                    raise InvalidScheduleError(
                        f"plan step {step}: op {op!r} of node {i} depends on op {src!r} of node {j}, "
                        "which the plan has not computed yet")
                if not ctrl and j not in resident:
                    raise InvalidScheduleError(
                        f"plan step {step}: op {op!r} of node {i} reads node {j}, which the plan has freed")
                rewired.append(("^" if ctrl else "") + copy_name(src, current[j]) + suffix)
            rewired_of[op] = rewired
            if not has_inner_input and by_name[op].op not in SHAPE_OPS:
                entry_ops.append(op)
        # An op of the copy that reads a sink's output waits for it already; an anchor on that sink
        # would give it a second consumer, and Grappler's remapper fuses no convolution, bias add and
        # add whose bias add has two (the total order, where the add waits for the bias add before it).
        read = {_split_input(t)[1] for ts in rewired_of.values() for t in ts if not t.startswith("^")}
        anchor_sinks = [s for s in anchor_sinks if s not in read]
        if not anchor_sinks:
            entry_ops = []
        # Where each entry op takes its anchor (Grappler's remapper fuses no op with a control input,
        # and constant folding turns an op that reads an anchored constant into an anchored one):
        # 1. a private copy of a variable read it makes (a matrix product's or convolution's kernel);
        # 2. else a VALUE_GATE_OP of a value another node computed, which every op of the copy that
        #    reads that value then reads (Sigmoid and Mul of a swish both read it, so they still fuse);
        # 3. else a private copy of a constant it reads; 4. else a control input on the op itself.
        var_gate: dict[str, str] = {}
        value_gates: dict[str, str] = {}        # tensor ("op:idx") -> the gate op passing it on
        const_gate: dict[str, str] = {}
        for op in entry_ops:
            data = [t for t in rewired_of[op] if not t.startswith("^")]
            static = [t for t in data if _split_input(t)[1] in by_name and op_node.get(_split_input(t)[1]) is None]
            found = next((t for t in static if by_name[_split_input(t)[1]].op == "ReadVariableOp"
                          and "ReadVariableOp" in gate_ops
                          and not _reads_written(by_name[_split_input(t)[1]], written)), None)
            if found is not None:
                var_gate[op] = found
                continue
            computed = [t for t in data if t not in static and gate_ops and tensor_dtypes.gateable(t)]
            if computed:
                _, src, suffix = _split_input(computed[0])
                value_gates.setdefault(f"{src}:{suffix.lstrip(':') or '0'}", "")
                continue
            found = next((t for t in static if by_name[_split_input(t)[1]].op == "Const" and "Const" in gate_ops), None)
            if found is not None:
                const_gate[op] = found
        anchor_inputs = [f"^{anchor_source(s)}" for s in anchor_sinks]
        for tensor in value_gates:
            src, _, idx = tensor.partition(":")
            gated = _gate_node(f"{src}{_GATE_SUFFIX}{c}_{len(gates)}", src, tensor_dtypes[tensor],
                               tensor_dtypes.shape(tensor).as_proto(), [src if idx == "0" else tensor] + anchor_inputs,
                               taken)
            gates.append(gated)
            out_nodes.append(gated)
            value_gates[tensor] = gated.name
        for op in node_ops[i]:
            original = by_name[op]
            if k == 0:
                new = out_nodes[position[op]]
            else:
                new = tf.compat.v1.NodeDef()
                new.CopyFrom(original)
                new.name = names[op]
            rewired = rewired_of[op]
            if value_gates and original.op not in SHAPE_OPS:
                for pos, text in enumerate(rewired):
                    ctrl, src, suffix = _split_input(text)
                    gate_name = value_gates.get(f"{src}:{suffix.lstrip(':') or '0'}")
                    if not ctrl and gate_name:
                        rewired[pos] = gate_name
            gate = var_gate.get(op) or const_gate.get(op)
            if gate is not None:
                # the anchor goes on a private copy of the op's variable read or constant
                _, src, suffix = _split_input(gate)
                gated = tf.compat.v1.NodeDef()
                gated.CopyFrom(by_name[src])
                gated.name = f"{src}{_GATE_SUFFIX}{c}_{len(gates)}"
                if gated.name in taken:
                    raise InvalidGraphError(f"cannot name the gate of op {src!r}: {gated.name!r} is taken")
                taken.add(gated.name)
                gated_inputs = [t for t in original_inputs[src] if not t.startswith("^")]
                del gated.input[:]
                gated.input.extend(gated_inputs + list(dict.fromkeys(
                    [t for t in original_inputs[src] if t.startswith("^")] + anchor_inputs)))
                gates.append(gated)
                out_nodes.append(gated)
                rewired[rewired.index(gate)] = gated.name + suffix
            elif op in entry_ops and not any(_split_input(t)[1] in value_gates.values()
                                             for t in rewired if not t.startswith("^")):
                present = {t for t in rewired if t.startswith("^")}
                rewired.extend(t for t in anchor_inputs if t not in present)
            # data inputs first, then control inputs: GraphDef requires that order
            data = [t for t in rewired if not t.startswith("^")]
            ctrl_inputs = list(dict.fromkeys(t for t in rewired if t.startswith("^")))
            del new.input[:]
            new.input.extend(data + ctrl_inputs)
            if k > 0:
                out_nodes.append(new)
            emitted += 1
        copy_ops[(i, k)] = tuple(names[op] for op in node_ops[i])
        prev_sinks = [names[op] for op in node_ops[i] if op not in consumed_inside]
        sinks_of.append(prev_sinks)
        current[i] = k
        resident.add(i)

    expected = schedule.recompute.sum(axis=0)
    if not np.array_equal(np.asarray(copies), expected):
        bad = int(np.flatnonzero(np.asarray(copies) != expected)[0])
        raise InvalidScheduleError(f"the plan computes node {bad} {copies[bad]} times, R says {int(expected[bad])}")

    def final(tensor: str) -> str:
        op, idx = _tensor_op(tensor)
        j = op_node.get(op)
        return f"{op if j is None else copy_name(op, current[j])}:{idx}"

    returned = (lowered.loss_tensor, *lowered.grad_tensors, *lowered.indices_tensors, *lowered.pred_tensors)
    outputs = tuple(final(t) for t in returned)
    for t, name in zip(returned, outputs):
        j = op_node.get(_tensor_op(t)[0])
        if j is not None and copies[j] > 1:
            warnings.append(f"output {t} is computed {copies[j]} times; the last copy is returned")

    op_unit = {op: key for key, ops in copy_ops.items() for op in ops}
    if order != "none":
        # a gate that keeps a pair apart is part of the computation of the op it gates (the two ops are
        # often one computation's: a unit of its own there would read that computation and feed it)
        for gate, reader in _separate_merged_pairs(out_nodes, tensor_dtypes, taken).items():
            if reader in op_unit:
                op_unit[gate] = op_unit[reader]
    _check_acyclic(out_nodes)
    result = tf.compat.v1.GraphDef()
    result.versions.CopyFrom(source.versions)
    result.library.CopyFrom(source.library)
    result.node.extend(out_nodes)
    capture_names = tuple(internal.op.name for _, internal in lowered.function.graph.captures)
    path = critical_path(out_nodes, op_unit, {key: costs[key[0]] for key in copy_ops})
    return RewrittenGraph(
        graph_def=result,
        copies=tuple(copies),
        copy_ops=copy_ops,
        op_copies=emitted,
        output_names=outputs,
        feed_names=tuple(lowered.input_names) + tuple(lowered.label_names) + capture_names,
        warnings=tuple(warnings),
        order=order,
        anchored={"none": 0, "total": max(0, c), "partial": sum(bool(w) for w in waits or ())}[order],
        critical_path_cost=path,
        plain_critical_path_cost=plain_path,
        total_cost=float(sum(costs[key[0]] for key in copy_ops)),
    )


def _captured(graph: Any, tensor: Any) -> Any:
    """``tensor`` as a tensor of ``graph``: itself when it belongs to it, else its capture (a
    placeholder of the function being built, fed the outer value when the function is called)."""
    if getattr(tensor, "graph", None) is graph:
        return tensor
    if not hasattr(graph, "capture"):
        # not a function graph (a tf.compat.v1 graph): an identity is the only way in
        return tf.identity(tensor)
    return graph.capture(tensor)


class RematFunction:
    """The generated step: ``fn(x, y) -> (loss, [grads])`` executing one schedule's plan.

    ``x`` and ``y`` may be tensors or nested structures whose flattening matches the lowered
    function's input and label placeholders. Gradients come in ``lowered.variables`` order.
    """

    def __init__(self, lowered: LoweredGraph, schedule: Schedule, rewritten: RewrittenGraph):
        self.lowered = lowered
        self.schedule = schedule
        self.rewritten = rewritten
        fn_graph = lowered.function.graph
        by_name = {op.name: op for op in fn_graph.get_operations()}
        feed_ops = [by_name[n] for n in tuple(lowered.input_names) + tuple(lowered.label_names)]
        self._specs = tuple(tf.TensorSpec(op.outputs[0].shape, op.outputs[0].dtype, name=op.name.replace("/", "_"))
                            for op in feed_ops)
        self._n_inputs = len(lowered.input_names)
        self._captures = tuple(external for external, _ in fn_graph.captures)
        self._function = self._build_function()
        self._concrete = None
        self._distributed_function = None

    def _capture_feeds(self) -> list:
        """The tensors fed for the captured variables: each handle captured into the graph being built
        (import_graph_def needs a tensor of that graph), the capture's placeholder itself and no op
        on it, so that the generated function holds no op the plain step does not (an identity per
        variable ran in every step wherever Grappler did not remove it). Under a strategy, a
        distributed variable's handle is read in the current replica context, so each replica reads
        its own copy."""
        graph = tf.compat.v1.get_default_graph()
        variables = self.lowered.capture_variables or (None,) * len(self._captures)
        return [_captured(graph, external if variable is None else variable.handle)
                for external, variable in zip(self._captures, variables)]

    def _import(self, flat: Sequence[Any], scope: str = IMPORT_SCOPE, graph_def: Any = None,
                outputs: Sequence[str] | None = None) -> tuple:
        feeds = self.rewritten.feed_names
        input_map = {f"{name}:0": t for name, t in zip(feeds, flat)}
        for name, tensor in zip(feeds[len(flat):], self._capture_feeds()):
            input_map[f"{name}:0"] = tensor
        results = tf.graph_util.import_graph_def(
            self.rewritten.graph_def if graph_def is None else graph_def, input_map=input_map,
            return_elements=list(self.rewritten.output_names if outputs is None else outputs), name=scope)
        return tuple(results)

    def _build_function(self, scope: str = IMPORT_SCOPE):
        def body(*flat):
            return self._import(flat, scope)

        return tf.function(body, input_signature=self._specs, autograph=False)

    @property
    def distribution(self) -> Any:
        """The ``tf.distribute`` strategy the step was lowered under (``None``: none)."""
        return self.lowered.distribution

    def replica_call(self, *flat) -> tuple:
        """``(loss, *grads, *preds)`` of one replica's batch (see :meth:`split`), the plan's ops imported
        into the graph being built.

        For a ``tf.function`` that calls it in each replica's context (``strategy.run``): the ops are
        placed on that replica's device and read that replica's copy of the variables. The enclosing
        function runs under :func:`checkmate.tf2._compat.grappler_disabled` (see the module docstring).
        """
        if tf.executing_eagerly():
            raise InvalidArgumentError("replica_call imports the step into a graph: call it inside a tf.function "
                                       "(e.g. in strategy.run there)")
        return self._import(flat)

    def plain_replica_call(self, *flat) -> tuple:
        """:meth:`replica_call` for the plain traced step (no rematerialization)."""
        if tf.executing_eagerly():
            raise InvalidArgumentError("plain_replica_call imports the step into a graph: call it inside a "
                                       "tf.function")
        lowered = self.lowered
        return self._import(flat, f"{IMPORT_SCOPE}_plain", lowered.function.graph.as_graph_def(),
                            (lowered.loss_tensor, *lowered.grad_tensors, *lowered.indices_tensors,
                             *lowered.pred_tensors))

    def split(self, out: Any) -> tuple[Any, list, Any]:
        """``(loss, grads, preds)`` of the step's flat outputs (``(loss, *grads, *indices, *preds)``);
        ``preds`` in the model's output structure (``None`` for a step without predictions).

        A gradient the tape gave as ``tf.IndexedSlices`` is one again, its dense shape its variable's:
        what an optimizer applies, as Keras' ``fit`` hands it over (:meth:`dense` sums it)."""
        lowered = self.lowered
        count = len(lowered.grad_tensors)
        sliced = len(lowered.indices_tensors)
        grads = list(out[1:1 + count])
        indices = iter(out[1 + count:1 + count + sliced])
        for k, name in enumerate(lowered.grad_indices):
            if name is not None:
                shape = [int(d) for d in lowered.variables[k].shape]
                grads[k] = tf.IndexedSlices(grads[k], next(indices), dense_shape=tf.constant(shape, tf.int64))
        preds = list(out[1 + count + sliced:])
        structure = lowered.pred_structure
        return out[0], grads, (tf.nest.pack_sequence_as(structure, preds) if structure is not None else None)

    @staticmethod
    def dense(grads: Sequence[Any]) -> list:
        """``grads`` with each ``tf.IndexedSlices`` summed into its dense tensor (the gradient's value)."""
        return [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]

    def dense_replica_call(self, *flat) -> tuple:
        """``(loss, *dense grads)`` of :meth:`replica_call`: one replica's gradients, summable over the
        replicas."""
        loss, grads, _ = self.split(self.replica_call(*flat))
        return (loss, *self.dense(grads))

    # ------------------------------------------------------------------------------- calling
    @property
    def input_specs(self) -> tuple:
        return self._specs

    @property
    def replicas(self) -> int:
        """Replicas in sync under the step's strategy (1 without one)."""
        return 1 if self.distribution is None else int(self.distribution.num_replicas_in_sync)

    def flat_args(self, x: Any, y: Any, per_replica: bool = False) -> list:
        """``x`` and ``y`` flattened, checked against the compiled shapes (and tensors' dtypes) where
        they are known (symbolic tensors of unknown batch size pass; the function's signature checks
        them). Under a strategy the step is compiled for one replica's batch: a global batch has
        ``replicas`` times its rows (values already distributed per replica are not checked here);
        ``per_replica=True`` checks one replica's batch (in a replica context)."""
        flat = list(tf.nest.flatten(x)) + list(tf.nest.flatten(y))
        if len(flat) != len(self._specs):
            raise InvalidArgumentError(f"the step takes {self._n_inputs} input and "
                                       f"{len(self._specs) - self._n_inputs} label tensor(s); got {len(flat)} in all")
        for k, (value, spec) in enumerate(zip(flat, self._specs)):
            if isinstance(value, tf.distribute.DistributedValues):
                continue
            what = f"input {k}" if k < self._n_inputs else f"label {k - self._n_inputs}"
            shape = tf.TensorShape(value.shape if hasattr(value, "shape") else np.shape(value))
            expected = spec.shape
            if self.replicas > 1 and not per_replica:
                expected = tf.TensorShape([spec.shape[0] * self.replicas] + spec.shape[1:].as_list())
            if not shape.is_compatible_with(expected):
                note = (f" ({self.replicas} replicas x {spec.shape[0]} rows)" if expected != spec.shape else "")
                raise InvalidArgumentError(f"{what} has shape {shape}; the step was compiled for {expected}"
                                           f"{note} (the batch size is part of the compiled plan)")
            # NumPy arrays and Python values are converted to the compiled dtype by TF; tensors are not
            if tf.is_tensor(value) and value.dtype != spec.dtype:
                raise InvalidArgumentError(f"{what} has dtype {value.dtype.name}; the step was compiled "
                                           f"for {spec.dtype.name}")
        return flat

    def distribute(self, flat: Sequence[Any]) -> list:
        """Global-batch tensors as per-replica values, replica ``r`` taking rows ``[r * b, (r + 1) * b)``
        of each (``b``: the compiled batch); values already distributed pass unchanged."""
        distribution = self.distribution
        out = []
        for value, spec in zip(flat, self._specs):
            if isinstance(value, tf.distribute.DistributedValues):
                out.append(value)
                continue
            tensor = tf.convert_to_tensor(value, spec.dtype)
            rows = int(spec.shape[0])
            out.append(distribution.experimental_distribute_values_from_function(
                lambda ctx, t=tensor, b=rows: t[ctx.replica_id_in_sync_group * b:(ctx.replica_id_in_sync_group + 1) * b]))
        return out

    def _distributed(self):
        """``(loss, *grads)`` of a global batch under the strategy: each replica runs the plan on its
        values; the loss (each replica's share) and the gradients are summed over the replicas, as the
        optimizer's all-reduce sums them."""
        if self._distributed_function is None:
            distribution = self.distribution

            def run(*flat):
                # the loss and the dense gradients, not predictions: a replica's sliced gradient is
                # summed into its dense one first (the replicas' indices differ)
                out = distribution.run(self.dense_replica_call, args=flat)
                return tuple(distribution.reduce(tf.distribute.ReduceOp.SUM, o, axis=None) for o in out)

            self._distributed_function = tf.function(run, autograph=False)
        return self._distributed_function

    @property
    def concrete_function(self):
        """The generated ``ConcreteFunction`` over the flat inputs (for nesting in other functions;
        without a strategy: under one, :meth:`replica_call` runs the plan in each replica)."""
        if self.distribution is not None:
            raise InvalidArgumentError("the step was compiled under a tf.distribute strategy: it runs per replica "
                                       "(replica_call inside strategy.run), not as one concrete function")
        if self._concrete is None:
            with _compat.grappler_disabled():
                self._concrete = self._function.get_concrete_function()
        return self._concrete

    def call_flat(self, *flat):
        """Call with flat tensors. Inside another ``tf.function`` this nests the generated function;
        the caller must then run under :func:`checkmate.tf2._compat.grappler_disabled` itself. Under a
        strategy (called eagerly): the global batch split over the replicas, loss and gradients summed."""
        if self.distribution is not None:
            fn, flat = self._distributed(), self.distribute(flat)
        else:
            fn = self.concrete_function
        if tf.executing_eagerly():
            with _compat.grappler_disabled():
                return fn(*flat)
        return fn(*flat)

    def __call__(self, x: Any, y: Any) -> tuple[tf.Tensor, list[tf.Tensor]]:
        out = self.call_flat(*self.flat_args(x, y))
        if self.distribution is not None:
            return out[0], list(out[1:])      # (loss, *dense grads) summed over the replicas
        loss, grads, _ = self.split(out)
        return loss, self.dense(grads)

    # ------------------------------------------------------------------------------- reports
    @property
    def graph_def(self):
        return self.rewritten.graph_def

    @property
    def op_copies(self) -> int:
        """Ops emitted for node computations (every copy of every node's ops)."""
        return self.rewritten.op_copies

    def expected_op_copies(self) -> int:
        """What the schedule asks for: sum over nodes of (computations x ops per node)."""
        per_node = np.array([len(ops) for ops in self.lowered.node_ops])
        return int((self.schedule.recompute.sum(axis=0) * per_node).sum())

    def predicted_peak_bytes(self) -> int:
        return simulate(self.lowered.graph, self.schedule).peak_memory_bytes

    def _executed_names(self, x: Any, y: Any) -> tuple[str, dict[str, str]]:
        """Run a fresh instance of the step once; (its import scope, name -> type of every op TF ran)."""
        if self.distribution is not None:
            raise InvalidArgumentError("counting executed ops runs one instance of the step: compile it without "
                                       "a tf.distribute strategy to count its ops")
        flat = self.flat_args(x, y)
        # TF reports the executed graphs only when a function is instantiated: run a fresh
        # instance of the same GraphDef, under the same settings as every call.
        global _probe_counter
        _probe_counter += 1
        scope = f"{IMPORT_SCOPE}_probe{_probe_counter}"   # tells this run's ops from any other's
        fresh = self._build_function(scope)

        def run():
            with _compat.grappler_disabled():
                return fresh(*flat)

        names = {nd.name: nd.op for gdef in _compat.executed_graph_defs(run) for nd in gdef.node}
        return scope, names

    def executed_op_counts(self, x: Any, y: Any) -> dict[str, int]:
        """Run once and count, per original op of a node, how many copies the runtime executed.

        Reads the post-optimization graph that TF actually ran (after inlining, Grappler and CSE), so
        a recomputation merged away by the runtime shows up as a missing copy. A Grappler fusion
        keeps only the name of its last op: the others show up as missing too (see
        :meth:`executed_copy_counts`).
        """
        scope, names = self._executed_names(x, y)
        pattern = re.compile(r"^(?:.*/)?" + re.escape(scope) + r"/(.*?)(?:" + _COPY_SUFFIX + r"\d+)?$")
        known = set(self.lowered.op_node)
        counts: dict[str, int] = {}
        for name in names:
            m = pattern.match(name)
            if m and m.group(1) in known:
                counts[m.group(1)] = counts.get(m.group(1), 0) + 1
        return counts

    def executed_copy_counts(self, x: Any, y: Any) -> list[int]:
        """Run once and count, per node, the computations of which at least one op ran, alone or
        inside a fused op.

        A node computed ``R`` times should show ``R``; fewer means recomputations were merged away.
        A Grappler fusion (``Conv2D + BiasAdd + Relu``, ``Add + Relu``) runs its ops as one op named
        after the last of them: an op whose copy is missing counts as run when a consumer of that
        copy ran as a fused op. A Grappler rewrite that renames an op (the arithmetic optimizer's
        ``<dir>/ArithmeticOptimizer/AddOpsRewrite_<op>``) keeps its directory and ends in its name.
        """
        scope, executed = self._executed_names(x, y)
        pattern = re.compile(r"^(?:.*/)?" + re.escape(scope) + r"/(.*)$")
        ran: dict[str, str] = {}
        for name, kind in executed.items():
            m = pattern.match(name)
            if m:
                ran[m.group(1)] = kind
        renamed: dict[str, list[str]] = {}
        for name in ran:
            m = re.match(r"^(.*?)/\w*Optimizer/(.*)$", name)
            if m:
                renamed.setdefault(m.group(1), []).append(m.group(2))

        def present(name: str) -> bool:
            if name in ran:
                return True
            folder, _, base = name.rpartition("/")
            return any(tail.endswith("_" + base) for tail in renamed.get(folder, ()))

        consumers: dict[str, list[str]] = {}
        for nd in self.rewritten.graph_def.node:
            for text in nd.input:
                if not text.startswith("^"):
                    consumers.setdefault(_split_input(text)[1], []).append(nd.name)

        def fused_into(name: str, depth: int = 3) -> bool:
            # a fused chain (Add -> Relu) may span several consumers; the fused op is at its end
            for user in consumers.get(name, ()):
                if "Fused" in ran.get(user, "") or (user not in ran and depth > 1 and fused_into(user, depth - 1)):
                    return True
            return False

        by_name = {nd.name: nd for nd in self.rewritten.graph_def.node}
        counts = [0] * self.lowered.graph.n
        for (i, _), names in self.rewritten.copy_ops.items():
            shape_only = all(by_name[n].op in SHAPE_OPS for n in names)   # never anchored: CSE may merge them
            if shape_only or any(present(n) for n in names) or any(fused_into(n) for n in names):
                counts[i] += 1
        return counts


def generate(lowered: LoweredGraph, schedule: Schedule, order: str = "auto") -> RematFunction:
    """Build the rematerializing step for ``schedule`` (which must be valid for ``lowered.graph``);
    ``order``: see :func:`rewrite_graph_def`."""
    return RematFunction(lowered, schedule, rewrite_graph_def(lowered, schedule, order))
