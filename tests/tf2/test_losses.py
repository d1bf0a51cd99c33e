"""RematModel computes its loss as keras.Model.fit does: per-token losses with no weights, per-token
and per-sample weights, class weights, several outputs with a dict of losses and loss weights of
Keras' own, dict inputs, a Keras mask on the predictions, and a compiled model's own compile()
arguments. Every case compares the loss values of fit with plain Keras fit on a twin model."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import checkmate  # noqa: E402
from checkmate.tf2 import _compat, losses  # noqa: E402

BATCH = 8
STEPS = 12
VOCAB = 40
OPTIONS = dict(budget="100%", strategy="checkpoint_all")


def token_model(seed: int = 0, mask: bool = False) -> keras.Model:
    """A tiny per-token classifier with dict inputs (token ids and a padding mask)."""
    keras.utils.set_random_seed(seed)
    ids = keras.Input((STEPS,), dtype="int32", name="token_ids")
    pad = keras.Input((STEPS,), dtype="int32", name="padding_mask")
    h = keras.layers.Embedding(VOCAB, 16, mask_zero=mask, name="embed")(ids)
    if not mask:     # with mask_zero, the embedding's mask reaches the predictions through the Dense layers
        gate = keras.layers.Reshape((STEPS, 1))(keras.ops.cast(pad, "float32"))
        h = keras.layers.Multiply(name="gate")([h, gate])
    h = keras.layers.Dense(24, activation="gelu", name="hidden")(h)
    out = keras.layers.Dense(VOCAB, name="logits")(h)
    return keras.Model({"token_ids": ids, "padding_mask": pad}, out, name="tokens")


def token_data(n: int = 3 * BATCH, seed: int = 1):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, VOCAB, (n, STEPS)).astype("int32")
    pad = np.ones((n, STEPS), "int32")
    pad[:, STEPS - 3:] = 0
    ids[:, STEPS - 3:] = 0
    y = rng.integers(0, VOCAB, (n, STEPS)).astype("int32")
    return {"token_ids": ids, "padding_mask": pad}, y


LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def fit_both(build, compile_kwargs, plain_fit=None, **fit_kwargs):
    """Per-batch losses of plain Keras fit and of RematModel fit, on twin models."""
    model, other = build(), build()
    other.set_weights(model.get_weights())
    model.compile(**compile_kwargs(), jit_compile=False)
    trainer = checkmate.tf2.RematModel(other, **OPTIONS)
    trainer.compile(**compile_kwargs())
    seen: dict[str, list] = {"want": [], "got": []}

    def recorder(key):
        return keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: seen[key].append(logs["loss"]))

    with _compat.grappler_disabled():
        model.fit(epochs=1, shuffle=False, verbose=0, callbacks=[recorder("want")], **(plain_fit or fit_kwargs))
    trainer.fit(epochs=1, shuffle=False, verbose=0, callbacks=[recorder("got")], **fit_kwargs)
    return np.array(seen["want"]), np.array(seen["got"]), trainer


def sgd_token_loss():
    return dict(optimizer=keras.optimizers.SGD(0.5), loss=LOSS)


def test_per_token_loss_without_weights_as_keras():
    x, y = token_data()
    want, got, trainer = fit_both(token_model, sgd_token_loss, x=x, y=y, batch_size=BATCH)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    # the step's weight input is a row of ones, one per sample
    assert trainer.compiled_step().input_specs[-1].shape == (BATCH,)


def test_per_token_weights_as_keras():
    x, y = token_data()
    weights = x["padding_mask"].astype("float32") * np.linspace(0.5, 1.5, STEPS, dtype="float32")
    want, got, trainer = fit_both(token_model, sgd_token_loss, x=x, y=y, batch_size=BATCH, sample_weight=weights)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert trainer.compiled_step().input_specs[-1].shape == (BATCH, STEPS)


def test_a_step_compiled_before_fit_for_per_token_weights_serves_fit():
    x, y = token_data()
    weights = x["padding_mask"].astype("float32") * np.linspace(0.5, 1.5, STEPS, dtype="float32")
    model, other = token_model(), token_model()
    other.set_weights(model.get_weights())
    model.compile(**sgd_token_loss(), jit_compile=False)
    trainer = checkmate.tf2.RematModel(other, **OPTIONS)
    trainer.compile(**sgd_token_loss())
    first = tf.nest.map_structure(lambda a: tf.convert_to_tensor(a[:BATCH]), (x, y, weights))
    step = trainer.compiled_step(*first)
    assert step.input_specs[-1].shape == (BATCH, STEPS)
    with _compat.grappler_disabled():
        want = model.fit(x, y, sample_weight=weights, batch_size=BATCH, shuffle=False, verbose=0).history["loss"]
    got = trainer.fit(x, y, sample_weight=weights, batch_size=BATCH, shuffle=False, verbose=0).history["loss"]
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert trainer.compiled_steps == {BATCH: step}      # fit used the step compiled beforehand


def test_per_sample_weights_weigh_every_token_of_a_row():
    x, y = token_data()
    weights = np.linspace(0.2, 2.0, len(y)).astype("float32")
    # Keras itself needs the weight as (B, 1) to broadcast it over the tokens; RematModel takes (B,)
    want, got, _ = fit_both(token_model, sgd_token_loss, x=x, y=y, batch_size=BATCH, sample_weight=weights,
                            plain_fit=dict(x=x, y=y, batch_size=BATCH, sample_weight=weights[:, None]))
    np.testing.assert_allclose(got, want, rtol=1e-5)
    unweighted, _, _ = fit_both(token_model, sgd_token_loss, x=x, y=y, batch_size=BATCH)
    assert not np.allclose(got, unweighted, rtol=1e-3)      # the weights changed the loss


def test_mask_on_the_predictions_as_keras():
    x, y = token_data()
    want, got, _ = fit_both(lambda: token_model(mask=True), sgd_token_loss, x=x, y=y, batch_size=BATCH)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    unmasked, _, _ = fit_both(token_model, sgd_token_loss, x=x, y=y, batch_size=BATCH)
    assert not np.allclose(got, unmasked, rtol=1e-6)   # losses near log(VOCAB) at init: a small change


def two_outputs(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((10,))
    h = keras.layers.Dense(32, activation="relu", name="trunk")(inputs)
    cls = keras.layers.Dense(5, name="cls")(h)
    reg = keras.layers.Dense(3, name="reg")(h)
    return keras.Model(inputs, {"cls": cls, "reg": reg}, name="two")


def test_several_outputs_dict_losses_sample_weights_and_loss_weights_as_keras():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4 * BATCH, 10)).astype("float32")
    y = {"cls": rng.integers(0, 5, (4 * BATCH,)).astype("int32"),
         "reg": rng.standard_normal((4 * BATCH, 3)).astype("float32")}

    def compiled():
        return dict(optimizer=keras.optimizers.SGD(0.1),
                    loss={"cls": keras.losses.SparseCategoricalCrossentropy(from_logits=True), "reg": "mse"})

    want, got, trainer = fit_both(two_outputs, compiled, x=x, y=y, batch_size=BATCH)
    np.testing.assert_allclose(got, want, rtol=1e-5)

    weights = np.linspace(0.1, 3.0, len(x)).astype("float32")
    want, got, _ = fit_both(two_outputs, compiled, x=x, y=y, batch_size=BATCH, sample_weight=weights)
    np.testing.assert_allclose(got, want, rtol=1e-5)

    def weighted():
        return dict(compiled(), loss_weights={"cls": 0.25, "reg": 4.0})

    want, got, _ = fit_both(two_outputs, weighted, x=x, y=y, batch_size=BATCH)
    np.testing.assert_allclose(got, want, rtol=1e-5)


def classifier(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((10,))
    h = keras.layers.Dense(16, activation="relu")(inputs)
    return keras.Model(inputs, keras.layers.Dense(4)(h), name="clf")


def test_class_weight_as_keras():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3 * BATCH, 10)).astype("float32")
    y = rng.integers(0, 4, (3 * BATCH, 1)).astype("int32")
    want, got, _ = fit_both(classifier, lambda: dict(optimizer=keras.optimizers.SGD(0.1), loss=LOSS), x=x, y=y,
                            batch_size=BATCH, class_weight={0: 0.5, 1: 1.0, 2: 2.0, 3: 4.0})
    np.testing.assert_allclose(got, want, rtol=1e-5)


def _twins_compiled(*metric_sets):
    """Two token models with the same weights, each compiled once per entry of ``metric_sets`` (the
    weighted metrics of that call, None for none)."""
    model, other = token_model(), token_model()
    other.set_weights(model.get_weights())
    for m in (model, other):
        for metrics in metric_sets:
            m.compile(keras.optimizers.SGD(0.5), LOSS, weighted_metrics=metrics, jit_compile=False)
    return model, other


def test_a_compiled_model_lends_its_compile_arguments():
    x, y = token_data()
    model, other = _twins_compiled(["sparse_categorical_accuracy"])
    arguments = losses.compile_arguments_of(other)
    assert arguments["loss"] is LOSS and arguments["optimizer"] is other.optimizer
    assert losses.compile_arguments_of(token_model()) is None
    with _compat.grappler_disabled():
        want = model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0).history
    trainer = checkmate.tf2.RematModel(other, **OPTIONS)      # fit without compiling the wrapper
    got = trainer.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0).history
    assert set(got) == set(want)
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5)
    np.testing.assert_allclose(got["sparse_categorical_accuracy"], want["sparse_categorical_accuracy"])


def test_metrics_kept_from_an_earlier_compile_are_reported_as_keras_does():
    # compile() without metrics keeps the metrics of an earlier compile() (a KerasHub task compiles
    # itself with weighted metrics on construction, and users compile it again for their optimizer):
    # Keras' fit still reports them, and so must a RematModel that adopts the model's compile()
    x, y = token_data()
    model, other = _twins_compiled(["sparse_categorical_accuracy"], None)
    with _compat.grappler_disabled():
        want = model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0).history
    assert "sparse_categorical_accuracy" in want
    got = checkmate.tf2.RematModel(other, **OPTIONS).fit(x, y, batch_size=BATCH, shuffle=False, verbose=0).history
    assert set(got) == set(want)
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5)
    np.testing.assert_allclose(got["sparse_categorical_accuracy"], want["sparse_categorical_accuracy"])


def test_empty_metric_lists_train_as_keras():
    """``compile(metrics=[], weighted_metrics=[])`` (as KerasHub's examples write it) reports the loss
    alone, as Keras' fit does; the empty compiled metrics, which Keras builds in its own train step,
    do not stop the first batch."""
    x, y = token_data()
    want, got, _ = fit_both(token_model, lambda: dict(optimizer=keras.optimizers.SGD(0.5), loss=LOSS, metrics=[],
                                                       weighted_metrics=[]), x=x, y=y, batch_size=BATCH)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    model = token_model()
    model.compile(keras.optimizers.SGD(0.5), LOSS, weighted_metrics=[], jit_compile=False)
    history = checkmate.tf2.RematModel(model, **OPTIONS).fit(x, y, batch_size=BATCH, shuffle=False, verbose=0).history
    assert set(history) == {"loss"}


def test_row_weights_take_each_output_labels_rank():
    w = tf.constant([1.0, 2.0])
    assert losses.row_weights_as(w, tf.zeros((2, 5, 7))).shape == (2, 1, 1)
    assert losses.row_weights_as(w, tf.zeros((2,))).shape == (2,)
    nested = losses.row_weights_as(w, {"a": tf.zeros((2, 3)), "b": tf.zeros((2, 3, 4))})
    assert nested["a"].shape == (2, 1) and nested["b"].shape == (2, 1, 1)


class OwnLoss(keras.Model):
    """A functional model that overrides ``compute_loss`` as Keras documents: its compiled loss plus a
    reconstruction of the inputs by layers the forward pass does not use (the loss reads ``x`` and
    calls sublayers again, as KerasHub's BASNet and PARSeq tasks do)."""

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        base = super().compute_loss(x, y, y_pred, sample_weight, training=training)
        recon = self.recon(self.get_layer("hidden")(x))
        return base + 0.5 * keras.ops.mean(keras.ops.square(recon - x))


class OwnLossNoTraining(OwnLoss):
    """The same loss, overridden without the ``training`` argument (Keras before 3.3)."""

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None):
        return super().compute_loss(x, y, y_pred, sample_weight)


def own_loss_model(cls=OwnLoss, seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8,), name="features")
    hidden = keras.layers.Dense(16, activation="gelu", name="hidden",
                                kernel_regularizer=keras.regularizers.L2(1e-2))
    recon = keras.layers.Dense(8, name="recon")
    out = keras.layers.Dense(4, name="out")(hidden(inputs))
    model = cls(inputs, out, name="own_loss")
    recon.build((None, 16))
    model.recon = recon          # tracked: its variables are the model's, trained through the loss only
    return model


@pytest.mark.parametrize("cls", [OwnLoss, OwnLossNoTraining])
def test_a_model_that_overrides_compute_loss_trains_and_evaluates_with_that_loss(cls):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3 * BATCH, 8)).astype("float32")
    y = rng.integers(0, 4, (3 * BATCH,)).astype("int32")
    compile_kwargs = lambda: dict(optimizer=keras.optimizers.SGD(0.1),
                                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    want, got, trainer = fit_both(lambda: own_loss_model(cls), compile_kwargs, x=x, y=y, batch_size=BATCH)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    # the reconstruction layer is trained by the loss alone: its weights moved as plain fit moved them
    other = trainer.inner.recon.kernel.numpy()
    assert not np.allclose(other, own_loss_model(cls).recon.kernel.numpy())
    # the compiled loss alone is a different number: the override was traced, not the compiled loss
    plain = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y[:BATCH], trainer.inner(x[:BATCH]))
    assert abs(float(plain) - float(trainer.evaluate(x[:BATCH], y[:BATCH], verbose=0))) > 1e-3
    # evaluate reports the model's own loss, as the wrapped model's evaluate does
    reference = own_loss_model(cls)
    reference.set_weights(trainer.inner.get_weights())
    reference.compile(**compile_kwargs())
    np.testing.assert_allclose(trainer.evaluate(x, y, batch_size=BATCH, verbose=0),
                               reference.evaluate(x, y, batch_size=BATCH, verbose=0), rtol=1e-5)


class DetectorLoss(keras.Model):
    """Two outputs whose targets the model's own ``compute_loss`` makes from raw labels of another
    structure (as KerasHub's RetinaNet encodes boxes and classes): Keras' per-output losses are of
    those targets."""

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        targets = {"kind": y["classes"], "where": y["boxes"] * 0.5}
        return super().compute_loss(x, targets, y_pred, None, training=training)


def detector_model(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8,), name="features")
    h = keras.layers.Dense(16, activation="relu", name="hidden")(inputs)
    outputs = {"kind": keras.layers.Dense(3, name="kind")(h), "where": keras.layers.Dense(4, name="where")(h)}
    return DetectorLoss(inputs, outputs, name="detector")


def test_an_own_compute_loss_of_several_outputs_reports_each_output_loss_as_keras():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3 * BATCH, 8)).astype("float32")
    y = {"classes": rng.integers(0, 3, (3 * BATCH,)).astype("int32"),
         "boxes": rng.standard_normal((3 * BATCH, 4)).astype("float32")}
    compile_kwargs = lambda: dict(optimizer=keras.optimizers.SGD(0.1),
                                  loss={"kind": keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                                        "where": "mse"})
    model, other = detector_model(), detector_model()
    other.set_weights(model.get_weights())
    model.compile(**compile_kwargs(), jit_compile=False)
    trainer = checkmate.tf2.RematModel(other, **OPTIONS)
    trainer.compile(**compile_kwargs())
    want = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0).history
    got = trainer.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0).history
    assert {"loss", "kind_loss", "where_loss"} <= set(want) and set(want) <= set(got)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, err_msg=key)


class OwnLossOnly(keras.Model):
    """A loss of the model's own that needs no compiled loss (compiled with an optimizer only)."""

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        return keras.ops.mean(keras.ops.square(y_pred - y)) + 0.1 * keras.ops.mean(keras.ops.abs(x))


def test_an_own_compute_loss_trains_without_a_compiled_loss():
    def build():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((8,))
        return OwnLossOnly(inputs, keras.layers.Dense(3)(keras.layers.Dense(16, activation="relu")(inputs)))

    rng = np.random.default_rng(5)
    x = rng.standard_normal((3 * BATCH, 8)).astype("float32")
    y = rng.standard_normal((3 * BATCH, 3)).astype("float32")
    want, got, _ = fit_both(build, lambda: dict(optimizer=keras.optimizers.SGD(0.1)), x=x, y=y, batch_size=BATCH)
    np.testing.assert_allclose(got, want, rtol=1e-5)
