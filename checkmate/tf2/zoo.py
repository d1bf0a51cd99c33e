"""The paper's architectures, without downloaded weights, plus small models for tests.

Every entry builds ``(model, loss, input_spec, label_spec)`` at any batch size and input size the
architecture admits:

* classification (``keras.applications`` with ``weights=None``): ``vgg16``, ``vgg19``, ``mobilenet``,
  ``resnet50`` — labels are class ids, shape ``(B,)``;
* segmentation (written here): ``unet`` (Ronneberger et al.), ``fcn8`` (Long et al., VGG16 encoder with
  pool3/pool4 skips), ``segnet`` (Badrinarayanan et al., conv-BN-ReLU encoder/decoder) — labels are
  per-pixel class ids, shape ``(B, H, W)``;
* small test models: ``mlp``, ``residual_cnn`` (convolutions, BatchNorm, residual adds, Dropout) and
  ``transformer`` (one pre-norm transformer block on a float sequence).

All models output logits; the loss is sparse categorical cross-entropy from logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

from checkmate.errors import InvalidArgumentError

__all__ = ["ZooModel", "build_model", "names", "describe", "default_input_shape"]


class ZooModel(NamedTuple):
    model: Any
    loss: Any
    input_spec: Any
    label_spec: Any


@dataclass(frozen=True)
class _Entry:
    builder: Callable[..., Any]
    input_shape: tuple[int, ...]
    num_classes: int
    batch_size: int
    kind: str  # "classification" | "segmentation"
    # spatial dimensions must be divisible by this (number of 2x poolings), 1 if unconstrained
    divisor: int
    min_size: int
    description: str


def _keras():
    import keras

    return keras


# ---------------------------------------------------------------------------------- applications
def _application(fn_name: str):
    def build(input_shape, num_classes):
        keras = _keras()
        fn = getattr(keras.applications, fn_name)
        return fn(weights=None, input_shape=input_shape, classes=num_classes, classifier_activation=None)

    return build


# ---------------------------------------------------------------------------------- segmentation
def _conv(x, filters, name, kernel=3, bn=False):
    layers = _keras().layers
    x = layers.Conv2D(filters, kernel, padding="same", activation=None if bn else "relu", name=name)(x)
    if bn:
        x = layers.BatchNormalization(name=f"{name}_bn")(x)
        x = layers.Activation("relu", name=f"{name}_relu")(x)
    return x


def _unet(input_shape, num_classes, base=64, depth=4):
    keras = _keras()
    layers = keras.layers
    inp = keras.Input(input_shape, name="image")
    skips = []
    x = inp
    for d in range(depth):
        filters = base * 2 ** d
        x = _conv(x, filters, f"down{d}_conv1")
        x = _conv(x, filters, f"down{d}_conv2")
        skips.append(x)
        x = layers.MaxPooling2D(name=f"down{d}_pool")(x)
    x = _conv(x, base * 2 ** depth, "bottom_conv1")
    x = _conv(x, base * 2 ** depth, "bottom_conv2")
    for d in reversed(range(depth)):
        filters = base * 2 ** d
        x = layers.Conv2DTranspose(filters, 2, strides=2, name=f"up{d}_upconv")(x)
        x = layers.Concatenate(name=f"up{d}_concat")([skips[d], x])
        x = _conv(x, filters, f"up{d}_conv1")
        x = _conv(x, filters, f"up{d}_conv2")
    out = layers.Conv2D(num_classes, 1, name="logits")(x)
    return keras.Model(inp, out, name="unet")


def _fcn8(input_shape, num_classes):
    keras = _keras()
    layers = keras.layers
    inp = keras.Input(input_shape, name="image")
    x = inp
    pools = []
    for block, (filters, convs) in enumerate([(64, 2), (128, 2), (256, 3), (512, 3), (512, 3)], start=1):
        for c in range(1, convs + 1):
            x = _conv(x, filters, f"block{block}_conv{c}")
        x = layers.MaxPooling2D(name=f"block{block}_pool")(x)
        pools.append(x)
    pool3, pool4 = pools[2], pools[3]
    x = layers.Conv2D(4096, 7, padding="same", activation="relu", name="fc6")(x)
    x = layers.Conv2D(4096, 1, activation="relu", name="fc7")(x)
    x = layers.Conv2D(num_classes, 1, name="score_fr")(x)
    x = layers.Conv2DTranspose(num_classes, 4, strides=2, padding="same", use_bias=False, name="upscore2")(x)
    s4 = layers.Conv2D(num_classes, 1, name="score_pool4")(pool4)
    x = layers.Add(name="fuse_pool4")([x, s4])
    x = layers.Conv2DTranspose(num_classes, 4, strides=2, padding="same", use_bias=False, name="upscore_pool4")(x)
    s3 = layers.Conv2D(num_classes, 1, name="score_pool3")(pool3)
    x = layers.Add(name="fuse_pool3")([x, s3])
    out = layers.Conv2DTranspose(num_classes, 16, strides=8, padding="same", use_bias=False, name="upscore8")(x)
    return keras.Model(inp, out, name="fcn8")


def _segnet(input_shape, num_classes):
    keras = _keras()
    layers = keras.layers
    inp = keras.Input(input_shape, name="image")
    plan = [(64, 2), (128, 2), (256, 3), (512, 3), (512, 3)]
    x = inp
    for block, (filters, convs) in enumerate(plan, start=1):
        for c in range(1, convs + 1):
            x = _conv(x, filters, f"enc{block}_conv{c}", bn=True)
        x = layers.MaxPooling2D(name=f"enc{block}_pool")(x)
    for block, (filters, convs) in reversed(list(enumerate(plan, start=1))):
        x = layers.UpSampling2D(name=f"dec{block}_up")(x)
        out_filters = plan[block - 2][0] if block > 1 else filters
        for c in range(1, convs + 1):
            x = _conv(x, filters if c < convs else out_filters, f"dec{block}_conv{c}", bn=True)
    out = layers.Conv2D(num_classes, 1, name="logits")(x)
    return keras.Model(inp, out, name="segnet")


# ---------------------------------------------------------------------------------- test models
def _mlp(input_shape, num_classes, widths=(128, 128, 128)):
    keras = _keras()
    inp = keras.Input(input_shape, name="features")
    x = inp
    for k, w in enumerate(widths):
        x = keras.layers.Dense(w, activation="relu", name=f"dense{k}")(x)
    out = keras.layers.Dense(num_classes, name="logits")(x)
    return keras.Model(inp, out, name="mlp")


def _residual_cnn(input_shape, num_classes, filters=8, blocks=2):
    keras = _keras()
    layers = keras.layers
    inp = keras.Input(input_shape, name="image")
    x = _conv(inp, filters, "stem", bn=True)
    for b in range(blocks):
        y = layers.Conv2D(filters, 3, padding="same", name=f"block{b}_conv1")(x)
        y = layers.BatchNormalization(name=f"block{b}_bn1")(y)
        y = layers.Activation("relu", name=f"block{b}_relu1")(y)
        y = layers.Conv2D(filters, 3, padding="same", name=f"block{b}_conv2")(y)
        y = layers.BatchNormalization(name=f"block{b}_bn2")(y)
        x = layers.Add(name=f"block{b}_add")([x, y])
        x = layers.Activation("relu", name=f"block{b}_out")(x)
    x = layers.GlobalAveragePooling2D(name="pool")(x)
    x = layers.Dropout(0.25, name="dropout")(x)
    out = layers.Dense(num_classes, name="logits")(x)
    return keras.Model(inp, out, name="residual_cnn")


def _transformer(input_shape, num_classes, heads=2, ff_mult=2):
    keras = _keras()
    layers = keras.layers
    seq, dim = input_shape
    inp = keras.Input(input_shape, name="tokens")
    h = layers.LayerNormalization(name="ln1")(inp)
    h = layers.MultiHeadAttention(num_heads=heads, key_dim=max(1, dim // heads), name="attention")(h, h)
    x = layers.Add(name="residual1")([inp, h])
    h = layers.LayerNormalization(name="ln2")(x)
    h = layers.Dense(dim * ff_mult, activation="gelu", name="ff1")(h)
    h = layers.Dense(dim, name="ff2")(h)
    x = layers.Add(name="residual2")([x, h])
    x = layers.GlobalAveragePooling1D(name="pool")(x)
    out = layers.Dense(num_classes, name="logits")(x)
    return keras.Model(inp, out, name="transformer")


_ZOO: dict[str, _Entry] = {
    "vgg16": _Entry(_application("VGG16"), (224, 224, 3), 1000, 32, "classification", 32, 32,
                    "VGG16 (Simonyan & Zisserman), keras.applications, random weights"),
    "vgg19": _Entry(_application("VGG19"), (224, 224, 3), 1000, 32, "classification", 32, 32,
                    "VGG19, keras.applications, random weights"),
    "mobilenet": _Entry(_application("MobileNet"), (224, 224, 3), 1000, 32, "classification", 32, 32,
                        "MobileNet v1 (Howard et al.), keras.applications, random weights"),
    "resnet50": _Entry(_application("ResNet50"), (224, 224, 3), 1000, 32, "classification", 32, 32,
                       "ResNet50 (He et al.), keras.applications, random weights"),
    "unet": _Entry(_unet, (256, 256, 3), 2, 8, "segmentation", 16, 16,
                   "U-Net (Ronneberger et al.): 4 down/up levels, 64 base filters, skip concatenations"),
    "fcn8": _Entry(_fcn8, (256, 256, 3), 21, 8, "segmentation", 32, 32,
                   "FCN-8s (Long et al.): VGG16 encoder, fc6/fc7 as convolutions, pool3/pool4 skips"),
    "segnet": _Entry(_segnet, (256, 256, 3), 12, 8, "segmentation", 32, 32,
                     "SegNet (Badrinarayanan et al.): conv-BN-ReLU encoder/decoder, 5 pooling levels"),
    "mlp": _Entry(_mlp, (64,), 10, 32, "classification", 1, 1, "3 hidden Dense(128, relu) layers"),
    "residual_cnn": _Entry(_residual_cnn, (32, 32, 3), 10, 8, "classification", 1, 4,
                           "small CNN: conv-BN stem, 2 residual blocks with BatchNorm, Dropout head"),
    "transformer": _Entry(_transformer, (16, 32), 10, 8, "classification", 1, 1,
                          "one pre-norm transformer block (2-head attention, GELU MLP) on a float sequence"),
}


def names() -> tuple[str, ...]:
    """Names accepted by :func:`build_model` (the paper's models first)."""
    return tuple(_ZOO)


def describe(name: str) -> str:
    return _entry(name).description


def default_input_shape(name: str) -> tuple[int, ...]:
    return _entry(name).input_shape


def _entry(name: str) -> _Entry:
    key = name.lower().replace("-", "_")
    if key not in _ZOO:
        raise InvalidArgumentError(f"unknown model {name!r}; the zoo has: {', '.join(_ZOO)}")
    return _ZOO[key]


def _check_shape(name: str, entry: _Entry, shape: tuple[int, ...]) -> None:
    if len(shape) != len(entry.input_shape):
        raise InvalidArgumentError(
            f"{name}: input shape {shape} must have {len(entry.input_shape)} dimensions, like {entry.input_shape}")
    if any(int(d) <= 0 for d in shape):
        raise InvalidArgumentError(f"{name}: input shape {shape} must be positive")
    if len(shape) == 3:
        for d in shape[:2]:
            if d < entry.min_size or d % entry.divisor:
                raise InvalidArgumentError(
                    f"{name}: spatial size {shape[:2]} must be at least {entry.min_size} and a multiple of "
                    f"{entry.divisor} (the network pools {entry.divisor.bit_length() - 1} times)")


def build_model(name: str, batch_size: int | None = None, input_shape: tuple[int, ...] | None = None,
                num_classes: int | None = None, *, seed: int = 0) -> ZooModel:
    """Build a zoo model with random weights, its loss, and fixed-batch input and label specs.

    ``batch_size``, ``input_shape`` (without the batch) and ``num_classes`` default to the entry's
    defaults (``describe(name)``; ``default_input_shape(name)``).
    """
    import tensorflow as tf

    keras = _keras()
    entry = _entry(name)
    shape = tuple(int(d) for d in (input_shape or entry.input_shape))
    _check_shape(name, entry, shape)
    batch = int(batch_size or entry.batch_size)
    if batch <= 0:
        raise InvalidArgumentError(f"batch size must be positive, got {batch_size}")
    classes = int(num_classes or entry.num_classes)
    if classes <= 1 and entry.kind == "classification":
        raise InvalidArgumentError(f"{name}: num_classes must be at least 2")
    keras.utils.set_random_seed(seed)
    model = entry.builder(shape, classes)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    input_spec = tf.TensorSpec((batch, *shape), tf.float32, name="x")
    if entry.kind == "segmentation":
        label_spec = tf.TensorSpec((batch, *shape[:2]), tf.int32, name="y")
    else:
        label_spec = tf.TensorSpec((batch,), tf.int32, name="y")
    return ZooModel(model, loss, input_spec, label_spec)
