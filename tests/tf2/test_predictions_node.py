"""With training metrics compiled, the step returns the training forward pass's predictions. They
leave the step through a node of their own, the step's last, so that the op that made them (a
language model's logits) need not stay resident through the whole backward: a plan may free it after
the loss and compute it again at the end. These tests fail where the predictions' producer is a step
output itself (resident from its first computation on)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import checkmate  # noqa: E402
import checkmate.tf2  # noqa: E402
from checkmate.bounds import peak_floor  # noqa: E402
from checkmate.graph import Graph  # noqa: E402
from checkmate.simulate import replay_plan  # noqa: E402
from checkmate.tf2.lowering import PREDICTION_LAYER  # noqa: E402

BATCH, STEPS, VOCAB, HIDDEN, LAYERS = 8, 32, 256, 128, 4


def token_lm(seed: int = 0) -> keras.Model:
    """Next-token logits over a vocabulary twice the hidden width, after four dense layers."""
    keras.utils.set_random_seed(seed)
    ids = keras.Input((STEPS,), dtype="int32")
    h = keras.layers.Embedding(VOCAB, HIDDEN)(ids)
    for _ in range(LAYERS):
        h = keras.layers.Dense(HIDDEN, activation="gelu")(h)
    return keras.Model(ids, keras.layers.Dense(VOCAB, name="logits")(h), name="token_lm")


def token_data(n: int = 3 * BATCH):
    rng = np.random.default_rng(3)
    return rng.integers(0, VOCAB, (n, STEPS)).astype("int32"), rng.integers(0, VOCAB, (n, STEPS)).astype("int32")


def _loss():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _lowered():
    spec = tf.TensorSpec((BATCH, STEPS), tf.int32)
    return checkmate.tf2.lower(token_lm(), _loss(), spec, spec, level="auto", predictions=True, cost_model="flops")


def _pinned(graph: Graph, node: int) -> Graph:
    """``graph`` with ``node`` a step output (resident from its first computation on)."""
    nodes = [dataclasses.replace(nd, output=True) if nd.id == node else nd for nd in graph.nodes]
    return Graph(nodes, [(d, i) for i in range(graph.n) for d in graph.deps[i]], name=graph.name,
                 fixed_mem=graph.fixed_mem)


def test_the_predictions_leave_the_step_through_its_last_node_which_holds_nothing_of_its_own():
    lowered = _lowered()
    g = lowered.graph
    last = g.n - 1
    assert g.nodes[last].name == PREDICTION_LAYER
    assert g.output[last] and int(g.mem[last]) == 0
    logits = lowered.op_node[next(op for op in lowered.op_node if op.startswith("token_lm_1/logits_1/"))]
    assert not g.output[logits], "the logits' node is not a step output"
    assert logits in g.deps[last]
    # the step returns the prediction node's op
    pred_op = tf.nest.flatten(lowered.pred_structure)[0].split(":")[0]
    assert lowered.op_node[pred_op] == last
    # what that buys: the least memory any schedule needs drops by the logits held through the backward
    assert peak_floor(g)[0] < peak_floor(_pinned(g, logits))[0]


def test_a_budget_that_holding_the_logits_cannot_meet_trains_with_keras_losses_and_metrics():
    x, y = token_data()
    plain = token_lm()
    plain.compile(keras.optimizers.SGD(0.05), _loss(), metrics=["accuracy"])
    want = plain.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0).history
    trainer = checkmate.tf2.RematModel(token_lm(), budget="46%")
    trainer.compile(keras.optimizers.SGD(0.05), _loss(), metrics=["accuracy"])
    got = trainer.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0).history
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5)
    np.testing.assert_allclose(got["accuracy"], want["accuracy"], rtol=1e-6)

    step = trainer.compiled_step()
    g = step.lowered.graph
    logits = step.lowered.op_node[next(op for op in step.lowered.op_node if op.startswith("token_lm_1/logits_1/"))]
    budget = step.predicted.budget_bytes
    # no schedule that holds the logits from their first computation to the end fits this budget
    assert peak_floor(_pinned(g, logits))[0] > budget
    plan = step.schedule.plan
    assert replay_plan(g, plan).peak_memory_bytes <= budget
    assert ("free", logits) in plan
