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
import os
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
from checkmate.solvers.minimum_budget import strategy_minimum_budget as minimum_feasible_budget
from checkmate.tf2 import _compat
from checkmate.tf2.codegen import RematFunction, generate
from checkmate.tf2.lowered import LoweredGraph
from checkmate.tf2.lowering import lower, training_loss
from checkmate.tf2.memory import available_device_memory, default_device, measure_step

__all__ = ["compile", "compile_lowered", "CompiledStep", "Prediction", "predicted_step_peak", "accounting",
           "RematModel", "resolve_budget", "minimum_feasible_budget", "cli_compile", "compare_strategies",
           "max_gradient_difference", "measure_step", "random_batch"]


@dataclass(frozen=True)
class Prediction:
    """What the memory model and the cost model predict for the compiled step."""

    peak_memory_bytes: int          # simulated peak, fixed bytes included (the number the budget bounds)
    fixed_bytes: int                # graph.fixed_mem
    resident_bytes: int             # part of fixed_bytes resident before the step runs (parameters, batch)
    compute_cost: float             # cost of the schedule, in the graph's cost unit
    baseline_cost: float            # cost of computing every node once
    recompute_count: int            # node computations beyond the first
    budget_bytes: int

    @property
    def overhead(self) -> float:
        return self.compute_cost / self.baseline_cost if self.baseline_cost > 0 else 1.0

    @property
    def step_peak_bytes(self) -> int:
        """Predicted peak of what the step allocates on top of the resident bytes: the quantity
        :func:`checkmate.tf2.measure_peak_memory` measures (activations, gradients, temporaries)."""
        return self.peak_memory_bytes - self.resident_bytes


def predicted_step_peak(lowered: LoweredGraph, schedule: Schedule) -> int:
    """Simulated peak minus the bytes resident before the step (parameters and batch).

    The parameter gradients are produced by the step, so they stay in this figure: with gradient
    nodes (and at op level) from the moment their output nodes are computed; in the compact
    layer-level accounting for the whole step, as part of ``fixed_mem`` (which then exceeds
    ``metadata["parameter_and_batch_bytes"]`` by ``metadata["grad_bytes"]``).
    """
    peak = simulate(lowered.graph, schedule).peak_memory_bytes
    return int(peak - _resident_bytes(lowered))


def _resident_bytes(lowered: LoweredGraph) -> int:
    return int(lowered.metadata.get("parameter_and_batch_bytes", lowered.graph.fixed_mem))


def accounting(lowered: LoweredGraph) -> str:
    """How the lowered graph accounts for the parameter gradients, in words (for reports)."""
    if lowered.level == "op":
        return "op level: gradients are output nodes"
    if lowered.metadata.get("gradient_nodes"):
        return "gradient nodes: parameter gradients resident from when computed"
    return "compact: parameter gradients resident for the whole step"


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
            resident_bytes=_resident_bytes(lowered),
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
            f"  accounting      {accounting(self.lowered)}",
            f"  strategy        {r.strategy}" + (f" (solver {r.solver})" if r.solver else "")
            + (", optimal" if r.optimal else ""),
            f"  budget          {format_bytes(p.budget_bytes)}",
            f"  predicted peak  {format_bytes(p.peak_memory_bytes)} (parameters and batch "
            f"{format_bytes(p.resident_bytes)}, step {format_bytes(p.step_peak_bytes)})",
            f"  overhead        {p.overhead:.3f}x ({p.recompute_count} recomputations)",
            f"  op copies       {self.function.op_copies} (plain step: {sum(len(o) for o in self.lowered.node_ops)})",
            f"  solve time      {r.solve_seconds:.2f} s",
        ]
        workspace = self.lowered.metadata.get("workspace_bytes") or ()
        if self.lowered.level == "layer" and workspace and max(workspace) > 0:
            # What a layer node allocates while it runs, beyond the tensors it passes on: not in the
            # plan (see README, "measure_peak_memory"). Shown so that a large one can be weighed.
            k = int(np.argmax(workspace))
            lines.append(f"  workspace       up to {format_bytes(workspace[k])} inside one node ({g.names[k]}), "
                         "not in the plan; level='op' plans it")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"CompiledStep(strategy={self.strategy!r}, nodes={self.graph.n}, "
                f"predicted_peak={self.predicted.peak_memory_bytes}, overhead={self.predicted.overhead:.3f})")


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
            gradient_nodes: bool | str = "auto", time_limit_s: float | None = None, cost_model: str = "flops",
            device: str | None = None, **solve_options: Any) -> CompiledStep:
    """Compile ``model``'s training step to run within ``budget``.

    Parameters
    ----------
    model, loss, optimizer:
        A Keras model (one that was never called is built by calling it once on a zero sample), a
        Keras optimizer and ``loss(y_true, y_pred)`` or a Keras loss name; for several outputs also
        a list of losses (``None`` for an output without one) or a dict keyed by output names,
        summed as ``keras.Model.compile`` sums them. The model's own losses (regularizers) are added.
    input_spec, label_spec:
        ``tf.TensorSpec`` (or nests) with fixed shapes, batch dimension included.
    budget:
        Bytes, ``"2GiB"``, ``"1.5GB"``, ``"60%"`` (of the checkpoint-all peak) or ``"auto"`` (the
        device's free memory). Counts parameters and the batch (the graph's fixed memory).
    strategy, solver, time_limit_s:
        Passed to :func:`checkmate.solve`.
    level:
        ``"layer"`` or ``"op"`` granularity of the graph.
    gradient_nodes:
        Layer level: ``"auto"`` (default) lowers the compact graph (one forward and one backward node
        per layer, parameter gradients resident for the whole step) and, when it has at most
        :data:`checkmate.tf2.lowering.AUTO_GRADIENT_NODES_MAX_NODES` nodes, the finer graph with
        the parameter gradients in output nodes of their own instead: ~1.65x the nodes (a slower
        MILP, still practical at that size), for a predicted peak that follows the measured one.
        ``True``/``False`` force one of them (see :mod:`checkmate.tf2.lowering`).
        :meth:`CompiledStep.summary` says which one was used.

    Raises :class:`~checkmate.errors.InfeasibleBudgetError` (with ``min_feasible_budget_bytes``)
    before any step runs when nothing fits.
    """
    lowered = lower(model, loss, input_spec, label_spec, level=level, gradient_nodes=gradient_nodes,
                    cost_model=cost_model)
    return compile_lowered(lowered, model, loss, optimizer, budget=budget, strategy=strategy, solver=solver,
                           time_limit_s=time_limit_s, device=device, **solve_options)



# ------------------------------------------------------------------------------------ measuring
def _state_variables(model: Any) -> list:
    """Variables a training step updates besides the parameters (BatchNorm statistics, dropout seeds)."""
    return list(getattr(model, "non_trainable_variables", ()))


def _snapshot(variables: Sequence[Any]) -> list:
    return [tf.identity(v) for v in variables]


def _restore(variables: Sequence[Any], values: Sequence[Any]) -> None:
    for v, value in zip(variables, values):
        v.assign(value)


def max_gradient_difference(step: CompiledStep, x: Any, y: Any) -> tuple[float, float]:
    """(max abs, relative) difference of loss and gradients between the compiled and the plain step
    on the same batch, each run from the same state (dropout seed, BatchNorm statistics), which is
    restored afterwards. Relative: the max abs difference over all tensors divided by the largest
    magnitude among the plain step's loss and gradients (a per-tensor ratio is meaningless for
    gradients that are zero up to rounding, such as a bias followed by BatchNorm).

    The plain step runs here with Grappler off, as the compiled step always does, so that the
    difference is the rematerialization's alone. Grappler's fused kernels round differently, and an
    ill-conditioned model amplifies that: on ResNet50 at 32x32 with batch 2 (BatchNorm over two
    values per channel), the plain step with and without Grappler differ by more than the largest
    gradient, while the compiled step equals the plain one without Grappler bit for bit."""
    state = _state_variables(step.model)
    before = _snapshot(state)
    with _compat.grappler_disabled():
        plain_loss, plain_grads = step.plain_gradients(x, y)
    _restore(state, before)
    loss, grads = step.gradients(x, y)
    _restore(state, before)
    worst = scale = 0.0
    for a, b in zip([loss, *grads], [plain_loss, *plain_grads]):
        a64, b64 = tf.cast(a, tf.float64), tf.cast(b, tf.float64)
        worst = max(worst, float(tf.reduce_max(tf.abs(a64 - b64))))
        scale = max(scale, float(tf.reduce_max(tf.abs(b64))))
    return worst, (worst / scale if scale > 0 else worst)


def time_step_s(fn: Any, *args: Any, steps: int = 3) -> float:
    """Median wall time of ``fn(*args)`` over ``steps`` calls, after one warm-up call."""
    def run():
        out = fn(*args)
        # Wait for the values: eager calls may return before a GPU has finished.
        for t in tf.nest.flatten(out)[:1]:
            t.numpy()

    run()
    times = []
    for _ in range(max(1, steps)):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def random_batch(lowered: LoweredGraph, model: Any, seed: int = 0) -> tuple[list, list]:
    """A batch for the lowered step: normal features and labels valid for the model's logits."""
    graph = lowered.function.graph
    rng = np.random.default_rng(seed)
    classes = None
    try:
        classes = int(model.outputs[0].shape[-1])
    except (AttributeError, IndexError, TypeError, ValueError):
        classes = None

    def value(name: str, label: bool):
        t = graph.get_operation_by_name(name).outputs[0]
        shape = tuple(int(d) for d in t.shape)
        if t.dtype.is_integer:
            high = classes if (label and classes) else 2
            return tf.constant(rng.integers(0, high, size=shape), dtype=t.dtype)
        return tf.constant(rng.standard_normal(shape), dtype=t.dtype)

    return ([value(n, False) for n in lowered.input_names], [value(n, True) for n in lowered.label_names])


def measure_plain(lowered: LoweredGraph, flat: Sequence[Any], *, steps: int = 3, device: str | None = None) -> dict:
    """Measured peak and median step time of the plain step, with checkpoint-all's predicted peak."""
    from checkmate.solvers import checkpoint_all_peak

    fn = lowered.function
    return {"measured_peak_bytes": measure_step(fn, *flat, device=device or default_device()).peak_bytes,
            "step_seconds": time_step_s(fn, *flat, steps=steps),
            "predicted_peak_bytes": checkpoint_all_peak(lowered.graph) - _resident_bytes(lowered)}


DEFAULT_CLI_STRATEGIES = ("checkpoint_all", "chen_sqrtn", "checkmate_milp")


def compare_strategies(lowered: LoweredGraph, model: Any, loss: Any, strategies: Sequence[str], budget: Any, *,
                       solver: str | None = None, time_limit_s: float | None = None, steps: int = 3,
                       optimizer: Any = None, plain: dict | None = None) -> dict:
    """Compile ``lowered`` with each strategy and measure it against the plain step (the demo's view).

    Returns ``{"plain": {...}, "rows": [{...} per strategy]}`` with predicted and measured peaks (step
    peaks: bytes allocated on top of the resident parameters and batch), predicted overhead,
    measured step time and its ratio to the plain step's, and the max gradient difference.
    """
    x, y = random_batch(lowered, model)
    flat = x + y
    device = default_device()
    resident = _resident_bytes(lowered)
    if plain is None:
        plain = measure_plain(lowered, flat, steps=steps, device=device)
    plain_peak = plain["measured_peak_bytes"]
    plain_time = plain["step_seconds"]
    rows = []
    for name in strategies:
        row: dict[str, Any] = {"strategy": name}
        try:
            step = compile_lowered(lowered, model, loss, optimizer, budget=budget, strategy=name, solver=solver,
                                   time_limit_s=time_limit_s, device=device)
        except InfeasibleBudgetError as exc:
            row.update(status="infeasible", min_feasible_budget_bytes=exc.min_feasible_budget_bytes,
                       budget_bytes=exc.budget_bytes)
            rows.append(row)
            continue
        except SolverError as exc:
            row.update(status=f"solver failed: {exc}")
            rows.append(row)
            continue
        fn = step.function.call_flat
        measured = measure_step(fn, *flat, device=device).peak_bytes
        seconds = time_step_s(fn, *flat, steps=steps)
        diff_abs, diff_rel = max_gradient_difference(step, x, y)
        row.update(
            status="ok", budget_bytes=step.predicted.budget_bytes,
            predicted_peak_bytes=step.predicted.step_peak_bytes,
            predicted_total_peak_bytes=step.predicted.peak_memory_bytes,
            measured_peak_bytes=measured,
            measured_over_predicted=measured / step.predicted.step_peak_bytes
            if step.predicted.step_peak_bytes > 0 else None,
            measured_over_plain=measured / plain_peak if plain_peak > 0 else None,
            predicted_overhead=step.predicted.overhead, step_seconds=seconds,
            time_over_plain=seconds / plain_time if plain_time > 0 else None,
            max_grad_diff=diff_abs, max_grad_rel_diff=diff_rel,
            recomputations=step.predicted.recompute_count, op_copies=step.function.op_copies,
            solve_seconds=step.result.solve_seconds, optimal=step.result.optimal,
        )
        rows.append(row)
    return {"graph": lowered.graph.name, "level": lowered.level, "nodes": lowered.graph.n,
            "gradient_nodes": bool(lowered.metadata.get("gradient_nodes")), "accounting": accounting(lowered),
            "device": device,
            "resident_bytes": resident, "plain": plain, "rows": rows}


def allocator_note(device: str) -> str | None:
    """A caveat about the CPU allocator's statistics, or None when the allocator counts every
    allocation (the BFC allocator, on CPU or GPU)."""
    if not device.upper().startswith("CPU") or os.environ.get("TF_CPU_ALLOCATOR_USE_BFC", "").lower() in ("1", "true"):
        return None
    return ("TF's default CPU allocator counts only allocations of 256 KiB or more; TF_CPU_ALLOCATOR_USE_BFC=true "
            "(the default of checkmate compile and max-batch) counts every one")


def cli_compile(args: Any) -> int:
    """``checkmate compile``: lower a zoo model, profile, solve, generate, run and report per strategy."""
    from checkmate.cli import _stdout_to_stderr
    from checkmate.tf2 import zoo

    strategies = ([s.strip() for s in args.strategy.split(",") if s.strip()] if args.strategy
                  else list(DEFAULT_CLI_STRATEGIES))
    for name in strategies:
        get_strategy(name)
    # --json promises one JSON object on stdout; solver libraries print banners to fd 1.
    with _stdout_to_stderr(args.json):
        built = zoo.build_model(args.model, args.batch_size, args.input_shape)
        lowered = lower(built.model, built.loss, built.input_spec, built.label_spec, level=args.level,
                        gradient_nodes="auto", cost_model="profile", progress=False)
        report = compare_strategies(lowered, built.model, built.loss, strategies, args.budget, solver=args.solver,
                                    time_limit_s=args.time_limit, steps=args.steps)
    report["model"] = args.model
    report["batch_size"] = args.batch_size
    report["allocator_note"] = allocator_note(report["device"])
    if args.json:
        print(json.dumps(report))
        return _compile_exit_code(report["rows"])
    plain = report["plain"]
    print(f"{args.model} (batch {args.batch_size}, {report['level']} level, {report['nodes']} nodes) on "
          f"{report['device']}; parameters and batch {format_bytes(report['resident_bytes'])} not counted below")
    print(f"accounting: {report['accounting']}")
    print(f"plain step: measured peak {format_bytes(plain['measured_peak_bytes'])} (checkpoint-all predicted "
          f"{format_bytes(plain['predicted_peak_bytes'])}), {plain['step_seconds'] * 1e3:.1f} ms")
    if report["allocator_note"]:
        print(f"note: {report['allocator_note']}")
    header = (f"{'strategy':<22} {'pred. peak':>11} {'meas. peak':>11} {'meas/pred':>9} {'pred. ovh':>9} "
              f"{'time/plain':>10} {'max |dgrad|':>11}")
    print(header)
    for row in report["rows"]:
        if row["status"] == "infeasible":
            print(f"{row['strategy']:<22} does not fit: needs {format_bytes(row['min_feasible_budget_bytes'])}")
            continue
        if row["status"] != "ok":
            print(f"{row['strategy']:<22} {row['status']}")
            continue
        ratio = f"{row['measured_over_predicted']:.2f}" if row["measured_over_predicted"] is not None else "-"
        print(f"{row['strategy']:<22} {format_bytes(row['predicted_peak_bytes']):>11} "
              f"{format_bytes(row['measured_peak_bytes']):>11} {ratio:>9} {row['predicted_overhead']:>8.2f}x "
              f"{row['time_over_plain']:>9.2f}x {row['max_grad_diff']:>11.2e}")
    return _compile_exit_code(report["rows"])


def _compile_exit_code(rows: list[dict]) -> int:
    """0 when some strategy ran; else 3 if every strategy was infeasible (naming the least budget any
    of them needs), 4 if a solver failed: the CLI's exit-code contract."""
    if any(row["status"] == "ok" for row in rows):
        return 0
    needs = [row["min_feasible_budget_bytes"] for row in rows
             if row["status"] == "infeasible" and row.get("min_feasible_budget_bytes") is not None]
    if rows and all(row["status"] == "infeasible" for row in rows):
        least = f"; minimum feasible budget: {min(needs)} bytes" if needs else ""
        print(f"checkmate: infeasible budget: no strategy fits{least}", file=sys.stderr)
        return 3
    print("checkmate: solver failed: no strategy produced a schedule", file=sys.stderr)
    return 4


class _CallableModule(types.ModuleType):
    """Importing this module binds ``checkmate.tf2.compile`` to it (Python sets a package attribute
    per loaded submodule), shadowing the function of the same name; calling it compiles."""

    def __call__(self, *args: Any, **kwargs: Any) -> CompiledStep:
        return compile(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
