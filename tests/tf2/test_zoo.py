"""The model zoo: every model builds and lowers; VGG16's layer graph has the paper's shape; extract CLI."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from checkmate.cli import main as cli_main  # noqa: E402
from checkmate.errors import InvalidArgumentError  # noqa: E402
from checkmate.graph import load_graph  # noqa: E402
from checkmate.tf2 import zoo  # noqa: E402
from checkmate.tf2.lowering import lower  # noqa: E402

pytestmark = pytest.mark.tf

PAPER_MODELS = ("vgg16", "vgg19", "mobilenet", "resnet50", "unet", "fcn8", "segnet")
TEST_MODELS = ("mlp", "residual_cnn", "transformer")
SMALL = {name: (32, 32, 3) for name in PAPER_MODELS}


def test_names():
    assert set(PAPER_MODELS + TEST_MODELS) <= set(zoo.names())
    for name in zoo.names():
        assert zoo.describe(name)


# Gradient nodes for the small graphs, the compact graph for the large ones (MobileNet, ResNet50, SegNet):
# one lowering per model covers both accountings.
SPLIT = {"vgg16", "vgg19", "unet", "fcn8", *TEST_MODELS}


@pytest.mark.parametrize("name", PAPER_MODELS + TEST_MODELS)
def test_every_zoo_model_lowers_at_layer_level(name):
    model, loss, xs, ys = zoo.build_model(name, batch_size=2, input_shape=SMALL.get(name))
    assert xs.shape[0] == 2 and ys.shape[0] == 2
    lg = lower(model, loss, xs, ys, level="layer", gradient_nodes=name in SPLIT)
    g = lg.graph
    split = lg.metadata["gradient_nodes"]
    assert split == (name in SPLIT)
    assert g.n == len(lg.node_ops)
    # gradients of every trainable variable are returned
    assert len(lg.grad_tensors) == len(model.trainable_variables)
    if split:
        assert g.n > lg.metadata["compact_nodes"]
        assert len(g.forward_nodes) > 0 and len(g.backward_nodes) > 0
        # the outputs are the loss and the parameter-gradient nodes
        assert [g.names[i] for i in np.flatnonzero(g.output)] == \
            ["loss"] + [nd.name for nd in g.nodes if nd.name.endswith(":params")]
        # non-recomputable nodes are exactly the BatchNorm/Dropout state parts and the gradient nodes
        for nd in g.nodes:
            assert nd.recomputable != nd.name.endswith((":state", ":params")), nd.name
    else:
        assert g.n == lg.metadata["compact_nodes"]
        assert len(g.forward_nodes) >= len(g.backward_nodes) > 0
        # the loss is the only output node: parameter gradients are accounted in fixed_mem
        assert [g.names[i] for i in np.flatnonzero(g.output)] == ["loss"]
        assert lg.metadata["grad_bytes_in_fixed_mem"]
        # non-recomputable nodes are exactly the BatchNorm/Dropout state parts
        for nd in g.nodes:
            assert nd.recomputable != nd.name.endswith(":state"), nd.name


def _small_vgg16_layer_graph(gradient_nodes):
    """(model, loss, specs, lowered, layer names, backward node names) of VGG16 at 32x32, batch 2; checks
    the forward nodes, which are one per layer plus the loss in both accountings."""
    model, loss, xs, ys = zoo.build_model("vgg16", batch_size=2, input_shape=(32, 32, 3))
    lg = lower(model, loss, xs, ys, level="layer", gradient_nodes=gradient_nodes)
    g = lg.graph
    layers = [layer.name for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)]
    assert len(layers) == 22
    assert [g.names[i] for i in g.forward_nodes] == layers + ["loss"]
    return model, loss, (xs, ys), lg, layers, [g.names[i] for i in g.backward_nodes]


def test_vgg16_layer_graph_matches_the_paper():
    model, loss, (xs, ys), lg, layers, backward = _small_vgg16_layer_graph(False)
    g = lg.graph
    assert backward == ["loss_grad"] + [f"{name}_grad" for name in reversed(layers)]
    assert 40 <= g.n <= 50            # the paper's VGG16 graph: ~45 nodes
    assert 80 <= len(g.edges) <= 100  # ... and ~90 edges
    # a forward convolution's value is its ReLU output
    conv = g.names.index("block1_conv1")
    assert g.mem[conv] == 2 * 32 * 32 * 64 * 4
    assert g.recomputable.all()
    assert g.fixed_mem == lg.metadata["parameter_and_batch_bytes"] + lg.metadata["grad_bytes"]
    # the op-level graph of the same step is much finer
    assert lower(model, loss, xs, ys, level="op").graph.n > 3 * g.n


def test_vgg16_gradient_node_graph():
    model, loss, (xs, ys), lg, layers, backward = _small_vgg16_layer_graph(True)
    g = lg.graph
    # with gradient nodes, a layer with weights also has a node for its gradients, and a convolution's backward is split around it (ReluGrad
    # before, the gradient w.r.t. the input after); the first convolution's input gradient is dead
    per_layer = [name for name, _ in itertools.groupby(b.split(":")[0] for b in backward)]
    assert per_layer == ["loss_grad"] + [f"{name}_grad" for name in reversed(layers)]
    weighted = [layer.name for layer in model.layers if layer.trainable_weights]
    assert sum(b.endswith(":params") for b in backward) == len(weighted) == 16
    compact = lg.metadata["compact_nodes"]
    assert 40 <= compact <= 50 and compact < g.n <= 2 * 45
    # a forward convolution's value is its ReLU output
    conv = g.names.index("block1_conv1")
    assert g.mem[conv] == 2 * 32 * 32 * 64 * 4
    assert all(nd.recomputable != nd.name.endswith(":params") for nd in g.nodes)
    assert g.fixed_mem == lg.metadata["parameter_and_batch_bytes"]


@pytest.mark.parametrize("gradient_nodes", [False, True])
def test_residual_cnn_flags(gradient_nodes):
    lg = lower(*zoo.build_model("residual_cnn", batch_size=2, input_shape=(16, 16, 3)), level="layer",
               gradient_nodes=gradient_nodes)
    names = lg.graph.names
    bn_layers = {"stem_bn", "block0_bn1", "block0_bn2", "block1_bn1", "block1_bn2"}
    assert {n for n, r in zip(names, lg.graph.recomputable) if not r and not n.endswith(":params")} == \
        {f"{b}:state" for b in bn_layers} | {"dropout:state"}
    # the residual add reads both branches
    add = names.index("block0_add")
    assert {names[d] for d in lg.graph.deps[add]} == {"stem_relu", "block0_bn2"}
    # with gradient nodes, the BatchNorm layers the backward reads only statistics of get :saved nodes
    assert any(n.endswith(":saved") for n in names) == gradient_nodes


def test_any_input_size_and_bad_sizes():
    model, _, xs, ys = zoo.build_model("unet", batch_size=3, input_shape=(48, 64, 1), num_classes=5)
    assert tuple(xs.shape) == (3, 48, 64, 1) and tuple(ys.shape) == (3, 48, 64)
    assert tuple(model.output.shape) == (None, 48, 64, 5)
    _, _, xs, _ = zoo.build_model("transformer", batch_size=1, input_shape=(7, 12))
    assert tuple(xs.shape) == (1, 7, 12)
    with pytest.raises(InvalidArgumentError, match="multiple of 16"):
        zoo.build_model("unet", input_shape=(40, 40, 3))
    with pytest.raises(InvalidArgumentError, match="unknown model"):
        zoo.build_model("alexnet")
    with pytest.raises(InvalidArgumentError, match="dimensions"):
        zoo.build_model("vgg16", input_shape=(32, 32))


def test_extract_cli_zoo_model(tmp_path, capsys):
    out = tmp_path / "mlp.json"
    rc = cli_main(["extract", "--model", "mlp", "--batch-size", "4", "--level", "op", "--cost-model", "flops",
                   "--out", str(out)])
    assert rc == 0
    g = load_graph(out)
    assert g.name == "mlp-b4-op"
    assert g.n > 10 and g.backward.any() and g.output.any()
    assert "wrote" in capsys.readouterr().out


def test_extract_cli_keras_file(tmp_path):
    keras.utils.set_random_seed(0)
    inp = keras.Input((None, None, 3))
    h = keras.layers.Conv2D(4, 3, padding="same", activation="relu", name="c")(inp)
    out = keras.layers.Conv2D(2, 1, name="logits")(h)
    model = keras.Model(inp, out)
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    path = tmp_path / "seg.keras"
    model.save(path)
    graph_path = tmp_path / "seg.json"
    # free spatial dimensions need --input-shape
    assert cli_main(["extract", "--keras-file", str(path), "--batch-size", "2", "--out", str(graph_path),
                     "--cost-model", "flops"]) == 2
    rc = cli_main(["extract", "--keras-file", str(path), "--batch-size", "2", "--input-shape", "8,8,3",
                   "--cost-model", "flops", "--out", str(graph_path)])
    assert rc == 0
    data = json.loads(graph_path.read_text())
    # checkmate extract writes the compact layer graph: one forward and one backward node per layer
    assert [n["name"] for n in data["nodes"]] == ["c", "logits", "loss", "loss_grad", "logits_grad", "c_grad"]


def test_extract_cli_errors(tmp_path, capsys):
    rc = cli_main(["extract", "--model", "nope", "--batch-size", "2", "--out", str(tmp_path / "g.json")])
    assert rc == 2
    assert "unknown model 'nope'" in capsys.readouterr().err
    rc = cli_main(["extract", "--keras-file", str(tmp_path / "missing.keras"), "--batch-size", "2",
                   "--out", str(tmp_path / "g.json")])
    assert rc == 2


@pytest.mark.slow
@pytest.mark.parametrize("name", PAPER_MODELS)
def test_paper_models_at_default_size(name, tmp_path):
    """Full-size models (224x224 / 256x256, default batch): layer graphs the MILP benchmarks use."""
    model, loss, xs, ys = zoo.build_model(name)
    lg = lower(model, loss, xs, ys, level="layer")
    g = lg.graph
    assert g.n > 40
    assert np.all(g.mem >= 0) and g.mem.sum() > 0
    from checkmate.graph import save_graph

    save_graph(g, tmp_path / f"{name}.json")
    assert load_graph(tmp_path / f"{name}.json") == g
