"""Keras model -> traced training step -> the solver's :class:`~checkmate.graph.Graph` (DESIGN §1, §6).

:func:`lower` traces one training step, ``(x, y) -> (loss, *grads)``, as a ``tf.function`` with
fixed-batch ``TensorSpec``\\ s, so that every tensor has a static shape, and classifies every op of the
resulting FuncGraph:

* **static** ops run once and are never recomputed; their outputs are not activations. They are the
  placeholders (batch, labels, captured variable handles), constants, and every stateless op whose
  data *and control* inputs are all static (shape arithmetic, reads of variables the step never
  assigns and arithmetic on them). The final ``Identity`` ops of the function's outputs and the
  ``NoOp`` that collects its side effects are static too ("terminal": created by ``tf.function``
  after the step returns). Reads of unassigned variables are static even though TF marks
  ``ReadVariableOp`` stateful: re-reading an unchanged variable is harmless.
* every other op belongs to exactly one graph **node**. Its data outputs are activations.
* **dead** ops, which no output or side effect depends on (Conv2D's gradient computes the gradient
  w.r.t. the batch although nothing uses it), are in no node: TF prunes them when it instantiates the
  function. They are listed in ``metadata["dead_ops"]``.

Forward/backward: ops created while ``tape.gradient`` runs are backward, the others forward. This is
a reachability split in the sense that matters: no forward op depends on a backward op (checked), and
every op on the path from the gradient seed to the gradients is backward. A pure "descendant of the
seed" rule would call forward the ops that the gradient code adds on forward values only (the ``Neg``
of the loss sum in ``div_no_nan``'s gradient, BN's recomputed ``x - mean``), although they run, and
are only needed, in the backward pass.

Recomputability: a node is ``recomputable=False`` when one of its ops reads a variable the step
assigns (the copy would read the updated value), is stateful (assigns, stateful random ops, anything
TF registers as stateful other than reads of unassigned variables), or is an opaque call/loop.

**Op level** (``level="op"``): one node per op that produces data, plus one node per side-effecting
op without outputs (``AssignVariableOp``: ``mem = 0``, never recomputable), so that it runs exactly
once, in order. A multi-output op is one node whose ``mem`` is the sum of the bytes of *all* its
outputs (each output is allocated when the op runs, whether or not it is used later).
``mem`` is the static size of the outputs, ``num_elements * dtype.size``. The nodes producing the
loss and the parameter gradients are the step's outputs. ``gradient_nodes`` has no effect at op level:
its accounting is already exact.

**Layer level** (``level="layer"``, the paper's granularity): the ops of each top-level Keras layer
call form one forward node, and the gradient ops of that layer one backward node (the loss function
is a layer of its own, named ``loss``). Ops are attributed to layers by recording which ops each
layer call creates while tracing; gradient ops by the forward op whose name scope they carry; ops
left over (gradient sums ``AddN``, casts Keras inserts outside ``call``) by their consumers, else
their producers. A layer whose forward ops mix recomputable and non-recomputable ops (BatchNorm's
moving-average update, Dropout's seed variable) is split into a recomputable node and a
``<layer>:state`` node holding the non-recomputable ops (plus the stateless ops that only feed them),
so that the layer's activations stay recomputable. A layer node's ``mem`` is the bytes of the
tensors it produces that are used outside it (by other nodes, or as step outputs; in the compact
accounting parameter gradients excepted, see below); tensors consumed only inside the node, or
otherwise only by dead ops, are transient. Their extra peak while the node runs is reported per node
in ``metadata["workspace_bytes"]`` (so ``mem + workspace`` is the node's peak footprint on top of
``fixed_mem``). A view (``Reshape``, ``Squeeze``, ``ExpandDims``, ``Identity``, ...) of a tensor
of the same node shares that tensor's buffer in TF, so the two count once (the backward of a Dense
layer on 3-D input can pass both a gradient sum and a ``Reshape`` of it to other nodes), and a view
of the batch, which is resident in ``fixed_mem``, counts nothing (a Dense layer on 3-D input
reshapes its input). With gradient nodes, a layer node whose new transient tensors (not written in
place) outweigh its value and ``WORKSPACE_SPLIT_FRACTION`` of the activations is split into one node
per op (``<node>:<op type>``, listed in ``metadata["split_workspace_nodes"]``), so that the plan
counts them: the backward of multi-head attention.

Outputs and parameter gradients. The memory model keeps a node flagged ``output`` resident from its
computation to the end of the step (DESIGN §3), and a node's value is all of its ``mem``. At op level
this is exact: each gradient op is a node whose value is the gradient, and the nodes producing the loss
and the gradients are the outputs. At layer level a backward node mixes the parameter gradients
(``Conv2DBackpropFilter``, ``BiasAddGrad``: step outputs, small) with the activation gradient it
passes to the previous layer's backward node (``Conv2DBackpropInput``: large, dead once consumed).
Flagging such a node ``output`` would keep every activation gradient to the end of the step and make
every schedule peak at the end of the backward pass. The layer level offers two accountings.

*Compact* (``gradient_nodes=False``, the default; the paper's graph, one forward and one backward
node per layer):

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

*Gradient nodes* (``gradient_nodes=True``): a node's value is one block that lives until its last
consumer has run, so layers are split where one block would hold bytes TF has already freed
(measured against TF's allocation log):

* **parameter gradients** (``<layer>_grad:params``): step outputs, resident from the moment they are
  computed (DESIGN §3's ``output`` flag), computed once (not recomputable). The node holds the ops
  producing the layer's gradients plus the ops of the layer's backward that feed only them. The
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
once per computation of its node). What DESIGN §3 cannot express is not modelled: TF writes an
elementwise output into a dying input's buffer (ReLU, BiasAdd, ReluGrad), and an input a node reads
first dies before the node ends (a layer's output, read only by its ReluGrad); both make TF use less
than the plan.

The trade-off: the compact graph is what the paper solves and what the MILP handles on large
networks (VGG16 46 nodes, MobileNet ~210, ResNet50 ~390); it over-counts the gradients early in the
step and holds a layer's whole output where the backward reads only part of it, so a schedule's
measured peak can be below its prediction (by up to ~30% on the CNNs of experiments/execution.py).
Gradient nodes make the predicted step peak follow the measured one (within ~15% on the test
models), at ~1.65x the nodes; the MILP's time grows much faster than that (MobileNet's LP
relaxation: 6 s compact, 170 s with gradient nodes).
:func:`checkmate.tf2.compile` picks gradient nodes by default when the compact graph is small
(``gradient_nodes="auto"``: at most :data:`AUTO_GRADIENT_NODES_MAX_NODES` nodes).

``fixed_mem`` is the bytes of every variable the step captures plus the batch (features and labels):
always resident, never rematerializable; plus, in the compact layer-level accounting, the parameter
gradients, and otherwise any gradient that static ops compute (a constant zero gradient of a variable
the loss does not use), which no node holds. The first part is
``metadata["parameter_and_batch_bytes"]``; ``metadata["grad_bytes"]`` is the bytes of all parameter
gradients (at both levels and in both accountings); ``metadata["grad_bytes_in_fixed_mem"]`` says
whether ``fixed_mem`` includes them (compact layer level only) and ``metadata["gradient_nodes"]``
whether the graph has gradient nodes (always at op level).

Opaque constructs: a function call or loop op whose outputs have static shapes becomes a single
non-recomputable node, with a warning (its internal memory is not modelled). Tensors that cannot be
sized (variant tensors such as TensorLists of a ``While`` loop, unknown shapes, strings) raise
:class:`~checkmate.errors.UnsupportedOpError` naming the op.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import networkx as nx
import numpy as np
import tensorflow as tf

from checkmate.errors import InvalidArgumentError, UnsupportedOpError
from checkmate.graph import Graph, Node
from checkmate.tf2 import _compat
from checkmate.tf2.lowered import LoweredGraph

__all__ = ["lower", "trace_step", "LEVELS", "AUTO_GRADIENT_NODES_MAX_NODES"]

LEVELS = ("op", "layer")
COST_MODELS = ("flops", "profile")
# gradient_nodes="auto" splits the parameter gradients into nodes of their own when the compact layer
# graph has at most this many nodes. The split adds ~65% nodes and the MILP's time grows much faster:
# VGG16 (46 -> 75 nodes) and U-Net (64 -> 104) stay where the MILP is practical; MobileNet (208 -> 343)
# does not (its LP relaxation alone goes from 6 s to 170 s).
AUTO_GRADIENT_NODES_MAX_NODES = 120
# Layer-level name of the loss function's ops, and of model ops no layer call created.
LOSS_LAYER = "loss"
_UNATTRIBUTED = "model"

# Ops that read a resource without changing it: static when the resource is never written.
_RESOURCE_READ_TYPES = frozenset({
    "ReadVariableOp", "ResourceGather", "ResourceGatherNd", "VariableShape", "VarIsInitializedOp",
})
# Ops that create resource handles (sources of resource tensors).
_RESOURCE_SOURCE_TYPES = frozenset({"Placeholder", "VarHandleOp", "_Arg"})
# Ops whose body is a function or a loop: checkmate cannot split or size their internals.
_OPAQUE_TYPES = frozenset({
    "While", "StatelessWhile", "If", "StatelessIf", "Case", "StatelessCase", "PartitionedCall",
    "StatefulPartitionedCall", "RemoteCall", "For", "SymbolicGradient",
})
# Ops that pass their input resource handle through (used to find which variable an op touches).
_PASSTHROUGH_TYPES = frozenset({"Identity", "IdentityN"})


# ------------------------------------------------------------------------------------------ trace
@dataclass
class TracedStep:
    """The traced step and what was recorded while tracing it."""

    function: Any
    loss_tensor: str
    grad_tensors: tuple[str, ...]
    input_names: tuple[str, ...]
    label_names: tuple[str, ...]
    variables: tuple[Any, ...]
    model_start: int
    loss_start: int
    grad_start: int
    terminal_start: int
    # (layer name, first op index, end op index) of every call of a top-level layer
    layer_calls: list[tuple[str, int, int]] = field(default_factory=list)


def _as_specs(spec: Any, what: str) -> Any:
    """Normalise ``spec`` (a TensorSpec, a shape tuple, or a nest of them) and require static shapes."""
    def convert(s):
        if isinstance(s, tf.TensorSpec):
            out = s
        elif isinstance(s, (tuple, list)) and all(isinstance(d, (int, np.integer)) for d in s):
            out = tf.TensorSpec(tuple(int(d) for d in s), tf.float32)
        elif hasattr(s, "shape") and hasattr(s, "dtype"):
            out = tf.TensorSpec(s.shape, s.dtype)
        else:
            raise InvalidArgumentError(f"{what}: expected a tf.TensorSpec, got {s!r}")
        if not out.shape.is_fully_defined():
            raise InvalidArgumentError(
                f"{what} {out} must have a fixed shape, batch size included (e.g. TensorSpec((32, 224, 224, 3)))")
        return out

    if isinstance(spec, (tuple, list)) and spec and all(isinstance(d, (int, np.integer)) for d in spec):
        return convert(spec)
    return tf.nest.map_structure(convert, spec)


def _resolve_loss(loss: Any, model: Any = None) -> Callable:
    """A callable ``loss(y, pred)``: a callable or a Keras loss name as given; for a model with several
    outputs, a list of losses (one per output, ``None`` for an output without one) or a dict from
    output names to losses, whose scalar values are summed as in ``keras.Model.compile``."""
    if callable(loss):
        return loss
    if isinstance(loss, (list, tuple, dict)):
        return _per_output_loss(loss, model)
    try:
        import keras

        return keras.losses.get(loss)
    except (ValueError, TypeError) as exc:
        raise InvalidArgumentError(f"unknown loss {loss!r}: {exc}") from None


def _per_output_loss(losses: Any, model: Any) -> Callable:
    names = list(getattr(model, "output_names", None) or [])
    if isinstance(losses, dict):
        unknown = sorted(set(losses) - set(names))
        if unknown:
            raise InvalidArgumentError(f"loss names {unknown} are not outputs of the model (outputs: {names})")
        entries = [(names.index(key), key, fn) for key, fn in losses.items()]
    else:
        if names and len(losses) != len(names):
            raise InvalidArgumentError(f"{len(losses)} losses for a model with {len(names)} outputs {names}")
        entries = [(k, names[k] if k < len(names) else None, fn) for k, fn in enumerate(losses)]
    entries = [(k, key, _resolve_loss(fn)) for k, key, fn in entries if fn is not None]
    if not entries:
        raise InvalidArgumentError("every output's loss is None: there is nothing to differentiate")

    def pick(values: Any, index: int, key: str | None, what: str) -> Any:
        if isinstance(values, dict):
            if key not in values:
                raise InvalidArgumentError(f"{what} has no entry for output {key!r} (keys: {sorted(values)})")
            return values[key]
        if isinstance(values, (list, tuple)):
            return values[index]
        raise InvalidArgumentError(f"a loss per output needs {what} as a list or dict, one entry per output")

    def combined(y: Any, pred: Any) -> tf.Tensor:
        return tf.add_n([_scalar_loss(fn(pick(y, k, key, "the labels"), pick(pred, k, key, "the model's output")))
                         for k, key, fn in entries])

    return combined


def _scalar_loss(value: Any) -> tf.Tensor:
    value = tf.convert_to_tensor(value)
    if value.shape.rank != 0:
        value = tf.reduce_mean(value)
    return value


def training_loss(model: Any, loss: Any, y: Any, pred: Any) -> tf.Tensor:
    """The scalar that the lowered step differentiates: ``loss(y, pred)`` (its mean if it is not a
    scalar) plus the model's own losses (regularizers, ``add_loss``)."""
    value = _scalar_loss(_resolve_loss(loss, model)(y, pred))
    extra = list(getattr(model, "losses", []) or [])
    if extra:
        value = value + tf.add_n([tf.cast(e, value.dtype) for e in extra])
    return value


def trace_step(model: Any, loss: Any, input_spec: Any, label_spec: Any) -> TracedStep:
    """Trace ``(x, y) -> (loss, *grads)`` for ``model`` with fixed-shape specs, recording op ranges."""
    input_spec = _as_specs(input_spec, "input_spec")
    label_spec = _as_specs(label_spec, "label_spec")
    if not getattr(model, "built", True):
        # Calling the model creates its variables; build(shape) does not for a subclassed model without
        # a build() of its own. One sample in inference mode: no state (BatchNorm, dropout seed) moves.
        def one_sample(spec):
            shape = spec.shape.as_list()
            return tf.zeros(shape[:1] and [1] + shape[1:], spec.dtype)

        model(tf.nest.map_structure(one_sample, input_spec), training=False)
    variables = tuple(model.trainable_variables)
    if not variables:
        raise InvalidArgumentError("the model has no trainable variables: there is no gradient to lower")
    loss_fn = _resolve_loss(loss, model)
    marks: dict[str, Any] = {}
    calls: list[tuple[str, int, int]] = []

    def step(x, y):
        marks["model_start"] = _compat.current_graph_op_count()
        with tf.GradientTape() as tape:
            pred = model(x, training=True)
            marks["loss_start"] = _compat.current_graph_op_count()
            value = training_loss(model, loss_fn, y, pred)
        marks["grad_start"] = _compat.current_graph_op_count()
        grads = tape.gradient(value, list(variables))
        # A variable the loss does not use (an output head the loss ignores) gets a constant zero
        # gradient. Not through UnconnectedGradients.ZERO: TF 2.21 cannot build that zero for a Keras 3
        # variable, whose dtype is a string.
        grads = [tf.zeros(v.shape, tf.as_dtype(v.dtype)) if g is None else g for g, v in zip(grads, variables)]
        # Sparse gradients (embeddings) are densified so that the step returns one tensor per variable.
        grads = [tf.convert_to_tensor(g) for g in grads]
        marks["loss"] = value.name
        marks["grads"] = tuple(g.name for g in grads)
        marks["terminal_start"] = _compat.current_graph_op_count()
        return (value, *grads)

    with _watch_layer_calls(model, calls):
        function = tf.function(step).get_concrete_function(input_spec, label_spec)

    n_in = len(tf.nest.flatten(input_spec))
    n_lab = len(tf.nest.flatten(label_spec))
    flat_inputs = function.inputs[: n_in + n_lab]
    return TracedStep(
        function=function,
        loss_tensor=marks["loss"],
        grad_tensors=marks["grads"],
        input_names=tuple(t.op.name for t in flat_inputs[:n_in]),
        label_names=tuple(t.op.name for t in flat_inputs[n_in:]),
        variables=variables,
        model_start=marks["model_start"],
        loss_start=marks["loss_start"],
        grad_start=marks["grad_start"],
        terminal_start=marks["terminal_start"],
        layer_calls=calls,
    )


class _watch_layer_calls:
    """Record, while tracing, which ops each top-level layer call creates.

    Wraps the public ``call`` method of each top-level layer with an instance attribute (Keras 3
    invokes ``self.call``), and removes the wrappers on exit.
    """

    def __init__(self, model: Any, calls: list):
        self.model = model
        self.calls = calls
        self.layers: list = []

    def __enter__(self):
        for layer in getattr(self.model, "layers", []) or []:
            if "call" in vars(layer):
                continue
            original = layer.call

            def wrapped(*args, __original=original, __name=layer.name, **kwargs):
                start = _compat.current_graph_op_count()
                try:
                    return __original(*args, **kwargs)
                finally:
                    self.calls.append((__name, start, _compat.current_graph_op_count()))

            object.__setattr__(layer, "call", wrapped)
            self.layers.append(layer)
        return self

    def __exit__(self, *exc):
        for layer in self.layers:
            vars(layer).pop("call", None)
        return False


# ------------------------------------------------------------------------------------------ ops
def _tensor_bytes(t: tf.Tensor) -> int | None:
    """Static size of ``t`` in bytes, or None when it cannot be known (variant, unknown shape, string)."""
    dtype = t.dtype
    if dtype in (tf.variant, tf.resource, tf.string) or not t.shape.is_fully_defined():
        return None
    return int(t.shape.num_elements()) * int(dtype.size)


def _describe_unsizeable(t: tf.Tensor) -> str:
    if t.dtype == tf.variant:
        return f"output {t.name} is a variant tensor (a TensorList of a loop or similar)"
    if t.dtype == tf.resource:
        return f"output {t.name} is a resource handle"
    if t.dtype == tf.string:
        return f"output {t.name} is a string tensor"
    return f"output {t.name} has a dynamic shape {t.shape}"


@dataclass
class OpInfo:
    op: Any
    index: int
    static: bool
    backward: bool = False
    recomputable: bool = True
    opaque: bool = False
    bytes: int = 0
    out_bytes: tuple[int, ...] = ()
    dead: bool = False  # never runs: TF prunes it (static for the contract, listed in metadata)


def _resource_source(t: tf.Tensor) -> str:
    """Name of the op that created the resource ``t`` (following Identity pass-throughs)."""
    seen = 0
    while t.op.type in _PASSTHROUGH_TYPES and t.op.inputs and seen < 64:
        t = t.op.inputs[t.value_index if t.op.type == "IdentityN" else 0]
        seen += 1
    return t.op.name


def _is_opaque(op) -> bool:
    if op.type in _OPAQUE_TYPES:
        return True
    try:
        return any(op.node_def.attr[a].HasField("func") for a in op.node_def.attr)
    except Exception:  # noqa: BLE001 - unusual NodeDefs are simply not opaque
        return False


def classify_ops(traced: TracedStep) -> list[OpInfo]:
    """Classify every op of the traced step (static or not, backward, recomputable, bytes)."""
    graph = traced.function.graph
    ops = graph.get_operations()
    batch_ops = set(traced.input_names) | set(traced.label_names)

    # Resources written by the step: inputs of any stateful op that is not a pure read.
    written: set[str] = set()
    for op in ops:
        if op.type in _RESOURCE_READ_TYPES or op.type in _RESOURCE_SOURCE_TYPES:
            continue
        if not _compat.op_is_stateful(op):
            continue
        for t in op.inputs:
            if t.dtype == tf.resource:
                written.add(_resource_source(t))

    # Live ops: ancestors of the function's outputs and of its side-effect collector. TF prunes the
    # rest when it instantiates the function (e.g. the gradient of a first convolution w.r.t. the
    # batch, which Conv2D's gradient computes although nothing uses it).
    live: set[str] = set()
    stack = [op for op in ops[traced.terminal_start:]]
    while stack:
        op = stack.pop()
        if op.name in live:
            continue
        live.add(op.name)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)

    infos: list[OpInfo] = []
    by_name: dict[str, OpInfo] = {}
    for index, op in enumerate(ops):
        info = OpInfo(op=op, index=index, static=True)
        by_name[op.name] = info
        infos.append(info)
        if index >= traced.terminal_start:
            continue  # the function's output identities and side-effect collector
        if op.name not in live:
            info.dead = True
            continue
        if op.name in batch_ops or op.type in _RESOURCE_SOURCE_TYPES:
            continue
        depends = any(
            (t.op.name in batch_ops) or not by_name[t.op.name].static for t in op.inputs
        ) or any(not by_name[c.name].static for c in op.control_inputs)
        reads_written = (op.type in _RESOURCE_READ_TYPES
                         and any(t.dtype == tf.resource and _resource_source(t) in written for t in op.inputs))
        harmless_read = op.type in _RESOURCE_READ_TYPES and not reads_written
        stateful = _compat.op_is_stateful(op) and not harmless_read
        opaque = _is_opaque(op)
        if not (depends or reads_written or stateful):
            continue
        info.static = False
        info.opaque = opaque
        info.recomputable = not (reads_written or stateful or opaque)
        info.backward = index >= traced.grad_start
        sizes = []
        for t in op.outputs:
            size = _tensor_bytes(t)
            if size is None:
                kind = "an opaque function call or loop whose " if opaque else ""
                raise UnsupportedOpError(
                    f"cannot size op {op.name!r} ({op.type}): {kind}{_describe_unsizeable(t)}; "
                    + _unsizeable_hint(op, ops))
            sizes.append(size)
        info.out_bytes = tuple(sizes)
        info.bytes = int(sum(sizes))

    for info in infos:
        if info.static or info.backward:
            continue
        for t in info.op.inputs:
            src = by_name[t.op.name]
            if not src.static and src.backward:
                raise UnsupportedOpError(
                    f"op {info.op.name!r} ({info.op.type}) runs before the gradient but reads "
                    f"{t.name}, which the gradient computation produces")
    return infos


def _unsizeable_hint(op, ops) -> str:
    loops = [o for o in ops if o.type in ("While", "StatelessWhile")]
    if loops:
        return (f"the step contains the loop {loops[0].name!r} ({loops[0].type}), whose TensorList "
                "accumulators cannot be sized; loops (RNN layers) are not supported")
    return "checkmate needs every activation to have a static size (use fixed-shape input specs)"


def _warn_opaque(infos: Sequence[OpInfo], warn: list[str]) -> None:
    for info in infos:
        if info.opaque and not info.static:
            message = (f"op {info.op.name!r} ({info.op.type}) is an opaque call or loop: it becomes a single "
                       "non-recomputable node and its internal memory is not modelled")
            warn.append(message)
            warnings.warn(message, UserWarning, stacklevel=3)


# ------------------------------------------------------------------------------------------ grouping
@dataclass
class _Group:
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


def _op_groups(infos: Sequence[OpInfo]) -> list[_Group]:
    groups = []
    for info in infos:
        if info.static:
            continue
        groups.append(_Group(info.op.name, [info.index], info.backward, info.recomputable))
    return groups


def _layer_of_ops(traced: TracedStep, infos: Sequence[OpInfo]) -> dict[int, str]:
    """Attribute every non-static op to a layer name (the loss function counts as layer ``loss``)."""
    layer: dict[int, str] = {}
    # Forward: innermost recorded call containing the op (calls are appended on exit, so a call
    # nested in another is listed first; sorting by length picks the innermost).
    spans = sorted(traced.layer_calls, key=lambda c: c[2] - c[1])
    for info in infos:
        if info.static:
            continue
        i = info.index
        if i < traced.loss_start:
            for name, start, end in spans:
                if start <= i < end:
                    layer[i] = name
                    break
        elif i < traced.grad_start:
            layer[i] = LOSS_LAYER

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
        if info.static or i < traced.grad_start:
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
    by_name = {info.op.name: info for info in infos}
    consumers: dict[int, list[int]] = {}
    for info in infos:
        if info.static:
            continue
        for t in info.op.inputs:
            src = by_name[t.op.name]
            if not src.static:
                consumers.setdefault(src.index, []).append(info.index)
        for c in info.op.control_inputs:
            src = by_name[c.name]
            if not src.static:
                consumers.setdefault(src.index, []).append(info.index)
    for info in reversed(infos):
        i = info.index
        if info.static or i in layer:
            continue
        for j in sorted(consumers.get(i, ())):
            if infos[j].backward == info.backward and j in layer:
                layer[i] = layer[j]
                break
    for info in infos:
        i = info.index
        if info.static or i in layer:
            continue
        producers = [by_name[t.op.name].index for t in info.op.inputs] + \
                    [by_name[c.name].index for c in info.op.control_inputs]
        for j in sorted(producers, reverse=True):
            if j in layer and infos[j].backward == info.backward:
                layer[i] = layer[j]
                break
        else:
            layer[i] = LOSS_LAYER if info.backward or i >= traced.loss_start else _UNATTRIBUTED
    return layer


def _span_of(i: int, spans, traced) -> str | None:
    for name, start, end in spans:
        if start <= i < end:
            return name
    if traced.loss_start <= i < traced.grad_start:
        return LOSS_LAYER
    return None


def _split_by_recomputability(ops: list[int], infos: Sequence[OpInfo]) -> list[tuple[list[int], bool]]:
    """Split one layer's ops into parts that are each all-recomputable or not, with no cycle between them.

    Stateless ops that only feed non-recomputable ops (BatchNorm's moving-average arithmetic, Dropout's
    seed increment) join them. Then each op gets the smallest rank >= its in-layer inputs' ranks whose
    parity encodes its kind (even: recomputable); ops of equal rank form a part, and parts of the same
    kind are merged whenever that keeps the parts acyclic.
    """
    recomputable = {i: infos[i].recomputable for i in ops}
    if all(recomputable.values()) or not any(recomputable.values()):
        return [(list(ops), all(recomputable.values()))]
    by_name = {infos[i].op.name: i for i in ops}
    inside_inputs: dict[int, list[int]] = {}
    users: dict[int, list[int]] = {i: [] for i in ops}
    for i in ops:
        op = infos[i].op
        srcs = [by_name[t.op.name] for t in op.inputs if t.op.name in by_name]
        srcs += [by_name[c.name] for c in op.control_inputs if c.name in by_name]
        inside_inputs[i] = srcs
        for s in srcs:
            users[s].append(i)
    # Absorb state-only feeders (reverse topological order so chains are absorbed whole).
    outside_users = _outside_users(ops, infos)
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


def _outside_users(ops: list[int], infos: Sequence[OpInfo]) -> dict[int, bool]:
    """Whether each op of ``ops`` has a consumer outside ``ops``."""
    members = {infos[i].op.name for i in ops}
    result: dict[int, bool] = {}
    for i in ops:
        result[i] = any(c.name not in members for t in infos[i].op.outputs for c in t.consumers())
    return result


def _layer_groups(traced: TracedStep, infos: Sequence[OpInfo]) -> list[_Group]:
    """One forward and one backward group per layer call (plus ``:state`` parts): the compact graph."""
    layer = _layer_of_ops(traced, infos)
    buckets: dict[tuple[str, bool], list[int]] = {}
    for info in infos:
        if not info.static:
            buckets.setdefault((layer[info.index], info.backward), []).append(info.index)
    groups: list[_Group] = []
    for (name, backward), ops in buckets.items():
        base = f"{name}_grad" if backward else name
        parts = _split_by_recomputability(ops, infos)
        seen_rec = 0
        for part_ops, rec in parts:
            if rec:
                seen_rec += 1
                label = base if seen_rec == 1 else f"{base}:{seen_rec}"
            else:
                label = f"{base}:state"
            # A part is recomputable only if every op in it is (absorbed feeders inherit the part's flag).
            rec = rec and all(infos[i].recomputable for i in part_ops)
            groups.append(_Group(label, part_ops, backward, rec, layer=name))
    return groups


def _gradient_node_groups(groups: list[_Group], infos: Sequence[OpInfo], traced: TracedStep) -> list[_Group]:
    """The compact layer groups with the gradient-node splits (``:saved``, ``:params``)."""
    groups = _split_saved_for_backward(groups, infos, traced)
    return _split_parameter_gradients(groups, infos, traced.grad_tensors)


def _split_saved_for_backward(groups: list[_Group], infos: Sequence[OpInfo], traced: TracedStep) -> list[_Group]:
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
    output_tensors = {traced.loss_tensor, *traced.grad_tensors}
    dead_ops = frozenset(info.op.name for info in infos if info.dead)
    backward_ops = {info.op.name for info in infos if info.backward and not info.static}
    result: list[_Group] = []
    for g in groups:
        if g.backward or not g.recomputable or len(g.ops) < 2:
            result.append(g)
            continue
        member = {infos[i].op.name: i for i in g.ops}
        saved = {i for i in g.ops
                 if any(c.name in backward_ops for t in infos[i].op.outputs for c in t.consumers())}
        if not saved:
            result.append(g)
            continue
        for i in reversed(g.ops):  # creation order is topological: ancestors come earlier
            if i in saved:
                op = infos[i].op
                for src in [t.op.name for t in op.inputs] + [c.name for c in op.control_inputs]:
                    if src in member:
                        saved.add(member[src])
        rest = [i for i in g.ops if i not in saved]
        part = sorted(saved)
        if not rest or (_node_mem(part, infos, "layer", output_tensors, dead_ops)[0]
                        >= _node_mem(g.ops, infos, "layer", output_tensors, dead_ops)[0]):
            result.append(g)
            continue
        first = g.sort_key[0]
        result.append(_Group(f"{g.name}:saved", part, False, True, layer=g.layer, order=(first, 0)))
        result.append(_Group(g.name, rest, False, True, layer=g.layer, order=(first, 1)))
    return result


def _split_parameter_gradients(groups: list[_Group], infos: Sequence[OpInfo],
                               grad_tensors: Sequence[str]) -> list[_Group]:
    """Give the parameter gradients of each backward group a node of their own (``<name>:params``).

    The gradients are step outputs, resident from the moment they are computed (DESIGN §3), while
    the rest of a backward layer (the gradient it passes on) dies once consumed. ``:params`` holds
    the ops producing gradients plus the ops of the group that feed only them. The other ops are
    split by whether ``:params`` needs them: those it needs run before it (``<name>``), the others
    after it (``<name>:2``). In this order the tensors crossing between the parts (the gradient of
    the layer's pre-activation, read by both the weight gradient and the input gradient) die where
    they die in the unsplit layer, instead of riding along in a node's value until its last user.
    A group whose ops all feed only gradients becomes a single ``:params`` node.
    """
    grad_ops = {t.rsplit(":", 1)[0] for t in grad_tensors}
    index_of = {info.op.name: info.index for info in infos}
    users: dict[int, set[int]] = {}
    for info in infos:
        if info.static or info.dead:
            continue
        for src in [t.op.name for t in info.op.inputs] + [c.name for c in info.op.control_inputs]:
            j = index_of[src]
            if not infos[j].static:
                users.setdefault(j, set()).add(info.index)
    result: list[_Group] = []
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
        needed = _reachable(params, infos, index_of, users, upward=True)
        fed = _reachable(params, infos, index_of, users, upward=False)
        params |= {i for i in g.ops if i in needed and i in fed}
        rest = [i for i in g.ops if i not in params]
        before = [i for i in rest if i in needed]
        after = [i for i in rest if i not in needed]
        first = g.sort_key[0]
        named = [p for p in (before, after) if p]
        for k, part in enumerate(named):
            result.append(_Group(g.name if k == 0 else f"{g.name}:{k + 1}", part, True, g.recomputable,
                                 layer=g.layer, order=(first, 0 if part is before else 2)))
        result.append(_Group(f"{g.name}:params", sorted(params), True, False, layer=g.layer, order=(first, 1)))
    return result


def _reachable(start: set[int], infos: Sequence[OpInfo], index_of: Mapping[str, int],
               users: Mapping[int, set[int]], *, upward: bool) -> set[int]:
    """Non-static ops from which an op of ``start`` is reachable (``upward``: its ancestors) or
    which are reachable from one (its descendants), through data and control edges."""
    seen: set[int] = set()
    stack = list(start)
    while stack:
        i = stack.pop()
        if upward:
            op = infos[i].op
            nxt = [index_of[n] for n in [t.op.name for t in op.inputs] + [c.name for c in op.control_inputs]]
        else:
            nxt = list(users.get(i, ()))
        for j in nxt:
            if j not in seen and not infos[j].static:
                seen.add(j)
                stack.append(j)
    return seen


def _group_dependencies(groups: list[_Group], infos: Sequence[OpInfo]) -> nx.DiGraph:
    """Group k depends on group d when one of k's ops reads (data or control) an op of d."""
    owner = {i: k for k, g in enumerate(groups) for i in g.ops}
    by_name = {info.op.name: info.index for info in infos}
    dg = nx.DiGraph()
    dg.add_nodes_from(range(len(groups)))
    for k, g in enumerate(groups):
        for i in g.ops:
            op = infos[i].op
            for src in [t.op.name for t in op.inputs] + [c.name for c in op.control_inputs]:
                j = by_name[src]
                if j in owner and owner[j] != k:
                    dg.add_edge(owner[j], k)
    return dg


def _merge_cycles(groups: list[_Group], infos: Sequence[OpInfo]) -> list[_Group]:
    """Merge groups that depend on each other in a cycle (possible only when attribution heuristics
    interleave two layers); a merged group is non-recomputable if any part was."""
    dg = _group_dependencies(groups, infos)
    if nx.is_directed_acyclic_graph(dg):
        return groups
    merged = []
    for scc in nx.strongly_connected_components(dg):
        members = sorted(scc, key=lambda k: min(groups[k].ops))
        if len(members) == 1:
            merged.append(groups[members[0]])
            continue
        ops = sorted(i for k in members for i in groups[k].ops)
        merged.append(_Group("+".join(groups[k].name for k in members), ops,
                             any(groups[k].backward for k in members),
                             all(groups[k].recomputable for k in members), layer=groups[members[0]].layer))
    return merged


# ------------------------------------------------------------------------------------------ graph
# Ops whose output is their first input's buffer under another shape (TF forwards the buffer).
_VIEW_OPS = frozenset({"Reshape", "Squeeze", "ExpandDims", "Identity", "StopGradient", "PreventGradient",
                       "EnsureShape"})


def _node_mem(group_ops: list[int], infos: Sequence[OpInfo], level: str, output_tensors: set[str],
              dead_ops: frozenset[str] = frozenset(), resident_tensors: frozenset[str] = frozenset()
              ) -> tuple[int, int]:
    """(mem, workspace) of a node: see the module docstring for the op- and layer-level rules.

    ``output_tensors`` are function outputs the node's value must include; ``resident_tensors`` are
    function outputs accounted in ``fixed_mem`` (compact layer level: the parameter gradients), which
    count neither in the node's value nor in its workspace, whoever consumes them. Consumers in
    ``dead_ops`` never run (TF prunes them), so they do not make a tensor leave the node.
    """
    if level == "op":
        return sum(infos[i].bytes for i in group_ops), 0
    members = {infos[i].op.name for i in group_ops}
    position = {infos[i].op.name: p for p, i in enumerate(group_ops)}
    size = {t.name: infos[i].out_bytes[k] for i in group_ops for k, t in enumerate(infos[i].op.outputs)}
    # A view of a tensor of this node is the same buffer: count the buffer once, at its producer, alive
    # until the last use of any of its views. A view of the batch costs nothing.
    buffer: dict[str, str] = {}
    for i in group_ops:
        op = infos[i].op
        for t in op.outputs:
            source = op.inputs[0] if op.type in _VIEW_OPS and len(op.inputs) > 0 else None
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
        for t in infos[i].op.outputs:
            if t.name in resident_tensors:
                continue
            root = buffer[t.name]
            users = [c.name for c in t.consumers() if c.name not in dead_ops]
            if t.name in output_tensors or any(u not in members for u in users):
                keep.add(root)
            inside = [position[u] for u in users if u in members]
            last_use[root] = max(last_use.get(root, 0), *inside, position[infos[i].op.name])
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


def _build(traced: TracedStep, infos: Sequence[OpInfo], groups: list[_Group], level: str,
           name: str, fixed: int, grads_resident: bool
           ) -> tuple[Graph, tuple[tuple[str, ...], ...], dict[str, int], tuple[int, ...], list[int]]:
    """The graph of ``groups``; also its node ops, each op's node, each node's workspace and, per node,
    the index of its group."""
    dg = _group_dependencies(groups, infos)
    first = [g.sort_key for g in groups]
    order = list(nx.lexicographical_topological_sort(dg, key=first.__getitem__))
    new_id = {old: new for new, old in enumerate(order)}

    if grads_resident:
        # Compact layer level: the parameter gradients are in fixed_mem, so a layer's backward node is
        # an output only through the loss, and its value is what it passes to other nodes.
        output_tensors = {traced.loss_tensor}
        resident = frozenset(traced.grad_tensors)
    else:
        # The loss and the parameter gradients are step outputs: resident from their computation on
        # (op level: the gradient ops; layer level: the :params nodes, see _split_parameter_gradients).
        output_tensors = {traced.loss_tensor, *traced.grad_tensors}
        resident = frozenset()
    output_ops = {t.rsplit(":", 1)[0] for t in output_tensors}
    dead_ops = frozenset(info.op.name for info in infos if info.dead)
    nodes, node_ops, workspace = [], [], []
    used_names: dict[str, int] = {}
    for new, old in enumerate(order):
        g = groups[old]
        mem, ws = _node_mem(g.ops, infos, level, output_tensors, dead_ops, resident)
        label = g.name
        if label in used_names:
            used_names[label] += 1
            label = f"{label}#{used_names[label]}"
        else:
            used_names[label] = 0
        nodes.append(Node(id=new, name=label, cost=1.0, mem=int(mem), backward=g.backward,
                          output=any(infos[i].op.name in output_ops for i in g.ops),
                          recomputable=g.recomputable))
        node_ops.append(tuple(infos[i].op.name for i in sorted(g.ops)))
        workspace.append(int(ws))
    edges = [(new_id[d], new_id[k]) for d, k in dg.edges]
    graph = Graph(nodes, edges, name=name, fixed_mem=fixed)
    assert graph.source_ids == tuple(range(graph.n)), "lowering must emit nodes in a topological order"
    op_node = {op: nid for nid, ops in enumerate(node_ops) for op in ops}
    return graph, tuple(node_ops), op_node, tuple(workspace), order


# In a graph with gradient nodes, a layer node whose new transient tensors outweigh both its value and
# this share of the activation part of the checkpoint-all peak is split into one node per op, so that
# the plan counts those tensors. The backward of multi-head attention holds the gradients of its score
# tensors: 1.5 MiB on a transformer block whose activations peak at 4-6 MiB, and its measured peak was
# 1.25-1.49x the layer-level plan. Smaller workspaces are left in their layer node: the measured peaks
# of MLPs, CNNs and U-Nets follow their layer-level plans.
WORKSPACE_SPLIT_FRACTION = 0.1

# Elementwise kernels that TF runs in place, writing into an input of their output's size that dies
# with them (forward_input_or_allocate_output): their outputs are not new memory, so they do not make a
# node's workspace large enough to split (a ReluGrad in a convolution's backward, a GELU's backward).
_IN_PLACE_OPS = frozenset({
    "Abs", "Add", "AddN", "AddV2", "BiasAdd", "Cast", "Cos", "Div", "DivNoNan", "Elu", "EluGrad", "Erf", "Exp",
    "Identity", "LeakyRelu", "LeakyReluGrad", "Log", "Log1p", "Maximum", "Minimum", "Mul", "MulNoNan", "Neg",
    "Pow", "RealDiv", "Reciprocal", "ReciprocalGrad", "Relu", "Relu6", "Relu6Grad", "ReluGrad", "Rsqrt",
    "RsqrtGrad", "Select", "SelectV2", "Selu", "SeluGrad", "Sigmoid", "SigmoidGrad", "Sign", "Sin", "Softplus",
    "SoftplusGrad", "Softsign", "SoftsignGrad", "Sqrt", "SqrtGrad", "Square", "SquaredDifference", "Sub",
    "Tanh", "TanhGrad",
})


def _new_workspace(group: _Group, infos: Sequence[OpInfo], mem: int) -> int:
    """Bytes of the node's tensors that are neither passed on (``mem``) nor written in place: the sum
    of the outputs of its other ops, less ``mem``."""
    allocated = 0
    for i in group.ops:
        op = infos[i].op
        for k, t in enumerate(op.outputs):
            size = infos[i].out_bytes[k]
            in_place = op.type in _IN_PLACE_OPS and any(
                u.dtype == t.dtype and u.shape.num_elements() == t.shape.num_elements() for u in op.inputs)
            if not in_place:
                allocated += size
    return max(0, allocated - mem)


def _split_large_workspaces(groups: list[_Group], infos: Sequence[OpInfo], graph: Graph,
                            workspace: Sequence[int], order: Sequence[int]) -> tuple[list[_Group], list[str]]:
    from checkmate.solvers import checkpoint_all_peak

    activations = checkpoint_all_peak(graph) - graph.fixed_mem
    split: set[int] = set()
    for node, group in enumerate(order):
        mem = int(graph.mem[node])
        if len(groups[group].ops) > 1 and workspace[node] > mem \
                and _new_workspace(groups[group], infos, mem) >= max(mem + 1, WORKSPACE_SPLIT_FRACTION * activations):
            split.add(group)
    if not split:
        return groups, []
    out: list[_Group] = []
    for k, g in enumerate(groups):
        if k not in split:
            out.append(g)
            continue
        for p, i in enumerate(sorted(g.ops)):
            out.append(_Group(f"{g.name}:{infos[i].op.type}", [i], g.backward,
                              g.recomputable and infos[i].recomputable, g.layer, order=(*g.sort_key, p)))
    return out, sorted(groups[k].name for k in split)


def _fixed_bytes(model: Any, traced: TracedStep) -> int:
    total = 0
    for v in getattr(model, "variables", ()):
        total += int(np.prod(v.shape, dtype=np.int64)) * int(tf.as_dtype(v.dtype).size)
    graph = traced.function.graph
    for name in (*traced.input_names, *traced.label_names):
        t = graph.get_operation_by_name(name).outputs[0]
        total += _tensor_bytes(t) or 0
    return int(total)


def _gradient_bytes(traced: TracedStep, infos: Sequence[OpInfo], *, static_only: bool = False) -> int:
    """Bytes of the step's parameter gradients (each distinct gradient tensor once); with
    ``static_only``, of those computed by static ops (a variable the loss does not use gets a constant
    zero gradient), which no node holds."""
    graph = traced.function.graph
    static = {info.op.name for info in infos if info.static}
    tensors = [graph.get_tensor_by_name(t) for t in dict.fromkeys(traced.grad_tensors)]
    return int(sum(_tensor_bytes(t) or 0 for t in tensors if not static_only or t.op.name in static))


def _with_costs(graph: Graph, costs: Sequence[float]) -> Graph:
    nodes = [Node(nd.id, nd.name, float(c), nd.mem, nd.backward, nd.output, nd.recomputable)
             for nd, c in zip(graph.nodes, costs)]
    return Graph(nodes, graph.edges, name=graph.name, fixed_mem=graph.fixed_mem)


def lower(model: Any, loss: Any, input_spec: Any, label_spec: Any, level: str = "layer", *,
          gradient_nodes: bool | str = False, cost_model: str = "flops", name: str | None = None,
          profile_options: Mapping[str, Any] | None = None, progress: bool = True) -> LoweredGraph:
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
        ``<layer>:saved``: a closer memory prediction, ~1.65x the nodes. ``"auto"``: ``True`` when the
        compact graph has at most :data:`AUTO_GRADIENT_NODES_MAX_NODES` nodes. See the module
        docstring for the trade-off.
    cost_model:
        ``"flops"`` (deterministic analytic estimate) or ``"profile"`` (run time of each node on the
        current device, cached on disk; see :mod:`checkmate.tf2.profiling`).
    profile_options:
        Keyword arguments for :func:`checkmate.tf2.profiling.profile_nodes` (repeats, warmup, cache_dir).
    """
    if level not in LEVELS:
        raise InvalidArgumentError(f"unknown level {level!r}: expected one of {', '.join(LEVELS)}")
    if cost_model not in COST_MODELS:
        raise InvalidArgumentError(f"unknown cost model {cost_model!r}: expected one of {', '.join(COST_MODELS)}")
    if gradient_nodes not in (True, False, "auto"):
        raise InvalidArgumentError(f"gradient_nodes must be True, False or 'auto', not {gradient_nodes!r}")
    traced = trace_step(model, loss, input_spec, label_spec)
    infos = classify_ops(traced)
    warn: list[str] = []
    _warn_opaque(infos, warn)
    compact_nodes = None
    if level == "op":
        groups = _op_groups(infos)
        split = True  # op level is exact: every gradient op is an output node of its own
    else:
        compact = _layer_groups(traced, infos)
        groups = _merge_cycles(compact, infos)
        compact_nodes = len(groups)
        split = (compact_nodes <= AUTO_GRADIENT_NODES_MAX_NODES) if gradient_nodes == "auto" else bool(gradient_nodes)
        if split:
            groups = _merge_cycles(_gradient_node_groups(compact, infos, traced), infos)
    if not groups:
        raise UnsupportedOpError("the training step has no op that depends on the batch")
    label = name or f"{getattr(model, 'name', 'model')}-{level}"
    param_batch = _fixed_bytes(model, traced)
    grad_bytes = _gradient_bytes(traced, infos)
    grads_resident = not split
    fixed = param_batch + (grad_bytes if grads_resident else _gradient_bytes(traced, infos, static_only=True))
    graph, node_ops, op_node, workspace, order = _build(traced, infos, groups, level, label, fixed, grads_resident)
    split_nodes: list[str] = []
    if level == "layer" and split:   # the compact graph keeps the papers' one node per layer
        groups, split_nodes = _split_large_workspaces(groups, infos, graph, workspace, order)
        if split_nodes:
            graph, node_ops, op_node, workspace, _ = _build(traced, infos, groups, level, label, fixed,
                                                            grads_resident)

    from checkmate.tf2 import profiling

    if cost_model == "flops":
        costs = [profiling.flops_cost(traced.function.graph, ops) for ops in node_ops]
        unit = "flops"
        profile_info = {}
    else:
        result = profiling.profile_nodes(traced.function, node_ops, traced.input_names, traced.label_names,
                                         progress=progress, **dict(profile_options or {}))
        costs = result.costs
        profile_info = {"profile_cache_hits": result.hits, "profile_cache_misses": result.misses,
                        "profile_cache": result.cache_path, "device": profiling.device_description()}
        unit = "us"
    graph = _with_costs(graph, costs)
    batch = [graph_tensor.shape[0] for graph_tensor in traced.function.inputs[: len(traced.input_names)]]
    metadata = {
        "batch_size": int(batch[0]) if batch and batch[0] is not None else None,
        "cost_model": cost_model,
        "cost_unit": unit,
        "level": level,
        "warnings": tuple(warn),
        "workspace_bytes": workspace,
        "static_ops": tuple(info.op.name for info in infos if info.static and not info.dead),
        "dead_ops": tuple(info.op.name for info in infos if info.dead),
        "parameter_and_batch_bytes": param_batch,
        # bytes of the parameter gradients: part of fixed_mem in the compact layer-level accounting,
        # else the values of the output nodes that compute them
        "grad_bytes": grad_bytes,
        "grad_bytes_in_fixed_mem": grads_resident,
        # whether the parameter gradients are output nodes (layer level: the :params/:saved splits)
        "gradient_nodes": split,
        # node count of the compact layer graph (None at op level): what "auto" decided on
        "compact_nodes": compact_nodes,
        # layer nodes split into one node per op for their workspace (WORKSPACE_SPLIT_FRACTION)
        "split_workspace_nodes": tuple(split_nodes),
        **profile_info,
    }
    return LoweredGraph(
        graph=graph,
        level=level,
        function=traced.function,
        node_ops=node_ops,
        op_node=op_node,
        input_names=traced.input_names,
        label_names=traced.label_names,
        loss_tensor=traced.loss_tensor,
        grad_tensors=traced.grad_tensors,
        variables=traced.variables,
        metadata=metadata,
    )

