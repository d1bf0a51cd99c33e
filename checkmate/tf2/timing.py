"""Timing a compiled step against the plain one: interleaved repeats in one process, medians.

:func:`measure_step_time` gives a :class:`MeasuredTime` (what :meth:`CompiledStep.measure_time
<checkmate.tf2.step.CompiledStep.measure_time>` keeps and the summary shows); :func:`interleaved_times`
runs several functions in turn so that the machine's load weighs on each alike. This module does not
import :mod:`checkmate.tf2.step`, which uses it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import tensorflow as tf

from checkmate.errors import InvalidArgumentError
from checkmate.tf2.lowered import LoweredGraph

if TYPE_CHECKING:  # pragma: no cover
    from checkmate.tf2.step import CompiledStep

__all__ = ["MeasuredTime", "measure_step_time", "interleaved_times", "time_step_s", "random_batch"]


@dataclass(frozen=True)
class MeasuredTime:
    """Measured step time of a compiled step against the plain traced step, in one process."""

    step_seconds: float         # median of the compiled step's gradients
    plain_seconds: float        # median of the plain traced step's
    repeats: int
    cpu_ratio: float | None = None   # the same ratio in process CPU time (robust to other processes)

    @property
    def ratio(self) -> float:
        return self.step_seconds / self.plain_seconds if self.plain_seconds > 0 else float("nan")

    def describe(self) -> str:
        cpu = f", CPU time {self.cpu_ratio:.3f}x" if self.cpu_ratio is not None else ""
        return (f"{self.step_seconds * 1e3:.1f} ms vs {self.plain_seconds * 1e3:.1f} ms, median of "
                f"{self.repeats}{cpu}")


def _state_variables(model: Any) -> list:
    """Variables a training step updates besides the parameters (BatchNorm statistics, dropout seeds)."""
    return list(getattr(model, "non_trainable_variables", ()))


def _snapshot(variables: Sequence[Any]) -> list:
    return [tf.identity(v) for v in variables]


def _restore(variables: Sequence[Any], values: Sequence[Any]) -> None:
    for v, value in zip(variables, values):
        v.assign(value)


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
    shared machine falls on all of them alike. Each round starts one function further on (round ``r``
    calls ``fns[r % n]`` first), so that no function is always the one called right after another
    (with the caches and thread pools that one left behind) or always the first of a round."""
    def run(fn):
        out = fn(*args)
        for t in tf.nest.flatten(out)[:1]:     # wait for the values (a GPU returns early)
            t.numpy()

    for fn in fns:
        run(fn)
    wall: list[list[float]] = [[] for _ in fns]
    cpu: list[list[float]] = [[] for _ in fns]
    n = len(fns)
    for r in range(max(1, repeats)):
        for k in [(r + j) % n for j in range(n)]:
            fn = fns[k]
            start, cpu_start = time.perf_counter(), time.process_time()
            run(fn)
            wall[k].append(time.perf_counter() - start)
            cpu[k].append(time.process_time() - cpu_start)
    return [float(np.median(w)) for w in wall], [float(np.median(c)) for c in cpu]


def measure_step_time(step: "CompiledStep", x: Any = None, y: Any = None, *, repeats: int = 15):
    """:class:`MeasuredTime` of ``step``'s gradients against the plain traced step
    (Grappler on, as users run it), interleaved (:func:`interleaved_times`); ``(x, y)`` default to a
    random batch of the compiled shapes. The model's state variables are restored afterwards."""
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


def random_batch(lowered: LoweredGraph, model: Any, seed: int = 0) -> tuple[list, list]:
    """A batch for the lowered step: normal features and labels valid for the model's logits."""
    graph = lowered.function.graph
    rng = np.random.default_rng(seed)
    classes = None
    try:
        # integer labels below every output's class count, valid for whichever output they label
        classes = min(int(out.shape[-1]) for out in model.outputs)
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
