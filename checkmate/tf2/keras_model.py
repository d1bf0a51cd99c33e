"""``RematModel``: a ``keras.Model`` whose ``fit`` trains with a compiled rematerializing step.

Two ways in. The Keras-native one wraps a model and is compiled like any Keras model::

    trainer = checkmate.tf2.RematModel(model, budget="60%", strategy="checkmate_milp")
    trainer.compile(optimizer, loss, metrics=["accuracy"])
    trainer.fit(dataset, epochs=10)

It lowers and solves the step at the first training batch (its batch size is the compiled one), with
sample weights as an input of the step. :meth:`checkmate.tf2.step.CompiledStep.keras_model` wraps an
already compiled step instead (fixed batch size, no sample weights).
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

import keras
import tensorflow as tf

from checkmate.errors import InvalidArgumentError
from checkmate.tf2 import _compat
from checkmate.tf2.lowering import training_loss
from checkmate.tf2.lowering.trace import _resolve_loss, check_not_distributed

if TYPE_CHECKING:  # pragma: no cover
    from checkmate.tf2.step import CompiledStep

__all__ = ["RematModel", "check_no_custom_train_step"]

_log = logging.getLogger("checkmate.tf2")
# keras.Model.fit's batch size when arrays are given without one
KERAS_DEFAULT_BATCH_SIZE = 32


def check_no_custom_train_step(model: Any) -> None:
    """Refuse a model that overrides ``train_step``: the compiled step is built from the model's
    ``call`` and the loss, so ``fit`` would silently skip the model's own training logic."""
    own = getattr(type(model), "train_step", None)
    if own is not None and own is not keras.Model.train_step:
        owner = next((c.__name__ for c in type(model).__mro__ if "train_step" in vars(c)), type(model).__name__)
        raise InvalidArgumentError(
            f"{getattr(model, 'name', 'the model')} has its own train_step (defined in {owner}): the "
            "rematerialized step is traced from the model's call() and the loss, so fit() would skip that "
            "logic. Express it in call(), the loss or add_loss(), or call a step from "
            "checkmate.tf2.compile(...) inside your own training loop or train_step")


def _as_loss_object(fn: Any) -> Any:
    fn = keras.losses.get(fn) if isinstance(fn, str) else fn
    if isinstance(fn, keras.losses.Loss):
        return fn
    # as keras.Model.compile does: a loss function is wrapped so that sample weights reduce as in Keras
    return keras.losses.LossFunctionWrapper(fn)


def weighted_loss(loss: Any, model: Any):
    """``loss`` as the step's loss of ``((y, sample_weight), pred)``: each output's loss weighs its
    per-sample values and reduces them as Keras does (``sum(w * l) / size``)."""
    weight: dict[str, Any] = {}

    def entry(fn):
        if fn is None:
            return None
        obj = _as_loss_object(fn)
        return lambda y, pred: obj(y, pred, sample_weight=weight["w"])

    if isinstance(loss, dict):
        wrapped: Any = {k: entry(v) for k, v in loss.items()}
    elif isinstance(loss, (list, tuple)):
        wrapped = [entry(v) for v in loss]
    else:
        wrapped = entry(loss)
    combined = _resolve_loss(wrapped, model)

    def step_loss(target, pred):
        y, w = target
        weight["w"] = w
        return combined(y, pred)

    return step_loss


def _spec(t: Any, batch: int) -> tf.TensorSpec:
    shape = list(t.shape)
    return tf.TensorSpec([batch] + [int(d) for d in shape[1:]], tf.as_dtype(t.dtype))


@keras.saving.register_keras_serializable(package="checkmate")
class RematModel(keras.Model):
    """A ``keras.Model`` that trains ``model`` with a rematerializing step.

    ``RematModel(model, budget=..., strategy=..., **options)`` is the Keras-native form: ``compile``
    takes an optimizer, a loss (any ``keras.Model.compile`` loss) and metrics as in Keras, and the
    first training batch compiles the step (:func:`checkmate.tf2.compile` with ``budget``,
    ``strategy`` and ``options``) for that batch size. It shares the model's layers and variables:
    ``fit`` trains the original model. Inference (``predict``, ``__call__``, ``evaluate``,
    ``export``) runs the model unchanged.

    - Sample weights and ``class_weight`` are honoured (an input of the compiled step).
    - A smaller batch (the last one of an epoch) is padded to the compiled size with zero rows whose
      weight is zero, and the real rows' weights rescaled so that the loss is the batch's own; layers
      that compute batch statistics (BatchNorm in training) see the padded rows.
    - Loss scaling: a ``LossScaleOptimizer`` (given, or the one ``compile`` adds under the
      ``mixed_float16`` policy) scales the differentiated loss and unscales the gradients as Keras does.
    - Training metrics need the predictions, which the rematerialized step does not keep: ``fit``
      computes them from an inference-mode forward pass of each batch before its update (one forward
      pass more per step, dropout off, BatchNorm on its moving statistics). Validation metrics are
      Keras' own.
    - ``save``/``keras.saving.load_model``: the file holds the model, the options and the compile
      arguments; loading gives back a ``RematModel`` that compiles its step again at its first
      training batch (a schedule depends on the device and its budget). ``save_weights`` and
      ``load_weights`` work on the model's weights.

    ``RematModel(step)`` (what :meth:`~checkmate.tf2.step.CompiledStep.keras_model` returns) wraps an
    already compiled step: the loss and optimizer are the step's, batches must have its size, and
    sample weights are refused.

    A model that overrides ``train_step`` is refused (:func:`check_no_custom_train_step`).
    """

    def __init__(self, model: Any = None, *, budget: Any = "auto", strategy: str | None = None,
                 compile_options: dict | None = None, **kwargs: Any):
        from checkmate.tf2.step import CompiledStep

        step = model if isinstance(model, CompiledStep) else None
        inner = step.model if step is not None else model
        if inner is None:
            raise InvalidArgumentError("RematModel needs a Keras model (or a compiled step)")
        check_no_custom_train_step(inner)
        check_not_distributed(inner)
        kwargs.setdefault("name", f"{getattr(inner, 'name', 'model')}_checkmate")
        super().__init__(**kwargs)
        self.step = step
        self.inner = inner
        self.native = step is None
        self.budget = budget
        self.strategy = strategy
        self.compile_options = dict(compile_options or {})
        self._steps: dict = {}
        if not self.native:
            self.loss_tracker = keras.metrics.Mean(name="loss")
        if getattr(inner, "built", False):
            # shares the built model's variables: save_weights and summary need no call first
            self.built = True

    # ------------------------------------------------------------------------------ Keras protocol
    def get_config(self) -> dict:
        budget = self.budget if self.native else int(self.step.predicted.budget_bytes)
        strategy = self.strategy if self.native else self.step.strategy
        return {"name": self.name, "model": keras.saving.serialize_keras_object(self.inner), "budget": budget,
                "strategy": strategy, "compile_options": dict(self.compile_options)}

    @classmethod
    def from_config(cls, config: dict, custom_objects: Any = None) -> "RematModel":
        config = dict(config)
        model = keras.saving.deserialize_keras_object(config.pop("model"), custom_objects=custom_objects)
        return cls(model, **config)

    @property
    def metrics(self):
        if self.native:
            return super().metrics
        # The documented Keras idiom for a custom train_step: fit and evaluate report (and reset
        # each epoch) the metrics listed here. Keras' own loss tracker (also named "loss") is left
        # out: the steps below update this one.
        return [self.loss_tracker] + [m for m in super().metrics if m.name != "loss"]

    def call(self, inputs, training=False):
        return self.inner(inputs, training=training)

    def export(self, filepath, format="tf_saved_model", **kwargs):
        """Exports the wrapped model (inference is the model's own)."""
        return self.inner.export(filepath, format=format, **kwargs)

    def compile(self, optimizer: Any = None, loss: Any = None, **kwargs: Any):
        # XLA would re-schedule the step and undo the plan's order.
        kwargs["jit_compile"] = False
        if self.native:
            if kwargs.get("loss_weights") is not None:
                # the step's loss sums the outputs' losses unweighted (checkmate.tf2.compile's loss)
                raise InvalidArgumentError("RematModel.compile does not support loss_weights: scale the "
                                           "losses themselves")
            self._steps = {}
            return super().compile(optimizer=optimizer if optimizer is not None else "rmsprop", loss=loss,
                                   **kwargs)
        inner_optimizer = getattr(self.step.optimizer, "inner_optimizer", None)
        if optimizer is not None and optimizer is not self.step.optimizer and optimizer is not inner_optimizer:
            raise InvalidArgumentError("RematModel trains with the optimizer given to checkmate.tf2.compile; "
                                       "pass that one (or none) to compile()")
        kwargs["optimizer"] = self.step.optimizer
        kwargs["auto_scale_loss"] = False   # the step's optimizer is the one its gradients were traced for
        if loss is not None and loss is not self.step.loss and loss != self.step.loss:
            raise InvalidArgumentError("RematModel trains and evaluates with the loss given to "
                                       "checkmate.tf2.compile; pass that one (or none) to compile()")
        for option in ("loss_weights", "weighted_metrics"):
            if kwargs.get(option) is not None:
                raise InvalidArgumentError(f"RematModel.compile does not support {option}")
        return super().compile(**kwargs)

    def get_compile_config(self) -> dict | None:
        return super().get_compile_config()

    def compile_from_config(self, config: dict) -> None:
        # Keras calls this (not compile()) when it loads a model whose compile() is its own
        self.compile(**keras.saving.deserialize_keras_object(config))

    # ------------------------------------------------------------------------------ the step
    def compiled_step(self, x: Any = None, y: Any = None) -> "CompiledStep":
        """The compiled step (native form: compiled for the batch ``(x, y)`` on first use)."""
        if not self.native:
            return self.step
        if not self._steps:
            if x is None:
                raise InvalidArgumentError("no step compiled yet: it is compiled at the first training batch")
            self._steps["step"] = self._compile_step(x, y)
        return self._steps["step"]

    def _compile_step(self, x: Any, y: Any) -> "CompiledStep":
        from checkmate.tf2.step import compile as compile_step

        if getattr(self, "optimizer", None) is None or getattr(self, "_compile_loss", None) is None:
            raise InvalidArgumentError("compile the RematModel with an optimizer and a loss before fit()")
        first = tf.nest.flatten(x)[0]
        batch = int(first.shape[0]) if first.shape[0] is not None else None
        if batch is None:
            raise InvalidArgumentError("the first training batch has no static batch size to compile for")
        input_spec = tf.nest.map_structure(lambda t: _spec(t, batch), x)
        label_spec = (tf.nest.map_structure(lambda t: _spec(t, batch), y), tf.TensorSpec((batch,), tf.float32))
        options = dict(self.compile_options)
        if self.strategy is not None:
            options["strategy"] = self.strategy
        _log.info("compiling the rematerialized step of %s for batches of %d", self.inner.name, batch)
        return compile_step(self.inner, weighted_loss(self._loss_argument, self.inner), self.optimizer,
                            input_spec, label_spec, budget=self.budget, **options)

    @property
    def _loss_argument(self):
        return self._compile_config.config["loss"] if getattr(self, "_compile_config", None) else None

    def _first_batch(self, x: Any, y: Any, batch_size: Any) -> tuple[Any, Any]:
        """One batch of the training data (its first), to compile the step for."""
        if isinstance(x, tf.data.Dataset):
            bx, by, _ = keras.utils.unpack_x_y_sample_weight(next(iter(x)))
            return bx, by
        first = tf.nest.flatten(x)[0] if x is not None else None
        if getattr(first, "shape", None) is not None:
            size = batch_size or KERAS_DEFAULT_BATCH_SIZE
            take = lambda t: tf.convert_to_tensor(t[:size])
            return tf.nest.map_structure(take, x), tf.nest.map_structure(take, y)
        raise InvalidArgumentError(
            "RematModel compiles its step from the first training batch: give fit() arrays or a tf.data "
            "dataset, or call train_on_batch(x, y) once first")

    def train_on_batch(self, x, y=None, sample_weight=None, class_weight=None, return_dict=False):
        if self.native and not self._steps:
            self.compiled_step(tf.nest.map_structure(tf.convert_to_tensor, x),
                               tf.nest.map_structure(tf.convert_to_tensor, y))
        return super().train_on_batch(x, y, sample_weight=sample_weight, class_weight=class_weight,
                                      return_dict=return_dict)

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        pred = None
        if self._has_compiled_metrics():
            pred = self.inner(x, training=False)
        if self.native:
            loss, rows = self._native_step(x, y, sample_weight)
            self._loss_tracker.update_state(loss, sample_weight=rows)
            if pred is None:
                return self.get_metrics_result()
            return self.compute_metrics(x, y, pred, sample_weight=sample_weight)
        if sample_weight is not None:
            raise InvalidArgumentError("a step from checkmate.tf2.compile does not take sample weights: "
                                       "use RematModel(model, budget=...) and compile() it")
        flat = self.step.function.flat_args(x, y)
        batch = int(self.step.input_specs[0].shape[0])
        if flat[0].shape[0] != batch:
            # a batch of unknown size (a dataset batched without drop_remainder): checked as it runs
            check = tf.debugging.assert_equal(
                tf.shape(flat[0])[0], batch,
                message=f"this batch's shape differs from the compiled one: the step was compiled for batches of "
                        f"{batch}; batch the data with drop_remainder=True, or use RematModel(model, budget=...), "
                        "which pads a short batch")
            with tf.control_dependencies([check]):
                flat = [tf.identity(t) for t in flat]
        flat = [tf.ensure_shape(t, spec.shape) for t, spec in zip(flat, self.step.input_specs)]
        loss = self.step.train_flat(*flat)
        self.loss_tracker.update_state(loss)
        if pred is not None:
            self.compute_metrics(x, y, pred)
        return {m.name: m.result() for m in self.metrics}

    def _has_compiled_metrics(self) -> bool:
        metrics = getattr(self, "_compile_metrics", None)
        return metrics is not None and bool(getattr(metrics, "_user_metrics", None) or
                                            getattr(metrics, "_user_weighted_metrics", None))

    def _native_step(self, x, y, sample_weight):
        step = self.compiled_step()
        batch = int(step.input_specs[0].shape[0])
        rows = tf.shape(tf.nest.flatten(x)[0])[0]
        weight = tf.ones((rows,), tf.float32) if sample_weight is None else tf.cast(
            tf.reshape(sample_weight, (rows,)), tf.float32)
        static = tf.nest.flatten(x)[0].shape[0]
        if static != batch:
            # The last batch of an epoch: pad to the compiled size; padded rows weigh nothing, and the
            # real rows are weighted up so that sum(w * l) / batch is the short batch's own mean.
            missing = batch - rows

            def pad(t):
                t = tf.convert_to_tensor(t)
                padding = tf.concat([[[0, missing]], tf.zeros((t.shape.rank - 1, 2), tf.int32)], axis=0)
                return tf.pad(t, padding)

            x = tf.nest.map_structure(pad, x)
            y = tf.nest.map_structure(pad, y)
            weight = pad(weight * tf.cast(batch, tf.float32) / tf.cast(rows, tf.float32))
        flat = step.function.flat_args(x, (y, weight))
        flat = [tf.ensure_shape(t, spec.shape) for t, spec in zip(flat, step.input_specs)]
        return step.train_flat(*flat), rows

    def fit(self, x=None, y=None, batch_size=None, epochs=1, **kwargs):
        """``keras.Model.fit``. Native form: the first call compiles the step for its first batch.
        Compiled-step form: with arrays, ``batch_size`` defaults to the compiled batch size, and a
        sample count that does not split into whole batches is refused before training starts."""
        if self.native:
            if not self._steps:
                bx, by = self._first_batch(x, y, batch_size)
                self.compiled_step(bx, by)
            return super().fit(x, y, batch_size=batch_size, epochs=epochs, **kwargs)
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
        if self.native:
            return super().test_step(data)
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
