"""Node costs: the analytic FLOP model and measured profiles with their on-disk cache."""

from __future__ import annotations

import json

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from checkmate.tf2 import profiling  # noqa: E402
from checkmate.tf2.lowering import lower  # noqa: E402

pytestmark = pytest.mark.tf

XENT = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def bn_dropout_model():
    keras.utils.set_random_seed(0)
    inp = keras.Input((6, 6, 2))
    h = keras.layers.Conv2D(4, 3, padding="same", name="conv")(inp)
    h = keras.layers.BatchNormalization(name="bn")(h)
    h = keras.layers.Flatten(name="flat")(h)
    h = keras.layers.Dropout(0.5, name="drop")(h)
    return keras.Model(inp, keras.layers.Dense(3, name="out")(h))


def specs(batch=2):
    return tf.TensorSpec((batch, 6, 6, 2)), tf.TensorSpec((batch,), tf.int32)


OPTS = {"repeats": 3, "warmup": 1}


def test_flops_of_matmul_and_conv():
    model = bn_dropout_model()
    lg = lower(model, XENT, *specs(), level="op", cost_model="flops")
    fg = lg.function.graph
    by_type = {}
    for nid, (name,) in enumerate(lg.node_ops):
        by_type.setdefault(fg.get_operation_by_name(name).type, []).append(nid)
    (conv,) = by_type["Conv2D"]
    assert lg.graph.cost[conv] == 2 * (2 * 6 * 6 * 4) * (3 * 3 * 2)
    (matmul,) = [i for i in by_type["MatMul"] if not lg.graph.backward[i]]
    assert lg.graph.cost[matmul] == 2 * (2 * 3) * 144
    assert (lg.graph.cost >= 1).all()
    again = lower(model, XENT, *specs(), level="op", cost_model="flops")
    np.testing.assert_array_equal(again.graph.cost, lg.graph.cost)
    assert lg.metadata["cost_unit"] == "flops"


def test_profile_cache_miss_then_hit(tmp_path):
    model = bn_dropout_model()
    opts = {**OPTS, "cache_dir": tmp_path}
    first = lower(model, XENT, *specs(), level="layer", cost_model="profile", profile_options=opts, progress=False)
    n = first.graph.n
    assert first.metadata["profile_cache_misses"] > 0
    assert first.metadata["profile_cache_hits"] + first.metadata["profile_cache_misses"] == n
    assert (first.graph.cost >= profiling.MIN_TIME_US).all()
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1
    data = json.loads(files[0].read_text())
    assert data["format"] == profiling.PROFILE_FORMAT
    assert data["device"] == profiling.device_description()
    assert all(isinstance(e["time_us"], float) for e in data["entries"].values())
    nodes = {k: e for k, e in data["entries"].items() if "median_us" in e}
    steps = {k: e for k, e in data["entries"].items() if e.get("kind") == "step_launch_us_per_op"}
    assert len(nodes) + len(steps) == len(data["entries"]) and len(steps) <= 1
    # a node's cached time is its own, measured alone: no share of the step in it
    assert all(e["time_us"] == max(profiling.MIN_TIME_US, e["median_us"] - e["overhead_us"]) for e in nodes.values())
    assert not list(tmp_path.glob(".*.tmp"))

    second = lower(model, XENT, *specs(), level="layer", cost_model="profile", profile_options=opts, progress=False)
    assert second.metadata["profile_cache_hits"] == n and second.metadata["profile_cache_misses"] == 0
    np.testing.assert_array_equal(second.graph.cost, first.graph.cost)

    # another batch size changes the input shapes of every node except the two state nodes (BatchNorm's
    # moving-statistics update and the dropout seed), which stay cached
    third = lower(model, XENT, *specs(batch=3), level="layer", cost_model="profile", profile_options=opts,
                  progress=False)
    assert third.metadata["profile_cache_hits"] == 2
    assert sorted(nd.name for nd in third.graph.nodes if not nd.recomputable) == ["bn:state", "drop:state"]
    entries = json.loads(files[0].read_text())["entries"]
    assert len(entries) > len(data["entries"])


def test_cache_dir_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(profiling.CACHE_ENV, str(tmp_path / "env"))
    assert profiling.cache_dir() == tmp_path / "env"
    assert profiling.cache_dir(tmp_path / "explicit") == tmp_path / "explicit"
    monkeypatch.delenv(profiling.CACHE_ENV)
    assert profiling.cache_dir().parts[-3:] == (".cache", "checkmate", "profiles")


def test_profiling_restores_assigned_variables_and_op_level_works(tmp_path):
    model = bn_dropout_model()
    before = [v.numpy().copy() for v in model.variables]
    lg = lower(model, XENT, *specs(), level="op", cost_model="profile",
               profile_options={**OPTS, "cache_dir": tmp_path, "use_cache": False}, progress=False)
    after = [v.numpy() for v in model.variables]
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)
    assert lg.metadata["profile_cache_misses"] == lg.graph.n
    assert not list(tmp_path.glob("*.json"))  # use_cache=False writes nothing
    assert np.isfinite(lg.graph.cost).all()


def test_bigger_node_costs_more():
    # a 64x wider matrix product must measure slower than a tiny elementwise node
    keras.utils.set_random_seed(0)
    inp = keras.Input((256,))
    h = keras.layers.Dense(1024, name="wide")(inp)
    out = keras.layers.Dense(2, name="narrow")(keras.layers.Activation("relu", name="act")(h))
    lg = lower(keras.Model(inp, out), XENT, tf.TensorSpec((64, 256)), tf.TensorSpec((64,), tf.int32),
               level="layer", cost_model="profile", profile_options={"use_cache": False, "repeats": 5},
               progress=False)
    names = lg.graph.names
    assert lg.graph.cost[names.index("wide")] > lg.graph.cost[names.index("narrow")]


def test_cache_ignores_corrupt_file(tmp_path):
    cache = profiling.ProfileCache(tmp_path)
    cache.path.parent.mkdir(parents=True, exist_ok=True)
    cache.path.write_text("{not json")
    fresh = profiling.ProfileCache(tmp_path)
    assert fresh.get("k") is None
    fresh.put("k", 12.5, ops="MatMul")
    fresh.save()
    assert profiling.ProfileCache(tmp_path).get("k") == 12.5


def test_robust_median_drops_slow_outliers():
    samples = [10.0, 10.5, 9.8, 10.2, 10.1, 95.0, 10.3]
    assert profiling.robust_median(samples) == pytest.approx(10.15)
    assert profiling.robust_median([5.0]) == 5.0
    with pytest.raises(ValueError):
        profiling.robust_median([])


def test_estimate_counts_memory_bound_ops():
    """A LayerNormalization + GELU node has almost no FLOPs per byte: the calibrated estimate prices
    its bytes, so it is not negligible next to a matrix product of the same width (FLOPs say it is)."""
    keras.utils.set_random_seed(0)
    inp = keras.Input((512,))
    h = keras.layers.Dense(512, name="dense")(inp)
    h = keras.layers.LayerNormalization(name="norm")(h)
    out = keras.layers.Activation("gelu", name="act")(h)
    lg = lower(keras.Model(inp, out), lambda y, p: tf.reduce_mean(p), tf.TensorSpec((256, 512)),
               tf.TensorSpec((256,)), level="layer", cost_model="flops")
    cal = profiling.Calibration(flops_per_us=1e5, bytes_per_us=1e4, op_launch_us=1.0)
    fg = lg.function.graph
    names = lg.graph.names
    est = {n: profiling.estimate_cost(fg, lg.node_ops[names.index(n)], cal) for n in ("dense", "norm", "act")}
    flops = {n: lg.graph.cost[names.index(n)] for n in ("dense", "norm", "act")}
    assert flops["act"] / flops["dense"] < 0.05
    assert est["act"] / est["dense"] > 0.2
    # the roofline: an op costs at least its bytes over the bandwidth and its FLOPs over the rate
    matmul = next(op for op in fg.get_operations() if op.type == "MatMul")
    assert cal.op_time_us(matmul) >= profiling.op_flops(matmul) / cal.flops_per_us
    assert cal.op_time_us(matmul) >= profiling.op_bytes(matmul) / cal.bytes_per_us


def test_time_budget_spent_gives_calibrated_estimates(tmp_path):
    """With no time to measure, every node costs its calibrated estimate (nothing cached); with time,
    the largest nodes are measured and the ones left are scaled by the measured/estimated ratio."""
    model = bn_dropout_model()
    lg = lower(model, XENT, *specs(), level="layer", cost_model="profile", progress=False,
               profile_options={**OPTS, "cache_dir": tmp_path, "time_budget_s": 0.0})
    assert lg.metadata["profile_estimated"] == lg.graph.n
    assert (lg.graph.cost >= profiling.MIN_TIME_US).all()
    data = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert not data["entries"] and data["calibration"]["flops_per_us"] > 0
    full = lower(model, XENT, *specs(), level="layer", cost_model="profile", progress=False,
                 profile_options={**OPTS, "cache_dir": tmp_path, "time_budget_s": None})
    assert full.metadata["profile_estimated"] == 0


def test_compile_defaults_to_profiled_costs_and_says_so(tmp_path, monkeypatch):
    import checkmate.tf2 as ct

    monkeypatch.setenv(profiling.CACHE_ENV, str(tmp_path))
    model = bn_dropout_model()
    step = ct.compile(model, XENT, keras.optimizers.SGD(), *specs(), budget="100%", strategy="checkpoint_all")
    assert step.lowered.metadata["cost_model"] == "profile"
    assert step.lowered.metadata["cost_unit"] == "us"
    text = step.summary()
    assert "cost model      profiled on" in text and "measured: not yet" in text
    measured = step.measure_time(repeats=3)
    assert measured.step_seconds > 0 and measured.plain_seconds > 0
    assert f"measured {measured.ratio:.3f}x the plain step" in step.summary()
    flops = ct.compile(model, XENT, keras.optimizers.SGD(), *specs(), budget="100%", strategy="checkpoint_all",
                       cost_model="flops")
    assert "cost model      FLOPs" in flops.summary()


def test_remat_model_reports_measured_step_time_after_first_epoch(tmp_path, monkeypatch, capsys):
    from checkmate.tf2.keras_model import RematModel

    monkeypatch.setenv(profiling.CACHE_ENV, str(tmp_path))
    model = bn_dropout_model()
    remat = RematModel(model, budget="100%", strategy="checkpoint_all")
    remat.compile(optimizer=keras.optimizers.SGD(), loss=XENT)
    x = np.random.default_rng(0).standard_normal((8, 6, 6, 2)).astype("float32")
    y = np.zeros((8,), "int32")
    remat.fit(x, y, batch_size=4, epochs=2, verbose=2)
    out = capsys.readouterr().out
    assert out.count("checkmate: step time") == 1       # after the first epoch only
    step = remat.compiled_step()
    assert step.measured is not None and step.measured.repeats > 0
    assert (f"{step.measured.ratio:.3f}x the plain step (predicted "
            f"{step.measured.describe_expected(step.predicted.time_overhead)}") in out
    # a step is measured once: fit() called again (one epoch at a time, say) costs no more measuring
    first = step.measured
    remat.fit(x, y, batch_size=4, epochs=1, verbose=2)
    assert "checkmate: step time" not in capsys.readouterr().out
    assert remat.compiled_step().measured is first


def test_node_cost_is_its_time_alone_plus_its_ops_share_of_the_step(tmp_path):
    """Measured or read from the cache, a node costs its time alone plus (its ops) x (the step's
    per-op scheduling share); the share is the step's, cached per step, so a node first measured in
    one step and read from the cache in another takes the other step's share."""
    lg = lower(bn_dropout_model(), XENT, *specs(), level="layer", cost_model="flops")
    graph = lg.function.graph
    gdef = graph.as_graph_def()
    keys = [profiling._node_program(graph, gdef, list(ops)).key for ops in lg.node_ops]
    opts = {**OPTS, "cache_dir": tmp_path, "progress": False, "time_budget_s": None}

    def profile(node_ops):
        return profiling.profile_nodes(lg.function, node_ops, lg.input_names, lg.label_names, **opts)

    def alone(key):
        (path,) = tmp_path.glob("*.json")
        return json.loads(path.read_text())["entries"][key]["time_us"]

    first = profile(lg.node_ops)
    assert first.misses == lg.graph.n and first.launch_us_per_op >= 0
    for k, ops in enumerate(lg.node_ops):
        assert first.costs[k] == pytest.approx(max(profiling.MIN_TIME_US, alone(keys[k]) * first.overlap_scale
                                                   + first.launch_us_per_op * len(ops)),
                                               rel=1e-12)
    again = profile(lg.node_ops)
    assert again.hits == lg.graph.n and again.costs == first.costs
    assert again.launch_us_per_op == first.launch_us_per_op
    # another step (its last node left out) made of cached nodes: its own share, the same times alone
    other = profile(lg.node_ops[:-1])
    assert other.hits == lg.graph.n - 1 and other.misses == 0
    for k, ops in enumerate(lg.node_ops[:-1]):
        assert other.costs[k] == pytest.approx(max(profiling.MIN_TIME_US, alone(keys[k]) * other.overlap_scale
                                                   + other.launch_us_per_op * len(ops)),
                                               rel=1e-12)


def test_node_programs_share_one_index_and_copy_the_library_only_for_function_calls():
    """Programs built with one index of the step's nodes equal those built with an index each (which
    made a 2621-node step's programs take minutes); a node's program carries the function library
    only when one of its ops calls a library function."""
    lg = lower(bn_dropout_model(), XENT, *specs(), level="layer", cost_model="flops")
    graph = lg.function.graph
    gdef = graph.as_graph_def()
    index = {nd.name: nd for nd in gdef.node}
    for ops in lg.node_ops:
        shared = profiling._node_program(graph, gdef, list(ops), index)
        own = profiling._node_program(graph, gdef, list(ops))
        assert shared.key == own.key
        assert shared.graph_def.SerializeToString(deterministic=True) == own.graph_def.SerializeToString(
            deterministic=True)

    inner = tf.function(lambda a: tf.sin(a) * 2.0)

    @tf.function
    def outer(a):
        return inner(tf.cos(a)) + 1.0

    fgraph = outer.get_concrete_function(tf.TensorSpec((3,))).graph
    fdef = fgraph.as_graph_def()
    assert len(fdef.library.function) >= 1
    calls = [op.name for op in fgraph.get_operations() if op.type in ("PartitionedCall", "StatefulPartitionedCall")]
    cosine = [op.name for op in fgraph.get_operations() if op.type == "Cos"]
    assert len(calls) == 1 and len(cosine) == 1
    assert len(profiling._node_program(fgraph, fdef, calls).graph_def.library.function) == len(fdef.library.function)
    assert len(profiling._node_program(fgraph, fdef, cosine).graph_def.library.function) == 0
    # the program of the call runs: its library came with it
    program = profiling._node_program(fgraph, fdef, calls)
    value = tf.constant([0.5, 1.0, 2.0])
    fn = profiling._compile(program.graph_def, program.feeds, program.fetches, [tf.cos(value)])
    np.testing.assert_allclose(fn(tf.cos(value))[0], np.sin(np.cos(value)) * 2.0, rtol=1e-6)


def test_recorded_inputs_run_without_grappler_and_leave_its_options_as_they_were(monkeypatch):
    """The one run that records every node's inputs runs with the meta optimizer off (it only reads
    values); the values are the step's, and the user's Grappler options are restored afterwards."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(4)])
    lg = lower(model, XENT, tf.TensorSpec((8, 8)), tf.TensorSpec((8,), tf.int32), level="op", cost_model="flops")
    graph = lg.function.graph
    gdef = graph.as_graph_def()
    programs = [profiling._node_program(graph, gdef, list(ops)) for ops in lg.node_ops]
    before = tf.config.optimizer.get_experimental_options()
    set_options = tf.config.optimizer.set_experimental_options
    seen: list = []
    monkeypatch.setattr(tf.config.optimizer, "set_experimental_options",
                        lambda options: (seen.append(dict(options)), set_options(options))[1])
    values = profiling._record_inputs(lg.function, gdef, programs, list(range(len(programs))), lg.input_names,
                                      lg.label_names, None, 0)
    assert tf.config.optimizer.get_experimental_options() == before
    assert seen[0] == {"disable_meta_optimizer": True}
    # the recorded loss input of the last forward node equals what the plain step computes
    batch = profiling._batch_values(lg.function, lg.input_names, lg.label_names, 0)
    loss = float(lg.function(*[tf.convert_to_tensor(v) for v in tf.nest.flatten(batch)])[0])
    assert np.isfinite(loss)
    hidden = [name for name in values if "MatMul" in name or "Relu" in name]
    assert hidden
    x = tf.convert_to_tensor(tf.nest.flatten(batch)[0])
    relu = model.layers[0](x)
    recorded = [np.asarray(values[name]) for name in hidden if np.asarray(values[name]).shape == tuple(relu.shape)]
    assert any(np.allclose(v, relu.numpy(), rtol=1e-5, atol=1e-6) for v in recorded)
