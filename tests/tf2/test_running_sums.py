"""A tensor read by many ops (a sequence sliced once per step of a recurrence unrolled in Python) gets
its gradients summed as they come, in a chain of adds, not by one ``AddN`` that holds every term; a
large node whose ops each read little is split; a group split into runs is ordered so that a value's
last reader follows it."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from checkmate.bounds import checkpoint_all_peak  # noqa: E402
from checkmate.tf2 import _compat  # noqa: E402
from checkmate.tf2.lowering import lower, trace_step  # noqa: E402
from checkmate.tf2.lowering.grouping import Group, _freeing_order, _runs, merge_cycles  # noqa: E402

pytestmark = pytest.mark.tf

BATCH, STEPS, WIDTH = 4, 12, 32
XENT = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


class Steps(keras.layers.Layer):
    """A recurrence unrolled in Python that reads its input one step at a time (``x[:, t]``): the
    gradient of each slice is a tensor of the whole sequence's size."""

    def call(self, x):
        state = tf.zeros_like(x[:, 0])
        outs = []
        for t in range(x.shape[1]):
            state = tf.tanh(state * 0.5 + x[:, t])
            outs.append(state)
        return tf.stack(outs, axis=1)


def steps_model():
    keras.utils.set_random_seed(0)
    inp = keras.Input((STEPS, 4))
    h = keras.layers.Dense(WIDTH, name="embed")(inp)
    h = Steps(name="steps")(h)
    h = keras.layers.Dense(4, name="mix")(h)
    out = keras.layers.Dense(3, name="logits")(keras.layers.GlobalAveragePooling1D()(h))
    return keras.Model(inp, out)


def specs():
    return tf.TensorSpec((BATCH, STEPS, 4)), tf.TensorSpec((BATCH,), tf.int64)


def batch():
    rng = np.random.default_rng(0)
    return (tf.constant(rng.standard_normal((BATCH, STEPS, 4)), tf.float32),
            tf.constant(rng.integers(0, 3, BATCH), tf.int64))


def plain_gradients(model, x, y):
    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = XENT(y, model(x, training=True))
        return loss, tape.gradient(loss, model.trainable_variables)
    return step, step(x, y)


def slice_gradients_alive(ops):
    """The most gradients of step slices created while none of their readers has been."""
    index = {op.name: i for i, op in enumerate(ops)}
    spans = []
    for i, op in enumerate(ops):
        if op.type == "StridedSliceGrad":
            first_reader = min(index[c.name] for c in op.outputs[0].consumers())
            spans.append((i, first_reader))
    assert len(spans) >= STEPS
    return max(sum(1 for s, e in spans if s <= p < e) for p in range(len(ops)))


def test_many_terms_are_summed_as_they_come_and_the_tape_sums_as_usual_afterwards():
    model = steps_model()
    traced = trace_step(model, XENT, *specs())
    ops = traced.function.graph.get_operations()
    assert not [op for op in ops if op.type == "AddN" and len(op.inputs) > _compat.RUNNING_SUM_MIN_TERMS]
    # each partial sum is read through an EnsureShape, so that Grappler cannot fold the chain back
    chain = [op for op in ops if op.type == "AddV2" and op.inputs[0].op.type == "EnsureShape"]
    assert len(chain) >= STEPS // (_compat.RUNNING_SUM_MIN_TERMS + 1)
    assert slice_gradients_alive(ops) <= _compat.RUNNING_SUM_MIN_TERMS + 1
    # outside the trace the tape is TF's again: one AddN of every slice's gradient
    step, _ = plain_gradients(model, *batch())
    plain_ops = step.get_concrete_function(*specs()).graph.get_operations()
    assert max(len(op.inputs) for op in plain_ops if op.type == "AddN") >= STEPS
    assert slice_gradients_alive(plain_ops) >= STEPS


def test_running_sums_give_the_plain_tapes_gradients_and_grappler_keeps_the_chain():
    model = steps_model()
    traced = trace_step(model, XENT, *specs())
    x, y = batch()
    out = {}
    graphs = _compat.executed_graph_defs(lambda: out.setdefault("r", traced.function(x, y)))
    loss, *grads = out["r"]
    _, (plain_loss, plain_grads) = plain_gradients(model, x, y)
    np.testing.assert_allclose(loss.numpy(), plain_loss.numpy(), rtol=1e-6)
    for g, p in zip(grads, plain_grads):
        np.testing.assert_allclose(g.numpy(), p.numpy(), rtol=1e-5, atol=1e-7)
    executed = [n for g in graphs for n in g.node]
    assert any(n.op == "StridedSliceGrad" for n in executed)
    assert not [n for n in executed if n.op == "AddN" and len([i for i in n.input if not i.startswith("^")])
                > _compat.RUNNING_SUM_MIN_TERMS + 1]


def test_running_sums_lower_the_checkpoint_all_peak(monkeypatch):
    with_sums = lower(steps_model(), XENT, *specs(), level="op")
    monkeypatch.setattr(_compat, "running_gradient_sums", lambda: contextlib.nullcontext(False))
    without = lower(steps_model(), XENT, *specs(), level="op")
    assert not [op for op in with_sums.function.graph.get_operations() if op.type == "AddN" and len(op.inputs) > 5]
    assert [op for op in without.function.graph.get_operations() if op.type == "AddN" and len(op.inputs) >= STEPS]
    # every slice's gradient is a whole sequence: the sum of twelve of them is the plain step's peak
    assert checkpoint_all_peak(with_sums.graph) < checkpoint_all_peak(without.graph)


def test_a_node_that_reads_many_values_its_ops_read_few_of_is_split():
    lg = lower(steps_model(), XENT, *specs(), level="auto", gradient_nodes=True)
    reasons = [line for line in lg.metadata["split_layers"] if "reads at least" in line]
    assert reasons and any(line.startswith("steps") for line in reasons), lg.metadata["split_layers"]
    names = [n.name for n in lg.graph.nodes]
    assert sum(1 for n in names if n.startswith("steps_grad")) > 1


def fake_ops(producers):
    """An op graph of ops ``0..n-1`` with these data producers (``users`` derived)."""
    users = [[] for _ in producers]
    for j, ps in enumerate(producers):
        for p in ps:
            users[p].append(j)
    op_graph = SimpleNamespace(producers=tuple(tuple(p) for p in producers),
                               users=tuple(tuple(sorted(u)) for u in users))
    infos = [SimpleNamespace(dead=False) for _ in producers]
    return op_graph, infos


def test_the_freeing_order_runs_each_add_after_the_terms_it_reads():
    # terms 0..5 created first, then a chain of adds over them (a sum the tape builds at the end)
    producers = [[] for _ in range(6)] + [[0, 1]] + [[5 + k, k + 1] for k in range(1, 5)]
    op_graph, infos = fake_ops(producers)
    order = _freeing_order(list(range(len(producers))), infos, op_graph)
    assert order == [0, 1, 6, 2, 7, 3, 8, 4, 9, 5, 10]
    position = {op: k for k, op in enumerate(order)}
    assert all(position[p] < position[j] for j, ps in enumerate(producers) for p in ps)
    # runs of that order: each reads only runs before it, and none holds more than two terms unsummed
    runs = _runs([[i] for i in range(len(producers))], limit=4, infos=infos, op_graph=op_graph)
    assert sorted(i for r in runs for i in r) == list(range(len(producers)))
    run_of = {i: k for k, r in enumerate(runs) for i in r}
    assert all(run_of[p] <= run_of[j] for j, ps in enumerate(producers) for p in ps)
    # without the op graph, creation order: the first run holds terms only
    assert _runs([[i] for i in range(len(producers))], limit=4)[0] == [0, 1, 2]


def test_a_cycle_of_many_groups_becomes_one_node_named_by_its_first_and_their_number():
    # group k holds ops k and n + k; op k reads op k - 1 and op n reads op n - 1: every group depends on
    # the one before it and the first on the last (a recurrence's backward interleaved with its forward)
    n = 120
    producers = [[]] + [[k - 1] for k in range(1, n)] + [[n - 1]] + [[] for _ in range(n - 1)]
    op_graph, _ = fake_ops(producers)
    groups = [Group(f"layer/step_{k}", [k, n + k], False, True) for k in range(n)] + [Group("other", [], False, True)]
    merged = merge_cycles(groups[:n], op_graph)
    assert len(merged) == 1
    assert merged[0].name == f"layer/step_0+{n - 1}"
    assert merged[0].ops == list(range(2 * n))
    # a name another group has already: the members' names joined, never a duplicate
    groups[n] = Group(f"layer/step_0+{n - 1}", [], False, True)
    op_graph, _ = fake_ops(producers + [[]])
    groups[n].ops.append(2 * n)
    names = [g.name for g in merge_cycles(groups, op_graph)]
    assert len(set(names)) == len(names) == 2
