"""KerasHub tasks whose layers take patterns the other real-model tests do not: one transformer layer
called once per layer (ALBERT shares its weights across depth), attention with relative-position
buckets (DeBERTaV3), shifted-window attention (Swin: windows cut out and rolled back), a recurrence
over the tokens unrolled in Python (Qwen3.5's gated delta-rule linear attention: its backward is one
cycle of ops, merged into one node and split again), a per-pixel loss on one-hot labels (SegFormer,
the task's own loss) and a masked language model's loss at gathered positions, weighted per masked
token (BERT's MaskedLM, whose sample weights are ``(B, masks)`` as its preprocessor gives them), and
an object detector whose own ``compute_loss`` turns boxes and classes into its two outputs' targets
(RetinaNet; its weights outweigh its activations, so its budget is a share of those), and a
transformer detector that maps over the batch in a ``While`` loop and matches boxes in its loss with
conds (D-FINE, built as ``experiments/realworld.py`` builds it), and a text recognizer whose own loss
runs its decoder once per permutation of the label order (PARSeq). Random
init, small configs, no download, ``RematModel`` with a budget only: the losses equal plain Keras
``fit``'s, the replayed schedule is within the budget, and no composite layer is a node of its own."""

from __future__ import annotations

import sys
from pathlib import Path

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

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "experiments"))
import realworld  # noqa: E402

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


def qwen3_5():
    backbone = keras_hub.models.Qwen3_5Backbone(
        vocabulary_size=VOCAB, num_layers=2, num_query_heads=2, num_key_value_heads=1, head_dim=16, hidden_dim=32,
        intermediate_dim=64, linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=8,
        linear_value_head_dim=8)
    return keras_hub.models.Qwen3_5CausalLM(backbone=backbone, preprocessor=None)


def segformer():
    encoder = keras_hub.models.MiTBackbone(
        layerwise_depths=[1, 1], num_layers=2, layerwise_num_heads=[1, 2], layerwise_sr_ratios=[4, 1],
        max_drop_path_rate=0.0, layerwise_patch_sizes=[7, 3], layerwise_strides=[4, 2], image_shape=(32, 32, 3),
        hidden_dims=[16, 32])
    backbone = keras_hub.models.SegFormerBackbone(image_encoder=encoder, projection_filters=16)
    return keras_hub.models.SegFormerImageSegmenter(backbone=backbone, num_classes=3, preprocessor=None)


def bert_mlm():
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=VOCAB, num_layers=2, num_heads=2, hidden_dim=64, intermediate_dim=128, dropout=0.0,
        max_sequence_length=STEPS)
    return keras_hub.models.BertMaskedLM(backbone=backbone, preprocessor=None)


def masked_lm_batches(masks: int = 6):
    """What BertMaskedLMPreprocessor gives: token ids with the masked positions, their labels, and a
    weight per masked token (0 where a sequence has fewer masks than ``masks``)."""
    x, _ = text_batches(True)
    rng = np.random.default_rng(1)
    rows = len(x["token_ids"])
    x["mask_positions"] = np.sort(np.stack([rng.choice(STEPS - 5, masks, replace=False) for _ in range(rows)]),
                                  axis=1).astype("int32")
    weights = (rng.random((rows, masks)) > 0.3).astype("float32")
    return x, rng.integers(1, VOCAB, (rows, masks)).astype("int32"), weights


def retinanet():
    encoder = keras_hub.models.ResNetBackbone(
        input_conv_filters=[64], input_conv_kernel_sizes=[7], stackwise_num_filters=[64, 64, 64, 64],
        stackwise_num_blocks=[1, 1, 1, 1], stackwise_num_strides=[1, 2, 2, 2], block_type="basic_block",
        use_pre_activation=False, image_shape=(None, None, 3))
    backbone = keras_hub.models.RetinaNetBackbone(image_encoder=encoder, min_level=3, max_level=5, use_p5=False,
                                                  image_shape=(64, 64, 3))
    return keras_hub.models.RetinaNetObjectDetector(backbone=backbone, num_classes=3, bounding_box_format="yxyx",
                                                    preprocessor=None, pre_logits_num_conv_layers=1)


def detection_batches(boxes: int = 4):
    """Images with boxes (``yxyx`` pixels) and their classes, -1 where an image has fewer boxes."""
    rng = np.random.default_rng(0)
    corner = rng.uniform(0, 16, (2 * BATCH, boxes, 2))
    size = rng.uniform(28, 48, (2 * BATCH, boxes, 2))
    classes = rng.integers(0, 3, (2 * BATCH, boxes)).astype("float32")
    classes[:, 2:] = -1
    return (rng.standard_normal((2 * BATCH, 64, 64, 3)).astype("float32"),
            {"boxes": np.concatenate([corner, corner + size], -1).astype("float32"), "labels": classes})


def parseq():
    """KerasHub's PARSeq text recognizer (``experiments/realworld.py``'s): its own ``compute_loss`` runs the
    decoder once per permutation of the label order (layers called by the loss)."""
    return realworld.parseq()


def parseq_batches():
    """Images, the label's tokens after [B] (and [E], then [P] padding), the next tokens, and the label's
    padding mask as the weights (what PARSeq's preprocessor gives)."""
    assert realworld.BATCH == BATCH
    return realworld.batches("text_recognition", 2)


def d_fine_batches(boxes: int = 2):
    """Images with boxes (centre and size, as fractions of the image) and their classes."""
    rng = np.random.default_rng(0)
    centre = rng.uniform(0.3, 0.7, (2 * BATCH, boxes, 2))
    size = rng.uniform(0.1, 0.3, (2 * BATCH, boxes, 2))
    return (rng.uniform(0, 1, (2 * BATCH, 32, 32, 3)).astype("float32"),
            {"boxes": np.concatenate([centre, size], -1).astype("float32"),
             "labels": rng.integers(0, realworld.SEGMENT_CLASSES, (2 * BATCH, boxes)).astype("int32")})


def lm_batches():
    x, _ = text_batches(False)
    return x, np.roll(x["token_ids"], -1, axis=1)


def segmentation_batches():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((2 * BATCH, 32, 32, 3)).astype("float32"),
            np.eye(3, dtype="float32")[rng.integers(0, 3, (2 * BATCH, 32, 32))])


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
    "qwen3_5": (qwen3_5, lm_batches),
    "segformer": (segformer, segmentation_batches),
    "bert_mlm": (bert_mlm, masked_lm_batches),
    "retinanet": (retinanet, detection_batches),
    "d_fine": (realworld.d_fine, d_fine_batches),
    "parseq": (parseq, parseq_batches),
}
BUDGETS = {"retinanet": "80% activations"}


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
        if name != "parseq":  # PARSeq compiled itself in __init__ (its loss needs its tokenizer's pad id)
            model.compile()   # the task's own defaults: its loss, optimizer and metrics
    x, y, *w = data()
    w = w[0] if w else None
    trainer = checkmate.tf2.RematModel(other, budget=BUDGETS.get(name, "50%"))
    with _compat.grappler_disabled():       # the same kernels as the generated step's
        want = losses_of(plain, x, y, w)
    got = losses_of(trainer, x, y, w)
    np.testing.assert_allclose(got, want, rtol=1e-4)

    step = trainer.compiled_step()
    assert_runs_the_plain_kernels(step, other, x, y, w)
    sim = simulate(step.graph, step.schedule)
    assert sim.valid
    assert sim.peak_memory_bytes <= step.predicted.budget_bytes
    assert step.lowered.level == "mixed"
    # every layer that runs other layers (the backbone, its transformer blocks, their attention) is
    # split: none of them names a node of its own
    split_layers = step.lowered.metadata["split_layers"]
    # each reason is a line a user reads: a node merged from a cycle of many groups (Qwen3.5's linear
    # attention backward) is named by its first group and how many joined it, not by all of their names
    assert max(len(line) for line in split_layers) < 400, max(split_layers, key=len)[:400]
    composites = {line.split(":")[0] for line in split_layers if "runs" in line}
    # attention inside a block inside the backbone (the detector: its heads, run once per level)
    assert any(c.count("/") >= (0 if name == "retinanet" else 2) for c in composites), sorted(composites)
    nodes = {n.split(":")[0] for n in step.graph.names}
    assert not composites & nodes
    # and their backward is split with them: each has backward nodes of the layers inside it
    for composite in composites:
        if name == "retinanet" and not any(n.startswith(composite + "/") for n in nodes):
            continue        # a head call of the detector's whose ops the step does not run (no node at all)
        if name == "parseq" and composite.startswith("par_seq_backbone"):
            continue        # the forward pass, whose output only the metrics read: the loss runs encoder and decoder again
        assert any(n.startswith(composite + "/") and "_grad" in n for n in nodes), composite
