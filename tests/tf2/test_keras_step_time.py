"""RematModel's step-time report after its first epoch: a real, interleaved measurement of the
compiled step against the plain one, reported beside the predicted overhead, that trains nothing."""

from __future__ import annotations

import logging

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import checkmate  # noqa: E402
from checkmate.tf2.trainer import STEP_TIME_REPORT_REPEATS  # noqa: E402


def mlp() -> keras.Model:
    keras.utils.set_random_seed(0)
    inputs = keras.Input((12,))
    h = keras.layers.Dense(32, activation="relu")(inputs)
    h = keras.layers.Dense(32, activation="relu")(h)
    return keras.Model(inputs, keras.layers.Dense(5)(h), name="mlp")


class CountCalls:
    """Counts the calls of a function it stands in for."""

    def __init__(self, fn):
        self.fn = fn
        self.calls = 0

    def __call__(self, *args):
        self.calls += 1
        return self.fn(*args)


class Spy(keras.callbacks.Callback):
    """Keeps the weights as the first epoch left them (this callback's ``on_epoch_end`` runs before
    the report's, which RematModel adds last)."""

    def __init__(self, trainer):
        super().__init__()
        self.trainer = trainer
        self.weights_after_epoch = None

    def on_epoch_end(self, epoch, logs=None):
        if self.weights_after_epoch is None:
            self.weights_after_epoch = [v.numpy() for v in self.trainer.inner.variables]


def test_first_epoch_reports_a_real_interleaved_measurement_beside_the_prediction(caplog, capsys, monkeypatch):
    from checkmate.tf2 import timing

    timed = []
    original = timing.interleaved_times

    def counted(fns, *args, **kwargs):
        # the functions measured, each counted as it runs
        timed.extend(CountCalls(fn) for fn in fns)
        return original(timed[-len(fns):], *args, **kwargs)

    monkeypatch.setattr(timing, "interleaved_times", counted)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 12)).astype("float32")
    y = rng.integers(0, 5, (32,)).astype("int32")
    trainer = checkmate.tf2.RematModel(mlp(), budget="100%", strategy="checkpoint_all",
                                       compile_options={"cost_model": "flops"})
    trainer.compile(keras.optimizers.SGD(0.1),
                    keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    spy = Spy(trainer)
    with caplog.at_level(logging.INFO, logger="checkmate.tf2"):
        trainer.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[spy])
    step = trainer.compiled_step()
    measured = step.measured
    assert measured is not None and measured.repeats == STEP_TIME_REPORT_REPEATS
    # the compiled step's gradients and the plain step's were both run: a warm-up call and one per repeat
    assert [t.fn for t in timed] == [step.function.call_flat, step.lowered.function]
    assert [t.calls for t in timed] == [STEP_TIME_REPORT_REPEATS + 1] * 2
    assert measured.step_seconds > 0 and measured.plain_seconds > 0
    assert measured.cpu_ratio is not None and measured.cpu_ratio > 0
    assert measured.ratio == pytest.approx(measured.step_seconds / measured.plain_seconds)
    # with verbose=0 the line goes to the log only, the ratio beside the predicted overhead
    assert "checkmate: step time" not in capsys.readouterr().out
    lines = [r.getMessage() for r in caplog.records if "checkmate: step time" in r.getMessage()]
    assert len(lines) == 1
    assert (f"step time {measured.ratio:.3f}x the plain step (predicted overhead {step.predicted.overhead:.3f}x; "
            f"{measured.describe()})") in lines[0]
    # measuring computes gradients only: the weights are those the epoch's batches left
    for before, v in zip(spy.weights_after_epoch, trainer.inner.variables):
        np.testing.assert_array_equal(v.numpy(), before)
    assert f"measured {measured.ratio:.3f}x the plain step" in step.summary()


def test_epochs_and_fit_calls_after_the_first_trace_nothing_again():
    """An epoch costs the step and no tracing: the train function is traced once per batch shape, not
    per epoch or per ``fit`` call (a fit timed epoch by epoch pays no first-epoch cost again)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((24, 12)).astype("float32")
    y = rng.integers(0, 5, (24,)).astype("int32")
    trainer = checkmate.tf2.RematModel(mlp(), budget="100%", strategy="checkpoint_all",
                                       compile_options={"cost_model": "flops"})
    trainer.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    traced = []
    own = trainer.train_step

    def counted(data):
        # runs only while the train function is traced
        traced.append(tuple(int(d) for d in tf.nest.flatten(data)[0].shape))
        return own(data)

    trainer.train_step = counted
    trainer.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    assert traced == [(8, 12)]
    step = trainer.compiled_step()
    trainer.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    assert traced == [(8, 12)] and trainer.compiled_step() is step
    # a short last batch is padded to the compiled step (no batch statistics): one trace of its shape
    trainer.fit(x[:20], y[:20], batch_size=8, epochs=2, shuffle=False, verbose=0)
    assert traced == [(8, 12), (4, 12)] and set(trainer.compiled_steps) == {8}
