"""``RematModel``: a ``keras.Model`` whose ``fit`` trains with a compiled rematerializing step.

Two ways in. The Keras-native one wraps a model and is compiled like any Keras model::

    trainer = checkmate.tf2.RematModel(model, budget="60%", strategy="checkmate_milp")
    trainer.compile(optimizer, loss, metrics=["accuracy"])
    trainer.fit(dataset, epochs=10)

It lowers and solves the step at the first training batch (its batch size, per replica under a
``tf.distribute`` strategy, is the compiled one), with sample weights as an input of the step; a
batch of another size is padded or gets a schedule of its own (``partial_batches``). Its train
function takes each batch eagerly to make that choice before the step is traced.
:meth:`checkmate.tf2.step.CompiledStep.keras_model` wraps an already compiled step instead (fixed
batch size, no sample weights).
"""

from __future__ import annotations

import contextlib
import logging
import math
from typing import TYPE_CHECKING, Any

import keras
import tensorflow as tf

from checkmate.errors import InvalidArgumentError
from checkmate.tf2 import _compat, losses
from checkmate.tf2.lowering import training_loss
from checkmate.tf2.lowering.trace import distribution_strategy, walk_layers

if TYPE_CHECKING:  # pragma: no cover
    from checkmate.tf2.step import CompiledStep

__all__ = ["RematModel", "check_no_custom_train_step", "PARTIAL_BATCHES", "BATCH_STATISTICS_LAYERS",
           "has_batch_statistics"]

_log = logging.getLogger("checkmate.tf2")
# How RematModel trains a batch smaller than a compiled one (see its docstring): "pad" it to the
# compiled size, "compile" a schedule for its size, or "auto": compile when the model has a layer
# whose training forward pass mixes the rows of a batch, pad otherwise.
PARTIAL_BATCHES = ("auto", "pad", "compile")
# Keras layers whose training forward pass reads statistics of the whole batch, so that padded rows
# would change the real rows' outputs and the layer's moving statistics.
BATCH_STATISTICS_LAYERS = (keras.layers.BatchNormalization,)


def has_batch_statistics(model: Any) -> bool:
    """Whether ``model`` (its layers, nested models' included) has a :data:`BATCH_STATISTICS_LAYERS` layer."""
    return any(isinstance(layer, BATCH_STATISTICS_LAYERS) for layer in walk_layers(model))


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


def _batch_size(x: Any) -> int | None:
    first = tf.nest.flatten(x)[0]
    size = first.shape[0] if getattr(first, "shape", None) is not None else None
    return int(size) if size is not None else None


def _unscaled(loss: tf.Tensor) -> tf.Tensor:
    """A replica's loss (its share of the global batch's) as the batch's own, which Keras' loss
    tracker averages over the replicas (in a replica context; unchanged without a strategy)."""
    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    return loss if replicas == 1 else loss * tf.cast(replicas, loss.dtype)


def _run_step(step: "CompiledStep", flat: list) -> tuple[tf.Tensor, Any]:
    """One optimizer step of ``step`` on one replica's flat batch, inside the train function: its loss
    and the training forward pass's predictions (``None`` for a step compiled without them)."""
    if step.distribution is not None:
        return step.replica_train(*flat)
    return step.train_flat_with_predictions(*flat)


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
    - A smaller batch (the last one of an epoch) is trained exactly as Keras trains it.
      ``partial_batches="auto"`` (default): if the model has a layer whose training forward pass
      reads the whole batch's statistics (:data:`BATCH_STATISTICS_LAYERS`: BatchNormalization), its
      first batch of a new size compiles a schedule for that size (once; :attr:`compiled_steps`),
      since padded rows would change those statistics; otherwise it is padded to the compiled size
      with zero rows whose weight is zero, the real rows' weights rescaled so that the loss is the
      batch's own (exact for layers that treat rows independently; dropout draws its masks for the
      padded shape). ``"compile"`` and ``"pad"`` force either (``"compile"`` for a custom layer that
      mixes rows). A batch larger than every compiled one always gets its own schedule.
    - Loss scaling: a ``LossScaleOptimizer`` (given, or the one ``compile`` adds under the
      ``mixed_float16`` policy) scales the differentiated loss and unscales the gradients as Keras does.
    - Training metrics are computed as in Keras, from the training forward pass's predictions: with
      metrics compiled, the step is compiled with ``predictions=True`` and returns the model's output
      (planned as a step output, resident to the end of the step). Validation metrics are Keras' own.
      The compiled-step form does the same for a step compiled with ``predictions=True``, else
      computes them from an inference-mode forward pass after the update.
    - ``save``/``keras.saving.load_model``: the file holds the model, the options and the compile
      arguments; loading gives back a ``RematModel`` that compiles its step again at its first
      training batch (a schedule depends on the device and its budget). ``save_weights`` and
      ``load_weights`` work on the model's weights.

    ``RematModel(step)`` (what :meth:`~checkmate.tf2.step.CompiledStep.keras_model` returns) wraps an
    already compiled step: the loss and optimizer are the step's, batches must have its size, and
    sample weights are refused.

    - ``tf.distribute``: built and compiled inside ``MirroredStrategy.scope()`` (or
      ``MultiWorkerMirroredStrategy``'s), ``fit`` compiles the step for the per-replica batch (the
      global batch divided by the replicas), every replica runs it on its share of each batch, and
      the optimizer sums the replicas' gradients and applies them once, as Keras' ``fit`` does.
      Other strategies are refused by name.

    A model that overrides ``train_step`` is refused (:func:`check_no_custom_train_step`).
    """

    def __init__(self, model: Any = None, *, budget: Any = "auto", strategy: str | None = None,
                 compile_options: dict | None = None, partial_batches: str = "auto", **kwargs: Any):
        from checkmate.tf2.step import CompiledStep

        step = model if isinstance(model, CompiledStep) else None
        inner = step.model if step is not None else model
        if inner is None:
            raise InvalidArgumentError("RematModel needs a Keras model (or a compiled step)")
        check_no_custom_train_step(inner)
        if partial_batches not in PARTIAL_BATCHES:
            raise InvalidArgumentError(f"partial_batches={partial_batches!r}: expected one of {', '.join(PARTIAL_BATCHES)}")
        distribution_strategy(inner)
        kwargs.setdefault("name", f"{getattr(inner, 'name', 'model')}_checkmate")
        super().__init__(**kwargs)
        self.step = step
        self.inner = inner
        self.native = step is None
        self.budget = budget
        self.strategy = strategy
        self.compile_options = dict(compile_options or {})
        self.partial_batches = partial_batches
        self._steps: dict = {}
        self._main_batch: int | None = None
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
                "strategy": strategy, "compile_options": dict(self.compile_options),
                "partial_batches": self.partial_batches}

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
            if loss is None and optimizer is None and set(kwargs) <= {"jit_compile"}:
                # a compiled model (a KerasHub task compiles itself) lends its own compile() arguments
                kwargs = losses.compile_arguments_of(self.inner) or {}
                loss, optimizer = kwargs.pop("loss", None), kwargs.pop("optimizer", None)
                kwargs["jit_compile"] = False
            self._steps = {}
            self._main_batch = None
            if getattr(self.inner, "output_names", None):
                # Keras matches a dict of losses to the compiled model's output names
                self.output_names = list(self.inner.output_names)
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
        if self.built and getattr(self, "optimizer", None) is not None and not self.optimizer.built:
            # Keras then restores the saved optimizer state into these variables (the slots of the
            # wrapped model's weights), as it does for a model of its own; unbuilt, it skips them.
            self.optimizer.build(self.trainable_variables)

    # ------------------------------------------------------------------------------ the step
    def compiled_step(self, x: Any = None, y: Any = None) -> "CompiledStep":
        """The compiled step (native form: the one compiled for the first training batch, or for the
        batch ``(x, y)`` if none is compiled yet; under a strategy, ``(x, y)`` is one replica's batch)."""
        if not self.native:
            return self.step
        if self._main_batch is None:
            if x is None:
                raise InvalidArgumentError("no step compiled yet: it is compiled at the first training batch")
            self._add_step(x, y)
        return self._steps[self._main_batch]

    @property
    def compiled_steps(self) -> dict:
        """Native form: the steps compiled so far, by the batch size (per replica) they were planned for."""
        return dict(self._steps)

    def _add_step(self, x: Any, y: Any, sample_weight: Any = None) -> "CompiledStep":
        batch = _batch_size(x)
        if batch is None:
            raise InvalidArgumentError("the training batch has no static batch size to compile for")
        if self._main_batch is not None:
            _log.info("%s: a schedule of its own for batches of %d (%s)", self.name, batch,
                      "larger than the first" if batch > self._main_batch else
                      f"partial_batches={self.partial_batches!r}" + (": the model has batch-statistics layers"
                                                                    if self.partial_batches == "auto" else ""))
        step = self._compile_step(x, y, batch, sample_weight)
        self._steps[batch] = step
        if self._main_batch is None:
            self._main_batch = batch
        return step

    def _compile_step(self, x: Any, y: Any, batch: int, sample_weight: Any = None) -> "CompiledStep":
        from checkmate.tf2.step import compile as compile_step

        if getattr(self, "optimizer", None) is None or getattr(self, "_compile_loss", None) is None:
            raise InvalidArgumentError("compile the RematModel with an optimizer and a loss before fit()")
        input_spec = tf.nest.map_structure(lambda t: _spec(t, batch), x)
        label_spec = (tf.nest.map_structure(lambda t: _spec(t, batch), y), losses.weight_spec(sample_weight, batch))
        options = dict(self.compile_options)
        # training metrics are computed as Keras does, from the training forward pass's predictions
        options.setdefault("predictions", self._has_compiled_metrics())
        if self.strategy is not None:
            options["strategy"] = self.strategy
        strategy = self._replicated_strategy()
        _log.info("compiling the rematerialized step of %s for batches of %d%s", self.inner.name, batch,
                  f" per replica ({strategy.num_replicas_in_sync} replicas)" if strategy is not None else "")
        # the lowering traces one replica's step under the model's strategy (see distribution_strategy)
        with strategy.scope() if strategy is not None else contextlib.nullcontext():
            return compile_step(self.inner, losses.step_loss(self), self.optimizer,
                                input_spec, label_spec, budget=self.budget, **options)

    def _replicated_strategy(self) -> Any:
        """The model's ``tf.distribute`` strategy when it is one the step runs under (else ``None``)."""
        strategy = self.distribute_strategy
        if isinstance(strategy, (tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy)):
            return strategy
        return None

    def _replica_batches(self, data: Any) -> list[tuple[int, Any, Any, Any]]:
        """``(rows, x, y, sample_weight)`` of each local replica's part of one batch as ``fit`` hands it to the train
        function (distributed values: one part per replica; plain tensors: every replica gets them all)."""
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        strategy = self.distribute_strategy

        def parts(t):
            if isinstance(t, tf.distribute.DistributedValues):
                return list(strategy.experimental_local_results(t))
            return None

        first = tf.nest.flatten(x)[0]
        count = len(parts(first) or [first])
        pick = lambda k: (lambda t: (parts(t) or [t] * count)[k])
        out = []
        for k in range(count):
            xk = tf.nest.map_structure(pick(k), x)
            yk = tf.nest.map_structure(pick(k), y)
            wk = None if sample_weight is None else tf.nest.map_structure(pick(k), sample_weight)
            out.append((_batch_size(xk), xk, yk, wk))
        return out

    def _ensure_steps(self, data: Any) -> None:
        """Compile, before the train function runs on it, a step for each replica batch size of this
        batch that no compiled step serves (see :meth:`_step_for`)."""
        if not self.native:
            return
        for rows, x, y, w in self._replica_batches(data):
            if rows is not None and self._step_for(rows) is None:
                self._add_step(tf.nest.map_structure(tf.convert_to_tensor, x),
                               tf.nest.map_structure(tf.convert_to_tensor, y), w)

    def _step_for(self, rows: int | None) -> "CompiledStep | None":
        """The step that trains a replica batch of ``rows``: the one compiled for it, else the main one
        when a smaller batch is padded to it (where padding is exact, see :meth:`pads_exactly`; an
        empty replica batch and one of unknown size are always padded). ``None``: compile one."""
        if rows in self._steps:
            return self._steps[rows]
        if self._main_batch is None:
            return None
        if rows is None or rows == 0 or (rows < self._main_batch and self.pads_exactly()):
            return self._steps[self._main_batch]
        return None

    def pads_exactly(self) -> bool:
        """Whether a smaller batch is padded to a compiled size (``partial_batches``: ``"pad"``, or
        ``"auto"`` for a model without a batch-statistics layer) rather than given a schedule of its own."""
        if self.partial_batches == "auto":
            return not has_batch_statistics(self.inner)
        return self.partial_batches == "pad"

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        metrics = self._has_compiled_metrics()
        if self.native:
            # the step was compiled with predictions when metrics were compiled (compile() drops steps)
            loss, rows, pred = self._native_step(x, y, sample_weight)
            self._loss_tracker.update_state(_unscaled(loss), sample_weight=rows)
            if not metrics:
                return self.get_metrics_result()
            return self.compute_metrics(x, y, pred, sample_weight=sample_weight)
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
        if metrics:
            if pred is None:
                # a step compiled without predictions=True: a forward pass of the batch in inference
                # mode, after its update
                pred = self.inner(x, training=False)
            self.compute_metrics(x, y, pred)
        return {m.name: m.result() for m in self.metrics}

    def _has_compiled_metrics(self) -> bool:
        metrics = getattr(self, "_compile_metrics", None)
        return metrics is not None and bool(getattr(metrics, "_user_metrics", None) or
                                            getattr(metrics, "_user_weighted_metrics", None))

    def _native_step(self, x, y, sample_weight):
        static = tf.nest.flatten(x)[0].shape[0]
        step = self._step_for(static)
        if step is None:
            raise InvalidArgumentError(f"no step compiled for batches of {static}: train with fit() or "
                                       "train_on_batch(), which compile one")
        batch = int(step.input_specs[0].shape[0])
        rows = tf.shape(tf.nest.flatten(x)[0])[0]
        weight = losses.step_weights(sample_weight, rows)
        if static != batch:
            # A smaller batch served by a larger step: pad to the compiled size; padded rows weigh
            # nothing, and the real rows are weighted up so that sum(w * l) / batch is the short
            # batch's own mean.
            missing = batch - rows

            def pad(t):
                t = tf.convert_to_tensor(t)
                padding = tf.concat([[[0, missing]], tf.zeros((t.shape.rank - 1, 2), tf.int32)], axis=0)
                return tf.pad(t, padding)

            x = tf.nest.map_structure(pad, x)
            y = tf.nest.map_structure(pad, y)
            weight = tf.nest.map_structure(
                lambda w: pad(tf.math.divide_no_nan(w * tf.cast(batch, tf.float32), tf.cast(rows, tf.float32))), weight)
        flat = step.function.flat_args(x, (y, weight), per_replica=True)
        flat = [tf.ensure_shape(t, spec.shape) for t, spec in zip(flat, step.input_specs)]
        loss, pred = _run_step(step, flat)
        if pred is not None and static != batch:
            pred = tf.nest.map_structure(lambda t: t[:rows], pred)     # the padded rows' predictions dropped
        return loss, rows, pred

    def make_train_function(self, force: bool = False):
        """The train function ``fit`` calls with its data iterator: it takes each batch eagerly,
        compiles a step for a replica batch size no compiled step serves (the first batch's, a
        remainder's: see the class docstring), then runs one ``tf.function`` traced per batch shape
        that runs :meth:`train_step` in each replica (``strategy.run``) and averages the replicas'
        metric results as Keras does. It runs with the same Grappler setting as the step, so that the
        plan's ordering edges survive."""
        if self.train_function is not None and not force:
            return self.train_function
        strategy = self.distribute_strategy

        def step_on_data(data):
            outputs = strategy.run(self.train_step, args=(data,))
            return tf.nest.map_structure(lambda v: strategy.reduce(tf.distribute.ReduceOp.MEAN, v, axis=None),
                                         outputs)

        one_step = step_on_data if self.run_eagerly else tf.function(step_on_data, autograph=False)

        def train_function(iterator):
            logs = None
            for _ in range(self.steps_per_execution):
                try:
                    data = next(iterator)
                except (StopIteration, tf.errors.OutOfRangeError):
                    if logs is None:
                        raise StopIteration
                    break
                # as Keras' own train function: a missing part of a batch (an Optional) is None
                data = tf.nest.map_structure(lambda t: None if isinstance(t, tf.experimental.Optional) else t, data)
                self._ensure_steps(data)
                with _compat.grappler_disabled():
                    logs = one_step(data)
            return logs

        self.train_function = train_function
        return self.train_function

    def fit(self, x=None, y=None, batch_size=None, epochs=1, **kwargs):
        """``keras.Model.fit``. Native form: the first batch compiles the step (per replica under a
        strategy). Compiled-step form: with arrays, ``batch_size`` defaults to the compiled (global)
        batch size, and a sample count that does not split into whole batches is refused before
        training starts."""
        if self.native:
            if not self.compiled and losses.compile_arguments_of(self.inner) is not None:
                self.compile()      # the wrapped model's own compile() arguments
            return super().fit(x, y, batch_size=batch_size, epochs=epochs, **kwargs)
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
        if self.native:
            return super().test_step(data)
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        if sample_weight is not None:
            raise InvalidArgumentError("evaluating the compiled step's loss does not take sample weights")
        pred = self.inner(x, training=False)
        self.loss_tracker.update_state(_unscaled(training_loss(self.inner, self.step.loss, y, pred)))
        return self.compute_metrics(x, y, pred)
