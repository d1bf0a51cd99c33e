"""lower(..., fused_batch_norm=True): BatchNormalization on TensorFlow's fused kernel.

The fused call must compute what Keras' layer computes (outputs, gradients, moving statistics) to
rounding, leave the model untouched, fall back to Keras' code where the kernel does not apply, and
give a graph whose working set is smaller while checkpoint-all's peak is not larger; a compiled step on
it must train as plain Keras does.
"""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import checkmate  # noqa: E402
from checkmate.bounds import checkpoint_all_peak, largest_working_set_bytes  # noqa: E402
from checkmate.tf2 import _compat  # noqa: E402
from checkmate.tf2.lowering import lower  # noqa: E402
from checkmate.tf2.lowering.batch_norm import fused_batch_norm_call  # noqa: E402

pytestmark = pytest.mark.tf


def _layer(shape, seed=0, **kwargs):
    keras.utils.set_random_seed(seed)
    bn = keras.layers.BatchNormalization(**kwargs)
    bn.build(shape)
    rng = np.random.default_rng(seed)
    channels = shape[bn.axis if isinstance(bn.axis, int) else bn.axis[0]]
    if bn.scale:
        bn.gamma.assign(rng.uniform(0.5, 1.5, channels).astype("float32"))
    if bn.center:
        bn.beta.assign(rng.standard_normal(channels).astype("float32"))
    bn.moving_mean.assign(rng.standard_normal(channels).astype("float32"))
    bn.moving_variance.assign(rng.uniform(0.5, 2.0, channels).astype("float32"))
    return bn


def _run(bn, call, x, dy, training=True):
    """Output, gradients (x, trainable weights) and the moving statistics after the call, from the
    layer's current statistics (restored afterwards)."""
    before = [v.numpy() for v in (bn.moving_mean, bn.moving_variance)]

    @tf.function
    def step(x, dy):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = call(x, training=training)
        grads = tape.gradient(y, [x, *bn.trainable_variables], output_gradients=tf.cast(dy, y.dtype))
        return y, grads

    y, grads = step(x, dy)
    after = [v.numpy() for v in (bn.moving_mean, bn.moving_variance)]
    for v, value in zip((bn.moving_mean, bn.moving_variance), before):
        v.assign(value)
    graph_ops = {op.type for op in step.get_concrete_function(x, dy).graph.get_operations()}
    return [np.asarray(t, np.float64) for t in (y, *grads, *after)], graph_ops


def _assert_close(got, want, rel=2e-5):
    for a, b in zip(got, want):
        scale = max(1.0, float(np.max(np.abs(b))))
        np.testing.assert_allclose(a, b, rtol=0, atol=rel * scale)


@pytest.mark.parametrize("kwargs", [{}, {"center": False}, {"scale": False, "momentum": 0.9, "epsilon": 1e-4}])
@pytest.mark.parametrize("shape", [(8, 3, 3, 16), (4, 20, 12, 8)])
def test_fused_call_computes_what_keras_computes(shape, kwargs):
    bn = _layer(shape, **kwargs)
    rng = np.random.default_rng(1)
    x = tf.constant(rng.standard_normal(shape) * 3 + 1, tf.float32)
    dy = tf.constant(rng.standard_normal(shape), tf.float32)
    want, keras_ops = _run(bn, bn.call, x, dy)
    got, fused_ops = _run(bn, fused_batch_norm_call(bn, bn.call), x, dy)
    assert "FusedBatchNormV3" in fused_ops and "FusedBatchNormGradV3" in fused_ops
    assert "FusedBatchNormV3" not in keras_ops
    _assert_close(got, want)


def test_fused_call_under_mixed_precision():
    """float16 activations: statistics in float32 as Keras computes them, output in float16."""
    shape = (8, 6, 6, 8)
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    try:
        bn = _layer(shape)
    finally:
        keras.config.set_dtype_policy(previous)
    rng = np.random.default_rng(2)
    x = tf.constant(rng.standard_normal(shape), tf.float16)
    dy = tf.constant(rng.standard_normal(shape), tf.float16)
    want, _ = _run(bn, bn.call, x, dy)
    got, ops = _run(bn, fused_batch_norm_call(bn, bn.call), x, dy)
    assert "FusedBatchNormV3" in ops
    _assert_close(got, want, rel=2e-3)   # float16 outputs and input gradients


@pytest.mark.parametrize("case", ["channels_first", "rank2", "inference"])
def test_calls_the_kernel_does_not_cover_run_keras_code(case):
    shape = {"channels_first": (4, 8, 5, 5), "rank2": (16, 8), "inference": (4, 5, 5, 8)}[case]
    bn = _layer(shape, axis=1 if case == "channels_first" else -1)
    rng = np.random.default_rng(3)
    x = tf.constant(rng.standard_normal(shape), tf.float32)
    dy = tf.constant(rng.standard_normal(shape), tf.float32)
    training = case != "inference"
    want, _ = _run(bn, bn.call, x, dy, training=training)
    got, ops = _run(bn, fused_batch_norm_call(bn, bn.call), x, dy, training=training)
    assert "FusedBatchNormV3" not in ops
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def conv_bn_model(batch=8, size=32, seed=0):
    """Conv-BN-ReLU blocks, one with a nested BatchNormalization: the BN backward sets the working set."""
    keras.utils.set_random_seed(seed)
    layers = keras.layers
    inner_in = keras.Input((size // 2, size // 2, 16))
    inner = keras.Model(inner_in, layers.ReLU()(layers.BatchNormalization(name="inner_bn")(inner_in)),
                        name="inner")
    inp = keras.Input((size, size, 3))
    x = inp
    for k, filters in enumerate((16, 16)):
        x = layers.Conv2D(filters, 3, padding="same", use_bias=False, name=f"conv{k}")(x)
        x = layers.BatchNormalization(name=f"bn{k}")(x)
        x = layers.ReLU(name=f"relu{k}")(x)
    x = layers.MaxPooling2D()(x)
    x = inner(x)
    x = layers.Conv2D(16, 3, padding="same", name="conv2")(x)
    x = layers.GlobalAveragePooling2D()(x)
    out = layers.Dense(5, name="logits")(x)
    model = keras.Model(inp, out)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return model, loss, tf.TensorSpec((batch, size, size, 3), tf.float32), tf.TensorSpec((batch,), tf.int32)


@pytest.mark.parametrize("gradient_nodes", [False, True])
def test_fused_lowering_shrinks_the_working_set_not_checkpoint_all(gradient_nodes):
    model, loss, xs, ys = conv_bn_model()
    keras_graph = lower(model, loss, xs, ys, gradient_nodes=gradient_nodes, progress=False)
    fused = lower(model, loss, xs, ys, gradient_nodes=gradient_nodes, fused_batch_norm=True, progress=False)
    assert fused.metadata["fused_batch_norm"] and not keras_graph.metadata["fused_batch_norm"]
    ops = {op.type for op in fused.function.graph.get_operations()}
    assert {"FusedBatchNormV3", "FusedBatchNormGradV3"} <= ops
    # the model is left as it was: no call substituted after the trace, nested layers included
    from checkmate.tf2.lowering.trace import walk_layers

    assert not any("call" in vars(layer) for layer in walk_layers(model))
    fixed = keras_graph.graph.fixed_mem
    assert fused.graph.fixed_mem == fixed
    ws_keras = largest_working_set_bytes(keras_graph.graph) - fixed
    ws_fused = largest_working_set_bytes(fused.graph) - fixed
    assert ws_fused <= 0.8 * ws_keras, (ws_fused, ws_keras)
    # the per-channel statistics the backward reads are held without the layer's output
    assert checkpoint_all_peak(fused.graph) <= checkpoint_all_peak(keras_graph.graph) * 1.01
    if gradient_nodes:
        assert {"bn0:saved", "bn1:saved"} <= set(fused.graph.names)


def test_compiled_fused_step_trains_as_keras_fit():
    """Three fit steps of a recomputing plan on the fused graph: losses, weights and moving statistics
    of plain Keras training (which normalizes with separate ops) to rounding."""
    steps = 3
    model, loss, xs, ys = conv_bn_model()
    other = conv_bn_model()[0]
    for a, b in zip(model.variables, other.variables):
        b.assign(a)
    batch = int(xs.shape[0])
    rng = np.random.default_rng(4)
    data_x = rng.standard_normal((steps * batch, *xs.shape[1:])).astype("float32")
    data_y = rng.integers(0, 5, size=(steps * batch,)).astype("int32")
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss=loss)
    with _compat.grappler_disabled():
        plain = model.fit(data_x, data_y, batch_size=batch, epochs=1, shuffle=False, verbose=0)

    step = checkmate.tf2.compile(other, loss, keras.optimizers.SGD(0.05, momentum=0.9), xs, ys, budget="70%",
                                 strategy="checkmate_milp", fused_batch_norm=True, time_limit_s=30)
    assert step.schedule.recompute_count > 0
    assert step.lowered.metadata["fused_batch_norm"]
    assert "fused kernel" in step.summary()
    history = step.keras_model().fit(data_x, data_y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    np.testing.assert_allclose(history.history["loss"], plain.history["loss"], rtol=1e-4)
    for a, b in zip(model.variables, other.variables):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-4, atol=1e-5, err_msg=a.path)


def test_remat_model_takes_the_option_through_compile_options():
    model, loss, xs, ys = conv_bn_model()
    batch = int(xs.shape[0])
    rng = np.random.default_rng(5)
    data_x = rng.standard_normal((2 * batch, *xs.shape[1:])).astype("float32")
    data_y = rng.integers(0, 5, size=(2 * batch,)).astype("int32")
    remat = checkmate.tf2.RematModel(model, budget="70%", strategy="checkmate_lp_rounding",
                                     compile_options={"fused_batch_norm": True, "time_limit_s": 30})
    remat.compile(optimizer=keras.optimizers.SGD(0.01), loss=loss)
    history = remat.fit(data_x, data_y, batch_size=batch, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    steps = list(remat.compiled_steps.values())
    assert steps and all(s.lowered.metadata["fused_batch_norm"] for s in steps)


def test_fused_layers_are_not_split_for_workspace_under_mixed_precision():
    """tf.custom_gradient passes the kernel's outputs on through IdentityN, a view: it allocates
    nothing, so it must not make a fused layer look like a node with a large workspace."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    try:
        model, loss, xs, ys = conv_bn_model()
    finally:
        keras.config.set_dtype_policy(previous)
    fused = lower(model, loss, xs, ys, gradient_nodes=True, fused_batch_norm=True, progress=False)
    split = fused.metadata["split_workspace_nodes"]
    assert not any(name.startswith(("bn0", "bn1")) for name in split), split
    assert not any(name.endswith(":IdentityN") for name in fused.graph.names)
