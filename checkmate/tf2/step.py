"""A Keras model + a memory budget -> a rematerializing training step (:func:`compile`, which the
package exports as ``checkmate.tf2.compile``).

Pipeline (docs/design.md §1): :func:`checkmate.tf2.lowering.lower` traces the step and builds the graph,
:func:`checkmate.solve` finds a schedule within the budget (raising
:class:`~checkmate.errors.InfeasibleBudgetError` with the minimum feasible budget before anything
runs), :func:`checkmate.tf2.codegen.generate` emits the tf.function that executes it. This module
owns :class:`CompiledStep`, its budget resolution and what the memory and cost models predict for it.

Keras integration: :meth:`CompiledStep.keras_model` (or :class:`checkmate.tf2.keras_model.RematModel`)
wraps the model in a ``keras.Model`` whose ``train_step`` runs the compiled step, so ``model.fit``
trains with it. Measuring a compiled step against the plain one: :mod:`checkmate.tf2.measure`.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from fractions import Fraction
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from checkmate.budgets import activation_reference, describe_fraction, is_relative_budget
from checkmate.errors import InfeasibleBudgetError, InvalidArgumentError, SolverError, TimeLimitError
from checkmate.logs import verbose_logging
from checkmate.schedule import Schedule
from checkmate.simulate import simulate
from checkmate.solvers import SolveResult, checkpoint_all_peak, format_bytes, parse_budget
from checkmate.solvers.minimum_budget import strategy_minimum_budget
from checkmate.tf2 import _compat
from checkmate.tf2.codegen import RematFunction, generate
from checkmate.tf2.lowered import LoweredGraph
from checkmate.tf2.lowering import lower
from checkmate.tf2.lowering.trace import distribution_name
from checkmate.tf2.plan_cache import solve_or_reuse
from checkmate.tf2.timing import MeasuredTime, measure_step_time
from checkmate.tf2.memory import available_device_memory, default_device

if TYPE_CHECKING:  # pragma: no cover
    from checkmate.tf2.step_model import CompiledStepModel

_log = logging.getLogger("checkmate.tf2")

__all__ = ["compile", "compile_lowered", "CompiledStep", "Prediction", "predicted_step_peak", "resident_bytes",
           "accounting", "resolve_budget", "resolve_budget_reported",
           "MeasuredTime", "cost_model_description", "price_in_place"]


@dataclass(frozen=True)
class Prediction:
    """What the memory model and the cost model predict for the compiled step."""

    peak_memory_bytes: int          # simulated peak, fixed bytes included (the number the budget bounds)
    fixed_bytes: int                # graph.fixed_mem
    resident_bytes: int             # part of fixed_bytes resident before the step runs (parameters, batch)
    compute_cost: float             # cost of the schedule, in the graph's cost unit
    baseline_cost: float            # cost of computing every node once
    recompute_count: int            # node computations beyond the first
    budget_bytes: int               # the budget as the user gave it, in bytes
    planned_budget_bytes: int | None = None   # what the schedule was planned for (allocator headroom)
    # 1 + the recomputed copies' time over the first copies' in the generated step's own trace
    # (price_in_place); None when not traced (FLOPs costs, nothing recomputed, no profiler)
    in_place_overhead: float | None = None

    @property
    def overhead(self) -> float:
        """The schedule's cost over computing every node once, at the costs the solver minimized."""
        return self.compute_cost / self.baseline_cost if self.baseline_cost > 0 else 1.0

    @property
    def time_overhead(self) -> float:
        """The step-time ratio predicted against the plain step: :attr:`in_place_overhead` where the
        recomputations were priced where they run, else :attr:`overhead`."""
        return self.in_place_overhead if self.in_place_overhead is not None else self.overhead

    @property
    def step_peak_bytes(self) -> int:
        """Predicted peak of what the step allocates on top of the resident bytes: the quantity
        :func:`checkmate.tf2.measure_peak_memory` measures (activations, gradients, temporaries)."""
        return self.peak_memory_bytes - self.resident_bytes


def cost_model_description(lowered: LoweredGraph) -> str:
    """Which cost model priced the nodes, in words (for reports)."""
    meta = lowered.metadata
    model = meta.get("cost_model", "flops")
    if model != "profile":
        return "FLOPs (analytic, from static shapes)"
    n = lowered.graph.n
    estimated = int(meta.get("profile_estimated", 0) or 0)
    hits = int(meta.get("profile_cache_hits", 0) or 0)
    share = float(meta.get("profile_measured_share", 1.0 if not estimated else 0.0))
    text = (f"profiled on {meta.get('device', 'this device').split(' | ')[0]} (us): {n - estimated} of {n} nodes "
            f"measured ({share:.1%} of the estimated cost)")
    if hits:
        text += f", {hits} from the cache"
    if estimated:
        text += f", {estimated} a calibrated FLOPs-and-bytes estimate"
    return text


def predicted_step_peak(lowered: LoweredGraph, schedule: Schedule) -> int:
    """Simulated peak minus the bytes resident before the step (parameters and batch).

    The parameter gradients are produced by the step, so they stay in this figure: with gradient
    nodes (and at op level) from the moment their output nodes are computed; in the compact
    layer-level accounting for the whole step, as part of ``fixed_mem`` (which then exceeds
    ``metadata["parameter_and_batch_bytes"]`` by ``metadata["grad_bytes"]``).
    """
    peak = simulate(lowered.graph, schedule).peak_memory_bytes
    return int(peak - resident_bytes(lowered))


def resident_bytes(lowered: LoweredGraph) -> int:
    """Bytes of the graph's fixed memory resident before the step runs: the parameters and the batch."""
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
    return resolve_budget_reported(budget, graph, model, device)[0]


def resolve_budget_reported(budget: Any, graph, model: Any = None, device: str | None = None) -> tuple[int, str]:
    """:func:`resolve_budget`'s bytes and what they were resolved from, in words: the reference of a
    percentage (checkpoint-all's peak) or of ``"auto"`` (the device and its free memory)."""
    if isinstance(budget, str) and budget.strip().lower() == "auto":
        resident = 0
        for v in getattr(model, "variables", ()) if model is not None else ():
            resident += int(np.prod(v.shape, dtype=np.int64)) * tf.as_dtype(v.dtype).size
        free = int(available_device_memory(device))
        total = free + int(resident)
        where = device or default_device()
        return total, (f"auto: {format_bytes(free)} free on {where} + {format_bytes(resident)} of model variables "
                       f"= {format_bytes(total)} ({total} bytes)")
    total = parse_budget(budget, graph)
    if is_relative_budget(budget) and "activation" in budget.lower():
        floor, activations = activation_reference(graph)
        return total, (f"{budget.strip()}: {format_bytes(floor)} that every schedule holds (parameters, batch, "
                       f"gradients, outputs) + {format_bytes(max(total - floor, 0))} (that share of the "
                       f"{format_bytes(activations)} of activations) = {format_bytes(total)} ({total} bytes)")
    if is_relative_budget(budget):
        reference = checkpoint_all_peak(graph)
        return total, (f"{budget.strip()} of checkpoint-all's peak {format_bytes(reference)} = {format_bytes(total)} "
                       f"({total} bytes)")
    return total, f"{format_bytes(total)} ({total} bytes)"


# split layers listed by CompiledStep.summary (the rest are counted)
_SUMMARY_SPLIT_LINES = 8


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
            resident_bytes=resident_bytes(lowered),
            compute_cost=float(sim.compute_cost),
            baseline_cost=float(lowered.graph.total_cost),
            recompute_count=int(sim.recompute_count),
            budget_bytes=int(result.budget_bytes),
        )
        self._train = None
        self.measured: "MeasuredTime | None" = None    # set by measure_time()
        # the largest measured step peak of the runs that checked the plan for a byte budget
        # (compile_lowered's verify_peak); None when the plan was not checked that way
        self.verified_step_peak_bytes: int | None = None
        # what the budget was resolved from (compile_lowered sets it; a budget in bytes says just that)
        self.budget_reference = f"{format_bytes(result.budget_bytes)} ({int(result.budget_bytes)} bytes)"

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

    @property
    def distribution(self) -> Any:
        """The ``tf.distribute`` strategy the step was compiled under (``None``: none)."""
        return self.lowered.distribution

    @property
    def replicas(self) -> int:
        return self.function.replicas

    # ------------------------------------------------------------------------------ running
    def gradients(self, x: Any, y: Any) -> tuple[tf.Tensor, list[tf.Tensor]]:
        """``(loss, grads)`` of one step on ``(x, y)``; no variable is updated except the step's own
        state (BatchNorm statistics, dropout seed), exactly as one plain step would.

        Under a strategy ``(x, y)`` is the global batch (``replicas`` times the compiled rows): each
        replica runs the plan on its slice, and the loss and gradients are the sums of the replicas'
        (each replica's loss being its share, as Keras scales it), i.e. what the optimizer applies.
        Every gradient is dense: a sliced one (an embedding's) is summed into its variable's shape."""
        return self.function(x, y)

    def plain_gradients(self, x: Any, y: Any) -> tuple[tf.Tensor, list[tf.Tensor]]:
        """The same step without rematerialization (the traced plain ``tf.function``)."""
        flat = self.function.flat_args(x, y)
        if self.distribution is not None:
            distribution = self.distribution

            def replica(*per_replica):
                # a replica's sliced gradient summed into its dense one before the replicas' sum
                loss, grads, _ = self.function.split(self.function.plain_replica_call(*per_replica))
                return (loss, *self.function.dense(grads))

            def run(*per_replica):
                out = distribution.run(replica, args=per_replica)
                return tuple(distribution.reduce(tf.distribute.ReduceOp.SUM, o, axis=None) for o in out)

            out = tf.function(run, autograph=False)(*self.function.distribute(flat))
            return out[0], list(out[1:])
        # the traced step takes (x, y) structured (dict inputs; labels with their sample weights)
        args, _ = self.lowered.function.structured_input_signature
        out = self.lowered.function(*tf.nest.pack_sequence_as(args, flat))
        loss, grads, _ = self.function.split(out)
        return loss, self.function.dense(grads)

    def _build_optimizer(self) -> None:
        if not getattr(self.optimizer, "built", True):
            if self.distribution is not None:
                with self.distribution.scope():      # its slots mirrored like the variables
                    self.optimizer.build(self.variables)
            else:
                self.optimizer.build(self.variables)

    def replica_train(self, *flat) -> tuple[tf.Tensor, Any]:
        """One replica's step inside a graph (a ``tf.function``, in ``strategy.run`` under a strategy):
        runs the plan on the replica's batch and applies the gradients with the optimizer, whose
        ``apply_gradients`` sums them over the replicas and updates once, as in Keras' ``train_step``
        (a gradient the tape gives as ``tf.IndexedSlices``, an untied embedding's, is applied as one).
        Returns the replica's loss (its share under a strategy) and the training forward pass's
        predictions (``None`` for a step compiled without them). The caller runs under
        :func:`checkmate.tf2._compat.grappler_disabled`; the optimizer is built (``fit`` builds it)."""
        loss, grads, preds = self.function.split(self.function.replica_call(*flat))
        self.optimizer.apply_gradients(zip(grads, self.variables))
        return loss, preds

    def replica_train_flat(self, *flat) -> tf.Tensor:
        """:meth:`replica_train`'s loss."""
        return self.replica_train(*flat)[0]

    def _train_function(self):
        """A ``tf.function`` of the flat batch returning ``(loss, *flat predictions)``."""
        if self._train is None:
            self._build_optimizer()
            if self.distribution is not None:
                distribution = self.distribution

                def train(*flat):
                    loss = distribution.run(self.replica_train_flat, args=flat)
                    return (distribution.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None),)

                self._train = tf.function(train, autograph=False)
                return self._train
            remat = self.function.concrete_function
            split = self.function.split
            variables = self.variables
            optimizer = self.optimizer

            def train(*flat):
                # a sliced gradient reaches the optimizer as tf.IndexedSlices, as in Keras' fit
                out = remat(*flat)
                loss, grads, preds = split(out)
                # The update waits for the step's call, and the outputs are new tensors: with the
                # call's outputs returned as they are, this function nested in another (RematModel's
                # train function) lost the step's own variable writes under Adam (a Dropout's seed
                # stayed put, every batch drew the same mask; SGD kept them).
                with tf.control_dependencies([out[0]]):
                    optimizer.apply_gradients(zip(grads, variables))
                    return tuple(tf.identity(t) for t in (loss, *(tf.nest.flatten(preds) if preds is not None else ())))

            self._train = tf.function(train, input_signature=self.function.input_specs, autograph=False)
        return self._train

    def _run_train(self, flat):
        fn = self._train_function()
        if self.distribution is not None:
            flat = self.function.distribute(flat)
        if tf.executing_eagerly():
            with _compat.grappler_disabled():
                return fn(*flat)
        return fn(*flat)

    def train_flat(self, *flat):
        """One optimizer step on flat tensors; usable inside another ``tf.function`` (nested), in
        which case the caller runs under :func:`checkmate.tf2._compat.grappler_disabled`. Under a
        strategy the tensors are the global batch (or values distributed per replica)."""
        return self._run_train(flat)[0]

    def train_flat_with_predictions(self, *flat) -> tuple[tf.Tensor, Any]:
        """:meth:`train_flat`, also returning the training forward pass's predictions in the model's
        output structure (a step compiled with ``predictions=True``; without a strategy: under one,
        each replica's come from :meth:`replica_train`)."""
        if self.distribution is not None:
            raise InvalidArgumentError("under a strategy each replica's predictions come from replica_train")
        out = self._run_train(flat)
        structure = self.lowered.pred_structure
        return out[0], (tf.nest.pack_sequence_as(structure, list(out[1:])) if structure is not None else None)

    def __call__(self, x: Any, y: Any) -> tf.Tensor:
        """One optimizer step on ``(x, y)``; returns the loss (under a strategy: of the global batch)."""
        return self.train_flat(*self.function.flat_args(x, y))

    def measure_time(self, x: Any = None, y: Any = None, *, repeats: int = 15,
                     gradients_only: bool = True) -> "MeasuredTime":
        """Time this step's gradients against the plain traced step's (``tf.GradientTape``, Grappler on,
        as users run it) on ``(x, y)`` (default: a random batch of the compiled shapes), interleaved in
        one process, median of ``repeats`` each after a warm-up call: the ratio the predicted overhead
        predicts. ``gradients_only=False`` times a whole training step instead (the gradients and the
        optimizer's update) against the plain traced step with the same update, which the update's
        time, the same in both, brings closer to 1. Kept in :attr:`measured` and shown by
        :meth:`summary`. The model's and the optimizer's variables are put back afterwards: measuring
        trains nothing."""
        self.measured = measure_step_time(self, x, y, repeats=repeats, gradients_only=gradients_only)
        return self.measured

    # ------------------------------------------------------------------------------ Keras
    def keras_model(self, **kwargs: Any) -> "CompiledStepModel":
        """A compiled ``keras.Model`` whose ``fit`` trains with this step (see
        :class:`~checkmate.tf2.step_model.CompiledStepModel`)."""
        # its module imports neither this one nor RematModel's (which compiles steps with this one)
        from checkmate.tf2.step_model import CompiledStepModel

        wrapper = CompiledStepModel(self, **kwargs)
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
            # a result that is not proven optimal says how far it may be off (time limit, gap)
            + (", optimal" if r.optimal else (f": {r.status}" if r.status and r.status != "ok" else "")),
            f"  budget          {self.budget_reference}"
            + (f" (planned for {format_bytes(p.planned_budget_bytes)}, leaving room for the allocator)"
               if p.planned_budget_bytes is not None and p.planned_budget_bytes != p.budget_bytes else "")
            + (f"; the step measured {format_bytes(self.verified_step_peak_bytes)} above the parameters and "
               f"batch ({format_bytes(p.budget_bytes - p.resident_bytes)} available)"
               if self.verified_step_peak_bytes is not None else ""),
            f"  predicted peak  {format_bytes(p.peak_memory_bytes)} (parameters and batch "
            f"{format_bytes(p.resident_bytes)}, step {format_bytes(p.step_peak_bytes)})",
            # The plan holds its tensors in every order the executor may pick, loaded or not; the
            # allocator's chunks round them up by an amount that depends on what ran before in the
            # process (experiments/results/peak_load.md): a byte budget is checked by running the step.
            *([] if self.verified_step_peak_bytes is not None else [
                "  allocator       the predicted peak counts tensors; a measured peak also counts the "
                "allocator's rounding of them to its chunks (not checked: a budget in bytes runs the step)"]),
            *([f"  kernels         {note}"] if (note := _kernels_note()) else []),
            f"  cost model      {cost_model_description(self.lowered)}",
            f"  overhead        {p.time_overhead:.3f}x predicted ({p.recompute_count} recomputations"
            + (f", priced where they run in the generated step; {p.overhead:.3f}x at the plain step's prices)"
               if p.in_place_overhead is not None else ")")
            + (f"; measured {self.measured.ratio:.3f}x the plain step ({self.measured.describe()})"
               + (f", where the prediction comes to {self.measured.describe_expected(p.time_overhead)}"
                  if self.measured.gradient_seconds is not None else "")
               if self.measured is not None else "; measured: not yet (step.measure_time())"),
            f"  op copies       {self.function.op_copies} (plain step: {sum(len(o) for o in self.lowered.node_ops)})",
            f"  order           {self.function.rewritten.describe_order()}",
            f"  solve time      {r.solve_seconds:.2f} s",
        ]
        if self.distribution is not None:
            rows = int(self.function.input_specs[0].shape[0])
            lines.insert(1, f"  replicas        {self.replicas} ({distribution_name(self.distribution)}): planned for one "
                            f"replica's batch of {rows} (global batch {rows * self.replicas}); every replica runs it")
        split_layers = self.lowered.metadata.get("split_layers") or ()
        if split_layers:
            # level="auto": what was looked into below one node per layer, and why
            shown = list(split_layers[:_SUMMARY_SPLIT_LINES])
            if len(split_layers) > len(shown):
                shown.append(f"... and {len(split_layers) - len(shown)} more")
            lines[1:1] = ["  split           " + (line if k == 0 else " " * 16 + line) for k, line in enumerate(shown)]
        if self.lowered.metadata.get("fused_batch_norm"):
            lines.insert(2, "  batch norm      TensorFlow's fused kernel (fused_batch_norm=True)")
        workspace = self.lowered.metadata.get("workspace_bytes") or ()
        if self.lowered.level != "op" and workspace and max(workspace) > 0:
            # What a layer node allocates while it runs, beyond the tensors it passes on: not in the
            # plan (see README, "measure_peak_memory"). Shown so that a large one can be weighed.
            k = int(np.argmax(workspace))
            lines.append(f"  workspace       up to {format_bytes(workspace[k])} inside one node ({g.names[k]}), "
                         "not in the plan; level='op' plans it")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"CompiledStep(strategy={self.strategy!r}, nodes={self.graph.n}, "
                f"predicted_peak={self.predicted.peak_memory_bytes}, overhead={self.predicted.time_overhead:.3f})")


def _kernels_note() -> str | None:
    """:func:`checkmate.kernels.onednn_note` for a step that runs on the CPU (no GPU visible)."""
    from checkmate.tf2.memory import onednn_note

    return None if tf.config.list_physical_devices("GPU") else onednn_note()


# A budget in bytes (or "auto") is a real memory limit, and the allocator rounds requests up to whole
# chunks that depend on the allocation history: measured over predicted step peaks run 0.92-1.18 on
# the five graphs of tests/tf2/test_memory_model.py, 0.92-1.03 on experiments/wall_clock.py's models
# at 100/70/50%, 1.13 on its residual MLP's checkpoint-all step and up to 1.27 on the test MLP's plans
# at 60%, where 1 MiB values land in the holes between 256 KiB weight gradients.
# Where the step can be measured, a plan for the whole budget is run and kept when it fits
# (compile_lowered's verify_peak); otherwise, and when it does not fit, the plan is made for this share
# less of the memory above the resident parameters and batch (or for what the measured step missed by,
# if more). A percentage budget is a fraction of the plan's own checkpoint-all peak, planned as given.
# Measured: experiments/results/README.md, section i.
ALLOCATOR_HEADROOM_FRACTION = 0.05
# Runs of a step planned for a byte budget before it is kept: the largest measured peak counts. The
# BFC allocator's chunks depend on the allocation history: the same step measured 23.7, 25.2 and
# 25.2 MiB in its first three runs after the warm-up. Measured: experiments/results/README.md, section i.
VERIFY_PEAK_REPEATS = 3
# Plans made and measured at most for one byte budget (the whole budget, then for what each measured
# step missed by, and once halfway back up after a plan that fits with room to spare): each is a
# solve, within the compile's time limit each. Measured: experiments/results/README.md, section i.
VERIFY_ROUNDS = 4
# The plans after the first share this fraction of one solve's time limit (compile's, or
# COMPILE_TIME_LIMIT_S) between them, each given at least VERIFY_MIN_SOLVE_S: checking a byte budget
# adds at most about half a solve to the compile, and the first plan keeps the whole limit.
VERIFY_EXTRA_SOLVE_SHARE = 0.5
VERIFY_MIN_SOLVE_S = 5.0
# compile()'s solve time when none is given: with lowering and code generation, compiling stays
# under five minutes; auto returns its best schedule so far and says how far from optimal it may be.
COMPILE_TIME_LIMIT_S = 150.0
# When the first plan finds no schedule at all within a default time limit (none given, or
# RematModel's by the graph's size), it is solved once more with this many times the limit, rather
# than refusing a budget that may fit: on two cores shared with other work, keras.applications
# EfficientNetV2S (1695 nodes, "50% activations") found none in RematModel's 60 s and a 1.019x plan in
# 66 s alone. A limit the caller gave is kept as given.
DEFAULT_LIMIT_RETRY_FACTOR = 2.0
# A first plan within a default limit of at most QUALITY_RETRY_MAX_LIMIT_S (RematModel's, by the
# graph's size) that costs over QUALITY_RETRY_MIN_OVERHEAD of the plain step and is over
# QUALITY_RETRY_MIN_GAP from its lower bound is solved once more with DEFAULT_LIMIT_RETRY_FACTOR times
# the limit, and the cheaper plan kept: on two cores, KerasHub RWKV-7's graph (1608 nodes) at 70% of
# checkpoint-all got 2.23x from auto within 60 s in one run (its time went to repairing the floor's
# schedules, leaving the refinement none; another run 1.16x) and 1.13x within 120 s, against a bound
# of 1.03x. Plans close to their bound, or cheap, never wait for a second solve; compile()'s own
# default (150 s) is not doubled.
QUALITY_RETRY_MIN_OVERHEAD = 1.25
QUALITY_RETRY_MIN_GAP = 0.2
QUALITY_RETRY_MAX_LIMIT_S = 60.0
# A plan that recomputes more than this many times the plain step's compute is kept (it fits the
# budget), with a warning that says what each step will cost: KerasHub PARSeq's loss, before its decoder
# calls were layer nodes, left auto only checkpoint_last_node at 70%, 421x.
SLOW_PLAN_WARN_OVERHEAD = 3.0


def _far_from_its_bound(result: SolveResult) -> bool:
    """A plan worth a second, longer solve: costly and far from its lower bound (see
    :data:`QUALITY_RETRY_MIN_GAP`)."""
    overhead, gap = result.overhead, result.gap
    return (result.schedule is not None and not result.optimal and overhead is not None and gap is not None
            and overhead > QUALITY_RETRY_MIN_OVERHEAD and gap > QUALITY_RETRY_MIN_GAP)


def _compile_default_time_limit_s(nodes: int) -> float:
    """:func:`compile`'s solve time limit when none is given: :data:`COMPILE_TIME_LIMIT_S` whatever the size."""
    return COMPILE_TIME_LIMIT_S


def planning_budget(budget: Any, budget_bytes: int, resident: int,
                    headroom: float = ALLOCATOR_HEADROOM_FRACTION) -> int:
    """The budget the schedule is planned for: ``budget_bytes`` less the allocator headroom on the part
    above the ``resident`` bytes, unless ``budget`` is a percentage."""
    if is_relative_budget(budget) or budget_bytes <= resident or headroom <= 0:
        return budget_bytes
    return resident + math.floor((budget_bytes - resident) * (1.0 - headroom))


def _user_budget_for(planned: int, resident: int, headroom: float) -> int:
    """The smallest budget in bytes whose planning budget is at least ``planned`` (the inverse of
    :func:`planning_budget` for budgets given in bytes, as a reported minimum is)."""
    if planned <= resident or headroom <= 0:
        return planned
    return resident + math.ceil((planned - resident) / (1.0 - headroom))


def _activation_share(budget_bytes: int, graph: Any, budget: Any) -> str:
    """``", or 63.2% of the activations"`` when the user's budget was a share of the activations (a
    relative budget is planned as given: the same share is the minimum to give)."""
    if isinstance(budget, str) and "activation" in budget:
        return ", or " + describe_fraction(budget_bytes, graph, budget).lstrip(", ")
    return ""


def _activation_budget_that_fits(planned_minimum: int, graph: Any, budget: Any) -> str:
    """``', or "43.5% activations"'``: the least budget in activations, to a tenth of a percent, that
    resolves to at least ``planned_minimum``, for a budget not given in activations (where the
    parameters and optimizer state are most of checkpoint-all's peak, a percentage of it says little of
    what recomputation can save); empty when the budget was given in activations or none fits."""
    from checkmate.budgets import activation_reference

    if isinstance(budget, str) and "activation" in budget:
        return ""
    floor, activations = activation_reference(graph)
    if activations <= 0:
        return ""
    tenths = max(0, math.ceil(Fraction((int(planned_minimum) - floor) * 1000, int(activations))))
    while tenths <= 1000 and parse_budget(f"{tenths / 10:g}% activations", graph) < planned_minimum:
        tenths += 1
    if tenths > 1000:
        return ""
    return f', or "{tenths / 10:g}% activations"'


def _share_that_fits(planned_minimum: int, graph) -> str:
    """The least percentage budget, to a tenth of a percent, that resolves to at least
    ``planned_minimum`` (a percentage is planned as given, without the allocator headroom)."""
    peak = checkpoint_all_peak(graph)
    if peak <= 0:
        return "100%"
    tenths = math.ceil(Fraction(int(planned_minimum) * 1000, int(peak)))
    return f"{tenths / 10:g}%"      # read back exactly (parse_budget reads decimals as fractions)


def _minimum_note(strategy: str) -> str:
    """What a stated minimum is for a strategy whose answer depends on its solver's time limit."""
    from checkmate.solvers.registry import get_strategy
    from checkmate.solvers.types import StrategyKind

    try:
        kind = get_strategy(strategy).kind
    except Exception:  # noqa: BLE001 - an unknown name was refused before solving
        return ""
    if kind == StrategyKind.SOLVER:
        return "; an upper bound: the least budget the solver found a schedule for (a smaller one may fit)"
    return ""


def _headroom_part(minimum: int, planned_minimum: int) -> str:
    """What a minimum in bytes holds besides the plan: the allocator's headroom (a percentage is
    planned as given, so the percentages beside it are of the plan alone)."""
    if minimum <= planned_minimum:
        return ""
    return f": a plan of {format_bytes(planned_minimum)} and the allocator's headroom"


def _floor_note(graph: Any, planned_minimum: int, strategy: str) -> str:
    """What is known of the minimum from below (:func:`checkmate.bounds.peak_floor`): that it is the
    least any schedule needs, or the least below which none fits; with, for a solving strategy whose
    minimum is above that, :func:`_minimum_note`."""
    from checkmate.bounds import peak_floor

    floor, node = peak_floor(graph)
    where = (f"when {graph.names[node]} first runs, it, its inputs, the outputs so far and the values that "
             "cannot be recomputed are resident")
    if floor >= planned_minimum:
        return f"; no schedule fits in less ({where})"
    return (f"{_minimum_note(strategy)}; none fits in less than {_share_that_fits(floor, graph)} of "
            f"checkpoint-all's peak ({where})")


def _measurable(lowered: LoweredGraph, device: str | None) -> str | None:
    """The device on which a compiled step's peak can be checked by running it, or None: steps under a
    ``tf.distribute`` strategy and TF's default CPU allocator (which does not count allocations under
    256 KiB) are not checked."""
    from checkmate.tf2.memory import counts_every_allocation

    if lowered.distribution is not None:
        return None
    device = device or default_device()
    return device if counts_every_allocation(device) else None


def _measured_step_peak(step: "CompiledStep", device: str) -> int:
    """The largest step peak (bytes above the resident parameters and batch) over
    :data:`VERIFY_PEAK_REPEATS` runs of ``step.gradients`` on a random batch of its shapes, after a
    warm-up run. The model's state variables (BatchNorm statistics, seeds) are restored afterwards."""
    from checkmate.tf2.memory import measure_step
    from checkmate.tf2.timing import _restore, _snapshot, _state_variables, random_batch

    x, y = random_batch(step.lowered, step.model)
    state = _state_variables(step.model)
    before = _snapshot(state)
    try:
        # through step.gradients, as a user (or a test) measures the step
        return int(measure_step(step.gradients, x, y, device=device, repeats=VERIFY_PEAK_REPEATS,
                                reduce="max").peak_bytes)
    finally:
        _restore(state, before)


def price_in_place(step: "CompiledStep", runs: int | None = None) -> float | None:
    """Price ``step``'s recomputations where they run: its generated function traced for ``runs``
    runs (default :data:`checkmate.tf2.profiling.IN_PLACE_RUNS`) on a random batch of its shapes, and
    :attr:`Prediction.in_place_overhead` set to one plus the recomputed copies' time over the first
    copies' (:func:`checkmate.tf2.profiling.in_place_share`). Returns it, or None (and leaves the
    prediction as it is) where there is nothing to price: FLOPs costs, nothing recomputed, a
    ``tf.distribute`` strategy, or a profiler that cannot run. The model's state variables
    (BatchNorm statistics, seeds) are put back afterwards.

    The profile prices every node by its time in the plain step. A recomputed copy runs in the
    backward pass, beside backward ops that leave a core idle, and took 0.63-0.91 of that price in
    the plans of one trace on two CPU cores (experiments/results/wall_clock_fid8_copies.md): a
    transformer's plan at 1.145x at the plain step's prices was 1.099x priced in place and measured
    1.085x (wall_clock_fid9.md). The solver still minimizes the plain step's prices
    (:attr:`Prediction.overhead`)."""
    from checkmate.tf2 import profiling
    from checkmate.tf2.codegen import IMPORT_SCOPE, copy_name
    from checkmate.tf2.timing import _restore, _snapshot, _state_variables, random_batch

    lowered = step.lowered
    if (lowered.metadata.get("cost_model") != "profile" or step.predicted.recompute_count <= 0
            or lowered.distribution is not None):
        return None
    counts = np.asarray(step.schedule.recompute.sum(axis=0), dtype=int)
    concrete = step.function.concrete_function
    names = {op.name for op in concrete.graph.get_operations()}
    first, copies = [], []
    for i, ops in enumerate(lowered.node_ops):
        for k in range(int(counts[i])):
            group = [n for n in (f"{IMPORT_SCOPE}/{copy_name(op, k)}" for op in ops) if n in names]
            if group:
                (first if k == 0 else copies).append(group)
    if not copies:
        return None

    class _Flat:        # the generated function on flat tensors, with the op names of its graph
        graph = concrete.graph

        def __call__(self, *flat):
            return step.function.call_flat(*flat)

    x, y = random_batch(lowered, step.model)
    flat = step.function.flat_args(x, y)
    state = _state_variables(step.model)
    before = _snapshot(state)
    started = time.perf_counter()
    try:
        share = profiling.in_place_share(_Flat(), flat, first, copies,
                                         runs=profiling.IN_PLACE_RUNS if runs is None else runs)
    except (RuntimeError, tf.errors.OpError) as exc:   # the profiler cannot start (one already running)
        _log.info("recomputations not priced in place: %s", str(exc).splitlines()[0][:200] if str(exc) else exc)
        return None
    finally:
        _restore(state, before)
    if share is None:
        return None
    step.predicted = replace(step.predicted, in_place_overhead=1.0 + share)
    _log.info("recomputations priced in place in %.1f s: %.3fx (%.3fx at the plain step's prices)",
              time.perf_counter() - started, 1.0 + share, step.predicted.overhead)
    return 1.0 + share


def compile_lowered(lowered: LoweredGraph, model: Any, loss: Any, optimizer: Any, *, budget: Any = "auto",
                    strategy: str = "auto", solver: str | None = None, time_limit_s: Any = None,
                    device: str | None = None, allocator_headroom: float = ALLOCATOR_HEADROOM_FRACTION,
                    verify_peak: bool = True, plan: Any = None, schedule_cache: Any = None,
                    in_place: bool = True, **solve_options: Any) -> CompiledStep:
    """Solve and generate for an already lowered step (lets callers reuse one lowering).

    With ``in_place`` (default) and profiled costs, the step's recomputations are then priced where
    they run (:func:`price_in_place`: a few traced runs of the generated step), and the predicted
    step-time ratio (:attr:`Prediction.time_overhead`) is that price.

    ``plan`` (a plan file from ``checkmate compile --save-plan``) is trained with instead of solving,
    once it is checked to replay on this graph within the budget. Otherwise a solved schedule is
    stored in the schedule cache and reused for the same graph, budget, strategy and device
    (``schedule_cache``: ``False`` turns it off, a path moves it; see :mod:`checkmate.tf2.plan_cache`).

    A budget in bytes or ``"auto"`` is a real memory limit. With ``verify_peak`` (default) and a
    device whose allocator counts every allocation (a GPU, or the CPU with
    ``TF_CPU_ALLOCATOR_USE_BFC=true``), the schedule is planned for the whole budget and its step is
    run (:data:`VERIFY_PEAK_REPEATS` times on a random batch, state restored): it is kept when its
    largest measured peak fits the budget. When it does not, the next plan is made for the peak that
    leaves as much room as that step's measurement exceeded its prediction by, and at least
    ``allocator_headroom`` (a fraction of the memory above the resident parameters and batch), and
    measured in turn; after one that fits with more than ``allocator_headroom`` of the budget unused,
    one more plan halfway back to the one that measured over, the cheaper that fits kept. At most
    :data:`VERIFY_ROUNDS` plans are made (each a solve); when none fits, the headroom plan is made if
    none was (the budget is refused when it cannot be, as without the check), and the plan that
    measured least is kept with a warning. When the step cannot be measured, the schedule is planned with ``allocator_headroom`` left
    to the allocator's rounding. A percentage is planned as given.
    ``min_feasible_budget_bytes`` of an :class:`InfeasibleBudgetError` is in the user's terms:
    compiling with it succeeds.
    """
    step = _compile_plan(lowered, model, loss, optimizer, budget=budget, strategy=strategy, solver=solver,
                         time_limit_s=time_limit_s, device=device, allocator_headroom=allocator_headroom,
                         verify_peak=verify_peak, plan=plan, schedule_cache=schedule_cache, **solve_options)
    if in_place:
        price_in_place(step)
    return step


def _compile_plan(lowered: LoweredGraph, model: Any, loss: Any, optimizer: Any, *, budget: Any,
                  strategy: str, solver: str | None, time_limit_s: Any, device: str | None,
                  allocator_headroom: float, verify_peak: bool, plan: Any, schedule_cache: Any,
                  **solve_options: Any) -> CompiledStep:
    """:func:`compile_lowered` before its recomputations are priced in place."""
    budget_bytes, reference = resolve_budget_reported(budget, lowered.graph, model, device)
    resident = resident_bytes(lowered)
    planned = planning_budget(budget, budget_bytes, resident, allocator_headroom)
    _log.info("budget %s", reference)
    measure_on = _measurable(lowered, device) if verify_peak and plan is None and planned != budget_bytes else None

    # the plans after the first share VERIFY_EXTRA_SOLVE_SHARE of one solve's limit between them, so
    # that checking a byte budget adds a bounded time to the compile
    default_limit = time_limit_s is None or callable(time_limit_s)
    if callable(time_limit_s):
        # a limit that depends on the graph's size (RematModel's), known only now that it is lowered
        time_limit_s = float(time_limit_s(lowered.graph.n))
        _log.info("solve time limit for %d nodes: %.0f s", lowered.graph.n, time_limit_s)
    one_limit_s = COMPILE_TIME_LIMIT_S if time_limit_s is None else float(time_limit_s)
    extra_deadline = [None]

    def solve_for(target: int, note: str) -> SolveResult:
        _log.info("solving %s (%d nodes) with %s for %s%s", lowered.graph.name, lowered.graph.n, strategy,
                  format_bytes(target), note)
        started = time.perf_counter()
        limit_s = time_limit_s
        first = extra_deadline[0] is None
        if extra_deadline[0] is None:
            extra_deadline[0] = math.inf           # the first plan gets the whole limit
        else:
            if extra_deadline[0] == math.inf:
                extra_deadline[0] = started + VERIFY_EXTRA_SOLVE_SHARE * one_limit_s
            limit_s = max(VERIFY_MIN_SOLVE_S, min(one_limit_s, extra_deadline[0] - started))
        retried = False
        try:
            try:
                result = solve_or_reuse(lowered.graph, target, strategy=strategy, solver=solver,
                                        time_limit_s=limit_s, plan=plan, schedule_cache=schedule_cache,
                                        **solve_options)
            except TimeLimitError as exc:
                if not (default_limit and first):
                    raise
                retried = True
                retry_s = DEFAULT_LIMIT_RETRY_FACTOR * one_limit_s
                _log.warning("no schedule found within the default time limit of %.0f s (%s); solving once "
                             "more with %.0f s (pass time_limit_s to choose)", one_limit_s, exc, retry_s)
                result = solve_or_reuse(lowered.graph, target, strategy=strategy, solver=solver,
                                        time_limit_s=retry_s, plan=plan, schedule_cache=schedule_cache,
                                        **solve_options)
            if (default_limit and first and not retried and plan is None and one_limit_s <= QUALITY_RETRY_MAX_LIMIT_S
                    and _far_from_its_bound(result)):
                retry_s = DEFAULT_LIMIT_RETRY_FACTOR * one_limit_s
                _log.warning("the plan found within the default time limit of %.0f s costs %.2fx, only within %.0f%% "
                             "of its lower bound; solving once more with %.0f s (pass time_limit_s to choose)",
                             one_limit_s, result.overhead, 100 * result.gap, retry_s)
                try:
                    again = solve_or_reuse(lowered.graph, target, strategy=strategy, solver=solver,
                                           time_limit_s=retry_s, plan=plan, schedule_cache=schedule_cache,
                                           **solve_options)
                except (TimeLimitError, InfeasibleBudgetError, SolverError) as exc:
                    _log.info("the second solve found no cheaper plan (%s)", exc)
                else:
                    if again.schedule is not None and again.compute_cost < result.compute_cost:
                        result = again
        except InfeasibleBudgetError as exc:
            minimum = exc.min_feasible_budget_bytes
            if minimum is None:
                minimum = strategy_minimum_budget(lowered.graph, strategy, solver=solver, time_limit_s=time_limit_s,
                                                   **solve_options)
            planned_minimum = int(minimum)
            # in the user's terms, as a budget in bytes: one whose headroom plan fits (what compiling
            # falls back to when the step planned for the whole budget measures above it)
            minimum = _user_budget_for(planned_minimum, resident, allocator_headroom)
            headroom_note = "" if target == budget_bytes else (
                f", planned for {format_bytes(target)} to leave {1 - (target - resident) / (budget_bytes - resident):.0%} "
                "of the step's memory to the allocator")
            raise InfeasibleBudgetError(
                f"{strategy}: no schedule of {lowered.graph.name} fits in {format_bytes(budget_bytes)} "
                f"({budget_bytes} bytes{describe_fraction(budget_bytes, lowered.graph, budget)}{headroom_note}); "
                f"minimum feasible budget: {format_bytes(minimum)} ({minimum} bytes"
                f"{_headroom_part(minimum, planned_minimum)})"
                f"{_activation_share(planned_minimum, lowered.graph, budget)}, or "
                f"{_share_that_fits(planned_minimum, lowered.graph)} of checkpoint-all's peak"
                f"{_activation_budget_that_fits(planned_minimum, lowered.graph, budget)}"
                f"{_floor_note(lowered.graph, planned_minimum, strategy)}",
                budget_bytes=budget_bytes, min_feasible_budget_bytes=minimum, strategy=strategy) from exc
        if result.schedule is None:
            raise SolverError(f"{strategy} returned no schedule (status {result.status}); it only computes a bound")
        overhead = result.compute_cost / lowered.graph.total_cost if lowered.graph.total_cost else 1.0
        _log.info("solved in %.1f s: overhead %.3fx, peak %s", time.perf_counter() - started,
                  overhead, format_bytes(result.peak_memory_bytes))
        if overhead > SLOW_PLAN_WARN_OVERHEAD:
            _log.warning("the plan for %s recomputes %.1fx the plain step's compute (%s): each step will take "
                         "about that much longer; a larger budget, or more solve time (time_limit_s), may find "
                         "a cheaper plan", format_bytes(target), overhead, result.status)
        return result

    def build(result: SolveResult, planned_for: int) -> CompiledStep:
        step = CompiledStep(model, loss, optimizer, lowered, result, generate(lowered, result.schedule))
        step.predicted = replace(step.predicted, budget_bytes=int(budget_bytes), planned_budget_bytes=int(planned_for))
        step.budget_reference = reference
        return step

    if measure_on is None:
        if planned != budget_bytes:
            _log.info("planned for %s, leaving %.0f%% of the step's memory to the allocator", format_bytes(planned),
                      100 * allocator_headroom)
        return build(solve_for(planned, ""), planned)
    room = budget_bytes - resident
    target = budget_bytes
    over = budget_bytes + 1        # the least plan budget whose step measured above the budget
    fitted: CompiledStep | None = None
    checked: list[CompiledStep] = []     # every plan made, with its measured peak
    for attempt in range(VERIFY_ROUNDS):
        if attempt and extra_deadline[0] is not None and time.perf_counter() >= extra_deadline[0]:
            _log.info("no time left to check another plan")
            break
        try:
            candidate = build(solve_for(target, "" if attempt else " (the whole budget, then checked by running "
                                                                 "the step)"), target)
        except InfeasibleBudgetError:
            if attempt == 0:
                raise
            _log.info("no schedule fits %s", format_bytes(target))
            break
        step = candidate
        measured = _measured_step_peak(step, measure_on)
        step.verified_step_peak_bytes = measured
        checked.append(step)
        if measured <= room:
            _log.info("planned for %s: the step's measured peak %s fits the %s above the parameters and batch",
                      format_bytes(target), format_bytes(measured), format_bytes(room))
            if fitted is None or step.predicted.compute_cost < fitted.predicted.compute_cost:
                fitted = step
            # a plan after one that measured above the budget may leave much of it unused: one more
            # plan halfway to that one, unless this one's step already uses all but the headroom
            if fitted is not step or attempt == 0 or measured >= (1 - allocator_headroom) * room:
                break
            middle = target + (over - target) // 2
            if middle <= target:
                break
            _log.info("planning for %s, halfway to the plan that measured above the budget", format_bytes(middle))
            target = middle
            continue
        over = min(over, target)
        if fitted is not None:
            break
        # the memory model missed by measured / predicted on this plan: plan the next one for the peak
        # that leaves that much room (never more than the allocator headroom leaves); it is strictly
        # smaller than this plan's predicted peak, so every round asks for less
        predicted_step = max(1, step.predicted.step_peak_bytes)
        target = resident + math.floor(room * predicted_step / measured)
        if attempt == 0:
            target = min(planned, target)
        _log.info("the step planned for %s measured %s above the parameters and batch (predicted %s, %s "
                  "available): planning for %s", format_bytes(step.predicted.planned_budget_bytes),
                  format_bytes(measured), format_bytes(predicted_step), format_bytes(room), format_bytes(target))
    if fitted is not None:
        return fitted
    if not any(c.predicted.planned_budget_bytes <= planned for c in checked):
        # no plan with the allocator headroom was made (the smaller ones did not exist): make it, and
        # like an unchecked compile, refuse the budget when it does not exist
        step = build(solve_for(planned, ""), planned)
        step.verified_step_peak_bytes = _measured_step_peak(step, measure_on)
        checked.append(step)
        if step.verified_step_peak_bytes <= room:
            return step
    step = min(checked, key=lambda c: (c.verified_step_peak_bytes, c.predicted.compute_cost))
    message = (f"no plan's step measured within the {format_bytes(room)} the budget leaves above the parameters "
               f"and batch after {len(checked)} plans (the allocator's rounding on this device exceeds what the "
               f"memory model predicts): keeping the one that measured least, "
               f"{format_bytes(step.verified_step_peak_bytes)}; a budget of "
               f"{format_bytes(resident + step.verified_step_peak_bytes)} or more fits it")
    _log.warning("%s", message)
    # shown whatever the logging setup (a Keras fit with verbose=0 shows no log): the step runs over budget
    warnings.warn(f"checkmate: {message}", UserWarning, stacklevel=2)
    return step


def compile(model: Any, loss: Any, optimizer: Any, input_spec: Any, label_spec: Any, *, budget: Any = "auto",
            strategy: str = "auto", solver: str | None = None, level: str = "auto",
            gradient_nodes: bool = True, time_limit_s: Any = None, cost_model: str = "profile",
            device: str | None = None, verbose: bool | int = False, predictions: bool = False,
            fused_batch_norm: bool = False, plan: Any = None, schedule_cache: Any = None,
            **solve_options: Any) -> CompiledStep:
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
        A budget in bytes or ``"auto"`` is planned whole and the step run to check that its measured
        peak fits, where the device's allocator counts every allocation; otherwise (or when it does
        not fit) with :data:`ALLOCATOR_HEADROOM_FRACTION` of the memory above the parameters and batch
        left to the allocator's rounding (see :func:`compile_lowered`).
    strategy, solver, time_limit_s:
        Passed to :func:`checkmate.solve`. ``strategy="auto"`` (default): the exact MILP on small
        graphs, the hierarchical strategy on large ones, never worse than the best baseline;
        ``time_limit_s=None`` means :data:`COMPILE_TIME_LIMIT_S` for the solve, so that compiling a
        model stays within a few minutes (:func:`checkmate.solve` alone defaults to ten minutes).
        A callable is given the lowered graph's node count and returns the limit in seconds.
    level:
        ``"auto"`` (default), ``"layer"`` or ``"op"`` granularity of the graph. ``"auto"`` looks
        inside nested models and composite layers (a KerasHub task's backbone, its transformer
        blocks, their attention layers): every layer that runs no other layer is a node (with the
        splits of ``gradient_nodes``), and the ops a composite layer runs itself (attention scores,
        softmax, residual adds) are one node each, as are the ops of a layer whose temporaries
        outweigh its output; :meth:`CompiledStep.summary` lists what was split and why. A model of
        plain layers gets the layer-level graph.
    gradient_nodes:
        Layer level: ``True`` (default) puts each layer's parameter gradients in an output node of
        its own, resident from when it is computed, and the part of a layer its backward reads in a
        node of its own: the predicted peak follows the measured one, at ~1.65x the nodes, which
        the hierarchical strategy handles at any depth. ``False`` lowers the compact graph (one
        forward and one backward node per layer, parameter gradients resident for the whole step).
        :meth:`CompiledStep.summary` says which one was used.

    predictions:
        Also keep the training forward pass's output (the model's predictions) to the end of the step,
        planned as a step output: :meth:`CompiledStep.train_flat_with_predictions` and
        :meth:`CompiledStep.replica_train` return it (``RematModel`` updates its training metrics
        with it).
    fused_batch_norm:
        Run BatchNormalization layers (4-D, channels last) on TensorFlow's fused kernel, whose
        backward keeps no activation-sized temporaries: smaller budgets become feasible. Results equal
        Keras' to floating-point rounding; off by default (see :func:`checkmate.tf2.lowering.lower`).

    cost_model:
        ``"profile"`` (default): each node's measured time on this device (repeats, median without
        outliers, cached per device, shapes and dtypes; bounded to a few seconds, the rest a
        calibrated FLOPs-and-bytes estimate; see :mod:`checkmate.tf2.profiling`), so that the
        overhead the solver minimizes is time. ``"flops"``: the deterministic FLOP count.
        :meth:`CompiledStep.summary` names the one used. With profiled costs a plan that recomputes
        is then traced for a few runs and its recomputations priced where they run (they share the
        cores with the backward pass): the predicted step-time ratio,
        :attr:`Prediction.time_overhead` (pass ``in_place=False`` to skip it; see
        :func:`price_in_place`).

    plan, schedule_cache:
        ``plan``: a plan file (``checkmate compile --save-plan``) to train with, without solving; it
        must have been made for this step's graph and fit the budget. Otherwise solved schedules
        are cached on disk (``$CHECKMATE_CACHE_DIR/schedules``, default ``~/.cache/checkmate``) and
        reused after a replay check; ``schedule_cache=False`` (or ``$CHECKMATE_SCHEDULE_CACHE=0``)
        turns that off.
    verbose:
        Log the lowering, profiling and solving (their sizes and times) and the resolved budget on
        stderr while compiling (:mod:`checkmate.logs`); silent by default. ``2`` adds checkmate's
        debug messages, ``3`` the solver backends' own logs.

    Raises :class:`~checkmate.errors.InfeasibleBudgetError` (with ``min_feasible_budget_bytes``)
    before any step runs when nothing fits.
    """
    if verbose and int(verbose) >= 3:
        # the solver backends' own logs (HiGHS prints ~100 lines a solve): a level of their own
        solve_options.setdefault("verbose", True)
    if time_limit_s is None:
        # compile's default limit, as a limit by the graph's size: a default, solved once more with
        # DEFAULT_LIMIT_RETRY_FACTOR times it if it finds no schedule at all
        time_limit_s = _compile_default_time_limit_s
    with verbose_logging(verbose):
        lowered = lower(model, loss, input_spec, label_spec, level=level, gradient_nodes=gradient_nodes,
                        cost_model=cost_model, optimizer=optimizer, predictions=predictions,
                        fused_batch_norm=fused_batch_norm)
        return compile_lowered(lowered, model, loss, optimizer, budget=budget, strategy=strategy, solver=solver,
                               time_limit_s=time_limit_s, device=device, plan=plan, schedule_cache=schedule_cache,
                               **solve_options)
