"""The memory model against the allocator: node values as TF holds them, and predicted step peaks
that follow the measured ones (checkpoint-all and a recomputing plan) on several graphs."""

from __future__ import annotations

import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import checkmate  # noqa: E402
from checkmate.simulate import simulate  # noqa: E402
from checkmate.solvers import checkpoint_all_peak  # noqa: E402
from checkmate.solvers.baselines import segment_schedule  # noqa: E402
from checkmate.tf2.codegen import generate  # noqa: E402
from checkmate.tf2.lowering import lower  # noqa: E402
from checkmate.tf2.memory import measure_peak_memory  # noqa: E402
from checkmate.tf2.step import resident_bytes  # noqa: E402
from isolation import ran_in_fresh_process  # noqa: E402
from test_codegen import MODELS, assert_close_relative, batch_for, plain, run_from_same_state  # noqa: E402

pytestmark = pytest.mark.tf

XENT = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def residual_stream_mlp(batch=512, width=64, blocks=4, seed=0):
    """Blocks written as ``x = x + block(x)`` between Keras layers (the residual add is no layer)."""
    keras.utils.set_random_seed(seed)
    layers = keras.layers
    inp = keras.Input((32,))
    x = layers.Dense(width, name="stem")(inp)
    for b in range(blocks):
        h = layers.LayerNormalization(name=f"b{b}_ln")(x)
        h = layers.Dense(2 * width, activation="relu", name=f"b{b}_up")(h)
        x = x + layers.Dense(width, name=f"b{b}_down")(h)
    out = layers.Dense(10, name="logits")(x)
    return keras.Model(inp, out, name="residual_stream_mlp"), XENT, tf.TensorSpec((batch, 32)), \
        tf.TensorSpec((batch,), tf.int32)


def groupnorm_unet(batch=4, size=32, base=8, levels=2, seed=0):
    """GroupNorm + SiLU residual conv blocks, strided downsampling, skip concatenations."""
    keras.utils.set_random_seed(seed)
    layers = keras.layers
    inp = keras.Input((size, size, 3))

    def block(x, ch, name):
        h = layers.GroupNormalization(groups=4, name=f"{name}_gn1")(x)
        h = layers.Activation("silu", name=f"{name}_act1")(h)
        h = layers.Conv2D(ch, 3, padding="same", name=f"{name}_conv1")(h)
        h = layers.GroupNormalization(groups=4, name=f"{name}_gn2")(h)
        h = layers.Activation("silu", name=f"{name}_act2")(h)
        h = layers.Conv2D(ch, 3, padding="same", name=f"{name}_conv2")(h)
        if x.shape[-1] != ch:
            x = layers.Conv2D(ch, 1, name=f"{name}_skip")(x)
        return layers.Add(name=f"{name}_add")([x, h])

    x = layers.Conv2D(base, 3, padding="same", name="stem")(inp)
    skips = []
    for d in range(levels):
        x = block(x, base * 2 ** d, f"down{d}")
        skips.append(x)
        x = layers.Conv2D(base * 2 ** d, 3, strides=2, padding="same", name=f"down{d}_pool")(x)
    x = block(x, base * 2 ** levels, "mid")
    for d in reversed(range(levels)):
        x = layers.UpSampling2D(name=f"up{d}_upsample")(x)
        x = layers.Concatenate(name=f"up{d}_concat")([x, skips[d]])
        x = block(x, base * 2 ** d, f"up{d}")
    x = layers.GroupNormalization(groups=4, name="out_gn")(x)
    x = layers.Activation("silu", name="out_act")(x)
    out = layers.Conv2D(3, 1, name="logits")(x)
    return keras.Model(inp, out, name="groupnorm_unet"), XENT, tf.TensorSpec((batch, size, size, 3)), \
        tf.TensorSpec((batch, size, size), tf.int32)


# ------------------------------------------------------------------------------------------ node values
def test_residual_stream_between_layers_is_a_node_of_its_own():
    """The add of ``x = x + block(x)`` is read by the next block's first layer and by the next add: as
    a node of its own, holding the stream between blocks costs only the stream, so the schedule of
    ``tf.recompute_grad`` around each block (keep the block inputs, recompute a block right before its
    backward) is a schedule of the graph, below checkpoint-all's peak; it runs with the plain step's
    gradients."""
    model, loss, xs, ys = residual_stream_mlp()
    lowered = lower(model, loss, xs, ys, level="layer", gradient_nodes=True)
    g = lowered.graph
    stream_bytes = 512 * 64 * 4
    junctions = [i for i in g.forward_nodes if not g.nodes[i].name.startswith(("stem", "b", "logits", "loss"))]
    # blocks 0-2 end in an add that the next block reads twice; block 3's feeds only the logits
    assert len(junctions) == 3, [g.nodes[i].name for i in g.forward_nodes]
    for i in junctions:
        assert g.mem[i] == stream_bytes
        readers = {g.nodes[u].name.split("_")[0] for u in g.users[i] if not g.backward[u]}
        assert len(readers) == 2, readers
    # the first layer of a block holds its own outputs only, not the stream it reads
    assert all(g.mem[g.names.index(f"b{b}_ln")] < 2.5 * stream_bytes for b in range(4))
    schedule = segment_schedule(g, junctions)
    sim = simulate(g, schedule)
    assert sim.valid and sim.recompute_count > 0
    assert sim.peak_memory_bytes < checkpoint_all_peak(g)
    x, y = batch_for(xs, ys, 10)
    fn = generate(lowered, schedule)
    (got, want), _ = run_from_same_state(model, [fn, plain(lowered)], x, y)
    for a, b in zip([got[0], *got[1]], [want[0], *want[1]]):
        assert_close_relative(a, b)


def test_default_compile_matches_the_recompute_grad_schedule_at_its_budget(monkeypatch):
    """Given the memory the schedule of tf.recompute_grad around each block needs (as a budget in
    bytes, the allocator's headroom on top), checkmate.tf2.compile with its defaults finds a schedule
    that fits and costs no more, where the step cannot be measured (TF's default CPU allocator). The
    allocator is pinned: a worker whose TF started with the BFC allocator (a CLI test before it sets
    TF_CPU_ALLOCATOR_USE_BFC) would check the step by running it, whose plans depend on the measured
    peaks (the next test covers that path)."""
    from checkmate.tf2 import step as step_module
    from checkmate.tf2.step import ALLOCATOR_HEADROOM_FRACTION, _user_budget_for

    monkeypatch.setattr(step_module, "_measurable", lambda lowered, device: None)

    model, loss, xs, ys = residual_stream_mlp()
    reference = checkmate.tf2.compile(model, loss, keras.optimizers.SGD(0.01), xs, ys, budget="100%",
                                      strategy="checkpoint_all", cost_model="flops")
    g = reference.graph
    junctions = [i for i in g.forward_nodes if not g.nodes[i].name.startswith(("stem", "b", "logits", "loss"))]
    blocks = simulate(g, segment_schedule(g, junctions))
    assert blocks.recompute_count > 0
    budget = _user_budget_for(blocks.peak_memory_bytes, resident_bytes(reference.lowered), ALLOCATOR_HEADROOM_FRACTION)
    step = checkmate.tf2.compile(model, loss, keras.optimizers.SGD(0.01), xs, ys, budget=budget,
                                 cost_model="flops", time_limit_s=20)
    assert step.graph.names == g.names
    # the plan's budget is the headroom plan's, at least the schedule's peak
    assert blocks.peak_memory_bytes <= step.predicted.planned_budget_bytes < budget
    assert step.predicted.peak_memory_bytes <= step.predicted.planned_budget_bytes
    assert step.predicted.compute_cost <= blocks.compute_cost * (1 + 1e-9)


def test_a_byte_budget_at_the_recompute_grad_schedules_peak_finds_it_when_its_step_fits(monkeypatch):
    """At exactly the peak of tf.recompute_grad's schedule (no headroom added to the budget), when the
    step planned for the whole budget measures within it, compile's defaults find that schedule or a
    cheaper one; with the 5% allocator headroom alone it would not fit the plan's budget."""
    from checkmate.tf2 import step as step_module

    model, loss, xs, ys = residual_stream_mlp()
    lowered = lower(model, loss, xs, ys, level="layer", gradient_nodes=True)
    g = lowered.graph
    junctions = [i for i in g.forward_nodes if not g.nodes[i].name.startswith(("stem", "b", "logits", "loss"))]
    blocks = simulate(g, segment_schedule(g, junctions))
    budget = int(blocks.peak_memory_bytes)
    resident = resident_bytes(lowered)
    assert step_module.planning_budget(budget, budget, resident) < budget
    monkeypatch.setattr(step_module, "_measurable", lambda lowered, device: "CPU:0")
    monkeypatch.setattr(step_module, "_measured_step_peak", lambda step, device: step.predicted.step_peak_bytes)
    step = step_module.compile_lowered(lowered, model, loss, keras.optimizers.SGD(0.01), budget=budget,
                                       time_limit_s=20, schedule_cache=False)
    assert step.predicted.planned_budget_bytes == budget
    assert step.predicted.peak_memory_bytes <= budget
    assert step.predicted.compute_cost <= blocks.compute_cost * (1 + 1e-9)


def test_in_place_kernels_share_their_input_node():
    """In a layer split for its workspace (GroupNorm's backward), an elementwise kernel that writes
    into an input nothing else reads is in that input's node: the broadcast of the group statistics
    (Tile) and its scaling (RealDiv, in place) are one buffer, so one node."""
    model, loss, xs, ys = groupnorm_unet(size=64, base=16)
    lowered = lower(model, loss, xs, ys, level="layer", gradient_nodes=True)
    split = lowered.metadata["split_workspace_nodes"]
    assert any("gn" in name for name in split), split
    graph = lowered.function.graph
    tiles = 0
    for k, ops in enumerate(lowered.node_ops):
        types = [graph.get_operation_by_name(o).type for o in ops]
        if "Tile" in types and ":" in lowered.graph.nodes[k].name:
            tiles += 1
            assert len(types) > 1 and "RealDiv" in types, (lowered.graph.nodes[k].name, types)
    assert tiles > 0


# ------------------------------------------------------------------------------------------ fidelity
FIDELITY_MODELS = {**MODELS, "groupnorm_unet": groupnorm_unet, "residual_stream_mlp": residual_stream_mlp}
# Measured over predicted step peak (the allocator's peak above the parameters and batch, against the
# simulator's): TF frees some values before the plan does (measured below) and rounds allocations to
# its chunks (measured above). Measured on this project's CPU runs: 0.91-1.10 over these five graphs and two plans, the chunk rounding varying with the machine's load and the allocation history.
PEAK_RATIO_BOUNDS = (0.88, 1.15)


@pytest.mark.slow   # a fresh process, two compiles and four measured steps per graph: 15-50 s each
@pytest.mark.parametrize("name", sorted(FIDELITY_MODELS))
def test_predicted_step_peak_follows_the_measured_one(name, request, monkeypatch):
    """checkpoint-all and chen_sqrtn (a recomputing plan that does not depend on the machine's load):
    the measured step peak over the predicted one lies within PEAK_RATIO_BOUNDS."""
    # the BFC allocator counts every allocation (TF's default CPU allocator only those of 256 KiB and
    # more); the fresh process reads it when TensorFlow starts
    monkeypatch.setenv("TF_CPU_ALLOCATOR_USE_BFC", "true")
    if ran_in_fresh_process(request):
        return
    model, loss, xs, ys = FIDELITY_MODELS[name]()
    x, y = batch_for(xs, ys, int(model.outputs[0].shape[-1]))
    ratios = {}
    for strategy in ("checkpoint_all", "chen_sqrtn"):
        step = checkmate.tf2.compile(model, loss, keras.optimizers.SGD(0.01), xs, ys, budget="100%",
                                     strategy=strategy, cost_model="flops")
        assert step.predicted.step_peak_bytes == \
            simulate(step.graph, step.schedule).peak_memory_bytes - resident_bytes(step.lowered)
        # min over repeats: the allocator statistics are process-wide (see checkmate.tf2.memory)
        measured = measure_peak_memory(step.gradients, x, y, repeats=2, reduce="min")
        ratios[strategy] = measured / step.predicted.step_peak_bytes
    low, high = PEAK_RATIO_BOUNDS
    assert all(low <= r <= high for r in ratios.values()), ratios
