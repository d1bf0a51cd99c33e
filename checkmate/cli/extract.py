"""``checkmate extract``: lower a zoo model or a saved Keras model to a training graph file.

TensorFlow is imported when the command runs, not when this module is imported.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from checkmate.cli._common import EXIT_OK, command, path, positive_int, shape
from checkmate.errors import InvalidArgumentError

__all__ = ["add_parser", "run", "load_keras_file"]


def add_parser(sub) -> None:
    p = sub.add_parser("extract", help="lower a Keras model to a training graph file")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", metavar="NAME", help="a model of checkmate.tf2.zoo")
    src.add_argument("--keras-file", type=path, metavar="F.keras", help="a saved Keras model")
    p.add_argument("--batch-size", type=positive_int, required=True)
    p.add_argument("--input-shape", type=shape, default=None, metavar="H,W,C")
    p.add_argument("--level", choices=("layer", "op", "auto"), default="layer")
    p.add_argument("--cost-model", choices=("profile", "flops"), default="profile")
    p.add_argument("--fused-batch-norm", action="store_true",
                   help="lower BatchNormalization on TensorFlow's fused kernel (see checkmate compile --help)")
    p.add_argument("--out", type=path, required=True, metavar="GRAPH.json")
    p.set_defaults(handler=command(run, tensorflow=True))


def load_keras_file(path: str, batch_size: int, input_shape: tuple[int, ...] | None) -> tuple[Any, Any, Any, Any]:
    """(model, loss, input_spec, label_spec) for a saved ``.keras`` model compiled with a loss."""
    import keras
    import tensorflow as tf

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
    dims = tuple(input_shape) if input_shape else declared
    if any(d is None for d in dims):
        raise InvalidArgumentError(f"{path}: the input shape {declared} has free dimensions; pass --input-shape")
    if input_shape and any(d is not None and d != s for d, s in zip(declared, dims)) or len(dims) != len(declared):
        raise InvalidArgumentError(f"{path}: --input-shape {dims} does not match the model's input {declared}")
    input_spec = tf.TensorSpec((batch_size, *dims), tf.as_dtype(model.inputs[0].dtype or "float32"))
    out_shape = model.compute_output_shape((batch_size, *dims))
    loss_name = loss if isinstance(loss, str) else getattr(loss, "name", type(loss).__name__)
    if "sparse" in str(loss_name).lower():
        label_spec = tf.TensorSpec(tuple(out_shape[:-1]), tf.int32)
    else:
        label_spec = tf.TensorSpec(tuple(out_shape), tf.float32)
    return model, loss, input_spec, label_spec


def run(args: argparse.Namespace) -> int:
    from checkmate.graph import save_graph
    from checkmate.io import output_target, refuse_input_as_output
    from checkmate.tf2.lowering import lower

    refuse_input_as_output(args.out, args.keras_file)
    output_target(args.out)  # an unwritable --out is refused before the model is built and profiled
    if args.model:
        from checkmate.tf2 import zoo

        model, loss, input_spec, label_spec = zoo.build_model(args.model, batch_size=args.batch_size,
                                                              input_shape=args.input_shape)
        name = f"{args.model}-b{args.batch_size}"
    else:
        model, loss, input_spec, label_spec = load_keras_file(args.keras_file, args.batch_size, args.input_shape)
        name = f"{getattr(model, 'name', 'model')}-b{args.batch_size}"
    lowered = lower(model, loss, input_spec, label_spec, level=args.level, cost_model=args.cost_model,
                    name=f"{name}-{args.level}", fused_batch_norm=args.fused_batch_norm)
    save_graph(lowered.graph, args.out)
    g = lowered.graph
    print(f"wrote {args.out}: {g.n} nodes ({len(g.forward_nodes)} forward, {len(g.backward_nodes)} backward, "
          f"{int((~g.recomputable).sum())} non-recomputable), {len(g.edges)} edges; {args.level} level, "
          f"costs in {lowered.metadata['cost_unit']}; activations {int(g.mem.sum())} bytes, "
          f"fixed {g.fixed_mem} bytes")
    return EXIT_OK
