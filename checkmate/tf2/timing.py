"""Timing a compiled step against the plain one: interleaved repeats in one process, medians.

:func:`measure_step_time` gives a :class:`MeasuredTime` (what :meth:`CompiledStep.measure_time
<checkmate.tf2.step.CompiledStep.measure_time>` keeps and the summary shows): the step's gradients
against the plain traced step's, the ratio the predicted overhead predicts; ``gradients_only=False``
times a whole training step, the optimizer update included, against the plain traced step with the
same update. :func:`interleaved_times` runs several
functions in turn so that the machine's load weighs on each alike; :func:`preserved_state` puts back
what the timed steps changed. :func:`interleaved_counters` runs them in turn the same way and
counts, per call, what the process paid besides the ops' arithmetic (page faults, context switches):
for telling whether a step costs less or more than predicted because of the memory it touches or of
the threads it waits for. This module does not import :mod:`checkmate.tf2.step`, which uses it.
"""

from __future__ import annotations

import contextlib
import time

try:        # POSIX only: the process's page-fault and context-switch counts (interleaved_counters)
    import resource
except ImportError:  # pragma: no cover - Windows
    resource = None
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import tensorflow as tf

from checkmate.errors import InvalidArgumentError
from checkmate.tf2.lowered import LoweredGraph

if TYPE_CHECKING:  # pragma: no cover
    from checkmate.tf2.step import CompiledStep

__all__ = ["MeasuredTime", "measure_step_time", "interleaved_times", "interleaved_counters", "StepCounters",
           "time_step_s", "random_batch", "preserved_state",
           "plain_train_function", "plain_gradients_function", "TRAIN_STEP_REFERENCE", "GRADIENTS_REFERENCE"]

# What a measured ratio is against (MeasuredTime.reference)
TRAIN_STEP_REFERENCE = "the plain traced train step (gradients and optimizer update)"
GRADIENTS_REFERENCE = "the plain traced step's gradients"


@dataclass(frozen=True)
class MeasuredTime:
    """Measured step time of a compiled step against the plain traced step, in one process."""

    step_seconds: float         # median of the compiled step's gradients
    plain_seconds: float        # median of the plain traced step's
    repeats: int
    cpu_ratio: float | None = None   # the same ratio in process CPU time (robust to other processes)
    reference: str = TRAIN_STEP_REFERENCE    # what plain_seconds timed
    # median of the plain traced step's gradients alone, timed in the same rounds, where the reference
    # is a whole training step (its update, metrics and data besides the gradients); None otherwise
    gradient_seconds: float | None = None

    @property
    def ratio(self) -> float:
        return self.step_seconds / self.plain_seconds if self.plain_seconds > 0 else float("nan")

    @property
    def gradient_share(self) -> float:
        """The plain gradients' share of the reference step's time (1 when the reference is the
        gradients themselves): the part of the step that recomputation slows down."""
        if self.gradient_seconds is None or self.plain_seconds <= 0:
            return 1.0
        return float(min(1.0, max(0.0, self.gradient_seconds / self.plain_seconds)))

    def expected_ratio(self, overhead: float) -> float:
        """The step-time ratio against this measurement's reference that a predicted overhead of the
        gradients (:attr:`Prediction.time_overhead`) comes to: the recomputations lengthen the
        gradients' share of the step, not the optimizer's update, the metrics or the data's
        handling, which cost the same in both steps."""
        return 1.0 + (overhead - 1.0) * self.gradient_share

    def describe_expected(self, overhead: float) -> str:
        """``overhead`` as predicted for this measurement's reference: itself when the reference is
        the gradients, else the ratio it comes to (:meth:`expected_ratio`) with the share it is of."""
        if self.gradient_seconds is None:
            return f"{overhead:.3f}x"
        return (f"{self.expected_ratio(overhead):.3f}x for the whole step ({overhead:.3f}x on its gradients, "
                f"{self.gradient_share:.0%} of the plain step's time)")

    def describe(self) -> str:
        cpu = f", CPU time {self.cpu_ratio:.3f}x" if self.cpu_ratio is not None else ""
        return (f"{self.step_seconds * 1e3:.1f} ms vs {self.plain_seconds * 1e3:.1f} ms of {self.reference}, "
                f"median of {self.repeats}{cpu}")


def _state_variables(model: Any) -> list:
    """Variables a training step updates besides the parameters (BatchNorm statistics, dropout seeds)."""
    return list(getattr(model, "non_trainable_variables", ()))


def _snapshot(variables: Sequence[Any]) -> list:
    # host copies: a device that trains near its memory limit has no room for a second set of weights
    return [v.numpy() for v in variables]


def _restore(variables: Sequence[Any], values: Sequence[Any]) -> None:
    for v, value in zip(variables, values):
        v.assign(value)


@contextlib.contextmanager
def preserved_state(*groups: Sequence[Any]):
    """Put back the values of every variable in ``groups`` (a model's weights and state, an optimizer's
    slots and iteration count, metrics' totals) as they were on entry: timing whole training steps
    updates them, and a measurement must not train the model."""
    seen: dict = {}
    for group in groups:
        for v in group:
            seen.setdefault(id(v), v)
    variables = list(seen.values())
    before = _snapshot(variables)
    try:
        yield
    finally:
        _restore(variables, before)


def plain_train_function(step: "CompiledStep"):
    """The plain traced step with ``step``'s optimizer update, as one ``tf.function`` over the step's flat
    inputs returning the loss: the training step a user writes with ``tf.GradientTape`` (Grappler on)."""
    lowered = step.lowered
    plain = lowered.function
    optimizer = step.optimizer
    variables = step.variables
    split = step.function.split

    # the traced step takes (x, y) structured (dict inputs; labels with their sample weights)
    args, _ = plain.structured_input_signature

    def train(*flat):
        out = plain(*tf.nest.pack_sequence_as(args, flat))
        # a sliced gradient (an embedding's) as tf.IndexedSlices, as the compiled step applies it
        loss, grads, _ = split(out)
        optimizer.apply_gradients(zip(grads, variables))
        return loss

    return tf.function(train, input_signature=step.function.input_specs, autograph=False)


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
    wall, cpu = interleaved_samples(fns, *args, repeats=repeats)
    return [float(np.median(w)) for w in wall], [float(np.median(c)) for c in cpu]


def interleaved_samples(fns: Sequence[Any], *args: Any, repeats: int = 15, min_repeats: int | None = None,
                        max_seconds: float | None = None) -> tuple[list[list[float]], list[list[float]]]:
    """The wall and process CPU seconds of every timed call of :func:`interleaved_times`, per function.
    With ``max_seconds``, rounds stop early once ``min_repeats`` are done and the timed rounds have
    taken that long: a step of seconds is measured in fewer rounds than a step of milliseconds."""
    def run(fn):
        out = fn(*args)
        for t in tf.nest.flatten(out)[:1]:     # wait for the values (a GPU returns early)
            t.numpy()

    for fn in fns:
        run(fn)
    wall: list[list[float]] = [[] for _ in fns]
    cpu: list[list[float]] = [[] for _ in fns]
    n = len(fns)
    begun = time.perf_counter()
    least = max(1, repeats if min_repeats is None else min(min_repeats, repeats))
    for r in range(max(1, repeats)):
        if max_seconds is not None and r >= least and time.perf_counter() - begun > max_seconds:
            break
        for k in [(r + j) % n for j in range(n)]:
            fn = fns[k]
            start, cpu_start = time.perf_counter(), time.process_time()
            run(fn)
            wall[k].append(time.perf_counter() - start)
            cpu[k].append(time.process_time() - cpu_start)
    return wall, cpu


@dataclass(frozen=True)
class StepCounters:
    """Per-call medians of one function's process counters (:func:`interleaved_counters`): time, and
    what the kernel counted for the whole process (all threads) during the call."""

    wall_s: float
    cpu_s: float                  # process CPU time (user and system, every thread)
    minor_faults: float           # page faults served without I/O: first touches of fresh pages
    major_faults: float           # page faults that read from disk
    voluntary_switches: float     # a thread gave up its core (waiting for another op, a lock, I/O)
    involuntary_switches: float   # a thread was preempted (another process or thread took its core)
    system_s: float               # kernel time (page faults, thread wake-ups, madvise/munmap)


def _counters() -> np.ndarray:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return np.array([time.perf_counter(), time.process_time(), usage.ru_minflt, usage.ru_majflt, usage.ru_nvcsw,
                     usage.ru_nivcsw, usage.ru_stime], dtype=float)


def interleaved_counters(fns: Sequence[Any], *args: Any, repeats: int = 15) -> list[StepCounters]:
    """:class:`StepCounters` of each ``fn(*args)``, called in turn as :func:`interleaved_times` calls
    them (one warm-up call each, each round starting one function further on), medians of ``repeats``.

    The counters are the process's (``getrusage``), so they count every thread the call woke; a
    warm step of a pooling allocator (TF's BFC allocator, or glibc's malloc once its mmap threshold has
    grown past the step's buffers) takes no page fault, and a fault count per call above zero means
    the allocator handed fresh pages to the step on every call."""
    if resource is None:
        raise InvalidArgumentError("interleaved_counters needs the POSIX resource module (getrusage), "
                                   "which this platform lacks")

    def run(fn):
        out = fn(*args)
        for t in tf.nest.flatten(out)[:1]:
            t.numpy()

    for fn in fns:
        run(fn)
    samples: list[list[np.ndarray]] = [[] for _ in fns]
    n = len(fns)
    for r in range(max(1, repeats)):
        for k in [(r + j) % n for j in range(n)]:
            before = _counters()
            run(fns[k])
            samples[k].append(_counters() - before)
    out = []
    for rows in samples:
        m = np.median(np.asarray(rows), axis=0)
        out.append(StepCounters(wall_s=float(m[0]), cpu_s=float(m[1]), minor_faults=float(m[2]),
                                major_faults=float(m[3]), voluntary_switches=float(m[4]),
                                involuntary_switches=float(m[5]), system_s=float(m[6])))
    return out


def measure_step_time(step: "CompiledStep", x: Any = None, y: Any = None, *, repeats: int = 15,
                      gradients_only: bool = True):
    """:class:`MeasuredTime` of ``step``'s gradients against the plain traced step's (Grappler on, as
    users run it), interleaved (:func:`interleaved_times`): what the predicted overhead predicts.
    ``gradients_only=False`` times a whole training step (the gradients and the optimizer's update)
    against the plain traced step with the same update. ``(x, y)`` default to a random batch of the
    compiled shapes. The model's variables and the optimizer's are put back afterwards: the
    measurement trains nothing."""
    if step.distribution is not None:
        raise InvalidArgumentError("measure_step_time times one replica's step against the plain one: compile the "
                                   "step without a tf.distribute strategy to measure it")
    if x is None or y is None:
        x, y = random_batch(step.lowered, step.model)
    flat = step.function.flat_args(x, y)
    gradients = plain_gradients_function(step)
    if gradients_only:
        fns = [step.function.call_flat, gradients]
        reference = GRADIENTS_REFERENCE
    else:
        # the plain gradients alone in the same rounds: their share of the training step is what the
        # predicted overhead applies to (MeasuredTime.expected_ratio)
        fns, reference = [step.train_flat, plain_train_function(step), gradients], TRAIN_STEP_REFERENCE
        step._build_optimizer()      # its slots exist before they are saved
    optimizer_variables = [] if gradients_only else list(getattr(step.optimizer, "variables", ()))
    with preserved_state(step.model.variables, optimizer_variables):
        walls, cpus = interleaved_times(fns, *flat, repeats=repeats)
    (remat_s, plain_s), (remat_cpu, plain_cpu) = walls[:2], cpus[:2]
    return MeasuredTime(step_seconds=remat_s, plain_seconds=plain_s, repeats=repeats,
                        cpu_ratio=remat_cpu / plain_cpu if plain_cpu > 0 else None, reference=reference,
                        gradient_seconds=None if gradients_only else walls[2])


def plain_gradients_function(step: "CompiledStep"):
    """The plain traced step's gradients (``step.lowered.function``, Grappler on) called on ``step``'s
    flat inputs."""
    plain = step.lowered.function
    args, _ = plain.structured_input_signature
    return lambda *flat: plain(*tf.nest.pack_sequence_as(args, flat))


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
