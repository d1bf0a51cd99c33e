"""The rematerialized step under tf.distribute: MirroredStrategy over two logical CPU devices, on a
residual MLP with an L2-regularized layer. Each replica runs the plan on its share of the global
batch; the gradients are summed over the replicas and applied once, as in Keras' own training under
the same strategy. Logical devices are configured once per process, before TF initialises them, so
each test body runs in a fresh interpreter."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import checkmate  # noqa: E402
from checkmate.tf2 import _compat  # noqa: E402
from isolation import ran_in_fresh_process  # noqa: E402

pytestmark = pytest.mark.tf

REPLICAS = 2
PER_REPLICA = 8
GLOBAL = REPLICAS * PER_REPLICA
FEATURES = 12
WIDTH = 32
CLASSES = 5
STEPS = 3
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
# Chen et al.'s sqrt(n) checkpoints: a plan that recomputes the segments between them.
OPTIONS = dict(budget="100%", strategy="chen_sqrtn")


class BatchLogs(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.logs = []

    def on_train_batch_end(self, batch, logs=None):
        self.logs.append({key: float(value) for key, value in logs.items()})


def two_cpus():
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * REPLICAS)
    return tf.distribute.MirroredStrategy([f"/cpu:{k}" for k in range(REPLICAS)])


def residual_mlp(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((FEATURES,))
    h = keras.layers.Dense(WIDTH, activation="relu", name="embed",
                           kernel_regularizer=keras.regularizers.L2(1e-3))(inputs)
    for k in range(3):
        r = keras.layers.Dense(WIDTH, activation="relu", name=f"block{k}a")(h)
        r = keras.layers.Dense(WIDTH, name=f"block{k}b")(r)
        h = keras.layers.Add(name=f"add{k}")([h, r])
    outputs = keras.layers.Dense(CLASSES, name="head")(h)
    return keras.Model(inputs, outputs, name="residual_mlp")


def data(n: int, seed: int = 1):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, FEATURES)).astype("float32"),
            rng.integers(0, CLASSES, size=(n,)).astype("int32"))


def assert_same_weights(model, other, rtol=1e-5, atol=1e-6):
    for a, b in zip(model.variables, other.variables):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=rtol, atol=atol, err_msg=a.path)


def test_the_compiled_step_trains_each_replica_and_applies_summed_gradients(request):
    if ran_in_fresh_process(request):
        return
    strategy = two_cpus()
    x, y = data(STEPS * GLOBAL)
    specs = (tf.TensorSpec((PER_REPLICA, FEATURES)), tf.TensorSpec((PER_REPLICA,), tf.int32))
    with strategy.scope():
        model, other = residual_mlp(), residual_mlp()
        plain_optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
        step = checkmate.tf2.compile(other, LOSS, keras.optimizers.SGD(0.1, momentum=0.9), *specs, **OPTIONS)
        plain_optimizer.build(model.trainable_variables)
    assert step.replicas == REPLICAS and step.predicted.recompute_count > 0
    assert f"replicas        {REPLICAS} (MirroredStrategy)" in step.summary()
    assert f"one replica's batch of {PER_REPLICA} (global batch {GLOBAL})" in step.summary()

    def replica_gradients(xb, yb):
        with tf.GradientTape() as tape:
            loss = LOSS(yb, model(xb, training=True))
            loss = loss + tf.add_n(model.losses) / REPLICAS     # Keras' share of the regularizer
        return loss, tape.gradient(loss, model.trainable_variables)

    @tf.function
    def plain_gradients(xb, yb):
        loss, grads = strategy.run(replica_gradients, args=(xb, yb))
        return (strategy.reduce("SUM", loss, axis=None), [strategy.reduce("SUM", g, axis=None) for g in grads])

    @tf.function
    def plain_train(xb, yb):
        def replica(xr, yr):
            loss, grads = replica_gradients(xr, yr)
            plain_optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss
        return strategy.reduce("SUM", strategy.run(replica, args=(xb, yb)), axis=None)

    def shards(k):
        dataset = tf.data.Dataset.from_tensor_slices((x[k * GLOBAL:(k + 1) * GLOBAL], y[k * GLOBAL:(k + 1) * GLOBAL]))
        return next(iter(strategy.experimental_distribute_dataset(dataset.batch(GLOBAL))))

    want_loss, want_grads = plain_gradients(*shards(0))
    got_loss, got_grads = step.gradients(x[:GLOBAL], y[:GLOBAL])
    np.testing.assert_allclose(got_loss.numpy(), want_loss.numpy(), rtol=1e-5)
    for g, w, v in zip(got_grads, want_grads, model.trainable_variables):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-4, atol=1e-6, err_msg=v.path)
    plain_loss, _ = step.plain_gradients(x[:GLOBAL], y[:GLOBAL])
    np.testing.assert_allclose(plain_loss.numpy(), want_loss.numpy(), rtol=1e-5)

    for k in range(STEPS):
        want = plain_train(*shards(k))
        got = step(x[k * GLOBAL:(k + 1) * GLOBAL], y[k * GLOBAL:(k + 1) * GLOBAL])
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5)
    assert_same_weights(model, other)
    for v in other.variables:      # the replicas' copies stay in sync
        first, second = strategy.experimental_local_results(v.value)
        np.testing.assert_array_equal(first.numpy(), second.numpy())


def test_a_remat_model_that_adopts_the_models_compile_reports_each_batch_as_keras(request):
    # RematModel(model) of a model compiled in the strategy's scope, trained without compiling it:
    # fit() compiles it outside the scope, and its loss and metrics must still be the strategy's
    if ran_in_fresh_process(request):
        return
    strategy = two_cpus()
    remainder = 5
    x, y = data(STEPS * GLOBAL + remainder)
    with strategy.scope():
        model, other = residual_mlp(), residual_mlp()
        for m in (model, other):
            m.compile(keras.optimizers.SGD(0.1, momentum=0.9), LOSS, metrics=["accuracy"], jit_compile=False)
        trainer = checkmate.tf2.RematModel(other, **OPTIONS)
    want_batches, got_batches = BatchLogs(), BatchLogs()
    with _compat.grappler_disabled():
        want = model.fit(x, y, batch_size=GLOBAL, shuffle=False, verbose=0, callbacks=[want_batches]).history
    got = trainer.fit(x, y, batch_size=GLOBAL, shuffle=False, verbose=0, callbacks=[got_batches]).history
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5)
    for key in ("loss", "accuracy"):
        np.testing.assert_allclose([logs[key] for logs in got_batches.logs],
                                   [logs[key] for logs in want_batches.logs], rtol=1e-5, err_msg=key)
    assert_same_weights(model, other)


def test_remat_model_fit_matches_keras_fit_under_the_same_strategy(request):
    if ran_in_fresh_process(request):
        return
    strategy = two_cpus()
    remainder = 5           # the last global batch: 3 rows on one replica, 2 on the other
    x, y = data(STEPS * GLOBAL + remainder)
    with strategy.scope():
        model, other, third = residual_mlp(), residual_mlp(), residual_mlp()
        model.compile(keras.optimizers.SGD(0.1, momentum=0.9), LOSS, metrics=["accuracy"], jit_compile=False)
        trainer = checkmate.tf2.RematModel(other, **OPTIONS)
        trainer.compile(keras.optimizers.SGD(0.1, momentum=0.9), LOSS, metrics=["accuracy"])
        # a schedule per replica batch size instead of padding the remainder's shares
        compiling = checkmate.tf2.RematModel(third, partial_batches="compile", **OPTIONS)
        compiling.compile(keras.optimizers.SGD(0.1, momentum=0.9), LOSS, metrics=["accuracy"])
    want_batches = BatchLogs()
    with _compat.grappler_disabled():
        want = model.fit(x, y, batch_size=GLOBAL, epochs=2, shuffle=False, verbose=0,
                         callbacks=[want_batches]).history
    for trained, remat in ((other, trainer), (third, compiling)):
        got_batches = BatchLogs()
        got = remat.fit(x, y, batch_size=GLOBAL, epochs=2, shuffle=False, verbose=0, callbacks=[got_batches]).history
        np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5)
        np.testing.assert_allclose(got["accuracy"], want["accuracy"])
        # each batch's logs too (what a progress bar or a per-batch callback shows): the whole global
        # batch's running means, not a mix of one replica's share and the batch's
        for key in ("loss", "accuracy"):
            np.testing.assert_allclose([logs[key] for logs in got_batches.logs],
                                       [logs[key] for logs in want_batches.logs], rtol=1e-5, err_msg=key)
        assert_same_weights(model, trained)
    step = trainer.compiled_step()
    assert step.replicas == REPLICAS and set(trainer.compiled_steps) == {PER_REPLICA}
    assert set(compiling.compiled_steps) == {PER_REPLICA, 2, 3}
    assert int(step.input_specs[0].shape[0]) == PER_REPLICA
    np.testing.assert_allclose(trainer.evaluate(x, y, batch_size=GLOBAL, verbose=0),
                               model.evaluate(x, y, batch_size=GLOBAL, verbose=0), rtol=1e-5)


def test_strategies_the_step_cannot_run_under_are_refused_by_name(request):
    if ran_in_fresh_process(request):
        return
    two_cpus()
    specs = (tf.TensorSpec((PER_REPLICA, FEATURES)), tf.TensorSpec((PER_REPLICA,), tf.int32))
    central = tf.distribute.experimental.CentralStorageStrategy([f"/cpu:{k}" for k in range(REPLICAS)])
    with central.scope():
        model = residual_mlp()
        with pytest.raises(checkmate.errors.UnsupportedOpError, match="CentralStorageStrategy.*MirroredStrategy"):
            checkmate.tf2.compile(model, LOSS, keras.optimizers.SGD(0.1), *specs, **OPTIONS)
        with pytest.raises(checkmate.errors.UnsupportedOpError, match="CentralStorageStrategy"):
            checkmate.tf2.RematModel(model, **OPTIONS)
    mirrored = tf.distribute.MirroredStrategy([f"/cpu:{k}" for k in range(REPLICAS)])
    with mirrored.scope():
        inputs = keras.Input((FEATURES,))
        outputs = keras.layers.Dense(CLASSES)(keras.layers.BatchNormalization(synchronized=True, name="sync_bn")(inputs))
        synchronized = keras.Model(inputs, outputs)
        # its statistics are all-reduced inside the forward pass, which one replica's plan cannot do
        with pytest.raises(checkmate.errors.UnsupportedOpError, match="sync_bn.*synchronized=False"):
            checkmate.tf2.compile(synchronized, LOSS, keras.optimizers.SGD(0.1), *specs, **OPTIONS)
        model = residual_mlp()
    # variables created under a strategy are refused outside its scope
    with pytest.raises(checkmate.errors.UnsupportedOpError, match="variables are distributed.*strategy.scope"):
        checkmate.tf2.compile(model, LOSS, keras.optimizers.SGD(0.1), *specs, **OPTIONS)


def test_remat_model_fit_under_multi_worker_mirrored_strategy_matches_keras(request):
    """One worker of a MultiWorkerMirroredStrategy (no TF_CONFIG: a cluster of this process alone):
    the same code path as MirroredStrategy, with collective all-reduces between workers."""
    if ran_in_fresh_process(request):
        return
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    x, y = data(STEPS * GLOBAL + 3)
    with strategy.scope():
        model, other = residual_mlp(), residual_mlp()
        model.compile(keras.optimizers.SGD(0.1, momentum=0.9), LOSS, metrics=["accuracy"], jit_compile=False)
        trainer = checkmate.tf2.RematModel(other, **OPTIONS)
        trainer.compile(keras.optimizers.SGD(0.1, momentum=0.9), LOSS, metrics=["accuracy"])
    with _compat.grappler_disabled():
        want = model.fit(x, y, batch_size=GLOBAL, epochs=2, shuffle=False, verbose=0).history
    got = trainer.fit(x, y, batch_size=GLOBAL, epochs=2, shuffle=False, verbose=0).history
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5)
    np.testing.assert_allclose(got["accuracy"], want["accuracy"])
    assert_same_weights(model, other)
    step = trainer.compiled_step()
    assert step.replicas == strategy.num_replicas_in_sync and step.predicted.recompute_count > 0
    assert "MultiWorkerMirroredStrategy" in step.summary()
