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
