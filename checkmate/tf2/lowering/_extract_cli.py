"""The ``checkmate extract`` command: lower a zoo model or a saved Keras model and write its graph file."""

from __future__ import annotations

import tensorflow as tf

from checkmate.errors import InvalidArgumentError
from checkmate.graph import save_graph
from checkmate.tf2.lowering import lower

__all__ = ["cli_extract"]


def _load_keras_file(path: str, batch_size: int, input_shape: tuple[int, ...] | None):
    """(model, loss, input_spec, label_spec) for a saved ``.keras`` model compiled with a loss."""
    import os

    import keras

    if not os.path.exists(path):
        raise FileNotFoundError(2, "No such file or directory", path)
    try:
        model = keras.models.load_model(path, compile=True)
    except Exception as exc:  # noqa: BLE001 - Keras raises many types for unreadable files
        raise InvalidArgumentError(f"cannot load Keras model {path!r}: {exc}") from None
    if len(model.inputs) != 1 or len(model.outputs) != 1:
        raise InvalidArgumentError(f"{path}: only single-input, single-output models can be extracted from a file")
    loss = getattr(model, "loss", None)
    if loss is None or isinstance(loss, (dict, list, tuple)):
        raise InvalidArgumentError(f"{path}: the model has no single compiled loss; save it after model.compile(loss=...)")
    declared = tuple(model.inputs[0].shape[1:])
    shape = tuple(input_shape) if input_shape else declared
    if any(d is None for d in shape):
        raise InvalidArgumentError(f"{path}: the input shape {declared} has free dimensions; pass --input-shape")
    if input_shape and any(d is not None and d != s for d, s in zip(declared, shape)) or len(shape) != len(declared):
        raise InvalidArgumentError(f"{path}: --input-shape {shape} does not match the model's input {declared}")
    input_spec = tf.TensorSpec((batch_size, *shape), tf.as_dtype(model.inputs[0].dtype or "float32"))
    out_shape = model.compute_output_shape((batch_size, *shape))
    loss_name = loss if isinstance(loss, str) else getattr(loss, "name", type(loss).__name__)
    if "sparse" in str(loss_name).lower():
        label_spec = tf.TensorSpec(tuple(out_shape[:-1]), tf.int32)
    else:
        label_spec = tf.TensorSpec(tuple(out_shape), tf.float32)
    return model, loss, input_spec, label_spec


def cli_extract(args) -> int:
    """``checkmate extract``: lower a zoo model or a saved Keras model and write its graph file."""
    if args.model:
        from checkmate.tf2 import zoo

        model, loss, input_spec, label_spec = zoo.build_model(args.model, batch_size=args.batch_size,
                                                              input_shape=args.input_shape)
        name = f"{args.model}-b{args.batch_size}"
    else:
        model, loss, input_spec, label_spec = _load_keras_file(args.keras_file, args.batch_size, args.input_shape)
        name = f"{getattr(model, 'name', 'model')}-b{args.batch_size}"
    lowered = lower(model, loss, input_spec, label_spec, level=args.level, cost_model=args.cost_model,
                    name=f"{name}-{args.level}")
    save_graph(lowered.graph, args.out)
    g = lowered.graph
    print(f"wrote {args.out}: {g.n} nodes ({len(g.forward_nodes)} forward, {len(g.backward_nodes)} backward, "
          f"{int((~g.recomputable).sum())} non-recomputable), {len(g.edges)} edges; {args.level} level, "
          f"costs in {lowered.metadata['cost_unit']}; activations {int(g.mem.sum())} bytes, "
          f"fixed {g.fixed_mem} bytes")
    return 0
