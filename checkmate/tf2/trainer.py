"""``StepTrainer``: what both Keras wrappers of compiled steps share: the train function, padded runs
of a smaller batch, metrics, saving, and the step-time report after the first epoch.

:class:`checkmate.tf2.keras_model.RematModel` compiles its steps (it imports
:mod:`checkmate.tf2.step`); :class:`checkmate.tf2.step_model.CompiledStepModel` wraps one already
compiled step (what :meth:`checkmate.tf2.step.CompiledStep.keras_model` returns). This module imports
neither of them nor the step module, so that the step module reaches its wrapper without a cycle.

Keras' private attributes are reached through :mod:`checkmate.tf2._compat` only.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

import keras
import numpy as np
import tensorflow as tf

from checkmate.errors import InvalidArgumentError
from checkmate.tf2 import _compat, losses
from checkmate.tf2.lowering.trace import distribution_strategy, walk_layers
from checkmate.tf2.plan_cache import read_plan

if TYPE_CHECKING:  # pragma: no cover
    from checkmate.tf2.step import CompiledStep

__all__ = ["StepTrainer", "StepTimeReport", "check_no_custom_train_step", "check_budget_form", "PARTIAL_BATCHES",
           "BATCH_STATISTICS_LAYERS", "has_batch_statistics", "STEP_TIME_REPORT_REPEATS", "STEP_TIME_REPORT_MAX_S", "MODEL_FORM_NAME",
           "measure_against_keras", "KERAS_REFERENCE"]

_log = logging.getLogger("checkmate.tf2")
# How RematModel trains a batch smaller than a compiled one (see its docstring): "pad" it to the
# compiled size, "compile" a schedule for its size, or "auto": compile when the model has a layer
# whose training forward pass mixes the rows of a batch, pad otherwise.
PARTIAL_BATCHES = ("auto", "pad", "compile")
# Keras layers whose training forward pass reads statistics of the whole batch, so that padded rows
# would change the real rows' outputs and the layer's moving statistics.
BATCH_STATISTICS_LAYERS = (keras.layers.BatchNormalization,)
# Repeats of the measurement after RematModel's first epoch: each runs both train functions once, so the
# report costs about 2 x this many steps and one trace of Keras' own train step, once per compiled step.
STEP_TIME_REPORT_REPEATS = 7
# ... in fewer rounds (at least STEP_TIME_REPORT_MIN_REPEATS) once its timed rounds have taken this long:
# a model whose step takes 20 s on a CPU (KerasHub's BASNet at 64x64) would otherwise stop fit() for
# 7 minutes after its first epoch
STEP_TIME_REPORT_MAX_S = 60.0
STEP_TIME_REPORT_MIN_REPEATS = 3
# The Keras registered name of RematModel, the form a saved wrapper of a compiled step loads back as.
MODEL_FORM_NAME = "checkmate>RematModel"
# get_compile_config's mark that the optimizer was the wrapped model's own
_SHARED_OPTIMIZER_KEY = "checkmate_optimizer_of_model"


def check_budget_form(budget: Any) -> None:
    """Refuse a budget that no step could resolve (``"60 percent"``, ``"-5%"``, ``0``) when it is given,
    rather than at the first batch: ``"auto"``, or what :func:`checkmate.budgets.parse_budget` reads,
    checked against a stand-in graph (a percentage is resolved against the step's graph later)."""
    if isinstance(budget, str) and budget.strip().lower() == "auto":
        return
    from checkmate.budgets import parse_budget
    from checkmate.graph import GraphBuilder

    # a graph whose checkpoint-all peak is large enough that any positive percentage is a byte or more
    builder = GraphBuilder("budget-check")
    first = builder.add_node("f", 1.0, 1 << 40)
    builder.add_node("g", 1.0, 1 << 40, [first], backward=True, output=True)
    parse_budget(budget, builder.build())


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


def _loss_weight_lookup(loss_weights: Any, model: Any):
    """``factor(index, output_name)`` for ``keras.Model.compile``'s ``loss_weights``: one number, a list
    (one per output) or a dict by output name (outputs it does not name weigh 1)."""
    names = list(getattr(model, "output_names", None) or [])
    if loss_weights is None:
        return lambda index, key: 1.0
    if isinstance(loss_weights, dict):
        unknown = sorted(set(loss_weights) - set(names)) if names else []
        if unknown:
            raise InvalidArgumentError(f"loss_weights names {unknown}, which are not outputs of the model "
                                       f"(outputs: {names})")
        return lambda index, key: float(loss_weights.get(key, 1.0))
    if isinstance(loss_weights, (list, tuple)):
        if names and len(loss_weights) != len(names):
            raise InvalidArgumentError(f"{len(loss_weights)} loss_weights for a model with {len(names)} outputs {names}")
        return lambda index, key: float(loss_weights[index])
    try:
        factor = float(loss_weights)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"loss_weights must be a number, a list or a dict, got {loss_weights!r}") from None
    return lambda index, key: factor


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


def _check_remat_arguments(model: Any, strategy: Any, compile_options: Any) -> None:
    """RematModel's arguments, checked when it is made rather than at the first batch of ``fit``."""
    if model is None:
        raise InvalidArgumentError("RematModel needs a Keras model (or a compiled step)")
    if not isinstance(model, keras.Model):
        hint = (": load the file with keras.models.load_model first" if isinstance(model, (str, os.PathLike))
                else "")
        raise InvalidArgumentError(f"RematModel needs a keras.Model (or a compiled step), got "
                                   f"{type(model).__name__}{hint}")
    if strategy is not None and not isinstance(strategy, str):
        raise InvalidArgumentError(f"strategy must be a strategy name, got {type(strategy).__name__}")
    if compile_options is not None and not isinstance(compile_options, dict):
        raise InvalidArgumentError(f"compile_options must be a dict of checkmate.tf2.compile options, got "
                                   f"{type(compile_options).__name__}")


def _check_input_keys(model: Any, x: Any) -> None:
    """A model with named (dict) inputs given a batch without one of them: say which, in one line,
    before TensorFlow fails deep inside the step with a multi-line trace."""
    try:
        expected = model.input
    except (AttributeError, ValueError):  # a subclassed model: no declared input structure
        return
    if not isinstance(expected, dict):
        return
    if not isinstance(x, dict):
        raise InvalidArgumentError(f"the model takes a dict of inputs {sorted(expected)}; this batch's inputs are a "
                                   f"{type(x).__name__}")
    missing = sorted(set(expected) - set(x))
    if missing:
        raise InvalidArgumentError(f"this batch has no input {', '.join(map(repr, missing))}; the model takes "
                                   f"{sorted(expected)}")


# keras.Model.fit's arguments after ``verbose``, in order: fit() names positional ones by them.
FIT_ARGUMENTS = ("callbacks", "validation_split", "validation_data", "shuffle", "class_weight", "sample_weight",
                 "initial_epoch", "steps_per_epoch", "validation_steps", "validation_batch_size", "validation_freq")


def _task_fit_inputs(model: Any, x: Any, y: Any, batch_size: Any, epochs: int, kwargs: dict) -> tuple:
    """``fit``'s data as the wrapped model's own ``fit`` hands it to Keras: a KerasHub task batches
    array inputs itself and maps its preprocessing (its ``preprocessor``: tokenizing, packing, the
    labels and padding-mask weights of a language model) over every batch, training and validation;
    ``keras.Model.fit`` of the wrapper would train on the raw inputs, and slice arrays with another
    pipeline. Any other model's arguments are returned unchanged."""
    pipeline = _compat.keras_hub_pipeline(model)
    if pipeline is None:
        return x, y, batch_size, kwargs
    kwargs = dict(kwargs)
    sample_weight = kwargs.pop("sample_weight", None)
    validation_data = kwargs.get("validation_data")
    split = kwargs.pop("validation_split", None)
    if split and validation_data is None:
        (x, y, sample_weight), validation_data = pipeline._train_validation_split(
            (x, y, sample_weight), validation_split=split)
    preprocess = model.preprocess_samples
    x = pipeline._build_dataset(x, y, sample_weight, batch_size, preprocess)
    is_grain = getattr(pipeline, "_is_grain_dataset", lambda d: False)
    if validation_data is not None:
        if pipeline._is_tf_dataset(validation_data) or is_grain(validation_data):
            validation_data = pipeline._apply_preprocessing(validation_data, preprocess)
        else:
            vx, vy, vw = keras.utils.unpack_x_y_sample_weight(validation_data)
            validation_data = pipeline._build_dataset(vx, vy, vw, batch_size, preprocess)
        kwargs["validation_data"] = validation_data
    class_weight = kwargs.get("class_weight")
    if class_weight is not None and is_grain(x) and hasattr(pipeline, "_apply_class_weight"):
        # Keras' grain adapter refuses class_weight: it is folded into the samples' weights, as the task's fit does
        import functools

        x = x.map(functools.partial(pipeline._apply_class_weight, class_weight))
        kwargs.pop("class_weight")
    declare = getattr(pipeline, "_declare_steps", None)
    if declare is not None:
        # a grain dataset's length told to Keras up front (one iterator across the epochs)
        x, steps, _ = declare(x, kwargs.get("steps_per_epoch"), epochs)
        if steps is not None:
            kwargs["steps_per_epoch"] = steps
        if kwargs.get("validation_data") is not None:
            kwargs["validation_data"], steps, _ = declare(kwargs["validation_data"], kwargs.get("validation_steps"),
                                                          epochs)
            if steps is not None:
                kwargs["validation_steps"] = steps
    return x, None, None, kwargs


# What RematModel's step-time report measures against (MeasuredTime.reference)
KERAS_REFERENCE = "Keras' own train step (keras.Model.train_step in Keras' train function)"


def measure_against_keras(trainer: "StepTrainer", data: Any, repeats: int = STEP_TIME_REPORT_REPEATS):
    """:class:`~checkmate.tf2.timing.MeasuredTime` of ``trainer``'s train function (what its ``fit`` runs
    per batch) against the train function plain Keras ``fit`` runs for the same model, loss, optimizer
    and metrics (``keras.Model.train_step``: forward, loss, ``tf.GradientTape``, optimizer update,
    metrics), both taking ``data`` (one batch ``(x, y, sample_weight)``) from a ``tf.data`` iterator,
    interleaved (:func:`~checkmate.tf2.timing.interleaved_times`). The model's, the optimizer's and the
    metrics' variables are put back afterwards: the measurement trains nothing."""
    import functools

    from checkmate.tf2.timing import MeasuredTime, interleaved_samples, preserved_state

    def source():
        return iter(tf.data.Dataset.from_tensors(data).repeat())

    ours = trainer.make_train_function()
    # Keras' own train step of this model (a RematModel's call() is the wrapped model's), in the train
    # function Keras' fit makes around it
    keras_step = _compat.keras_train_function(trainer, functools.partial(keras.Model.train_step, trainer))
    batches = {"ours": source(), "keras": source()}
    fns = [lambda: ours(batches["ours"]), lambda: keras_step(batches["keras"])]
    # the plain traced gradients of the same batch, in the same rounds: their share of Keras' step is
    # the part the predicted overhead applies to (MeasuredTime.expected_ratio)
    metric_variables = [v for m in trainer.metrics for v in m.variables]
    with preserved_state(trainer.inner.variables, trainer.optimizer.variables, metric_variables):
        gradients = _plain_gradients_call(trainer, data)
        if gradients is not None:
            fns.append(gradients)
        wall_samples, cpu_samples = interleaved_samples(fns, repeats=repeats, min_repeats=STEP_TIME_REPORT_MIN_REPEATS,
                                                        max_seconds=STEP_TIME_REPORT_MAX_S)
    walls = [float(np.median(w)) for w in wall_samples]
    cpus = [float(np.median(c)) for c in cpu_samples]
    (remat_s, plain_s), (remat_cpu, plain_cpu) = walls[:2], cpus[:2]
    return MeasuredTime(step_seconds=remat_s, plain_seconds=plain_s, repeats=len(wall_samples[0]),
                        cpu_ratio=remat_cpu / plain_cpu if plain_cpu > 0 else None, reference=KERAS_REFERENCE,
                        gradient_seconds=walls[2] if gradients is not None else None)


def _plain_gradients_call(trainer: "StepTrainer", data: Any):
    """A call of the plain traced step's gradients (Grappler on) on the batch ``data`` as the trainer's
    compiled step takes it, run once; or None where the batch is not the compiled step's size (a step
    serving a smaller batch pads it) or the plain step does not take it."""
    from checkmate.tf2.timing import plain_gradients_function

    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    rows = tf.nest.flatten(x)[0].shape[0]
    step = trainer._step_for(rows)
    if step is None or rows != int(step.input_specs[0].shape[0]):
        return None
    try:
        weight = losses.step_weights(sample_weight, tf.shape(tf.nest.flatten(x)[0])[0])
        flat = step.function.flat_args(x, (y, weight))
        gradients = plain_gradients_function(step)
        gradients(*flat)        # a batch the plain step cannot take leaves the share unmeasured
    except (InvalidArgumentError, ValueError, TypeError, tf.errors.OpError) as exc:
        logging.getLogger("checkmate.tf2").info("checkmate: the plain gradients not timed on the first batch (%s)",
                                                str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
        return None
    return lambda: gradients(*flat)


class StepTimeReport(keras.callbacks.Callback):
    """After the first epoch of ``fit`` that trains a step not yet measured, measure the train function
    against the one plain Keras ``fit`` runs (:func:`measure_against_keras`, on the first training
    batch) and report the measured step-time ratio beside the predicted overhead: on the
    ``checkmate.tf2`` logger, and on stdout when ``fit`` is verbose. The result stays in
    ``step.measured`` (and in ``step.summary()``)."""

    def __init__(self, remat_model: Any, repeats: int = STEP_TIME_REPORT_REPEATS):
        super().__init__()
        self.remat_model = remat_model
        self.repeats = repeats
        self.reported = False

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if self.reported:
            return
        self.reported = True
        try:
            step = self.remat_model.compiled_step()
        except InvalidArgumentError:       # no batch was trained (an empty dataset)
            return
        if step.measured is not None:
            return          # measured once per compiled step, not at every fit() call
        if step.distribution is not None:
            logging.getLogger("checkmate.tf2").info(
                "checkmate: step time not measured under a tf.distribute strategy (predicted overhead %.3fx)",
                step.predicted.time_overhead)
            return
        data = self.remat_model._timing_batch
        measured = None
        if data is not None:
            try:
                measured = measure_against_keras(self.remat_model, data, self.repeats)
                step.measured = measured
            except tf.errors.ResourceExhaustedError as exc:
                self._not_measured(step, exc)
                return
            except (ValueError, TypeError, tf.errors.OpError) as exc:
                # Keras' own train step refuses some of what RematModel trains exactly (a per-sample
                # weight on a per-token loss compiled in the wrapper); the report must not stop fit()
                logging.getLogger("checkmate.tf2").info(
                    "checkmate: Keras' own train step could not run the first batch (%s); the step is timed "
                    "against the plain traced train step instead", str(exc).splitlines()[0][:200])
        if measured is None:        # also a wrapper of a step compiled beforehand
            try:
                measured = step.measure_time(repeats=self.repeats, gradients_only=False)
            except tf.errors.ResourceExhaustedError as exc:
                self._not_measured(step, exc)
                return
        line = (f"checkmate: step time {measured.ratio:.3f}x the plain step (predicted "
                f"{measured.describe_expected(step.predicted.time_overhead)}; {measured.describe()})")
        logging.getLogger("checkmate.tf2").info(line)
        if self.params.get("verbose", 1):
            print(line)

    def _not_measured(self, step: "CompiledStep", exc: Exception) -> None:
        # The plain step is what a model that needs rematerialization cannot run: out of device memory,
        # the report says so and fit() goes on with the compiled step (the variables are put back).
        line = (f"checkmate: step time not measured: the plain step does not fit in the device's memory "
                f"({str(exc).splitlines()[0][:200]}); predicted overhead {step.predicted.time_overhead:.3f}x")
        logging.getLogger("checkmate.tf2").info(line)
        if self.params.get("verbose", 1):
            print(line)


class StepTrainer(keras.Model):
    """The ``keras.Model`` that trains ``model`` with compiled steps, one per batch size (see
    :class:`~checkmate.tf2.keras_model.RematModel`): the base of ``RematModel``, which compiles them,
    and of :class:`~checkmate.tf2.step_model.CompiledStepModel`, which trains one compiled beforehand.
    A subclass says how a step is compiled (:meth:`_compile_step`)."""

    def __init__(self, model: Any = None, *, budget: Any = "auto", strategy: str | None = None,
                 compile_options: dict | None = None, partial_batches: str = "auto", plan: Any = None,
                 **kwargs: Any):
        _check_remat_arguments(model, strategy, compile_options)
        if model is None:
            raise InvalidArgumentError("RematModel needs a Keras model (or a compiled step)")
        check_no_custom_train_step(model)
        if partial_batches not in PARTIAL_BATCHES:
            raise InvalidArgumentError(f"partial_batches={partial_batches!r}: expected one of {', '.join(PARTIAL_BATCHES)}")
        check_budget_form(budget)
        distribution_strategy(model)
        kwargs.setdefault("name", f"{getattr(model, 'name', 'model')}_checkmate")
        super().__init__(**kwargs)
        self.inner = model
        self.budget = budget
        self.strategy = strategy
        self.compile_options = dict(compile_options or {})
        self.partial_batches = partial_batches
        # a plan file (checkmate compile --save-plan) for the first batch size: read now, so that a
        # missing or foreign file is named before training starts
        self.plan = None if plan is None else os.fspath(plan)
        self._plan_doc = None if plan is None else read_plan(plan)
        self._steps: dict = {}
        self._main_batch: int | None = None
        # the batch the first step was compiled for, (x, y, sample_weight): what the step-time report times
        self._timing_batch = None
        self._show_status = False      # fit() with verbose != 0 shows a status line while compiling
        if getattr(model, "built", False):
            # shares the built model's variables: save_weights and summary need no call first
            self.built = True

    # ------------------------------------------------------------------------------ Keras protocol
    def get_config(self) -> dict:
        return {"name": self.name, "model": keras.saving.serialize_keras_object(self.inner), "budget": self.budget,
                "strategy": self.strategy, "compile_options": dict(self.compile_options),
                "partial_batches": self.partial_batches, **({"plan": self.plan} if self.plan is not None else {})}

    @classmethod
    def from_config(cls, config: dict, custom_objects: Any = None) -> "StepTrainer":
        config = dict(config)
        model = keras.saving.deserialize_keras_object(config.pop("model"), custom_objects=custom_objects)
        if config.get("plan") is not None and not os.path.exists(config["plan"]):
            # the schedule cache usually has the step's schedule; else it is solved again
            _log.warning("%s: the plan %s is gone; the step is planned again", config.get("name"), config["plan"])
            config.pop("plan")
        # always the model form: a saved compiled-step wrapper comes back as a RematModel that
        # compiles its step again for the budget and strategy it was saved with. It is found by its
        # Keras registered name, as Keras finds every class of a saved file: this module cannot import
        # RematModel's, which imports the step module, which imports CompiledStepModel's and so this one.
        form = keras.saving.get_registered_object(MODEL_FORM_NAME)
        if form is None:
            raise InvalidArgumentError(f"loading {config.get('name', 'a checkmate model')} needs RematModel "
                                       "registered with Keras: import checkmate.tf2.keras_model first")
        return form(model, **config)

    def call(self, inputs, training=False):
        return self.inner(_compat.in_input_order(self.inner, inputs), training=training)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        """Keras' loss of a batch; the wrapped model's own ``compute_loss`` where it overrides Keras'
        (a loss that reads the inputs or calls sublayers again, as KerasHub's BASNet, RetinaNet and
        PARSeq tasks do), given this model's compiled loss for its ``super().compute_loss``. The
        rematerialized step differentiates this (:func:`checkmate.tf2.losses.step_loss`) and
        ``evaluate`` reports it, as the wrapped model's own ``fit`` and ``evaluate`` would."""
        if _compat.own_compute_loss(self.inner) is None:
            return super().compute_loss(x, y, y_pred, sample_weight, training=training)
        return _compat.call_compute_loss(self.inner, _compat.keras_compiled_loss(self), x, y, y_pred,
                                         sample_weight, training)

    @property
    def output_names(self):
        """The wrapped model's: ``compile`` names each output's loss and metrics after them, as Keras
        does for that model (``kind_loss``, ``val_kind_loss``)."""
        return getattr(self.inner, "output_names", None)

    def save_weights(self, filepath, overwrite=True, max_shard_size=None):
        """The wrapped model's weights, in the file ``model.save_weights`` writes (with the optimizer's
        state where a compiled model keeps it): ``model.load_weights`` reads it, and so does
        :meth:`load_weights` of a trainer of that model. Sharded files (``max_shard_size``) are Keras'
        own, of this trainer."""
        path = os.fspath(filepath)
        if max_shard_size is not None or not path.endswith(".weights.h5"):
            return super().save_weights(filepath, overwrite=overwrite, max_shard_size=max_shard_size)
        if not overwrite and os.path.exists(path):
            from keras.src.utils import io_utils

            if not io_utils.ask_to_proceed_with_overwrite(path):
                return None
        optimizer = getattr(self, "optimizer", None)
        _compat.save_weights_in_model_layout(self.inner, optimizer if getattr(optimizer, "built", False) else None,
                                             path)
        return None

    def load_weights(self, filepath, skip_mismatch=False, **kwargs):
        """Weights written by :meth:`save_weights` or by the wrapped model's own ``save_weights``
        (with the optimizer's state, where the file has it and the optimizer is built); a file of this
        trainer's own layout (an earlier version's, or sharded) is read as Keras reads it."""
        path = os.fspath(filepath)
        if kwargs or not path.endswith(".weights.h5") or "inner" in _compat.weights_file_groups(path):
            return super().load_weights(filepath, skip_mismatch=skip_mismatch, **kwargs)
        _compat.load_weights_in_model_layout(self.inner, getattr(self, "optimizer", None), path,
                                             skip_mismatch=skip_mismatch)
        return None

    def export(self, filepath, format="tf_saved_model", **kwargs):
        """Exports the wrapped model (inference is the model's own)."""
        return self.inner.export(filepath, format=format, **kwargs)

    def compile(self, optimizer: Any = None, loss: Any = None, **kwargs: Any):
        # XLA would re-schedule the step and undo the plan's order.
        kwargs["jit_compile"] = False
        if loss is None and optimizer is None and set(kwargs) <= {"jit_compile"}:
            # a compiled model (a KerasHub task compiles itself) lends its own compile() arguments
            kwargs = losses.compile_arguments_of(self.inner) or {}
            loss, optimizer = kwargs.pop("loss", None), kwargs.pop("optimizer", None)
            kwargs["jit_compile"] = False
        # checked now, with the model's outputs, rather than at the first batch; Keras' compiled
        # loss, which the step differentiates, applies them
        _loss_weight_lookup(kwargs.get("loss_weights"), self.inner)
        self._steps = {}
        self._main_batch = None
        self._timing_batch = None
        # Keras creates the loss tracker and the metrics here, and under a tf.distribute strategy they
        # must be that strategy's (one share per replica, summed when read): fit() compiles a model
        # built in the strategy's scope outside it when it adopts the wrapped model's compile(), and
        # plain variables there were updated by every replica in turn, so each batch's logs mixed
        # one replica's rows with the whole batch's.
        with self.distribute_strategy.scope():
            result = super().compile(optimizer=optimizer if optimizer is not None else "rmsprop", loss=loss,
                                     **kwargs)
        # empty metric lists (KerasHub's examples pass weighted_metrics=[]) report nothing in Keras' fit
        _compat.drop_empty_compiled_metrics(self)
        return result

    def get_compile_config(self) -> dict:
        config = super().get_compile_config()
        if config and getattr(self, "optimizer", None) is not None and \
                self.optimizer is getattr(self.inner, "optimizer", None):
            # The optimizer is the wrapped model's own (adopted from its compile(), or passed again):
            # Keras saves a shared object's state once, at its first path, the wrapped model's
            # (".../inner/optimizer"), and nothing at this model's. Loading must share it again so
            # that the state comes back (see compile_from_config).
            config = {**config, _SHARED_OPTIMIZER_KEY: True}
        return config

    def compile_from_config(self, config: dict) -> None:
        # Keras calls this (not compile()) when it loads a model whose compile() is its own
        config = dict(config)
        shared = bool(config.pop(_SHARED_OPTIMIZER_KEY, False))
        arguments = keras.saving.deserialize_keras_object(config)
        self.compile(**arguments)
        if shared:
            # the saved optimizer state lies at the wrapped model's path, which Keras loads into the
            # wrapped model's optimizer: make that this one (a KerasHub task, whose compile() Keras
            # does not call on load, would otherwise keep its constructor's default optimizer)
            self.inner.optimizer = self.optimizer
        if self.built and getattr(self, "optimizer", None) is not None and not self.optimizer.built:
            # Keras then restores the saved optimizer state into these variables (the slots of the
            # wrapped model's weights), as it does for a model of its own; unbuilt, it skips them.
            self.optimizer.build(self.trainable_variables)

    # ------------------------------------------------------------------------------ the step
    def compiled_step(self, x: Any = None, y: Any = None, sample_weight: Any = None) -> "CompiledStep":
        """The step compiled for the first training batch, or for the batch ``(x, y)`` (with its
        ``sample_weight``, of the shape ``fit`` will be given) if none is compiled yet (under a
        strategy, ``(x, y)`` is one replica's batch)."""
        if self._main_batch is None:
            if x is None:
                raise InvalidArgumentError("no step compiled yet: it is compiled at the first training batch")
            self._add_step(x, y, sample_weight)
        return self._steps[self._main_batch]

    @property
    def compiled_steps(self) -> dict:
        """The steps compiled so far, by the batch size (per replica) they were planned for."""
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
            if self._replicated_distribution() is None:
                self._timing_batch = (x, y) if sample_weight is None else (x, y, sample_weight)
        return step

    def _compile_step(self, x: Any, y: Any, batch: int, sample_weight: Any = None) -> "CompiledStep":
        """A step of ``batch`` rows for the batch ``(x, y)``: RematModel compiles one; the wrapper of a
        step compiled beforehand never needs another."""
        raise NotImplementedError(f"{type(self).__name__} does not compile steps")

    def _several_outputs(self) -> bool:
        return len(getattr(self.inner, "outputs", None) or []) > 1

    def _replicated_distribution(self) -> Any:
        """The model's ``tf.distribute`` strategy when it is one the step runs under (else ``None``)."""
        distribution = self.distribute_strategy
        if isinstance(distribution, (tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy)):
            return distribution
        return None

    def _replica_batches(self, data: Any) -> list[tuple[int, Any, Any, Any]]:
        """``(rows, x, y, sample_weight)`` of each local replica's part of one batch as ``fit`` hands it to the train
        function (distributed values: one part per replica; plain tensors: every replica gets them all)."""
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        distribution = self.distribute_strategy

        def parts(t):
            if isinstance(t, tf.distribute.DistributedValues):
                return list(distribution.experimental_local_results(t))
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
        _check_input_keys(self.inner, keras.utils.unpack_x_y_sample_weight(data)[0])
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
        # the step was compiled with predictions when metrics were compiled (compile() drops steps)
        loss, rows, pred = self._run_padded(x, y, sample_weight)
        _compat.keras_loss_tracker(self).update_state(_unscaled(loss), sample_weight=rows)
        metrics = _compat.has_compiled_metrics(self)
        if pred is None and (metrics or self._several_outputs()):
            # a step planned without the predictions (a plan file's, or predictions=False): an
            # inference-mode forward pass of the batch, after its update
            pred = self.inner(_compat.in_input_order(self.inner, x), training=False)
        if self._several_outputs():
            # each output's loss in the training logs, as Keras reports it ("<output>_loss"); the first
            # call builds those means, as Keras' own train step does in its first trace
            if _compat.own_compute_loss(self.inner) is not None:
                # the model's own compute_loss makes each output's targets from the labels (a
                # detector's boxes and classes): it updates those means, as in Keras' train step
                self.compute_loss(x, y, pred, sample_weight, training=True)
            else:
                _compat.update_output_losses(self, y, pred, sample_weight)
        if not metrics:
            return self.get_metrics_result()
        return self.compute_metrics(x, y, pred, sample_weight=sample_weight)

    def _run_padded(self, x, y, sample_weight):
        """One optimizer step on a replica batch with the step that serves its size (padded to it
        when smaller): its loss, its rows and the training forward pass's predictions of its rows."""
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
            # the padded rows' predictions dropped; a static row count keeps the static shape, by which
            # Keras weighs each output's loss mean
            keep = static if static is not None else rows
            pred = tf.nest.map_structure(lambda t: t[:keep], pred)
        return loss, rows, pred

    def fit(self, x=None, y=None, batch_size=None, epochs=1, verbose="auto", *args, **kwargs):
        """``keras.Model.fit``; the first batch compiles the step (per replica under a strategy). With
        ``verbose`` other than 0 (Keras' default is 1), compiling a step shows one status line
        (:class:`CompileStatus`). An uncompiled ``RematModel`` of a compiled model trains with that
        model's ``compile()`` arguments. A KerasHub task's data goes through the task's own
        preprocessing, as its ``fit`` does (raw text, labels and padding-mask weights from its
        ``preprocessor``)."""
        if not self.compiled and losses.compile_arguments_of(self.inner) is not None:
            self.compile()      # the wrapped model's own compile() arguments
        kwargs.update(zip(FIT_ARGUMENTS, args))
        x, y, batch_size, kwargs = _task_fit_inputs(self.inner, x, y, batch_size, epochs, kwargs)
        # the measured step time beside the predicted overhead, after the first epoch
        kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), StepTimeReport(self)]
        self._show_status = verbose != 0
        try:
            return super().fit(x, y, batch_size, epochs, verbose, **kwargs)
        finally:
            self._show_status = False

    def evaluate(self, x=None, y=None, batch_size=None, sample_weight=None, **kwargs):
        """``keras.Model.evaluate`` with this model's compiled loss and metrics; a KerasHub task's
        data goes through the task's preprocessing first, as its own ``evaluate`` does (``fit``'s
        validation data was prepared by ``fit``)."""
        pipeline = _compat.keras_hub_pipeline(self.inner)
        if pipeline is not None and not kwargs.get("_use_cached_eval_dataset", False):
            x = pipeline._build_dataset(x, y, sample_weight, batch_size, self.inner.preprocess_samples)
            declare = getattr(pipeline, "_declare_steps", None)
            if declare is not None:
                x, steps, _ = declare(x, kwargs.get("steps"))
                if steps is not None:
                    kwargs["steps"] = steps
            y = sample_weight = batch_size = None
        return super().evaluate(x=x, y=y, batch_size=batch_size, sample_weight=sample_weight, **kwargs)

    def predict(self, x=None, batch_size=None, **kwargs):
        """The wrapped model's own ``predict`` (inference runs the model unchanged; a KerasHub task
        preprocesses its inputs there)."""
        return self.inner.predict(x, batch_size=batch_size, **kwargs)

    def train_on_batch(self, x, y=None, sample_weight=None, **kwargs):
        """``keras.Model.train_on_batch``; a KerasHub task's batch goes through its preprocessing first."""
        if _compat.keras_hub_pipeline(self.inner) is not None:
            x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(self.inner.preprocess_samples(x, y, sample_weight))
        return super().train_on_batch(x, y, sample_weight=sample_weight, **kwargs)

    def make_train_function(self, force: bool = False):
        """The train function ``fit`` calls with its data iterator: it takes each batch eagerly,
        compiles a step for a replica batch size no compiled step serves (the first batch's, a
        remainder's: see the class docstring), then runs one ``tf.function`` traced per batch shape
        that runs :meth:`train_step` in each replica (``strategy.run``) and averages the replicas'
        metric results as Keras does. It runs with the same Grappler setting as the step, so that the
        plan's ordering edges survive."""
        if self.train_function is not None and not force:
            return self.train_function
        distribution = self.distribute_strategy

        def step_on_data(data):
            outputs = distribution.run(self.train_step, args=(data,))
            return tf.nest.map_structure(lambda v: distribution.reduce(tf.distribute.ReduceOp.MEAN, v, axis=None),
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
