"""Zoo models as graphs and as measured training steps, for the sweeps and the max-batch study.

Thin glue over :mod:`checkmate.tf2` (zoo, lowering, compile, memory): TensorFlow is imported when a
function here runs, never when the module is imported.
"""

from __future__ import annotations

from typing import Any

from checkmate.graph import Graph

__all__ = ["lower_zoo_model", "extract_graph", "random_zoo_batch", "measure_compiled_step"]


def lower_zoo_model(model: str, batch_size: int, *, input_shape: tuple[int, ...] | None = None,
                    level: str = "layer", cost_model: str = "flops", gradient_nodes: bool = False,
                    progress: bool = False, fused_batch_norm: bool = False):
    """Build zoo ``model`` at ``batch_size`` and lower its training step; returns ``(ZooModel, LoweredGraph)``.

    ``gradient_nodes`` and ``fused_batch_norm`` as in :func:`checkmate.tf2.lowering.lower` (default: the
    compact layer graph, Keras' own batch normalization)."""
    from checkmate.tf2 import zoo
    from checkmate.tf2.lowering import lower

    built = zoo.build_model(model, batch_size=batch_size, input_shape=input_shape)
    lowered = lower(built.model, built.loss, built.input_spec, built.label_spec, level=level,
                    gradient_nodes=gradient_nodes, cost_model=cost_model, name=f"{model}-b{batch_size}-{level}",
                    progress=progress, fused_batch_norm=fused_batch_norm)
    return built, lowered


def extract_graph(model: str, batch_size: int, *, input_shape: tuple[int, ...] | None = None,
                  level: str = "layer", cost_model: str = "flops", gradient_nodes: bool = False,
                  fused_batch_norm: bool = False) -> Graph:
    """The training graph of zoo ``model`` at ``batch_size`` (layer level by default, as in the paper)."""
    import gc

    import keras

    _, lowered = lower_zoo_model(model, batch_size, input_shape=input_shape, level=level, cost_model=cost_model,
                                 gradient_nodes=gradient_nodes, fused_batch_norm=fused_batch_norm)
    graph = lowered.graph
    # Each extraction builds a fresh model; drop Keras' global state so a long search does not grow.
    del lowered
    keras.backend.clear_session()
    gc.collect()
    return graph


def random_zoo_batch(built) -> tuple[Any, Any]:
    """A random ``(x, y)`` matching a :class:`~checkmate.tf2.zoo.ZooModel`'s specs (labels in range)."""
    import tensorflow as tf

    classes = int(built.model.output_shape[-1])
    x = tf.random.normal(built.input_spec.shape, dtype=built.input_spec.dtype, seed=0)
    y = tf.random.uniform(built.label_spec.shape, maxval=classes, dtype=built.label_spec.dtype, seed=1)
    return x, y


def measure_compiled_step(model: str, batch_size: int, memory_bytes: int, strategy: str, *,
                          input_shape: tuple[int, ...] | None = None, level: str = "layer",
                          gradient_nodes: bool = False, solver: str | None = None,
                          time_limit_s: float | None = None, allocator_headroom: float | None = None,
                          fused_batch_norm: bool = False) -> dict:
    """Compile zoo ``model`` at ``batch_size`` for ``memory_bytes`` with ``strategy``, run one step
    and measure it. The measured figure is the allocator's peak during the step above what was
    resident before it (parameters and the batch); it is reported next to the schedule's predicted
    peak of the same quantity, and ``peak_memory_bytes`` adds the resident bytes back (the figure the
    memory limit bounds). ``allocator_headroom`` is passed to the compile when given (0 plans the
    schedule for the whole of ``memory_bytes``, as a max-batch search does)."""
    import time

    import keras

    from checkmate.tf2.step import compile_lowered
    from checkmate.tf2.memory import measure_step

    built, lowered = lower_zoo_model(model, batch_size, input_shape=input_shape, level=level,
                                     gradient_nodes=gradient_nodes, fused_batch_norm=fused_batch_norm)
    headroom = {} if allocator_headroom is None else {"allocator_headroom": float(allocator_headroom)}
    step = compile_lowered(lowered, built.model, built.loss, keras.optimizers.SGD(0.01), budget=int(memory_bytes),
                           strategy=strategy, solver=solver, time_limit_s=time_limit_s, **headroom)
    x, y = random_zoo_batch(built)
    m = measure_step(step.gradients, x, y)
    start = time.perf_counter()
    step.gradients(x, y)[0].numpy()
    seconds = time.perf_counter() - start
    return {
        "status": "measured",
        "device": m.device,
        "batch_size": int(batch_size),
        "predicted_step_peak_bytes": int(step.predicted.step_peak_bytes),
        "measured_step_peak_bytes": int(m.peak_bytes),
        "resident_bytes": int(step.predicted.resident_bytes),
        "predicted_peak_bytes": int(step.predicted.peak_memory_bytes),
        "peak_memory_bytes": int(m.peak_bytes) + int(step.predicted.resident_bytes),
        "predicted_overhead": float(step.predicted.overhead),
        "step_seconds": seconds,
    }
