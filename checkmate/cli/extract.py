"""``checkmate extract``: lower a zoo model or a saved Keras model (``.keras``, any number of inputs and
outputs, custom objects from ``--custom-objects``) to a training graph file.

TensorFlow is imported when the command runs, not when this module is imported.
"""

from __future__ import annotations

import argparse

from checkmate.cli._common import EXIT_OK, command, path, positive_int, shape
from checkmate.cli.user_model import CUSTOM_OBJECTS_HELP, is_model_file, load_custom_objects, load_keras_file

__all__ = ["add_parser", "run", "load_keras_file"]


def add_parser(sub) -> None:
    p = sub.add_parser("extract", help="lower a Keras model to a training graph file")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", metavar="NAME", help="a model of checkmate.tf2.zoo, or a saved .keras file")
    src.add_argument("--keras-file", type=path, metavar="F.keras", help="a saved Keras model (any number of inputs and outputs)")
    p.add_argument("--custom-objects", metavar="MODULE:ATTR", default=None, help=CUSTOM_OBJECTS_HELP)
    p.add_argument("--batch-size", type=positive_int, required=True)
    p.add_argument("--input-shape", type=shape, default=None, metavar="H,W,C")
    p.add_argument("--level", choices=("layer", "op", "auto"), default="layer")
    p.add_argument("--cost-model", choices=("profile", "flops"), default="profile")
    p.add_argument("--fused-batch-norm", action="store_true",
                   help="lower BatchNormalization on TensorFlow's fused kernel (see checkmate compile --help)")
    p.add_argument("--out", type=path, required=True, metavar="GRAPH.json")
    p.set_defaults(handler=command(run, tensorflow=True))


def run(args: argparse.Namespace) -> int:
    from checkmate.graph import save_graph
    from checkmate.io import output_target, refuse_input_as_output
    from checkmate.tf2.lowering import lower

    path = args.keras_file or (args.model if is_model_file(args.model) else None)
    refuse_input_as_output(args.out, path)
    output_target(args.out)  # an unwritable --out is refused before the model is built and profiled
    custom_objects = load_custom_objects(args.custom_objects)
    if path is None:
        from checkmate.tf2 import zoo

        model, loss, input_spec, label_spec = zoo.build_model(args.model, batch_size=args.batch_size,
                                                              input_shape=args.input_shape)
        name = f"{args.model}-b{args.batch_size}"
    else:
        user = load_keras_file(path, args.batch_size, args.input_shape, custom_objects)
        model, loss, input_spec, label_spec = user.model, user.loss, user.input_spec, user.label_spec
        name = f"{user.name}-b{args.batch_size}"
    lowered = lower(model, loss, input_spec, label_spec, level=args.level, cost_model=args.cost_model,
                    name=f"{name}-{args.level}", fused_batch_norm=args.fused_batch_norm)
    save_graph(lowered.graph, args.out)
    g = lowered.graph
    print(f"wrote {args.out}: {g.n} nodes ({len(g.forward_nodes)} forward, {len(g.backward_nodes)} backward, "
          f"{int((~g.recomputable).sum())} non-recomputable), {len(g.edges)} edges; {args.level} level, "
          f"costs in {lowered.metadata['cost_unit']}; activations {int(g.mem.sum())} bytes, "
          f"fixed {g.fixed_mem} bytes")
    return EXIT_OK
