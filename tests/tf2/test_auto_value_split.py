"""level="auto" splits the loss node, a step output through the loss scalar that also holds the
cross-entropy's gradient of the logits, into op nodes: only the loss stays resident to the end."""

from __future__ import annotations

import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import checkmate  # noqa: E402
import checkmate.tf2  # noqa: E402

BATCH = 64


def test_auto_splits_the_loss_node_so_the_logits_gradient_is_not_resident_to_the_end():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((16,))
    hidden = keras.layers.Dense(64, activation="relu", name="body")(inputs)
    logits = keras.layers.Dense(2000, name="vocabulary")(hidden)
    model = keras.Model(inputs, logits)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    specs = (tf.TensorSpec((BATCH, 16), tf.float32), tf.TensorSpec((BATCH,), tf.int32))
    layer = checkmate.tf2.lower(model, loss, *specs, level="layer", gradient_nodes=True, cost_model="flops")
    auto = checkmate.tf2.lower(model, loss, *specs, level="auto", gradient_nodes=True, cost_model="flops")
    logits_bytes = BATCH * 2000 * 4
    resident = lambda g: [g.names[k] for k in range(g.n)
                          if g.output[k] and not g.backward[k] and g.mem[k] >= logits_bytes]
    # at layer level the loss node (the loss and the cross-entropy's gradient of the logits) is an
    # output, so the plan keeps that gradient to the end of the step
    assert resident(layer.graph) == ["loss"]
    assert resident(auto.graph) == [] and auto.level == "mixed"
    assert any(line.startswith("loss: one node per op") for line in auto.metadata["split_layers"])


def test_split_loss_node_trains_as_keras():
    import numpy as np

    keras.utils.set_random_seed(0)
    inputs = keras.Input((16,))
    hidden = inputs
    for k in range(3):
        hidden = keras.layers.Dense(256, activation="relu", name=f"body_{k}")(hidden)
    model = keras.Model(inputs, keras.layers.Dense(2000, name="vocabulary")(hidden))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x = np.random.default_rng(0).standard_normal((BATCH, 16)).astype("float32")
    y = (np.arange(BATCH) * 7 % 2000).astype("int32")
    step = checkmate.tf2.compile(model, loss, keras.optimizers.SGD(0.1), tf.TensorSpec((BATCH, 16), tf.float32),
                                 tf.TensorSpec((BATCH,), tf.int32), budget="100%", cost_model="flops")
    assert any(line.startswith("loss: one node per op") for line in step.lowered.metadata["split_layers"])
    got_loss, got = step.gradients(x, y)
    with tf.GradientTape() as tape:
        want_loss = loss(y, model(x, training=True))
    want = tape.gradient(want_loss, model.trainable_variables)
    np.testing.assert_allclose(float(got_loss), float(want_loss), rtol=1e-6)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-6)
