"""Node costs: an analytic FLOP estimate and measured run times on the current device.

``flops_cost`` is deterministic: floating-point operations of the node's ops, from their static
shapes (matrix products and convolutions exactly, elementwise ops and reductions as one operation per
element). Every node costs at least 1, so that no recomputation is free.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import tensorflow as tf

__all__ = ["flops_cost", "op_flops"]


def _elements(t: tf.Tensor) -> int:
    if not t.shape.is_fully_defined():
        return 0
    return int(t.shape.num_elements())


def op_flops(op) -> float:
    """Floating-point operations of one op, from static shapes (0 for ops with no data outputs)."""
    kind = op.type
    outs = sum(_elements(t) for t in op.outputs)
    ins = [t for t in op.inputs if t.dtype != tf.resource]
    if kind in ("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"):
        a = op.inputs[0]
        transpose_a = False
        for attr in ("transpose_a", "adj_x"):
            try:
                transpose_a = bool(op.get_attr(attr))
                break
            except ValueError:
                continue
        if a.shape.rank is None or a.shape.rank < 2:
            return float(outs)
        k = a.shape[-2] if transpose_a else a.shape[-1]
        return 2.0 * outs * int(k or 1)
    if kind in ("Conv2D", "Conv3D", "DepthwiseConv2dNative"):
        filt = op.inputs[1].shape
        if not filt.is_fully_defined():
            return float(outs)
        window = int(np.prod(filt[:-1])) if kind != "DepthwiseConv2dNative" else int(np.prod(filt[:-2]))
        return 2.0 * outs * window
    if kind in ("Conv2DBackpropInput", "Conv3DBackpropInputV2", "DepthwiseConv2dNativeBackpropInput"):
        # Same work as the forward convolution producing the incoming gradient.
        grad = op.inputs[2].shape
        filt = op.inputs[1].shape
        if not (grad.is_fully_defined() and filt.is_fully_defined()):
            return float(outs)
        window = int(np.prod(filt[:-1])) if "Depthwise" not in kind else int(np.prod(filt[:-2]))
        return 2.0 * int(grad.num_elements()) * window
    if kind in ("Conv2DBackpropFilter", "Conv3DBackpropFilterV2", "DepthwiseConv2dNativeBackpropFilter"):
        grad = op.inputs[2].shape
        out = op.outputs[0].shape
        if not (grad.is_fully_defined() and out.is_fully_defined()):
            return float(outs)
        window = int(np.prod(out[:-1])) if "Depthwise" not in kind else int(np.prod(out[:-2]))
        return 2.0 * int(grad.num_elements()) * window
    if kind in ("Einsum",):
        # Output elements times the product of the contracted dimensions.
        try:
            equation = op.get_attr("equation").decode()
            lhs, out_spec = equation.split("->")
            dims: dict[str, int] = {}
            for spec, t in zip(lhs.split(","), op.inputs):
                spec = spec.replace("...", "")
                for letter, d in zip(spec[::-1], list(t.shape)[::-1]):
                    dims[letter] = int(d or 1)
            contracted = int(np.prod([d for k, d in dims.items() if k not in out_spec] or [1]))
            return 2.0 * outs * contracted
        except (ValueError, TypeError):
            return float(outs)
    # Elementwise ops, reductions, pooling, data movement: one operation per element read or written.
    return float(max(outs, max((_elements(t) for t in ins), default=0)))


def flops_cost(graph: tf.Graph, op_names: Iterable[str]) -> float:
    """Analytic cost of a node: the FLOPs of its ops (at least 1)."""
    total = 0.0
    for name in op_names:
        total += op_flops(graph.get_operation_by_name(name))
    return max(1.0, total)
