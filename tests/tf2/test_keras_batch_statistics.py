"""RematModel on a 1-D convolutional sequence classifier with BatchNorm and Dropout, whose training
forward pass differs from its inference one: training metrics come from the training forward pass's
predictions (no forward pass of their own), and an epoch's partial last batch trains as in Keras."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import checkmate  # noqa: E402
from checkmate.tf2 import _compat  # noqa: E402

pytestmark = pytest.mark.tf

BATCH = 8
STEPS = 24
CHANNELS = 6
CLASSES = 4
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
OPTIONS = dict(budget="100%", strategy="chen_sqrtn")


def sequence_cnn(seed: int = 0, dropout: float = 0.3, batchnorm: bool = True) -> keras.Model:
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((STEPS, CHANNELS))
    h = inputs
    for k in range(2):
        h = keras.layers.Conv1D(16, 3, padding="same", use_bias=False, name=f"conv{k}")(h)
        if batchnorm:
            h = keras.layers.BatchNormalization(name=f"bn{k}")(h)
        h = keras.layers.ReLU(name=f"relu{k}")(h)
    h = keras.layers.MaxPooling1D(2)(h)
    h = keras.layers.Flatten()(h)
    if dropout:
        h = keras.layers.Dropout(dropout, seed=3)(h)
    outputs = keras.layers.Dense(CLASSES, name="head")(h)
    return keras.Model(inputs, outputs, name="sequence_cnn")


def data(n: int, seed: int = 1):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, STEPS, CHANNELS)).astype("float32"),
            rng.integers(0, CLASSES, size=(n,)).astype("int32"))


def assert_same_weights(model, other, rtol=1e-4, atol=1e-5):
    for a, b in zip(model.variables, other.variables):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=rtol, atol=atol, err_msg=a.path)


def twins(dropout: float = 0.3, **options):
    model, other = sequence_cnn(dropout=dropout), sequence_cnn(dropout=dropout)
    metrics = ["accuracy", keras.metrics.SparseCategoricalCrossentropy(from_logits=True, name="xent")]
    model.compile(keras.optimizers.SGD(0.05, momentum=0.9), LOSS, metrics=metrics, jit_compile=False)
    trainer = checkmate.tf2.RematModel(other, **{**OPTIONS, **options})
    trainer.compile(keras.optimizers.SGD(0.05, momentum=0.9), LOSS, metrics=[
        "accuracy", keras.metrics.SparseCategoricalCrossentropy(from_logits=True, name="xent")])
    return model, other, trainer


def test_training_metrics_come_from_the_training_forward_pass():
    x, y = data(4 * BATCH)
    model, other, trainer = twins()
    inference_calls = []
    original = other.call

    def counting_call(*args, **kwargs):
        if not kwargs.get("training") and not isinstance(args[0], keras.KerasTensor):
            inference_calls.append(1)
        return original(*args, **kwargs)

    object.__setattr__(other, "call", counting_call)
    try:
        with _compat.grappler_disabled():
            want = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0).history
        got = trainer.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0).history
    finally:
        vars(other).pop("call", None)
    assert inference_calls == []          # no forward pass of the metrics' own was traced
    assert trainer.compiled_step().lowered.pred_tensors
    for name in ("loss", "accuracy", "xent"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, err_msg=name)
    # the metric is the loss itself on the training forward pass's predictions (BatchNorm on the
    # batch, dropout on), which an inference pass would not give
    assert abs(got["xent"][0] - got["loss"][0]) < 1e-4
    assert_same_weights(model, other)


def test_a_partial_last_batch_gets_a_schedule_of_its_own_with_batchnorm():
    x, y = data(3 * BATCH + 3)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)       # last batch: 3 rows
    model, other, trainer = twins()
    with _compat.grappler_disabled():
        want = model.fit(dataset, epochs=2, shuffle=False, verbose=0).history
    got = trainer.fit(dataset, epochs=2, shuffle=False, verbose=0).history
    assert sorted(trainer.compiled_steps) == [3, BATCH]     # compiled once, reused in the second epoch
    assert trainer.compiled_step() is trainer.compiled_steps[BATCH]
    for name in ("loss", "accuracy", "xent"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, err_msg=name)
    assert_same_weights(model, other)       # BatchNorm's moving statistics included


def test_padding_is_kept_where_it_is_exact_and_the_choice_can_be_forced():
    plain = sequence_cnn(batchnorm=False)
    assert not checkmate.tf2.keras_model.has_batch_statistics(plain)
    assert checkmate.tf2.RematModel(plain, **OPTIONS).pads_exactly()
    assert not checkmate.tf2.RematModel(plain, partial_batches="compile", **OPTIONS).pads_exactly()
    x, y = data(2 * BATCH + 3)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    model, other = sequence_cnn(dropout=0.0), sequence_cnn(dropout=0.0)
    assert not checkmate.tf2.RematModel(model, **OPTIONS).pads_exactly()
    trainer = checkmate.tf2.RematModel(other, partial_batches="pad", **OPTIONS)
    assert trainer.pads_exactly()
    trainer.compile(keras.optimizers.SGD(0.05), LOSS)
    trainer.fit(dataset, epochs=1, shuffle=False, verbose=0)
    assert sorted(trainer.compiled_steps) == [BATCH]        # the short batch was padded
    with pytest.raises(checkmate.errors.InvalidArgumentError, match="partial_batches"):
        checkmate.tf2.RematModel(model, partial_batches="sometimes")
    config = checkmate.tf2.RematModel(model, partial_batches="compile", **OPTIONS).get_config()
    assert config["partial_batches"] == "compile"
