"""An embedding's gradient reaches the optimizer as Keras' ``fit`` gives it: ``tf.IndexedSlices``, one
row per occurrence of an id. Keras' Adam, RMSprop and Adagrad update their slots per row (Adam's
squared gradient per occurrence, then a scatter-add), so an id that occurs twice in a batch moves the
weights differently from the dense sum's update. Ids drawn from 0-4 in batches of 8 x 6 repeat in
every batch. A tied embedding (read by a gather and a matmul) gets a dense gradient from TF's own
aggregation and stays dense."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import checkmate  # noqa: E402
from checkmate.tf2 import _compat  # noqa: E402
from isolation import ran_in_fresh_process  # noqa: E402

pytestmark = pytest.mark.tf

VOCAB = 50
DIM = 8
SEQ = 6
BATCH = 8
CLASSES = 3
EPOCHS = 3
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
# Chen et al.'s sqrt(n) checkpoints: a plan that recomputes segments, so the outputs cross a rewrite.
OPTIONS = dict(budget="100%", strategy="chen_sqrtn")
OPTIMIZERS = {"adam": lambda: keras.optimizers.Adam(1e-2), "rmsprop": lambda: keras.optimizers.RMSprop(1e-2),
              "adagrad": lambda: keras.optimizers.Adagrad(0.1)}


def embedding_model(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    ids = keras.Input((SEQ,), dtype="int32")
    h = keras.layers.Embedding(VOCAB, DIM, name="embedding")(ids)
    h = keras.layers.Dense(16, activation="relu", name="hidden0")(h)
    h = keras.layers.Dense(16, activation="relu", name="hidden1")(h)
    h = keras.layers.Flatten()(h)
    return keras.Model(ids, keras.layers.Dense(CLASSES, name="head")(h), name="embedding_model")


class TiedHead(keras.layers.Layer):
    """Embeds the ids and scores them against the same table (a gather and a matmul of one variable)."""

    def build(self, shape):
        self.table = self.add_weight(shape=(VOCAB, DIM), initializer="glorot_uniform", name="table")

    def call(self, ids):
        h = tf.gather(self.table, ids)
        return tf.reduce_mean(tf.matmul(h, self.table, transpose_b=True), axis=1)


def tied_model(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    ids = keras.Input((SEQ,), dtype="int32")
    return keras.Model(ids, TiedHead(name="tied")(ids), name="tied_model")


def data(n: int = 6 * BATCH, seed: int = 1, classes: int = CLASSES):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 5, size=(n, SEQ)).astype("int32"),
            rng.integers(0, classes, size=(n,)).astype("int32"))


def assert_same_weights(model, other, rtol=1e-6, atol=1e-7):
    for a, b in zip(model.variables, other.variables):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=rtol, atol=atol, err_msg=a.path)


def fit_pair(make_model, optimizer, x, y):
    model, other = make_model(), make_model()
    model.compile(optimizer(), LOSS, jit_compile=False)
    trainer = checkmate.tf2.RematModel(other, **OPTIONS)
    trainer.compile(optimizer(), LOSS)
    with _compat.grappler_disabled():
        want = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0).history["loss"]
    got = trainer.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0).history["loss"]
    return model, other, trainer, want, got


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_remat_model_applies_an_embeddings_sliced_gradient_as_keras_fit(name):
    x, y = data()
    model, other, trainer, want, got = fit_pair(embedding_model, OPTIMIZERS[name], x, y)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert_same_weights(model, other)
    lowered = trainer.compiled_step().lowered
    sliced = [v.path for v, t in zip(lowered.variables, lowered.grad_indices) if t is not None]
    assert sliced == ["embedding/embeddings"]
    # the values tensor holds one row per occurrence of an id, not the dense table
    graph = lowered.function.graph
    values = graph.get_tensor_by_name(lowered.grad_tensors[0])
    assert values.shape.as_list() == [BATCH * SEQ, DIM]


def test_compiled_step_trains_with_sliced_gradients_and_reports_dense_ones():
    x, y = data()
    plain, model = embedding_model(), embedding_model()
    plain.compile(keras.optimizers.Adam(1e-2), LOSS, jit_compile=False)
    specs = (tf.TensorSpec((BATCH, SEQ), tf.int32), tf.TensorSpec((BATCH,), tf.int32))
    step = checkmate.tf2.compile(model, LOSS, keras.optimizers.Adam(1e-2), *specs, **OPTIONS)

    # gradients() is the dense gradient a GradientTape's densified IndexedSlices gives
    loss, grads = step.gradients(x[:BATCH], y[:BATCH])
    plain_loss, plain_grads = step.plain_gradients(x[:BATCH], y[:BATCH])
    with tf.GradientTape() as tape:
        value = LOSS(y[:BATCH], model(x[:BATCH], training=True))
    want = tape.gradient(value, model.trainable_variables)
    assert isinstance(want[0], tf.IndexedSlices)
    for g, p, w in zip(grads, plain_grads, want):
        assert not isinstance(g, tf.IndexedSlices) and not isinstance(p, tf.IndexedSlices)
        np.testing.assert_allclose(g.numpy(), tf.convert_to_tensor(w).numpy(), rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(p.numpy(), tf.convert_to_tensor(w).numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(float(loss), float(value), rtol=1e-6)

    with _compat.grappler_disabled():
        for _ in range(EPOCHS):
            for start in range(0, len(x), BATCH):
                batch = (x[start:start + BATCH], y[start:start + BATCH])
                want_loss = plain.train_on_batch(*batch)
                got_loss = float(step(*batch))
                np.testing.assert_allclose(got_loss, want_loss, rtol=1e-6)
    assert_same_weights(plain, model)


def test_a_tied_embedding_gets_a_dense_gradient_and_trains_as_keras():
    x, y = data(classes=VOCAB)
    model, other, trainer, want, got = fit_pair(tied_model, OPTIMIZERS["adam"], x, y)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert_same_weights(model, other)
    lowered = trainer.compiled_step().lowered
    assert all(t is None for t in lowered.grad_indices)
    graph = lowered.function.graph
    assert graph.get_tensor_by_name(lowered.grad_tensors[0]).shape.as_list() == [VOCAB, DIM]


def test_the_plan_counts_the_sliced_gradients_not_the_dense_table():
    """The step holds the per-occurrence rows and their ids, not a vocabulary-sized table: the gradient
    bytes are those of the values and indices."""
    model = embedding_model()
    specs = (tf.TensorSpec((BATCH, SEQ), tf.int32), tf.TensorSpec((BATCH,), tf.int32))
    lowered = checkmate.tf2.lower(model, LOSS, *specs, level="op")
    rows = BATCH * SEQ
    dense = sum(int(np.prod(v.shape)) * 4 for v in model.trainable_variables)
    sliced = dense - VOCAB * DIM * 4 + rows * DIM * 4 + rows * 4
    assert lowered.metadata["grad_bytes"] == sliced
    # the ids are a step output: the node computing them is resident to the end of the step, at op
    # level and in the layer graph's gradient nodes
    for lowered in (lowered, checkmate.tf2.lower(model, LOSS, *specs, level="layer", gradient_nodes=True)):
        (indices,) = lowered.indices_tensors
        node = lowered.op_node[indices.rsplit(":", 1)[0]]
        assert lowered.graph.nodes[node].output, lowered.level


def test_mixed_float16_sliced_gradients_are_unscaled_as_keras_does():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        x, y = data()

        def optimizer():
            return keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(1e-2))

        model, other, trainer, want, got = fit_pair(embedding_model, optimizer, x, y)
        assert isinstance(trainer.optimizer, keras.optimizers.LossScaleOptimizer)
        np.testing.assert_allclose(got, want, rtol=1e-5)
        assert_same_weights(model, other, rtol=1e-4, atol=1e-5)
        assert any(t is not None for t in trainer.compiled_step().lowered.grad_indices)
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_sliced_gradients_under_mirrored_strategy_match_keras(request):
    if ran_in_fresh_process(request):
        return
    replicas = 2
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{k}" for k in range(replicas)])
    x, y = data(4 * replicas * BATCH)
    with strategy.scope():
        model, other = embedding_model(), embedding_model()
        model.compile(keras.optimizers.Adam(1e-2), LOSS, jit_compile=False)
        trainer = checkmate.tf2.RematModel(other, **OPTIONS)
        trainer.compile(keras.optimizers.Adam(1e-2), LOSS)
    with _compat.grappler_disabled():
        want = model.fit(x, y, batch_size=replicas * BATCH, epochs=2, shuffle=False, verbose=0).history["loss"]
    got = trainer.fit(x, y, batch_size=replicas * BATCH, epochs=2, shuffle=False, verbose=0).history["loss"]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert_same_weights(model, other, rtol=1e-5, atol=1e-6)
    step = trainer.compiled_step()
    assert any(t is not None for t in step.lowered.grad_indices)
    # gradients() under the strategy: the replicas' dense gradients summed (RematModel's step takes
    # the labels with their sample weights)
    rows = replicas * BATCH
    loss, grads = step.gradients(x[:rows], (y[:rows], np.ones(rows, "float32")))
    assert [tuple(g.shape) for g in grads] == [tuple(v.shape) for v in step.variables]
