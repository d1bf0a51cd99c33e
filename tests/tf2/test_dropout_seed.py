"""A Dropout's seed advances once per batch in RematModel's fit, as in Keras' own (each batch draws a new
mask), whatever the optimizer."""

from __future__ import annotations

import numpy as np
import pytest

keras = pytest.importorskip("keras")

import checkmate.tf2  # noqa: E402

BATCH = 8


def model(optimizer: str) -> keras.Model:
    """A small KerasHub DINOv2 backbone under a head of the user's own (its class token, Dropout,
    Dense): with Adam, the nested train function lost the Dropout's seed update (it does not on a
    plain stack of Dense layers)."""
    keras_hub = pytest.importorskip("keras_hub")
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.DINOV2Backbone(patch_size=14, num_layers=1, hidden_dim=32, num_heads=2,
                                               intermediate_dim=64, image_shape=(28, 28, 3),
                                               position_embedding_shape=(28, 28, 3))
    inputs = keras.Input((28, 28, 3))
    h = keras.layers.Lambda(lambda t: t[:, 0])(backbone(inputs))
    m = keras.Model(inputs, keras.layers.Dense(5)(keras.layers.Dropout(0.3)(h)))
    opt = keras.optimizers.Adam(1e-2) if optimizer == "adam" else keras.optimizers.SGD(0.1)
    m.compile(opt, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return m


def seed_state(m: keras.Model) -> list[int]:
    (state,) = [v for v in m.variables if "seed" in v.path]
    return state.numpy().tolist()


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_each_batch_draws_a_new_dropout_mask(optimizer):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3 * BATCH, 28, 28, 3)).astype("float32")
    y = rng.integers(0, 5, (3 * BATCH,))
    plain = model(optimizer)
    other = model(optimizer)
    other.set_weights(plain.get_weights())
    start = seed_state(other)
    assert start == seed_state(plain)
    trainer = checkmate.tf2.RematModel(other, budget="100%")
    want, got = [], []

    def record(store: list, m: keras.Model):
        # each batch's loss and the seed state right after it
        return keras.callbacks.LambdaCallback(
            on_train_batch_end=lambda b, logs: store.append((float(logs["loss"]), seed_state(m))))

    plain.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[record(want, plain)])
    trainer.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[record(got, other)])
    # the seed moved on after every batch, as plain fit's did
    assert [s for _, s in got] == [s for _, s in want]
    assert [s for _, s in got][-1] != start
    # and so the losses of every batch are Keras' own
    np.testing.assert_allclose([l for l, _ in got], [l for l, _ in want], rtol=1e-5)
