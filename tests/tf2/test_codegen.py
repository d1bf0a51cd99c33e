"""Code generation: the rematerializing step computes what the plain step computes, runs exactly the
schedule's op copies (after Grappler and CSE), and leaves TF's global settings as it found them.

The three models (an MLP, a residual CNN with BatchNorm and Dropout, a U-Net-like network) are sized so
that their activations are powers of two of at least 256 KiB: TF's default CPU allocator only counts
allocations from 256 KiB up (see checkmate.tf2.memory), and the memory tests in test_compile.py reuse
them.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from checkmate.errors import InvalidGraphError, InvalidScheduleError  # noqa: E402
from checkmate.graph import Graph, Node  # noqa: E402
from checkmate.schedule import Schedule  # noqa: E402
from checkmate.solvers import checkpoint_all_peak, solve  # noqa: E402
from checkmate.solvers.baselines import checkpoint_all_schedule  # noqa: E402
from checkmate.tf2 import _compat  # noqa: E402
from checkmate.tf2.codegen import _DONE_SUFFIX as DONE_SUFFIX  # noqa: E402
from checkmate.tf2.codegen import _GATE_SUFFIX as GATE_SUFFIX  # noqa: E402
from checkmate.tf2.codegen import generate, partial_anchors, partial_waits, rewrite_graph_def  # noqa: E402
from checkmate.tf2.lowering import lower  # noqa: E402
from checkmate.tf2.memory import measure_peak_memory  # noqa: E402
from checkmate.tf2.step import predicted_step_peak  # noqa: E402
from isolation import ran_in_fresh_process  # noqa: E402

pytestmark = pytest.mark.tf

XENT = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


# ------------------------------------------------------------------------------------------ models
def mlp_model(batch=1024, width=256, depth=16, seed=0):
    """Dense(256, relu) x depth, Dropout, logits: 1 MiB activations, 256 KiB weights."""
    keras.utils.set_random_seed(seed)
    inp = keras.Input((width,), name="features")
    x = inp
    for k in range(depth):
        x = keras.layers.Dense(width, activation="relu", name=f"dense{k}")(x)
    x = keras.layers.Dropout(0.2, name="dropout")(x)
    out = keras.layers.Dense(10, name="logits")(x)
    return (keras.Model(inp, out, name="mlp"), XENT, tf.TensorSpec((batch, width)),
            tf.TensorSpec((batch,), tf.int32))


def residual_cnn_model(batch=8, size=32, filters=16, blocks=4, seed=0):
    """Conv-BN stem, residual blocks (conv, conv, BatchNorm, add), Dropout head: 512 KiB activations."""
    keras.utils.set_random_seed(seed)
    layers = keras.layers
    inp = keras.Input((size, size, 3), name="image")
    x = layers.Conv2D(filters, 3, padding="same", name="stem")(inp)
    x = layers.BatchNormalization(name="stem_bn")(x)
    x = layers.Activation("relu", name="stem_relu")(x)
    for b in range(blocks):
        y = layers.Conv2D(filters, 3, padding="same", activation="relu", name=f"block{b}_conv1")(x)
        y = layers.Conv2D(filters, 3, padding="same", name=f"block{b}_conv2")(y)
        y = layers.BatchNormalization(name=f"block{b}_bn")(y)
        x = layers.Add(name=f"block{b}_add")([x, y])
        x = layers.Activation("relu", name=f"block{b}_out")(x)
    x = layers.GlobalAveragePooling2D(name="pool")(x)
    x = layers.Dropout(0.25, name="dropout")(x)
    out = layers.Dense(10, name="logits")(x)
    return (keras.Model(inp, out, name="residual_cnn"), XENT, tf.TensorSpec((batch, size, size, 3)),
            tf.TensorSpec((batch,), tf.int32))


def unet_model(batch=4, size=64, base=16, depth=2, convs=3, seed=0):
    """Encoder/decoder with skip concatenations; per-pixel logits."""
    keras.utils.set_random_seed(seed)
    layers = keras.layers
    inp = keras.Input((size, size, 3), name="image")
    x = inp
    skips = []
    for d in range(depth):
        for c in range(convs):
            x = layers.Conv2D(base * 2 ** d, 3, padding="same", activation="relu", name=f"down{d}_conv{c}")(x)
        skips.append(x)
        x = layers.MaxPooling2D(name=f"down{d}_pool")(x)
    x = layers.Conv2D(base * 2 ** depth, 3, padding="same", activation="relu", name="bottom")(x)
    for d in reversed(range(depth)):
        x = layers.Conv2DTranspose(base * 2 ** d, 2, strides=2, name=f"up{d}_upconv")(x)
        x = layers.Concatenate(name=f"up{d}_concat")([skips[d], x])
        for c in range(convs):
            x = layers.Conv2D(base * 2 ** d, 3, padding="same", activation="relu", name=f"up{d}_conv{c}")(x)
    out = layers.Conv2D(2, 1, name="logits")(x)
    return (keras.Model(inp, out, name="unet_like"), XENT, tf.TensorSpec((batch, size, size, 3)),
            tf.TensorSpec((batch, size, size), tf.int32))


MODELS = {"mlp": mlp_model, "residual_cnn": residual_cnn_model, "unet": unet_model}
# A budget-aware strategy that fits 50% of the checkpoint-all peak of each model quickly.
STRATEGY = {"mlp": "checkmate_milp", "residual_cnn": "checkmate_lp_rounding", "unet": "checkmate_lp_rounding"}
SOLVE_OPTIONS = {"time_limit_s": 10}


def batch_for(input_spec, label_spec, classes, seed=0):
    rng = np.random.default_rng(seed)
    x = tf.constant(rng.standard_normal(input_spec.shape.as_list()), input_spec.dtype)
    y = tf.constant(rng.integers(0, classes, size=label_spec.shape.as_list()), label_spec.dtype)
    return x, y


def state_variables(model):
    return list(model.non_trainable_variables)


def run_from_same_state(model, fns, x, y):
    """Run each fn from the same BatchNorm statistics and dropout seed; return results and the state
    after each run."""
    state = state_variables(model)
    start = [v.numpy() for v in state]
    results, after = [], []
    for fn in fns:
        for v, value in zip(state, start):
            v.assign(value)
        results.append(fn(x, y))
        after.append([v.numpy() for v in state])
    for v, value in zip(state, start):
        v.assign(value)
    return results, after


def assert_close_relative(actual, expected, rel=1e-5):
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    scale = max(1.0, float(np.max(np.abs(expected)))) if expected.size else 1.0
    assert float(np.max(np.abs(actual - expected), initial=0.0)) <= rel * scale


@pytest.fixture(scope="module", params=sorted(MODELS))
def case(request):
    name = request.param
    model, loss, xs, ys = MODELS[name]()
    lowered = lower(model, loss, xs, ys, level="layer")
    graph = lowered.graph
    result = solve(graph, checkpoint_all_peak(graph) // 2, strategy=STRATEGY[name], **SOLVE_OPTIONS)
    x, y = batch_for(xs, ys, int(model.outputs[0].shape[-1]))
    return dataclasses.make_dataclass("Case", ["name", "model", "lowered", "schedule", "x", "y"])(
        name, model, lowered, result.schedule, x, y)


def plain(lowered):
    def run(x, y):
        out = lowered.function(x, y)
        return out[0], list(out[1:])
    return run


# ------------------------------------------------------------------------------------------ tests
def test_gradients_match_plain_step(case):
    """Issue 5a: loss and gradients of the rematerializing step equal the plain step's (dropout on)."""
    assert case.schedule.recompute_count > 0, "the test needs a schedule that recomputes"
    fn = generate(case.lowered, case.schedule)
    (got, want), (state_got, state_want) = run_from_same_state(case.model, [fn, plain(case.lowered)],
                                                               case.x, case.y)
    assert_close_relative(got[0], want[0])
    assert len(got[1]) == len(want[1]) == len(case.model.trainable_variables)
    for g, w, v in zip(got[1], want[1], case.model.trainable_variables):
        assert g.shape == v.shape
        assert_close_relative(g, w)
    # one step advances the state (dropout seed, BatchNorm statistics) exactly as the plain step does
    for a, b in zip(state_got, state_want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_dropout_mask_is_shared_by_recomputations():
    """A recomputed dropout must reuse the mask of the first computation (the seed read runs once)."""
    model, loss, xs, ys = mlp_model(batch=256, width=256, depth=3)
    lowered = lower(model, loss, xs, ys, level="op")
    graph = lowered.graph
    fwd = [i for i in graph.forward_nodes if graph.recomputable[i]]
    # keep nothing of the forward pass but what must stay: every use recomputes from the batch
    result = solve(graph, 10 * checkpoint_all_peak(graph), strategy="checkpoint_last_node")
    assert result.schedule.recompute_count > len(fwd)
    x, y = batch_for(xs, ys, 10)
    fn = generate(lowered, result.schedule)
    (got, want), _ = run_from_same_state(model, [fn, plain(lowered)], x, y)
    for g, w in zip([got[0], *got[1]], [want[0], *want[1]]):
        assert_close_relative(g, w)


def merged_copies(fn, schedule, counts):
    """Nodes some but not all of whose computations ran (alone or in a fused op): (name, executed,
    scheduled). A node none of whose copies ran was simplified away by Grappler, every copy alike (a
    Sum over an axis of size 1, a Reshape to the same shape)."""
    scheduled = schedule.recompute.sum(axis=0)
    return [(fn.lowered.graph.names[i], c, int(n)) for i, (c, n) in enumerate(zip(counts, scheduled)) if 0 < c < n]


def test_executed_op_copies_equal_schedule_computations(case):
    """Issue 5b: TF runs one copy of a node's ops per computation in the schedule, none merged away."""
    fn = generate(case.lowered, case.schedule)
    computations = case.schedule.recompute.sum(axis=0)
    expected = {op: int(computations[i]) for i, ops in enumerate(case.lowered.node_ops) for op in ops}
    assert fn.op_copies == fn.expected_op_copies() == sum(expected.values())
    counts = fn.executed_copy_counts(case.x, case.y)
    # Grappler runs (its fusions run several ops as one), and TF's graph optimizer runs CSE and
    # constant folding after it: every recomputation must survive them.
    assert not merged_copies(fn, case.schedule, counts)
    assert sum(c == 0 for c in counts) < case.lowered.graph.n // 4


@pytest.mark.parametrize("order", ["total", "partial"])
def test_every_recomputation_runs_with_grappler_on(order):
    """The step runs under Grappler as the plain step does, fusions included (a test that fails if
    the meta optimizer is turned off for it again), and with every pass on that is not in
    PLAN_BREAKING_PASSES every recomputation of this U-Net plan runs; each pass in it is there
    because it merges recomputations when on."""
    model, loss, xs, ys = unet_model()
    lowered = lower(model, loss, xs, ys, level="layer", gradient_nodes=True)
    schedule = solve(lowered.graph, checkpoint_all_peak(lowered.graph) // 2, strategy="checkmate_lp_rounding",
                     **SOLVE_OPTIONS).schedule
    assert schedule.recompute_count > 0
    x, y = batch_for(xs, ys, 2)
    fn = generate(lowered, schedule, order=order)
    _, executed = fn._executed_names(x, y)
    assert any("Fused" in kind for kind in executed.values()), "no Grappler fusion ran in the generated step"
    assert not merged_copies(fn, schedule, fn.executed_copy_counts(x, y))
    for name in list(_compat.PLAN_BREAKING_PASSES):
        saved = dict(_compat.PLAN_BREAKING_PASSES)
        _compat.PLAN_BREAKING_PASSES.pop(name)
        try:
            merged = merged_copies(fn, schedule, fn.executed_copy_counts(x, y))
        finally:
            _compat.PLAN_BREAKING_PASSES.clear()
            _compat.PLAN_BREAKING_PASSES.update(saved)
        assert merged, f"{name} merges no recomputation when on: it need not be switched off"


def test_op_level_step_matches_plain_and_copies():
    model, loss, xs, ys = residual_cnn_model(batch=2, size=16, filters=4, blocks=1)
    lowered = lower(model, loss, xs, ys, level="op")
    graph = lowered.graph
    result = solve(graph, int(checkpoint_all_peak(graph) * 0.8), strategy="checkmate_lp_rounding")
    assert result.schedule.recompute_count > 0
    x, y = batch_for(xs, ys, 10)
    fn = generate(lowered, result.schedule)
    (got, want), _ = run_from_same_state(model, [fn, plain(lowered)], x, y)
    for g, w in zip([got[0], *got[1]], [want[0], *want[1]]):
        assert_close_relative(g, w)
    assert not merged_copies(fn, result.schedule, fn.executed_copy_counts(x, y))


@pytest.mark.parametrize("level", ["layer", "op"])
def test_variables_the_loss_does_not_use_get_zero_gradients(level):
    """An output head the loss ignores: its variables get zero gradients, in the order of
    model.trainable_variables, and the rest match an eager GradientTape."""
    keras.utils.set_random_seed(0)
    inp = keras.Input((32,))
    h = keras.layers.Dense(64, activation="relu", name="hidden0")(inp)
    h = keras.layers.Dense(64, activation="relu", name="hidden1")(h)
    main = keras.layers.Dense(10, name="main")(h)
    aux = keras.layers.Dense(3, name="aux")(h)
    model = keras.Model(inp, [main, aux])

    def loss(y_true, y_pred):
        return XENT(y_true, y_pred[0])

    xs, ys = tf.TensorSpec((64, 32)), tf.TensorSpec((64,), tf.int32)
    lowered = lower(model, loss, xs, ys, level=level)
    result = solve(lowered.graph, 10 * checkpoint_all_peak(lowered.graph), strategy="checkpoint_last_node")
    assert result.schedule.recompute_count > 0
    x, y = batch_for(xs, ys, 10)
    got_loss, got = generate(lowered, result.schedule)(x, y)
    with tf.GradientTape() as tape:
        want_loss = loss(y, model(x, training=True))
    want = tape.gradient(want_loss, model.trainable_variables)
    assert_close_relative(got_loss, want_loss)
    assert len(got) == len(model.trainable_variables)
    for g, w, v in zip(got, want, model.trainable_variables):
        assert g.shape == v.shape
        if v.path.startswith("aux"):
            assert w is None and not np.any(g.numpy()), v.path
        else:
            assert_close_relative(g, w)


def test_layers_split_for_their_workspace_run_and_match_the_plain_step():
    """With gradient nodes, a layer node whose new transient tensors outweigh its value and 10% of the
    activations (the attention backward: the gradients of its score tensors) becomes one node per op;
    layers whose transients are written in place are not split; a schedule that recomputes the split
    graph runs with the plain step's loss and gradients."""
    from checkmate.solvers import checkpoint_all_peak as peak_of
    from checkmate.tf2 import zoo

    built = zoo.build_model("transformer", 4, (64, 32))
    lowered = lower(built.model, built.loss, built.input_spec, built.label_spec, level="layer",
                    gradient_nodes=True)
    g = lowered.graph
    assert "attention_grad" in lowered.metadata["split_workspace_nodes"]
    assert "attention_grad" not in g.names
    parts = [n for n in g.names if n.startswith("attention_grad:")]
    assert len(parts) > 5 and any(n.startswith("attention_grad:Einsum") for n in parts)
    # the feed-forward backward (GELU's gradient, elementwise, in place) stays one node
    assert "ff1_grad" in g.names
    compact = lower(built.model, built.loss, built.input_spec, built.label_spec, level="layer",
                    gradient_nodes=False)
    assert compact.metadata["split_workspace_nodes"] == () and "attention_grad" in compact.graph.names
    for name, build in MODELS.items():
        model, loss, xs, ys = build()
        assert lower(model, loss, xs, ys, level="layer", gradient_nodes=True).metadata["split_workspace_nodes"] == ()

    result = solve(g, int(peak_of(g) * 0.9), strategy="chen_sqrtn")
    assert result.schedule.recompute_count > 0
    x, y = batch_for(built.input_spec, built.label_spec, 10)
    fn = generate(lowered, result.schedule)
    (got, want), _ = run_from_same_state(built.model, [fn, plain(lowered)], x, y)
    for a, b in zip([got[0], *got[1]], [want[0], *want[1]]):
        assert_close_relative(a, b)
    assert not merged_copies(fn, result.schedule, fn.executed_copy_counts(x, y))


def test_checkpoint_all_emits_no_copies():
    """A plan that recomputes nothing is the plain step's graph: same ops, same inputs, no anchor."""
    model, loss, xs, ys = mlp_model(batch=8, width=8, depth=2)
    lowered = lower(model, loss, xs, ys, level="op")
    rewritten = rewrite_graph_def(lowered, checkpoint_all_schedule(lowered.graph))
    assert set(rewritten.copies) == {1}
    assert (rewritten.order, rewritten.anchored) == ("none", 0)
    names = [nd.name for nd in rewritten.graph_def.node]
    assert len(names) == len(set(names)) == len(lowered.function.graph.as_graph_def().node)
    plain = {nd.name: list(nd.input) for nd in lowered.function.graph.as_graph_def().node}
    assert {nd.name: list(nd.input) for nd in rewritten.graph_def.node} == plain
    total = rewrite_graph_def(lowered, checkpoint_all_schedule(lowered.graph), order="total")
    assert {nd.name: list(nd.input) for nd in total.graph_def.node} != plain


def _executed_structure(run):
    """What TF ran after its optimizations, names aside: a count of (op type, data input op types,
    control input op types) over every executed graph, and how many graphs there were."""
    graphs = _compat.executed_graph_defs(run)
    shape = collections.Counter()
    for gdef in graphs:
        types = {nd.name: nd.op for nd in gdef.node}
        for nd in gdef.node:
            data = tuple(types.get(_split(t), "?") for t in nd.input if not t.startswith("^"))
            control = tuple(sorted(types.get(t[1:], "?") for t in nd.input if t.startswith("^")))
            shape[(nd.op, data, control)] += 1
    return shape, len(graphs)


def _split(text):
    return text.partition(":")[0]


@pytest.mark.parametrize("name", ["mlp", "residual_cnn", "unet"])
def test_checkpoint_all_step_runs_the_plain_steps_graph(name):
    """With nothing recomputed, what TF executes for the generated step is what it executes for the
    plain step: the same ops, wired alike, no added identity, control edge or measuring hook. It also
    fails when a Grappler pass is switched off for the generated step (with ``remapping`` in
    PLAN_BREAKING_PASSES it fails on all three models)."""
    model, loss, xs, ys = MODELS[name]()
    lowered = lower(model, loss, xs, ys, level="layer")
    fn = generate(lowered, checkpoint_all_schedule(lowered.graph))
    x, y = batch_for(xs, ys, int(model.outputs[0].shape[-1]))
    flat = fn.flat_args(x, y)
    # both first calls: TF reports a function's executed graphs when it instantiates it
    generated, generated_graphs = _executed_structure(lambda: fn.call_flat(*flat))
    plain_step, plain_graphs = _executed_structure(lambda: lowered.function(*flat))
    assert generated_graphs == plain_graphs > 0
    assert sum(plain_step.values()) > 20
    assert generated == plain_step, (generated - plain_step, plain_step - generated)


def test_generated_function_adds_no_op_per_variable():
    """Before any optimization, the generated function holds the plain step's ops and only what a
    function needs around them: its arguments, one identity per output and the control output's
    NoOp. The variables' handles are fed as the function's captures, with no identity per variable
    (with one, the residual CNN's function held 41 more ops, one per captured variable)."""
    model, loss, xs, ys = residual_cnn_model()
    lowered = lower(model, loss, xs, ys, level="layer")
    fn = generate(lowered, checkpoint_all_schedule(lowered.graph))
    generated = collections.Counter(op.type for op in fn.concrete_function.graph.get_operations())
    plain = collections.Counter(op.type for op in lowered.function.graph.get_operations())
    captures = len(lowered.function.graph.captures)
    assert captures > 20
    assert plain - generated == collections.Counter()
    assert generated - plain == collections.Counter(
        {"Placeholder": len(fn.rewritten.feed_names), "Identity": len(fn.rewritten.output_names), "NoOp": 1})
    graph = fn.concrete_function.graph
    internal = {t.op.name for t in graph.internal_captures}
    assert len(internal) == captures
    assert not [op.name for op in graph.get_operations()
                if op.type == "Identity" and op.inputs and op.inputs[0].op.name in internal]


def anchors_of(by_name, ops):
    """The ops a copy waits for: its ops' control inputs, and those of the gates they read (a private
    variable read, constant or EnsureShape carrying the anchor, so that the op itself stays fusable); an
    anchor on the EnsureShape that reads an op's output (so that the op has no control output) stands
    for that op."""
    def source(name):
        return name[:-len(DONE_SUFFIX)] if name.endswith(DONE_SUFFIX) else name

    out = set()
    for op in ops:
        for text in by_name[op].input:
            name = text.lstrip("^").partition(":")[0]
            if text.startswith("^"):
                out.add(source(name))
            elif GATE_SUFFIX in name:
                out.update(source(t[1:]) for t in by_name[name].input if t.startswith("^"))
    return out


def test_anchored_contractions_stay_fused():
    """The anchor of a matrix product or convolution goes on a gate (a private copy of its variable
    read), not on the op: Grappler fuses no op with a control input, and the bias add would run apart.
    In the default order every forward matrix product of this plan runs fused, every recomputation too."""
    model, loss, xs, ys = mlp_model(batch=64, width=32, depth=6)
    lowered = lower(model, loss, xs, ys, level="layer")
    graph = lowered.graph
    schedule = solve(graph, int(checkpoint_all_peak(graph) * 0.75), strategy="checkmate_lp_rounding",
                     **SOLVE_OPTIONS).schedule
    assert schedule.recompute_count > 0
    rewritten = rewrite_graph_def(lowered, schedule)
    gates = [nd for nd in rewritten.graph_def.node if GATE_SUFFIX in nd.name]
    assert gates and all(nd.op in ("ReadVariableOp", "Const", "EnsureShape") for nd in gates)
    assert any(nd.op == "ReadVariableOp" for nd in gates)
    assert all(any(t.startswith("^") for t in nd.input) for nd in gates)
    by_name = {nd.name: nd for nd in rewritten.graph_def.node}
    matmuls = [by_name[op] for (i, _), ops in rewritten.copy_ops.items() if not graph.backward[i]
               for op in ops if by_name[op].op == "MatMul"]
    assert len(matmuls) > 3 and not any(t.startswith("^") for nd in matmuls for t in nd.input)
    fn = generate(lowered, schedule)
    x, y = batch_for(xs, ys, 10)
    scope, executed = fn._executed_names(x, y)
    ran = {name.split(scope + "/", 1)[1] for name in executed if scope + "/" in name}
    # every forward matrix product ran fused into its bias add (the fused op takes the last op's
    # name), recomputations included
    assert not {nd.name for nd in matmuls} & ran
    assert not merged_copies(fn, schedule, fn.executed_copy_counts(x, y))


def test_recomputation_copies_are_anchored_on_the_plan_order():
    """order="total": each copy's entry ops carry a control input on the previous computation's last
    ops, or read one of them: that is what keeps TF from running ahead, and what keeps CSE from merging
    copies (a copy that reads the computation just before it reads a value no earlier copy of its node
    read)."""
    model, loss, xs, ys = mlp_model(batch=8, width=8, depth=3)
    lowered = lower(model, loss, xs, ys, level="layer")
    graph = lowered.graph
    schedule = solve(graph, 10 * checkpoint_all_peak(graph), strategy="checkpoint_last_node").schedule
    rewritten = rewrite_graph_def(lowered, schedule, order="total")
    by_name = {nd.name: nd for nd in rewritten.graph_def.node}
    computes = [i for action, i in schedule.plan if action == "compute"]
    seen = {}
    for step, i in enumerate(computes):
        k = seen.get(i, 0)
        seen[i] = k + 1
        if step == 0:
            continue
        ops = rewritten.copy_ops[(i, k)]
        prev = computes[step - 1]
        prev_ops = set(rewritten.copy_ops[(prev, seen[prev] - 1)])
        reads = {t.partition(":")[0] for op in ops for t in by_name[op].input if not t.startswith("^")}
        assert (anchors_of(by_name, ops) | reads) & prev_ops, f"copy {k} of node {i} is not ordered after node {prev}"


def test_global_optimizer_settings_are_restored():
    """The step runs with Grappler on except the plan-breaking passes, and leaves the user's settings."""
    model, loss, xs, ys = mlp_model(batch=8, width=8, depth=2)
    lowered = lower(model, loss, xs, ys, level="layer")
    fn = generate(lowered, checkpoint_all_schedule(lowered.graph))
    x, y = batch_for(xs, ys, 10)
    before = tf.config.optimizer.get_experimental_options()
    inside = []
    with _compat.grappler_disabled():
        inside.append(tf.config.optimizer.get_experimental_options())
    fn(x, y)
    assert not inside[0].get("disable_meta_optimizer", False)
    assert all(inside[0].get(name) is on for name, on in _compat.PLAN_BREAKING_PASSES.items())
    assert tf.config.optimizer.get_experimental_options() == before
    tf.config.optimizer.set_experimental_options({"dependency_optimization": True, "remapping": False})
    try:
        fn(x, y)
        assert tf.config.optimizer.get_experimental_options()["dependency_optimization"] is True
        assert tf.config.optimizer.get_experimental_options()["remapping"] is False
    finally:
        tf.config.optimizer.set_experimental_options({"dependency_optimization": None, "remapping": None})
    assert tf.config.optimizer.get_experimental_options() == before


def _diamond(out_mem):
    """a -> b -> c, a -> d, (c, d) -> e: d may run as soon as a exists, or where the plan puts it."""
    nodes = [Node(0, "a", 1.0, 4), Node(1, "b", 1.0, 1), Node(2, "c", 1.0, 4), Node(3, "d", 1.0, 1),
             Node(4, "e", 1.0, out_mem, output=True)]
    graph = Graph(nodes, [(0, 1), (1, 2), (0, 3), (2, 4), (3, 4)])
    plan = [("compute", 0), ("compute", 1), ("compute", 2), ("free", 1), ("compute", 3), ("free", 0),
            ("compute", 4)]
    return graph, plan


def test_partial_order_waits_only_where_running_beside_another_exceeds_the_plan_peak():
    # plan memory 4, 5, 9, (8), 9, (5), 5 + out: d (1 byte) run beside c (plan memory 9) is 10 bytes
    graph, plan = _diamond(out_mem=1)        # plan peak 9: d waits for c, and for nothing else
    assert partial_waits(graph, plan) == [(), (), (), (2,), ()]
    assert partial_anchors(graph, plan) == [False, False, False, True, False]
    # e reads c and d: every consumer of a and b (b, c, d) has run, so both frees are done without a wait
    graph, plan = _diamond(out_mem=8)        # plan peak 13 (at e): d beside c stays under it
    assert partial_waits(graph, plan) == [(), (), (), (), ()]


def test_partial_order_waits_for_the_consumers_of_late_frees_it_needs():
    # a -> b, a -> c, a -> d, (b, c, d) -> e; a 4, b 4, c 1, d 1 bytes; the plan frees b after computing
    # c, and computes d (1 byte) at the plan's peak of 10 (a 4, c 1, d 1, e 4 with b gone)
    nodes = [Node(0, "a", 1.0, 4), Node(1, "b", 1.0, 4), Node(2, "c", 1.0, 1), Node(3, "d", 1.0, 1),
             Node(4, "e", 1.0, 4, output=True)]
    graph = Graph(nodes, [(0, 1), (0, 2), (0, 3), (1, 4), (2, 4), (3, 4)])
    # with b read only by e, the plan must hold it until e: every position stays within the peak
    plan = [("compute", 0), ("compute", 1), ("compute", 2), ("compute", 3), ("compute", 4)]
    assert partial_waits(graph, plan) == [(), (), (), (), ()]
    # b -> x -> e instead: the plan frees b once x (4 bytes) has run; y (4 bytes), placed after that
    # free at the peak, must wait for x (the consumer of b)
    nodes = [Node(0, "a", 1.0, 2), Node(1, "b", 1.0, 4), Node(2, "x", 1.0, 4), Node(3, "c", 1.0, 1),
             Node(4, "y", 1.0, 4), Node(5, "e", 1.0, 1, output=True)]
    graph = Graph(nodes, [(0, 1), (1, 2), (0, 3), (0, 4), (2, 5), (3, 5), (4, 5)])
    plan = [("compute", 0), ("compute", 1), ("compute", 2), ("free", 1), ("compute", 3), ("compute", 4),
            ("free", 0), ("compute", 5)]
    # memory 2, 6, 10, (6), 7, 11 (peak), (9), 10; y beside b and x would be 2 + 4 + 4 + 4 = 14
    # and for c: c may run before x, while b is still live (7 + 4), and the bound at c's moment does
    # not know that y, if it ran then, would have freed b (it counts both: 15 > 11)
    waits = partial_waits(graph, plan)
    assert waits == [(), (), (), (), (2, 3), ()], waits
    # with more room (a peak of 15 elsewhere: e of 6 bytes), y waits for nothing
    graph = Graph(nodes[:5] + [Node(5, "e", 1.0, 6, output=True)], graph.edges)
    assert partial_waits(graph, plan)[4] == ()


def test_partial_order_anchors_every_recomputation():
    graph, _ = _diamond(out_mem=8)
    plan = [("compute", 0), ("compute", 1), ("free", 0), ("compute", 2), ("free", 1), ("compute", 0),
            ("compute", 3), ("free", 0), ("compute", 4)]
    # the second computation of a waits though its inputs (none) exist from the start and the plan's
    # peak would allow it beside anything: on a computation after a's first copy that it does not
    # read (b, the one that ends first), so that its control input differs from the first copy's; c
    # reads b already, so the wait goes on c (an anchor on a value another computation reads could
    # keep Grappler from fusing the two)
    waits = partial_waits(graph, plan)
    assert waits == [(), (), (), (2,), (), ()]
    assert partial_anchors(graph, plan) == [False, False, False, True, False, False]


def _as_backward(graph, first_backward):
    return Graph([Node(nd.id, nd.name, nd.cost, nd.mem, backward=nd.id >= first_backward, output=nd.output)
                  for nd in graph.nodes], graph.edges)


def test_partial_order_counts_a_backward_computations_workspace():
    # d (1 byte) has room beside c under the peak of 13 as a forward computation and as a backward
    # one (its value and as much again of workspace): left free both ways
    graph, plan = _diamond(out_mem=8)
    assert partial_anchors(graph, plan)[3] is False
    assert partial_anchors(_as_backward(graph, 3), plan)[3] is False
    # d of 3 bytes, plan memory 4, 5, 9, (8), 11, (7), 12 (at e). As a forward computation: peak 12,
    # and beside c (9) its value fits (12). As the only backward one: its workspace at its own moment
    # makes the peak 14, and beside c value and workspace do not fit (15): it waits for c
    nodes = [Node(nd.id, nd.name, nd.cost, 3 if nd.id == 3 else nd.mem, output=nd.output)
             for nd in _diamond(out_mem=5)[0].nodes]
    graph = Graph(nodes, _diamond(out_mem=5)[0].edges)
    assert partial_waits(graph, plan)[3] == ()
    backward_d = Graph([Node(nd.id, nd.name, nd.cost, nd.mem, backward=nd.id == 3, output=nd.output)
                        for nd in graph.nodes], graph.edges)
    assert partial_waits(backward_d, plan)[3] == (2,)


def test_partial_order_is_a_subset_of_the_total_one_and_keeps_copies_apart():
    """order="partial": the computations partial_anchors leaves free carry no control input; every
    recomputation differs from its node's first copy (a control input or another copy's input), so
    common-subexpression elimination cannot merge it back; fewer control inputs than the total order."""
    model, loss, xs, ys = mlp_model(batch=8, width=8, depth=3)
    lowered = lower(model, loss, xs, ys, level="layer")
    graph = lowered.graph
    schedule = solve(graph, 10 * checkpoint_all_peak(graph), strategy="checkpoint_last_node").schedule
    assert schedule.recompute_count > 0
    partial = rewrite_graph_def(lowered, schedule, order="partial")
    total = rewrite_graph_def(lowered, schedule, order="total")
    by_name = {nd.name: nd for nd in partial.graph_def.node}
    source = {nd.name: nd for nd in lowered.function.graph.as_graph_def().node}
    anchors = partial_anchors(graph, schedule.plan)
    computes = [i for action, i in schedule.plan if action == "compute"]
    seen = {}
    for c, i in enumerate(computes):
        k = seen.get(i, 0)
        seen[i] = k + 1
        ops = partial.copy_ops[(i, k)]
        controls = [t for op in ops for t in by_name[op].input if t.startswith("^")]
        if not anchors[c]:
            added = set(controls) - {t for op in ops for t in source[op].input if t.startswith("^")}
            assert not added and not any(GATE_SUFFIX in t for op in ops for t in by_name[op].input), (graph.names[i], k)
        if k > 0:
            assert anchors[c]
            first = [list(by_name[op].input) for op in partial.copy_ops[(i, 0)]]
            assert [list(by_name[op].input) for op in ops] != first, (graph.names[i], k)

    def count(rewritten):
        return sum(t.startswith("^") for nd in rewritten.graph_def.node for t in nd.input)

    assert partial.critical_path_cost < total.critical_path_cost
    assert partial.critical_path_cost >= partial.plain_critical_path_cost
    assert total.critical_path_cost == pytest.approx(total.total_cost)     # one chain
    assert not all(anchors) and any(anchors)
    assert (partial.order, partial.anchored) == ("partial", sum(anchors))
    assert (total.order, total.anchored) == ("total", len(computes) - 1)
    assert rewrite_graph_def(lowered, schedule).order == "partial"      # the default for a recomputing plan
    assert partial.describe_order().startswith(f"partial: {sum(anchors)} of {len(computes)} computations")
    with pytest.raises(Exception, match="unknown order"):
        rewrite_graph_def(lowered, schedule, order="sideways")


@pytest.mark.slow
def test_partial_order_keeps_the_plans_memory(request):
    """The partial order (the default for a plan that recomputes) peaks where the total order does and
    within the plan's prediction, on a U-Net (skip connections) at 50% of its checkpoint-all peak; with
    no order at all the same plan peaks well above it (the anchors it keeps are the ones memory needs)."""
    if ran_in_fresh_process(request):
        return
    model, loss, xs, ys = unet_model()
    lowered = lower(model, loss, xs, ys, level="layer")
    graph = lowered.graph
    schedule = solve(graph, checkpoint_all_peak(graph) // 2, strategy="checkmate_lp_rounding",
                     **SOLVE_OPTIONS).schedule
    assert schedule.recompute_count > 0
    x, y = batch_for(xs, ys, int(model.outputs[0].shape[-1]))
    predicted = predicted_step_peak(lowered, schedule)
    peaks = {}
    for order in ("partial", "total", "none"):
        fn = generate(lowered, schedule, order=order)
        # min over repeats: the allocator statistics are process-wide (see checkmate.tf2.memory)
        peaks[order] = measure_peak_memory(fn.call_flat, *fn.flat_args(x, y), repeats=2, reduce="min")
    # the allocator hands out whole chunks (0.5 MiB steps at these 7-8 MiB peaks): one chunk apart
    assert peaks["partial"] <= 1.10 * peaks["total"], peaks
    assert peaks["partial"] <= 1.15 * predicted, (peaks, predicted)
    assert peaks["none"] > 1.15 * peaks["partial"], peaks


def test_plan_that_reads_a_freed_value_is_rejected():
    model, loss, xs, ys = mlp_model(batch=8, width=8, depth=2)
    lowered = lower(model, loss, xs, ys, level="layer")
    schedule = checkpoint_all_schedule(lowered.graph)
    plan = list(schedule.plan)
    # free node 0 right after computing it, before its users run
    plan.remove(("free", 0))
    plan.insert(plan.index(("compute", 0)) + 1, ("free", 0))
    bad = Schedule(schedule.recompute, schedule.retain, tuple(plan))
    with pytest.raises(InvalidScheduleError):
        generate(lowered, bad)


def test_lowered_graph_missing_a_data_edge_is_rejected():
    model, loss, xs, ys = mlp_model(batch=8, width=8, depth=2)
    lowered = lower(model, loss, xs, ys, level="layer")
    graph = lowered.graph
    fn_graph = lowered.function.graph

    def reads(u, v):
        producers = set(lowered.node_ops[u])
        return any(t.op.name in producers for op in lowered.node_ops[v]
                   for t in fn_graph.get_operation_by_name(op).inputs)

    u, v = next((u, v) for u, v in graph.edges if graph.backward[v] and not graph.backward[u] and reads(u, v))
    pruned = Graph(graph.nodes, [e for e in graph.edges if e != (u, v)], name=graph.name,
                   fixed_mem=graph.fixed_mem)
    broken = dataclasses.replace(lowered, graph=pruned)
    with pytest.raises(InvalidGraphError, match="no edge"):
        rewrite_graph_def(broken, checkpoint_all_schedule(pruned))


def nasnet_cell_model(batch=8, size=8, filters=16, cells=3, seed=0):
    """NASNet-style cells (ReLU, separable convolution, BatchNorm twice per branch; branches added and
    concatenated) down to 2x2 pixels, in float64."""
    keras.utils.set_random_seed(seed)
    layers = keras.layers
    dtype = "float64"
    inp = keras.Input((size, size, 3), name="image", dtype=dtype)
    x = layers.Conv2D(filters, 3, strides=2, padding="same", name="stem", dtype=dtype)(inp)
    x = layers.BatchNormalization(name="stem_bn", dtype=dtype)(x)
    for c in range(cells):
        branches = []
        for b, kernel in enumerate((3, 5)):
            y = x
            for k in range(2):
                y = layers.Activation("relu", name=f"cell{c}_b{b}_relu{k}", dtype=dtype)(y)
                y = layers.SeparableConv2D(filters, kernel, padding="same", use_bias=False,
                                           name=f"cell{c}_b{b}_sep{k}", dtype=dtype)(y)
                y = layers.BatchNormalization(name=f"cell{c}_b{b}_bn{k}", dtype=dtype)(y)
            branches.append(y)
        added = layers.Add(name=f"cell{c}_add", dtype=dtype)(branches)
        x = layers.Concatenate(name=f"cell{c}_concat", dtype=dtype)([added, x])
        x = layers.Conv2D(filters, 1, strides=2 if c == 0 else 1, name=f"cell{c}_adjust", dtype=dtype)(x)
    x = layers.Activation("relu", name="head_relu", dtype=dtype)(x)
    x = layers.GlobalAveragePooling2D(name="pool", dtype=dtype)(x)
    out = layers.Dense(10, name="logits", dtype=dtype)(x)
    return (keras.Model(inp, out, name="nasnet_cells"), XENT, tf.TensorSpec((batch, size, size, 3), tf.float64),
            tf.TensorSpec((batch,), tf.int32))


@pytest.mark.parametrize("order", ["partial", "total"])
def test_nasnet_style_cells_match_the_plain_step_in_float64(order):
    """Separable convolutions, BatchNorm and ReLU at 2x2 pixels, as in NASNetMobile's last cells.

    Compared in float64: in float32 the generated and the plain step (or the plain step with and
    without oneDNN) round differently by ~1e-6, and a ReLU whose input is within that of zero takes
    the other side; at 2x2 pixels and batch 8 a BatchNorm beta's gradient is a sum of 32 entries, so
    one such entry moves it by several percent of its largest entry (NASNetMobile at 64x64: 6.8e-2,
    the plain step alone with oneDNN on and off: 6.8e-2). In float64 the rounding is ~1e-15 and any
    copy reading a wrong tensor still shows."""
    model, loss, xs, ys = nasnet_cell_model()
    lowered = lower(model, loss, xs, ys, level="layer")
    graph = lowered.graph
    result = solve(graph, int(checkpoint_all_peak(graph) * 0.7), strategy="auto", **SOLVE_OPTIONS)
    assert result.schedule.recompute_count > 0, "the test needs a schedule that recomputes"
    fn = generate(lowered, result.schedule, order=order)
    x, y = batch_for(xs, ys, 10)
    (got, want), _ = run_from_same_state(model, [fn, plain(lowered)], x, y)
    assert_close_relative(got[0], want[0], rel=1e-12)
    assert len(got[1]) == len(want[1]) == len(model.trainable_variables)
    for g, w in zip(got[1], want[1]):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == np.float64
        # the floor: a convolution bias before a BatchNorm has a gradient of zero, computed as ~1e-16
        assert float(np.abs(g - w).max()) <= 1e-9 * max(float(np.abs(w).max()), 1e-6)


def _paths_joining_fusable_pairs(graph_def) -> list[tuple[str, str]]:
    """The pairs oneDNN's layout pass merges into one op (a Conv2DBackpropFilter and the BiasAddGrad
    reading the same op; a Conv2D or Pad and the BiasAdd or Conv2D reading it) that a path through
    other ops joins: merged, such a pair would wait for itself."""
    import networkx as nx

    g = nx.DiGraph()
    for nd in graph_def.node:
        g.add_node(nd.name)
        for text in nd.input:
            g.add_edge(text.lstrip("^").split(":")[0], nd.name)
    by_name = {nd.name: nd for nd in graph_def.node}

    def source(nd, k):
        return nd.input[k].split(":")[0] if len(nd.input) > k and not nd.input[k].startswith("^") else None

    joined = []
    for nd in graph_def.node:
        if nd.op == "BiasAddGrad":
            for other in graph_def.node:
                if other.op == "Conv2DBackpropFilter" and source(other, 2) == source(nd, 0) and (
                        nx.has_path(g, nd.name, other.name) or nx.has_path(g, other.name, nd.name)):
                    joined.append((other.name, nd.name))
        first = by_name.get(source(nd, 0) or "")
        if first is not None and (first.op, nd.op) in {("Conv2D", "BiasAdd"), ("Pad", "Conv2D")}:
            without = g.copy()
            without.remove_edge(first.name, nd.name)
            if nx.has_path(without, first.name, nd.name):
                joined.append((first.name, nd.name))
    return joined


def test_ops_onednn_merges_are_kept_apart_where_the_order_puts_work_between_them():
    # A functional backbone and a Sequential head at op level, ordered at 90% of checkpoint-all:
    # computations wait between a convolution's filter gradient and its bias gradient. Merged by
    # oneDNN's layout pass (TF 2.21 on CPU), the step failed with "N nodes in a cycle" when first run.
    keras.utils.set_random_seed(0)
    inner = keras.Input((16, 16, 3))
    h = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(inner)
    h = keras.layers.MaxPooling2D(2)(keras.layers.Conv2D(8, 3, padding="same", activation="relu")(h))
    backbone = keras.Model(inner, h)
    head = keras.Sequential([keras.layers.Conv2D(16, 3, activation="relu"), keras.layers.Conv2D(16, 1, activation="relu"),
                             keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
    inp = keras.Input((16, 16, 3))
    model = keras.Model(inp, head(backbone(inp)))
    xs, ys = tf.TensorSpec((4, 16, 16, 3)), tf.TensorSpec((4,), tf.int32)
    lowered = lower(model, keras.losses.SparseCategoricalCrossentropy(from_logits=True), xs, ys, level="op")
    result = solve(lowered.graph, int(checkpoint_all_peak(lowered.graph) * 0.9), strategy="griewank_logn")
    fn = generate(lowered, result.schedule)
    assert fn.rewritten.order == "partial"
    assert _paths_joining_fusable_pairs(fn.rewritten.graph_def) == []
    x, y = tf.random.normal((4, 16, 16, 3), seed=1), tf.range(4) % 10
    (got, want), _ = run_from_same_state(model, [fn, plain(lowered)], x, y)
    for g, w in zip([got[0], *got[1]], [want[0], *want[1]]):
        assert_close_relative(g, w)
