"""A user's saved Keras model for ``checkmate compile`` and ``checkmate extract``: a ``.keras`` file
with any number of inputs and outputs, its custom objects from ``--custom-objects module:attr``, the
input shapes from the model and the loss from its compiled configuration.

TensorFlow and Keras are imported when a model is loaded, not when this module is imported.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from typing import Any

from checkmate.errors import InvalidArgumentError

__all__ = ["UserModel", "is_model_file", "load_custom_objects", "load_keras_file", "CUSTOM_OBJECTS_HELP"]

CUSTOM_OBJECTS_HELP = ("custom layers, losses and functions the saved model needs: MODULE:ATTR names a dict of "
                       "them (MODULE importable from the current directory), e.g. mymod:CUSTOM_OBJECTS")


@dataclass
class UserModel:
    """A loaded model and the specs of one training batch (nests that follow its inputs and outputs)."""

    model: Any
    loss: Any
    input_spec: Any
    label_spec: Any
    name: str


def is_model_file(name: str) -> bool:
    """Whether ``--model NAME`` names a saved Keras model rather than one of the zoo's."""
    return name.endswith(".keras") or os.sep in name or os.path.isfile(name)


def load_custom_objects(spec: str | None) -> dict | None:
    """The dict named by ``module:attr``, the module imported with the current directory first on the
    path (where a user's own module lives). ``None`` for no spec."""
    if spec is None:
        return None
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise InvalidArgumentError(f"--custom-objects {spec!r}: expected MODULE:ATTR, e.g. mymod:CUSTOM_OBJECTS")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidArgumentError(f"--custom-objects {spec!r}: cannot import {module_name!r} from {cwd} "
                                   f"({exc})") from None
    try:
        value = getattr(module, attr)
    except AttributeError:
        raise InvalidArgumentError(f"--custom-objects {spec!r}: module {module_name!r} has no {attr!r}") from None
    if not isinstance(value, dict):
        raise InvalidArgumentError(f"--custom-objects {spec!r}: {attr} is a {type(value).__name__}, expected a dict "
                                   "from names to custom layers, losses and functions")
    return value


def _cause(exc: Exception, limit: int = 300) -> str:
    """The part of a Keras loading error that says what went wrong, on one line: Keras wraps the cause
    ("Exception encountered: Could not locate class ...") in the whole model's configuration."""
    text = str(exc)
    marker = "Exception encountered:"
    if marker in text:
        text = text.split(marker, 1)[1]
    text = text.split("Full object config", 1)[0]
    text = " ".join(text.split()).rstrip(" .")
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _loss_name(loss: Any) -> str:
    if isinstance(loss, str):
        return loss
    return str(getattr(loss, "name", None) or getattr(loss, "__name__", None) or type(loss).__name__)


def _label_spec(loss: Any, output_shape: tuple, batch_size: int):
    import tensorflow as tf

    # A sparse categorical loss takes class indices: the output's shape without its class axis.
    if loss is not None and "sparse" in _loss_name(loss).lower():
        return tf.TensorSpec((batch_size, *output_shape[1:-1]), tf.int32)
    return tf.TensorSpec((batch_size, *output_shape[1:]), tf.float32)


def load_keras_file(path: str, batch_size: int, input_shape: tuple[int, ...] | None = None,
                    custom_objects: dict | None = None) -> UserModel:
    """Load a ``.keras`` file compiled with a loss: the model, the loss as compiled (one, a list or a
    dict for several outputs) and the batch's input and label specs, nested as the model's inputs and
    outputs. ``input_shape`` (without the batch) fills free dimensions of a single input."""
    import keras
    import numpy as np
    import tensorflow as tf

    if not os.path.exists(path):
        raise FileNotFoundError(2, "No such file or directory", path)
    try:
        model = keras.saving.load_model(path, custom_objects=custom_objects, compile=True)
    except Exception as exc:  # noqa: BLE001 - Keras raises many types for unreadable files
        hint = "" if custom_objects else "; a model with custom objects needs --custom-objects MODULE:ATTR"
        raise InvalidArgumentError(f"cannot load Keras model {path!r}: {_cause(exc)}{hint}") from None
    loss = getattr(model, "loss", None)
    if loss is None:
        raise InvalidArgumentError(f"{path}: the model has no compiled loss; save it after model.compile(loss=...)")
    inputs = list(getattr(model, "inputs", None) or [])
    if not inputs:
        raise InvalidArgumentError(f"{path}: the model has no declared inputs (save a functional or built model)")
    if input_shape is not None and len(inputs) != 1:
        raise InvalidArgumentError(f"{path}: --input-shape is for a model with one input; this one has "
                                   f"{len(inputs)}, whose shapes come from the model")
    specs = []
    for k, tensor in enumerate(inputs):
        declared = tuple(tensor.shape[1:])
        dims = tuple(input_shape) if input_shape is not None else declared
        if len(dims) != len(declared) or any(d is not None and d != s for d, s in zip(declared, dims)):
            raise InvalidArgumentError(f"{path}: --input-shape {dims} does not match the model's input {declared}")
        if any(d is None for d in dims):
            what = f"input {getattr(tensor, 'name', k)!r}" if len(inputs) > 1 else "the input"
            raise InvalidArgumentError(f"{path}: {what} has free dimensions {declared}"
                                       + ("; pass --input-shape" if len(inputs) == 1 else ""))
        specs.append(tf.TensorSpec((batch_size, *dims), tf.as_dtype(tensor.dtype or "float32")))
    structure = model.input if len(inputs) > 1 else None
    input_spec = (tf.nest.pack_sequence_as(structure, specs) if structure is not None
                  and not isinstance(structure, keras.KerasTensor) else specs[0] if len(specs) == 1 else specs)
    # the outputs' shapes for this batch, free dimensions resolved, from one forward pass on zeros
    zeros = tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), input_spec)
    outputs = model(zeros, training=False)
    flat_out = tf.nest.flatten(outputs)
    if len(flat_out) > 1 and not isinstance(loss, (list, tuple, dict)):
        loss = [loss] * len(flat_out)     # as Keras applies one compiled loss to every output
    names = list(getattr(model, "output_names", None) or [f"output_{k}" for k in range(len(flat_out))])
    if len(flat_out) == 1:
        loss_one = loss[0] if isinstance(loss, (list, tuple)) and len(loss) == 1 else (
            next(iter(loss.values())) if isinstance(loss, dict) and len(loss) == 1 else loss)
        label_spec = _label_spec(loss_one, tuple(np.shape(flat_out[0])), batch_size)
    else:
        per_output = []
        for k, out in enumerate(flat_out):
            if isinstance(loss, dict):
                fn = loss.get(names[k])
            elif isinstance(loss, (list, tuple)):
                fn = loss[k] if k < len(loss) else None
            else:
                fn = loss
            per_output.append(_label_spec(fn, tuple(np.shape(out)), batch_size))
        label_spec = dict(zip(names, per_output)) if isinstance(loss, dict) else per_output
    return UserModel(model, loss, input_spec, label_spec, getattr(model, "name", None) or "model")
