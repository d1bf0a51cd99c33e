"""Small training graphs of the shapes that defeat structured strategies, for the solver-quality tests:
a transformer whose attention scores and feed-forward values dwarf the rest, a U-Net whose every
encoder output is concatenated into the decoder, and a dense block whose layers read the
concatenation of every earlier output."""

from __future__ import annotations

from checkmate.synthetic import training_graph


def _builder():
    fwd: list = []

    def add(name, cost, mem, deps):
        fwd.append((name, float(cost), int(mem), list(deps)))
        return len(fwd) - 1

    return fwd, add


def mini_transformer(layers: int = 2, width_mem: int = 1 << 20, seq_over_width: int = 2, vocab_over_width: int = 6):
    """Pre-norm transformer layers: the attention scores (and their softmax and dropout) are
    ``seq_over_width`` times a hidden state, the feed-forward values four times, the logits
    ``vocab_over_width`` times; the matrix products cost most per byte."""
    fwd, add = _builder()
    h = add("embed", 1, width_mem, [])
    scores_mem = seq_over_width * width_mem
    for layer in range(layers):
        p = f"l{layer}_"
        ln = add(p + "ln1", 1, width_mem, [h])
        q, k, v = (add(p + part, 8, width_mem, [ln]) for part in ("q", "k", "v"))
        scores = add(p + "scores", 8 * seq_over_width, scores_mem, [q, k])
        soft = add(p + "softmax", 2, scores_mem, [scores])
        drop = add(p + "attn_dropout", 1, scores_mem, [soft])
        ctx = add(p + "context", 8 * seq_over_width, width_mem, [drop, v])
        out = add(p + "attn_out", 8, width_mem, [ctx])
        h = add(p + "add1", 0.5, width_mem, [h, out])
        ln2 = add(p + "ln2", 1, width_mem, [h])
        up = add(p + "ffn_up", 32, 4 * width_mem, [ln2])
        act = add(p + "gelu", 2, 4 * width_mem, [up])
        down = add(p + "ffn_down", 32, width_mem, [act])
        h = add(p + "add2", 0.5, width_mem, [h, down])
    ln = add("final_ln", 1, width_mem, [h])
    logits = add("logits", 8 * vocab_over_width, vocab_over_width * width_mem, [ln])
    add("loss", 2, 4, [logits])
    return training_graph(fwd, name=f"mini_transformer{layers}")


def long_skip_unet(levels: int = 3, convs: int = 2, base_mem: int = 4 << 20, cost: float = 10.0):
    """An encoder of ``convs`` convolutions a level, every one of whose outputs is concatenated into
    the decoder level of the same resolution (skips that span the whole network)."""
    fwd, add = _builder()
    prev = add("stem", cost, base_mem, [])
    skips, mem, width = [], base_mem, 1
    for level in range(levels):
        for c in range(convs):
            prev = add(f"down{level}_conv{c}", cost * width, mem, [prev])
            skips.append(prev)
        prev = add(f"down{level}_pool", cost * width / 4, mem // 2, [prev])
        mem //= 2
        width *= 2
    prev = add("mid", cost * width, mem, [prev])
    for level in reversed(range(levels)):
        prev = add(f"up{level}_upsample", cost * width / 4, 2 * mem, [prev])
        mem *= 2
        width //= 2
        for c in range(convs):
            cat = add(f"up{level}_cat{c}", cost * width / 10, 2 * mem, [prev, skips.pop()])
            prev = add(f"up{level}_conv{c}", cost * width, mem, [cat])
    add("loss", 0.1, 4, [prev])
    return training_graph(fwd, name=f"long_skip_unet{levels}")


def dense_blocks(blocks: int = 2, layers: int = 4, growth_mem: int = 1 << 20, cost: float = 4.0):
    """DenseNet blocks: each layer normalises and convolves the concatenation of the block's input
    and every earlier layer's output (so the concatenations grow), a transition halves between blocks."""
    fwd, add = _builder()
    prev = add("stem", cost, 4 * growth_mem, [])
    channels = 4
    for b in range(blocks):
        features = [prev]
        for layer in range(layers):
            cat = add(f"b{b}_l{layer}_cat", cost / 8 * channels / 4, channels * growth_mem, features)
            norm = add(f"b{b}_l{layer}_norm", cost / 4 * channels / 4, channels * growth_mem, [cat])
            conv = add(f"b{b}_l{layer}_conv", cost * channels / 4, growth_mem, [norm])
            features = features + [conv]
            channels += 1
        cat = add(f"b{b}_out_cat", cost / 8 * channels / 4, channels * growth_mem, features)
        channels //= 2
        prev = add(f"b{b}_transition", cost * channels / 2, channels * growth_mem // 2, [cat])
    add("loss", 0.1, 4, [prev])
    return training_graph(fwd, name=f"dense_blocks{blocks}x{layers}")
