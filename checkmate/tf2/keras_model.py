"""``RematModel``: a ``keras.Model`` whose ``fit`` trains with a compiled rematerializing step
(:meth:`checkmate.tf2.step.CompiledStep.keras_model` builds one).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import keras
import tensorflow as tf

from checkmate.errors import InvalidArgumentError
from checkmate.tf2 import _compat
from checkmate.tf2.lowering import training_loss

if TYPE_CHECKING:  # pragma: no cover
    from checkmate.tf2.step import CompiledStep

__all__ = ["RematModel"]


class RematModel(keras.Model):
    """``keras.Model`` wrapper whose ``train_step`` runs a :class:`CompiledStep`.

    It shares the wrapped model's layers and variables: ``fit`` trains the original model.
    Inference (``predict``, ``__call__``) runs the wrapped model unchanged. Training batches must
    have the compiled batch size: batch a ``tf.data`` pipeline with ``drop_remainder=True`` or give
    ``fit`` a sample count divisible by the batch size.

    The loss is the one given to :func:`checkmate.tf2.compile`: ``fit`` reports the compiled step's
    loss, and ``evaluate`` (and ``fit``'s validation) computes the same loss on the wrapped model
    in inference mode, with any ``metrics`` given to :meth:`compile`. Those metrics need the
    predictions, which the training step does not keep, so ``fit`` reports them for validation
    data only. Sample weights are not supported.
    """

    def __init__(self, step: CompiledStep, **kwargs: Any):
        kwargs.setdefault("name", f"{getattr(step.model, 'name', 'model')}_checkmate")
        super().__init__(**kwargs)
        self.step = step
        self.inner = step.model
        self.loss_tracker = keras.metrics.Mean(name="loss")

    @property
    def metrics(self):
        # The documented Keras idiom for a custom train_step: fit and evaluate report (and reset
        # each epoch) the metrics listed here. Keras' own loss tracker (also named "loss") is left
        # out: the steps below update this one.
        return [self.loss_tracker] + [m for m in super().metrics if m.name != "loss"]

    def call(self, inputs, training=False):
        return self.inner(inputs, training=training)

    def compile(self, optimizer: Any = None, loss: Any = None, **kwargs: Any):
        # XLA would re-schedule the step and undo the plan's order.
        kwargs["jit_compile"] = False
        if optimizer is not None and optimizer is not self.step.optimizer:
            raise InvalidArgumentError("RematModel trains with the optimizer given to checkmate.tf2.compile; "
                                       "pass that one (or none) to compile()")
        kwargs["optimizer"] = self.step.optimizer
        if loss is not None and loss is not self.step.loss and loss != self.step.loss:
            raise InvalidArgumentError("RematModel trains and evaluates with the loss given to "
                                       "checkmate.tf2.compile; pass that one (or none) to compile()")
        for option in ("loss_weights", "weighted_metrics"):
            if kwargs.get(option) is not None:
                raise InvalidArgumentError(f"RematModel.compile does not support {option}")
        return super().compile(**kwargs)

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        if sample_weight is not None:
            raise InvalidArgumentError("the compiled step does not take sample weights")
        flat = self.step.function.flat_args(x, y)
        flat = [tf.ensure_shape(t, spec.shape) for t, spec in zip(flat, self.step.input_specs)]
        loss = self.step.train_flat(*flat)
        self.loss_tracker.update_state(loss)
        return {"loss": self.loss_tracker.result()}

    def fit(self, x=None, y=None, batch_size=None, epochs=1, **kwargs):
        """``keras.Model.fit``; with arrays, ``batch_size`` defaults to the compiled batch size, and
        a sample count that does not split into whole batches is refused before training starts
        (the last batch would not fit the compiled step; drop or pad the remainder)."""
        batch = int(self.step.input_specs[0].shape[0])
        first = tf.nest.flatten(x)[0] if x is not None else None
        shape = getattr(first, "shape", None)
        if shape is not None and len(shape) > 0:     # arrays and tensors, not datasets or generators
            if batch_size is None:
                batch_size = batch
            if batch_size != batch:
                raise InvalidArgumentError(f"batch_size={batch_size}: the step was compiled for batches of {batch}")
            samples = int(shape[0])
            split = kwargs.get("validation_split") or 0.0
            train = int(math.floor(samples * (1.0 - split)))
            if train % batch:
                raise InvalidArgumentError(
                    f"{train} training samples do not split into batches of {batch} (the compiled batch size): "
                    f"drop or pad the last {train % batch}")
        return super().fit(x, y, batch_size=batch_size, epochs=epochs, **kwargs)

    def test_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        if sample_weight is not None:
            raise InvalidArgumentError("evaluating the compiled step's loss does not take sample weights")
        pred = self.inner(x, training=False)
        self.loss_tracker.update_state(training_loss(self.inner, self.step.loss, y, pred))
        return self.compute_metrics(x, y, pred)

    def make_train_function(self, force: bool = False):
        super().make_train_function(force)
        inner = self.train_function
        if inner is not None and not getattr(inner, "_checkmate_scoped", False):
            def train_function(iterator):
                # Keras nests the step in its own tf.function; run that one with the same
                # Grappler setting as the step so that the plan's ordering edges survive.
                with _compat.grappler_disabled():
                    return inner(iterator)

            train_function._checkmate_scoped = True
            self.train_function = train_function
        return self.train_function
