"""Node costs read from a profiler trace of the whole plain step: coverage, agreement with nodes timed
alone, the cache, fusions, the fallback when the profiler is taken, and the summary line."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from checkmate.tf2 import _compat, profiling  # noqa: E402
from checkmate.tf2.lowering import lower  # noqa: E402
from checkmate.tf2.step import cost_model_description  # noqa: E402

pytestmark = pytest.mark.tf

XENT = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def conv_model():
    """Nodes whose costs span orders of magnitude: wide convolutions at 32x32 down to a 4-unit head."""
    keras.utils.set_random_seed(0)
    inp = keras.Input((32, 32, 3))
    h = keras.layers.Conv2D(32, 3, padding="same", activation="relu", name="wide1")(inp)
    h = keras.layers.Conv2D(32, 3, padding="same", activation="relu", name="wide2")(h)
    h = keras.layers.MaxPooling2D(4, name="pool")(h)
    h = keras.layers.Conv2D(8, 1, name="narrow")(h)
    h = keras.layers.Flatten(name="flat")(h)
    return keras.Model(inp, keras.layers.Dense(4, name="head")(h))


def conv_specs(batch=8):
    return tf.TensorSpec((batch, 32, 32, 3)), tf.TensorSpec((batch,), tf.int32)


def repeated_cells(blocks=24, width=32):
    """A residual MLP of repeated cells (dense, normalization, activation, add): 200+ layer nodes."""
    keras.utils.set_random_seed(0)
    inp = keras.Input((width,))
    x = keras.layers.Dense(width, name="stem")(inp)
    for b in range(blocks):
        h = keras.layers.Dense(width, name=f"c{b}_d1")(x)
        h = keras.layers.LayerNormalization(name=f"c{b}_ln")(h)
        h = keras.layers.Activation("gelu", name=f"c{b}_act")(h)
        h = keras.layers.Dense(width, name=f"c{b}_d2")(h)
        x = keras.layers.Add(name=f"c{b}_add")([x, h])
    return keras.Model(inp, keras.layers.Dense(3, name="head")(x))


def profile(lg, tmp_path, **opts):
    opts = {"repeats": 5, "warmup": 1, "cache_dir": tmp_path, "progress": False, **opts}
    return profiling.profile_nodes(lg.function, lg.node_ops, lg.input_names, lg.label_names, **opts)


def test_trace_agrees_with_nodes_timed_alone(tmp_path):
    """Every node is measured in the trace, and the costs rank the nodes as timing each alone does:
    the largest nodes (the wide convolutions and their gradients) come out on top in both, the costs
    correlate on a log scale, and their totals are of one size. Ratios of many nodes, not one timing."""
    lg = lower(conv_model(), XENT, *conv_specs(), level="layer", cost_model="flops")
    # 15 repeats, not 5: on two loaded cores the median of 5 timings of a small node alone varied 8x
    # between runs (the loss node: 90 and 777 us), enough to pull 14 nodes' correlation to 0.44
    traced = profile(lg, tmp_path / "trace", time_budget_s=None, repeats=15)
    alone = profile(lg, tmp_path / "alone", time_budget_s=None, trace=False, repeats=15)
    assert traced.estimated == 0 and traced.traced == lg.graph.n and traced.measured_share == 1.0
    assert alone.estimated == 0 and alone.traced == 0
    a, t = np.log(alone.costs), np.log(traced.costs)
    assert np.corrcoef(a, t)[0, 1] > 0.6
    assert np.argmax(traced.costs) in set(np.argsort(alone.costs)[-3:])
    assert np.argmax(alone.costs) in set(np.argsort(traced.costs)[-3:])
    wide = [k for k, nd in enumerate(lg.graph.nodes) if nd.name.startswith("wide")]
    assert len(wide) == 4
    for costs in (traced.costs, alone.costs):
        assert sum(costs[k] for k in wide) > 0.5 * sum(costs)
    assert 0.25 < sum(traced.costs) / sum(alone.costs) < 4.0


@pytest.mark.slow
def test_every_node_of_a_repeated_cell_model_is_measured_in_the_default_budget(tmp_path):
    """A 200+-node step: every node measured, in the default time budget, from one trace (no node
    timed alone); a second run reads every node from the cache, no trace, the same costs."""
    model = repeated_cells()
    lg = lower(model, XENT, tf.TensorSpec((16, 32)), tf.TensorSpec((16,), tf.int32), level="layer",
               cost_model="flops")
    assert lg.graph.n >= 200
    first = profile(lg, tmp_path, repeats=7, warmup=2)        # the default budget
    assert first.estimated == 0 and first.measured_share == 1.0
    assert first.traced == lg.graph.n and first.misses == lg.graph.n and first.hits == 0
    assert all(c >= profiling.MIN_TIME_US for c in first.costs)
    # the cells' equal layers share one time (one key, the median of their times in the trace)
    by_name = {nd.name: c for nd, c in zip(lg.graph.nodes, first.costs)}
    assert by_name["c3_d1"] == by_name["c7_d1"]
    second = profile(lg, tmp_path, repeats=7, warmup=2)
    assert second.hits == lg.graph.n and second.misses == 0 and second.traced == 0
    assert second.costs == first.costs


def test_costs_add_up_to_the_step(tmp_path):
    """The nodes' costs add up to the plain step's time. Traced nodes hold their share of the step's
    scheduling already: one scale sets them to the step's time, no launch share per op. Timed alone,
    a launch share fills what their sum leaves, an overlap scale shrinks a sum that exceeds it (ops
    run side by side); never both."""
    lg = lower(conv_model(), XENT, *conv_specs(), level="layer", cost_model="flops")
    result = profile(lg, tmp_path, time_budget_s=None)
    assert result.traced == lg.graph.n
    assert result.overlap_scale > 0 and result.launch_us_per_op == 0.0
    entry = next(e for e in profiling.ProfileCache(tmp_path).entries.values()
                 if e.get("kind") == "step_launch_us_per_op")
    step_net_us = entry["step_us"] - profiling._call_overhead_us(5, 1)
    # a node the scale takes below the least measurable time keeps that time (at most that much more)
    clamp_us = profiling.MIN_TIME_US * lg.graph.n
    assert step_net_us - 1e-6 <= sum(result.costs) <= step_net_us + clamp_us
    alone = profile(lg, tmp_path / "alone", time_budget_s=None, trace=False)
    assert 0 < alone.overlap_scale <= 1.0
    assert alone.overlap_scale == 1.0 or alone.launch_us_per_op == 0.0
    entry = next(e for e in profiling.ProfileCache(tmp_path / "alone").entries.values()
                 if e.get("kind") == "step_launch_us_per_op")
    step_net_us = entry["step_us"] - profiling._call_overhead_us(5, 1)
    assert step_net_us - 1e-6 <= sum(alone.costs) <= step_net_us + clamp_us


def test_a_fused_op_shares_its_time_with_the_ops_it_absorbed():
    """Grappler fuses a convolution, its bias and a residual add into one op named after the add: the
    convolution, which did not run under its own name, takes most of the time, by its roofline."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, (8, 32, 32, 16), name="x")
        w = tf.constant(np.ones((3, 3, 16, 16), np.float32), name="w")
        conv = tf.nn.conv2d(x, w, 1, "SAME", name="conv")
        biased = tf.nn.bias_add(conv, tf.constant(np.ones(16, np.float32)), name="bias")
        tf.math.add(biased, x, name="add")
    cal = profiling.Calibration(flops_per_us=1e4, bytes_per_us=1e4, op_launch_us=1.0)
    shares = profiling._fusion_shares(graph, ["add"], executed={"add", "x"}, calibration=cal)
    parts = dict(shares["add"])
    assert set(parts) == {"add", "bias", "conv"}
    assert sum(parts.values()) == pytest.approx(1.0)
    assert parts["conv"] > 0.9
    # an op that ran under its own name absorbed nothing of it
    shares = profiling._fusion_shares(graph, ["add"], executed={"add", "x", "conv"}, calibration=cal)
    assert set(dict(shares["add"])) == {"add", "bias"}


def test_profiler_taken_falls_back_to_timing_nodes_alone(tmp_path):
    """With the profiler already running (a user's trace), no trace is taken: the nodes are timed
    alone, and the user's profiler session is left running."""
    lg = lower(conv_model(), XENT, *conv_specs(2), level="layer", cost_model="flops")
    tf.profiler.experimental.start(str(tmp_path / "user-trace"))
    try:
        result = profile(lg, tmp_path / "cache", time_budget_s=None)
    finally:
        tf.profiler.experimental.stop()
    assert result.traced == 0 and result.estimated == 0
    assert list((tmp_path / "user-trace").rglob("*.xplane.pb"))


def test_interrupted_trace_stops_the_profiler():
    """Ctrl-C inside a trace stops the profiler: the next trace starts."""
    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _compat.profiler_trace(interrupted)
    space = _compat.profiler_trace(lambda: tf.math.add(1.0, 2.0))
    assert len(space.planes) >= 1


def test_summary_says_how_many_nodes_were_measured_and_their_share(tmp_path):
    model = conv_model()
    full = lower(model, XENT, *conv_specs(2), level="layer", cost_model="profile", progress=False,
                 profile_options={"repeats": 3, "warmup": 1, "cache_dir": tmp_path / "a", "time_budget_s": None})
    n = full.graph.n
    text = cost_model_description(full)
    assert f"{n} of {n} nodes measured (100.0% of the estimated cost)" in text
    assert "estimate" not in text.split("cost)")[1]
    none = lower(model, XENT, *conv_specs(2), level="layer", cost_model="profile", progress=False,
                 profile_options={"repeats": 3, "warmup": 1, "cache_dir": tmp_path / "b", "time_budget_s": 0.0})
    text = cost_model_description(none)
    assert f"0 of {n} nodes measured (0.0% of the estimated cost)" in text
    assert f"{n} a calibrated FLOPs-and-bytes estimate" in text


def test_ops_side_by_side_share_the_wall_time():
    """Two ops that overlap split the overlap evenly; the shares add up to the busy wall time, gaps
    excluded; an op alone keeps its duration."""
    shares = profiling._exclusive_times([(0.0, 10.0), (5.0, 15.0), (20.0, 24.0), (21.0, 22.0)])
    assert shares == pytest.approx([7.5, 7.5, 3.5, 0.5])
    assert sum(shares) == pytest.approx(15.0 + 4.0)
    assert profiling._exclusive_times([]) == []


def test_nodes_timed_alone_are_measured_again_in_the_steps_trace(tmp_path):
    """A cache of nodes timed alone (hot inputs, ops back to back: memory-bound nodes come out cheaper than
    they are in the step) does not price a step that was never traced: the trace measures every node
    again and its times replace them in the cache; the next call reads them all from the cache."""
    lg = lower(conv_model(), XENT, *conv_specs(2), level="layer", cost_model="flops")
    alone = profile(lg, tmp_path, time_budget_s=None, trace=False)
    assert alone.traced == 0 and alone.misses == lg.graph.n
    traced = profile(lg, tmp_path, time_budget_s=None)
    assert traced.traced == lg.graph.n and traced.hits == 0
    again = profile(lg, tmp_path, time_budget_s=None)
    assert again.traced == 0 and again.hits == lg.graph.n
    assert again.costs == traced.costs


def test_a_trace_prices_every_node_it_times_cached_ones_too(tmp_path):
    """When a step is traced (one node missing from the cache), every node takes its time from that trace:
    a node's cached time from another run (here made 1000 times larger) does not stand beside it."""
    lg = lower(conv_model(), XENT, *conv_specs(2), level="layer", cost_model="flops")
    first = profile(lg, tmp_path, time_budget_s=None)
    cache = profiling.ProfileCache(tmp_path)
    keys = [k for k, v in cache.entries.items() if not k.startswith(profiling._STEP_PREFIX)]
    assert len(keys) >= 2
    largest = max(keys, key=lambda k: cache.entries[k]["time_us"])
    inflated = cache.entries[largest]["time_us"] * 1000
    cache.entries[largest]["time_us"] = inflated
    del cache.entries[min(keys, key=lambda k: cache.entries[k]["time_us"])]
    # the step's own entry goes too: the cache then holds no trace of this step
    for k in [k for k in cache.entries if k.startswith(profiling._STEP_PREFIX)]:
        del cache.entries[k]
    cache._dirty = True
    cache.path.unlink()
    cache.save()
    second = profile(lg, tmp_path, time_budget_s=None)
    assert second.traced == lg.graph.n
    assert max(second.costs) < 10 * max(first.costs), (second.costs, first.costs)
    assert profiling.ProfileCache(tmp_path).entries[largest]["time_us"] < inflated / 10
