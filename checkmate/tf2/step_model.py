"""``CompiledStepModel``: a ``keras.Model`` whose ``fit`` trains with one already compiled step
(:meth:`checkmate.tf2.step.CompiledStep.keras_model`, or ``RematModel(step)``).

It imports neither the step module (which imports it to build the wrapper) nor
:mod:`checkmate.tf2.keras_model`: the step is recognised by what the wrapper uses of it.
"""

from __future__ import annotations

import math
from typing import Any

import keras
import tensorflow as tf

from checkmate.errors import InvalidArgumentError
from checkmate.tf2 import _compat
from checkmate.tf2.lowering import training_loss
from checkmate.tf2.trainer import StepTrainer, _batch_size, _run_step, _unscaled

__all__ = ["CompiledStepModel"]

# What CompiledStepModel reads of a compiled step (checkmate.tf2.step.CompiledStep).
STEP_ATTRIBUTES = ("model", "loss", "optimizer", "predicted", "strategy", "input_specs", "function", "replicas",
                   "distribution", "replica_train", "train_flat_with_predictions")


def _is_compiled_step(value: Any) -> bool:
    return value is not None and not isinstance(value, keras.Model) and all(
        hasattr(value, name) for name in STEP_ATTRIBUTES)


@keras.saving.register_keras_serializable(package="checkmate")
class CompiledStepModel(StepTrainer):
    """A ``keras.Model`` whose ``fit`` trains with one already compiled step
    (:meth:`checkmate.tf2.step.CompiledStep.keras_model`, or ``RematModel(step)``).

    The loss and optimizer are the step's, batches must have its (global) batch size, and sample
    weights are refused. Training metrics come from the training forward pass for a step compiled with
    ``predictions=True``, else from an inference-mode forward pass after the update. Saved and loaded,
    it comes back as a :class:`~checkmate.tf2.keras_model.RematModel` for the step's budget in bytes
    and its strategy. It is a :class:`~checkmate.tf2.trainer.StepTrainer`, not a ``RematModel``.
    """

    def __init__(self, step: Any = None, **kwargs: Any):
        if not _is_compiled_step(step):
            raise InvalidArgumentError("CompiledStepModel wraps a step from checkmate.tf2.compile")
        super().__init__(step.model, budget=int(step.predicted.budget_bytes), strategy=step.strategy, **kwargs)
        self.step = step
        # its own loss tracker: the documented Keras idiom for a custom train_step
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self._adopt_step()

    def _adopt_step(self) -> None:
        # the one step serves batches of its size; nothing else is ever compiled
        batch = int(self.step.input_specs[0].shape[0])
        self._steps = {batch: self.step}
        self._main_batch = batch

    @property
    def metrics(self):
        # fit and evaluate report (and reset each epoch) the metrics listed here. Keras' own loss
        # tracker (also named "loss") is left out: the steps below update this one.
        return [self.loss_tracker] + [m for m in super().metrics if m.name != "loss"]

    def compile(self, optimizer: Any = None, loss: Any = None, **kwargs: Any):
        inner_optimizer = getattr(self.step.optimizer, "inner_optimizer", None)
        if optimizer is not None and optimizer is not self.step.optimizer and optimizer is not inner_optimizer:
            raise InvalidArgumentError("RematModel trains with the optimizer given to checkmate.tf2.compile; "
                                       "pass that one (or none) to compile()")
        if loss is not None and loss is not self.step.loss and loss != self.step.loss:
            raise InvalidArgumentError("RematModel trains and evaluates with the loss given to "
                                       "checkmate.tf2.compile; pass that one (or none) to compile()")
        for option in ("loss_weights", "weighted_metrics"):
            if kwargs.get(option) is not None:
                raise InvalidArgumentError(f"RematModel.compile does not support {option}")
        kwargs["jit_compile"] = False    # XLA would re-schedule the step and undo the plan's order
        kwargs["auto_scale_loss"] = False   # the step's optimizer is the one its gradients were traced for
        # Keras' own compile: RematModel.compile would drop the step
        result = keras.Model.compile(self, optimizer=self.step.optimizer, **kwargs)
        _compat.drop_empty_compiled_metrics(self)     # compile(metrics=[]): nothing to report, as in Keras
        self._adopt_step()
        return result

    def _ensure_steps(self, data: Any) -> None:
        # one step, one batch size: another size is refused in train_step, naming the compiled one
        return None

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        if sample_weight is not None:
            raise InvalidArgumentError("a step from checkmate.tf2.compile does not take sample weights: "
                                       "use RematModel(model, budget=...) and compile() it")
        batch = int(self.step.input_specs[0].shape[0])
        message = (f"this batch's shape differs from the compiled one: the step was compiled for batches of {batch}"
                   f"{' per replica' if self.step.replicas > 1 else ''}; batch the data with drop_remainder=True, "
                   "or use RematModel(model, budget=...), which trains a short batch as well")
        static = _batch_size(x)
        if static is not None and static != batch:
            raise InvalidArgumentError(f"{message} (this one has {static} rows)")
        flat = self.step.function.flat_args(x, y, per_replica=True)
        if flat[0].shape[0] != batch:
            # a batch of unknown size: checked as it runs
            check = tf.debugging.assert_equal(tf.shape(flat[0])[0], batch, message=message)
            with tf.control_dependencies([check]):
                flat = [tf.identity(t) for t in flat]
        flat = [tf.ensure_shape(t, spec.shape) for t, spec in zip(flat, self.step.input_specs)]
        loss, pred = _run_step(self.step, flat)
        self.loss_tracker.update_state(_unscaled(loss))
        if _compat.has_compiled_metrics(self):
            if pred is None:
                # a step compiled without predictions=True: a forward pass of the batch in inference
                # mode, after its update
                pred = self.inner(x, training=False)
            self.compute_metrics(x, y, pred)
        return {m.name: m.result() for m in self.metrics}

    def fit(self, x=None, y=None, batch_size=None, epochs=1, **kwargs):
        """``keras.Model.fit``. With arrays, ``batch_size`` defaults to the compiled (global) batch
        size, and a sample count that does not split into whole batches is refused before training
        starts."""
        batch = int(self.step.input_specs[0].shape[0]) * self.step.replicas
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
        self.loss_tracker.update_state(_unscaled(training_loss(self.inner, self.step.loss, y, pred, x)))
        return self.compute_metrics(x, y, pred)
