"""Keras model -> traced training step -> the solver's :class:`~checkmate.graph.Graph` (docs/design.md §1, §6).

:func:`lower` runs the lowering pipeline, one module per stage:

1. :mod:`~checkmate.tf2.lowering.trace`: trace one training step, ``(x, y) -> (loss, *grads)``, as a
   ``tf.function`` with fixed-batch specs, recording which ops each layer call creates;
2. :mod:`~checkmate.tf2.lowering.ops`: the step's op graph, built once, and the classification of its
   ops (static, dead, forward/backward, recomputable, bytes);
3. :mod:`~checkmate.tf2.lowering.grouping`: the non-static ops grouped into nodes (one per op, or one
   forward and one backward per layer, with the gradient-node and workspace splits);
4. :mod:`~checkmate.tf2.lowering.accounting`: each node's memory (value and workspace) and the fixed
   bytes;
5. :mod:`~checkmate.tf2.lowering.assembly`: the graph in a topological order, its costs, and the
   :class:`~checkmate.tf2.lowered.LoweredGraph`.

**Op level** (``level="op"``): one node per op that produces data, plus one node per side-effecting
op without outputs. The nodes producing the loss and the parameter gradients are the step's outputs.
``gradient_nodes`` has no effect at op level: its accounting is already exact.

**Layer level** (``level="layer"``, the paper's granularity): one forward and one backward node per
top-level Keras layer call (the loss function is a layer of its own, named ``loss``).

**Auto** (``level="auto"``, the default of :func:`checkmate.tf2.compile`): the layer level, looking
inside nested models and composite layers so that no node is a whole sub-network. Every layer call
is recorded at every depth, named by its path (``backbone/transformer_layer_0/self_attention/query``);
a layer that runs no other layer is a layer node (with the gradient-node splits), and an op that a
composite layer (a nested model, a KerasHub task's backbone, a transformer block, an attention
layer) runs outside its sublayers (attention scores and softmax, residual adds, a model's glue) is a
node of its own; layer nodes whose temporaries outweigh their output are split into op nodes as at
the layer level, and so is a forward node that is a step output through a small tensor but holds a large
one (the loss node, with the cross-entropy's gradient of the logits), so that only the loss stays
resident to the end of the step; the layer nodes inside composite layers are split into op nodes,
largest first, while the graph stays within ``AUTO_OP_NODE_LIMIT`` nodes
(:func:`~checkmate.tf2.lowering.grouping.split_composite_layers`), so that the plan sees a
transformer block's temporaries and gets its cheap choices (recompute an activation, keep a matmul). A node
that reads at least ``WORKING_SET_SPLIT_FRACTION`` of the activations at once while its ops each read
little (the backward of a recurrence unrolled in Python, which reads every step's saved values) is
split into one node per chain of ops (:func:`~checkmate.tf2.lowering.grouping.split_large_working_sets`). A model of plain layers gets exactly the layer-level graph (``level == "layer"``);
otherwise ``level == "mixed"`` and ``metadata["split_layers"]`` says what was split and why (one
line per layer; per composite layer, one line listing its layers split into op nodes).

Outputs and parameter gradients. The memory model keeps a node flagged ``output`` resident from its
computation to the end of the step (docs/design.md §3), and a node's value is all of its ``mem``. At
op level this is exact: each gradient op is a node whose value is the gradient, and the nodes
producing the loss and the gradients are the outputs. At layer level a backward node mixes the
parameter gradients (``Conv2DBackpropFilter``, ``BiasAddGrad``: step outputs, small) with the
activation gradient it passes to the previous layer's backward node (``Conv2DBackpropInput``: large,
dead once consumed). Flagging such a node ``output`` would keep every activation gradient to the end
of the step and make every schedule peak at the end of the backward pass. The layer level offers two
accountings: *compact* (``gradient_nodes=False``, the default; the paper's graph, the parameter
gradients resident in ``fixed_mem``: see :mod:`~checkmate.tf2.lowering.accounting`) and *gradient
nodes* (``gradient_nodes=True``: the parameter gradients in output nodes of their own and the part
of a layer its backward reads split off: see :mod:`~checkmate.tf2.lowering.grouping`).

The trade-off: the compact graph is what the paper solves and what the MILP handles on large
networks (VGG16 46 nodes, MobileNet ~210, ResNet50 ~390); it over-counts the gradients early in the
step and holds a layer's whole output where the backward reads only part of it, so a schedule's
measured peak can be below its prediction (by up to ~30% on the CNNs of experiments/execution.py).
Gradient nodes make the predicted step peak follow the measured one (within ~15% on the test
models), at ~1.65x the nodes; the MILP's time grows much faster than that (MobileNet's LP
relaxation: 6 s compact, 170 s with gradient nodes).
:func:`checkmate.tf2.compile` lowers with gradient nodes by default (the hierarchical strategy takes
the larger graphs); :func:`lower` lowers the compact graph unless asked.
``metadata["gradient_nodes"]`` says whether the graph has gradient nodes (always at op level).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Mapping, Sequence

from checkmate.errors import InvalidArgumentError, UnsupportedOpError
from checkmate.tf2.lowered import LoweredGraph, flat_names
from checkmate.tf2.lowering.accounting import fixed_bytes, gradient_bytes
from checkmate.tf2.lowering.assembly import build_graph, lowered_graph, node_costs, with_costs
from checkmate.tf2.lowering.grouping import (
    LOSS_LAYER,
    PREDICTION_LAYER,
    WORKSPACE_SPLIT_FRACTION,
    WORKING_SET_SPLIT_FRACTION,
    WORKING_SET_SPLIT_RATIO,
    AUTO_OP_NODE_LIMIT,
    composite_calls,
    gradient_node_groups,
    layer_groups,
    prediction_ops,
    merge_cycles,
    op_groups,
    split_large_workspaces,
    split_large_outputs,
    split_composite_layers,
    split_large_working_sets,
)
from checkmate.tf2.lowering.ops import OpGraph, OpInfo, classify_ops, warn_opaque
from checkmate.tf2.lowering.trace import TracedStep, trace_step, training_loss

__all__ = ["lower", "trace_step", "training_loss", "TracedStep", "classify_ops", "OpGraph", "OpInfo", "LEVELS",
           "COST_MODELS", "LOSS_LAYER", "PREDICTION_LAYER", "WORKSPACE_SPLIT_FRACTION"]

_log = logging.getLogger("checkmate.tf2.lowering")

LEVELS = ("auto", "op", "layer")
COST_MODELS = ("flops", "profile")


def lower(model: Any, loss: Any, input_spec: Any, label_spec: Any, level: str = "layer", *,
          gradient_nodes: bool = False, cost_model: str = "flops", name: str | None = None,
          profile_options: Mapping[str, Any] | None = None, progress: bool = True,
          optimizer: Any = None, predictions: bool = False, fused_batch_norm: bool = False) -> LoweredGraph:
    """Lower one training step of ``model`` to a :class:`LoweredGraph`.

    Parameters
    ----------
    model:
        A built Keras model (functional, sequential or subclassed; layer level needs ``model.layers``).
    loss:
        ``loss(y_true, y_pred)`` callable or a Keras loss name; a non-scalar result is averaged.
    input_spec, label_spec:
        ``tf.TensorSpec`` (or nests of them) with fixed shapes, batch dimension included.
    level:
        ``"layer"`` (one forward and one backward node per Keras layer) or ``"op"``.
    gradient_nodes:
        Layer level only (op level is exact either way). ``False``: the compact graph, parameter
        gradients in ``fixed_mem`` for the whole step. ``True``: parameter gradients in output nodes
        of their own (``<layer>_grad:params``) and the part of a layer its backward reads in
        ``<layer>:saved``: a closer memory prediction, ~1.65x the nodes. See the module docstring
        for the trade-off.
    cost_model:
        ``"flops"`` (deterministic analytic estimate) or ``"profile"`` (run time of each node on the
        current device, cached on disk; see :mod:`checkmate.tf2.profiling`).
    profile_options:
        Keyword arguments for :func:`checkmate.tf2.profiling.profile_nodes` (repeats, warmup, cache_dir).
    optimizer:
        The optimizer the step will apply the gradients with: a ``LossScaleOptimizer`` scales the
        differentiated loss (see :func:`~checkmate.tf2.lowering.trace.trace_step`).
    predictions:
        Also return the training forward pass's output from the step (after the gradients): the
        nodes producing it are outputs, resident to the end of the step like the loss.
    fused_batch_norm:
        Trace BatchNormalization layers (4-D, channels last, training mode) on TensorFlow's fused
        kernel, whose backward keeps no activation-sized temporaries where Keras' separate ops keep
        about three: smaller working sets, so smaller feasible budgets and larger batches. The
        results equal Keras' to floating-point rounding, not bit for bit; off by default. See
        :mod:`checkmate.tf2.lowering.batch_norm`.
    """
    if level not in LEVELS:
        raise InvalidArgumentError(f"unknown level {level!r}: expected one of {', '.join(LEVELS)}")
    if cost_model not in COST_MODELS:
        raise InvalidArgumentError(f"unknown cost model {cost_model!r}: expected one of {', '.join(COST_MODELS)}")
    if isinstance(gradient_nodes, str) or gradient_nodes not in (True, False):
        raise InvalidArgumentError(f"gradient_nodes must be True or False, not {gradient_nodes!r}")
    started = time.perf_counter()
    _log.info("lowering %s (%s level)", getattr(model, "name", "model"), level)
    traced = trace_step(model, loss, input_spec, label_spec, optimizer=optimizer, predictions=predictions,
                        fused_batch_norm=fused_batch_norm, nested=level == "auto")
    op_graph = OpGraph.of(traced)
    infos = classify_ops(traced, op_graph)
    warn: list[str] = []
    warn_opaque(infos, warn)
    compact_nodes = None
    composites: dict[str, int] = {}
    if level == "op":
        groups = op_groups(infos, prediction_ops(traced, infos))
        split = True  # op level is exact: every gradient op is an output node of its own
    else:
        composites = composite_calls(traced) if level == "auto" else {}
        compact = layer_groups(traced, infos, op_graph, composites)
        groups = merge_cycles(compact, op_graph)
        compact_nodes = len(groups)
        split = bool(gradient_nodes)
        if split:
            groups = merge_cycles(gradient_node_groups(compact, infos, op_graph, traced), op_graph)
    if not groups:
        raise UnsupportedOpError("the training step has no op that depends on the batch")
    split_layers = _split_reasons(traced, composites, [], groups) if level == "auto" else ()
    # what auto chose: the layer graph when no layer was looked into, else a mix of layer and op nodes
    chosen = level if level != "auto" else ("mixed" if split_layers else "layer")
    label = name or f"{getattr(model, 'name', 'model')}-{chosen}"
    param_batch = fixed_bytes(model, traced)
    grad_bytes = gradient_bytes(traced, infos)
    grads_resident = not split
    fixed = param_batch + (grad_bytes if grads_resident else gradient_bytes(traced, infos, static_only=True))
    # auto's nodes are layer nodes (or single ops, whose layer-level accounting is the op's)
    accounting_level = "op" if level == "op" else "layer"
    graph, node_ops, op_node, workspace, order = build_graph(traced, infos, op_graph, groups, accounting_level, label,
                                                             fixed, grads_resident)
    split_nodes: list[str] = []
    value_nodes: list[str] = []
    fine_nodes: list[str] = []
    read_nodes: list[str] = []
    if level != "op" and split:   # the compact graph keeps the papers' one node per layer
        # step outputs keep their own buffers: an in-place kernel never takes them over
        keep = frozenset({traced.loss_tensor, *traced.gradient_outputs, *flat_names(traced.pred_structure)})
        groups, split_nodes = split_large_workspaces(groups, infos, graph, workspace, order, op_graph, keep)
        if split_nodes:
            graph, node_ops, op_node, workspace, order = build_graph(traced, infos, op_graph, groups,
                                                                     accounting_level, label, fixed, grads_resident)
        if level == "auto":
            groups, fine_nodes = split_composite_layers(groups, infos, op_graph, composites, keep,
                                                        activation_layers=traced.activation_calls)
            if fine_nodes:
                graph, node_ops, op_node, workspace, order = build_graph(traced, infos, op_graph, groups,
                                                                         accounting_level, label, fixed,
                                                                         grads_resident)
            step_outputs = (traced.loss_tensor, *flat_names(traced.pred_structure))
            groups, value_nodes = split_large_outputs(groups, infos, graph, order, step_outputs)
            if value_nodes:
                graph, node_ops, op_node, workspace, order = build_graph(traced, infos, op_graph, groups,
                                                                         accounting_level, label, fixed,
                                                                         grads_resident)
            groups, read_nodes = split_large_working_sets(groups, infos, graph, order, op_graph, keep)
            if read_nodes:
                graph, node_ops, op_node, workspace, _ = build_graph(traced, infos, op_graph, groups,
                                                                     accounting_level, label, fixed, grads_resident)
    if cost_model == "profile":
        _log.info("profiling %d nodes", graph.n)
    costs, unit, profile_info = node_costs(traced, node_ops, cost_model, profile_options, progress)
    _log.info("lowered %s: %d nodes, %d edges in %.1f s", label, graph.n, len(graph.edges),
              time.perf_counter() - started)
    if level == "auto" and (split_nodes or value_nodes or fine_nodes or read_nodes):
        split_layers = _split_reasons(traced, composites, split_nodes, groups, value_nodes, fine_nodes, read_nodes)
        chosen = "mixed"
    return lowered_graph(traced, infos, with_costs(graph, costs), node_ops, op_node, level=chosen,
                         cost_model=cost_model, cost_unit=unit, warnings=warn, workspace=workspace,
                         parameter_and_batch_bytes=param_batch, grad_bytes=grad_bytes,
                         grads_resident=grads_resident, gradient_nodes=split, compact_nodes=compact_nodes,
                         split_workspace_nodes=split_nodes, profile_info=profile_info,
                         fused_batch_norm=bool(fused_batch_norm), split_layers=split_layers)


# A summary line names at most this many layers, then how many more there are.
SPLIT_LINE_NAMES = 8


def _layer_of(node: str) -> str:
    """The layer a node of a layer's forward or backward belongs to (``dense_grad:params`` -> ``dense``)."""
    name = node.split(":")[0]
    return name[:-len("_grad")] if name.endswith("_grad") else name


def _some(names: Sequence[str], what: str) -> str:
    """``names`` joined, the first :data:`SPLIT_LINE_NAMES` of them and how many more there are."""
    shown = ", ".join(names[:SPLIT_LINE_NAMES])
    rest = len(names) - SPLIT_LINE_NAMES
    return shown + (f" and {rest} more {what}(s)" if rest > 0 else "")


def _split_reasons(traced: TracedStep, composites: Mapping[str, int], split_nodes: list[str],
                   groups: list, value_nodes: Sequence[str] = (), fine_nodes: Sequence[str] = (),
                   read_nodes: Sequence[str] = ()) -> tuple[str, ...]:
    """What ``level="auto"`` split below one node per layer, and why, one line per layer."""
    recorded = {name for name, _, _ in traced.layer_calls}
    own_ops = dict.fromkeys(composites, 0)
    for g in groups:
        if g.backward or not g.layer or g.layer in recorded:
            continue
        owner = max((c for c in composites if g.layer.startswith(c + "/")), key=len, default=None)
        if owner is not None:
            own_ops[owner] += 1
    lines = [f"{name}: runs {composites[name]} layer call(s), each a node or split further"
             + (f"; its own {own_ops[name]} op(s) one node each" if own_ops[name] else "")
             for name in sorted(composites)]
    lines += [f"{name}: one node per op (its temporaries outweigh its output and "
              f"{WORKSPACE_SPLIT_FRACTION:.0%} of the activations)" for name in split_nodes]
    # the layer nodes split inside composite layers, one line per innermost composite layer
    inside: dict[str, list[str]] = {}
    for name in fine_nodes:
        owner = max((c for c in composites if name.startswith(c + "/")), key=len, default="")
        inside.setdefault(owner, []).append(name[len(owner) + 1:] if owner else name)
    activations = sorted({n.split(":")[0] for n in inside.pop("", [])})
    lines += [f"{owner}: {len(names)} layer node(s) inside it one node per op (finer choices and exact "
              f"temporaries for the plan, the graph within {AUTO_OP_NODE_LIMIT} nodes): "
              f"{_some(sorted(dict.fromkeys(_layer_of(n) for n in names)), 'layer')}"
              for owner, names in sorted(inside.items())]
    if activations:
        lines.append(f"{len(activations)} layer node(s) with a non-linear activation split at it (the "
                     f"activation's values recomputable without the layer's matmul or convolution): "
                     f"{_some(activations, 'layer node')}")
    lines += [f"{name}: one node per op (a step output through small tensors that holds a large one, which "
              "would stay resident to the end of the step)" for name in value_nodes]
    lines += [f"{name}: one node per chain of ops (it reads at least {WORKING_SET_SPLIT_FRACTION:.0%} of the "
              f"activations at once, its ops at most 1/{WORKING_SET_SPLIT_RATIO} of that each)" for name in read_nodes]
    return tuple(lines)
