"""A function call op whose function only computes (Keras runs a grouped convolution on CPU as a call
of an XLA-compiled function: KerasHub's HGNetV2, MobileNet and D-FINE)
is a recomputable node; a call whose function holds a stateful op (a random draw) is not."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import checkmate  # noqa: E402
import checkmate.tf2  # noqa: E402
from checkmate.simulate import replay_plan  # noqa: E402

BATCH = 4


def grouped(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    layers = keras.layers
    inputs = keras.Input((16, 16, 8))
    h = inputs
    for k in range(4):
        h = layers.Conv2D(16, 3, padding="same", groups=4, activation="relu", name=f"grouped{k}")(h)
    outputs = layers.Dense(3)(layers.GlobalAveragePooling2D()(h))
    return keras.Model(inputs, outputs, name="grouped")


def data(n: int = 3 * BATCH):
    rng = np.random.default_rng(2)
    return rng.standard_normal((n, 16, 16, 8)).astype("float32"), rng.integers(0, 3, n).astype("int32")


def _compile(model):
    model.compile(keras.optimizers.SGD(0.05), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _call_nodes(step) -> list[int]:
    kind = {op.name: op.type for op in step.lowered.function.graph.get_operations()}
    return [i for i, ops in enumerate(step.lowered.node_ops)
            if any(kind.get(op) == "StatefulPartitionedCall" for op in ops)]


def test_grouped_convolutions_are_recomputed_and_train_as_keras():
    x, y = data()
    want = _compile(grouped()).fit(x, y, batch_size=BATCH, shuffle=False, verbose=0).history["loss"]
    trainer = _compile(checkmate.tf2.RematModel(grouped(), budget="60% activations"))
    got = trainer.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0).history["loss"]
    np.testing.assert_allclose(got, want, rtol=1e-5)
    step = trainer.compiled_step()
    calls = _call_nodes(step)
    graph = step.lowered.graph
    assert calls and all(graph.recomputable[i] for i in calls), [graph.nodes[i].name for i in calls]
    # the plan runs some of them twice, and the step it runs is the plan's
    counts = np.asarray(step.schedule.recompute.sum(axis=0))
    assert any(counts[i] > 1 for i in calls), [(graph.nodes[i].name, int(counts[i])) for i in calls]
    assert replay_plan(graph, step.schedule.plan).peak_memory_bytes <= step.predicted.budget_bytes


class NoisyScale(keras.layers.Layer):
    """Multiplies by noise drawn inside a function of its own: a call op holding a stateful random op."""

    def call(self, inputs):
        # a function of its own for each call: traced for the shapes of that call
        return tf.function(lambda t: t * tf.random.uniform(tf.shape(t), 0.9, 1.1))(inputs)


def test_a_call_that_draws_random_numbers_is_not_recomputable():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((16, 16, 8))
    h = keras.layers.Conv2D(8, 3, padding="same", groups=2, name="grouped")(inputs)
    h = NoisyScale(name="noisy")(h)
    model = _compile(keras.Model(inputs, keras.layers.Dense(3)(keras.layers.GlobalAveragePooling2D()(h))))
    x, y = data(BATCH)
    trainer = _compile(checkmate.tf2.RematModel(model, budget="100%"))
    step = trainer.compiled_step(tf.convert_to_tensor(x), tf.convert_to_tensor(y))
    kind = {op.name: op.type for op in step.lowered.function.graph.get_operations()}
    graph = step.lowered.graph
    names = {graph.nodes[i].name.split(":")[0]: i for i in _call_nodes(step)}
    noisy = [i for i, ops in enumerate(step.lowered.node_ops)
             if any(kind.get(op) in ("StatefulPartitionedCall", "PartitionedCall") for op in ops)
             and graph.nodes[i].name.startswith("noisy") and not graph.backward[i]]
    assert noisy and not any(graph.recomputable[i] for i in noisy)
    assert any(n.startswith("grouped") for n in names) and all(
        graph.recomputable[i] for n, i in names.items() if n.startswith("grouped") and not graph.backward[i])
