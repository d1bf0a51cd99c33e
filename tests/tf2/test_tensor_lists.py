"""A ``tf.TensorArray`` written in a Python loop (KerasHub's RWKV-7 time mixing): its TensorLists are
sized by the items they hold, and a plan that recomputes through them gives plain training's gradients."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import checkmate  # noqa: E402
from checkmate.simulate import simulate  # noqa: E402
from checkmate.tf2.lowering import lower  # noqa: E402
from checkmate.tf2.lowering.ops import tensor_list_bytes  # noqa: E402
from test_codegen import assert_close_relative  # noqa: E402

pytestmark = pytest.mark.tf

BATCH, STEPS, WIDTH = 4, 6, 8
XENT = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


class Scan(keras.layers.Layer):
    """A recurrence unrolled in Python, its outputs gathered in a TensorArray, as RWKV-7 does on TF."""

    def call(self, x):
        out = tf.TensorArray(x.dtype, size=x.shape[1])
        state = tf.zeros_like(x[:, 0])
        for t in range(x.shape[1]):
            state = tf.tanh(state * 0.5 + x[:, t])
            out = out.write(t, state)
        return tf.transpose(out.stack(), [1, 0, 2])


def scan_model(depth=3, width=WIDTH):
    keras.utils.set_random_seed(0)
    inp = keras.Input((STEPS, width))
    h = inp
    for k in range(depth):
        h = keras.layers.Dense(width, activation="relu", name=f"pre{k}")(h)
    h = Scan(name="scan")(h)
    for k in range(depth):
        h = keras.layers.Dense(width, activation="relu", name=f"post{k}")(h)
    out = keras.layers.Dense(3, name="logits")(keras.layers.GlobalAveragePooling1D()(h))
    return keras.Model(inp, out)


def specs(batch=BATCH, width=WIDTH):
    return tf.TensorSpec((batch, STEPS, width)), tf.TensorSpec((batch,), tf.int64)



def assert_trains_as_keras_fit(build, x, y, budget):
    """Two models from ``build`` with the same weights: ``RematModel(model, budget).fit`` gives the
    losses Keras' own fit gives, and the replayed plan is within its budget."""
    reference, model = build(), build()
    for m in (reference, model):
        m.compile(keras.optimizers.Adam(1e-2), XENT)
    for a, b in zip(reference.variables, model.variables):
        b.assign(a)
    trainer = checkmate.tf2.RematModel(model, budget=budget)
    expected = reference.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0).history["loss"]
    got = trainer.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0).history["loss"]
    assert got == pytest.approx(expected, rel=1e-5)
    step = trainer.compiled_step()
    assert simulate(step.graph, step.schedule).peak_memory_bytes <= step.predicted.budget_bytes

def test_tensor_lists_are_sized_by_the_items_they_hold():
    lg = lower(scan_model(), XENT, *specs(), level="op")
    graph, fg = lg.graph, lg.function.graph
    item = BATCH * WIDTH * 4
    writes = sorted((op for op in fg.get_operations() if op.type == "TensorListSetItem"
                     and op.name in lg.op_node and not lg.graph.backward[lg.op_node[op.name]]),
                    key=lambda op: int(tf.get_static_value(op.inputs[1])))
    assert len(writes) == STEPS
    for k, op in enumerate(writes):
        # the list after the k-th write holds k + 1 items, counted in its node's value
        assert tensor_list_bytes(op.outputs[0]) == (k + 1) * item
        assert graph.mem[lg.op_node[op.name]] >= (k + 1) * item
    # the backward pass's list from the stacked gradient holds every slot; overwriting a slot with
    # zeros does not grow it past them
    backward = [op for op in fg.get_operations() if op.type in ("TensorListFromTensor", "TensorListSetItem")
                and op.name in lg.op_node and lg.graph.backward[lg.op_node[op.name]]]
    assert backward
    for op in backward:
        assert tensor_list_bytes(op.outputs[0]) == STEPS * item
    # a variant that is not a TensorList is not sized
    assert tensor_list_bytes(tf.constant(1.0)) is None


def test_a_plan_that_recomputes_through_the_tensor_lists_gives_the_plain_gradients():
    plain, model = scan_model(width=32), scan_model(width=32)
    for a, b in zip(plain.variables, model.variables):
        b.assign(a)
    xs, ys = specs(width=32)
    # chen_sqrtn recomputes its segments of the forward pass: writes and the stack among them
    step = checkmate.tf2.compile(model, XENT, keras.optimizers.SGD(0.1), xs, ys, budget=1 << 40,
                                 level="op", strategy="chen_sqrtn")
    graph, schedule = step.graph, step.schedule
    recomputed = {graph.names[i] for i in np.nonzero(schedule.recompute.sum(axis=0) > 1)[0]}
    assert any("TensorArrayV2Write" in name or "TensorArrayV2Stack" in name for name in recomputed), recomputed
    sim = simulate(graph, schedule)
    assert sim.valid and sim.peak_memory_bytes <= step.predicted.budget_bytes
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, STEPS, 32)).astype("float32")
    y = rng.integers(0, 3, (BATCH,))
    loss, grads = step.gradients(x, y)
    with tf.GradientTape() as tape:
        expected_loss = XENT(y, plain(x, training=True))
    expected = tape.gradient(expected_loss, plain.trainable_variables)
    assert float(loss) == pytest.approx(float(expected_loss), rel=1e-6)
    for g, e in zip(grads, expected):
        assert_close_relative(g, e)


class MixedScan(keras.layers.Layer):
    """A composite layer (a sublayer inside it) whose call() unrolls a long recurrence of its own ops."""

    def __init__(self, steps, **kwargs):
        super().__init__(**kwargs)
        self.steps = steps
        self.proj = keras.layers.Dense(WIDTH, name="proj")

    def call(self, x):
        h = self.proj(x)
        out = tf.TensorArray(h.dtype, size=self.steps)
        state = tf.zeros_like(h[:, 0])
        for t in range(self.steps):
            state = tf.tanh(state * 0.5 + h[:, t % h.shape[1]]) * 1.5
            out = out.write(t, state)
        return tf.reduce_mean(out.stack(), axis=0)


def test_a_composite_layer_with_thousands_of_its_own_ops_gets_runs_of_them():
    from checkmate.tf2.lowering.grouping import COMPOSITE_OWN_NODES

    steps = 150             # about 6 ops each: 900 ops of the layer's own
    keras.utils.set_random_seed(0)
    inp = keras.Input((STEPS, WIDTH))
    out = keras.layers.Dense(3, name="logits")(MixedScan(steps, name="mixed")(inp))
    model = keras.Model(inp, out)
    lg = lower(model, XENT, *specs(), level="auto")
    own = [name for name in lg.graph.names if name.startswith("mixed/") and not name.startswith("mixed/proj")
           and not lg.graph.backward[lg.graph.names.index(name)]]
    assert 10 < len(own) <= COMPOSITE_OWN_NODES + 2
    assert any("+" in name for name in own)          # runs of several ops, named by their first
    assert lg.graph.n < 3 * COMPOSITE_OWN_NODES + 50
    # the runs are in creation order: each reads only runs before it (the graph is acyclic and valid)
    step = checkmate.tf2.compile(model, XENT, keras.optimizers.SGD(0.1), *specs(), budget=1 << 40,
                                 strategy="chen_sqrtn")
    assert step.schedule.recompute_count > 0
    x = np.random.default_rng(2).standard_normal((BATCH, STEPS, WIDTH)).astype("float32")
    y = np.array([0, 1, 2, 0])
    loss, grads = step.gradients(x, y)
    expected_loss, expected = step.plain_gradients(x, y)
    assert float(loss) == pytest.approx(float(expected_loss), rel=1e-6)
    for g, e in zip(grads, expected):
        assert_close_relative(g, e)


def test_a_large_workspace_node_is_split_into_at_most_split_max_parts_runs_in_creation_order(monkeypatch):
    from checkmate.tf2.lowering import grouping

    # the runs of interleaved parts: cut in creation order where a part starts, about limit of them
    assert grouping._runs([[0, 1], [2, 3], [4, 5], [6, 7]], limit=2) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # interleaved chains are never cut inside the span where they all started
    parts = [[0, 4, 8], [1, 5], [2, 6, 9], [3, 7]]
    assert grouping._runs(parts, limit=2) == [list(range(10))]
    assert grouping._runs(parts, limit=4) == parts

    def lowered():
        keras.utils.set_random_seed(0)
        inp = keras.Input((STEPS, WIDTH))
        out = keras.layers.Dense(3, name="logits")(MixedScan(150, name="mixed")(inp))
        return lower(keras.Model(inp, out), XENT, *specs(), level="auto", gradient_nodes=True)

    capped = lowered()
    assert capped.metadata["split_workspace_nodes"]
    # the composite splits fill the graph up to their limit, no further
    assert capped.graph.n <= grouping.AUTO_OP_NODE_LIMIT + 10
    monkeypatch.setattr(grouping, "SPLIT_MAX_PARTS", 10 ** 6)
    # one part per chain of the unrolled recurrence's backward node: 840 nodes
    assert lowered().graph.n > grouping.AUTO_OP_NODE_LIMIT + 100


class MapRows(keras.layers.Layer):
    """``keras.ops.map`` over the batch (KerasHub's D-FINE query generator): TF runs it as a ``While``
    loop of static trip count that carries TensorLists, and adds accumulators to it for the gradient."""

    def call(self, x):
        return keras.ops.map(lambda row: tf.tanh(row) * 2.0, x)


def map_model(width=WIDTH):
    keras.utils.set_random_seed(0)
    inp = keras.Input((STEPS, width))
    h = keras.layers.Dense(width, activation="relu", name="pre")(inp)
    h = MapRows(name="rows")(h)
    h = keras.layers.Dense(width, activation="relu", name="post")(h)
    return keras.Model(inp, keras.layers.Dense(3, name="logits")(keras.layers.GlobalAveragePooling1D()(h)))


def test_the_lists_a_loop_carries_are_sized_at_their_capacity():
    lg = lower(map_model(), XENT, *specs(), level="op")
    fg = lg.function.graph
    loops = [op for op in fg.get_operations() if op.type in ("While", "StatelessWhile")]
    assert len(loops) == 2                           # the map and its gradient
    row = STEPS * WIDTH * 4
    for op in loops:
        for t in op.outputs:
            if t.dtype == tf.variant:
                # every list leaves the loop at most full: slots (the batch) times an item's bytes
                size = tensor_list_bytes(t)
                assert size is not None and size <= BATCH * row, (t.name, size)
    # the map's results: one row per slot
    stacked = [op for op in fg.get_operations() if op.type == "TensorListStack"
               and op.inputs[0].op in loops and op.name in lg.op_node]
    assert stacked and all(tensor_list_bytes(op.inputs[0]) == BATCH * row for op in stacked)
    # each loop is one node holding its lists
    for op in loops:
        assert lg.graph.mem[lg.op_node[op.name]] >= BATCH * row


@pytest.mark.parametrize("build,budget", [(scan_model, "80% activations"), (map_model, "90% activations")],
                         ids=["tensor_array", "map_over_the_batch"])
def test_remat_model_trains_a_model_with_lists_as_keras_fit_does(build, budget):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3 * BATCH, STEPS, 32)).astype("float32")
    y = rng.integers(0, 3, (3 * BATCH,))
    assert_trains_as_keras_fit(lambda: build(width=32), x, y, budget)


class Branch(keras.layers.Layer):
    """A data-dependent ``keras.ops.cond`` whose branches differ, one mapping over the batch (D-FINE's
    loss matches boxes so): differentiated, TF returns each branch's intermediates from the ``If`` op
    as optionals, the map's lists among them."""

    def call(self, x):
        return keras.ops.cond(keras.ops.mean(x) > 0.0,
                              lambda: keras.ops.tanh(x) * keras.ops.sigmoid(x),
                              lambda: keras.ops.map(lambda row: keras.ops.sin(row) * row, x))


def branch_model(width=WIDTH):
    keras.utils.set_random_seed(0)
    inp = keras.Input((STEPS, width))
    h = keras.layers.Dense(width, name="pre")(inp)
    h = Branch(name="branch")(h)
    return keras.Model(inp, keras.layers.Dense(3, name="logits")(keras.layers.GlobalAveragePooling1D()(h)))


def test_the_optionals_a_cond_returns_for_its_gradient_are_sized_and_train_as_keras_fit():
    lg = lower(branch_model(), XENT, *specs(), level="op")
    fg = lg.function.graph
    branches = [op for op in fg.get_operations() if op.type in ("If", "StatelessIf") and op.name in lg.op_node]
    optionals = [t for op in branches for t in op.outputs if t.dtype == tf.variant]
    assert optionals
    item = BATCH * STEPS * WIDTH * 4
    for t in optionals:
        size = tensor_list_bytes(t)
        # an intermediate of either branch: at most a few activations' worth (the map's lists included)
        assert size is not None and size <= 4 * item, (t.name, size)
    assert max(tensor_list_bytes(t) for t in optionals) >= item // STEPS

    rng = np.random.default_rng(4)
    x = rng.standard_normal((4 * BATCH, STEPS, 32)).astype("float32")
    x[BATCH:2 * BATCH] -= 3.0           # the second batch takes the other branch
    y = rng.integers(0, 3, (4 * BATCH,))
    # the cond is one node that cannot be recomputed, which holds the step near checkpoint-all's peak
    assert_trains_as_keras_fit(lambda: branch_model(width=32), x, y, "100%")


def rnn_model(kind: str, units: int = 16, steps: int = 7):
    keras.utils.set_random_seed(0)
    inp = keras.Input((steps,), dtype="int32")
    h = keras.layers.Embedding(50, 8, name="embed")(inp)
    h = getattr(keras.layers, kind)(units, return_sequences=True, name="first")(h)
    h = getattr(keras.layers, kind)(units, name="second")(h)
    return keras.Model(inp, keras.layers.Dense(3, name="logits")(h))


def test_an_rnn_layers_loop_is_sized_by_what_each_trip_keeps():
    """A Keras LSTM (not unrolled) runs a ``While`` loop that TF gives accumulators for its gradient: one
    item a trip of each cell value, and of each kernel read (which shares the kernel's buffer: no
    bytes); the gradient loop pops them all. The loop's lists are sized so."""
    steps, units = 7, 16
    lg = lower(rnn_model("LSTM", units, steps), XENT, tf.TensorSpec((BATCH, steps), tf.int32),
               tf.TensorSpec((BATCH,), tf.int32), level="op")
    fg = lg.function.graph
    loops = [op for op in fg.get_operations() if op.type in ("While", "StatelessWhile")]
    forward = [op for op in loops if "_grad" not in op.name]
    backward = [op for op in loops if "_grad" in op.name]
    assert len(forward) == 2 and len(backward) == 2
    state = BATCH * units * 4
    for op in forward:
        sizes = [tensor_list_bytes(t) for t in op.outputs if t.dtype == tf.variant]
        assert all(size is not None for size in sizes)
        # the cell's values (gates, states), one a trip: multiples of steps * state; kernel reads add none
        cell = [size for size in sizes if size and size % (steps * state) == 0]
        assert len(cell) >= 4, sizes
        assert sum(sizes) < 16 * steps * state, sizes
    for op in backward:
        # every accumulator it reads is popped to empty by the end
        popped = [t for t in op.outputs if t.dtype == tf.variant and op.inputs[t.value_index].op in forward]
        assert popped and all(tensor_list_bytes(t) == 0 for t in popped)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_remat_model_trains_rnn_layers_as_keras_fit_does(kind):
    rng = np.random.default_rng(5)
    x = rng.integers(0, 50, (3 * BATCH, 7)).astype("int32")
    y = rng.integers(0, 3, (3 * BATCH,))
    assert_trains_as_keras_fit(lambda: rnn_model(kind), x, y, "100%")
