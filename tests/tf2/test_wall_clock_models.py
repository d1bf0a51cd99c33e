"""The heuristics experiments/wall_clock.py sets beside checkmate: ``tf.recompute_grad`` around the
blocks of every model, the U-Net's residual blocks included, computes the plain step's loss and
gradients and lowers its peak."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "experiments"))

import wall_clock  # noqa: E402
from checkmate.tf2.memory import measure_peak_memory  # noqa: E402

pytestmark = pytest.mark.tf


def test_recompute_grad_around_the_unets_residual_blocks():
    model, forward, xs, ys, classes = wall_clock.build("unet")
    x, y = wall_clock.random_batch(xs, ys, classes)
    loss = wall_clock.loss_fn()
    plain = wall_clock.tape_step(model, loss)
    wrapped = wall_clock.tape_step(model, loss, blocks_forward=forward)
    want, got = plain(x, y), wrapped(x, y)
    assert len(got) == len(want) == 1 + len(model.trainable_variables)
    for a, b in zip(want, got):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-6)
    # the wrapped forward pass recomputes every residual block (7 of them) in the backward pass
    graph = wrapped.get_concrete_function(x, y).graph
    recomputed = [op for op in graph.get_operations() if op.type == "Conv2D"]
    plain_convs = [op for op in plain.get_concrete_function(x, y).graph.get_operations() if op.type == "Conv2D"]
    assert len(recomputed) > len(plain_convs)
    # and holds only the blocks' inputs: well below the plain step's peak (measured 6.9 against 12.1 MiB)
    assert measure_peak_memory(wrapped, x, y, repeats=2, reduce="min") < \
        0.75 * measure_peak_memory(plain, x, y, repeats=2, reduce="min")


def test_the_flat_model_and_the_forward_pass_share_their_layers():
    """Both run the same variables: the forward pass over a chain computes the model's output."""
    model, forward, xs, ys, classes = wall_clock.build("resmlp")
    x, _ = wall_clock.random_batch(xs, ys, classes)
    np.testing.assert_allclose(forward(x).numpy(), model(x).numpy(), rtol=1e-5, atol=1e-6)
    wrapped = forward(x, wrap=tf.recompute_grad)
    np.testing.assert_allclose(wrapped.numpy(), model(x).numpy(), rtol=1e-5, atol=1e-6)


def test_interleaved_peaks_measure_every_step_in_turn():
    calls = []

    def step(rows):
        @tf.function
        def fn(x):
            calls.append(rows)      # traced once; the count below is of runs
            return tf.reduce_sum(tf.tile(x, [rows, 1]) * 2.0)
        return fn

    small, large = step(64), step(512)
    counted = {"small": 0, "large": 0}

    def count(name, fn):
        def run(x):
            counted[name] += 1
            return fn(x)
        return run

    x = tf.ones((64, 1024))
    peaks = wall_clock.interleaved_peaks([count("small", small), count("large", large)], x, rounds=3)
    assert counted == {"small": 3, "large": 3}
    # the tiled copy (and its product) of 64 x 1024 floats per row of the multiple
    assert peaks[1] >= 512 * 64 * 1024 * 4 > peaks[0]


def test_cache_reuse_times_each_case_hot_and_cold(monkeypatch):
    """One row per case, its ratios the quotients of its medians (a small case and flood keep it quick)."""
    monkeypatch.setattr(wall_clock, "CACHE_REUSE_CASES", (("m", "layer_norm", (64, 32), None),
                                                          ("m", "weight_gradient", (64, 32), 16)))
    monkeypatch.setattr(wall_clock, "EVICT_BYTES", 2 ** 20)
    rows = wall_clock.cache_reuse(3)
    assert [(r["op"], r["value_shape"], r["value_kib"]) for r in rows] == [("layer_norm", "64x32", 8),
                                                                           ("weight_gradient", "64x32", 8)]
    for r in rows:
        assert r["hot_us"] > 0 and r["cold_us"] > 0 and r["repeats"] == 3
        assert r["cold_over_hot"] == pytest.approx(r["cold_us"] / r["hot_us"], rel=0.01)
    text = wall_clock.cache_reuse_markdown(rows, {"command": "c", "device": "d", "started": "s", "seconds": 1.0})
    assert text.count("| m |") == 2
