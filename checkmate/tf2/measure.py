"""Measuring compiled steps: each strategy's step against the plain one on the same random batch.

:func:`compare_strategies` (what ``checkmate compile`` reports) compiles a lowered step with each
strategy, runs it, and gives the predicted and measured peaks (bytes allocated on top of the resident
parameters and batch, measured by :func:`checkmate.tf2.memory.measure_step`), the step time relative to
the plain step's, and the largest difference of loss and gradients from the plain step
(:func:`max_gradient_difference`, run from the same state, which is restored afterwards).
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import tensorflow as tf

from checkmate.budgets import is_relative_budget
from checkmate.errors import InfeasibleBudgetError, SolverError
from checkmate.tf2 import _compat
from checkmate.tf2.lowered import LoweredGraph
from checkmate.tf2.memory import default_device, measure_step
from checkmate.tf2.step import CompiledStep, accounting, compile_lowered, resident_bytes, resolve_budget_reported
from checkmate.tf2.timing import (_restore, _snapshot, _state_variables, interleaved_times,  # noqa: F401
                                 measure_step_time, random_batch, time_step_s)
# the report fit adds lives beside the Keras wrappers, which must not import the step module
from checkmate.tf2.trainer import STEP_TIME_REPORT_REPEATS, StepTimeReport  # noqa: F401 (re-exported)

__all__ = ["max_gradient_difference", "time_step_s", "random_batch", "measure_plain", "compare_strategies",
           "allocator_note", "measure_step_time", "interleaved_times", "StepTimeReport",
           "STEP_TIME_REPORT_REPEATS"]


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
                       optimizer: Any = None, plain: dict | None = None, mip_gap: float | None = None,
                       compiled: dict | None = None) -> dict:
    """Compile ``lowered`` with each strategy and measure it against the plain step (the demo's view).

    Returns ``{"plain": {...}, "rows": [{...} per strategy]}`` with predicted and measured peaks (step
    peaks: bytes allocated on top of the resident parameters and batch), predicted overhead (the
    schedule's cost, and the step-time ratio with its recomputations priced where they run:
    ``predicted_time_overhead``, see :func:`checkmate.tf2.step.price_in_place`), measured step time and its ratio to the plain step's, and the max gradient difference.
    ``mip_gap`` (None: the default, proven optimal) is passed to every solve. ``compiled``, when
    given, receives each strategy's :class:`~checkmate.tf2.step.CompiledStep` by name.
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
    per_strategy = budget if is_relative_budget(budget) else budget_bytes
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
        if compiled is not None:
            compiled[name] = step
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
            predicted_overhead=step.predicted.overhead, predicted_time_overhead=step.predicted.time_overhead,
            step_seconds=seconds,
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
    from checkmate.tf2.memory import onednn_note

    if not device.upper().startswith("CPU"):
        return None
    kernels = onednn_note()
    if os.environ.get("TF_CPU_ALLOCATOR_USE_BFC", "").lower() in ("1", "true"):
        return kernels
    note = ("TF's default CPU allocator counts only allocations of 256 KiB or more; TF_CPU_ALLOCATOR_USE_BFC=true "
            "(the default of checkmate compile and max-batch) counts every one")
    return note if kernels is None else f"{note}; {kernels}"
