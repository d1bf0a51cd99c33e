"""``RematModel``: a ``keras.Model`` whose ``fit`` trains with a compiled rematerializing step.

It wraps a model and is compiled like any Keras model::

    trainer = checkmate.tf2.RematModel(model, budget="60%", strategy="checkmate_milp")
    trainer.compile(optimizer, loss, metrics=["accuracy"])
    trainer.fit(dataset, epochs=10)

It lowers and solves the step at the first training batch (its batch size, per replica under a
``tf.distribute`` strategy, is the compiled one), with sample weights as an input of the step; a
batch of another size is padded or gets a schedule of its own (``partial_batches``). Its train
function takes each batch eagerly to make that choice before the step is traced.

:class:`CompiledStepModel` (:meth:`checkmate.tf2.step.CompiledStep.keras_model`, defined in
:mod:`checkmate.tf2.step_model`) wraps an already compiled step instead (fixed batch size, no sample
weights); ``RematModel(step)`` builds one. What both share is :class:`checkmate.tf2.trainer.StepTrainer`.

Keras' private attributes are reached through :mod:`checkmate.tf2._compat` only.
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import keras
import tensorflow as tf

from checkmate.errors import InvalidArgumentError
from checkmate.tf2 import _compat, losses
from checkmate.tf2.plan_cache import PLAN_FIELD
from checkmate.tf2.step_model import CompiledStepModel
from checkmate.tf2.trainer import (BATCH_STATISTICS_LAYERS, PARTIAL_BATCHES, StepTrainer, _spec, check_budget_form,
                                   check_no_custom_train_step, has_batch_statistics)

if TYPE_CHECKING:  # pragma: no cover
    from checkmate.tf2.step import CompiledStep

__all__ = ["RematModel", "CompiledStepModel", "check_no_custom_train_step", "check_budget_form", "PARTIAL_BATCHES", "FIRST_PLAN_TIME_LIMIT_S", "FIRST_PLAN_MAX_TIME_LIMIT_S",
           "first_plan_time_limit_s", "BATCH_STATISTICS_LAYERS",
           "has_batch_statistics"]

_log = logging.getLogger("checkmate.tf2")
# RematModel's solve time limit on graphs of the flat MILP's size: the first batch waits for it, and
# longer limits bought little. Measured: experiments/results/README.md, section i.
FIRST_PLAN_TIME_LIMIT_S = 20.0
# Larger graphs get the limit in proportion to their nodes, up to this: the hierarchical plan needs
# CPU time in proportion to its segments before it has any plan at all, and auto returns as soon as
# its plan is close to the bound. On two cores shared with other work, ResNet50's 654 nodes got no
# hierarchical plan in 20 s (the Griewank baseline's 1.268x instead) and the 1.019x plan in 27 s.
# Measured: experiments/results/README.md, section i.
FIRST_PLAN_MAX_TIME_LIMIT_S = 60.0


def first_plan_time_limit_s(nodes: int) -> float:
    """RematModel's solve time limit for a lowered graph of ``nodes`` nodes: :data:`FIRST_PLAN_TIME_LIMIT_S`
    up to the flat MILP's size, then in proportion to the nodes, at most :data:`FIRST_PLAN_MAX_TIME_LIMIT_S`."""
    from checkmate.solvers.auto import AUTO_MILP_MAX_NODES

    scaled = FIRST_PLAN_TIME_LIMIT_S * max(int(nodes), 1) / AUTO_MILP_MAX_NODES
    return float(min(FIRST_PLAN_MAX_TIME_LIMIT_S, max(FIRST_PLAN_TIME_LIMIT_S, scaled)))
# Where the status line cannot be rewritten in place (a log file), a new line at most this often.
STATUS_LOG_EVERY_S = 10.0


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


@keras.saving.register_keras_serializable(package="checkmate")
class RematModel(StepTrainer):
    """A ``keras.Model`` that trains ``model`` with a rematerializing step.

    ``RematModel(model, budget=..., strategy=..., compile_options=...)``: ``compile`` takes an optimizer,
    a loss (any ``keras.Model.compile`` loss) and metrics as in Keras, and the first training batch
    compiles the step (:func:`checkmate.tf2.compile` with ``budget``, ``strategy`` and
    ``compile_options``) for that batch size, solving within :func:`first_plan_time_limit_s` of the
    lowered graph's size (20 s up to 160 nodes, at most 60 s) unless ``compile_options`` gives a
    ``time_limit_s``. It shares the model's layers and variables: ``fit`` trains the original model.
    Inference (``predict``, ``__call__``, ``evaluate``, ``export``) runs the model unchanged.

    - Sample weights and ``class_weight`` are honoured (an input of the compiled step).
    - A KerasHub task's ``fit`` data is prepared as the task's own ``fit`` prepares it: batched by the
      task's pipeline, its ``preprocessor`` (if any) mapped over every training and validation batch.
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
    That is a :class:`~checkmate.tf2.trainer.StepTrainer`, as ``RematModel`` is, not a ``RematModel``:
    ``isinstance(x, StepTrainer)`` holds for both.

    A model that overrides ``train_step`` is refused (:func:`check_no_custom_train_step`).
    """

    def __new__(cls, model: Any = None, *args: Any, **kwargs: Any):
        # RematModel(step) has always wrapped an already compiled step: that is a class of its own,
        # built here so that the public constructor keeps both forms (it is no RematModel, so Python
        # does not run RematModel.__init__ on it).
        if cls is RematModel and _is_compiled_step(model):
            return CompiledStepModel(model, *args, **kwargs)
        return super().__new__(cls, model, *args, **kwargs)

    def __init__(self, model: Any = None, *, budget: Any = "auto", strategy: str | None = None,
                 compile_options: dict | None = None, partial_batches: str = "auto", plan: Any = None,
                 **kwargs: Any):
        if _is_compiled_step(model):
            raise InvalidArgumentError("RematModel wraps a Keras model; a compiled step is wrapped by "
                                       "CompiledStep.keras_model() (CompiledStepModel)")
        super().__init__(model, budget=budget, strategy=strategy, compile_options=compile_options,
                         partial_batches=partial_batches, plan=plan, **kwargs)

    def _compile_step(self, x: Any, y: Any, batch: int, sample_weight: Any = None) -> "CompiledStep":
        from checkmate.tf2.step import compile as compile_step

        if getattr(self, "optimizer", None) is None or (self.loss is None and _compat.own_compute_loss(self.inner) is None):
            # (a model's own compute_loss may need no compiled loss, as in Keras)
            raise InvalidArgumentError("compile the RematModel with an optimizer and a loss before fit()")
        input_spec = tf.nest.map_structure(lambda t: _spec(t, batch), x)
        label_spec = (tf.nest.map_structure(lambda t: _spec(t, batch), y), losses.weight_spec(sample_weight, batch))
        options = dict(self.compile_options)
        options.setdefault("time_limit_s", first_plan_time_limit_s)   # resolved once the graph is lowered
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
            status.done(f"{self.inner.name} planned for batches of {batch}: overhead {step.predicted.time_overhead:.3f}x, "
                        f"{step.strategy}" + (", optimal" if step.result.optimal else ""))
        return step


def _is_compiled_step(value: Any) -> bool:
    from checkmate.tf2.step import CompiledStep

    return isinstance(value, CompiledStep)
