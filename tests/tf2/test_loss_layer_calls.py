"""A model whose own ``compute_loss`` runs layers again (KerasHub's PARSeq runs its decoder once per
permutation of the label order, BASNet its backbone): those calls are layer nodes like the model's,
and the loss's own ops between them are runs of their own, instead of one loss node that both feeds
and reads every call (a cycle that merged the whole loss into one node)."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import checkmate  # noqa: E402
import checkmate.tf2  # noqa: E402
from checkmate.simulate import replay_plan  # noqa: E402

BATCH, STEPS, WIDTH, CALLS = 8, 16, 8, 4


class RunsAgainInItsLoss(keras.Model):
    """Its loss: the compiled loss, plus the decoder run again on the features rolled along the steps."""

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        total = super().compute_loss(x, y, y_pred, sample_weight, training=training)
        for k in range(1, CALLS):
            again = self.decoder(keras.ops.roll(x, k, axis=1))
            total = total + keras.ops.mean(keras.ops.square(again - y))
        return total


def build(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    decoder = keras.Sequential([keras.layers.Dense(64, activation="gelu"), keras.layers.Dense(64, activation="gelu"),
                                keras.layers.Dense(WIDTH)], name="decoder")
    inputs = keras.Input((STEPS, WIDTH))
    model = RunsAgainInItsLoss(inputs, decoder(inputs), name="runs_again")
    model.decoder = decoder
    return model


def data(n: int = 3 * BATCH):
    rng = np.random.default_rng(5)
    return (rng.standard_normal((n, STEPS, WIDTH)).astype("float32"),
            rng.standard_normal((n, STEPS, WIDTH)).astype("float32"))


def _compile(model):
    model.compile(keras.optimizers.SGD(0.05), "mse")
    return model


def test_layers_the_loss_calls_are_nodes_of_their_own_between_runs_of_the_loss():
    x, y = data()
    trainer = _compile(checkmate.tf2.RematModel(build(), budget="100%"))
    lowered = trainer.compiled_step(tf.convert_to_tensor(x[:BATCH]), tf.convert_to_tensor(y[:BATCH])).lowered
    g = lowered.graph
    names = [nd.name for nd in g.nodes]
    ops = lowered.function.graph.get_operations()
    kind = {op.name: op.type for op in ops}
    for k in range(2, CALLS + 1):
        assert any(n.startswith(f"decoder#{k}/") and not g.backward[i] for i, n in enumerate(names)), names
    # no forward loss node holds a matrix product: those are the decoder's, in the decoder's nodes
    for i, n in enumerate(names):
        if n.startswith("loss") and not g.backward[i]:
            assert not any(kind[op] in ("MatMul", "BatchMatMulV2") for op in lowered.node_ops[i]), n
    assert {"loss", "loss@2", "loss@3", "loss@4"} <= {n.split(":")[0] for n in names}


def test_it_trains_as_keras_at_half_of_checkpoint_all():
    x, y = data()
    want = _compile(build()).fit(x, y, batch_size=BATCH, shuffle=False, verbose=0).history["loss"]
    trainer = _compile(checkmate.tf2.RematModel(build(), budget="50%"))
    got = trainer.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0).history["loss"]
    np.testing.assert_allclose(got, want, rtol=1e-5)
    step = trainer.compiled_step()
    assert replay_plan(step.lowered.graph, step.schedule.plan).peak_memory_bytes <= step.predicted.budget_bytes


class ConsistentOnFlips(keras.Model):
    """A consistency loss: the network run again in the loss on the images flipped left to right."""

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        total = super().compute_loss(x, y, y_pred, sample_weight, training=training)
        flipped = self.net(tf.reverse(x, axis=[2]), training=training)
        return total + 0.1 * keras.ops.mean(keras.ops.square(flipped - y_pred))


def _consistent_resnet() -> keras.Model:
    keras.utils.set_random_seed(0)
    net = keras.applications.ResNet50V2(weights=None, input_shape=(32, 32, 3), classes=10)
    inputs = keras.Input((32, 32, 3))
    model = ConsistentOnFlips(inputs, net(inputs))
    model.net = net
    model.compile(keras.optimizers.SGD(0.01, momentum=0.9), "sparse_categorical_crossentropy")
    return model


@pytest.mark.slow
def test_a_network_run_again_in_its_loss_trains_as_keras_at_half_of_its_activations():
    # Its plan gates a gradient sum apart from the BiasAddGrad of the same computation (oneDNN would
    # fuse that BiasAddGrad with another layer's filter gradient); the gate is part of that
    # computation, not a step of its own between two of its ops (which read as a cycle).
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, 8)
    want = _consistent_resnet().fit(x, y, batch_size=4, shuffle=False, verbose=0).history["loss"]
    trainer = checkmate.tf2.RematModel(_consistent_resnet(), budget="50% activations")
    trainer.compile(keras.optimizers.SGD(0.01, momentum=0.9), "sparse_categorical_crossentropy")
    got = trainer.fit(x, y, batch_size=4, shuffle=False, verbose=0).history["loss"]
    np.testing.assert_allclose(got, want, rtol=1e-5)
    step = trainer.compiled_step()
    assert any(name.startswith("resnet50v2#2/") for name in (nd.name for nd in step.lowered.graph.nodes))
    assert replay_plan(step.lowered.graph, step.schedule.plan).peak_memory_bytes <= step.predicted.budget_bytes
