"""Lowering Keras training steps to Graphs: node counts, edges, the forward/backward split, sizes and flags."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from checkmate.errors import InvalidArgumentError, UnsupportedOpError  # noqa: E402
from checkmate.tf2.lowered import LoweredGraph  # noqa: E402
from checkmate.tf2.lowering import lower  # noqa: E402

pytestmark = pytest.mark.tf

BATCH = 2
XENT = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def mlp(widths=(16, 12), classes=4, features=8):
    keras.utils.set_random_seed(0)
    inp = keras.Input((features,), name="x")
    h = inp
    for k, w in enumerate(widths):
        h = keras.layers.Dense(w, activation="relu", name=f"dense{k}")(h)
    out = keras.layers.Dense(classes, name="logits")(h)
    return keras.Model(inp, out, name="mlp")


def small_cnn(bn=False, dropout=False):
    keras.utils.set_random_seed(0)
    inp = keras.Input((8, 8, 3))
    h = keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="conv1")(inp)
    if bn:
        h = keras.layers.BatchNormalization(name="bn1")(h)
    h = keras.layers.MaxPooling2D(name="pool1")(h)
    h = keras.layers.Conv2D(6, 3, padding="same", activation="relu", name="conv2")(h)
    h = keras.layers.Flatten(name="flatten")(h)
    if dropout:
        h = keras.layers.Dropout(0.5, name="drop")(h)
    out = keras.layers.Dense(3, name="logits")(h)
    return keras.Model(inp, out, name="cnn")


def specs(shape, classes_dtype=tf.int32):
    return tf.TensorSpec((BATCH, *shape), tf.float32), tf.TensorSpec((BATCH,), classes_dtype)


def lower_mlp(level="op", gradient_nodes=False, **kw):
    return lower(mlp(**kw), XENT, *specs((8,)), level=level, gradient_nodes=gradient_nodes)


def _tensor_bytes(t):
    return int(t.shape.num_elements()) * t.dtype.size


def assert_contract(lg: LoweredGraph):
    """Structural promises of LoweredGraph that code generation relies on."""
    g = lg.graph
    fg = lg.function.graph
    assert len(lg.node_ops) == g.n
    seen = set()
    for nid, ops in enumerate(lg.node_ops):
        assert ops, f"node {nid} has no ops"
        for name in ops:
            assert name not in seen, f"op {name} in two nodes"
            seen.add(name)
            assert lg.op_node[name] == nid
        # ops listed in a topological (creation) order
        order = {op.name: k for k, op in enumerate(fg.get_operations())}
        assert [order[o] for o in ops] == sorted(order[o] for o in ops)
    assert set(lg.op_node) == seen
    # deps are exactly the nodes producing the inputs (data or control) of the node's ops
    for nid, ops in enumerate(lg.node_ops):
        producers = set()
        for name in ops:
            op = fg.get_operation_by_name(name)
            for src in [t.op.name for t in op.inputs] + [c.name for c in op.control_inputs]:
                if src in lg.op_node and lg.op_node[src] != nid:
                    producers.add(lg.op_node[src])
        assert set(g.deps[nid]) == producers
        assert all(d < nid for d in producers)
    # static ops depend only on static ops (except the function's output identities and NoOp)
    outputs = {t.op.name for t in lg.function.outputs}
    dead = set(lg.metadata["dead_ops"])
    for op in fg.get_operations():
        if op.name in lg.op_node or op.name in outputs or op.type == "NoOp" or op.name in dead:
            continue
        for src in [t.op.name for t in op.inputs] + [c.name for c in op.control_inputs]:
            assert src not in lg.op_node, f"static op {op.name} depends on node op {src}"
    # outputs: the loss and the gradients, in trainable-variable order
    assert len(lg.grad_tensors) == len(lg.variables)
    for t, v in zip(lg.grad_tensors, lg.variables):
        assert tuple(fg.get_tensor_by_name(t).shape) == tuple(v.shape)
    # outputs: the nodes of the loss and of the gradients (at layer level with gradient nodes, the
    # :params nodes); in the compact layer accounting only the loss node (the parameter gradients are
    # in fixed_mem, so backward nodes are not outputs because of them)
    compact = lg.level == "layer" and not lg.metadata["gradient_nodes"]
    assert lg.metadata["grad_bytes_in_fixed_mem"] == compact
    assert lg.metadata["gradient_nodes"] == (lg.level == "op" or any(":params" in nm for nm in g.names))
    flagged = {nid for nid in range(g.n) if g.output[nid]}
    step_outputs = (lg.loss_tensor,) if compact else (lg.loss_tensor, *lg.grad_tensors)
    expected = {lg.op_node[t.rsplit(":", 1)[0]] for t in step_outputs if t.rsplit(":", 1)[0] in lg.op_node}
    assert flagged == expected
    # every gradient op still belongs to a (backward) node, so it runs when that node is computed
    for t in lg.grad_tensors:
        op = t.rsplit(":", 1)[0]
        if op in lg.op_node:
            assert g.backward[lg.op_node[op]]
    assert fg.get_operation_by_name(lg.input_names[0]).type == "Placeholder"
    assert fg.get_operation_by_name(lg.label_names[0]).type == "Placeholder"


# ------------------------------------------------------------------------------------- op level
def test_op_level_mlp_nodes_edges_and_split():
    lg = lower_mlp()
    assert_contract(lg)
    g = lg.graph
    names = g.names
    # Per Dense+relu layer: MatMul, BiasAdd, Relu forward; ReluGrad, BiasAddGrad, two MatMuls backward
    # (the first layer has no gradient w.r.t. the batch, so one MatMul).
    for k in (0, 1):
        for suffix in ("MatMul", "BiasAdd", "Relu"):
            nid = next(i for i, nm in enumerate(names) if nm.endswith(f"dense{k}_1/{suffix}") or nm.endswith(f"dense{k}/{suffix}"))
            assert not g.backward[nid]
    fwd_matmuls = [i for i in g.forward_nodes if names[i].endswith("/MatMul")]
    bwd_matmuls = [i for i in g.backward_nodes if "MatMul" in names[i]]
    assert len(fwd_matmuls) == 3
    assert len(bwd_matmuls) == 5  # dW for 3 layers, dx for the 2 upper layers
    # every backward node comes after every forward node it depends on; no forward node reads a backward one
    for v in g.forward_nodes:
        assert not any(g.backward[u] for u in g.deps[v])
    # constants, shape ops and variable reads are not nodes
    fg = lg.function.graph
    for name in lg.op_node:
        assert fg.get_operation_by_name(name).type not in ("Const", "Placeholder", "ReadVariableOp", "Shape")
    # the loss node and the six gradient nodes are outputs
    assert int(g.output.sum()) == 1 + 6
    assert names[int(np.flatnonzero(g.output)[0])].endswith("div_no_nan")
    # no stateful op in a plain MLP
    assert g.recomputable.all()


def test_op_level_mem_is_static_tensor_size():
    lg = lower_mlp()
    fg = lg.function.graph
    for nid, ops in enumerate(lg.node_ops):
        (name,) = ops
        op = fg.get_operation_by_name(name)
        assert lg.graph.mem[nid] == sum(_tensor_bytes(t) for t in op.outputs)
    matmul = lg.op_node[next(n for n in lg.op_node if n.endswith("dense0_1/MatMul") or n.endswith("dense0/MatMul"))]
    assert lg.graph.mem[matmul] == BATCH * 16 * 4
    # fixed memory: parameters and the batch
    params = sum(int(np.prod(v.shape)) * 4 for v in lg.variables)
    assert lg.graph.fixed_mem == params + BATCH * 8 * 4 + BATCH * 4


def test_multi_output_op_is_one_node_sized_by_all_outputs():
    lg = lower_mlp()
    fg = lg.function.graph
    name = next(n for n in lg.op_node if fg.get_operation_by_name(n).type == "SparseSoftmaxCrossEntropyWithLogits")
    op = fg.get_operation_by_name(name)
    assert len(op.outputs) == 2
    nid = lg.op_node[name]
    assert lg.node_ops[nid] == (name,)
    assert lg.graph.mem[nid] == BATCH * 4 + BATCH * 4 * 4  # per-example loss + backprop (logits' shape)
    # the backward consumer of the second output depends on this node
    users = [u for u in lg.graph.users[nid] if lg.graph.backward[u]]
    assert users


def test_op_level_cnn():
    lg = lower(small_cnn(), XENT, *specs((8, 8, 3)), level="op")
    assert_contract(lg)
    fg = lg.function.graph
    types = [fg.get_operation_by_name(ops[0]).type for ops in lg.node_ops]
    assert types.count("Conv2D") == 2
    assert types.count("Conv2DBackpropFilter") == 2
    assert types.count("Conv2DBackpropInput") == 1  # the gradient w.r.t. the batch is dead
    dead = [fg.get_operation_by_name(n).type for n in lg.metadata["dead_ops"]]
    assert dead.count("Conv2DBackpropInput") == 1
    assert types.count("MaxPool") == 1 and types.count("MaxPoolGrad") == 1
    conv1 = types.index("Conv2D")
    assert lg.graph.mem[conv1] == BATCH * 8 * 8 * 4 * 4
    for nid in range(lg.graph.n):
        is_grad_op = lg.node_ops[nid][0].startswith("gradient_tape/") or types[nid] in ("AddN",)
        if is_grad_op:
            assert lg.graph.backward[nid]
    assert lg.graph.recomputable.all()


def test_function_computes_loss_and_gradients():
    model = mlp()
    lg = lower(model, XENT, *specs((8,)), level="op")
    x = tf.random.stateless_normal((BATCH, 8), seed=(1, 2))
    y = tf.constant([1, 3], tf.int32)
    loss, *grads = lg.function(x, y)
    with tf.GradientTape() as tape:
        ref = XENT(y, model(x, training=True))
    ref_grads = tape.gradient(ref, model.trainable_variables)
    np.testing.assert_allclose(loss.numpy(), ref.numpy(), rtol=1e-6)
    for a, b in zip(grads, ref_grads):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-7)


def test_bad_specs_and_level():
    with pytest.raises(InvalidArgumentError, match="fixed shape"):
        lower(mlp(), XENT, tf.TensorSpec((None, 8)), tf.TensorSpec((None,), tf.int32))
    with pytest.raises(InvalidArgumentError, match="level"):
        lower(mlp(), XENT, *specs((8,)), level="block")


# ------------------------------------------------------------------------------------- layer level
def test_compact_layer_level_mlp_one_forward_and_backward_node_per_layer():
    lg = lower_mlp(level="layer")
    assert_contract(lg)
    g = lg.graph
    assert g.names == ("dense0", "dense1", "logits", "loss",
                       "loss_grad", "logits_grad", "dense1_grad", "dense0_grad")
    assert [bool(b) for b in g.backward] == [False] * 4 + [True] * 4
    edges = set(g.edges)
    # forward chain, backward chain, and each backward node reads its layer's input and output
    assert {(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (6, 7)} <= edges
    assert (1, 5) in edges and (0, 6) in edges and (1, 6) in edges and (0, 7) in edges
    # 3 + 3 chain edges, loss -> loss_grad, and the four reads of forward activations above
    assert len(edges) == 11
    # the only output is the loss: the backward nodes hold the weight gradients' ops but are not
    # outputs because of them (the gradients are accounted in fixed_mem)
    assert [g.names[i] for i in np.flatnonzero(g.output)] == ["loss"]
    fg = lg.function.graph
    for nid in g.backward_nodes:
        grad_ops = [o for o in lg.node_ops[nid] if any(t.startswith(o + ":") for t in lg.grad_tensors)]
        if g.names[nid] in ("logits_grad", "dense1_grad", "dense0_grad"):
            assert grad_ops, g.names[nid]
            assert {fg.get_operation_by_name(o).type for o in grad_ops} <= {"MatMul", "BiasAddGrad", "AddN"}
        assert not g.output[nid]
    # every op of a layer node carries the layer's name scope
    for nid, ops in enumerate(lg.node_ops):
        layer = g.names[nid].removesuffix("_grad")
        if layer != "loss":
            assert all(f"{layer}_1/" in op or f"/{layer}/" in op or op.startswith("AddN") for op in ops), ops


def test_compact_layer_level_mem_counts_tensors_used_outside_the_node():
    lg = lower_mlp(level="layer")
    g = lg.graph
    # dense0's MatMul and BiasAdd are consumed inside the layer; only the ReLU output leaves it
    assert g.mem[0] == BATCH * 16 * 4
    assert lg.metadata["workspace_bytes"][0] == BATCH * 16 * 4  # MatMul+BiasAdd live together once
    # a backward node's value is the activation gradient it passes down, not the weight gradients
    assert g.mem[5] == BATCH * 12 * 4  # logits_grad -> dense1_grad
    assert g.mem[6] == BATCH * 16 * 4  # dense1_grad -> dense0_grad
    # dense0's backward produces only the two weight gradients (in fixed_mem); the gradient w.r.t. the
    # batch is dead, so its value is empty, and its workspace is the ReluGrad it consumes inside
    assert g.mem[7] == 0
    assert lg.metadata["workspace_bytes"][7] == BATCH * 16 * 4
    # summed over nodes, layer mem never exceeds the op-level total
    assert g.mem.sum() < lower_mlp(level="op").graph.mem.sum()


def _variable_bytes(variables):
    return sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in variables)


# An MLP, and a CNN with BatchNorm statistics and a dropout seed among its variables.
PARAMETER_MODELS = [
    (lambda: mlp(), (8,), tf.int32),
    (lambda: small_cnn(bn=True, dropout=True), (8, 8, 3), tf.int32),
]


@pytest.mark.parametrize("build,shape,classes_dtype", PARAMETER_MODELS)
def test_compact_layer_level_fixed_mem_holds_parameters_batch_and_gradients(build, shape, classes_dtype):
    model = build()
    xs, ys = specs(shape, classes_dtype)
    lg = lower(model, XENT, xs, ys, level="layer")
    # every variable (BN statistics and the dropout seed included), the batch, and one gradient per
    # trainable variable, computed from the model and the specs
    variables = _variable_bytes(model.variables)
    batch = int(np.prod(xs.shape)) * xs.dtype.size + int(np.prod(ys.shape)) * ys.dtype.size
    grads = _variable_bytes(model.trainable_variables)
    assert grads > 0 and len(model.variables) >= len(model.trainable_variables)
    assert lg.graph.fixed_mem == variables + batch + grads
    assert lg.metadata["grad_bytes"] == grads and lg.metadata["grad_bytes_in_fixed_mem"]
    assert not lg.metadata["gradient_nodes"]
    assert lg.metadata["parameter_and_batch_bytes"] == variables + batch
    # the op level keeps the gradients in their own output nodes, not in fixed_mem
    op = lower(model, XENT, xs, ys, level="op")
    assert op.graph.fixed_mem == variables + batch
    assert op.metadata["grad_bytes"] == grads and not op.metadata["grad_bytes_in_fixed_mem"]
    # gradient_nodes has no effect at op level: its accounting is already exact
    op_split = lower(model, XENT, xs, ys, level="op", gradient_nodes=True)
    assert op_split.graph.names == op.graph.names and op_split.graph.fixed_mem == op.graph.fixed_mem
    assert np.array_equal(op_split.graph.mem, op.graph.mem) and op_split.graph.edges == op.graph.edges
    grad_nodes = {op.op_node[t.rsplit(":", 1)[0]] for t in op.grad_tensors}
    assert all(op.graph.output[n] for n in grad_nodes)
    # both levels name the same step outputs
    assert lg.grad_tensors == op.grad_tensors


def _checkpoint_all_peak_by_hand(g):
    """(peak, memory while the last node runs) of checkpoint-all, counted directly: each value lives
    from its computation to its last use, outputs to the end."""
    last = [max([u for u in g.users[i]], default=i) for i in range(g.n)]
    live = [sum(int(g.mem[i]) for i in range(t) if last[i] >= t or g.output[i]) + int(g.mem[t])
            for t in range(g.n)]
    return g.fixed_mem + max(live), g.fixed_mem + live[-1]


def test_compact_layer_level_checkpoint_all_peak_matches_liveness():
    """The simulator's checkpoint-all peak on a layer graph is fixed_mem plus the largest set of live
    values: each value lives from its computation to its last use, and only the loss to the end."""
    import checkmate
    from checkmate.simulate import simulate

    lg = lower(small_cnn(bn=True), XENT, *specs((8, 8, 3)), level="layer")
    g = lg.graph
    assert g.mem[g.names.index("conv1_grad")] == 0  # only weight gradients; dx of the batch is dead
    expected, final = _checkpoint_all_peak_by_hand(g)
    result = checkmate.solve(g, 10 * expected, strategy="checkpoint_all")
    assert simulate(g, result.schedule).peak_memory_bytes == expected
    # the peak is not at the end of the backward pass, where an output flag on backward nodes would
    # hold every activation gradient: the last node (the first layer's backward) runs with its inputs only
    assert final < expected


def test_compact_layer_level_cnn_contract_and_split():
    lg = lower(small_cnn(), XENT, *specs((8, 8, 3)), level="layer")
    assert_contract(lg)
    g = lg.graph
    forward = [g.names[i] for i in g.forward_nodes]
    assert forward == ["conv1", "pool1", "conv2", "flatten", "logits", "loss"]
    backward = [g.names[i] for i in g.backward_nodes]
    assert backward == ["loss_grad", "logits_grad", "flatten_grad", "conv2_grad", "pool1_grad", "conv1_grad"]


def test_gradient_nodes_mlp_one_forward_node_per_layer_and_gradient_nodes():
    lg = lower_mlp(level="layer", gradient_nodes=True)
    assert_contract(lg)
    g = lg.graph
    # each backward layer: the part the weight gradients need (dense1's ReluGrad), the weight
    # gradients (an output node), and the rest (the gradient w.r.t. the layer's input)
    assert g.names == ("dense0", "dense1", "logits", "loss",
                       "loss_grad", "logits_grad:params", "logits_grad",
                       "dense1_grad", "dense1_grad:params", "dense1_grad:2", "dense0_grad:params")
    assert [bool(b) for b in g.backward] == [False] * 4 + [True] * 7
    assert set(g.edges) == {
        (0, 1), (1, 2), (2, 3), (3, 4),          # forward chain, loss -> loss_grad
        (4, 5), (4, 6), (6, 7), (7, 8), (7, 9), (9, 10),   # backward: dy feeds :params and the rest
        (1, 5), (1, 7), (0, 8), (0, 10),         # reads of forward activations (layer inputs, ReLU outputs)
    }
    # outputs: the loss and the three gradient nodes, which are computed exactly once
    params = [i for i in range(g.n) if g.names[i].endswith(":params")]
    assert [g.names[i] for i in np.flatnonzero(g.output)] == ["loss"] + [g.names[i] for i in params]
    assert not any(g.recomputable[i] for i in params)
    fg = lg.function.graph
    grad_ops = {t.rsplit(":", 1)[0] for t in lg.grad_tensors}
    for nid in g.backward_nodes:
        here = grad_ops.intersection(lg.node_ops[nid])
        assert bool(here) == (nid in params), g.names[nid]
        assert {fg.get_operation_by_name(o).type for o in here} <= {"MatMul", "BiasAddGrad", "AddN"}
    # every op of a layer node carries the layer's name scope
    for nid, ops in enumerate(lg.node_ops):
        layer = g.names[nid].split(":")[0].removesuffix("_grad")
        if layer != "loss":
            assert all(f"{layer}_1/" in op or f"/{layer}/" in op or op.startswith("AddN") for op in ops), ops


def test_gradient_nodes_mem_counts_tensors_used_outside_the_node():
    lg = lower_mlp(level="layer", gradient_nodes=True)
    g = lg.graph
    n = g.names.index
    # dense0's MatMul and BiasAdd are consumed inside the layer; only the ReLU output leaves it
    assert g.mem[0] == BATCH * 16 * 4
    assert lg.metadata["workspace_bytes"][0] == BATCH * 16 * 4  # MatMul+BiasAdd live together once
    # a gradient node's value is the weight and bias gradients
    assert g.mem[n("logits_grad:params")] == (12 * 4 + 4) * 4
    assert g.mem[n("dense1_grad:params")] == (16 * 12 + 12) * 4
    assert g.mem[n("dense0_grad:params")] == (8 * 16 + 16) * 4
    # the other backward nodes pass on activation gradients
    assert g.mem[n("logits_grad")] == BATCH * 12 * 4     # -> dense1_grad
    assert g.mem[n("dense1_grad")] == BATCH * 12 * 4     # ReluGrad -> :params and :2
    assert g.mem[n("dense1_grad:2")] == BATCH * 16 * 4   # -> dense0_grad:params
    # dense0's gradient w.r.t. the batch is dead: its whole backward feeds only the weight gradients,
    # and its ReluGrad is workspace inside the gradient node
    assert lg.metadata["workspace_bytes"][n("dense0_grad:params")] == BATCH * 16 * 4
    # summed over nodes, layer mem never exceeds the op-level total
    assert g.mem.sum() < lower_mlp(level="op").graph.mem.sum()


@pytest.mark.parametrize("gradient_nodes", [False, True])
def test_views_share_their_buffer(gradient_nodes):
    """Dense layers on 3-D input go through Reshape (Tensordot), which TF runs as a view of its input:
    a view of the batch costs nothing, and a node passing on a tensor and a view of it holds one
    buffer."""
    from checkmate.tf2 import zoo

    seq, dim, ff = 16, 32, 64
    keras.utils.set_random_seed(0)
    inp = keras.Input((seq, dim))
    h = keras.layers.Dense(ff, activation="relu", name="first")(inp)
    out = keras.layers.Dense(3, name="logits")(keras.layers.GlobalAveragePooling1D(name="pool")(h))
    lg = lower(keras.Model(inp, out), XENT, *specs((seq, dim)), level="layer", gradient_nodes=gradient_nodes)
    g, fn_graph = lg.graph, lg.function.graph
    first = g.names.index("first")
    assert any(op.type == "Reshape" and op.inputs[0].op.type == "Placeholder"
               for op in map(fn_graph.get_operation_by_name, lg.node_ops[first]))
    # its value is its output only (BATCH x seq x ff), not the reshaped batch as well
    assert g.mem[first] == BATCH * seq * ff * 4

    if not gradient_nodes:
        return   # in the compact graph the Reshape below feeds the weight gradient inside the node
    built = zoo.build_model("transformer", BATCH, (seq, dim))
    lg = lower(built.model, built.loss, built.input_spec, built.label_spec, level="layer", gradient_nodes=True)
    g, fn_graph = lg.graph, lg.function.graph
    ops = {name: fn_graph.get_operation_by_name(name) for names in lg.node_ops for name in names}
    # its backward passes on the gradient sum and a Reshape of it: one buffer of BATCH x seq x ff
    node = g.names.index("ff1_grad")
    members = set(lg.node_ops[node])
    passed = [t for o in lg.node_ops[node] for t in ops[o].outputs
              if any(c.name not in members for c in t.consumers())]
    passed_names = {t.name for t in passed}
    views = [t for t in passed if t.op.type == "Reshape" and t.op.inputs[0].name in passed_names]
    assert views and all(t.shape.num_elements() == BATCH * seq * ff for t in views)
    sizes = sum(t.shape.num_elements() * t.dtype.size for t in passed)
    assert g.mem[node] == sizes - sum(t.shape.num_elements() * t.dtype.size for t in views)


@pytest.mark.parametrize("build,shape,classes_dtype", PARAMETER_MODELS)
def test_gradient_nodes_fixed_mem_holds_parameters_and_batch_gradients_are_outputs(build, shape, classes_dtype):
    model = build()
    xs, ys = specs(shape, classes_dtype)
    # every variable (BN statistics and the dropout seed included) and the batch, computed from the
    # model and the specs; the gradients (one per trainable variable) are the values of output nodes
    variables = _variable_bytes(model.variables)
    batch = int(np.prod(xs.shape)) * xs.dtype.size + int(np.prod(ys.shape)) * ys.dtype.size
    grads = _variable_bytes(model.trainable_variables)
    assert grads > 0 and len(model.variables) >= len(model.trainable_variables)
    lowered = [lower(model, XENT, xs, ys, level=level, gradient_nodes=True) for level in ("layer", "op")]
    for lg in lowered:
        g = lg.graph
        assert g.fixed_mem == variables + batch, lg.level
        assert lg.metadata["grad_bytes"] == grads
        assert lg.metadata["parameter_and_batch_bytes"] == variables + batch
        assert lg.metadata["gradient_nodes"] and not lg.metadata["grad_bytes_in_fixed_mem"]
        grad_nodes = {lg.op_node[t.rsplit(":", 1)[0]] for t in lg.grad_tensors}
        assert all(g.output[n] and g.backward[n] for n in grad_nodes)
        if lg.level == "layer":  # a :params node runs once
            assert not any(g.recomputable[n] for n in grad_nodes)
        # the output nodes hold the loss and every gradient byte
        loss_node = lg.op_node[lg.loss_tensor.rsplit(":", 1)[0]]
        assert int(g.mem[sorted(grad_nodes)].sum()) >= grads
        assert set(np.flatnonzero(g.output)) == grad_nodes | {loss_node}
    # both levels name the same step outputs
    assert lowered[0].grad_tensors == lowered[1].grad_tensors


def test_gradient_nodes_checkpoint_all_peak_matches_liveness():
    """The simulator's checkpoint-all peak on a layer graph is fixed_mem plus the largest set of live
    values: each value lives from its computation to its last use, the outputs (loss, gradients) to
    the end."""
    import checkmate
    from checkmate.simulate import simulate

    lg = lower(small_cnn(bn=True), XENT, *specs((8, 8, 3)), level="layer", gradient_nodes=True)
    g = lg.graph
    # conv1's backward is only its weight gradients (3*3*3*4 + 4 floats): dx of the batch is dead
    assert "conv1_grad" not in g.names and g.mem[g.names.index("conv1_grad:params")] == (3 * 3 * 3 * 4 + 4) * 4
    expected, final = _checkpoint_all_peak_by_hand(g)
    result = checkmate.solve(g, 10 * expected, strategy="checkpoint_all")
    assert simulate(g, result.schedule).peak_memory_bytes == expected
    # the peak is not at the end of the backward pass: the last node (the first layer's gradients)
    # runs with its inputs and the gradients only
    assert final < expected


def test_gradient_nodes_cnn_contract_and_split():
    lg = lower(small_cnn(), XENT, *specs((8, 8, 3)), level="layer", gradient_nodes=True)
    assert_contract(lg)
    g = lg.graph
    forward = [g.names[i] for i in g.forward_nodes]
    assert forward == ["conv1", "pool1", "conv2", "flatten", "logits", "loss"]
    backward = [g.names[i] for i in g.backward_nodes]
    assert backward == ["loss_grad", "logits_grad:params", "logits_grad", "flatten_grad", "conv2_grad",
                        "conv2_grad:params", "conv2_grad:2", "pool1_grad", "conv1_grad:params"]


# ------------------------------------------------------------------------------------- recomputability
def _bn_dropout_mlp():
    keras.utils.set_random_seed(0)
    inp = keras.Input((8,))
    h = keras.layers.Dense(16, activation="relu", name="d1")(inp)
    h = keras.layers.Dropout(0.5, name="drop")(h)
    h = keras.layers.BatchNormalization(name="bn")(h)
    out = keras.layers.Dense(4, name="d2")(h)
    return keras.Model(inp, out)


def test_op_level_flags_reads_of_assigned_variables_and_assigns():
    lg = lower(_bn_dropout_mlp(), XENT, *specs((8,)), level="op")
    assert_contract(lg)
    fg = lg.function.graph
    g = lg.graph
    flagged = {lg.node_ops[i][0] for i in np.flatnonzero(~g.recomputable)}
    types = sorted(fg.get_operation_by_name(n).type for n in flagged)
    # dropout: two reads of the seed + its increment; BatchNorm: two moving-statistic reads + two updates
    assert types == ["AssignVariableOp"] * 3 + ["ReadVariableOp"] * 4
    for name in flagged:
        op = fg.get_operation_by_name(name)
        if op.type == "AssignVariableOp":
            assert g.mem[lg.op_node[name]] == 0
    # reads of the trainable weights (never assigned by the step) are static, not nodes
    kernel_reads = [op.name for op in fg.get_operations()
                    if op.type == "ReadVariableOp" and "/d1_1/" in op.name]
    assert kernel_reads and not any(n in lg.op_node for n in kernel_reads)
    # the stateless random ops that draw the dropout mask are recomputable (same seed value, same mask)
    rng = [n for n in lg.op_node if fg.get_operation_by_name(n).type == "StatelessRandomUniformV2"]
    assert rng and all(g.recomputable[lg.op_node[n]] for n in rng)


@pytest.mark.parametrize("gradient_nodes", [False, True])
def test_layer_level_bn_and_dropout_state_nodes(gradient_nodes):
    lg = lower(_bn_dropout_mlp(), XENT, *specs((8,)), level="layer", gradient_nodes=gradient_nodes)
    assert_contract(lg)
    g = lg.graph
    fg = lg.function.graph
    non_recomputable = sorted(g.names[i] for i in np.flatnonzero(~g.recomputable) if not g.names[i].endswith(":params"))
    assert non_recomputable == ["bn:state", "drop:state"]
    # the layers' activations stay recomputable
    for name in ("bn", "drop", "d1", "d2"):
        assert g.recomputable[g.names.index(name)]
    state_types = {g.names[i]: sorted(fg.get_operation_by_name(o).type for o in lg.node_ops[i])
                   for i in np.flatnonzero(~g.recomputable)}
    assert state_types["bn:state"].count("AssignVariableOp") == 2
    assert state_types["drop:state"].count("AssignVariableOp") == 1
    assert state_types["drop:state"].count("ReadVariableOp") == 2
    # the mask depends on the seed read: drop:state -> drop
    assert g.names.index("drop:state") in g.deps[g.names.index("drop")]
    # the statistics update depends on the batch moments: bn -> bn:state
    assert g.names.index("bn") in g.deps[g.names.index("bn:state")]


def test_stateful_random_op_is_not_recomputable():
    class Noise(keras.layers.Layer):
        def call(self, x):
            return x + tf.random.uniform(tf.shape(x))  # stateful RandomUniform

    inp = keras.Input((8,))
    out = keras.layers.Dense(3, name="d")(Noise(name="noise")(inp))
    lg = lower(keras.Model(inp, out), XENT, *specs((8,)), level="op")
    fg = lg.function.graph
    name = next(n for n in lg.op_node if fg.get_operation_by_name(n).type == "RandomUniform")
    assert not lg.graph.recomputable[lg.op_node[name]]


# ------------------------------------------------------------------------------------- unsupported
@tf.function
def _opaque_inner(a):
    return tf.nn.relu(a) * 2.0


class Opaque(keras.layers.Layer):
    """A layer that calls a tf.function: an opaque call in the step's graph."""

    def call(self, x):
        return x + tf.stop_gradient(_opaque_inner(x))


def test_opaque_call_is_one_node_with_a_warning_recomputable_as_its_function_only_computes():
    inp = keras.Input((8,))
    h = keras.layers.Dense(6, name="d")(inp)
    out = keras.layers.Dense(3, name="o")(Opaque(name="opq")(h))
    model = keras.Model(inp, out)
    with pytest.warns(UserWarning, match="opaque"):
        lg = lower(model, XENT, *specs((8,)), level="op")
    fg = lg.function.graph
    call = next(n for n in lg.op_node if fg.get_operation_by_name(n).type == "PartitionedCall")
    nid = lg.op_node[call]
    assert lg.node_ops[nid] == (call,)
    # relu and a product: it computes the same each time (a call holding a random draw is not
    # recomputable: tests/tf2/test_pure_calls.py)
    assert lg.graph.recomputable[nid]
    assert lg.graph.mem[nid] == BATCH * 6 * 4
    assert lg.metadata["warnings"]


def test_several_opaque_calls_give_one_warning_and_one_note_each():
    inp = keras.Input((8,))
    h = keras.layers.Dense(6, name="d")(inp)
    out = keras.layers.Dense(3, name="o")(Opaque(name="second")(Opaque(name="first")(h)))
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lg = lower(keras.Model(inp, out), XENT, *specs((8,)), level="op")
    opaque = [str(w.message) for w in caught if "opaque" in str(w.message)]
    assert len(opaque) == 1 and opaque[0].startswith("2 ops are opaque calls or loops")
    assert len([m for m in lg.metadata["warnings"] if "opaque" in m]) == 2


class UntilLarge(keras.layers.Layer):
    """A loop that stops on its data, with no bound on its trips: its gradient's accumulators have none."""

    def call(self, x):
        def more(i, h):
            return tf.reduce_mean(tf.abs(h)) < 10.0

        def step(i, h):
            return i + 1, tf.tanh(h) * 1.5 + 0.5

        return tf.while_loop(more, step, (tf.constant(0), x))[1]


def test_loop_with_unbounded_lists_is_an_error_naming_the_op():
    inp = keras.Input((3,))
    out = keras.layers.Dense(2)(UntilLarge(name="until")(keras.layers.Dense(3)(inp)))
    with pytest.raises(UnsupportedOpError, match=r"until.*while.*loop|cannot size op .*until") as refused:
        lower(keras.Model(inp, out), "mse", tf.TensorSpec((BATCH, 3)), tf.TensorSpec((BATCH, 2)), level="op")
    assert "unroll=True" in str(refused.value)


def test_an_unrolled_rnn_layer_lowers_to_its_steps():
    # what the refusal of a loop suggests: the same layer with unroll=True traces its five steps as ops
    inp = keras.Input((5, 3))
    out = keras.layers.Dense(2)(keras.layers.LSTM(4, unroll=True, name="lstm")(inp))
    lg = lower(keras.Model(inp, out), "mse", tf.TensorSpec((BATCH, 5, 3)), tf.TensorSpec((BATCH, 2)), level="op")
    assert_contract(lg)
    types = {lg.function.graph.get_operation_by_name(op).type for ops in lg.node_ops for op in ops}
    assert not types & {"While", "StatelessWhile"}
    assert sum(1 for ops in lg.node_ops for op in ops
               if lg.function.graph.get_operation_by_name(op).type == "MatMul") >= 5


@pytest.mark.parametrize("level,gradient_nodes", [("op", False), ("layer", False), ("layer", True)])
@pytest.mark.parametrize("name", ["residual_cnn", "transformer"])
def test_contract_holds_for_test_models(name, level, gradient_nodes):
    from checkmate.tf2 import zoo

    model, loss, xs, ys = zoo.build_model(name, batch_size=2, input_shape=(8, 8, 3) if name == "residual_cnn" else (4, 8))
    lg = lower(model, loss, xs, ys, level=level, gradient_nodes=gradient_nodes)
    assert_contract(lg)
    assert lg.level == level


def test_gradient_nodes_is_true_or_false():
    """Gradient nodes split the compact graph; the compact node count is reported either way."""
    model, xs_ys = small_cnn(bn=True), specs((8, 8, 3))
    compact = lower(model, XENT, *xs_ys, level="layer")
    split = lower(model, XENT, *xs_ys, level="layer", gradient_nodes=True)
    assert compact.metadata["compact_nodes"] == compact.graph.n < split.graph.n
    assert split.metadata["compact_nodes"] == compact.graph.n
    assert not compact.metadata["gradient_nodes"] and split.metadata["gradient_nodes"]
    for value in ("auto", "yes", 2):
        with pytest.raises(InvalidArgumentError, match="gradient_nodes"):
            lower(model, XENT, *xs_ys, level="layer", gradient_nodes=value)


def test_sequential_and_subclassed_models():
    keras.utils.set_random_seed(0)
    seq = keras.Sequential([keras.Input((8,)), keras.layers.Dense(5, activation="relu", name="a"),
                            keras.layers.Dense(3, name="b")])
    lg = lower(seq, XENT, *specs((8,)), level="layer")
    assert_contract(lg)
    assert lg.graph.names == ("a", "b", "loss", "loss_grad", "b_grad", "a_grad")
    lg = lower(seq, XENT, *specs((8,)), level="layer", gradient_nodes=True)
    assert_contract(lg)
    assert lg.graph.names == ("a", "b", "loss", "loss_grad", "b_grad:params", "b_grad", "a_grad:params")

    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.first = keras.layers.Dense(5, activation="relu", name="first")
            self.second = keras.layers.Dense(3, name="second")

        def call(self, x, training=False):
            return self.second(self.first(x))

    net = Net()
    net(tf.zeros((BATCH, 8)))
    lg = lower(net, XENT, *specs((8,)), level="layer")
    assert_contract(lg)
    assert lg.graph.names == ("first", "second", "loss", "loss_grad", "second_grad", "first_grad")
    lg = lower(net, XENT, *specs((8,)), level="layer", gradient_nodes=True)
    assert_contract(lg)
    assert lg.graph.names == ("first", "second", "loss", "loss_grad", "second_grad:params", "second_grad",
                              "first_grad:params")

    # models that were never called: lowering builds them (subclassed: build(shape) creates nothing)
    for fresh in (Net(), keras.Sequential([keras.layers.Dense(5, activation="relu", name="first"),
                                           keras.layers.Dense(3, name="second")])):
        assert not fresh.built
        lg = lower(fresh, XENT, *specs((8,)), level="layer")
        assert_contract(lg)
        assert lg.graph.names == ("first", "second", "loss", "loss_grad", "second_grad", "first_grad")
        assert len(lg.variables) == 4


@pytest.mark.parametrize("batch,size", [(2, 32), (32, 128)])
def test_vgg16_layer_level_rematerialization_lowers_the_peak(batch, size):
    """With the parameter gradients in fixed_mem, rematerialization lowers VGG16's layer-level peak.

    A 70% budget is out of reach at these sizes for every schedule, not only for the heuristics: at
    32x32 the weights and their gradients alone exceed it, and at 128x128 the backward node of
    block1_conv2 needs its three full-resolution inputs and its output at once (docs/design.md §3's lower
    bound, ~91% of checkpoint-all); chen_greedy reaches that bound up to the loss value.
    """
    import checkmate
    from checkmate.errors import InfeasibleBudgetError
    from checkmate.tf2 import zoo

    model, loss, xs, ys = zoo.build_model("vgg16", batch_size=batch, input_shape=(size, size, 3))
    g = lower(model, loss, xs, ys, level="layer").graph
    assert [g.names[i] for i in np.flatnonzero(g.output)] == ["loss"]
    all_peak = checkmate.solve(g, "100%", strategy="checkpoint_all").peak_memory_bytes
    sqrtn = checkmate.solve(g, "100%", strategy="chen_sqrtn").peak_memory_bytes
    assert sqrtn < all_peak
    bound = g.fixed_mem + max(int(g.mem[k]) + sum(int(g.mem[d]) for d in g.deps[k]) for k in range(g.n))
    assert 0.7 * all_peak < bound < all_peak  # no schedule fits 70% of checkpoint-all
    with pytest.raises(InfeasibleBudgetError) as info:
        checkmate.solve(g, "70%", strategy="chen_greedy")
    # chen_greedy's smallest peak is the bound (up to the loss value, held to the end)
    smallest = info.value.min_feasible_budget_bytes
    assert bound <= smallest <= bound + int(g.mem[g.names.index("loss")]) < all_peak
    greedy = checkmate.solve(g, smallest, strategy="chen_greedy")
    assert greedy.peak_memory_bytes == smallest
    if size == 128:  # activation-dominated: a sizeable saving
        assert smallest < 0.92 * all_peak


@pytest.mark.parametrize("batch,size", [(2, 32), (32, 128)])
def test_vgg16_gradient_nodes_rematerialization_lowers_the_peak(batch, size):
    """With gradient nodes, rematerialization lowers VGG16's layer-level peak when activations
    dominate (128x128).

    chen_greedy reaches docs/design.md §3's lower bound up to the outputs (loss and gradients) that are
    resident when the bounding node runs; at 128x128 the backward of block1_conv2 (three
    full-resolution inputs and its output at once) sets that bound.
    """
    import checkmate
    from checkmate.errors import InfeasibleBudgetError
    from checkmate.tf2 import zoo

    model, loss, xs, ys = zoo.build_model("vgg16", batch_size=batch, input_shape=(size, size, 3))
    g = lower(model, loss, xs, ys, level="layer", gradient_nodes=True).graph
    assert [g.names[i] for i in np.flatnonzero(g.output)] == \
        ["loss"] + [nd.name for nd in g.nodes if nd.name.endswith(":params")]
    all_peak = checkmate.solve(g, "100%", strategy="checkpoint_all").peak_memory_bytes
    sqrtn = checkmate.solve(g, "100%", strategy="chen_sqrtn").peak_memory_bytes
    # at 32x32 the weights and gradients dominate: every schedule peaks at the end of the backward
    # pass, when all gradients are resident
    assert sqrtn < all_peak if size == 128 else sqrtn <= all_peak
    bound = g.fixed_mem + max(int(g.mem[k]) + sum(int(g.mem[d]) for d in g.deps[k]) for k in range(g.n))
    assert bound < all_peak
    with pytest.raises(InfeasibleBudgetError) as info:
        checkmate.solve(g, bound - 1, strategy="chen_greedy")
    smallest = info.value.min_feasible_budget_bytes
    outputs = int(g.mem[g.output].sum())
    assert bound <= smallest <= bound + outputs and smallest <= all_peak
    greedy = checkmate.solve(g, smallest, strategy="chen_greedy")
    assert greedy.peak_memory_bytes == smallest
    if size == 128:  # activation-dominated: a sizeable saving
        assert smallest < 0.95 * all_peak  # 0.93 measured


@pytest.mark.parametrize("build", [lambda: small_cnn(bn=True, dropout=True), _bn_dropout_mlp])
def test_gradient_node_split_searches_only_between_the_groups_first_and_last_op(build, monkeypatch):
    """The split of a backward layer into its parts asks which of the layer's ops reach its gradient
    ops (and are reached from them); searching only the ops between the layer's first and last gives
    the same parts as searching the whole graph."""
    from checkmate.tf2.lowering import grouping

    model = build()
    shape = tuple(model.input.shape[1:])
    restricted = lower(model, XENT, *specs(shape), level="layer", gradient_nodes=True)
    whole = grouping._reachable

    def unrestricted(*args, within=None, **kwargs):
        return whole(*args, **kwargs)

    monkeypatch.setattr(grouping, "_reachable", unrestricted)
    full = lower(model, XENT, *specs(shape), level="layer", gradient_nodes=True)
    assert restricted.graph.names == full.graph.names
    assert restricted.node_ops == full.node_ops
    assert any(name.endswith(":params") for name in restricted.graph.names)
