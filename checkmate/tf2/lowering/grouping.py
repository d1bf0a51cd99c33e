"""Grouping the step's non-static ops into the graph's nodes (docs/design.md §1, §3).

**Op level** (``level="op"``): one group per op that produces data, plus one per side-effecting op
without outputs (``AssignVariableOp``, never recomputable), so that it runs exactly once, in order.

**Layer level** (``level="layer"``, the paper's granularity): the ops of each top-level Keras layer
call form one forward group, and the gradient ops of that layer one backward group (the loss function
is a layer of its own, named ``loss``). Ops are attributed to layers by the ops each layer call
created while tracing; gradient ops by the forward op whose name scope they carry; ops left over
(gradient sums ``AddN``, casts Keras inserts outside ``call``) by their consumers, else their
producers; a forward op outside every layer call whose output several layers read (the residual
add of ``x = x + block(x)`` written between layers) is a node of its own, named after the op, so that
the stream between blocks can be kept without the layer that reads it. A layer whose forward ops mix
recomputable and non-recomputable ops (BatchNorm's moving-average update, Dropout's seed variable) is
split into a recomputable group and a ``<layer>:state`` group holding the non-recomputable ops (plus
the stateless ops that only feed them), so that the layer's activations stay recomputable. Groups
that depend on each other in a cycle (only when attribution heuristics interleave two layers) are
merged. These are the compact groups: one
forward and one backward node per layer.

**Gradient nodes** (``gradient_nodes=True``): a node's value is one block that lives until its last
consumer has run, so layers are split where one block would hold bytes TF has already freed
(measured against TF's allocation log):

* **parameter gradients** (``<layer>_grad:params``): step outputs, resident from the moment they are
  computed (docs/design.md §3's ``output`` flag), computed once (not recomputable). The node holds the
  ops producing the layer's gradients plus the ops of the layer's backward that feed only them. The
  backward ops the gradients need run before it (``<layer>_grad``: e.g. the ReluGrad whose output
  both the weight gradient and the input gradient read), the others after it (``<layer>_grad:2``,
  e.g. the gradient w.r.t. the layer's input, which is passed on and dies once consumed). A backward
  op that both depends on a gradient and feeds one (BatchNorm's gradient w.r.t. beta feeds gamma's
  through a per-channel ``Neg``) joins ``:params``. A layer whose backward only feeds its gradients
  (the first layer: the gradient w.r.t. the batch is dead) is a single ``:params`` node.
* **what the backward reads** (``<layer>:saved``): BatchNorm's gradient reads the batch statistics
  (bytes per channel), not the layer's output. When the ops whose outputs backward nodes read (and
  their ancestors in the layer) pass on fewer bytes than the whole layer, they form ``:saved`` and the
  rest keeps the layer's name; recomputing the layer for the backward pass then recomputes only them.

Both splits only regroup ops (``node_ops`` covers the same ops in both accountings; every op runs
once per computation of its node). What docs/design.md §3 cannot express is not modelled: TF writes
an elementwise output into a dying input's buffer (ReLU, BiasAdd, ReluGrad) of another node, and an
input a node reads first dies before the node ends (a layer's output, read only by its ReluGrad);
both make TF use less than the plan.

**Workspace split**: with gradient nodes, a layer node whose new transient tensors (not written in
place) outweigh its value and ``WORKSPACE_SPLIT_FRACTION`` of the activations is split into one node
per op (``<node>:<op type>``, listed in ``metadata["split_workspace_nodes"]``), so that the plan
counts them: the backward of multi-head attention, GroupNorm's. Ops that write into one buffer (a view
of its input, an elementwise kernel on an input nothing else reads) stay together, named after the
last: as separate nodes the plan would hold that buffer twice.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Mapping, Sequence

import networkx as nx

from checkmate.graph import Graph
from checkmate.tf2.lowering.accounting import _IN_PLACE_OPS, _VIEW_OPS, new_workspace, node_mem
from checkmate.tf2.lowering.ops import OpGraph, OpInfo
from checkmate.tf2.lowering.trace import TracedStep

__all__ = ["Group", "LOSS_LAYER", "PREDICTION_LAYER", "WORKSPACE_SPLIT_FRACTION", "op_groups", "layer_groups", "gradient_node_groups",
           "composite_calls",
           "merge_cycles", "group_dependencies", "split_large_workspaces", "split_large_outputs",
           "OUTPUT_SPLIT_RATIO", "OUTPUT_SPLIT_FRACTION", "WORKING_SET_SPLIT_FRACTION", "WORKING_SET_SPLIT_RATIO",
           "split_composite_layers", "split_large_working_sets", "AUTO_OP_NODE_LIMIT", "COMPOSITE_OWN_NODES",
           "SPLIT_MAX_PARTS"]

# Layer-level name of the loss function's ops, and of model ops no layer call created.
LOSS_LAYER = "loss"
# The node of the ops that return the step's predictions (with predictions=True; see prediction_ops);
# no layer's name or node label has this form (":" ends a layer name in a label, as in "<layer>:saved")
PREDICTION_LAYER = "step:predictions"
_UNATTRIBUTED = "model"

# In a graph with gradient nodes, a layer node whose new transient tensors outweigh both its value and
# this share of the activation part of the checkpoint-all peak is split into one node per op, so that
# the plan counts those tensors. The backward of multi-head attention holds the gradients of its score
# tensors: 1.5 MiB on a transformer block whose activations peak at 4-6 MiB, and its measured peak was
# 1.25-1.49x the layer-level plan. Smaller workspaces are left in their layer node: the measured peaks
# of MLPs, CNNs and U-Nets follow their layer-level plans.
WORKSPACE_SPLIT_FRACTION = 0.1
# With gradient nodes, a layer node that reads this share of the activations (its inputs and value
# together) is split as a large workspace is, when no op of it reads and writes more than
# 1 / WORKING_SET_SPLIT_RATIO of that: one node would need every input resident at once where its ops
# each need a few. The backward of KerasHub's RWKV-7 time mixing (a recurrence unrolled in Python, two
# layers, 64 steps): one node read 68% of the activations, every saved value of its 64 steps.
WORKING_SET_SPLIT_FRACTION = 0.25
WORKING_SET_SPLIT_RATIO = 4
# level="auto": a forward node that is a step output through small tensors (the loss) but whose value
# is at least OUTPUT_SPLIT_RATIO times them and this share of the activations (the cross-entropy's
# gradient of the logits) is split into one node per op, so that only the loss stays resident: GPT-2's
# and Llama's loss nodes (7.8 MiB of 56-81 MiB of activations) otherwise keep the logits' gradient
# resident for the whole backward pass; Llama (hidden 256, batch 8 x 128) at 50% of checkpoint-all was
# infeasible in RematModel's 20 s solve, 1.12x predicted after the split.
OUTPUT_SPLIT_RATIO = 2.0
OUTPUT_SPLIT_FRACTION = 0.02
# level="auto": the layer nodes inside composite layers are split into op nodes while the graph stays
# within this many nodes, a size that RematModel's first-plan solve (20 s) still plans well: GPT-2
# (2 layers, hidden 256, batch 8 x 128) at 50% of checkpoint-all, 161 nodes 1.300x predicted, 370 nodes
# (all split) 1.104x in 11 s, the op level's 599 nodes 1.081x in 16 s (experiments/results/realworld_lm.md).
AUTO_OP_NODE_LIMIT = 600
# The most nodes the ops a composite call creates outside its sublayers become (one per op up to this
# many; beyond, runs of consecutive ops). KerasHub's RWKV-7 (2 layers, hidden 128, 64 tokens) unrolls its
# recurrence in the time-mixing layer's call(): one node per op gave 5027 nodes, on which no strategy
# found a schedule at 50% of checkpoint-all within 180 s.
COMPOSITE_OWN_NODES = 128
# The most parts a layer node with a large workspace is split into (one per chain of ops up to this
# many; beyond, runs of consecutive chains): the backward node of RWKV-7's unrolled recurrence holds
# thousands of ops, which one node each made 3772 nodes of a 343-node graph.
SPLIT_MAX_PARTS = 128


@dataclass
class Group:
    """Ops that become one node of the graph."""

    name: str
    ops: list[int]  # op indices, creation (topological) order
    backward: bool
    recomputable: bool
    layer: str | None = None
    # Position among the groups when dependencies leave a choice (default: (first op, 0)). The parts
    # of a split backward layer share their layer's first op, so that they run in the intended order.
    order: tuple[int, int] | None = None

    @property
    def sort_key(self) -> tuple[int, int]:
        return self.order if self.order is not None else (min(self.ops), 0)


def op_groups(infos: Sequence[OpInfo], predictions: Sequence[int] = ()) -> list[Group]:
    """One group per op, but the ops that return the predictions (``predictions``, see
    :func:`prediction_ops`): one group, the step's last node."""
    groups = []
    for info in infos:
        if info.static or info.index in predictions:
            continue
        groups.append(Group(info.op.name, [info.index], info.backward, info.recomputable))
    if predictions:
        groups.append(Group(PREDICTION_LAYER, sorted(predictions), infos[predictions[0]].backward,
                            all(infos[i].recomputable for i in predictions)))
    return groups


def composite_calls(traced: TracedStep) -> dict[str, int]:
    """The recorded layer calls inside which other recorded calls ran (a nested model, a transformer
    block, an attention layer), by path, with the number of calls directly inside each."""
    names = {name for name, _, _ in traced.layer_calls}
    inner: dict[str, int] = {}
    for name in names:
        if "/" in name:
            parent = name.rsplit("/", 1)[0]
            if parent in names:
                inner[parent] = inner.get(parent, 0) + 1
    return inner


def prediction_ops(traced: TracedStep, infos: Sequence[OpInfo]) -> list[int]:
    """The indices of the ops that return the step's predictions (non-static ones): created after the
    gradients, together one node, the step's last (see ``trace._prediction_output``)."""
    start = traced.prediction_start if traced.prediction_start is not None else traced.terminal_start
    return [i for i in range(start, traced.terminal_start) if not infos[i].static]


def _loss_runs(layer: dict[int, str]) -> None:
    """Where the loss calls layers (a model run again in its own ``compute_loss``), its own ops between
    those calls become runs of their own, ``loss``, ``loss@2``, ...: one node holding the ops before
    and after a call would both feed the call and read it, a cycle that merges everything between."""
    run, seen, between = 1, False, False
    for i in sorted(layer):
        if layer[i] != LOSS_LAYER:
            between = seen
            continue
        if between:
            run += 1
            between = False
        seen = True
        if run > 1:
            layer[i] = f"{LOSS_LAYER}@{run}"


def _layer_of_ops(traced: TracedStep, infos: Sequence[OpInfo], op_graph: OpGraph,
                  composites: Mapping[str, int] | None = None) -> dict[int, str]:
    """Attribute every non-static op to a layer name (the loss function counts as layer ``loss``).

    With ``composites`` (calls that contain other calls), an op that a composite call creates
    outside all of its sublayers' calls (attention scores and softmax, a block's residual adds, a
    nested model's glue) is a pseudo-layer of its own, ``<composite>/<op>``: one node per op, or,
    for a call with more than :data:`COMPOSITE_OWN_NODES` such ops, one per run of consecutive ops
    (``<composite>/<first op>+<more>``).
    """
    layer: dict[int, str] = {}
    # Forward: innermost recorded call containing the op (calls are appended on exit, so a call
    # nested in another is listed first; sorting by length picks the innermost).
    spans = sorted(traced.layer_calls, key=lambda c: c[2] - c[1])
    for info in infos:
        if info.static:
            continue
        i = info.index
        if i < traced.grad_start:
            # a layer called by the loss (a model run again in its own compute_loss) is a layer too
            for name, start, end in spans:
                if start <= i < end:
                    layer[i] = name
                    break
            else:
                if i >= traced.loss_start:
                    layer[i] = LOSS_LAYER
    _loss_runs(layer)
    if composites:
        taken: set[str] = set()
        own: dict[str, list[int]] = {}
        for i, name in sorted(layer.items()):
            if name in composites:
                own.setdefault(name, []).append(i)
        for name, members in own.items():
            # a call with many ops of its own (a recurrence unrolled by a Python loop in its call():
            # RWKV-7's time mixing, 64 steps of a dozen ops each) gets them in runs of consecutive ops
            # (ops in creation order: a run reads only runs before it), at most COMPOSITE_OWN_NODES
            # of them, rather than thousands of one-op nodes
            size = -(-len(members) // COMPOSITE_OWN_NODES)
            runs: list[list[int]] = []
            for i in members:
                # a run ends where another layer's op was created between two of its ops
                apart = runs and any(layer.get(j, name) != name for j in range(runs[-1][-1] + 1, i))
                if not runs or len(runs[-1]) >= size or apart:
                    runs.append([])
                runs[-1].append(i)
            for run in runs:
                tail = "/".join(infos[run[0]].op.name.split("/")[-2:])
                label = f"{name}/{tail}" + (f"+{len(run) - 1}" if len(run) > 1 else "")
                if label in taken:
                    label = f"{label}#{run[0]}"
                taken.add(label)
                for i in run:
                    layer[i] = label

    _split_junctions(layer, traced, infos, op_graph)

    # The ops that return the predictions: together the step's last node, PREDICTION_LAYER
    predictions = set(prediction_ops(traced, infos))
    for i in predictions:
        layer[i] = PREDICTION_LAYER

    # Backward: the forward op (or scope) whose name the gradient op carries.
    scope_layer: dict[str, str | None] = {}
    for info in infos:
        i = info.index
        if i >= traced.grad_start:
            break
        name = layer.get(i)
        if name is None:
            if info.static and traced.model_start <= i < traced.grad_start:
                name = _span_of(i, spans, traced)
            if name is None:
                continue
        parts = info.op.name.split("/")
        for k in range(1, len(parts) + 1):
            prefix = "/".join(parts[:k])
            if prefix in scope_layer and scope_layer[prefix] != name:
                scope_layer[prefix] = None  # ambiguous (an enclosing scope such as the model's)
            else:
                scope_layer[prefix] = name
    for info in infos:
        i = info.index
        if info.static or i < traced.grad_start or i in predictions:
            continue
        parts = info.op.name.split("/")
        if parts[0].startswith("gradient_tape"):
            parts = parts[1:]
        for k in range(len(parts), 0, -1):
            hit = scope_layer.get("/".join(parts[:k]))
            if hit:
                layer[i] = hit
                break

    # Leftovers: the layer of a consumer in the same direction, else of a producer.
    for info in reversed(infos):
        i = info.index
        if info.static or i in layer:
            continue
        for j in op_graph.users[i]:
            if not infos[j].static and infos[j].backward == info.backward and j in layer:
                layer[i] = layer[j]
                break
    for info in infos:
        i = info.index
        if info.static or i in layer:
            continue
        for j in sorted(op_graph.producers[i], reverse=True):
            if j in layer and infos[j].backward == info.backward:
                layer[i] = layer[j]
                break
        else:
            layer[i] = LOSS_LAYER if info.backward or i >= traced.loss_start else _UNATTRIBUTED
    return layer


def _split_junctions(layer: dict[int, str], traced: TracedStep, infos: Sequence[OpInfo], op_graph: OpGraph) -> None:
    """Make each forward op outside every layer call whose output more than one layer (or other such op)
    reads a pseudo-layer of its own (``<op name without the model's scope>``), in place.

    A residual stream written between layers (``x = x + block(x)`` in a functional model) is such an
    op. Attributed to one of its readers' layers, its value would be part of that layer's node, which
    is then kept or recomputed as a whole: holding the stream between blocks (what
    ``tf.recompute_grad`` around each block keeps) would cost the layer's other outputs too."""
    taken = set(layer.values())
    for info in infos:
        i = info.index
        if info.static or info.backward or i in layer or not traced.model_start <= i < traced.loss_start:
            continue
        readers = {layer.get(j, j) for consumers in op_graph.output_consumers[i] for j in consumers
                   if not infos[j].static and not infos[j].dead and not infos[j].backward}
        if len(readers) < 2:
            continue
        parts = info.op.name.split("/")
        label = "/".join(parts[1:] if len(parts) > 1 else parts)
        while label in taken:
            label = f"{label}#{i}"
        taken.add(label)
        layer[i] = label


def _span_of(i: int, spans, traced) -> str | None:
    for name, start, end in spans:
        if start <= i < end:
            return name
    if traced.loss_start <= i < traced.grad_start:
        return LOSS_LAYER
    return None


def _split_by_recomputability(ops: list[int], infos: Sequence[OpInfo],
                              op_graph: OpGraph) -> list[tuple[list[int], bool]]:
    """Split one layer's ops into parts that are each all-recomputable or not, with no cycle between them.

    Stateless ops that only feed non-recomputable ops (BatchNorm's moving-average arithmetic, Dropout's
    seed increment) join them. Then each op gets the smallest rank >= its in-layer inputs' ranks whose
    parity encodes its kind (even: recomputable); ops of equal rank form a part, and parts of the same
    kind are merged whenever that keeps the parts acyclic.
    """
    recomputable = {i: infos[i].recomputable for i in ops}
    if all(recomputable.values()) or not any(recomputable.values()):
        return [(list(ops), all(recomputable.values()))]
    members = set(ops)
    inside_inputs: dict[int, list[int]] = {}
    users: dict[int, list[int]] = {i: [] for i in ops}
    for i in ops:
        srcs = [j for j in op_graph.producers[i] if j in members]
        inside_inputs[i] = srcs
        for s in srcs:
            users[s].append(i)
    # Absorb state-only feeders (reverse topological order so chains are absorbed whole).
    outside_users = _outside_users(ops, op_graph)
    for i in reversed(ops):
        if recomputable[i] and users[i] and not outside_users.get(i) and \
                all(not recomputable[u] for u in users[i]):
            recomputable[i] = False
    rank: dict[int, int] = {}
    for i in ops:
        base = max((rank[s] for s in inside_inputs[i]), default=0)
        want = 0 if recomputable[i] else 1
        rank[i] = base if base % 2 == want else base + 1
    parts: dict[int, list[int]] = {}
    for i in ops:
        parts.setdefault(rank[i], []).append(i)
    # Greedy merge of same-kind parts while the quotient stays acyclic.
    labels = {i: rank[i] for i in ops}
    keys = sorted(parts)

    def acyclic(lbl):
        dg = nx.DiGraph()
        dg.add_nodes_from(set(lbl.values()))
        for i in ops:
            for s in inside_inputs[i]:
                if lbl[s] != lbl[i]:
                    dg.add_edge(lbl[s], lbl[i])
        return nx.is_directed_acyclic_graph(dg)

    for a_pos, a in enumerate(keys):
        for b in keys[a_pos + 1:]:
            if a % 2 != b % 2 or b not in set(labels.values()) or a not in set(labels.values()):
                continue
            trial = {i: (a if lbl == b else lbl) for i, lbl in labels.items()}
            if acyclic(trial):
                labels = trial
    final: dict[int, list[int]] = {}
    for i in ops:
        final.setdefault(labels[i], []).append(i)
    return [(final[k], k % 2 == 0) for k in sorted(final)]


def _outside_users(ops: list[int], op_graph: OpGraph) -> dict[int, bool]:
    """Whether each op of ``ops`` has a consumer outside ``ops``."""
    members = set(ops)
    return {i: any(c not in members for consumers in op_graph.output_consumers[i] for c in consumers)
            for i in ops}


def layer_groups(traced: TracedStep, infos: Sequence[OpInfo], op_graph: OpGraph,
                 composites: Mapping[str, int] | None = None) -> list[Group]:
    """One forward and one backward group per layer call (plus ``:state`` parts): the compact graph.
    With ``composites`` (see :func:`_layer_of_ops`), a composite call's own ops are one group each."""
    layer = _layer_of_ops(traced, infos, op_graph, composites)
    buckets: dict[tuple[str, bool], list[int]] = {}
    for info in infos:
        if not info.static:
            buckets.setdefault((layer[info.index], info.backward), []).append(info.index)
    groups: list[Group] = []
    for (name, backward), ops in buckets.items():
        base = f"{name}_grad" if backward and name != PREDICTION_LAYER else name
        parts = _split_by_recomputability(ops, infos, op_graph)
        seen_rec = 0
        for part_ops, rec in parts:
            if rec:
                seen_rec += 1
                label = base if seen_rec == 1 else f"{base}:{seen_rec}"
            else:
                label = f"{base}:state"
            # A part is recomputable only if every op in it is (absorbed feeders inherit the part's flag).
            rec = rec and all(infos[i].recomputable for i in part_ops)
            groups.append(Group(label, part_ops, backward, rec, layer=name))
    return groups


def gradient_node_groups(groups: list[Group], infos: Sequence[OpInfo], op_graph: OpGraph,
                         traced: TracedStep) -> list[Group]:
    """The compact layer groups with the gradient-node splits (``:saved``, ``:params``)."""
    groups = _split_saved_for_backward(groups, infos, op_graph, traced)
    return _split_parameter_gradients(groups, infos, op_graph, traced.gradient_outputs)


def _split_saved_for_backward(groups: list[Group], infos: Sequence[OpInfo], op_graph: OpGraph,
                              traced: TracedStep) -> list[Group]:
    """Split off the part of a forward layer that the backward pass reads (``<name>:saved``) when
    it is smaller than the layer's value.

    A node's value lives until its last consumer has run, as one block. BatchNorm's backward reads
    only the batch statistics (a few bytes per channel), Dropout's only the mask, yet as one node the
    layer's whole output would stay resident until its gradient runs, and recomputing the layer for
    the backward pass would produce the output too. ``:saved`` holds the ops whose outputs the
    backward reads and their ancestors inside the layer; the rest (``<name>``) produces what the
    forward consumers read. The split is made only when the bytes ``:saved`` passes on (to the
    backward and to the rest of the layer) are fewer than the layer's own value.
    """
    output_tensors = {traced.loss_tensor, *traced.gradient_outputs}
    backward_ops = {info.index for info in infos if info.backward and not info.static}
    result: list[Group] = []
    for g in groups:
        if g.backward or not g.recomputable or len(g.ops) < 2:
            result.append(g)
            continue
        members = set(g.ops)
        saved = {i for i in g.ops
                 if any(c in backward_ops for consumers in op_graph.output_consumers[i] for c in consumers)}
        if not saved:
            result.append(g)
            continue
        read = set(saved)
        for i in reversed(g.ops):  # creation order is topological: ancestors come earlier
            if i in saved:
                saved.update(j for j in op_graph.producers[i] if j in members)
        rest = [i for i in g.ops if i not in saved]
        part = sorted(saved)
        whole_bytes = node_mem(g.ops, infos, op_graph, "layer", output_tensors)[0]
        first = g.sort_key[0]
        if rest and node_mem(part, infos, op_graph, "layer", output_tensors)[0] < whole_bytes:
            result.append(Group(f"{g.name}:saved", part, False, True, layer=g.layer, order=(first, 0)))
            result.append(Group(g.name, rest, False, True, layer=g.layer, order=(first, 1)))
            continue
        views = sorted(read)
        rest = [i for i in g.ops if i not in read]
        if (rest and all(infos[i].op.type in _VIEW_OPS for i in views)
                # nothing else in the layer reads the views: the rest must not depend on ``:saved``
                and not any(c in members and c not in read
                            for i in views for consumers in op_graph.output_consumers[i] for c in consumers)
                and node_mem(views, infos, op_graph, "layer", output_tensors)[0] < whole_bytes):
            # What the backward reads comes out of the op that also writes the layer's output (a fused
            # kernel's per-channel statistics), through views of its own: those views alone become
            # ``:saved``, after the rest, so that the output dies with its forward consumers while the
            # statistics wait for the backward. Recomputing ``:saved`` recomputes the kernel.
            result.append(Group(g.name, rest, False, True, layer=g.layer, order=(first, 0)))
            result.append(Group(f"{g.name}:saved", views, False, True, layer=g.layer, order=(first, 1)))
            continue
        result.append(g)
    return result


def _split_parameter_gradients(groups: list[Group], infos: Sequence[OpInfo], op_graph: OpGraph,
                               grad_tensors: Sequence[str]) -> list[Group]:
    """Give the parameter gradients of each backward group a node of their own (``<name>:params``).

    The gradients are step outputs, resident from the moment they are computed (docs/design.md §3),
    while the rest of a backward layer (the gradient it passes on) dies once consumed. ``:params``
    holds the ops producing gradients plus the ops of the group that feed only them. The other ops are
    split by whether ``:params`` needs them: those it needs run before it (``<name>``), the others
    after it (``<name>:2``). In this order the tensors crossing between the parts (the gradient of
    the layer's pre-activation, read by both the weight gradient and the input gradient) die where
    they die in the unsplit layer, instead of riding along in a node's value until its last user.
    A group whose ops all feed only gradients becomes a single ``:params`` node.
    """
    grad_ops = {t.rsplit(":", 1)[0] for t in grad_tensors}
    # The non-static ops reading each non-static op (dead ops are static: they never read anything).
    users = {info.index: {j for j in op_graph.users[info.index] if not infos[j].static}
             for info in infos if not info.static}
    result: list[Group] = []
    for g in groups:
        params = {i for i in g.ops if infos[i].op.name in grad_ops}
        if not g.backward or not params:
            result.append(g)
            continue
        for i in reversed(g.ops):  # creation order is topological: users come later
            if i not in params and users.get(i) and users[i] <= params:
                params.add(i)
        # Ops anywhere in the graph that the gradients depend on (paths may leave the group), and
        # ops that depend on a gradient op. An op of the group that is both (BatchNorm's gradient
        # w.r.t. beta feeds the one w.r.t. gamma through a small Neg) joins :params: outside it, it
        # would make the parts depend on each other in a cycle.
        # Only the group's ops are asked about, and op indices are a topological order: a path
        # between two of them never leaves [first op, last op], so the search stops there (the whole
        # graph's ancestors per layer made a 2621-node NASNetMobile's split take 13 s).
        needed = _reachable(params, infos, op_graph, users, upward=True, within=(min(g.ops), max(g.ops)))
        fed = _reachable(params, infos, op_graph, users, upward=False, within=(min(g.ops), max(g.ops)))
        params |= {i for i in g.ops if i in needed and i in fed}
        rest = [i for i in g.ops if i not in params]
        before = [i for i in rest if i in needed]
        after = [i for i in rest if i not in needed]
        first = g.sort_key[0]
        named = [p for p in (before, after) if p]
        for k, part in enumerate(named):
            result.append(Group(g.name if k == 0 else f"{g.name}:{k + 1}", part, True, g.recomputable,
                                layer=g.layer, order=(first, 0 if part is before else 2)))
        result.append(Group(f"{g.name}:params", sorted(params), True, False, layer=g.layer, order=(first, 1)))
    return result


def _reachable(start: set[int], infos: Sequence[OpInfo], op_graph: OpGraph,
               users: Mapping[int, set[int]], *, upward: bool,
               within: tuple[int, int] | None = None) -> set[int]:
    """Non-static ops from which an op of ``start`` is reachable (``upward``: its ancestors) or
    which are reachable from one (its descendants), through data and control edges; with
    ``within=(lo, hi)``, only through ops whose index lies in that range."""
    lo, hi = within if within is not None else (-1, len(infos))
    seen: set[int] = set()
    stack = list(start)
    while stack:
        i = stack.pop()
        nxt = op_graph.producers[i] if upward else users.get(i, ())
        for j in nxt:
            if lo <= j <= hi and j not in seen and not infos[j].static:
                seen.add(j)
                stack.append(j)
    return seen


def group_dependencies(groups: list[Group], op_graph: OpGraph) -> nx.DiGraph:
    """Group k depends on group d when one of k's ops reads (data or control) an op of d."""
    owner = {i: k for k, g in enumerate(groups) for i in g.ops}
    dg = nx.DiGraph()
    dg.add_nodes_from(range(len(groups)))
    for k, g in enumerate(groups):
        for i in g.ops:
            for j in op_graph.producers[i]:
                if j in owner and owner[j] != k:
                    dg.add_edge(owner[j], k)
    return dg


def merge_cycles(groups: list[Group], op_graph: OpGraph) -> list[Group]:
    """Merge groups that depend on each other in a cycle (possible only when attribution heuristics
    interleave two layers); a merged group is non-recomputable if any part was."""
    dg = group_dependencies(groups, op_graph)
    if nx.is_directed_acyclic_graph(dg):
        return groups
    merged = []
    taken = {g.name for g in groups}
    for scc in nx.strongly_connected_components(dg):
        members = sorted(scc, key=lambda k: min(groups[k].ops))
        if len(members) == 1:
            merged.append(groups[members[0]])
            continue
        ops = sorted(i for k in members for i in groups[k].ops)
        # named by its first member and how many joined it, as runs are (the names of a cycle of a
        # recurrence's backward, hundreds of ops, would fill the summary and every error that names it)
        name = f"{groups[members[0]].name}+{len(members) - 1}"
        if name in taken:
            name = "+".join(groups[k].name for k in members)
        taken.add(name)
        merged.append(Group(name, ops,
                            any(groups[k].backward for k in members),
                            all(groups[k].recomputable for k in members), layer=groups[members[0]].layer))
    return merged


# An op that orders itself after a chain and feeds its next op may join the chain when its output is
# below this fraction of the chain's buffer (a scalar or per-channel tensor against an activation).
_SMALL_INPUT_RATIO = 64


def _same_buffer_size(a, b) -> bool:
    return a.dtype == b.dtype and a.shape.num_elements() is not None \
        and a.shape.num_elements() == b.shape.num_elements()


def in_place_chains(ops: Sequence[int], infos: Sequence[OpInfo], op_graph: OpGraph,
                    keep_tensors: frozenset[str] = frozenset()) -> list[list[int]]:
    """``ops`` (one split layer node) partitioned into chains that each hold one buffer: an op joins
    the chain of the op whose output it writes into.

    TF runs a view (Reshape) on its input's buffer, and an elementwise kernel (``_IN_PLACE_OPS``) in an
    input of its output's size when that input has no other reader (its buffer dies with the kernel).
    As two nodes, the memory model would hold both buffers while the second one runs (and, when a
    third op only orders itself after the first through a control edge, until that op runs): one
    buffer too many on each such op. An input that is read elsewhere, or is a step output
    (``keep_tensors``), is not taken over, so its producer stays a node of its own."""
    members = set(ops)
    chain_of = {i: i for i in ops}
    ancestors: dict[int, set[int]] = {}
    for i in sorted(ops):   # creation order is topological
        ancestors[i] = set()
        for q in op_graph.producers[i]:
            if q in members:
                ancestors[i] |= {q} | ancestors[q]
    for j in sorted(ops):
        op = infos[j].op
        if op.type not in _IN_PLACE_OPS and op.type not in _VIEW_OPS:
            continue
        if len(op.outputs) != 1:
            continue
        out = op.outputs[0]
        candidates = op.inputs[:1] if op.type in _VIEW_OPS else op.inputs
        for k, t in enumerate(candidates):
            p = op_graph.inputs[j][k]
            if p not in members or t.name in keep_tensors or not _same_buffer_size(t, out):
                continue
            readers = [c for c in op_graph.output_consumers[p][t.value_index] if not infos[c].dead]
            if readers != [j]:
                continue
            # j's other inputs must not come after the chain (the two would depend on each other and
            # be merged, hiding the other input's buffer), unless they are small: a constant that a
            # gradient function orders after the chain with a control edge (2 * grad in
            # SquaredDifference's gradient)
            chain = chain_of[p]
            others = [q for q in op_graph.producers[j] if q in members and chain_of[q] != chain
                      and infos[q].bytes * _SMALL_INPUT_RATIO > infos[p].bytes]
            if any(chain_of[a] == chain for q in others for a in ancestors[q]):
                continue
            chain_of[j] = chain
            break
    chains: dict[int, list[int]] = {}
    for i in sorted(ops):
        chains.setdefault(chain_of[i], []).append(i)
    return sorted(chains.values(), key=min)


def _with_parts(groups: list[Group], parts: Mapping[int, Sequence[Sequence[int]]],
                infos: Sequence[OpInfo]) -> list[Group]:
    """``groups`` with each group ``k`` of ``parts`` replaced by one group per part, in order, each
    named after the op whose output is the part's value (the last of its chain)."""
    out: list[Group] = []
    for k, g in enumerate(groups):
        if k not in parts:
            out.append(g)
            continue
        for p, part in enumerate(parts[k]):
            out.append(Group(f"{g.name}:{infos[part[-1]].op.type}", list(part), g.backward,
                             g.recomputable and all(infos[i].recomputable for i in part), g.layer,
                             order=(*g.sort_key, p)))
    return out


def _freeing_order(ops: Sequence[int], infos: Sequence[OpInfo], op_graph: OpGraph) -> list[int]:
    """``ops`` in a topological order that runs an op as soon as it is the last reader of a value of
    the group (it frees that value), else in creation order.

    Creation order can leave the readers of many values to the end (a sum of per-step gradients
    created after the last of them, without :func:`checkmate.tf2._compat.running_gradient_sums`), and
    runs cut from creation order would hold every value until then. In this order each reader follows
    the values it is the last to read."""
    members = set(ops)
    waiting = {i: sum(1 for q in op_graph.producers[i] if q in members) for i in ops}
    readers = {i: sum(1 for u in op_graph.users[i] if u in members and not infos[u].dead) for i in ops}
    ready = [i for i in sorted(ops) if waiting[i] == 0]
    heapq.heapify(ready)
    freeing: list[int] = []
    order: list[int] = []
    done: set[int] = set()

    def frees(i: int) -> bool:
        return any(q in members and readers[q] == 1 for q in op_graph.producers[i])

    while ready or freeing:
        i = -1
        while freeing:
            j = heapq.heappop(freeing)
            if j not in done:
                i = j
                break
        if i < 0:
            i = heapq.heappop(ready)
            if i in done:
                continue
        done.add(i)
        order.append(i)
        for q in set(op_graph.producers[i]):
            if q in members:
                readers[q] -= 1
                # the last reader of q frees it: run it next
                for u in op_graph.users[q]:
                    if u in members and u not in done and waiting[u] == 0 and frees(u):
                        heapq.heappush(freeing, u)
        for u in op_graph.users[i]:
            if u in members:
                waiting[u] -= 1
                if waiting[u] == 0:
                    heapq.heappush(freeing if frees(u) else ready, u)
    return order


def _runs(parts: Sequence[Sequence[int]], limit: int | None = None, infos: Sequence[OpInfo] | None = None,
          op_graph: OpGraph | None = None) -> list[list[int]]:
    """``parts`` of one group, or, when they are more than ``limit`` (default :data:`SPLIT_MAX_PARTS`),
    about ``limit`` runs of the group's ops in a topological order, each cut where a part starts. Runs of a
    topological order depend only on the runs before them (parts of interleaved chains merged by first
    op would depend on each other, and merging those cycles left 9 nodes of 600 ops); a chain cut by a
    run's end counts its buffer on both sides, which overstates the memory, never understates it. The
    order is creation order, or, with ``op_graph``, :func:`_freeing_order`."""
    limit = SPLIT_MAX_PARTS if limit is None else limit
    if len(parts) <= limit:
        return [list(p) for p in parts]
    starts = {min(p) for p in parts if p}
    ops = sorted(i for p in parts for i in p)
    if op_graph is not None and infos is not None:
        ops = _freeing_order(ops, infos, op_graph)
    size = -(-len(ops) // limit)
    runs: list[list[int]] = []
    for i in ops:
        if not runs or (len(runs[-1]) >= size and i in starts):
            runs.append([])
        runs[-1].append(i)
    return runs


def split_large_workspaces(groups: list[Group], infos: Sequence[OpInfo], graph: Graph,
                           workspace: Sequence[int], order: Sequence[int], op_graph: OpGraph | None = None,
                           keep_tensors: frozenset[str] = frozenset()) -> tuple[list[Group], list[str]]:
    """Split each layer node whose new workspace is large (see the module docstring) into one group
    per op, or, with ``op_graph``, per chain of ops that write into one buffer (:func:`in_place_chains`),
    at most :data:`SPLIT_MAX_PARTS` groups a node (runs of consecutive ones beyond); also the names of
    the split groups."""
    from checkmate.solvers import checkpoint_all_peak

    activations = checkpoint_all_peak(graph) - graph.fixed_mem
    split: set[int] = set()
    for node, group in enumerate(order):
        mem = int(graph.mem[node])
        if len(groups[group].ops) > 1 and workspace[node] > mem \
                and new_workspace(groups[group].ops, infos, mem) >= max(mem + 1, WORKSPACE_SPLIT_FRACTION * activations):
            split.add(group)
    if not split:
        return groups, []
    out = _with_parts(groups, {k: _runs(in_place_chains(groups[k].ops, infos, op_graph, keep_tensors)
                                        if op_graph is not None else [[i] for i in sorted(groups[k].ops)],
                                        infos=infos, op_graph=op_graph)
                               for k in split}, infos)
    if op_graph is not None:
        # a chain takes in the ops between its members in the layer's order; an op outside the chain
        # that reads one member and feeds a later one would make two parts depend on each other
        out = merge_cycles(out, op_graph)
    return out, sorted(groups[k].name for k in split)


def split_large_working_sets(groups: list[Group], infos: Sequence[OpInfo], graph: Graph, order: Sequence[int],
                             op_graph: OpGraph, keep_tensors: frozenset[str] = frozenset()
                             ) -> tuple[list[Group], list[str]]:
    """Split each node that reads much of the activations where its ops each read little (see
    :data:`WORKING_SET_SPLIT_FRACTION`) as :func:`split_large_workspaces` splits a large workspace;
    also the names of the split groups."""
    from checkmate.solvers import checkpoint_all_peak

    activations = checkpoint_all_peak(graph) - graph.fixed_mem
    split: set[int] = set()
    for node, group in enumerate(order):
        ops = groups[group].ops
        if len(ops) < 2:
            continue
        reads = int(graph.mem[node]) + int(sum(int(graph.mem[d]) for d in graph.deps[node]))
        if reads >= WORKING_SET_SPLIT_FRACTION * activations \
                and WORKING_SET_SPLIT_RATIO * _largest_op_working_set(ops, infos, op_graph) <= reads:
            split.add(group)
    if not split:
        return groups, []
    out = _with_parts(groups, {k: _runs(in_place_chains(groups[k].ops, infos, op_graph, keep_tensors),
                                        infos=infos, op_graph=op_graph) for k in split}, infos)
    return merge_cycles(out, op_graph), sorted(groups[k].name for k in split)


def _largest_op_working_set(ops: Sequence[int], infos: Sequence[OpInfo], op_graph: OpGraph) -> int:
    """The most bytes one of ``ops`` reads and writes: its distinct inputs and its outputs."""
    largest = 0
    for i in ops:
        read = {(p, t.value_index) for p, t in zip(op_graph.inputs[i], infos[i].op.inputs)}
        largest = max(largest, infos[i].bytes + sum(infos[p].out_bytes[k] for p, k in read if infos[p].out_bytes))
    return largest


def split_large_outputs(groups: list[Group], infos: Sequence[OpInfo], graph: Graph, order: Sequence[int],
                        step_outputs: Sequence[str] = ()) -> tuple[list[Group], list[str]]:
    """Split into one group per op each forward node that is a step output through small tensors only
    (``step_outputs``: the loss, the predictions) while its value is large (see
    :data:`OUTPUT_SPLIT_RATIO`): the loss layer's node holds the loss scalar and the cross-entropy's
    activation-sized gradient, and as an output all of it would stay resident to the end of the step,
    where TF frees the gradient once the backward has read it. Also the names of the split groups."""
    from checkmate.solvers import checkpoint_all_peak

    activations = checkpoint_all_peak(graph) - graph.fixed_mem
    outputs: dict[str, int] = {}
    for info in infos:
        for k, t in enumerate(info.op.outputs):
            if t.name in step_outputs:
                outputs[info.op.name] = outputs.get(info.op.name, 0) + info.out_bytes[k]
    split: set[int] = set()
    for node, group in enumerate(order):
        g = groups[group]
        if g.backward or not g.recomputable or len(g.ops) < 2 or not graph.output[node]:
            continue
        mem = int(graph.mem[node])
        output_bytes = sum(outputs.get(infos[i].op.name, 0) for i in g.ops)
        if mem >= OUTPUT_SPLIT_RATIO * max(output_bytes, 1) and mem >= OUTPUT_SPLIT_FRACTION * activations:
            split.add(group)
    if not split:
        return groups, []
    out = _with_parts(groups, {k: [[i] for i in sorted(groups[k].ops)] for k in split}, infos)
    return out, sorted(groups[k].name for k in split)


def split_composite_layers(groups: list[Group], infos: Sequence[OpInfo], op_graph: OpGraph,
                           composites: Mapping[str, int], keep_tensors: frozenset[str] = frozenset(),
                           max_nodes: int | None = None, activation_layers: frozenset[str] = frozenset()
                           ) -> tuple[list[Group], list[str]]:
    """level="auto": split the layer nodes inside composite layers (a nested model, a transformer block,
    an attention layer) into one group per chain of ops that write into one buffer
    (:func:`in_place_chains`), while the graph stays within ``max_nodes`` (default
    :data:`AUTO_OP_NODE_LIMIT`) nodes; also the names of the split groups.

    Inside a transformer block a layer node (a LayerNorm, an MLP's dense layer with its activation)
    holds temporaries the plan cannot free separately and offers the solver one choice where an op
    graph offers several cheap ones (recompute the activation, keep the matmul). Layers are split
    largest first (by the bytes their ops produce), so that a graph too large to split whole gets the
    finer nodes where the memory is.

    The forward nodes of the layers in ``activation_layers`` (layers anywhere whose own ``activation``
    is not linear: a Dense with activation="gelu") are split the same way: the matmul's output and
    the activation's temporaries (erf's, a sigmoid's) become separate values, so that a plan can keep
    the one and recompute the others cheaply, as ``keras.RematScope(mode="activations")`` does. An
    activation that runs in place (ReLU after BiasAdd) makes one chain and leaves its node whole."""
    limit = AUTO_OP_NODE_LIMIT if max_nodes is None else max_nodes
    prefixes = tuple(c + "/" for c in composites)
    if not prefixes and not activation_layers:
        return groups, []
    candidates = []
    for k, g in enumerate(groups):
        if len(g.ops) < 2 or not g.layer:
            continue
        inside = bool(prefixes) and g.layer.startswith(prefixes)
        if not inside and not (g.layer in activation_layers and not g.backward):
            continue
        parts = in_place_chains(g.ops, infos, op_graph, keep_tensors)
        if not inside and sum(1 for p in parts if any(infos[i].op.type not in _VIEW_OPS for i in p)) < 2:
            continue    # one buffer besides views of the layer's input (a Dense's Reshape): nothing to free
        if len(parts) > 1:
            candidates.append((sum(infos[i].bytes for i in g.ops), k, parts))
    count = len(groups)
    split: dict[int, list[list[int]]] = {}
    for _, k, parts in sorted(candidates, key=lambda c: (-c[0], c[1])):
        if count + len(parts) - 1 > limit:
            continue
        split[k] = parts
        count += len(parts) - 1
    if not split:
        return groups, []
    out = _with_parts(groups, split, infos)
    # a chain takes in the ops between its members; an op outside it that reads one member and feeds
    # a later one would make two parts depend on each other
    return merge_cycles(out, op_graph), sorted(groups[k].name for k in split)
