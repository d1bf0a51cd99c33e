"""level="auto" splits the layer nodes inside composite layers (a transformer block) into op nodes
while the graph stays within AUTO_OP_NODE_LIMIT nodes; layers outside composites keep one node, except
that a layer's non-linear activation that does not run in place (GELU) gets nodes of its own."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import checkmate  # noqa: E402
import checkmate.tf2  # noqa: E402
from checkmate.tf2.lowering import grouping  # noqa: E402

BATCH, SEQ, WIDTH = 4, 16, 32


class Block(keras.layers.Layer):
    """A pre-norm MLP block: its sublayers hold the activations."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.norm = keras.layers.LayerNormalization(name="norm")
        self.up = keras.layers.Dense(4 * WIDTH, activation="gelu", name="up")
        self.down = keras.layers.Dense(WIDTH, name="down")

    def call(self, x):
        return x + self.down(self.up(self.norm(x)))


def model():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((SEQ, WIDTH))
    h = keras.layers.Dense(WIDTH, name="stem")(inputs)
    for k in range(2):
        h = Block(name=f"block_{k}")(h)
    return keras.Model(inputs, keras.layers.Dense(8, name="head")(h))


SPECS = (tf.TensorSpec((BATCH, SEQ, WIDTH), tf.float32), tf.TensorSpec((BATCH, SEQ), tf.int32))
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def lowered(m):
    return checkmate.tf2.lower(m, LOSS, *SPECS, level="auto", gradient_nodes=True, cost_model="flops")


def layer_nodes(graph, layer):
    """The forward nodes of ``layer``: its node and the part its backward reads (``:saved``)."""
    return sorted(n for n in graph.names if n.split(":")[0] == layer)


def test_layers_inside_composites_get_op_nodes_and_the_others_keep_one(monkeypatch):
    m = model()
    fine = lowered(m)
    monkeypatch.setattr(grouping, "AUTO_OP_NODE_LIMIT", 0)
    coarse = lowered(m)
    assert fine.level == coarse.level == "mixed"
    assert fine.graph.n > coarse.graph.n
    # the block's dense layer with its activation: at the limit 0 a layer node (and the part its
    # backward reads), below the limit one node per op (named after the op's type)
    assert layer_nodes(coarse.graph, "block_0/up") == ["block_0/up", "block_0/up:saved"]
    assert len(layer_nodes(fine.graph, "block_0/up")) > 2
    # a layer outside every composite layer keeps its node
    assert layer_nodes(fine.graph, "stem") == layer_nodes(coarse.graph, "stem") == ["stem"]
    assert any(line.startswith("block_0: ") and "inside it one node per op" in line and " up" in line
               for line in fine.metadata["split_layers"])
    assert not any("inside it one node per op" in line for line in coarse.metadata["split_layers"])
    # the same ops, regrouped
    ops = lambda low: sorted(op for node in low.node_ops for op in node)
    assert ops(fine) == ops(coarse)


def test_the_split_stops_at_the_node_limit(monkeypatch):
    m = model()
    monkeypatch.setattr(grouping, "AUTO_OP_NODE_LIMIT", 0)
    base = lowered(m).graph.n
    monkeypatch.setattr(grouping, "AUTO_OP_NODE_LIMIT", base + 6)
    limited = lowered(m)
    assert base < limited.graph.n <= base + 6


def plain_model():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((SEQ, WIDTH))
    h = keras.layers.Dense(4 * WIDTH, activation="gelu", name="up")(inputs)
    h = keras.layers.Dense(2 * WIDTH, activation="relu", name="mid")(h)
    return keras.Model(inputs, keras.layers.Dense(8, name="head")(h))


def test_a_model_of_plain_layers_keeps_the_layer_graph_but_splits_at_a_gelu():
    m = plain_model()
    low = lowered(m)
    layer = checkmate.tf2.lower(m, LOSS, *SPECS, level="layer", gradient_nodes=True, cost_model="flops")
    assert not any("inside it one node per op" in line for line in low.metadata.get("split_layers") or ())
    # a linear layer and a ReLU (written in place after BiasAdd: one chain) keep their nodes
    for name in ("mid", "head"):
        assert layer_nodes(low.graph, name) == layer_nodes(layer.graph, name)
    # the GELU's temporaries become values of their own, apart from the matmul's output
    assert len(layer_nodes(low.graph, "up")) > len(layer_nodes(layer.graph, "up"))
    assert any("activation split at it" in line and line.endswith("up") for line in low.metadata["split_layers"])
    ops = lambda lw: sorted(op for node in lw.node_ops for op in node)
    assert ops(low) == ops(layer)


def test_an_activation_layer_keeps_its_node():
    """An Activation layer is only its activation: its node is the activation's already, with no
    matmul to recompute apart from it."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((SEQ, WIDTH))
    h = keras.layers.Dense(4 * WIDTH, name="up")(inputs)
    h = keras.layers.Activation("silu", name="act")(h)
    m = keras.Model(inputs, keras.layers.Dense(8, name="head")(h))
    low = lowered(m)
    layer = checkmate.tf2.lower(m, LOSS, *SPECS, level="layer", gradient_nodes=True, cost_model="flops")
    assert layer_nodes(low.graph, "act") == layer_nodes(layer.graph, "act")
    assert not any("activation split at it" in line for line in low.metadata.get("split_layers") or ())


def test_the_activation_split_stops_at_the_node_limit(monkeypatch):
    monkeypatch.setattr(grouping, "AUTO_OP_NODE_LIMIT", 0)
    low = lowered(plain_model())
    assert not any("activation split at it" in line for line in low.metadata.get("split_layers") or ())
    assert layer_nodes(low.graph, "up") == ["up", "up:saved"]


def assert_trains_as_keras(m, budget, split_says, seed):
    """Compile ``m`` at ``budget`` (its summary's split lines must say ``split_says``): the plan is
    within the budget and its loss and gradients are the plain tape's."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((BATCH, SEQ, WIDTH)).astype("float32")
    y = rng.integers(0, 8, (BATCH, SEQ)).astype("int32")
    step = checkmate.tf2.compile(m, LOSS, keras.optimizers.SGD(0.1), *SPECS, budget=budget, cost_model="flops")
    assert any(split_says in line for line in step.lowered.metadata["split_layers"])
    assert step.predicted.peak_memory_bytes <= step.result.budget_bytes
    got_loss, got = step.gradients(x, y)
    with tf.GradientTape() as tape:
        want_loss = LOSS(y, m(x, training=True))
    want = tape.gradient(want_loss, m.trainable_variables)
    np.testing.assert_allclose(float(got_loss), float(want_loss), rtol=1e-6)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-6)


def test_a_split_activation_trains_as_keras():
    assert_trains_as_keras(plain_model(), "90%", "activation split at it", seed=1)


def test_op_nodes_inside_composites_train_as_keras():
    assert_trains_as_keras(model(), "80%", "inside it one node per op", seed=0)
