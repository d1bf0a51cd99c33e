"""Real models through ``RematModel`` with a budget only, beside plain Keras ``fit``.

KerasHub tasks (GPT-2, Llama, OPT, Qwen and Gemma causal LMs; BERT, DistilBERT, RoBERTa and ALBERT
classifiers; a ViT) and keras.applications models (ResNet50, EfficientNetB0 and V2B0, MobileNetV3Small,
ConvNeXtTiny, DenseNet121, NASNetMobile at 64x64; InceptionV3 and Xception at 75x75, their smallest
inputs) at small random-init configurations (no download), batch 8. For each model:

* ``RematModel(model, budget=B)`` and nothing else (a KerasHub task keeps its own ``compile()``
  defaults; a keras.applications model is compiled with SGD and its classification loss, the same
  for both runs): the graph's nodes and the level ``auto`` chose (``mixed`` when it looked inside
  nested models or composite layers), the compile time (lowering, solving, code generation, pricing
  the recomputations in place), the plan's cost at the budget and the step-time ratio compile
  predicts (``Prediction.time_overhead``);
* on the same lowered graph, the predicted overhead of the ``auto`` strategy at 50% and 25% of the
  activation memory (``"50% activations"``: the memory above what every schedule holds), or the
  smallest feasible share when that is infeasible;
* the step's measured peak memory against the plain step's (the device allocator's peak above what
  was resident, :func:`checkmate.tf2.measure_peak_memory`);
* the losses of the first two batches against plain ``fit`` from the same weights (relative
  difference), and the epoch time of ``fit`` against plain ``fit`` (epochs interleaved, each round
  starting one further on, the first epoch of each, with its tracing and compiling, left out), the
  minimum of the timed epochs (the median beside it), in wall time and in the process's CPU time
  (which other jobs on a shared machine disturb less); beside it a control, a second plain model
  from the same weights timed in the same rounds, whose ratio to the first is the noise floor.

B is ``"50%"`` (of checkpoint-all's peak) for transformers and language models and ``"50%
activations"`` for CNNs, whose weights dominate the step at these sizes (``"70% activations"`` for
InceptionV3 and Xception, which cannot go below about 62% and 65% of theirs: :data:`BUDGETS`).

Writes experiments/results/realworld.csv and realworld.md (the table and the command).

    python experiments/realworld.py                          # every model (~30-60 min on 2 CPU cores)
    python experiments/realworld.py --models gpt2,resnet50 --epochs 3

By name only (:data:`EXTRA_MODELS`): MobileNetV2, DeiT, BART and T5 (``Seq2SeqLM``: encoder and
decoder tokens), DeBERTa-v3 and XLM-RoBERTa classifiers, Mistral, Mixtral (4 experts), Falcon, Bloom,
Qwen3, Qwen3-MoE (4 experts, top 2), Phi-3 and GPT-NeoX causal LMs; KerasHub's ResNet and DenseNet
classifiers; keras.applications EfficientNetB2, MobileNetV3Large, ResNet50V2, ConvNeXtSmall,
DenseNet169, InceptionResNetV2, MobileNet and ResNet101; KerasHub's Gemma3 causal LM (text only),
RoformerV2 classifier and VGG classifier (a functional backbone, then a head of a 7x7 convolution);
KerasHub's Swin Transformer, CSPNet (CSP-DarkNet), MiT and Xception classifiers, GPT-OSS (4 experts,
top 2), SmolLM3 and RWKV-7 causal LMs; Qwen3.5 (gated delta-rule linear attention), Gemma4 (text only,
position ids), Qwen-MoE (4 experts, top 2, a shared expert), Qwen2 and Llama3 causal LMs, the FNet
classifier (token and segment ids), the ESM protein classifier (token ids only), KerasHub's HGNetV2
classifier and the SegFormer segmenter (one-hot labels per pixel, the task's own loss); KerasHub's
RetinaNet detector and BASNet segmenter (each with a ``compute_loss`` of its own), the D-FINE detector,
and the PARSeq text recognizer (its ``compute_loss`` runs its decoder once per permutation of the label).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from common import RESULTS, fmt_ratio, fmt_seconds, markdown_table, write_csv, write_meta  # noqa: E402

BATCH = 8
SEQUENCE = 128
IMAGE = 64
CLASSES = 10
SEGMENT_CLASSES = 4
VOCAB = 2000
# transformer width: large enough that a step's compute, not its dispatch, sets the epoch time
HIDDEN = 256

FIELDS = ["model", "kind", "parameters", "budget", "nodes", "level", "split_layers", "compile_seconds",
          "strategy_status", "overhead_at_budget", "time_overhead_at_budget", "overhead_50pct_activations", "overhead_25pct_activations",
          "measured_peak_bytes", "plain_peak_bytes", "peak_over_plain", "loss_rel_diff_batch1",
          "loss_rel_diff_batch2", "epoch_seconds", "plain_epoch_seconds", "epoch_over_plain", "epoch_cpu_seconds",
          "plain_epoch_cpu_seconds", "epoch_cpu_over_plain", "epoch_seconds_median", "plain_epoch_seconds_median",
          "epoch_over_plain_median", "epoch_cpu_seconds_median", "plain_epoch_cpu_seconds_median",
          "epoch_cpu_over_plain_median", "control_over_plain", "control_cpu_over_plain", "control_over_plain_median",
          "control_cpu_over_plain_median"]


# ------------------------------------------------------------------------------------------ models
def _hub():
    import keras_hub

    return keras_hub


def _causal_lm(family: str):
    """A KerasHub ``<family>CausalLM`` on a small random-init ``<family>Backbone`` (2 layers, 4 heads)."""
    hub = _hub()
    backbone = getattr(hub.models, f"{family}Backbone")(
        vocabulary_size=VOCAB, num_layers=2, num_heads=4, hidden_dim=HIDDEN, intermediate_dim=4 * HIDDEN,
        max_sequence_length=SEQUENCE)
    return getattr(hub.models, f"{family}CausalLM")(backbone=backbone, preprocessor=None)


def gpt2():
    return _causal_lm("GPT2")


def llama():
    hub = _hub()
    backbone = hub.models.LlamaBackbone(vocabulary_size=VOCAB, num_layers=2, num_query_heads=4,
                                        num_key_value_heads=2, hidden_dim=HIDDEN, intermediate_dim=2 * HIDDEN)
    return hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)


def _text_classifier(family: str, **extra):
    """A KerasHub ``<family>TextClassifier`` on a small random-init ``<family>Backbone`` (2 layers)."""
    hub = _hub()
    backbone = getattr(hub.models, f"{family}Backbone")(
        vocabulary_size=VOCAB, num_layers=2, num_heads=4, hidden_dim=HIDDEN, intermediate_dim=4 * HIDDEN,
        max_sequence_length=SEQUENCE, **extra)
    return getattr(hub.models, f"{family}TextClassifier")(backbone=backbone, num_classes=4, preprocessor=None)


def bert():
    return _text_classifier("Bert")


def distilbert():
    return _text_classifier("DistilBert")


def vit():
    hub = _hub()
    backbone = hub.models.ViTBackbone(image_shape=(IMAGE, IMAGE, 3), patch_size=8, num_layers=2, num_heads=4,
                                      hidden_dim=HIDDEN, mlp_dim=2 * HIDDEN)
    return hub.models.ViTImageClassifier(backbone=backbone, num_classes=CLASSES, preprocessor=None)


def deit():
    hub = _hub()
    backbone = hub.models.DeiTBackbone(image_shape=(IMAGE, IMAGE, 3), patch_size=8, num_layers=2, num_heads=4,
                                       hidden_dim=HIDDEN, intermediate_dim=2 * HIDDEN)
    return hub.models.DeiTImageClassifier(backbone=backbone, num_classes=CLASSES, preprocessor=None)


def roberta():
    return _text_classifier("Roberta")


def albert():
    return _text_classifier("Albert", embedding_dim=128)


def opt():
    return _causal_lm("OPT")


def qwen():
    hub = _hub()
    backbone = hub.models.QwenBackbone(vocabulary_size=VOCAB, num_layers=2, num_query_heads=4, num_key_value_heads=2,
                                       hidden_dim=HIDDEN, intermediate_dim=2 * HIDDEN)
    return hub.models.QwenCausalLM(backbone=backbone, preprocessor=None)


def gemma():
    hub = _hub()
    backbone = hub.models.GemmaBackbone(vocabulary_size=VOCAB, num_layers=2, num_query_heads=4, num_key_value_heads=1,
                                        hidden_dim=HIDDEN, intermediate_dim=2 * HIDDEN, head_dim=HIDDEN // 4)
    return hub.models.GemmaCausalLM(backbone=backbone, preprocessor=None)


def _causal_lm_of(family: str, **heads):
    """A KerasHub ``<family>CausalLM`` on a small random-init backbone (2 layers), the backbone's own
    names for its head counts in ``heads``."""
    def build():
        hub = _hub()
        backbone = getattr(hub.models, f"{family}Backbone")(vocabulary_size=VOCAB, num_layers=2, hidden_dim=HIDDEN,
                                                            intermediate_dim=2 * HIDDEN, **heads)
        return getattr(hub.models, f"{family}CausalLM")(backbone=backbone, preprocessor=None)
    return build


def bart():
    hub = _hub()
    backbone = hub.models.BartBackbone(vocabulary_size=VOCAB, num_layers=2, num_heads=4, hidden_dim=HIDDEN,
                                       intermediate_dim=2 * HIDDEN, max_sequence_length=SEQUENCE)
    return hub.models.BartSeq2SeqLM(backbone=backbone, preprocessor=None)


def t5():
    hub = _hub()
    backbone = hub.models.T5Backbone(vocabulary_size=VOCAB, num_layers=2, num_heads=4, hidden_dim=HIDDEN,
                                     intermediate_dim=2 * HIDDEN)
    return hub.models.T5Seq2SeqLM(backbone=backbone, preprocessor=None)


def deberta():
    return _text_classifier("DebertaV3")


def xlm_roberta():
    return _text_classifier("XLMRoberta")


def hub_resnet():
    """KerasHub's ResNet classifier on a small bottleneck backbone (three stacks of two blocks)."""
    hub = _hub()
    backbone = hub.models.ResNetBackbone(
        input_conv_filters=[64], input_conv_kernel_sizes=[7], stackwise_num_filters=[64, 64, 128],
        stackwise_num_blocks=[2, 2, 2], stackwise_num_strides=[1, 2, 2], block_type="bottleneck_block",
        image_shape=(IMAGE, IMAGE, 3))
    return hub.models.ResNetImageClassifier(backbone=backbone, num_classes=CLASSES, preprocessor=None)


def hub_densenet():
    """KerasHub's DenseNet classifier on a small backbone (dense blocks of 2, 4, 4 and 2 layers)."""
    hub = _hub()
    backbone = hub.models.DenseNetBackbone(stackwise_num_repeats=[2, 4, 4, 2], image_shape=(IMAGE, IMAGE, 3))
    return hub.models.DenseNetImageClassifier(backbone=backbone, num_classes=CLASSES, preprocessor=None)


def gemma3():
    """KerasHub's Gemma3 causal LM, text only (2 layers, sliding-window attention of 64 tokens)."""
    hub = _hub()
    backbone = hub.models.Gemma3Backbone(
        vocabulary_size=VOCAB, image_size=IMAGE, num_layers=2, num_query_heads=4, num_key_value_heads=1,
        hidden_dim=HIDDEN, intermediate_dim=2 * HIDDEN, head_dim=HIDDEN // 4, use_post_ffw_norm=True,
        use_post_attention_norm=True, use_sliding_window_attention=True, sliding_window_size=64)
    return hub.models.Gemma3CausalLM(backbone=backbone, preprocessor=None)


def roformer_v2():
    hub = _hub()
    backbone = hub.models.RoformerV2Backbone(vocabulary_size=VOCAB, num_layers=2, num_heads=4, hidden_dim=HIDDEN,
                                             intermediate_dim=4 * HIDDEN, head_size=HIDDEN // 4)
    return hub.models.RoformerV2TextClassifier(backbone=backbone, num_classes=4, preprocessor=None)


def hub_vgg():
    """KerasHub's VGG classifier on a small backbone: a functional backbone, then a head whose first
    layer is a 7x7 convolution (pooling="avg")."""
    hub = _hub()
    backbone = hub.models.VGGBackbone(stackwise_num_repeats=[2, 2, 3], stackwise_num_filters=[32, 64, 128],
                                      image_shape=(IMAGE, IMAGE, 3))
    return hub.models.VGGImageClassifier(backbone=backbone, num_classes=CLASSES, pooling="avg",
                                         pooling_hidden_dim=256, preprocessor=None)


def smollm3():
    """KerasHub's SmolLM3 causal LM (2 layers, rotary embeddings in the first only)."""
    hub = _hub()
    backbone = hub.models.SmolLM3Backbone(
        vocabulary_size=VOCAB, hidden_dim=HIDDEN, intermediate_dim=2 * HIDDEN, num_layers=2, num_attention_heads=4,
        num_key_value_heads=2, attention_bias=False, attention_dropout=0.0, rope_layer_enabled_list=[True, False],
        layer_types=["attention", "attention"], mlp_bias=False, layer_norm_epsilon=1e-6,
        max_position_embeddings=2 * SEQUENCE, rope_theta=10000.0, partial_rotary_factor=1.0)
    return hub.models.SmolLM3CausalLM(backbone=backbone, preprocessor=None)


def rwkv7():
    """KerasHub's RWKV-7 causal LM (2 layers, hidden 64, heads of 16; its time mixing unrolls the
    recurrence over the tokens in a Python loop on TensorFlow)."""
    hub = _hub()
    backbone = hub.models.RWKV7Backbone(hidden_size=HIDDEN // 4, head_size=16, num_layers=2, vocabulary_size=VOCAB,
                                        intermediate_dim=HIDDEN // 2, gate_lora=16, mv_lora=8, aaa_lora=8,
                                        decay_lora=8)
    return hub.models.RWKV7CausalLM(backbone=backbone, preprocessor=None)


def hub_swin():
    """KerasHub's Swin Transformer classifier (three stages of two blocks, windows of 4x4 patches,
    stochastic depth as the backbone's default)."""
    hub = _hub()
    backbone = hub.models.SwinTransformerBackbone(image_shape=(IMAGE, IMAGE, 3), embed_dim=32, depths=[2, 2, 2],
                                                  num_heads=[2, 4, 8], window_size=4, patch_size=4)
    return hub.models.SwinTransformerImageClassifier(backbone=backbone, num_classes=CLASSES, preprocessor=None)


def hub_cspnet():
    """KerasHub's CSPNet classifier on a small CSP-DarkNet backbone (stages of 1, 2 and 2 dark blocks)."""
    hub = _hub()
    backbone = hub.models.CSPNetBackbone(
        stem_filters=32, stem_kernel_size=3, stem_strides=2, stackwise_depth=[1, 2, 2], stackwise_strides=[2, 2, 2],
        stackwise_num_filters=[64, 128, 256], block_type="dark_block", stage_type="csp", expand_ratio=[2.0, 1.0, 1.0],
        bottle_ratio=[0.5, 1.0, 1.0], block_ratio=[1.0, 0.5, 0.5], down_growth=True, image_shape=(IMAGE, IMAGE, 3))
    return hub.models.CSPNetImageClassifier(backbone=backbone, num_classes=CLASSES, preprocessor=None)


def hub_mit():
    """KerasHub's MiT (SegFormer's encoder) classifier: four stages of one block, spatial-reduction
    attention."""
    hub = _hub()
    backbone = hub.models.MiTBackbone(
        layerwise_depths=[1, 1, 1, 1], num_layers=4, layerwise_num_heads=[1, 2, 2, 4], layerwise_sr_ratios=[8, 4, 2, 1],
        max_drop_path_rate=0.1, layerwise_patch_sizes=[7, 3, 3, 3], layerwise_strides=[4, 2, 2, 2],
        image_shape=(IMAGE, IMAGE, 3), hidden_dims=[32, 64, 96, 128])
    return hub.models.MiTImageClassifier(backbone=backbone, num_classes=CLASSES, preprocessor=None)


def hub_xception():
    """KerasHub's Xception classifier on three stacks of separable convolutions."""
    hub = _hub()
    backbone = hub.models.XceptionBackbone(stackwise_conv_filters=[[32, 64], [128, 128], [256, 256]],
                                           stackwise_pooling=[False, True, True], image_shape=(IMAGE, IMAGE, 3))
    return hub.models.XceptionImageClassifier(backbone=backbone, num_classes=CLASSES, preprocessor=None)


def qwen3_5():
    """KerasHub's Qwen3.5 causal LM (2 layers of its default kinds: gated delta-rule linear attention,
    a recurrence over the tokens unrolled in Python on TensorFlow; 2 key and 4 value heads of 32)."""
    hub = _hub()
    backbone = hub.models.Qwen3_5Backbone(
        vocabulary_size=VOCAB, num_layers=2, num_query_heads=4, num_key_value_heads=2, head_dim=HIDDEN // 4,
        hidden_dim=HIDDEN, intermediate_dim=2 * HIDDEN, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=32, linear_value_head_dim=32)
    return hub.models.Qwen3_5CausalLM(backbone=backbone, preprocessor=None)


def gemma4():
    """KerasHub's Gemma4 causal LM, text only (2 layers, sliding-window attention of 64 tokens); its
    inputs include position ids."""
    hub = _hub()
    backbone = hub.models.Gemma4Backbone(
        vocabulary_size=VOCAB, image_size=None, num_layers=2, num_query_heads=4, num_key_value_heads=2,
        hidden_dim=HIDDEN, intermediate_dim=2 * HIDDEN, head_dim=HIDDEN // 4, sliding_window_size=64)
    return hub.models.Gemma4CausalLM(backbone=backbone, preprocessor=None)


def qwen_moe():
    """KerasHub's Qwen-MoE causal LM (4 experts, top 2, and a shared expert)."""
    hub = _hub()
    backbone = hub.models.QwenMoeBackbone(
        vocabulary_size=VOCAB, num_layers=2, num_query_heads=4, num_key_value_heads=2, hidden_dim=HIDDEN,
        intermediate_dim=2 * HIDDEN, moe_intermediate_dim=HIDDEN, shared_expert_intermediate_dim=HIDDEN,
        num_experts=4, top_k=2)
    return hub.models.QwenMoeCausalLM(backbone=backbone, preprocessor=None)


def fnet():
    """KerasHub's FNet classifier (Fourier transforms in place of attention; token and segment ids)."""
    hub = _hub()
    backbone = hub.models.FNetBackbone(vocabulary_size=VOCAB, num_layers=2, hidden_dim=HIDDEN,
                                       intermediate_dim=2 * HIDDEN, max_sequence_length=SEQUENCE)
    return hub.models.FNetTextClassifier(backbone=backbone, num_classes=4, preprocessor=None)


def esm():
    """KerasHub's ESM protein classifier (rotary embeddings; token ids only)."""
    hub = _hub()
    backbone = hub.models.ESMBackbone(vocabulary_size=VOCAB, num_layers=2, num_heads=4, hidden_dim=HIDDEN,
                                      intermediate_dim=2 * HIDDEN, max_sequence_length=SEQUENCE)
    return hub.models.ESMProteinClassifier(backbone=backbone, num_classes=4, preprocessor=None)


def hub_hgnetv2():
    """KerasHub's HGNetV2 classifier (three stages, its docstring's small configuration)."""
    hub = _hub()
    backbone = hub.models.HGNetV2Backbone(
        depths=[1, 2, 4], embedding_size=32, hidden_sizes=[64, 128, 256], stem_channels=[3, 16, 32],
        hidden_act="relu", use_learnable_affine_block=False,
        stackwise_stage_filters=[(32, 16, 64, 1, 1, 3), (64, 32, 128, 2, 1, 3), (128, 64, 256, 4, 1, 3)],
        apply_downsample=[False, True, True], use_lightweight_conv_block=[False, False, False],
        image_shape=(IMAGE, IMAGE, 3))
    return hub.models.HGNetV2ImageClassifier(backbone=backbone, num_classes=CLASSES, preprocessor=None)


def segformer():
    """KerasHub's SegFormer segmenter on a small MiT encoder: a per-pixel loss over 4 classes (the
    task's own compile() defaults: one-hot labels)."""
    hub = _hub()
    encoder = hub.models.MiTBackbone(
        layerwise_depths=[1, 1, 1, 1], num_layers=4, layerwise_num_heads=[1, 2, 2, 4], layerwise_sr_ratios=[8, 4, 2, 1],
        max_drop_path_rate=0.1, layerwise_patch_sizes=[7, 3, 3, 3], layerwise_strides=[4, 2, 2, 2],
        image_shape=(IMAGE, IMAGE, 3), hidden_dims=[32, 64, 96, 128])
    backbone = hub.models.SegFormerBackbone(image_encoder=encoder, projection_filters=64)
    return hub.models.SegFormerImageSegmenter(backbone=backbone, num_classes=SEGMENT_CLASSES, preprocessor=None)


def retinanet():
    """KerasHub's RetinaNet detector on a small ResNet (four stages of one basic block, levels 3-5): its
    own ``compute_loss`` turns boxes and classes into its two heads' targets."""
    hub = _hub()
    encoder = hub.models.ResNetBackbone(
        input_conv_filters=[64], input_conv_kernel_sizes=[7], stackwise_num_filters=[64, 64, 128, 128],
        stackwise_num_blocks=[1, 1, 1, 1], stackwise_num_strides=[1, 2, 2, 2], block_type="basic_block",
        use_pre_activation=False, image_shape=(None, None, 3))
    backbone = hub.models.RetinaNetBackbone(image_encoder=encoder, min_level=3, max_level=5, use_p5=False,
                                            image_shape=(IMAGE, IMAGE, 3))
    return hub.models.RetinaNetObjectDetector(backbone=backbone, num_classes=SEGMENT_CLASSES,
                                              bounding_box_format="yxyx", preprocessor=None)


def basnet():
    """KerasHub's BASNet salient-object segmenter on the same small ResNet (32x32 images: a step of its
    refinement module at 64x64 takes seconds on a CPU); its own ``compute_loss`` runs the backbone again
    and sums the loss of every prediction head."""
    hub = _hub()
    encoder = hub.models.ResNetBackbone(
        input_conv_filters=[64], input_conv_kernel_sizes=[7], stackwise_num_filters=[64, 64, 128, 128],
        stackwise_num_blocks=[1, 1, 1, 1], stackwise_num_strides=[1, 2, 2, 2], block_type="basic_block",
        use_pre_activation=False, image_shape=(None, None, 3))
    backbone = hub.models.BASNetBackbone(image_encoder=encoder, num_classes=1, image_shape=(32, 32, 3))
    return hub.models.BASNetImageSegmenter(backbone=backbone, preprocessor=None)


basnet.image_size = 32


def d_fine():
    """KerasHub's D-FINE detector, small (HGNetV2 of two stages, 10 queries, two decoder layers, 32x32):
    its query generator maps over the batch (a ``While`` loop) and its own loss matches boxes inside
    conds and loops."""
    hub = _hub()
    encoder = hub.models.HGNetV2Backbone(
        stem_channels=[3, 16, 16], stackwise_stage_filters=[[16, 16, 32, 1, 1, 3], [32, 16, 64, 1, 1, 3]],
        apply_downsample=[False, True], use_lightweight_conv_block=[False, False], depths=[1, 1],
        hidden_sizes=[32, 64], embedding_size=16, use_learnable_affine_block=True, hidden_act="relu",
        image_shape=(None, None, 3), out_features=["stage1", "stage2"], data_format="channels_last")
    backbone = hub.models.DFineBackbone(
        backbone=encoder, decoder_in_channels=[32, 32], encoder_hidden_dim=32, num_denoising=10,
        num_labels=SEGMENT_CLASSES, hidden_dim=32, learn_initial_query=False, num_queries=10,
        anchor_image_size=(32, 32), feat_strides=[4, 8], num_feature_levels=2, encoder_in_channels=[32, 64],
        encode_proj_layers=[1], num_attention_heads=2, encoder_ffn_dim=64, num_encoder_layers=1,
        hidden_expansion=0.5, depth_multiplier=0.5, eval_idx=-1, num_decoder_layers=2, decoder_attention_heads=2,
        decoder_ffn_dim=64, decoder_method="default", decoder_n_points=[2, 2], lqe_hidden_dim=16, num_lqe_layers=1,
        out_features=["stage1", "stage2"], image_shape=(32, 32, 3), data_format="channels_last", seed=0)
    return hub.models.DFineObjectDetector(backbone=backbone, num_classes=SEGMENT_CLASSES, bounding_box_format="yxyx",
                                          preprocessor=None)


d_fine.image_size = 32

PARSEQ_VOCAB, PARSEQ_LABEL = 97, 8      # the tokenizer's default characters with [E], [B] and [P]


def parseq():
    """KerasHub's PARSeq text recognizer (a one-layer ViT encoder, one decoder layer, 32x64 images, labels
    of up to 8 characters): its own ``compute_loss`` runs the decoder again once per permutation of the
    label order. Its ``__init__`` compiles with its tokenizer's pad id, so it is built with a
    preprocessor and then used without one."""
    hub = _hub()
    encoder = hub.models.ViTBackbone(
        image_shape=(32, 64, 3), patch_size=(8, 8), num_layers=1, num_heads=2, hidden_dim=32, mlp_dim=64,
        use_class_token=False, dropout_rate=0.0, attention_dropout=0.0, name="encoder")
    backbone = hub.models.PARSeqBackbone(
        image_encoder=encoder, vocabulary_size=PARSEQ_VOCAB, max_label_length=PARSEQ_LABEL, decoder_hidden_dim=32,
        num_decoder_layers=1, num_decoder_heads=2, decoder_mlp_dim=64, dropout_rate=0.0, attention_dropout=0.0)
    tokenizer = hub.tokenizers.PARSeqTokenizer(max_label_length=PARSEQ_LABEL)
    preprocessor = hub.models.PARSeqCausalLMPreprocessor(image_converter=None, tokenizer=tokenizer,
                                                         sequence_length=PARSEQ_LABEL)
    task = hub.models.PARSeqCausalLM(backbone=backbone, preprocessor=preprocessor, seed=0)
    task.preprocessor = None
    return task


# keras.applications models that refuse inputs below a size of their own (InceptionV3 and
# InceptionResNetV2: 75, Xception: 71)
IMAGE_SIZES = {"InceptionV3": 75, "Xception": 75, "InceptionResNetV2": 75}


def _application(name):
    def build():
        import keras

        size = IMAGE_SIZES.get(name, IMAGE)
        return getattr(keras.applications, name)(weights=None, input_shape=(size, size, 3), classes=CLASSES)
    build.image_size = IMAGE_SIZES.get(name, IMAGE)
    return build


# name -> (builder, data kind)
MODELS = {
    "gpt2": (gpt2, "lm"),
    "llama": (llama, "lm"),
    "bert": (bert, "bert"),
    "vit": (vit, "image"),
    "distilbert": (distilbert, "distilbert"),
    "resnet50": (_application("ResNet50"), "image"),
    "efficientnetb0": (_application("EfficientNetB0"), "image"),
    "mobilenetv3small": (_application("MobileNetV3Small"), "image"),
    "convnexttiny": (_application("ConvNeXtTiny"), "image"),
    "densenet121": (_application("DenseNet121"), "image"),
    "nasnetmobile": (_application("NASNetMobile"), "image"),
    "inceptionv3": (_application("InceptionV3"), "image"),
    "xception": (_application("Xception"), "image"),
    "efficientnetv2b0": (_application("EfficientNetV2B0"), "image"),
    "roberta": (roberta, "distilbert"),
    "albert": (albert, "bert"),
    "opt": (opt, "lm"),
    "qwen": (qwen, "lm"),
    "gemma": (gemma, "lm"),
}
# by name only (--models), not in the default run
EXTRA_MODELS = {
    "mobilenetv2": (_application("MobileNetV2"), "image"),
    "deit": (deit, "image"),
    "bart": (bart, "seq2seq"),
    "t5": (t5, "seq2seq"),
    "deberta": (deberta, "distilbert"),
    "xlmr": (xlm_roberta, "distilbert"),
    "mistral": (_causal_lm_of("Mistral", num_query_heads=4, num_key_value_heads=2), "lm"),
    "mixtral": (_causal_lm_of("Mixtral", num_query_heads=4, num_key_value_heads=2, num_experts=4), "lm"),
    "falcon": (_causal_lm_of("Falcon", num_attention_heads=4), "lm"),
    "bloom": (_causal_lm_of("Bloom", num_heads=4), "lm"),
    "qwen3": (_causal_lm_of("Qwen3", num_query_heads=4, num_key_value_heads=2, head_dim=HIDDEN // 4), "lm"),
    "qwen3moe": (_causal_lm_of("Qwen3Moe", num_query_heads=4, num_key_value_heads=2, head_dim=HIDDEN // 4,
                               moe_intermediate_dim=HIDDEN, num_experts=4, top_k=2), "lm"),
    "phi3": (_causal_lm_of("Phi3", num_query_heads=4, num_key_value_heads=2), "lm"),
    "gptneox": (_causal_lm_of("GPTNeoX", num_heads=4), "lm"),
    "hubresnet": (hub_resnet, "image"),
    "hubdensenet": (hub_densenet, "image"),
    "efficientnetb2": (_application("EfficientNetB2"), "image"),
    "mobilenetv3large": (_application("MobileNetV3Large"), "image"),
    "resnet50v2": (_application("ResNet50V2"), "image"),
    "convnextsmall": (_application("ConvNeXtSmall"), "image"),
    "densenet169": (_application("DenseNet169"), "image"),
    "inceptionresnetv2": (_application("InceptionResNetV2"), "image"),
    "gemma3": (gemma3, "lm"),
    "roformerv2": (roformer_v2, "bert"),
    "hubvgg": (hub_vgg, "image"),
    "mobilenet": (_application("MobileNet"), "image"),
    "resnet101": (_application("ResNet101"), "image"),
    "gptoss": (_causal_lm_of("GptOss", num_query_heads=4, num_key_value_heads=2, num_experts=4, top_k=2,
                             head_dim=HIDDEN // 4), "lm"),
    "smollm3": (smollm3, "lm"),
    "rwkv7": (rwkv7, "lm"),
    "hubswin": (hub_swin, "image"),
    "hubcspnet": (hub_cspnet, "image"),
    "hubmit": (hub_mit, "image"),
    "hubxception": (hub_xception, "image"),
    "qwen3_5": (qwen3_5, "lm"),
    "gemma4": (gemma4, "lm_positions"),
    "qwenmoe": (qwen_moe, "lm"),
    "qwen2": (_causal_lm_of("Qwen2", num_query_heads=4, num_key_value_heads=2), "lm"),
    "llama3": (_causal_lm_of("Llama3", num_query_heads=4, num_key_value_heads=2), "lm"),
    "fnet": (fnet, "segments"),
    "esm": (esm, "tokens"),
    "hubhgnetv2": (hub_hgnetv2, "image"),
    "segformer": (segformer, "segmentation"),
    "retinanet": (retinanet, "detection"),
    "basnet": (basnet, "saliency"),
    "dfine": (d_fine, "centred_boxes"),
    "parseq": (parseq, "text_recognition"),
}
# KerasHub image tasks, which compile themselves (the others of kind "image" are compiled by twins())
HUB_IMAGE_TASKS = {"vit", "deit", "hubresnet", "hubdensenet", "hubvgg", "hubswin", "hubcspnet", "hubmit",
                   "hubxception", "hubhgnetv2", "segformer", "retinanet", "basnet", "dfine", "parseq"}
TRANSFORMERS = {"lm", "lm_positions", "bert", "distilbert", "seq2seq", "segments", "tokens"}
# CNNs whose smallest feasible share of the activations is above 50% at these sizes (InceptionV3 and
# Xception at 75x75: 61.8% and 64.9%, their largest layers' working sets): trained at a budget they meet
# KerasHub's small VGG: 71.2% of its activations at the least
BUDGETS = {"inceptionv3": "70% activations", "xception": "70% activations", "hubvgg": "80% activations",
           # weights and gradients outweigh the activations: 71.9% and 64.9% of them the least found (realworld_loss_calls.md)
           "retinanet": "80% activations", "basnet": "75% activations",
           # a transformer detector: at half of checkpoint-all, as the language models
           "dfine": "50%", "parseq": "50%",
           # RWKV-7's smallest budget found: 59.5% of checkpoint-all (docs/design.md, running sums)
           "rwkv7": "70%"}


def model_entry(name: str) -> tuple:
    """``(builder, data kind)`` of a model of the default run or of :data:`EXTRA_MODELS`."""
    return MODELS[name] if name in MODELS else EXTRA_MODELS[name]


def batches(kind: str, count: int, seed: int = 0, image: int = IMAGE):
    """``count`` batches of BATCH rows as numpy arrays ``(x, y)`` (images of ``image`` x ``image`` pixels)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    n = count * BATCH
    if kind == "lm":
        ids = rng.integers(1, VOCAB, (n, SEQUENCE)).astype("int32")
        mask = np.ones((n, SEQUENCE), "int32")
        return {"token_ids": ids, "padding_mask": mask}, np.roll(ids, -1, axis=1)
    if kind == "bert":
        ids = rng.integers(1, VOCAB, (n, SEQUENCE)).astype("int32")
        return ({"token_ids": ids, "padding_mask": np.ones_like(ids), "segment_ids": np.zeros_like(ids)},
                rng.integers(0, 4, (n,)).astype("int32"))
    if kind == "seq2seq":      # an encoder's and a decoder's tokens; the decoder's next tokens the labels
        enc = rng.integers(1, VOCAB, (n, SEQUENCE)).astype("int32")
        dec = rng.integers(1, VOCAB, (n, SEQUENCE)).astype("int32")
        ones = np.ones((n, SEQUENCE), "int32")
        return ({"encoder_token_ids": enc, "encoder_padding_mask": ones, "decoder_token_ids": dec,
                 "decoder_padding_mask": ones}, np.roll(dec, -1, axis=1))
    if kind == "lm_positions":  # token ids, padding mask and position ids (Gemma4)
        ids = rng.integers(1, VOCAB, (n, SEQUENCE)).astype("int32")
        positions = np.tile(np.arange(SEQUENCE, dtype="int32"), (n, 1))
        return ({"token_ids": ids, "padding_mask": np.ones_like(ids), "position_ids": positions},
                np.roll(ids, -1, axis=1))
    if kind == "segments":      # token and segment ids, no padding mask (FNet)
        ids = rng.integers(1, VOCAB, (n, SEQUENCE)).astype("int32")
        return {"token_ids": ids, "segment_ids": np.zeros_like(ids)}, rng.integers(0, 4, (n,)).astype("int32")
    if kind == "tokens":        # token ids only (ESM)
        ids = rng.integers(1, VOCAB, (n, SEQUENCE)).astype("int32")
        return {"token_ids": ids}, rng.integers(0, 4, (n,)).astype("int32")
    if kind == "segmentation":  # images and one-hot labels per pixel
        images = rng.standard_normal((n, image, image, 3)).astype("float32")
        return images, np.eye(SEGMENT_CLASSES, dtype="float32")[rng.integers(0, SEGMENT_CLASSES, (n, image, image))]
    if kind == "detection":     # images, and boxes (yxyx pixels) with their classes, -1 past each image's 2
        corner = rng.uniform(0, image / 4, (n, 4, 2))
        size = rng.uniform(image * 7 / 16, image * 3 / 4, (n, 4, 2))
        classes = rng.integers(0, SEGMENT_CLASSES, (n, 4)).astype("float32")
        classes[:, 2:] = -1
        return (rng.standard_normal((n, image, image, 3)).astype("float32"),
                {"boxes": np.concatenate([corner, corner + size], -1).astype("float32"), "labels": classes})
    if kind == "centred_boxes":  # images in [0, 1], two boxes each (centre and size, fractions of the image)
        centre = rng.uniform(0.3, 0.7, (n, 2, 2))
        size = rng.uniform(0.1, 0.3, (n, 2, 2))
        return (rng.uniform(0, 1, (n, image, image, 3)).astype("float32"),
                {"boxes": np.concatenate([centre, size], -1).astype("float32"),
                 "labels": rng.integers(0, SEGMENT_CLASSES, (n, 2)).astype("int32")})
    if kind == "text_recognition":  # 32x64 images; [B], a label of 2-6 characters, [E], [P] padding; weights
        full = np.full((n, PARSEQ_LABEL + 1), PARSEQ_VOCAB - 1, dtype="int32")
        mask = np.zeros((n, PARSEQ_LABEL + 1), dtype="int32")
        for i, k in enumerate(rng.integers(2, PARSEQ_LABEL - 1, size=n)):
            full[i, 0] = PARSEQ_VOCAB - 2
            full[i, 1:k + 1] = rng.integers(1, PARSEQ_VOCAB - 2, size=k)
            full[i, k + 1] = 0
            mask[i, :k + 2] = 1
        # the label's padding mask weighs the loss (PARSeq's loss requires it: its preprocessor gives it)
        return ({"images": rng.random((n, 32, 64, 3)).astype("float32"), "token_ids": full[:, :-1],
                 "padding_mask": mask[:, :-1]}, full[:, 1:], mask[:, 1:].astype("float32"))
    if kind == "saliency":      # images and a binary mask per pixel
        return (rng.standard_normal((n, image, image, 3)).astype("float32"),
                (rng.random((n, image, image, 1)) > 0.5).astype("float32"))
    if kind == "distilbert":    # no segment ids
        ids = rng.integers(1, VOCAB, (n, SEQUENCE)).astype("int32")
        return {"token_ids": ids, "padding_mask": np.ones_like(ids)}, rng.integers(0, 4, (n,)).astype("int32")
    return (rng.standard_normal((n, image, image, 3)).astype("float32"),
            rng.integers(0, CLASSES, (n,)).astype("int32"))


def twins(name: str):
    """Two models of ``name`` with the same weights (and dropout seeds), compiled the same way."""
    import keras

    build, kind = model_entry(name)
    keras.utils.set_random_seed(0)
    plain = build()
    keras.utils.set_random_seed(0)
    other = build()
    other.set_weights(plain.get_weights())
    if kind == "image" and name not in HUB_IMAGE_TASKS:
        for m in (plain, other):
            m.compile(keras.optimizers.SGD(0.01, momentum=0.9), "sparse_categorical_crossentropy")
    return plain, other, kind


# ------------------------------------------------------------------------------------------ measuring
def _losses_callback(store: list):
    import keras

    return keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: store.append(float(logs["loss"])))


def _activation_overhead(lowered, share: str, time_limit_s: float) -> str:
    import checkmate
    from checkmate.budgets import describe_fraction

    try:
        r = checkmate.solve(lowered.graph, share, strategy="auto", time_limit_s=time_limit_s)
    except checkmate.errors.InfeasibleBudgetError as exc:
        minimum = exc.min_feasible_budget_bytes
        return ("infeasible" + (f" (min{describe_fraction(minimum, lowered.graph, share)[1:]})"
                                if minimum is not None else ""))
    except checkmate.errors.TimeLimitError:
        # a share near the smallest feasible one, where no strategy had a schedule within the limit
        return f"none within {time_limit_s:g} s"
    return f"{r.compute_cost / lowered.graph.total_cost:.3f}x"


def run_model(name: str, epochs: int, steps: int, time_limit_s: float) -> dict:
    import numpy as np
    import tensorflow as tf

    import checkmate
    import checkmate.tf2
    from checkmate.tf2.memory import measure_step

    plain, other, kind = twins(name)
    budget = BUDGETS.get(name, "50%" if kind in TRANSFORMERS else "50% activations")
    data = batches(kind, steps, image=getattr(model_entry(name)[0], "image_size", IMAGE))
    x, y = data[:2]
    weights = data[2] if len(data) > 2 else None     # sample weights, where the task needs them
    trainer = checkmate.tf2.RematModel(other, budget=budget)
    if not trainer.compiled and checkmate.tf2.losses.compile_arguments_of(other) is None:
        raise SystemExit(f"{name}: not compiled")
    if checkmate.tf2.losses.compile_arguments_of(other) is not None:
        trainer.compile()
    else:
        trainer.compile(other.optimizer, other.loss)
    first = tf.nest.map_structure(lambda a: tf.convert_to_tensor(a[:BATCH]), (x, y))
    plain_losses: list = []
    remat_losses: list = []
    plain.fit(x, y, sample_weight=weights, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[_losses_callback(plain_losses)])
    started = time.perf_counter()
    try:
        step = trainer.compiled_step(*first, None if weights is None else tf.convert_to_tensor(weights[:BATCH]))
    except checkmate.errors.InfeasibleBudgetError as exc:
        # a row that says so (the minimum the solvers found), and the next model
        print(f"{name}: {exc}", flush=True)
        minimum = exc.min_feasible_budget_bytes
        return {"model": name, "kind": kind, "budget": budget, "compile_seconds": round(time.perf_counter() - started, 1),
                "strategy_status": str(exc),
                "overhead_at_budget": "infeasible" + (f" (min {minimum} bytes)" if minimum is not None else ""),
                "loss_rel_diff_batch1": "–", "loss_rel_diff_batch2": "–", "epoch_seconds": None,
                "plain_epoch_seconds": None, "epoch_cpu_seconds": None, "plain_epoch_cpu_seconds": None}
    compile_s = time.perf_counter() - started
    trainer.fit(x, y, sample_weight=weights, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                callbacks=[_losses_callback(remat_losses)])
    # plain fit logs the mean of the batches so far: batch 2's own loss is 2 * log2 - log1
    own = lambda logs: [logs[0], 2 * logs[1] - logs[0]]
    diffs = [abs(a - b) / abs(a) for a, b in zip(own(plain_losses), own(remat_losses))]
    # a second plain model from the same weights, timed as the others are: what the same work measures
    # twice on this machine (the noise floor of the ratios), trained once before timing as the others were
    control = twins(name)[0]
    control.fit(x, y, sample_weight=weights, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    times = {"plain": ([], []), "remat": ([], []), "control": ([], [])}   # wall, CPU seconds of each timed epoch
    runs = {"plain": plain, "remat": trainer, "control": control}
    order = list(runs)
    for r in range(epochs):
        # interleaved, each round starting one further on, so that none is always the one run right after
        # another (with the caches and thread pools it left) and a load that comes and goes falls on all
        for side in order[r % 3:] + order[:r % 3]:
            t, c = time.perf_counter(), time.process_time()
            runs[side].fit(x, y, sample_weight=weights, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
            times[side][0].append(time.perf_counter() - t)
            times[side][1].append(time.process_time() - c)
    lowered = step.lowered
    flat = step.function.flat_args(first[0], (first[1], tf.ones((BATCH,), tf.float32) if weights is None
                                              else tf.convert_to_tensor(weights[:BATCH])))
    plain_peak = measure_step(lowered.function, *flat).peak_bytes
    remat_peak = measure_step(step.function.call_flat, *flat).peak_bytes
    row = {
        "model": name, "kind": kind, "parameters": int(sum(np.prod(v.shape) for v in other.trainable_variables)),
        "budget": budget, "nodes": lowered.graph.n, "level": lowered.level,
        "split_layers": len(lowered.metadata.get("split_layers") or ()),
        "compile_seconds": round(compile_s, 1), "strategy_status": step.result.status,
        "overhead_at_budget": round(step.predicted.overhead, 4),
        "time_overhead_at_budget": round(step.predicted.time_overhead, 4),
        "overhead_50pct_activations": _activation_overhead(lowered, "50% activations", time_limit_s),
        "overhead_25pct_activations": _activation_overhead(lowered, "25% activations", time_limit_s),
        "measured_peak_bytes": remat_peak, "plain_peak_bytes": plain_peak,
        "peak_over_plain": round(remat_peak / plain_peak, 3) if plain_peak else None,
        "loss_rel_diff_batch1": f"{diffs[0]:.1e}", "loss_rel_diff_batch2": f"{diffs[1]:.1e}",
    }
    # the minimum is the statistic of the table: other jobs on a shared machine only ever add time to an
    # epoch's fixed work; the median is kept beside it
    for stat, f in (("", np.min), ("_median", np.median)):
        for unit, k in (("", 0), ("_cpu", 1)):
            remat_s, plain_s = float(f(times["remat"][k])), float(f(times["plain"][k]))
            control_s = float(f(times["control"][k]))
            row[f"epoch{unit}_seconds{stat}"] = round(remat_s, 3)
            row[f"plain_epoch{unit}_seconds{stat}"] = round(plain_s, 3)
            row[f"epoch{unit}_over_plain{stat}"] = round(remat_s / plain_s, 3) if plain_s > 0 else None
            row[f"control{unit}_over_plain{stat}"] = round(control_s / plain_s, 3) if plain_s > 0 else None
    print(step.summary(), flush=True)
    print(row, flush=True)
    return row


COLUMNS = [("model", "model"), ("budget", "budget"), ("nodes", "nodes"), ("level", "level"),
           ("split_layers", "layers split"), ("compile", "compile"), ("overhead_at_budget", "overhead at budget"),
           ("time_overhead_at_budget", "predicted step time"),
           ("overhead_50pct_activations", "overhead at 50% act."), ("overhead_25pct_activations", "at 25% act."),
           ("peak_over_plain", "peak / plain"), ("loss", "loss rel. diff (batch 1, 2)"),
           ("epoch", "epoch / plain fit"), ("epoch_cpu", "epoch CPU time / plain fit"),
           ("control", "control: plain twin / plain fit, wall / CPU")]


def source_commit() -> str | None:
    """The commit of the checkout this script runs from, and whether its code was edited since
    (``None`` outside a git checkout)."""
    import subprocess

    def git(*args):
        return subprocess.run(["git", "-C", str(HERE.parent), *args], capture_output=True, text=True, timeout=10)

    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0 or not head.stdout.strip():
            return None
        # the package or the scripts edited since: the results are not that commit's alone
        dirty = git("diff", "--quiet", "HEAD", "--", "checkmate", "experiments").returncode != 0
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + (" with uncommitted changes" if dirty else "")


def write_markdown(path: Path, rows: list[dict], command: str, commit: str | None = None) -> None:
    shown = []
    for row in rows:
        shown.append({**row, "compile": fmt_seconds(row["compile_seconds"]),
                      "overhead_at_budget": (row["overhead_at_budget"] if isinstance(row["overhead_at_budget"], str)
                                             else fmt_ratio(row["overhead_at_budget"])),
                      "time_overhead_at_budget": fmt_ratio(row.get("time_overhead_at_budget")),
                      "loss": f"{row['loss_rel_diff_batch1']}, {row['loss_rel_diff_batch2']}",
                      "epoch": f"{fmt_ratio(row.get('epoch_over_plain'), 3)} ({row['epoch_seconds']} s vs "
                               f"{row['plain_epoch_seconds']} s; median {fmt_ratio(row.get('epoch_over_plain_median'), 3)})",
                      "epoch_cpu": f"{fmt_ratio(row.get('epoch_cpu_over_plain'), 3)} ({row['epoch_cpu_seconds']} s vs "
                                   f"{row['plain_epoch_cpu_seconds']} s; median "
                                   f"{fmt_ratio(row.get('epoch_cpu_over_plain_median'), 3)})",
                      "control": f"{fmt_ratio(row.get('control_over_plain'), 3)} / "
                                 f"{fmt_ratio(row.get('control_cpu_over_plain'), 3)}"})
    path.write_text("# Real models through RematModel with a budget only\n\n"
                    f"Command: `{command}`" + (f" (commit {commit})" if commit else "") + "\n\n"
                    "Epoch times: the minimum of the timed epochs of each (the median in brackets), interleaved, each "
                    "round starting one further on; the minimum is the statistic used, since other jobs on a shared "
                    "machine only ever add time to an epoch's fixed work. The CPU time is the process's, which "
                    "other jobs disturb less than the wall time. The control is a second plain model from the same "
                    "weights timed in the same rounds: what the same work measures twice here, the noise floor of "
                    "the ratios.\n\n"
                    + markdown_table(shown, COLUMNS) + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS),
                   help=f"comma-separated (default: {', '.join(MODELS)}); by name only: {', '.join(EXTRA_MODELS)}")
    p.add_argument("--epochs", type=int, default=8, help="timed epochs of each (interleaved; minimum and median)")
    p.add_argument("--steps", type=int, default=12, help="batches per epoch")
    p.add_argument("--time-limit", type=float, default=60.0, help="time limit of the activation-share solves (s)")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--name", default="realworld", help="file stem of the results")
    args = p.parse_args(argv)
    started = time.perf_counter()
    command = ("python experiments/realworld.py " + " ".join(sys.argv[1:] if argv is None else argv)).strip()
    commit = source_commit()
    rows = []
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        if name not in MODELS and name not in EXTRA_MODELS:
            p.error(f"unknown model {name!r}: one of {', '.join([*MODELS, *EXTRA_MODELS])}")
        rows.append(run_model(name, args.epochs, args.steps, args.time_limit))
        # written after each model, so that a long run leaves what it has measured
        write_csv(args.out / f"{args.name}.csv", rows, FIELDS)
        write_markdown(args.out / f"{args.name}.md", rows, command, commit)
    write_meta(args.out / f"{args.name}.meta.json", "default", started=started,
               extra={"commit": commit} if commit else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
