"""KerasHub tasks whose layers take patterns the other real-model tests do not: one transformer layer
called once per layer (ALBERT shares its weights across depth), attention with relative-position
buckets (DeBERTaV3), and shifted-window attention (Swin: windows cut out and rolled back). Random
init, small configs, no download, ``RematModel`` with a budget only: the losses equal plain Keras
``fit``'s, the replayed schedule is within the budget, and no composite layer is a node of its own."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
keras_hub = pytest.importorskip("keras_hub")

import checkmate  # noqa: E402
import checkmate.tf2  # noqa: E402
from checkmate.simulate import simulate  # noqa: E402
from checkmate.tf2 import _compat  # noqa: E402

from test_real_models import BATCH, assert_runs_the_plain_kernels, losses_of  # noqa: E402

VOCAB, STEPS = 200, 32


def albert():
    backbone = keras_hub.models.AlbertBackbone(
        vocabulary_size=VOCAB, num_layers=3, num_heads=2, embedding_dim=32, hidden_dim=64, intermediate_dim=128,
        num_groups=1, dropout=0.0, max_sequence_length=STEPS)
    return keras_hub.models.AlbertTextClassifier(backbone=backbone, num_classes=3, preprocessor=None, dropout=0.0)


def deberta():
    backbone = keras_hub.models.DebertaV3Backbone(
        vocabulary_size=VOCAB, num_layers=2, num_heads=2, hidden_dim=64, intermediate_dim=128, dropout=0.0,
        max_sequence_length=STEPS, bucket_size=16)
    return keras_hub.models.DebertaV3TextClassifier(backbone=backbone, num_classes=3, preprocessor=None)


def swin():
    backbone = keras_hub.models.SwinTransformerBackbone(
        image_shape=(32, 32, 3), embed_dim=16, depths=[2, 2], num_heads=[2, 2], window_size=4, patch_size=2,
        drop_path=0.0)
    return keras_hub.models.SwinTransformerImageClassifier(backbone=backbone, num_classes=3, preprocessor=None)


def text_batches(segments: bool):
    rng = np.random.default_rng(0)
    ids = rng.integers(1, VOCAB, (2 * BATCH, STEPS)).astype("int32")
    mask = np.ones_like(ids)
    mask[:, -5:] = 0
    x = {"token_ids": ids, "padding_mask": mask}
    if segments:
        x["segment_ids"] = np.zeros_like(ids)
    return x, rng.integers(0, 3, (2 * BATCH,)).astype("int32")


def image_batches():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((2 * BATCH, 32, 32, 3)).astype("float32"),
            rng.integers(0, 3, (2 * BATCH,)).astype("int32"))


CASES = {
    "albert": (albert, lambda: text_batches(True)),
    "deberta": (deberta, lambda: text_batches(False)),
    "swin": (swin, image_batches),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_keras_hub_task_trains_as_keras_at_half_of_checkpoint_all(name):
    build, data = CASES[name]
    keras.utils.set_random_seed(0)
    plain = build()
    keras.utils.set_random_seed(0)
    other = build()
    other.set_weights(plain.get_weights())
    for model in (plain, other):
        model.compile()       # the task's own defaults: its loss, optimizer and metrics
    x, y = data()
    trainer = checkmate.tf2.RematModel(other, budget="50%")
    with _compat.grappler_disabled():       # the same kernels as the generated step's
        want = losses_of(plain, x, y, None)
    got = losses_of(trainer, x, y, None)
    np.testing.assert_allclose(got, want, rtol=1e-4)

    step = trainer.compiled_step()
    assert_runs_the_plain_kernels(step, other, x, y, None)
    sim = simulate(step.graph, step.schedule)
    assert sim.valid
    assert sim.peak_memory_bytes <= step.predicted.budget_bytes
    assert step.lowered.level == "mixed"
    # every layer that runs other layers (the backbone, its transformer blocks, their attention) is
    # split: none of them names a node of its own
    composites = {line.split(":")[0] for line in step.lowered.metadata["split_layers"] if "runs" in line}
    assert any(name.count("/") >= 2 for name in composites)     # attention inside a block inside the backbone
    nodes = {n.split(":")[0] for n in step.graph.names}
    assert not composites & nodes
    # and their backward is split with them: each has backward nodes of the layers inside it
    for composite in composites:
        assert any(n.startswith(composite + "/") and "_grad" in n for n in nodes), composite
