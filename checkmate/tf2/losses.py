"""Keras' loss semantics for :class:`~checkmate.tf2.keras_model.RematModel`'s compiled step.

The rematerialized step of ``RematModel`` differentiates the loss exactly as ``keras.Model.fit``
computes it: the model's compiled ``CompileLoss`` (every output's loss, ``loss_weights``, dict or
list losses keyed by output names, masks carried by the predictions, each loss's reduction) is
called inside the traced step on ``(y, y_pred, sample_weight)``, and the model's own losses
(regularizers, ``add_loss``) are added by the lowering. A model that overrides ``compute_loss`` (the
way Keras documents for a loss of its own) has that method traced instead, with the inputs, as
Keras' train step calls it; it adds the model's own losses itself.

Sample weights are an input of the step, so that one compiled step serves every batch:

- a weight of any shape given to ``fit`` (per sample ``(B,)``, per token ``(B, S)``, per pixel, or
  the ``(B,)`` weights Keras derives from ``class_weight``) is fed as it is;
- without one, the step gets a row weight of ones, shape ``(B,)``.

Keras multiplies a loss's per-element values by the weight after matching their ranks only when they
differ by a trailing axis of one; a ``(B,)`` weight against a per-token loss ``(B, S)`` would not
broadcast. A rank-1 weight (the row weights, or a per-sample weight) is therefore given to each
output's loss as ``(B, 1, ..., 1)`` with the rank of that output's labels: for labels ``(B,)`` or
``(B, C)`` Keras' rank matching makes this the same product as a ``(B,)`` weight, and for sparse
per-token ``(B, S)`` or per-pixel ``(B, H, W)`` labels it weighs every element of a row by the row's
weight. Rows of ones are then exactly Keras' unweighted loss, which is how a ``RematModel`` trains
a language model whose labels are per token.

A short batch padded to a compiled size gets zero weights on its padded rows and its real rows'
weights scaled by ``compiled / rows`` (see ``RematModel``): exact for the ``"sum_over_batch_size"``
reduction without a mask. A model whose predictions carry a Keras mask divides by the number of
unmasked elements instead, so its padded batches would be off by that factor: such models should
train with ``partial_batches="compile"`` (or full batches).

``compile_arguments_of`` gives the ``compile()`` arguments of an already compiled model (a KerasHub
task compiles itself with its own defaults on construction), which ``RematModel`` adopts when it is
trained without being compiled itself.
"""

from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf

from checkmate.errors import InvalidArgumentError
from checkmate.tf2 import _compat

__all__ = ["step_loss", "weight_spec", "step_weights", "compile_arguments_of", "row_weights_as"]

# The keras.Model.compile arguments that a model adopted from its compiled wrapped model keeps.
_ADOPTED = ("loss", "loss_weights", "metrics", "weighted_metrics")


def compile_arguments_of(model: Any) -> dict | None:
    """The ``compile()`` arguments of a compiled Keras model (its optimizer, loss, loss weights and
    metrics as objects), or ``None`` if it was never compiled with a loss."""
    if getattr(model, "optimizer", None) is None or _compat.keras_compiled_loss(model) is None:
        return None
    config = _compat.keras_compile_arguments(model)
    arguments = {key: config.get(key) for key in _ADOPTED if config.get(key) is not None}
    # the metrics Keras' fit of the model computes, which outlive a later compile() without any
    metrics, weighted_metrics = _compat.compiled_metric_lists(model)
    for key, value in (("metrics", metrics), ("weighted_metrics", weighted_metrics)):
        if value:
            arguments[key] = value
    arguments["loss"] = getattr(model, "loss", None) or config.get("loss")
    arguments["optimizer"] = model.optimizer
    return arguments


def row_weights_as(weight: tf.Tensor, labels: Any) -> Any:
    """A rank-1 weight ``(B,)`` shaped ``(B, 1, ..., 1)`` with the rank of ``labels`` (per output
    when the outputs' labels differ in rank): see the module docstring."""
    def shaped(y):
        rank = len(getattr(y, "shape", ()) or ())
        return tf.reshape(weight, [-1] + [1] * max(rank - 1, 0))

    flat = tf.nest.flatten(labels)
    ranks = {len(getattr(y, "shape", ()) or ()) for y in flat}
    if len(ranks) <= 1:
        return shaped(flat[0]) if flat else weight
    return tf.nest.map_structure(shaped, labels)


def step_loss(trainer: Any) -> Callable:
    """The loss of ``((y, sample_weight), y_pred)`` that ``trainer``'s compiled step differentiates:
    ``trainer``'s Keras ``CompileLoss`` on the batch, as ``keras.Model.compute_loss`` calls it."""
    # fit() builds Keras' compiled loss (its structure, a loss tracker per output) symbolically before
    # the first step is traced
    compiled = _compat.keras_compiled_loss(trainer)
    inner = getattr(trainer, "inner", None)
    own = inner is not None and _compat.own_compute_loss(inner) is not None
    if compiled is None and not own:    # a model's own compute_loss may need no compiled loss
        raise InvalidArgumentError("compile the RematModel with a loss before fit()")

    def weights(target: Any) -> tuple:
        y, weight = target
        if not tf.nest.is_nested(weight) and weight.shape.rank == 1:
            weight = row_weights_as(weight, y)
        return y, weight

    if own:
        # the wrapped model's own compute_loss (through the trainer's), which may read the inputs: the
        # lowering calls it with them (``takes_inputs``) and adds no model losses of its own
        def own_loss(target: Any, pred: Any, x: Any) -> tf.Tensor:
            # labels of several parts may be turned into other targets by the method (a detector's
            # boxes and classes): a row weight is given to it as it is, not shaped after each part
            y, weight = weights(target) if not tf.nest.is_nested(target[0]) else target
            return trainer.compute_loss(x, y, pred, weight, training=True)

        own_loss.takes_inputs = True
        return own_loss

    def loss(target: Any, pred: Any) -> tf.Tensor:
        y, weight = weights(target)
        return compiled(y, pred, sample_weight=weight)

    return loss


def weight_spec(sample_weight: Any, batch: int) -> Any:
    """The step's sample-weight spec for batches of ``batch`` rows: the shape of the weights given to
    ``fit`` (rows ``batch``), or ``(batch,)`` row weights without any."""
    if sample_weight is None:
        return tf.TensorSpec((batch,), tf.float32)

    def spec(w):
        shape = [int(d) for d in tf.convert_to_tensor(w).shape[1:]]
        return tf.TensorSpec([batch] + shape, tf.float32)

    return tf.nest.map_structure(spec, sample_weight)


def step_weights(sample_weight: Any, rows: tf.Tensor) -> Any:
    """The step's sample-weight input for one batch of ``rows`` rows (see :func:`weight_spec`)."""
    if sample_weight is None:
        return tf.ones((rows,), tf.float32)
    return tf.nest.map_structure(lambda w: tf.cast(w, tf.float32), sample_weight)
