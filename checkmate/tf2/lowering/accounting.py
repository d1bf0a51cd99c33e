"""Per-node memory: a node's value and workspace, and the step's fixed bytes (docs/design.md §3).

**Op level**: ``mem`` is the static size of the outputs, ``num_elements * dtype.size``. A multi-output
op is one node whose ``mem`` is the sum of the bytes of *all* its outputs (each output is allocated
when the op runs, whether or not it is used later). A side-effecting op without outputs
(``AssignVariableOp``) has ``mem = 0``.

**Layer level**: a node's ``mem`` is the bytes of the tensors it produces that are used outside it (by
other nodes, or as step outputs; in the compact accounting parameter gradients excepted, see below);
tensors consumed only inside the node, or otherwise only by dead ops, are transient. Their extra peak
while the node runs is reported per node in ``metadata["workspace_bytes"]`` (so ``mem + workspace``
is the node's peak footprint on top of ``fixed_mem``). A view (``Reshape``, ``Squeeze``,
``ExpandDims``, ``Identity``, ...) of a tensor of the same node shares that tensor's buffer in TF, so
the two count once (the backward of a Dense layer on 3-D input can pass both a gradient sum and a
``Reshape`` of it to other nodes), and a view of the batch, which is resident in ``fixed_mem``,
counts nothing (a Dense layer on 3-D input reshapes its input). A node's *new* workspace, the bytes
of its tensors that are neither passed on nor written in place by an elementwise kernel, decides the
workspace split of :mod:`checkmate.tf2.lowering.grouping`.

*Compact* accounting (``gradient_nodes=False``, the default; the paper's graph, one forward and one
backward node per layer):

* the parameter gradients are accounted as resident for the whole step, in ``fixed_mem``. This is
  conservative: a gradient is counted before it is produced, an over-count of at most the trainable
  parameters' size early in the step and of nothing at the end, where all of them are live anyway;
* a backward node's ``mem`` (and workspace) excludes the parameter gradients: it is only what the
  node passes to other nodes. A node whose only live outputs are parameter gradients (the first
  layer's, whose gradient w.r.t. the batch is dead) has ``mem == 0``; it still runs its ops, once, in
  the schedule's frontier stage;
* ``output`` is set only on the node producing the loss, the one step output that is not a parameter
  gradient. Its value (the loss and the tensors the loss gradient reads, ``batch x classes``) is kept
  to the end, a small over-count.

With gradient nodes (and at op level) the parameter gradients are the values of the output nodes
that compute them (see :mod:`checkmate.tf2.lowering.grouping`).

``fixed_mem`` is the bytes of every variable the step captures plus the batch (features and labels):
always resident, never rematerializable; plus, in the compact layer-level accounting, the parameter
gradients, and otherwise any gradient that static ops compute (a constant zero gradient of a variable
the loss does not use), which no node holds. The first part is
``metadata["parameter_and_batch_bytes"]``; ``metadata["grad_bytes"]`` is the bytes of all parameter
gradients (at both levels and in both accountings); ``metadata["grad_bytes_in_fixed_mem"]`` says
whether ``fixed_mem`` includes them (compact layer level only).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from checkmate.tf2.lowering.ops import OpGraph, OpInfo, tensor_bytes
from checkmate.tf2.lowering.trace import TracedStep

__all__ = ["node_mem", "new_workspace", "fixed_bytes", "gradient_bytes"]

# Ops whose output is their first input's buffer under another shape (TF forwards the buffer).
_VIEW_OPS = frozenset({"Reshape", "Squeeze", "ExpandDims", "Identity", "StopGradient", "PreventGradient",
                       "EnsureShape"})

# Elementwise kernels that TF runs in place, writing into an input of their output's size that dies
# with them (forward_input_or_allocate_output): their outputs are not new memory, so they do not make a
# node's workspace large enough to split (a ReluGrad in a convolution's backward, a GELU's backward).
_IN_PLACE_OPS = frozenset({
    "Abs", "Add", "AddN", "AddV2", "BiasAdd", "Cast", "Cos", "Div", "DivNoNan", "Elu", "EluGrad", "Erf", "Exp",
    "Identity", "IdentityN", "LeakyRelu", "LeakyReluGrad", "Log", "Log1p", "Maximum", "Minimum", "Mul", "MulNoNan", "Neg",
    "Pow", "RealDiv", "Reciprocal", "ReciprocalGrad", "Relu", "Relu6", "Relu6Grad", "ReluGrad", "Rsqrt",
    "RsqrtGrad", "Select", "SelectV2", "Selu", "SeluGrad", "Sigmoid", "SigmoidGrad", "Sign", "Sin", "Softplus",
    "SoftplusGrad", "Softsign", "SoftsignGrad", "Sqrt", "SqrtGrad", "Square", "SquaredDifference", "Sub",
    "Tanh", "TanhGrad",
})


def _view_source(op, k: int):
    """The input whose buffer output ``k`` of ``op`` is, for a view op (``None`` otherwise).
    ``IdentityN`` (what ``tf.custom_gradient`` wraps a function's outputs in) passes input k on as
    output k."""
    if op.type == "IdentityN":
        return op.inputs[k] if k < len(op.inputs) else None
    return op.inputs[0] if op.type in _VIEW_OPS and len(op.inputs) > 0 else None


def node_mem(group_ops: list[int], infos: Sequence[OpInfo], op_graph: OpGraph, level: str,
              output_tensors: set[str], resident_tensors: frozenset[str] = frozenset()) -> tuple[int, int]:
    """(mem, workspace) of a node: see the module docstring for the op- and layer-level rules.

    ``output_tensors`` are function outputs the node's value must include; ``resident_tensors`` are
    function outputs accounted in ``fixed_mem`` (compact layer level: the parameter gradients), which
    count neither in the node's value nor in its workspace, whoever consumes them. Dead consumers never
    run (TF prunes them), so they do not make a tensor leave the node.
    """
    if level == "op":
        return sum(infos[i].bytes for i in group_ops), 0
    members = set(group_ops)
    position = {i: p for p, i in enumerate(group_ops)}
    size = {t.name: infos[i].out_bytes[k] for i in group_ops for k, t in enumerate(infos[i].op.outputs)}
    # A view of a tensor of this node is the same buffer: count the buffer once, at its producer, alive
    # until the last use of any of its views. A view of the batch costs nothing.
    buffer: dict[str, str] = {}
    for i in group_ops:
        op = infos[i].op
        for k, t in enumerate(op.outputs):
            source = _view_source(op, k)
            if source is not None and source.op.type == "Placeholder":
                # a view of the batch, which is resident in fixed_mem
                buffer[t.name] = source.name
                size[source.name] = 0
            elif source is not None and source.name in buffer and size[source.name] == size[t.name]:
                buffer[t.name] = buffer[source.name]
            else:
                buffer[t.name] = t.name
    last_use: dict[str, int] = {}
    keep: set[str] = set()
    for i in group_ops:
        for t, consumers in zip(infos[i].op.outputs, op_graph.output_consumers[i]):
            if t.name in resident_tensors:
                continue
            root = buffer[t.name]
            users = [c for c in consumers if not infos[c].dead]
            if t.name in output_tensors or any(u not in members for u in users):
                keep.add(root)
            inside = [position[u] for u in users if u in members]
            last_use[root] = max(last_use.get(root, 0), *inside, position[i])
    external = sum(size[root] for root in keep)
    # Peak of the node's own tensors while it runs, freeing internal buffers after their last use.
    live: dict[str, int] = {}
    peak = 0
    for p, i in enumerate(group_ops):
        for t in infos[i].op.outputs:
            if t.name not in resident_tensors and buffer[t.name] == t.name:
                live[t.name] = size[t.name]
        peak = max(peak, sum(live.values()))
        for name in [n for n in live if n not in keep and last_use.get(n, p) <= p]:
            del live[name]
    return external, max(0, peak - external)


def new_workspace(group_ops: Sequence[int], infos: Sequence[OpInfo], mem: int) -> int:
    """Bytes of the node's tensors that are neither passed on (``mem``) nor written in place: the sum
    of the outputs of its other ops, less ``mem``."""
    allocated = 0
    for i in group_ops:
        op = infos[i].op
        for k, t in enumerate(op.outputs):
            size = infos[i].out_bytes[k]
            in_place = op.type in _IN_PLACE_OPS and any(
                u.dtype == t.dtype and u.shape.num_elements() == t.shape.num_elements() for u in op.inputs)
            if not in_place:
                allocated += size
    return max(0, allocated - mem)


def fixed_bytes(model: Any, traced: TracedStep) -> int:
    total = 0
    for v in getattr(model, "variables", ()):
        total += int(np.prod(v.shape, dtype=np.int64)) * int(tf.as_dtype(v.dtype).size)
    graph = traced.function.graph
    for name in (*traced.input_names, *traced.label_names):
        t = graph.get_operation_by_name(name).outputs[0]
        total += tensor_bytes(t) or 0
    return int(total)


def gradient_bytes(traced: TracedStep, infos: Sequence[OpInfo], *, static_only: bool = False) -> int:
    """Bytes of the step's parameter gradients (each distinct gradient tensor once); with
    ``static_only``, of those computed by static ops (a variable the loss does not use gets a constant
    zero gradient), which no node holds."""
    graph = traced.function.graph
    static = {info.op.name for info in infos if info.static}
    tensors = [graph.get_tensor_by_name(t) for t in dict.fromkeys(traced.gradient_outputs)]
    return int(sum(tensor_bytes(t) or 0 for t in tensors if not static_only or t.op.name in static))
