"""The Keras-native RematModel on a ConvNeXt-style CNN (depthwise convolution, LayerNormalization,
GELU, residual blocks): fit/evaluate/predict, metrics, callbacks, save/load, sample and class weights,
partial batches, loss scaling, and the refusal of a model with its own train_step."""

from __future__ import annotations

import os

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import checkmate  # noqa: E402
from checkmate.tf2 import _compat  # noqa: E402

BATCH = 8
SIZE = 16
CLASSES = 10


def convnext(seed: int = 0, dtype: str | None = None) -> keras.Model:
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((SIZE, SIZE, 3))
    h = keras.layers.Conv2D(16, 4, strides=4, name="stem", dtype=dtype)(inputs)
    for k in range(2):
        r = keras.layers.DepthwiseConv2D(7, padding="same", name=f"dw{k}", dtype=dtype)(h)
        r = keras.layers.LayerNormalization(epsilon=1e-6, name=f"ln{k}", dtype=dtype)(r)
        r = keras.layers.Dense(64, activation="gelu", name=f"pw{k}a", dtype=dtype)(r)
        r = keras.layers.Dense(16, name=f"pw{k}b", dtype=dtype)(r)
        h = keras.layers.Add(name=f"add{k}", dtype=dtype)([h, r])
    h = keras.layers.GlobalAveragePooling2D(dtype=dtype)(h)
    h = keras.layers.LayerNormalization(epsilon=1e-6, dtype=dtype)(h)
    outputs = keras.layers.Dense(CLASSES, name="head", dtype="float32")(h)
    return keras.Model(inputs, outputs, name="convnext")


def data(n: int, seed: int = 1):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, SIZE, SIZE, 3)).astype("float32")
    y = rng.integers(0, CLASSES, size=(n,)).astype("int32")
    return x, y


LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
OPTIONS = dict(budget="100%", strategy="checkpoint_all")


def pair(**fit_kwargs):
    """Train a plain Keras model and a RematModel of its twin the same way; return both histories."""
    model, other = convnext(), convnext()
    model.compile(keras.optimizers.SGD(0.05, momentum=0.9), LOSS, metrics=["accuracy"], jit_compile=False)
    trainer = checkmate.tf2.RematModel(other, **OPTIONS)
    trainer.compile(keras.optimizers.SGD(0.05, momentum=0.9), LOSS, metrics=["accuracy"])
    with _compat.grappler_disabled():
        want = model.fit(epochs=1, shuffle=False, verbose=0, **fit_kwargs).history
    got = trainer.fit(epochs=1, shuffle=False, verbose=0, **fit_kwargs).history
    return model, other, trainer, want, got


def assert_same_weights(model, other, rtol=1e-4, atol=1e-5):
    for a, b in zip(model.variables, other.variables):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=rtol, atol=atol, err_msg=a.path)


def test_fit_evaluate_predict_metrics_and_callbacks_as_keras(tmp_path):
    x, y = data(4 * BATCH)
    seen = []
    callback = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: seen.append(sorted(logs)))
    model, other, trainer, want, got = pair(x=x, y=y, batch_size=BATCH, validation_data=data(BATCH, seed=3),
                                            callbacks=[callback])
    assert set(got) == set(want) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-4)
    np.testing.assert_allclose(got["val_loss"], want["val_loss"], rtol=1e-4)
    np.testing.assert_allclose(got["val_accuracy"], want["val_accuracy"])
    assert seen == [sorted(got)] * 2      # the plain fit, then the rematerialized one
    assert_same_weights(model, other)
    np.testing.assert_allclose(trainer.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(trainer.evaluate(x, y, verbose=0), model.evaluate(x, y, verbose=0), rtol=1e-4)
    assert trainer.compiled_step().strategy == "checkpoint_all"
    # loss_weights as Keras takes them (tests/tf2/test_keras_parity.py), checked against the outputs
    with pytest.raises(checkmate.errors.InvalidArgumentError, match="2 loss_weights for a model with 1 outputs"):
        trainer.compile(keras.optimizers.SGD(0.1), LOSS, loss_weights=[2.0, 1.0])


def test_save_load_weights_and_export(tmp_path):
    x, y = data(2 * BATCH)
    trainer = checkmate.tf2.RematModel(convnext(), **OPTIONS)
    trainer.compile(keras.optimizers.SGD(0.05, momentum=0.9), LOSS, metrics=["accuracy"])
    trainer.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    path = str(tmp_path / "t.keras")
    trainer.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, checkmate.tf2.RematModel) and loaded.budget == "100%"
    np.testing.assert_allclose(loaded.predict(x, verbose=0), trainer.predict(x, verbose=0), rtol=1e-6)
    # the optimizer's state (momentum) comes back with the model, so training resumes where it stopped:
    # the loaded model compiles its step again at its first batch and takes the same steps as the original
    history = loaded.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False).history
    assert np.isfinite(history["loss"][0]) and "accuracy" in history
    trainer.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False)
    assert_same_weights(trainer, loaded, rtol=1e-6, atol=1e-7)

    weights = str(tmp_path / "t.weights.h5")
    trainer.save_weights(weights)
    fresh = checkmate.tf2.RematModel(convnext(seed=5), **OPTIONS)
    fresh.load_weights(weights)
    np.testing.assert_allclose(fresh.predict(x, verbose=0), trainer.predict(x, verbose=0), rtol=1e-6)
    trainer.export(str(tmp_path / "exported"), verbose=False)
    assert os.path.isdir(tmp_path / "exported")


def test_weights_files_are_the_models_own_in_both_directions(tmp_path):
    # a trainer's weights file is the one the wrapped model writes: the plain model reads it, a trainer
    # reads the plain model's, and a trainer of the same model gets the optimizer's state back too
    x, y = data(2 * BATCH)
    trainer = checkmate.tf2.RematModel(convnext(), **OPTIONS)
    trainer.compile(keras.optimizers.SGD(0.05, momentum=0.9), LOSS)
    trainer.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    path = str(tmp_path / "t.weights.h5")
    trainer.save_weights(path)
    plain = convnext(seed=5)
    plain.load_weights(path)
    np.testing.assert_allclose(plain.predict(x, verbose=0), trainer.predict(x, verbose=0), rtol=1e-6)

    other = convnext(seed=7)
    other.save_weights(str(tmp_path / "plain.weights.h5"))
    reader = checkmate.tf2.RematModel(convnext(seed=5), **OPTIONS)
    reader.load_weights(str(tmp_path / "plain.weights.h5"))
    np.testing.assert_allclose(reader.predict(x, verbose=0), other.predict(x, verbose=0), rtol=1e-6)

    resumed = checkmate.tf2.RematModel(convnext(seed=5), **OPTIONS)
    resumed.compile(keras.optimizers.SGD(0.05, momentum=0.9), LOSS)
    resumed.optimizer.build(resumed.trainable_variables)
    resumed.load_weights(path)
    momenta = [v for v in trainer.optimizer.variables if "momentum" in v.path]
    assert momenta and any(np.abs(v.numpy()).max() > 0 for v in momenta)
    for a, b in zip(trainer.optimizer.variables, resumed.optimizer.variables):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("adopted", [True, False])
def test_save_load_with_the_models_own_optimizer_keeps_its_state(tmp_path, adopted):
    # RematModel(model) of a compiled model trains with the model's own optimizer (adopted from its
    # compile(), or passed to compile() again): one object, saved once at the model's path. Loaded,
    # training resumes from the saved state (Adam's moments and step count), as plain Keras' does.
    x, y = data(3 * BATCH)
    model, other = convnext(), convnext()
    for m in (model, other):
        m.compile(keras.optimizers.Adam(1e-2), LOSS, jit_compile=False)
    trainer = checkmate.tf2.RematModel(other, **OPTIONS)
    if not adopted:
        trainer.compile(other.optimizer, LOSS)
    with _compat.grappler_disabled():
        model.fit(x, y, batch_size=BATCH, verbose=0, shuffle=False)
    trainer.fit(x, y, batch_size=BATCH, verbose=0, shuffle=False)
    assert trainer.optimizer is other.optimizer
    model.save(str(tmp_path / "plain.keras"))
    trainer.save(str(tmp_path / "remat.keras"))
    plain = keras.saving.load_model(str(tmp_path / "plain.keras"))
    loaded = keras.saving.load_model(str(tmp_path / "remat.keras"))
    assert int(loaded.optimizer.iterations) == int(plain.optimizer.iterations) == 3
    for a, b in zip(plain.optimizer.variables, loaded.optimizer.variables):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-7, err_msg=a.path)
    with _compat.grappler_disabled():
        want = plain.fit(x, y, batch_size=BATCH, verbose=0, shuffle=False).history
    got = loaded.fit(x, y, batch_size=BATCH, verbose=0, shuffle=False).history
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5)
    assert_same_weights(plain, loaded, rtol=1e-5, atol=1e-6)


def test_a_model_compiled_with_its_own_optimizer_saves_the_trainers_optimizer_state(tmp_path):
    # a model compiled before it is wrapped (a KerasHub task compiles itself) keeps an optimizer of its
    # own: the trainer's weights file (ModelCheckpoint's save_weights_only) holds the state of the
    # optimizer that trains, where the model keeps its own, and reads back into a trainer
    x, y = data(2 * BATCH)
    model = convnext()
    model.compile(keras.optimizers.Adam(1e-3), LOSS)
    trainer = checkmate.tf2.RematModel(model, **OPTIONS)
    trainer.compile(keras.optimizers.SGD(0.05, momentum=0.9), LOSS)
    path = str(tmp_path / "best.weights.h5")
    trainer.fit(x, y, batch_size=BATCH, epochs=2, verbose=0,
                callbacks=[keras.callbacks.ModelCheckpoint(path, save_weights_only=True)])
    assert model.optimizer is not trainer.optimizer
    import h5py

    with h5py.File(path, "r") as f:
        assert "optimizer" in f
        saved = [np.asarray(f["optimizer"]["vars"][k]) for k in sorted(f["optimizer"]["vars"], key=int)]
    assert len(saved) == len(trainer.optimizer.variables)
    for got, want in zip(saved, trainer.optimizer.variables):
        np.testing.assert_array_equal(got, np.asarray(want))
    resumed = checkmate.tf2.RematModel(convnext(seed=5), **OPTIONS)
    resumed.compile(keras.optimizers.SGD(0.05, momentum=0.9), LOSS)
    resumed.optimizer.build(resumed.trainable_variables)
    resumed.load_weights(path)
    np.testing.assert_allclose(resumed.predict(x, verbose=0), trainer.predict(x, verbose=0), rtol=1e-6)
    for a, b in zip(trainer.optimizer.variables, resumed.optimizer.variables):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_partial_last_batch_sample_and_class_weights_as_keras():
    x, y = data(3 * BATCH + 3)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)       # last batch: 3 rows
    model, other, _, want, got = pair(x=dataset)
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-4)
    assert_same_weights(model, other)

    weights = np.linspace(0.2, 2.0, len(x)).astype("float32")
    model, other, _, want, got = pair(x=x, y=y, batch_size=BATCH, sample_weight=weights)
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-4)
    assert_same_weights(model, other)

    class_weight = {c: 1.0 + c / 4 for c in range(CLASSES)}
    model, other, _, want, got = pair(x=x, y=y, batch_size=BATCH, class_weight=class_weight)
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-4)
    assert_same_weights(model, other)


@pytest.mark.parametrize("explicit", [True, False])
def test_mixed_float16_loss_scaling_follows_keras(explicit):
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        x, y = data(4 * BATCH)
        model, other = convnext(), convnext()

        def optimizer():
            sgd = keras.optimizers.SGD(0.1)
            return keras.optimizers.LossScaleOptimizer(sgd) if explicit else sgd

        model.compile(optimizer(), LOSS, jit_compile=False)
        trainer = checkmate.tf2.RematModel(other, **OPTIONS)
        trainer.compile(optimizer(), LOSS)
        assert isinstance(trainer.optimizer, keras.optimizers.LossScaleOptimizer)
        with _compat.grappler_disabled():
            want = model.fit(x, y, batch_size=BATCH, epochs=5, shuffle=False, verbose=0).history["loss"]
        got = trainer.fit(x, y, batch_size=BATCH, epochs=5, shuffle=False, verbose=0).history["loss"]
        assert want[-1] < 0.8 * want[0]                       # it learns: the gradients are unscaled
        np.testing.assert_allclose(got, want, rtol=2e-2)      # float16 rounding, not a different curve
        half = trainer.compiled_step().graph
    finally:
        keras.mixed_precision.set_global_policy("float32")
    # the plan counts the float16 activations at their size: about half the float32 model's bytes
    step32 = checkmate.tf2.RematModel(convnext(), **OPTIONS)
    step32.compile(keras.optimizers.SGD(0.1), LOSS)
    step32.train_on_batch(x[:BATCH], y[:BATCH])
    assert 0.4 < half.mem.sum() / step32.compiled_step().graph.mem.sum() < 0.7


def test_compiled_step_with_loss_scale_optimizer_scales_the_loss():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        x, y = data(BATCH)
        model = convnext()
        # a scale under float16 overflow, so that every gradient can be compared
        opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=64.0)
        step = checkmate.tf2.compile(model, LOSS, opt, tf.TensorSpec((BATCH, SIZE, SIZE, 3)),
                                     tf.TensorSpec((BATCH,), tf.int32), **OPTIONS)
        loss, grads = step.gradients(x, y)
        plain = convnext()
        with tf.GradientTape() as tape:
            value = LOSS(y, plain(x, training=True))
        want = tape.gradient(value, plain.trainable_variables)
        scale = float(opt.dynamic_scale.numpy())  # built by the lowering, as Keras builds it
        # the gradients are those of the scaled loss, which apply_gradients unscales
        for g, w in zip(grads, want):
            np.testing.assert_allclose(np.asarray(g, "float32") / scale, np.asarray(w, "float32"),
                                       rtol=5e-2, atol=1e-3)
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_a_model_with_its_own_train_step_is_refused():
    class Custom(keras.Model):
        def train_step(self, data):
            return super().train_step(data)

    inputs = keras.Input((SIZE, SIZE, 3))
    outputs = keras.layers.Dense(CLASSES)(keras.layers.GlobalAveragePooling2D()(inputs))
    model = Custom(inputs, outputs)
    with pytest.raises(checkmate.errors.InvalidArgumentError, match="own train_step.*Custom.*call\\(\\)"):
        checkmate.tf2.RematModel(model, **OPTIONS)
    step = checkmate.tf2.compile(model, LOSS, keras.optimizers.SGD(0.1), tf.TensorSpec((BATCH, SIZE, SIZE, 3)),
                                 tf.TensorSpec((BATCH,), tf.int32), **OPTIONS)
    with pytest.raises(checkmate.errors.InvalidArgumentError, match="own train_step"):
        step.keras_model()


def test_a_compiled_steps_keras_model_reports_metrics_saves_and_names_a_short_batch(tmp_path):
    x, y = data(2 * BATCH)
    model = convnext()
    step = checkmate.tf2.compile(model, LOSS, keras.optimizers.SGD(0.05), tf.TensorSpec((BATCH, SIZE, SIZE, 3)),
                                 tf.TensorSpec((BATCH,), tf.int32), **OPTIONS)
    trainer = step.keras_model()
    assert isinstance(trainer, checkmate.tf2.keras_model.CompiledStepModel)
    assert type(checkmate.tf2.RematModel(step)) is checkmate.tf2.keras_model.CompiledStepModel
    trainer.compile(metrics=[])                  # an empty list reports the loss alone, as in Keras
    assert set(trainer.fit(x, y, epochs=1, verbose=0).history) == {"loss"}
    trainer.compile(metrics=["accuracy"])
    history = trainer.fit(x, y, epochs=1, verbose=0).history
    assert set(history) == {"loss", "accuracy"}
    trainer.save_weights(str(tmp_path / "w.weights.h5"))
    trainer.export(str(tmp_path / "exported"), verbose=False)
    trainer.save(str(tmp_path / "t.keras"))
    loaded = keras.saving.load_model(str(tmp_path / "t.keras"))
    # it comes back as the model form, for the step's budget in bytes and its strategy
    assert type(loaded) is checkmate.tf2.RematModel
    assert loaded.budget == step.predicted.budget_bytes and loaded.strategy == step.strategy
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-6)
    with pytest.raises(checkmate.errors.InvalidArgumentError, match="sample weights.*RematModel\\(model"):
        trainer.fit(x, y, sample_weight=np.ones(len(x)), epochs=1, verbose=0)
    short = tf.data.Dataset.from_tensor_slices(data(BATCH + 3)).batch(BATCH)
    with pytest.raises(Exception, match="compiled for batches of 8.*RematModel\\(model"):
        trainer.fit(short, epochs=1, verbose=0, shuffle=False)


def test_resolved_budgets_are_reported_with_their_reference(capfd):
    specs = (tf.TensorSpec((BATCH, SIZE, SIZE, 3)), tf.TensorSpec((BATCH,), tf.int32))
    capfd.readouterr()
    checkmate.tf2.compile(convnext(), LOSS, keras.optimizers.SGD(0.1), *specs, budget="100%",
                          strategy="checkpoint_all")
    assert "checkmate:" not in capfd.readouterr().err          # library calls are silent by default
    step = checkmate.tf2.compile(convnext(), LOSS, keras.optimizers.SGD(0.1), *specs, budget="100%",
                                 strategy="checkpoint_all", verbose=True)
    err = capfd.readouterr().err
    for fragment in ("checkmate: lowering convnext", "checkmate: lowered", "checkmate: budget 100% of checkpoint-all",
                     "checkmate: solving", "checkmate: solved in"):
        assert fragment in err, err
    peak = checkmate.solvers.checkpoint_all_peak(step.graph)
    assert step.predicted.budget_bytes == peak
    assert f"100% of checkpoint-all's peak {checkmate.solvers.format_bytes(peak)}" in step.summary()
    assert f"({peak} bytes)" in step.summary()
    step = checkmate.tf2.compile(convnext(), LOSS, keras.optimizers.SGD(0.1), *specs, budget="auto",
                                 strategy="checkpoint_all")
    assert "auto: " in step.budget_reference and " free on " in step.budget_reference
    assert f"({step.predicted.budget_bytes} bytes)" in step.summary()


@pytest.mark.parametrize("loss", ["sparse_categorical_crossentropy", keras.losses.sparse_categorical_crossentropy])
def test_a_loss_given_by_name_or_function_trains_as_keras(loss):
    x, y = data(2 * BATCH + 3)
    weights = np.linspace(0.5, 1.5, len(y)).astype("float32")
    model, other = convnext(), convnext()
    head = keras.layers.Softmax()
    model, other = keras.Model(model.input, head(model.output)), keras.Model(other.input, head(other.output))
    model.compile(keras.optimizers.SGD(0.05), loss, jit_compile=False)
    trainer = checkmate.tf2.RematModel(other, **OPTIONS)
    trainer.compile(keras.optimizers.SGD(0.05), loss)
    with _compat.grappler_disabled():
        want = model.fit(x, y, sample_weight=weights, batch_size=BATCH, shuffle=False, verbose=0).history
    got = trainer.fit(x, y, sample_weight=weights, batch_size=BATCH, shuffle=False, verbose=0).history
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-4)
    assert_same_weights(model, other)


def test_summary_says_how_far_an_unproven_plan_may_be_off():
    specs = (tf.TensorSpec((BATCH, SIZE, SIZE, 3)), tf.TensorSpec((BATCH,), tf.int32))
    # a time limit too short for the LP: the MILP answers with its best incumbent, unproven
    step = checkmate.tf2.compile(convnext(), LOSS, keras.optimizers.SGD(0.1), *specs, budget="70%",
                                 strategy="checkmate_milp", time_limit_s=1e-3)
    line = next(x for x in step.summary().splitlines() if x.strip().startswith("strategy"))
    assert not step.result.optimal
    assert step.result.status in line and "optimal" not in line.replace(step.result.status, "")


def test_dict_inputs_reach_the_model_in_its_own_key_order():
    # tf.data and tf.nest sort a dict's keys; Keras warns when a functional model with dict inputs gets
    # them in another order than its own, as a KerasHub task's token_ids and padding_mask did
    import warnings

    ids, mask = keras.Input((6,), name="token_ids"), keras.Input((6,), name="padding_mask")
    hidden = keras.layers.Dense(8, activation="relu")(keras.layers.Concatenate()([ids, mask]))
    model = keras.Model({"token_ids": ids, "padding_mask": mask}, keras.layers.Dense(3)(hidden))
    rng = np.random.default_rng(0)
    x = {"token_ids": rng.random((2 * BATCH, 6), dtype="float32"), "padding_mask": np.ones((2 * BATCH, 6), "float32")}
    y = rng.integers(0, 3, 2 * BATCH)
    trainer = checkmate.tf2.RematModel(model, **OPTIONS)
    trainer.compile(keras.optimizers.SGD(0.01), LOSS, metrics=["accuracy"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
        trainer.evaluate(x, y, verbose=0)
    assert not [w for w in caught if "match the expected structure" in str(w.message)]
