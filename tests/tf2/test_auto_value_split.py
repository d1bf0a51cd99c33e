"""level="auto" splits a forward layer node whose value holds several large tensors (a Dense layer
with a GELU activation: the matmul output and the activation's intermediates) into op nodes."""

from __future__ import annotations

import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import checkmate  # noqa: E402
import checkmate.tf2  # noqa: E402
from checkmate.tf2.lowering.grouping import MULTI_TENSOR_VALUE_RATIO  # noqa: E402

BATCH = 256


def gelu_mlp():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((32,))
    hidden = keras.layers.Dense(512, activation="gelu", name="wide")(inputs)
    for k in range(3):     # deep enough that a schedule can drop and recompute the first layers
        hidden = keras.layers.Dense(512, activation="gelu", name=f"wide_{k}")(hidden)
    outputs = keras.layers.Dense(4, name="head")(hidden)
    return keras.Model(inputs, outputs)


def lowered(level):
    model = gelu_mlp()
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return checkmate.tf2.lower(model, loss, tf.TensorSpec((BATCH, 32), tf.float32), tf.TensorSpec((BATCH,), tf.int32),
                               level=level, gradient_nodes=True, cost_model="flops")


def test_auto_splits_a_value_of_several_large_tensors_into_op_nodes():
    layer, auto = lowered("layer"), lowered("auto")
    saved = [k for k, n in enumerate(layer.graph.names) if n.startswith("wide") and not layer.graph.backward[k]]
    # at layer level the GELU layer's value holds several of its (B, 512) tensors in one node
    tensor_bytes = BATCH * 512 * 4
    assert max(int(layer.graph.mem[k]) for k in saved) >= MULTI_TENSOR_VALUE_RATIO * tensor_bytes
    assert auto.level == "mixed"
    split = [n for n in auto.graph.names if n.startswith("wide") and ":MatMul" in n]
    assert split, auto.graph.names
    assert any("its value holds" in line and line.startswith("wide") for line in auto.metadata["split_layers"])
    # no forward node of the layer holds more than one of its tensors any more
    forward = [k for k, n in enumerate(auto.graph.names) if n.startswith("wide") and not auto.graph.backward[k]]
    assert max(int(auto.graph.mem[k]) for k in forward) <= tensor_bytes
    # the same ops, the same checkpoint-all peak: only the grouping changed
    assert sum(len(o) for o in auto.node_ops) == sum(len(o) for o in layer.node_ops)


def test_auto_split_trains_as_keras():
    import numpy as np

    model = gelu_mlp()
    x = np.random.default_rng(0).standard_normal((BATCH, 32)).astype("float32")
    y = np.arange(BATCH, dtype="int32") % 4
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    step = checkmate.tf2.compile(model, loss, keras.optimizers.SGD(0.1), tf.TensorSpec((BATCH, 32), tf.float32),
                                 tf.TensorSpec((BATCH,), tf.int32), budget="60% activations", cost_model="flops",
                                 time_limit_s=20)
    assert step.lowered.level == "mixed"
    assert step.predicted.recompute_count > 0     # the split nodes are recomputed, not only kept
    got_loss, got = step.gradients(x, y)
    with tf.GradientTape() as tape:
        want_loss = loss(y, model(x, training=True))
    want = tape.gradient(want_loss, model.trainable_variables)
    np.testing.assert_allclose(float(got_loss), float(want_loss), rtol=1e-6)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-6)


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
