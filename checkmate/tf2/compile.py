"""``checkmate.tf2.compile``: a Keras model + a memory budget -> a rematerializing training step.

Pipeline (DESIGN §1): :func:`checkmate.tf2.lowering.lower` traces the step and builds the graph,
:func:`checkmate.solve` finds a schedule within the budget (raising
:class:`~checkmate.errors.InfeasibleBudgetError` with the minimum feasible budget before anything
runs), :func:`checkmate.tf2.codegen.generate` emits the tf.function that executes it.

Keras integration: :meth:`CompiledStep.keras_model` (or :class:`RematModel`) wraps the model in a
``keras.Model`` whose ``train_step`` runs the compiled step, so ``model.fit`` trains with it.

Note: inside the package, the name ``checkmate.tf2.compile`` is the function (re-exported by
``checkmate.tf2``); reach this module with ``importlib.import_module("checkmate.tf2.compile")``.
"""

from __future__ import annotations

import json
import math
import sys
import time
import types
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import keras
import numpy as np
import tensorflow as tf

from checkmate.errors import InfeasibleBudgetError, InvalidArgumentError, InvalidBudgetError, SolverError
from checkmate.schedule import Schedule
from checkmate.simulate import simulate
from checkmate.solvers import SolveResult, format_bytes, get_strategy, parse_budget, solve
from checkmate.tf2 import _compat
from checkmate.tf2.codegen import RematFunction, generate
from checkmate.tf2.lowered import LoweredGraph
from checkmate.tf2.memory import available_device_memory, default_device, measure_step

__all__ = ["compile", "compile_lowered", "CompiledStep", "Prediction", "RematModel", "resolve_budget",
           "minimum_feasible_budget", "cli_compile"]


@dataclass(frozen=True)
class Prediction:
    """What the memory model and the cost model predict for the compiled step."""

    peak_memory_bytes: int          # simulated peak, fixed bytes (parameters, batch) included
    fixed_bytes: int                # graph.fixed_mem: resident before the step starts
    compute_cost: float             # cost of the schedule, in the graph's cost unit
    baseline_cost: float            # cost of computing every node once
    recompute_count: int            # node computations beyond the first
    budget_bytes: int

    @property
    def overhead(self) -> float:
        return self.compute_cost / self.baseline_cost if self.baseline_cost > 0 else 1.0

    @property
    def activation_peak_bytes(self) -> int:
        """The step's own peak (what :func:`checkmate.tf2.measure_peak_memory` measures)."""
        return self.peak_memory_bytes - self.fixed_bytes


def resolve_budget(budget: Any, graph, model: Any = None, device: str | None = None) -> int:
    """Bytes for ``budget``: an int, ``"2GiB"``, ``"60%"`` (of checkpoint-all's peak) or ``"auto"``.

    ``"auto"`` is the device's free memory (:func:`checkmate.tf2.memory.available_device_memory`) plus
    the bytes of the model's variables, which are already allocated and are part of the graph's
    fixed memory.
    """
    if isinstance(budget, str) and budget.strip().lower() == "auto":
        resident = 0
        for v in getattr(model, "variables", ()) if model is not None else ():
            resident += int(np.prod(v.shape, dtype=np.int64)) * tf.as_dtype(v.dtype).size
        return int(available_device_memory(device)) + int(resident)
    return parse_budget(budget, graph)


def _lower_bound_bytes(graph) -> int:
    """No schedule beats max_k (mem[k] + sum of k's inputs) + fixed bytes (DESIGN §3)."""
    return int(graph.fixed_mem) + max(int(graph.mem[k]) + sum(int(graph.mem[d]) for d in graph.deps[k])
                                      for k in range(graph.n))


def minimum_feasible_budget(graph, strategy: str, *, solver: str | None = None, time_limit_s: float | None = None,
                            rel_tol: float = 0.01, **options: Any) -> int:
    """The smallest budget at which ``strategy`` finds a schedule, within ``rel_tol`` (bisection).

    For a strategy that ignores the budget this is its own peak. For budget-aware ones the search
    runs between the lower bound of DESIGN §3 and checkpoint-all's peak.
    """
    from checkmate.solvers import checkpoint_all_peak

    hi = checkpoint_all_peak(graph)
    spec = get_strategy(strategy)
    if not spec.budget_aware:
        try:
            return int(solve(graph, hi * 64, strategy=strategy, solver=solver, time_limit_s=time_limit_s,
                             **options).peak_memory_bytes)
        except InfeasibleBudgetError as exc:
            if exc.min_feasible_budget_bytes is not None:
                return int(exc.min_feasible_budget_bytes)
            raise
    lo = _lower_bound_bytes(graph) - 1        # infeasible for every strategy
    best = None
    try:
        best = int(solve(graph, hi, strategy=strategy, solver=solver, time_limit_s=time_limit_s,
                         **options).peak_memory_bytes)
    except InfeasibleBudgetError:
        return hi
    hi = best
    while hi - lo > max(1, int(rel_tol * hi)):
        mid = (lo + hi) // 2
        try:
            r = solve(graph, mid, strategy=strategy, solver=solver, time_limit_s=time_limit_s, **options)
            hi = min(mid, int(r.peak_memory_bytes))
        except InfeasibleBudgetError:
            lo = mid
    return int(hi)


class CompiledStep:
    """A training step that executes a rematerialization schedule.

    ``step(x, y)`` runs one step and applies the optimizer, returning the loss;
    ``step.gradients(x, y)`` returns ``(loss, grads)`` without applying them (grads in
    ``model.trainable_variables`` order). ``x``/``y`` must have the shapes the step was compiled for.
    """

    def __init__(self, model: Any, loss: Any, optimizer: Any, lowered: LoweredGraph, result: SolveResult,
                 function: RematFunction):
        self.model = model
        self.loss = loss
        self.optimizer = optimizer
        self.lowered = lowered
        self.result = result
        self.function = function
        self.variables = list(lowered.variables) if lowered.variables else list(model.trainable_variables)
        sim = simulate(lowered.graph, result.schedule)
        self.predicted = Prediction(
            peak_memory_bytes=int(sim.peak_memory_bytes),
            fixed_bytes=int(lowered.graph.fixed_mem),
            compute_cost=float(sim.compute_cost),
            baseline_cost=float(lowered.graph.total_cost),
            recompute_count=int(sim.recompute_count),
            budget_bytes=int(result.budget_bytes),
        )
        self._train = None

    # ------------------------------------------------------------------------------ properties
    @property
    def schedule(self) -> Schedule:
        return self.result.schedule

    @property
    def graph(self):
        return self.lowered.graph

    @property
    def strategy(self) -> str:
        return self.result.strategy

    @property
    def input_specs(self) -> tuple:
        return self.function.input_specs

    # ------------------------------------------------------------------------------ running
    def gradients(self, x: Any, y: Any) -> tuple[tf.Tensor, list[tf.Tensor]]:
        """``(loss, grads)`` of one step on ``(x, y)``; no variable is updated except the step's own
        state (BatchNorm statistics, dropout seed), exactly as one plain step would."""
        return self.function(x, y)

    def plain_gradients(self, x: Any, y: Any) -> tuple[tf.Tensor, list[tf.Tensor]]:
        """The same step without rematerialization (the traced plain ``tf.function``)."""
        out = self.lowered.function(*self.function.flat_args(x, y))
        return out[0], list(out[1:])

    def _train_function(self):
        if self._train is None:
            if not getattr(self.optimizer, "built", True):
                self.optimizer.build(self.variables)
            remat = self.function.concrete_function
            variables = self.variables
            optimizer = self.optimizer

            def train(*flat):
                out = remat(*flat)
                optimizer.apply_gradients(zip(out[1:], variables))
                return out[0]

            self._train = tf.function(train, input_signature=self.function.input_specs, autograph=False)
        return self._train

    def train_flat(self, *flat):
        """One optimizer step on flat tensors; usable inside another ``tf.function`` (nested), in
        which case the caller runs under :func:`checkmate.tf2._compat.grappler_disabled`."""
        fn = self._train_function()
        if tf.executing_eagerly():
            with _compat.grappler_disabled():
                return fn(*flat)
        return fn(*flat)

    def __call__(self, x: Any, y: Any) -> tf.Tensor:
        return self.train_flat(*self.function.flat_args(x, y))

    # ------------------------------------------------------------------------------ Keras
    def keras_model(self, **kwargs: Any) -> "RematModel":
        """A compiled ``keras.Model`` whose ``fit`` trains with this step (see :class:`RematModel`)."""
        wrapper = RematModel(self, **kwargs)
        wrapper.compile(optimizer=self.optimizer)
        return wrapper

    # ------------------------------------------------------------------------------ reports
    def summary(self) -> str:
        g = self.graph
        p = self.predicted
        r = self.result
        lines = [
            f"checkmate step for {getattr(self.model, 'name', 'model')} ({self.lowered.level} level: "
            f"{g.n} nodes, {len(g.edges)} edges)",
            f"  strategy        {r.strategy}" + (f" (solver {r.solver})" if r.solver else "")
            + (", optimal" if r.optimal else ""),
            f"  budget          {format_bytes(p.budget_bytes)}",
            f"  predicted peak  {format_bytes(p.peak_memory_bytes)} (of which fixed {format_bytes(p.fixed_bytes)}, "
            f"step {format_bytes(p.activation_peak_bytes)})",
            f"  overhead        {p.overhead:.3f}x ({p.recompute_count} recomputations)",
            f"  op copies       {self.function.op_copies} (plain step: {sum(len(o) for o in self.lowered.node_ops)})",
            f"  solve time      {r.solve_seconds:.2f} s",
        ]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"CompiledStep(strategy={self.strategy!r}, nodes={self.graph.n}, "
                f"predicted_peak={self.predicted.peak_memory_bytes}, overhead={self.predicted.overhead:.3f})")


class RematModel(keras.Model):
    """``keras.Model`` wrapper whose ``train_step`` runs a :class:`CompiledStep`.

    It shares the wrapped model's layers and variables: ``fit`` trains the original model.
    Inference (``predict``, ``evaluate``, ``__call__``) runs the wrapped model unchanged. Batches
    must have the compiled batch size: batch a ``tf.data`` pipeline with ``drop_remainder=True``
    or give ``fit`` a sample count divisible by the batch size. The compiled step computes the
    loss it was compiled with; ``compile(loss=...)`` and sample weights are not used in training.
    """

    def __init__(self, step: CompiledStep, **kwargs: Any):
        kwargs.setdefault("name", f"{getattr(step.model, 'name', 'model')}_checkmate")
        super().__init__(**kwargs)
        self.step = step
        self.inner = step.model
        self.loss_tracker = keras.metrics.Mean(name="loss")

    @property
    def metrics(self):
        # The documented Keras idiom for a custom train_step: fit reports (and resets each epoch)
        # the metrics listed here.
        return [self.loss_tracker]

    def call(self, inputs, training=False):
        return self.inner(inputs, training=training)

    def compile(self, *args: Any, **kwargs: Any):
        # XLA would re-schedule the step and undo the plan's order.
        kwargs["jit_compile"] = False
        kwargs.setdefault("optimizer", self.step.optimizer)
        if kwargs["optimizer"] is not self.step.optimizer:
            raise InvalidArgumentError("RematModel trains with the optimizer given to checkmate.tf2.compile; "
                                       "pass that one (or none) to compile()")
        return super().compile(*args, **kwargs)

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        if sample_weight is not None:
            raise InvalidArgumentError("the compiled step does not take sample weights")
        flat = self.step.function.flat_args(x, y)
        flat = [tf.ensure_shape(t, spec.shape) for t, spec in zip(flat, self.step.input_specs)]
        loss = self.step.train_flat(*flat)
        self.loss_tracker.update_state(loss)
        return {"loss": self.loss_tracker.result()}

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


def compile_lowered(lowered: LoweredGraph, model: Any, loss: Any, optimizer: Any, *, budget: Any = "auto",
                    strategy: str = "checkmate_milp", solver: str | None = None, time_limit_s: float | None = None,
                    device: str | None = None, **solve_options: Any) -> CompiledStep:
    """Solve and generate for an already lowered step (lets callers reuse one lowering)."""
    budget_bytes = resolve_budget(budget, lowered.graph, model, device)
    try:
        result = solve(lowered.graph, budget_bytes, strategy=strategy, solver=solver, time_limit_s=time_limit_s,
                       **solve_options)
    except InfeasibleBudgetError as exc:
        minimum = exc.min_feasible_budget_bytes
        if minimum is None:
            minimum = minimum_feasible_budget(lowered.graph, strategy, solver=solver, time_limit_s=time_limit_s,
                                              **solve_options)
        raise InfeasibleBudgetError(
            f"{strategy}: no schedule of {lowered.graph.name} fits in {format_bytes(budget_bytes)} "
            f"({budget_bytes} bytes); minimum feasible budget: {format_bytes(minimum)} ({minimum} bytes)",
            budget_bytes=budget_bytes, min_feasible_budget_bytes=minimum, strategy=strategy) from exc
    if result.schedule is None:
        raise SolverError(f"{strategy} returned no schedule (status {result.status}); it only computes a bound")
    return CompiledStep(model, loss, optimizer, lowered, result, generate(lowered, result.schedule))


def compile(model: Any, loss: Any, optimizer: Any, input_spec: Any, label_spec: Any, *, budget: Any = "auto",
            strategy: str = "checkmate_milp", solver: str | None = None, level: str = "layer",
            time_limit_s: float | None = None, cost_model: str = "flops", device: str | None = None,
            **solve_options: Any) -> CompiledStep:
    """Compile ``model``'s training step to run within ``budget``.

    Parameters
    ----------
    model, loss, optimizer:
        A built Keras model, ``loss(y_true, y_pred)`` (or a Keras loss name), a Keras optimizer.
    input_spec, label_spec:
        ``tf.TensorSpec`` (or nests) with fixed shapes, batch dimension included.
    budget:
        Bytes, ``"2GiB"``, ``"1.5GB"``, ``"60%"`` (of the checkpoint-all peak) or ``"auto"`` (the
        device's free memory). Counts parameters and the batch (the graph's fixed memory).
    strategy, solver, time_limit_s:
        Passed to :func:`checkmate.solve`.
    level:
        ``"layer"`` or ``"op"`` granularity of the graph.

    Raises :class:`~checkmate.errors.InfeasibleBudgetError` (with ``min_feasible_budget_bytes``)
    before any step runs when nothing fits.
    """
    from checkmate.tf2.lowering import lower

    lowered = lower(model, loss, input_spec, label_spec, level=level, cost_model=cost_model)
    return compile_lowered(lowered, model, loss, optimizer, budget=budget, strategy=strategy, solver=solver,
                           time_limit_s=time_limit_s, device=device, **solve_options)


class _CallableModule(types.ModuleType):
    """Importing this module binds ``checkmate.tf2.compile`` to it (Python sets a package attribute
    per loaded submodule), shadowing the function of the same name; calling it compiles."""

    def __call__(self, *args: Any, **kwargs: Any) -> CompiledStep:
        return compile(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
