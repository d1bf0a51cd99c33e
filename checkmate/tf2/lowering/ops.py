"""The traced step's ops: their graph, built once, and their classification (docs/design.md §1, §6).

:class:`OpGraph` holds the edges of the traced step's ops: name -> index, the producers of each op's
data and control inputs, the consumers of each output, and each op's users through data and control
edges. It is built once per traced step, and every later stage reads it instead of walking the ops'
inputs and ``control_inputs`` again.

:func:`classify_ops` classifies every op of the step's FuncGraph:

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

Recomputability: an op is not recomputable when it reads a variable the step assigns (the copy would
read the updated value), is stateful (assigns, stateful random ops, anything TF registers as stateful
other than reads of unassigned variables), or is a loop, or a call of a function that holds such an
op (:func:`_pure_call`); a node holding such an op is ``recomputable=False``.

Opaque constructs: a function call or loop op whose outputs have static shapes becomes a single
node, with a warning (its internal memory is not modelled); recomputable only where it is a call of a
function that only computes. A TensorList built
outside a loop (a ``tf.TensorArray`` written in a Python loop) is sized by the items it holds, a
list a ``While`` loop carries (``tf.map_fn``, ``keras.ops.map``, a Keras RNN layer's loop and their
gradient's accumulators) by what each trip of the loop body does to it, and the optionals an ``If`` op returns for
its gradient as the larger branch's (:func:`tensor_list_bytes`). Tensors that
cannot be sized (other variant tensors, such as the lists of a loop with no static bound, unknown
shapes, strings) raise :class:`~checkmate.errors.UnsupportedOpError` naming the op.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import tensorflow as tf

from checkmate.errors import UnsupportedOpError
from checkmate.tf2 import _compat
from checkmate.tf2.lowering.trace import TracedStep

__all__ = ["OpGraph", "OpInfo", "classify_ops", "tensor_bytes", "tensor_list_bytes", "warn_opaque"]

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
# Outputs whose shape TF leaves unknown because it depends on the device's kernel: the fused batch
# norm's third reserve space (empty on CPU, cuDNN's per-channel scratch on GPU). Sized as one value
# per channel, the size of the kernel's batch-mean output (output 1).
_KERNEL_SCRATCH_OUTPUTS = frozenset({("FusedBatchNormV3", 5), ("FusedBatchNormEx", 5)})
# Ops that pass their input resource handle through (used to find which variable an op touches).
_PASSTHROUGH_TYPES = frozenset({"Identity", "IdentityN"})


@dataclass(frozen=True)
class OpGraph:
    """The ops of a traced step in creation (topological) order, and their edges by op index.

    ``producers[i]`` lists the producers of op i's data inputs, in input order, then of its control
    inputs (a producer read twice is listed twice); ``users[i]`` the ops that read op i through a data
    edge or that have it as a control input (its control outputs), ascending, each once.
    """

    ops: tuple[Any, ...]
    index: Mapping[str, int]
    inputs: tuple[tuple[int, ...], ...]
    control_inputs: tuple[tuple[int, ...], ...]
    producers: tuple[tuple[int, ...], ...]
    # per op, per output: the ops reading that output (data edges)
    output_consumers: tuple[tuple[tuple[int, ...], ...], ...]
    users: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, traced: TracedStep) -> OpGraph:
        ops = tuple(traced.function.graph.get_operations())
        index = {op.name: i for i, op in enumerate(ops)}
        inputs = tuple(tuple(index[t.op.name] for t in op.inputs) for op in ops)
        control_inputs = tuple(tuple(index[c.name] for c in op.control_inputs) for op in ops)
        output_consumers: list[list[list[int]]] = [[[] for _ in op.outputs] for op in ops]
        users: list[set[int]] = [set() for _ in ops]
        for j, op in enumerate(ops):
            for t, i in zip(op.inputs, inputs[j]):
                output_consumers[i][t.value_index].append(j)
                users[i].add(j)
            for i in control_inputs[j]:
                users[i].add(j)
        return cls(
            ops=ops,
            index=index,
            inputs=inputs,
            control_inputs=control_inputs,
            producers=tuple(d + c for d, c in zip(inputs, control_inputs)),
            output_consumers=tuple(tuple(tuple(c) for c in per_op) for per_op in output_consumers),
            users=tuple(tuple(sorted(u)) for u in users),
        )


def tensor_bytes(t: tf.Tensor) -> int | None:
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
    pure_call: bool = False     # an opaque call that only computes (and reads variables): recomputable
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


_CALL_TYPES = frozenset({"PartitionedCall", "StatefulPartitionedCall"})


def _pure_call(op, seen: dict[str, bool] | None = None) -> bool:
    """Whether ``op`` calls a function that, with the functions it calls, holds no stateful op but
    reads of variables: a call that computes the same outputs each time it runs with the same inputs
    (Keras runs a grouped convolution on CPU as such a call, compiled by XLA), which may therefore be
    recomputed like any op. Whether the variables it reads are assigned by the step is the caller's
    check (:func:`classify_ops`, on the call's resource inputs)."""
    if op.type not in _CALL_TYPES:
        return False
    seen = {} if seen is None else seen
    try:
        key = op.get_attr("f").name
    except (ValueError, TypeError):
        return False
    if key in seen:
        return seen[key]
    seen[key] = False           # a function that calls itself is not looked into
    body = _compat.call_graph(op)
    if body is None:
        return False
    for inner in body.get_operations():
        if inner.type in _CALL_TYPES:
            if not _pure_call(inner, seen):
                return False
        elif inner.type in _OPAQUE_TYPES:
            return False        # a loop or a branch: not looked into
        elif _compat.op_is_stateful(inner) and inner.type not in _RESOURCE_READ_TYPES:
            return False
    seen[key] = True
    return True


def _is_opaque(op) -> bool:
    if op.type in _OPAQUE_TYPES:
        return True
    try:
        return any(op.node_def.attr[a].HasField("func") for a in op.node_def.attr)
    except Exception:  # noqa: BLE001 - unusual NodeDefs are simply not opaque
        return False


def classify_ops(traced: TracedStep, op_graph: OpGraph | None = None) -> list[OpInfo]:
    """Classify every op of the traced step (static or not, backward, recomputable, bytes).

    ``op_graph`` is the step's :class:`OpGraph` (built here when not given)."""
    if op_graph is None:
        op_graph = OpGraph.of(traced)
    ops = op_graph.ops
    batch_ops = {op_graph.index[name] for name in (*traced.input_names, *traced.label_names)}

    # Function calls whose functions only compute and read variables (see _pure_call)
    pure_calls = {index for index, op in enumerate(ops) if op.type in _CALL_TYPES and _pure_call(op)}

    # Resources written by the step: inputs of any stateful op that is not a pure read.
    written: set[str] = set()
    for index, op in enumerate(ops):
        if op.type in _RESOURCE_READ_TYPES or op.type in _RESOURCE_SOURCE_TYPES or index in pure_calls:
            continue
        if not _compat.op_is_stateful(op):
            continue
        for t in op.inputs:
            if t.dtype == tf.resource:
                written.add(_resource_source(t))

    # Live ops: ancestors of the function's outputs and of its side-effect collector. TF prunes the
    # rest when it instantiates the function (e.g. the gradient of a first convolution w.r.t. the
    # batch, which Conv2D's gradient computes although nothing uses it).
    live: set[int] = set()
    stack = list(range(traced.terminal_start, len(ops)))
    while stack:
        i = stack.pop()
        if i in live:
            continue
        live.add(i)
        stack.extend(op_graph.producers[i])

    infos: list[OpInfo] = []
    list_sizes: dict[str, Any] = {}
    prediction_start = traced.prediction_start if traced.prediction_start is not None else traced.terminal_start
    for index, op in enumerate(ops):
        info = OpInfo(op=op, index=index, static=True)
        infos.append(info)
        if index >= traced.terminal_start:
            continue  # the function's output identities and side-effect collector
        if index not in live:
            info.dead = True
            continue
        if index in batch_ops or op.type in _RESOURCE_SOURCE_TYPES:
            continue
        depends = any(j in batch_ops or not infos[j].static for j in op_graph.inputs[index]) \
            or any(not infos[j].static for j in op_graph.control_inputs[index])
        pure = index in pure_calls
        reads_written = ((op.type in _RESOURCE_READ_TYPES or pure)
                         and any(t.dtype == tf.resource and _resource_source(t) in written for t in op.inputs))
        harmless_read = (op.type in _RESOURCE_READ_TYPES or pure) and not reads_written
        stateful = _compat.op_is_stateful(op) and not harmless_read
        opaque = _is_opaque(op)
        if not (depends or reads_written or stateful):
            continue
        info.static = False
        info.opaque = opaque
        info.pure_call = pure
        info.recomputable = not (reads_written or stateful or (opaque and not pure))
        info.backward = index >= traced.grad_start
        sizes = []
        for t in op.outputs:
            size = tensor_bytes(t)
            if size is None:
                size = _kernel_scratch_bytes(t)
            if size is None:
                size = tensor_list_bytes(t, list_sizes)
            if size is None and t.dtype == tf.resource and op.type in _LOOP_TYPES:
                size = 0    # a variable's handle the loop passes on: its bytes are the parameters'
            if size is None:
                kind = "an opaque function call or loop whose " if opaque else ""
                raise UnsupportedOpError(
                    f"cannot size op {op.name!r} ({op.type}): {kind}{_describe_unsizeable(t)}; "
                    + _unsizeable_hint(op, ops))
            sizes.append(size)
        if prediction_start <= index:
            # an op that returns a prediction passes its input's buffer on (an Identity): its node holds
            # nothing of its own, and the step's last node reads the prediction there
            sizes = [0] * len(sizes)
        info.out_bytes = tuple(sizes)
        info.bytes = int(sum(sizes))

    for info in infos:
        if info.static or info.backward:
            continue
        for t, j in zip(info.op.inputs, op_graph.inputs[info.index]):
            src = infos[j]
            if not src.static and src.backward:
                raise UnsupportedOpError(
                    f"op {info.op.name!r} ({info.op.type}) runs before the gradient but reads "
                    f"{t.name}, which the gradient computation produces")
    return infos


# TensorList ops (a ``tf.TensorArray`` in a Python loop: KerasHub's RWKV-7 time mixing) and how the
# bytes of the list they return follow from their inputs (see :func:`tensor_list_bytes`).
_LIST_FROM_TENSOR_TYPES = frozenset({"TensorListFromTensor", "TensorListSplit", "TensorListScatter",
                                     "TensorListScatterV2"})
_LIST_GROWING_TYPES = frozenset({"TensorListSetItem", "TensorListPushBack", "TensorListScatterIntoExistingList"})
_LIST_KEEPING_TYPES = frozenset({"TensorListPopBack", "TensorListResize", "Identity", "IdentityN", "StopGradient",
                                 "Snapshot", "ZerosLike"})
_LIST_EMPTY_TYPES = frozenset({"TensorListReserve", "EmptyTensorList"})
_LOOP_TYPES = frozenset({"While", "StatelessWhile"})
_BRANCH_TYPES = frozenset({"If", "StatelessIf"})


def tensor_list_bytes(t, memo: dict | None = None) -> int | None:
    """The bytes a TensorList (a variant tensor) holds, from the ops that built it; None for any other
    variant, or a list whose size does not follow from them.

    A list made from a tensor holds that tensor's bytes; a reserved or empty list none. Setting or
    pushing an item adds the item's bytes, at most the list's capacity (its slots times the item's
    bytes, where the slots are a constant), so that a backward pass that overwrites the slots of a
    full list with zeros does not grow it; popping, resizing and zeroing are counted as keeping the
    bytes (an upper bound). A list that a ``While`` loop carries (``tf.map_fn``, ``keras.ops.map``, a
    Keras RNN layer's loop, the accumulators TF adds to a loop for its gradient) leaves the loop as each
    trip of its body changes it (:func:`_loop_exit_size`), else at most full: its capacity, where the
    list it entered with has a constant number of slots (a reserved list, or an empty one with a
    maximum, as a loop of static trip count has) and items of a static shape. The elements are
    references to the items, which the memory model frees at their last use: the list's bytes keep
    them counted while it lives. An optional (a differentiated cond's intermediates) holds the bytes of
    what it wraps, an ``If`` op's output the larger of its two branches' outputs."""
    memo = {} if memo is None else memo
    found = _tensor_list_size(t, memo)
    return None if found is None else int(found[0])


def _static_item_bytes(op) -> int | None:
    """Bytes of one item of the list a ``TensorListReserve`` or ``EmptyTensorList`` op makes, when its
    element shape is static (None otherwise)."""
    shape = tf.get_static_value(op.inputs[0])
    # a scalar -1 is an unknown rank, a -1 in a vector an unknown dimension
    if shape is None or np.ndim(shape) != 1 or any(int(d) < 0 for d in shape):
        return None
    return int(np.prod(shape, dtype=np.int64)) * tf.as_dtype(op.get_attr("element_dtype")).size


def _tensor_list_size(t, memo: dict):
    """``(bytes, slots or None, item bytes or None)`` of the TensorList ``t`` (see
    :func:`tensor_list_bytes`), or None. The lists of a step are sized in the order of its ops, so that
    the memo holds a list's input already."""
    if t.dtype != tf.variant:
        return None
    key = (id(t.graph), t.name)     # a branch's or loop body's graph names its tensors as the step's do
    if key in memo:
        return memo[key]
    op = t.op
    kind = op.type
    found = None
    if kind in _LIST_EMPTY_TYPES:
        slots = _static_value(op.inputs[1]) if len(op.inputs) > 1 else None
        found = (0, int(slots) if slots is not None and int(slots) >= 0 else None, _static_item_bytes(op))
    elif kind in _LIST_FROM_TENSOR_TYPES:
        size = tensor_bytes(op.inputs[0])
        rows = op.inputs[0].shape[0] if op.inputs[0].shape.rank else None
        whole = kind == "TensorListFromTensor" and rows
        found = None if size is None else (size, int(rows) if whole else None, size // int(rows) if whole else None)
    elif kind == "OptionalFromValue":
        # an optional holding tensors (cond's gradient intermediates a branch produced): their bytes
        sizes = [tensor_bytes(i) if i.dtype != tf.variant else (_tensor_list_size(i, memo) or (None,))[0]
                 for i in op.inputs]
        found = None if any(b is None for b in sizes) else (int(sum(sizes)), None, None)
    elif kind == "OptionalNone":
        found = (0, None, None)
    elif kind in _BRANCH_TYPES:
        # output k is output k of the branch that ran: the larger of the two
        sizes = [_tensor_list_size(g.outputs[t.value_index], memo) if t.value_index < len(g.outputs) else None
                 for g in _compat.branch_graphs(op)]
        if sizes and all(b is not None for b in sizes):
            found = (max(b[0] for b in sizes), None, None)
    elif kind in _LOOP_TYPES:
        # loop variable k leaves the loop as output k
        inner = _tensor_list_size(op.inputs[t.value_index], memo) if t.value_index < len(op.inputs) else None
        if inner is not None:
            found = _loop_exit_size(op, t.value_index, inner)
    elif kind in _LIST_GROWING_TYPES or kind in _LIST_KEEPING_TYPES:
        index = t.value_index if kind == "IdentityN" else 0
        inner = _tensor_list_size(op.inputs[index], memo) if op.inputs else None
        if inner is not None and kind in _LIST_GROWING_TYPES:
            # SetItem(list, index, item); PushBack(list, item); ScatterIntoExistingList(list, items, indices)
            item = tensor_bytes(op.inputs[2] if kind == "TensorListSetItem" else op.inputs[1])
            if item is None:
                inner = None
            else:
                size, slots, each = inner
                grown = size + item
                if kind == "TensorListSetItem" and slots is not None:
                    grown = min(grown, slots * item)
                if each is None and kind != "TensorListScatterIntoExistingList":
                    each = item     # an item set or pushed: the list's items have its size
                inner = (grown, slots, each)
        found = inner
    memo[key] = found
    return found


# reductions a loop's bound is computed with from constants (a Keras RNN layer's maximum_iterations is
# the ``Max`` of its sequence length), which ``tf.get_static_value`` does not fold
_STATIC_REDUCTIONS = {"Max": np.max, "Min": np.min}


def _static_value(t):
    """``tf.get_static_value(t)``, or the value of a max or min of static values (None if unknown)."""
    value = tf.get_static_value(t)
    if value is not None or t.op.type not in _STATIC_REDUCTIONS:
        return value
    data, axes = (tf.get_static_value(i) for i in t.op.inputs[:2])
    if data is None or axes is None or np.size(data) == 0:
        return None
    axes = tuple(int(a) for a in np.atleast_1d(axes))
    return _STATIC_REDUCTIONS[t.op.type](data, axis=axes, keepdims=bool(t.op.get_attr("keep_dims")))


def _through_identities(t):
    while t.op.type == "Identity" and len(t.op.inputs) == 1:
        t = t.op.inputs[0]
    return t


def _loop_exit_size(op, k: int, entering: tuple):
    """``(bytes, slots, item bytes)`` of the list loop variable ``k`` of the ``While`` op ``op`` holds
    when the loop ends, given the list it entered with (see :func:`tensor_list_bytes`).

    The loop body says how the list changes each trip (TF 2 ``while_v2``: its inputs and outputs are the
    loop variables, the second of which is the maximum number of trips): passed on unchanged, it leaves
    as it came; an item pushed each trip adds that many items (none for a variable's value, which the
    item shares with the variable: the per-trip reads of an RNN cell's kernels); popped each trip (the
    gradient loop consuming an accumulator of its forward loop) it loses that many. Otherwise, or where
    the body cannot be read, the list leaves at most full: its slots times an item."""
    size, slots, item = entering
    full = (max(size, slots * item), slots, item) if slots is not None and item is not None else None
    body = _compat.loop_body_graph(op)
    if body is None or k >= len(body.outputs) or k >= len(body.inputs) or len(op.inputs) < 2:
        return full
    trips = _static_value(op.inputs[1])
    start, out = body.inputs[k], _through_identities(body.outputs[k])
    if out is start:
        return entering
    if trips is None or np.ndim(trips) != 0 or int(trips) < 0 or not out.op.inputs \
            or _through_identities(out.op.inputs[0]) is not start:
        return full
    trips = int(trips)
    if out.op.type == "TensorListPushBack":
        pushed = out.op.inputs[1]
        each = 0 if _through_identities(pushed).op.type == "ReadVariableOp" else tensor_bytes(pushed)
        if each is None:
            return full
        return size + trips * each, slots, item if item is not None else each
    if out.op.type == "TensorListPopBack" and op.inputs[k].op.type in _LOOP_TYPES:
        # an accumulator of the forward loop, which pushed one item a trip: the gradient loop runs as
        # many trips as it did and pops them all (a loop that stops early pops fewer: not assumed)
        each = tensor_bytes(out.op.outputs[1])
        return (max(0, size - trips * each), slots, item) if each is not None else full
    return full


def _kernel_scratch_bytes(t) -> int | None:
    """The bytes of a kernel scratch output of unknown shape (:data:`_KERNEL_SCRATCH_OUTPUTS`), or of
    an ``Identity`` of one; ``None`` for any other tensor."""
    while t.op.type == "Identity" and len(t.op.inputs) == 1:
        t = t.op.inputs[0]
    if (t.op.type, t.value_index) in _KERNEL_SCRATCH_OUTPUTS:
        return tensor_bytes(t.op.outputs[1])
    return None


def _unsizeable_hint(op, ops) -> str:
    loops = [o for o in ops if o.type in ("While", "StatelessWhile")]
    if loops:
        return (f"the step contains the loop {loops[0].name!r} ({loops[0].type}), whose TensorList "
                "accumulators cannot be sized; loops (RNN layers) are not supported: build a Keras RNN layer "
                "with unroll=True (a fixed sequence length) to have its steps traced as ops")
    return "checkmate needs every activation to have a static size (use fixed-shape input specs)"


def warn_opaque(infos: Sequence[OpInfo], warn: list[str]) -> None:
    """One message per opaque op in ``warn`` (the lowering's metadata), and one warning for them all
    (KerasHub's MobileNet runs 22 grouped convolutions as XLA calls: 22 warnings said the same)."""
    opaque = [info for info in infos if info.opaque and not info.static]
    for info in opaque:
        if info.recomputable:
            warn.append(f"op {info.op.name!r} ({info.op.type}) is an opaque call: it becomes a single node "
                        "(recomputable: its function only computes) and its internal memory is not modelled")
        else:
            warn.append(f"op {info.op.name!r} ({info.op.type}) is an opaque call or loop: it becomes a single "
                        "non-recomputable node and its internal memory is not modelled")
    # a loop keeps every trip's values to the end of its gradient, and none can be dropped: say how to
    # have a Keras RNN layer's trips planned one by one
    loops = any(info.op.type in _LOOP_TYPES for info in opaque)
    hint = ("; a Keras RNN layer built with unroll=True (a fixed sequence length) is planned step by step"
            if loops else "")
    if len(opaque) == 1:
        warnings.warn(warn[-1] + hint, UserWarning, stacklevel=3)
    elif opaque:
        named = ", ".join(f"{info.op.name!r} ({info.op.type})" for info in opaque[:3])
        fixed = sum(not info.recomputable for info in opaque)
        kind = ("non-recomputable node" if fixed == len(opaque) else
                "node (recomputable where its function only computes: "
                f"{len(opaque) - fixed} of them)")
        warnings.warn(f"{len(opaque)} ops are opaque calls or loops ({named}{', ...' if len(opaque) > 3 else ''}): "
                      f"each becomes a single {kind} and its internal memory is not modelled" + hint,
                      UserWarning, stacklevel=3)
