"""Anchored computations keep their fusions: every copy of a node, recomputations included, runs the
kernels the plain step runs for it (a fused swish stays fused, a convolution stays fused with its
bias), read from the graph TF executed after Grappler, not from timings."""

from __future__ import annotations

import re

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import checkmate.tf2  # noqa: E402
from checkmate.solvers import checkpoint_all_peak, solve  # noqa: E402
from checkmate.tf2 import _compat  # noqa: E402
from checkmate.tf2.codegen import _GATE_SUFFIX, IMPORT_SCOPE, VALUE_GATE_OP, copy_name, generate  # noqa: E402
from checkmate.tf2.lowering import lower  # noqa: E402

pytestmark = pytest.mark.tf

XENT = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def swish_cnn(batch=8, size=16, filters=16, blocks=4, seed=0):
    """EfficientNet's pattern: convolution without bias, BatchNorm, swish; a residual add; a biased 1x1
    convolution into a swish (a fusable convolution whose anchor has a variable read to go through)."""
    keras.utils.set_random_seed(seed)
    layers = keras.layers
    inp = keras.Input((size, size, 3), name="image")
    x = layers.Conv2D(filters, 3, padding="same", use_bias=False, name="stem")(inp)
    x = layers.BatchNormalization(name="stem_bn")(x)
    x = layers.Activation("swish", name="stem_act")(x)
    for b in range(blocks):
        h = layers.Conv2D(filters, 3, padding="same", use_bias=False, name=f"b{b}_conv")(x)
        h = layers.BatchNormalization(name=f"b{b}_bn")(h)
        h = layers.Activation("swish", name=f"b{b}_act")(h)
        h = layers.Conv2D(filters, 1, name=f"b{b}_project")(h)
        x = layers.Add(name=f"b{b}_add")([x, h])
    x = layers.GlobalAveragePooling2D(name="pool")(x)
    out = layers.Dense(5, name="logits")(x)
    return (keras.Model(inp, out, name="swish_cnn"), tf.TensorSpec((batch, size, size, 3)),
            tf.TensorSpec((batch,), tf.int32))


def executed_kinds(run, scope: str) -> dict[str, str]:
    """Op name (inside the import scope ``scope``) -> the kind TF executed it as, after Grappler and
    oneDNN's rewrites (a fused op keeps the name of the last op it stands for)."""
    pattern = re.compile(r"^(?:.*/)?" + re.escape(scope) + r"/(.*)$")
    out = {}
    for gdef in _compat.executed_graph_defs(run):
        for nd in gdef.node:
            m = pattern.match(nd.name)
            if m:
                out[m.group(1)] = nd.op
    return out


_probes = 0


def plain_and_generated_kinds(fn, x, y) -> tuple[dict[str, str], dict[str, str]]:
    """What the plain step and the generated step each executed, both imported afresh (TF reports the
    executed graphs of a function when it is instantiated) and run under the generated step's settings."""
    global _probes
    _probes += 1
    flat = fn.flat_args(x, y)
    plain = tf.function(lambda *a: fn.plain_replica_call(*a), autograph=False)
    scope = f"{IMPORT_SCOPE}_fusion{_probes}"
    generated = fn._build_function(scope)

    def run(f):
        def call():
            with _compat.grappler_disabled():
                return f(*flat)
        return call

    return executed_kinds(run(plain), f"{IMPORT_SCOPE}_plain"), executed_kinds(run(generated), scope)


def copies_that_run_other_kernels(fn, plain: dict, generated: dict, nodes) -> list:
    """(node, copy, op, plain kind, generated kind) for every op of a copy of ``nodes`` that ran as
    another kind than the plain step ran it (or ran where the plain step fused it away, or the reverse)."""
    lowered = fn.lowered
    out = []
    for i in nodes:
        for k in range(fn.rewritten.copies[i]):
            for op in lowered.node_ops[i]:
                want, got = plain.get(op), generated.get(copy_name(op, k))
                if want != got:
                    out.append((lowered.graph.names[i], k, op, want, got))
    return out


def swish_nodes(lowered) -> list[int]:
    """Forward nodes holding a swish: a ``Sigmoid`` whose output a ``Mul`` of the same node reads (not
    a sigmoid gate such as a squeeze-and-excitation block's, whose product is another layer's)."""
    graph = lowered.function.graph
    out = []
    for i, ops in enumerate(lowered.node_ops):
        if lowered.graph.backward[i]:
            continue
        members = set(ops)
        for name in ops:
            op = graph.get_operation_by_name(name)
            if op.type == "Sigmoid" and any(c.type == "Mul" and c.name in members for c in op.outputs[0].consumers()):
                out.append(i)
                break
    return out


@pytest.mark.parametrize("order", ["total", "partial"])
def test_anchored_swish_and_convolution_copies_run_the_plain_steps_kernels(order):
    """Every computation of every forward node (every one anchored in the total order, every
    recomputation in the partial one) runs as the plain step runs that node: oneDNN's fused swish
    (``Sigmoid`` + ``Mul``) stays fused, and so does the 1x1 convolution with its bias add and the
    residual add after it (a fusion of two nodes' ops). The anchors of the swish copies go through a
    gate on their input that Grappler keeps."""
    model, xs, ys = swish_cnn()
    lowered = lower(model, XENT, xs, ys, level="layer")
    graph = lowered.graph
    schedule = solve(graph, checkpoint_all_peak(graph) // 2, strategy="checkmate_lp_rounding",
                     time_limit_s=10).schedule
    swish = swish_nodes(lowered)
    computations = schedule.recompute.sum(axis=0)
    assert len(swish) == 5 and int(computations[swish].sum()) > len(swish), "the plan recomputes no swish"
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal(xs.shape.as_list()), tf.float32)
    y = tf.constant(rng.integers(0, 5, ys.shape.as_list()), tf.int32)
    fn = generate(lowered, schedule, order=order)

    gates = [nd for nd in fn.rewritten.graph_def.node if nd.op == VALUE_GATE_OP and _GATE_SUFFIX in nd.name]
    assert gates and all(any(t.startswith("^") for t in nd.input) for nd in gates)
    plain, generated = plain_and_generated_kinds(fn, x, y)
    # the gates are still there after Grappler, with their anchors
    assert {nd.name for nd in gates} <= {n for n, kind in generated.items() if kind == VALUE_GATE_OP}
    swish_kinds = {plain.get(op) for i in swish for op in lowered.node_ops[i]} - {None}
    if "Sigmoid" in swish_kinds:
        pytest.skip("this TensorFlow build runs the plain step's swish unfused (no oneDNN swish fusion)")
    forward = [i for i in range(graph.n) if not graph.backward[i]]
    assert not copies_that_run_other_kernels(fn, plain, generated, forward)


@pytest.mark.slow
def test_efficientnet_recomputed_swish_runs_fused():
    """keras.applications EfficientNetB0 (64x64, batch 8) at 50% of its activations: every computation
    of a swish activation, recomputations included, runs as the plain step's fused swish."""
    keras.utils.set_random_seed(0)
    model = keras.applications.EfficientNetB0(weights=None, input_shape=(64, 64, 3), classes=5)
    xs, ys = tf.TensorSpec((8, 64, 64, 3)), tf.TensorSpec((8,), tf.int32)
    step = checkmate.tf2.compile(model, XENT, keras.optimizers.SGD(), xs, ys, budget="50% activations")
    fn = step.function
    lowered = step.lowered
    swish = swish_nodes(lowered)
    computations = step.schedule.recompute.sum(axis=0)
    assert int(computations[swish].sum()) > len(swish), "the plan recomputes no swish"
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal(xs.shape.as_list()), tf.float32)
    y = tf.constant(rng.integers(0, 5, ys.shape.as_list()), tf.int32)
    plain, generated = plain_and_generated_kinds(fn, x, y)
    if any(plain.get(op) == "Sigmoid" for i in swish for op in lowered.node_ops[i]):
        pytest.skip("this TensorFlow build runs the plain step's swish unfused (no oneDNN swish fusion)")
    assert not copies_that_run_other_kernels(fn, plain, generated, swish)
