"""RematModel as Keras on a model with two outputs: loss_weights, each output's loss in the training
history, and budgets refused when the RematModel is built."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import checkmate  # noqa: E402
from checkmate.errors import InvalidArgumentError  # noqa: E402
from checkmate.tf2 import _compat  # noqa: E402

pytestmark = pytest.mark.tf

BATCH = 16


def two_heads(seed=0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((24,), name="x")
    h = inputs
    for k in range(3):
        h = keras.layers.Dense(32, activation="relu", name=f"d{k}")(h)
    kind = keras.layers.Dense(4, name="kind")(h)
    score = keras.layers.Dense(1, name="score")(h)
    return keras.Model(inputs, [kind, score], name="two_heads")


def batches(n=3 * BATCH):
    # whole batches: Keras weighs a short last batch's per-output loss mean by its traced (unknown)
    # batch dimension, RematModel by its rows
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 24)).astype("float32")
    return x, [rng.integers(0, 4, (n,)).astype("int32"), rng.standard_normal((n, 1)).astype("float32")]


LOSSES = [keras.losses.SparseCategoricalCrossentropy(from_logits=True), keras.losses.MeanSquaredError()]


@pytest.mark.parametrize("form", ["list", "dict"])
def test_loss_weights_and_per_output_losses_as_keras(form):
    if form == "list":
        losses, loss_weights = LOSSES, [0.25, 2.0]
    else:
        losses, loss_weights = dict(zip(["kind", "score"], LOSSES)), {"kind": 1.0, "score": 3.0}
    x, y = batches()
    model, twin = two_heads(), two_heads()
    model.compile(keras.optimizers.SGD(0.05), losses, loss_weights=loss_weights, jit_compile=False)
    trainer = checkmate.tf2.RematModel(twin, budget="100%", strategy="checkpoint_all")
    trainer.compile(keras.optimizers.SGD(0.05), losses, loss_weights=loss_weights)
    with _compat.grappler_disabled():
        want = model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0, shuffle=False, validation_data=(x, y)).history
    got = trainer.fit(x, y, batch_size=BATCH, epochs=2, verbose=0, shuffle=False, validation_data=(x, y)).history
    assert set(got) == set(want)
    assert {"kind_loss", "score_loss", "val_kind_loss", "val_score_loss"} <= set(got)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=2e-4, err_msg=key)
    for a, b in zip(model.variables, twin.variables):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-4, atol=1e-5, err_msg=a.path)
    assert got["kind_loss"][0] > 0 and got["score_loss"][0] > 0


def test_bad_loss_weights_are_refused_at_compile():
    trainer = checkmate.tf2.RematModel(two_heads(), budget="100%")
    with pytest.raises(InvalidArgumentError, match="3 loss_weights for a model with 2 outputs"):
        trainer.compile("sgd", LOSSES, loss_weights=[1.0, 1.0, 1.0])
    with pytest.raises(InvalidArgumentError, match=r"names \['nope'\]"):
        trainer.compile("sgd", LOSSES, loss_weights={"nope": 1.0})


@pytest.mark.parametrize("budget", ["60 percent", "-5%", "0", 0, "0%", "12 parsecs", -3, True, "", None])
def test_budgets_are_checked_when_the_remat_model_is_built(budget):
    with pytest.raises(InvalidArgumentError, match="budget"):
        checkmate.tf2.RematModel(two_heads(), budget=budget)


@pytest.mark.parametrize("budget", ["auto", "AUTO", "60%", "0.5%", "2GiB", "1.5GB", 10**9, "512 MiB"])
def test_budget_forms_that_resolve_are_accepted(budget):
    assert checkmate.tf2.RematModel(two_heads(), budget=budget).budget == budget


def test_the_stated_minimum_works_as_bytes_and_as_a_percentage():
    """The infeasible message's minimum works in its three forms (bytes, a percentage of checkpoint-all's
    peak, a share of the activations), and as a percentage never exceeds 100% for the default strategy
    (checkpoint-all always fits its own peak)."""
    import re

    from checkmate.errors import InfeasibleBudgetError

    model = two_heads()
    specs = (tf.TensorSpec((64, 24)), [tf.TensorSpec((64,), tf.int32), tf.TensorSpec((64, 1))])
    with pytest.raises(InfeasibleBudgetError) as info:
        checkmate.tf2.compile(model, LOSSES, keras.optimizers.SGD(0.1), *specs, budget="5%", strategy="auto",
                              time_limit_s=10)
    message = str(info.value)
    share = re.search(r"or ([0-9.]+%) of checkpoint-all's peak", message)
    assert share, message
    assert float(share.group(1)[:-1]) <= 100.0
    # and as a share of the activations, in the form a budget takes
    activations = re.search(r'or "([0-9.]+% activations)"', message)
    assert activations, message
    for budget in (share.group(1), info.value.min_feasible_budget_bytes, activations.group(1)):
        step = checkmate.tf2.compile(model, LOSSES, keras.optimizers.SGD(0.1), *specs, budget=budget,
                                     strategy="auto", time_limit_s=10)
        assert step.predicted.peak_memory_bytes <= step.predicted.budget_bytes
