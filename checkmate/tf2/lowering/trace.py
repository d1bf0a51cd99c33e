"""Tracing the training step: the first stage of the lowering (docs/design.md §1, §6).

:func:`trace_step` traces one training step, ``(x, y) -> (loss, *grads)``, as a ``tf.function`` with
fixed-batch ``TensorSpec``\\ s, so that every tensor has a static shape. While tracing it records the
op count at each phase (the model call, the loss, ``tape.gradient``, and the function's output
identities that ``tf.function`` adds after the step returns), which later stages use to tell forward
ops from backward ones, and which ops each top-level Keras layer call creates (the layer-call
watcher), by which the layer level attributes ops to layers.

Loss resolution: a callable or a Keras loss name as given; for a model with several outputs a list
or dict of losses, one per output, whose scalar values are summed as in ``keras.Model.compile``. The
step differentiates that scalar (its mean if the loss is not a scalar) plus the model's own losses.

Under ``MirroredStrategy`` or ``MultiWorkerMirroredStrategy`` the step is one replica's: it is traced
in the replica context of this worker's first replica, reading that replica's copy of each
variable, with each replica's share of the loss as Keras computes it (:func:`training_loss`), and
:attr:`TracedStep.capture_variables` records which distributed variable each captured handle
belongs to. Other strategies are refused (:func:`distribution_strategy`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from checkmate.errors import InvalidArgumentError, UnsupportedOpError
from checkmate.tf2 import _compat

__all__ = ["TracedStep", "trace_step", "training_loss", "distribution_strategy", "distribution_name",
           "check_not_distributed", "SUPPORTED_STRATEGIES", "walk_layers"]


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
    # with predictions: the index of the first op that returns one (each an op of its own, created
    # after the gradients; see _prediction_output); terminal_start without
    prediction_start: int | None = None
    # (layer name, first op index, end op index) of every call of a top-level layer (traced with
    # nested=True: of every layer at every depth, named by its path, e.g. "backbone/block_0/query")
    layer_calls: list[tuple[str, int, int]] = field(default_factory=list)
    # with predictions: the model's output as returned by the step (a nest of tensor names)
    pred_structure: Any = None
    # the tf.distribute strategy it was traced under (None: none) and, per captured tensor, the
    # distributed variable it is a replica's handle of (see _capture_variables)
    distribution: Any = None
    capture_variables: tuple[Any, ...] = ()
    # per variable, aligned with grad_tensors: the indices tensor of a gradient that the tape gives as
    # tf.IndexedSlices (an untied embedding's), whose grad_tensors entry is then its values; None for
    # a dense gradient. Empty: every gradient is dense.
    grad_indices: tuple[str | None, ...] = ()
    # the recorded layer calls (names as in layer_calls) of layers with a non-linear ``activation``
    # after work of their own (a Dense or Conv with activation="gelu"; not an Activation layer):
    # level="auto" may give the activation's ops nodes of their own
    activation_calls: frozenset[str] = frozenset()

    @property
    def gradient_outputs(self) -> tuple[str, ...]:
        """Every tensor the step returns for the gradients: each gradient (a sliced one's values), then
        the sliced ones' indices."""
        return (*self.grad_tensors, *(t for t in self.grad_indices if t is not None))


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


def _replica_share(value: tf.Tensor) -> tf.Tensor:
    """``value`` divided by the number of replicas in sync (unchanged outside a strategy), as Keras
    scales a replica's loss: the optimizer sums the replicas' gradients, so each replica contributes
    its share of the global batch's mean."""
    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    return value if replicas == 1 else value * tf.cast(1.0 / replicas, value.dtype)


def _scalar_loss(value: Any) -> tf.Tensor:
    value = tf.convert_to_tensor(value)
    if value.shape.rank != 0:
        # As Keras wraps a loss function: its mean, a replica's share of it under a strategy. A scalar
        # is taken as given (Keras' Loss objects scale themselves, as does a custom loss's reduction).
        value = _replica_share(tf.reduce_mean(value))
    return value


def training_loss(model: Any, loss: Any, y: Any, pred: Any, x: Any = None) -> tf.Tensor:
    """The scalar that the lowered step differentiates: ``loss(y, pred)`` (its mean if it is not a
    scalar) plus the model's own losses (regularizers, ``add_loss``). Under a ``tf.distribute``
    strategy, in a replica context, it is that replica's share as in Keras' ``train_step``: a Keras
    loss and the mean of a per-sample loss divided by the number of replicas, and so are the
    model's own losses. A loss marked ``takes_inputs`` (a model's own ``compute_loss``, see
    :func:`checkmate.tf2.losses.step_loss`) is ``loss(y, pred, x)``, the model's losses included."""
    fn = _resolve_loss(loss, model)
    if getattr(fn, "takes_inputs", False):
        return _scalar_loss(fn(y, pred, x))
    value = _scalar_loss(fn(y, pred))
    extra = list(getattr(model, "losses", []) or [])
    if extra:
        value = value + _replica_share(tf.add_n([tf.cast(e, value.dtype) for e in extra]))
    return value


# The strategies whose replicas each run the whole step on their own copy of the variables and
# all-reduce the gradients in the optimizer, which is what the generated per-replica step needs.
SUPPORTED_STRATEGIES = ("MirroredStrategy", "MultiWorkerMirroredStrategy")


def distribution_name(distribution: Any) -> str:
    """The public name of a ``tf.distribute`` strategy (``MultiWorkerMirroredStrategy`` is an instance
    of an internal class whose own name users never wrote)."""
    if isinstance(distribution, tf.distribute.MultiWorkerMirroredStrategy):
        return "MultiWorkerMirroredStrategy"   # its class is named CollectiveAllReduceStrategy
    if isinstance(distribution, tf.distribute.MirroredStrategy):
        return "MirroredStrategy"
    return type(distribution).__name__


def distribution_strategy(model: Any = None) -> Any:
    """The ``tf.distribute`` strategy the step will run under, or ``None`` outside every strategy.

    Under ``MirroredStrategy`` or ``MultiWorkerMirroredStrategy`` (their ``scope()``) the step is
    traced in one replica's context and each replica runs the generated step on its own variables
    (:mod:`checkmate.tf2.codegen`). Any other strategy (``TPUStrategy``, ``ParameterServerStrategy``,
    ``CentralStorageStrategy``, ...) is refused, naming it, before anything is traced; so is a model
    whose variables a strategy created when that strategy's scope is not active.
    """
    distribution = tf.distribute.get_strategy() if tf.distribute.has_strategy() else None
    distributed = [v for v in getattr(model, "variables", ()) or ()
                   if isinstance(getattr(v, "value", v), tf.distribute.DistributedValues)]
    if distribution is None:
        if distributed:
            raise UnsupportedOpError(
                f"{len(distributed)} of the model's variables are distributed (created under a tf.distribute "
                "strategy) but no strategy scope is active: compile and train inside strategy.scope()")
        return None
    if not isinstance(distribution, (tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy)):
        raise UnsupportedOpError(
            f"checkmate does not run under {distribution_name(distribution)}: a rematerialized step runs under "
            f"{' and '.join(SUPPORTED_STRATEGIES)} only (every replica runs the whole step on its own copy of "
            "the variables). Use one of those, or build and train the model outside strategy.scope()")
    synchronized = [layer.name for layer in walk_layers(model) if getattr(layer, "synchronized", False)]
    if synchronized:
        # its batch statistics are all-reduced inside the forward pass: the step would not be one
        # replica's alone, and the replicas' imported plans cannot meet in that all-reduce
        raise UnsupportedOpError(
            f"{synchronized[0]} synchronizes its batch statistics across replicas (synchronized=True), which "
            "a rematerialized step does not support under a strategy: use synchronized=False (Keras' default)")
    return distribution


def _public_layers(layer: Any) -> list:
    return list(getattr(layer, "layers", None) or [])


def walk_layers(model: Any, children: Any = _public_layers) -> list:
    """Every layer of ``model``, each once, nested ones included: ``children(layer)`` gives a layer's
    own (by default the public ``layers`` of a nested model)."""
    found: list = []
    seen: set[int] = set()
    stack = _public_layers(model)
    while stack:
        layer = stack.pop()
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        found.append(layer)
        stack.extend(children(layer))
    return found


# the former name, kept for existing imports
check_not_distributed = distribution_strategy


def _in_first_local_replica(distribution: Any, fn: Callable[[], Any]) -> Any:
    """``fn()`` run once, in the replica context of this worker's first replica (where reading a
    distributed variable gives that replica's copy; documented ``strategy.run`` only)."""
    ids = distribution.experimental_local_results(
        distribution.run(lambda: tf.distribute.get_replica_context().replica_id_in_sync_group))
    first = min(int(i) for i in ids)
    result: dict[str, Any] = {}

    def replica():
        if int(tf.distribute.get_replica_context().replica_id_in_sync_group) == first:
            result["value"] = fn()

    distribution.run(replica)
    return result["value"]


def _capture_variables(function: Any, distribution: Any, candidates: Any) -> tuple[Any, ...]:
    """For each tensor ``function`` captures, the distributed variable whose local copy it is the handle
    of (``None`` for any other capture): the generated step feeds each replica's own copy there."""
    if distribution is None:
        return ()
    owner: dict[int, Any] = {}
    for v in candidates:
        value = getattr(v, "value", v)
        if isinstance(value, tf.distribute.DistributedValues):
            for local in distribution.experimental_local_results(value):
                owner[id(local.handle)] = value
    return tuple(owner.get(id(external)) for external, _ in function.graph.captures)


def _prediction_output(tensor: tf.Tensor) -> tf.Tensor:
    """``tensor`` as the step returns it among the predictions: an op of its own (no copy: TF's
    ``Identity`` passes the buffer on)."""
    return tf.identity(tensor, name="prediction")


def trace_step(model: Any, loss: Any, input_spec: Any, label_spec: Any, optimizer: Any = None,
               predictions: bool = False, fused_batch_norm: bool = False, nested: bool = False) -> TracedStep:
    """Trace ``(x, y) -> (loss, *grads, *indices)`` for ``model`` with fixed-shape specs, recording op
    ranges. A gradient the tape gives as ``tf.IndexedSlices`` is returned as its values among the
    gradients and its indices after them (:attr:`TracedStep.grad_indices`).

    ``predictions=True`` also returns the training forward pass's output (``(loss, *grads, *indices, *preds)``,
    the model's output flattened), so that training metrics need no forward pass of their own.

    With an ``optimizer`` that scales the loss (``keras.optimizers.LossScaleOptimizer``), the gradients
    are those of ``optimizer.scale_loss(loss)``, as in Keras' own ``train_step``: its
    ``apply_gradients`` unscales them. The returned loss is the unscaled one.

    ``nested=True`` records the calls of every layer at every depth (layers of nested models, the
    sublayers of composite layers), each named by its path of enclosing calls
    (``"backbone/transformer_layer_0/self_attention/query"``); by default only the top-level
    layers' calls are recorded, under their names.
    """
    distribution = distribution_strategy(model)
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
    if optimizer is not None and hasattr(optimizer, "scale_loss") and not getattr(optimizer, "built", True):
        # An unbuilt LossScaleOptimizer scales by its initial scale, a constant: the step would keep
        # that scale when apply_gradients lowers its dynamic one after an overflow.
        optimizer.build(list(variables))
    marks: dict[str, Any] = {}
    calls: list[tuple[str, int, int]] = []
    activations: set[str] = set()

    def step(x, y):
        marks["model_start"] = _compat.current_graph_op_count()
        with tf.GradientTape() as tape:
            pred = model(_compat.in_input_order(model, x), training=True)
            marks["loss_start"] = _compat.current_graph_op_count()
            value = training_loss(model, loss_fn, y, pred, x)
            scaled = value
            if optimizer is not None and hasattr(optimizer, "scale_loss"):
                # Keras' optimizers all have scale_loss: the identity but for LossScaleOptimizer, whose
                # scale is a variable read in the step (float16 gradients that would underflow).
                scaled = optimizer.scale_loss(value)
        marks["grad_start"] = _compat.current_graph_op_count()
        # a tensor read by many ops (a sequence sliced per step) gets its gradients as a running sum
        with _compat.running_gradient_sums():
            grads = tape.gradient(scaled, list(variables))
        # A variable the loss does not use (an output head the loss ignores) gets a constant zero
        # gradient. Not through UnconnectedGradients.ZERO: TF 2.21 cannot build that zero for a Keras 3
        # variable, whose dtype is a string.
        grads = [tf.zeros(v.shape, tf.as_dtype(v.dtype)) if g is None else g for g, v in zip(grads, variables)]
        # A gradient the tape gives as tf.IndexedSlices (a gather's: one row per occurrence of an id)
        # leaves the step as its values and indices, not as their dense sum: Keras' optimizers update
        # their slots per row (Adam's squared gradient per occurrence, then a scatter-add), which
        # differs from the sum's update when an id occurs twice in a batch. TF's own aggregation
        # decides which are sliced (a variable read by a gather and a matmul gets a dense one).
        # A sliced gradient's dense shape is its variable's (see RematFunction.split).
        sliced = [isinstance(g, tf.IndexedSlices) for g in grads]
        indices = [tf.convert_to_tensor(g.indices) for g, s in zip(grads, sliced) if s]
        grads = [tf.convert_to_tensor(g.values if s else g) for g, s in zip(grads, sliced)]
        marks["loss"] = value.name
        marks["grads"] = tuple(g.name for g in grads)
        names = iter(t.name for t in indices)
        marks["grad_indices"] = tuple(next(names) if s else None for s in sliced) if indices else ()
        preds = []
        marks["prediction_start"] = _compat.current_graph_op_count()
        if predictions:
            # Each prediction leaves the step through an op of its own, created last: together they are
            # the step's last node, the only one that must hold the predictions at the end. The op that made
            # it (a language model's logits) is then free to go after the loss and to be computed
            # again for this one at the end, instead of staying resident through the whole backward.
            preds = [_prediction_output(tf.convert_to_tensor(p)) for p in tf.nest.flatten(pred)]
            marks["preds"] = tf.nest.pack_sequence_as(pred, [p.name for p in preds])
        marks["terminal_start"] = _compat.current_graph_op_count()
        return (value, *grads, *indices, *preds)

    def trace():
        # the fused calls go in first, so that the layer-call watcher wraps them and attributes their ops
        with _fused_batch_norm(model, fused_batch_norm), _watch_layer_calls(model, calls, nested=nested,
                                                                            activations=activations):
            return tf.function(step).get_concrete_function(input_spec, label_spec)

    # Under a strategy the step is one replica's: traced in a replica context, it reads that replica's
    # copy of each variable (the generated step feeds every replica its own) and Keras' losses scale
    # themselves by 1 / num_replicas_in_sync, as in Keras' own train_step.
    function = trace() if distribution is None else _in_first_local_replica(distribution, trace)
    candidates = list(model.variables) + list(getattr(optimizer, "variables", None) or [])

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
        prediction_start=marks["prediction_start"],
        layer_calls=calls,
        pred_structure=marks.get("preds"),
        distribution=distribution,
        capture_variables=_capture_variables(function, distribution, candidates),
        grad_indices=marks["grad_indices"],
        activation_calls=frozenset(activations),
    )


class _instance_calls:
    """Base of the tracing-time substitutions of layers' ``call``: an instance attribute (Keras 3
    invokes ``self.call``), the layer's previous instance attribute restored on exit, in reverse
    order, so that substitutions nest."""

    def __init__(self, model: Any):
        self.model = model
        self.replaced: list[tuple[Any, Any]] = []

    def _set_call(self, layer: Any, call: Any) -> None:
        self.replaced.append((layer, vars(layer).get("call", _NO_CALL)))
        object.__setattr__(layer, "call", call)

    def __exit__(self, *exc):
        for layer, previous in reversed(self.replaced):
            if previous is _NO_CALL:
                vars(layer).pop("call", None)
            else:
                object.__setattr__(layer, "call", previous)
        self.replaced.clear()
        return False


_NO_CALL = object()
# marks a call substituted by checkmate (fused batch norm), which the layer-call watcher still wraps
_SUBSTITUTE_MARK = "_checkmate_traced_substitute"


def has_activation(layer: Any) -> bool:
    """Whether ``layer`` applies a non-linear ``activation`` attribute of its own after work of its
    own (Keras' Dense and Conv layers keep it there; ``linear`` is none). A layer without weights (an
    ``Activation`` layer) is only its activation: its node is already the activation's, with no
    matmul or convolution to recompute apart from it, and splitting it would only add nodes."""
    act = getattr(layer, "activation", None)
    if not callable(act) or isinstance(act, type):
        return False
    if not getattr(layer, "weights", None):
        return False
    return getattr(act, "__name__", None) not in ("linear", None)


class _watch_layer_calls(_instance_calls):
    """Record, while tracing, which ops each top-level layer call creates.

    Wraps the ``call`` of each top-level layer (a user's own instance ``call`` is left alone, one that
    checkmate substituted is wrapped too), and restores them on exit. ``nested=True`` wraps every
    layer at every depth (:func:`checkmate.tf2._compat.sublayers`) and names each call by the path
    of the calls it runs in; a path called again (a layer applied twice in one block) gets ``#2``,
    ``#3``..., so that every call is a node of its own.
    """

    def __init__(self, model: Any, calls: list, nested: bool = False, activations: set | None = None):
        super().__init__(model)
        self.calls = calls
        self.activations = activations if activations is not None else set()
        self.nested = nested
        self.stack: list[str] = []
        self.seen_paths: dict[str, int] = {}

    def _layers(self) -> list:
        if not self.nested:
            return _public_layers(self.model)
        return walk_layers(self.model, children=_compat.sublayers)

    def __enter__(self):
        for layer in self._layers():
            if "call" in vars(layer) and not getattr(vars(layer)["call"], _SUBSTITUTE_MARK, False):
                continue
            original = layer.call

            def wrapped(*args, __original=original, __name=layer.name, __act=has_activation(layer), **kwargs):
                start = _compat.current_graph_op_count()
                name = __name
                if self.nested:
                    path = "/".join([*self.stack, __name])
                    count = self.seen_paths.get(path, 0) + 1
                    self.seen_paths[path] = count
                    name = path if count == 1 else f"{path}#{count}"
                    self.stack.append(name.rsplit("/", 1)[-1])
                try:
                    return __original(*args, **kwargs)
                finally:
                    if self.nested:
                        self.stack.pop()
                    self.calls.append((name, start, _compat.current_graph_op_count()))
                    if __act:
                        self.activations.add(name)

            self._set_call(layer, wrapped)
        return self


class _fused_batch_norm(_instance_calls):
    """While tracing, every BatchNormalization layer of the model (nested ones included) calls
    :func:`~checkmate.tf2.lowering.batch_norm.fused_batch_norm_call`; nothing is set when ``enabled``
    is false."""

    def __init__(self, model: Any, enabled: bool):
        super().__init__(model)
        self.enabled = bool(enabled)

    def __enter__(self):
        if not self.enabled:
            return self
        import keras

        from checkmate.tf2.lowering.batch_norm import fused_batch_norm_call

        for layer in walk_layers(self.model):
            if not isinstance(layer, keras.layers.BatchNormalization) or "call" in vars(layer):
                continue
            call = fused_batch_norm_call(layer, layer.call)
            setattr(call, _SUBSTITUTE_MARK, True)
            self._set_call(layer, call)
        return self
