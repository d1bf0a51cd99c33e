"""``RematModel``: a ``keras.Model`` whose ``fit`` trains with a compiled rematerializing step.

It wraps a model and is compiled like any Keras model::

    trainer = checkmate.tf2.RematModel(model, budget="60%", strategy="checkmate_milp")
    trainer.compile(optimizer, loss, metrics=["accuracy"])
    trainer.fit(dataset, epochs=10)

It lowers and solves the step at the first training batch (its batch size, per replica under a
``tf.distribute`` strategy, is the compiled one), with sample weights as an input of the step; a
batch of another size is padded or gets a schedule of its own (``partial_batches``). Its train
function takes each batch eagerly to make that choice before the step is traced.

:class:`CompiledStepModel` (:meth:`checkmate.tf2.step.CompiledStep.keras_model`) wraps an already
compiled step instead (fixed batch size, no sample weights).

Keras' private attributes are reached through :mod:`checkmate.tf2._compat` only.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import keras
import tensorflow as tf

from checkmate.errors import InvalidArgumentError
from checkmate.tf2 import _compat, losses
from checkmate.tf2.lowering import training_loss
from checkmate.tf2.lowering.trace import distribution_strategy, walk_layers
from checkmate.tf2.plan_cache import PLAN_FIELD, read_plan

if TYPE_CHECKING:  # pragma: no cover
    from checkmate.tf2.step import CompiledStep

__all__ = ["RematModel", "CompiledStepModel", "check_no_custom_train_step", "check_budget_form", "PARTIAL_BATCHES", "FIRST_PLAN_TIME_LIMIT_S", "BATCH_STATISTICS_LAYERS",
           "has_batch_statistics"]

_log = logging.getLogger("checkmate.tf2")
# How RematModel trains a batch smaller than a compiled one (see its docstring): "pad" it to the
# compiled size, "compile" a schedule for its size, or "auto": compile when the model has a layer
# whose training forward pass mixes the rows of a batch, pad otherwise.
PARTIAL_BATCHES = ("auto", "pad", "compile")
# The solver's time limit for RematModel's steps (compile_options["time_limit_s"] overrides it): the
# first batch waits for the solve, and checkmate.tf2.compile's default limit (ten minutes) buys little
# more. strategy="auto" at 50% with this limit (2-core machine, shared; layer level, gradient nodes):
# a 146-node ViT 1.0903x in 20 s (the full solve: 1.0901x after 600 s; 10 s: 1.2334x); a 432-node ViT
# 1.0710x in 12 s (the full solve: the same in 16 s); an 848-node ViT 1.0764x in 18 s (1.0664x in 53 s).
FIRST_PLAN_TIME_LIMIT_S = 20.0
# Where the status line cannot be rewritten in place (a log file), a new line at most this often.
STATUS_LOG_EVERY_S = 10.0
# Keras layers whose training forward pass reads statistics of the whole batch, so that padded rows
# would change the real rows' outputs and the layer's moving statistics.
BATCH_STATISTICS_LAYERS = (keras.layers.BatchNormalization,)


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


class CompileStatus(logging.Handler):
    """One status line while ``fit`` compiles a step: what checkmate is doing (lowering, profiling,
    solving: its latest ``checkmate`` log message, which carries the best overhead and the bound as
    the solvers find them) and the time so far.

    It is written where Keras writes its progress bar (``sys.stdout``, which a notebook shows), and
    rewritten in place where Keras' bar is (a terminal or a notebook); elsewhere (a log file) a line
    is added when the message changes, at most every :data:`STATUS_LOG_EVERY_S`. The solvers' own
    logs are not shown (``compile_options={"verbose": 3}`` shows them).
    """

    REFRESH_S = 0.5

    def __init__(self, what: str, enabled: bool = True, stream: Any = None):
        super().__init__(level=logging.INFO)
        self.what = what
        self.enabled = enabled
        self.stream = stream
        self.message = "starting"
        self._start = time.perf_counter()
        self._width = 0
        self._last_written = -math.inf
        self._written_message = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        self._level = None

    @staticmethod
    def dynamic(stream: Any) -> bool:
        """Whether a line can be rewritten in place on ``stream`` (as Keras' progress bar decides)."""
        try:
            tty = bool(stream.isatty())
        except (AttributeError, ValueError):
            tty = False
        return tty or "ipykernel" in sys.modules

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = " ".join(record.getMessage().split())
        except Exception:  # noqa: BLE001 - a malformed record must not stop training
            return
        with self._lock:
            self.message = message
        self._draw()

    def _line(self) -> str:
        return f"checkmate: {self.what} | {time.perf_counter() - self._start:.0f} s | {self.message}"

    def _draw(self, final: str | None = None) -> None:
        with self._lock:
            stream = self.stream or sys.stdout
            line = final if final is not None else self._line()
            if self.dynamic(stream):
                # rewrite the line in place, blanking what a longer previous one left
                pad = max(self._width - len(line), 0)
                stream.write("\r" + line + " " * pad + ("\n" if final is not None else ""))
                self._width = 0 if final is not None else len(line)
            else:
                now = time.perf_counter()
                if final is None and (self.message == self._written_message
                                      or now - self._last_written < STATUS_LOG_EVERY_S):
                    return
                self._last_written, self._written_message = now, self.message
                stream.write(line + "\n")
            stream.flush()

    def _tick(self) -> None:
        while not self._stop.wait(self.REFRESH_S):
            if self.dynamic(self.stream or sys.stdout):
                self._draw()

    def __enter__(self) -> "CompileStatus":
        if not self.enabled:
            return self
        logger = logging.getLogger("checkmate")
        self._level = logger.level
        if logger.level == logging.NOTSET or logger.level > logging.INFO:
            logger.setLevel(logging.INFO)
        logger.addHandler(self)
        self._draw()
        self._thread = threading.Thread(target=self._tick, daemon=True, name="checkmate-status")
        self._thread.start()
        return self

    def done(self, text: str) -> None:
        """End the line with ``text`` (what was compiled, and how well)."""
        if self.enabled:
            self._stop.set()
            self._draw(final=f"checkmate: {text} ({time.perf_counter() - self._start:.0f} s)")
            self.enabled = False

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._level is not None:
            logger = logging.getLogger("checkmate")
            logger.removeHandler(self)
            logger.setLevel(self._level)
            self._level = None
        if self.enabled:
            # failed: leave the line as it stood, ended, so that the error prints below it
            self._draw(final=self._line())


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


def _check_remat_arguments(model: Any, strategy: Any, compile_options: Any, step_type: type) -> None:
    """RematModel's arguments, checked when it is made rather than at the first batch of ``fit``."""
    if model is None:
        raise InvalidArgumentError("RematModel needs a Keras model (or a compiled step)")
    if not isinstance(model, (keras.Model, step_type)):
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


@keras.saving.register_keras_serializable(package="checkmate")
class RematModel(keras.Model):
    """A ``keras.Model`` that trains ``model`` with a rematerializing step.

    ``RematModel(model, budget=..., strategy=..., compile_options=...)``: ``compile`` takes an optimizer,
    a loss (any ``keras.Model.compile`` loss) and metrics as in Keras, and the first training batch
    compiles the step (:func:`checkmate.tf2.compile` with ``budget``, ``strategy`` and
    ``compile_options``) for that batch size, solving within :data:`FIRST_PLAN_TIME_LIMIT_S` unless
    ``compile_options`` gives a ``time_limit_s``. It shares the model's layers and variables: ``fit`` trains the original model.
    Inference (``predict``, ``__call__``, ``evaluate``, ``export``) runs the model unchanged.

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
    - Schedules are solved once: a solved schedule is kept in the schedule cache
      (:mod:`checkmate.tf2.plan_cache`; ``compile_options={"schedule_cache": False}`` turns it off)
      and reused, after a replay check, by a rerun, a loaded model and an identical step.
      ``plan=path`` (``checkmate compile --save-plan``) trains the first batch size's step with that
      plan, without solving.
    - ``save``/``keras.saving.load_model``: the file holds the model, the options and the compile
      arguments; loading gives back a ``RematModel`` that compiles its step again at its first
      training batch (its schedule from the schedule cache when the device and budget are the same).
      ``save_weights`` and ``load_weights`` work on the model's weights.
    - ``tf.distribute``: built and compiled inside ``MirroredStrategy.scope()`` (or
      ``MultiWorkerMirroredStrategy``'s), ``fit`` compiles the step for the per-replica batch (the
      global batch divided by the replicas), every replica runs it on its share of each batch, and
      the optimizer sums the replicas' gradients and applies them once, as Keras' ``fit`` does.
      Other strategies are refused by name.

    ``RematModel(step)`` with a :class:`~checkmate.tf2.step.CompiledStep` builds a
    :class:`CompiledStepModel` (what :meth:`~checkmate.tf2.step.CompiledStep.keras_model` returns).

    A model that overrides ``train_step`` is refused (:func:`check_no_custom_train_step`).
    """

    def __new__(cls, model: Any = None, *args: Any, **kwargs: Any):
        # RematModel(step) has always wrapped an already compiled step: that is a class of its own,
        # picked here so that the public constructor keeps both forms.
        if cls is RematModel and _is_compiled_step(model):
            cls = CompiledStepModel
        return super().__new__(cls, model, *args, **kwargs)

    def __init__(self, model: Any = None, *, budget: Any = "auto", strategy: str | None = None,
                 compile_options: dict | None = None, partial_batches: str = "auto", plan: Any = None,
                 **kwargs: Any):
        from checkmate.tf2.step import CompiledStep

        _check_remat_arguments(model, strategy, compile_options, CompiledStep)
        if model is None:
            raise InvalidArgumentError("RematModel needs a Keras model (or a compiled step)")
        if _is_compiled_step(model):
            raise InvalidArgumentError("RematModel wraps a Keras model; a compiled step is wrapped by "
                                       "CompiledStep.keras_model() (CompiledStepModel)")
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
    def from_config(cls, config: dict, custom_objects: Any = None) -> "RematModel":
        config = dict(config)
        model = keras.saving.deserialize_keras_object(config.pop("model"), custom_objects=custom_objects)
        if config.get("plan") is not None and not os.path.exists(config["plan"]):
            # the schedule cache usually has the step's schedule; else it is solved again
            _log.warning("%s: the plan %s is gone; the step is planned again", config.get("name"), config["plan"])
            config.pop("plan")
        # always the model form: a saved compiled-step wrapper comes back as a RematModel that
        # compiles its step again for the budget and strategy it was saved with
        return RematModel(model, **config)

    def call(self, inputs, training=False):
        return self.inner(inputs, training=training)

    @property
    def output_names(self):
        """The wrapped model's: ``compile`` names each output's loss and metrics after them, as Keras
        does for that model (``kind_loss``, ``val_kind_loss``)."""
        return getattr(self.inner, "output_names", None)

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
        return super().compile(optimizer=optimizer if optimizer is not None else "rmsprop", loss=loss,
                               **kwargs)

    def compile_from_config(self, config: dict) -> None:
        # Keras calls this (not compile()) when it loads a model whose compile() is its own
        self.compile(**keras.saving.deserialize_keras_object(config))
        if self.built and getattr(self, "optimizer", None) is not None and not self.optimizer.built:
            # Keras then restores the saved optimizer state into these variables (the slots of the
            # wrapped model's weights), as it does for a model of its own; unbuilt, it skips them.
            self.optimizer.build(self.trainable_variables)

    # ------------------------------------------------------------------------------ the step
    def compiled_step(self, x: Any = None, y: Any = None) -> "CompiledStep":
        """The step compiled for the first training batch, or for the batch ``(x, y)`` if none is
        compiled yet (under a strategy, ``(x, y)`` is one replica's batch)."""
        if self._main_batch is None:
            if x is None:
                raise InvalidArgumentError("no step compiled yet: it is compiled at the first training batch")
            self._add_step(x, y)
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
        return step

    def _compile_step(self, x: Any, y: Any, batch: int, sample_weight: Any = None) -> "CompiledStep":
        from checkmate.tf2.step import compile as compile_step

        if getattr(self, "optimizer", None) is None or self.loss is None:
            raise InvalidArgumentError("compile the RematModel with an optimizer and a loss before fit()")
        input_spec = tf.nest.map_structure(lambda t: _spec(t, batch), x)
        label_spec = (tf.nest.map_structure(lambda t: _spec(t, batch), y), losses.weight_spec(sample_weight, batch))
        options = dict(self.compile_options)
        options.setdefault("time_limit_s", FIRST_PLAN_TIME_LIMIT_S)
        # training metrics and, for several outputs, each output's loss are computed as Keras does, from
        # the training forward pass's predictions
        options.setdefault("predictions", _compat.has_compiled_metrics(self) or self._several_outputs())
        if self._plan_doc is not None and self._main_batch is None:
            # the plan was made for a step with or without the predictions as an output: that step
            # (without them, training metrics come from an inference pass; see train_step)
            options["plan"] = self.plan
            planned = self._plan_doc[PLAN_FIELD].get("predictions")
            if isinstance(planned, bool):
                options["predictions"] = planned
        if self.strategy is not None:
            options["strategy"] = self.strategy
        distribution = self._replicated_distribution()
        _log.info("compiling the rematerialized step of %s for batches of %d%s", self.inner.name, batch,
                  f" per replica ({distribution.num_replicas_in_sync} replicas)" if distribution is not None else "")
        status = CompileStatus(f"planning {self.inner.name} for batches of {batch}", enabled=self._show_status)
        if status.enabled:
            options.setdefault("progress", False)     # the solvers' own line would compete with this one
        # the lowering traces one replica's step under the model's tf.distribute strategy (see
        # distribution_strategy)
        with status, distribution.scope() if distribution is not None else contextlib.nullcontext():
            step = compile_step(self.inner, losses.step_loss(self), self.optimizer,
                                input_spec, label_spec, budget=self.budget, **options)
            status.done(f"{self.inner.name} planned for batches of {batch}: overhead {step.predicted.overhead:.3f}x, "
                        f"{step.strategy}" + (", optimal" if step.result.optimal else ""))
        return step

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
            pred = self.inner(x, training=False)
        if self._several_outputs():
            # each output's loss in the training logs, as Keras reports it ("<output>_loss"); the first
            # call builds those means, as Keras' own train step does in its first trace
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
        model's ``compile()`` arguments."""
        from checkmate.tf2.measure import StepTimeReport

        if not self.compiled and losses.compile_arguments_of(self.inner) is not None:
            self.compile()      # the wrapped model's own compile() arguments
        # the measured step time beside the predicted overhead, after the first epoch
        kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), StepTimeReport(self)]
        self._show_status = verbose != 0
        try:
            return super().fit(x, y, batch_size, epochs, verbose, *args, **kwargs)
        finally:
            self._show_status = False

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


def _is_compiled_step(value: Any) -> bool:
    from checkmate.tf2.step import CompiledStep

    return isinstance(value, CompiledStep)


@keras.saving.register_keras_serializable(package="checkmate")
class CompiledStepModel(RematModel):
    """A ``keras.Model`` whose ``fit`` trains with one already compiled step
    (:meth:`checkmate.tf2.step.CompiledStep.keras_model`, or ``RematModel(step)``).

    The loss and optimizer are the step's, batches must have its (global) batch size, and sample
    weights are refused. Training metrics come from the training forward pass for a step compiled with
    ``predictions=True``, else from an inference-mode forward pass after the update. Saved and loaded,
    it comes back as a :class:`RematModel` for the step's budget in bytes and its strategy.
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
        self.loss_tracker.update_state(_unscaled(training_loss(self.inner, self.step.loss, y, pred)))
        return self.compute_metrics(x, y, pred)
