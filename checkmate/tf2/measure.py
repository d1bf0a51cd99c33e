"""Measuring compiled steps: each strategy's step against the plain one on the same random batch.

:func:`compare_strategies` (what ``checkmate compile`` reports) compiles a lowered step with each
strategy, runs it, and gives the predicted and measured peaks (bytes allocated on top of the resident
parameters and batch, measured by :func:`checkmate.tf2.memory.measure_step`), the step time relative to
the plain step's, and the largest difference of loss and gradients from the plain step
(:func:`max_gradient_difference`, run from the same state, which is restored afterwards).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Sequence

import keras
import numpy as np
import tensorflow as tf

from checkmate.errors import InfeasibleBudgetError, InvalidArgumentError, SolverError
from checkmate.tf2 import _compat
from checkmate.tf2.lowered import LoweredGraph
from checkmate.tf2.memory import default_device, measure_step
from checkmate.tf2.step import CompiledStep, accounting, compile_lowered, resident_bytes, resolve_budget_reported

__all__ = ["max_gradient_difference", "time_step_s", "random_batch", "measure_plain", "compare_strategies",
           "allocator_note", "measure_step_time", "interleaved_times", "StepTimeReport",
           "STEP_TIME_REPORT_REPEATS"]

# Repeats of the measurement after RematModel's first epoch: each runs both steps once, so the report
# costs about 2 x this many steps, once per fit.
STEP_TIME_REPORT_REPEATS = 7


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


def interleaved_times(fns: Sequence[Any], *args: Any, repeats: int = 15) -> tuple[list[float], list[float]]:
    """Median wall seconds and median process CPU seconds of each ``fn(*args)``, the functions called in
    turn ``repeats`` times (after one warm-up call each), so that a load that comes and goes on a
    shared machine falls on all of them alike."""
    def run(fn):
        out = fn(*args)
        for t in tf.nest.flatten(out)[:1]:     # wait for the values (a GPU returns early)
            t.numpy()

    for fn in fns:
        run(fn)
    wall: list[list[float]] = [[] for _ in fns]
    cpu: list[list[float]] = [[] for _ in fns]
    for _ in range(max(1, repeats)):
        for k, fn in enumerate(fns):
            start, cpu_start = time.perf_counter(), time.process_time()
            run(fn)
            wall[k].append(time.perf_counter() - start)
            cpu[k].append(time.process_time() - cpu_start)
    return [float(np.median(w)) for w in wall], [float(np.median(c)) for c in cpu]


def measure_step_time(step: CompiledStep, x: Any = None, y: Any = None, *, repeats: int = 15):
    """:class:`~checkmate.tf2.step.MeasuredTime` of ``step``'s gradients against the plain traced step
    (Grappler on, as users run it), interleaved (:func:`interleaved_times`); ``(x, y)`` default to a
    random batch of the compiled shapes. The model's state variables are restored afterwards."""
    from checkmate.tf2.step import MeasuredTime

    if step.distribution is not None:
        raise InvalidArgumentError("measure_step_time times one replica's step against the plain one: compile the "
                                   "step without a tf.distribute strategy to measure it")
    if x is None or y is None:
        x, y = random_batch(step.lowered, step.model)
    flat = step.function.flat_args(x, y)
    state = _state_variables(step.model)
    before = _snapshot(state)
    try:
        (remat_s, plain_s), (remat_cpu, plain_cpu) = interleaved_times(
            [step.function.call_flat, step.lowered.function], *flat, repeats=repeats)
    finally:
        _restore(state, before)
    return MeasuredTime(step_seconds=remat_s, plain_seconds=plain_s, repeats=repeats,
                        cpu_ratio=remat_cpu / plain_cpu if plain_cpu > 0 else None)


class StepTimeReport(keras.callbacks.Callback):
    """After the first epoch of ``fit``, measure the compiled step against the plain one
    (:meth:`~checkmate.tf2.step.CompiledStep.measure_time`) and report the measured step-time ratio
    beside the predicted overhead: on the ``checkmate.tf2`` logger, and on stdout when ``fit`` is
    verbose. The result stays in ``step.measured`` (and in ``step.summary()``)."""

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
        if step.distribution is not None:
            logging.getLogger("checkmate.tf2").info(
                "checkmate: step time not measured under a tf.distribute strategy (predicted overhead %.3fx)",
                step.predicted.overhead)
            return
        measured = step.measure_time(repeats=self.repeats)
        line = (f"checkmate: step time {measured.ratio:.3f}x the plain step (predicted overhead "
                f"{step.predicted.overhead:.3f}x; {measured.describe()})")
        logging.getLogger("checkmate.tf2").info(line)
        if self.params.get("verbose", 1):
            print(line)


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
            "predicted_peak_bytes": checkpoint_all_peak(lowered.graph) - resident_bytes(lowered),
            # the same figure as a budget (parameters and batch included): what checkpoint-all needs
            "checkpoint_all_budget_bytes": checkpoint_all_peak(lowered.graph)}


def compare_strategies(lowered: LoweredGraph, model: Any, loss: Any, strategies: Sequence[str], budget: Any, *,
                       solver: str | None = None, time_limit_s: float | None = None, steps: int = 3,
                       optimizer: Any = None, plain: dict | None = None, mip_gap: float | None = None) -> dict:
    """Compile ``lowered`` with each strategy and measure it against the plain step (the demo's view).

    Returns ``{"plain": {...}, "rows": [{...} per strategy]}`` with predicted and measured peaks (step
    peaks: bytes allocated on top of the resident parameters and batch), predicted overhead,
    measured step time and its ratio to the plain step's, and the max gradient difference.
    ``mip_gap`` (None: the default, proven optimal) is passed to every solve.
    """
    x, y = random_batch(lowered, model)
    flat = x + y
    device = default_device()
    resident = resident_bytes(lowered)
    if plain is None:
        plain = measure_plain(lowered, flat, steps=steps, device=device)
    # one resolution for every strategy ("auto" reads the free memory once), reported with its reference
    budget_bytes, reference = resolve_budget_reported(budget, lowered.graph, model, device)
    plain_peak = plain["measured_peak_bytes"]
    rows = []
    # a percentage is passed on as such (it is planned as given); anything else as its resolved bytes,
    # so that "auto" is read from the device once for every strategy
    per_strategy = budget if isinstance(budget, str) and budget.strip().endswith("%") else budget_bytes
    for name in strategies:
        row: dict[str, Any] = {"strategy": name}
        try:
            step = compile_lowered(lowered, model, loss, optimizer, budget=per_strategy, strategy=name, solver=solver,
                                   time_limit_s=time_limit_s, device=device,
                                   **({} if mip_gap is None else {"mip_gap": mip_gap}))
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
        # interleaved with the plain step, so that a load on a shared machine falls on both alike
        (seconds, plain_seconds), _ = interleaved_times([fn, lowered.function], *flat, repeats=steps)
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
            time_over_plain=seconds / plain_seconds if plain_seconds > 0 else None,
            max_grad_diff=diff_abs, max_grad_rel_diff=diff_rel,
            recomputations=step.predicted.recompute_count, op_copies=step.function.op_copies,
            solve_seconds=step.result.solve_seconds, optimal=step.result.optimal,
        )
        rows.append(row)
    from checkmate.tf2.step import cost_model_description

    return {"graph": lowered.graph.name, "level": lowered.level, "nodes": lowered.graph.n,
            "cost_model": cost_model_description(lowered),
            "gradient_nodes": bool(lowered.metadata.get("gradient_nodes")), "accounting": accounting(lowered),
            "device": device, "budget_bytes": budget_bytes, "budget_reference": reference,
            "resident_bytes": resident, "plain": plain, "rows": rows}


def allocator_note(device: str) -> str | None:
    """A caveat about the CPU allocator's statistics, or None when the allocator counts every
    allocation (the BFC allocator, on CPU or GPU)."""
    if not device.upper().startswith("CPU") or os.environ.get("TF_CPU_ALLOCATOR_USE_BFC", "").lower() in ("1", "true"):
        return None
    return ("TF's default CPU allocator counts only allocations of 256 KiB or more; TF_CPU_ALLOCATOR_USE_BFC=true "
            "(the default of checkmate compile and max-batch) counts every one")
