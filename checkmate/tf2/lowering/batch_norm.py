"""Fused batch normalization in the traced step (``lower(..., fused_batch_norm=True)``).

Keras 3 normalizes with separate ops (``moments``, then ``batch_normalization``), and TensorFlow's
gradient of that chain keeps about three activation-sized temporaries alive at once in the backward of
every BatchNormalization layer (``x - mean``, ``dy * (x - mean)`` and their products), besides the
layer's input, the incoming gradient and the result. In a convolutional network those temporaries
set the working set of the largest layers, and with it the smallest budget any schedule can meet.

With the option, the traced forward of a BatchNormalization layer in training mode is TensorFlow's
fused kernel (``FusedBatchNormV3``), whose registered gradient (``FusedBatchNormGradV3``) writes the
input gradient in one pass, with per-channel scratch only: the same function, computed with a
different order of floating-point operations (results agree with Keras' to rounding, ~1e-6
relative). The moving statistics are updated exactly as Keras does, from the batch mean and the
biased batch variance (the kernel returns the unbiased one; the factor is undone).

Only the cases the kernel covers are fused: 4-D channels-last inputs, training mode, no mask, no
renormalization, no cross-replica synchronization, an epsilon the GPU kernel accepts. Every other call
runs Keras' own code. Models are never modified: the substitution is an instance attribute set for
the duration of the trace.
"""

from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf

__all__ = ["fused_batch_norm_call", "fusable", "MIN_FUSED_EPSILON"]

# cuDNN refuses a smaller epsilon (CUDNN_BN_MIN_EPSILON is 1e-5; TF's own wrapper keeps clear of it)
MIN_FUSED_EPSILON = 1.001e-5


def _axis(layer: Any) -> list[int]:
    axis = getattr(layer, "axis", -1)
    return list(axis) if isinstance(axis, (list, tuple)) else [axis]


def fusable(layer: Any, inputs: Any, training: Any, mask: Any) -> bool:
    """Whether this call of BatchNormalization ``layer`` can run on the fused kernel."""
    shape = getattr(inputs, "shape", None)
    if shape is None or shape.rank != 4:
        return False
    axis = [a % 4 for a in _axis(layer)]
    return (training is True and bool(layer.trainable) and mask is None and axis == [3]
            and not getattr(layer, "renorm", False) and not getattr(layer, "synchronized", False)
            and float(layer.epsilon) >= MIN_FUSED_EPSILON
            and tf.as_dtype(inputs.dtype) in (tf.float16, tf.bfloat16, tf.float32))


def _fused_training(x: tf.Tensor, gamma: tf.Tensor, beta: tf.Tensor, epsilon: float):
    """``FusedBatchNormV3`` in training mode: ``(y, batch mean, unbiased batch variance)``.

    The gradient is the kernel's own (``FusedBatchNormGradV3``), with the parameter gradients passed
    on through ``Identity`` ops: the op that writes the input gradient then produces no step output,
    so the lowering can free its activation-sized result once consumed, while the per-channel
    parameter gradients stay resident as step outputs. The mean and variance feed only the moving
    averages (assignments, which have no gradient): their incoming gradients are ignored.
    """

    @tf.custom_gradient
    def forward(x, gamma, beta):
        empty = tf.zeros([0], tf.float32)   # no running statistics in: exponential_avg_factor=1
        y, mean, variance, *reserve = tf.raw_ops.FusedBatchNormV3(
            x=x, scale=gamma, offset=beta, mean=empty, variance=empty, epsilon=epsilon,
            exponential_avg_factor=1.0, data_format="NHWC", is_training=True)
        # The backward reads the per-channel reserve spaces through ops of their own, so that the
        # lowering can keep them without keeping y, which the same kernel wrote.
        saved = [tf.identity(r) for r in reserve]
        scope = tf.get_current_name_scope()

        def gradient(dy, *unused_statistics_gradients):
            # named like TensorFlow's own gradient ops, under the forward op's scope
            with tf.name_scope(f"gradient_tape/{scope}/" if scope else "gradient_tape/"):
                dx, dgamma, dbeta, _, _ = tf.raw_ops.FusedBatchNormGradV3(
                    y_backprop=dy, x=x, scale=gamma, reserve_space_1=saved[0], reserve_space_2=saved[1],
                    reserve_space_3=saved[2], epsilon=epsilon, data_format="NHWC", is_training=True)
                return dx, tf.identity(dgamma), tf.identity(dbeta)

        return (y, mean, variance), gradient

    return forward(x, gamma, beta)


def fused_batch_norm_call(layer: Any, original: Callable) -> Callable:
    """A ``call`` for ``layer`` that runs the fused kernel where :func:`fusable`, else ``original``."""

    def call(inputs, training=None, mask=None, **kwargs):
        if kwargs or not fusable(layer, inputs, training, mask):
            return original(inputs, training=training, mask=mask, **kwargs)
        # As Keras: statistics and normalization in float32 (float16 inputs overflow), output in the
        # layer's compute dtype.
        x = tf.cast(inputs, tf.float32)
        channels = int(x.shape[-1])
        gamma = tf.cast(layer.gamma, tf.float32) if layer.scale else tf.ones([channels], tf.float32)
        beta = tf.cast(layer.beta, tf.float32) if layer.center else tf.zeros([channels], tf.float32)
        y, mean, unbiased_variance = _fused_training(x, gamma, beta, float(layer.epsilon))
        count = int(x.shape[0]) * int(x.shape[1]) * int(x.shape[2])
        variance = unbiased_variance * ((count - 1) / count) if count > 1 else unbiased_variance
        momentum = float(layer.momentum)
        moving_mean = tf.cast(layer.moving_mean, tf.float32)
        moving_variance = tf.cast(layer.moving_variance, tf.float32)
        layer.moving_mean.assign(moving_mean * momentum + mean * (1.0 - momentum))
        layer.moving_variance.assign(moving_variance * momentum + variance * (1.0 - momentum))
        return tf.cast(y, layer.compute_dtype)

    return call
