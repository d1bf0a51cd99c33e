"""RematModel refuses wrong arguments when it is made, and a batch that lacks one of a dict-input
model's inputs at the first batch, with checkmate's own one-line errors."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from checkmate.errors import InvalidArgumentError  # noqa: E402
from checkmate.tf2 import RematModel  # noqa: E402


def _small_model() -> keras.Model:
    inputs = keras.Input((4,))
    return keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Dense(8, activation="relu")(inputs)))


@pytest.mark.parametrize("model", ["model.keras", 42, [1, 2]])
def test_a_model_that_is_not_a_keras_model_is_refused_when_made(model):
    with pytest.raises(InvalidArgumentError, match="keras.Model"):
        RematModel(model, budget="60%")


def test_the_path_of_a_saved_model_is_refused_with_a_hint():
    with pytest.raises(InvalidArgumentError, match="load_model"):
        RematModel("model.keras")


@pytest.mark.parametrize("options", ["x", 3, ["time_limit_s"]])
def test_compile_options_must_be_a_dict(options):
    with pytest.raises(InvalidArgumentError, match="compile_options"):
        RematModel(_small_model(), compile_options=options)


def test_a_strategy_must_be_a_name():
    with pytest.raises(InvalidArgumentError, match="strategy"):
        RematModel(_small_model(), strategy=3)


def test_a_batch_without_one_of_the_named_inputs_is_one_line():
    a, b = keras.Input((3,), name="a"), keras.Input((2,), name="b")
    out = keras.layers.Dense(1)(keras.layers.Concatenate()([a, b]))
    model = RematModel(keras.Model({"a": a, "b": b}, out), budget="90%", strategy="checkpoint_all")
    model.compile(optimizer="sgd", loss="mse")
    x = {"a": np.zeros((8, 3), np.float32)}
    with pytest.raises(InvalidArgumentError, match="no input 'b'"):
        model.fit(x, np.zeros((8, 1), np.float32), batch_size=8, epochs=1, verbose=0)
