"""The contract between lowering (Keras model -> Graph) and code generation (Schedule -> tf.function).

Kept in its own module, free of TensorFlow imports, so both sides (and tests) agree on one structure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from checkmate.graph import Graph

__all__ = ["LoweredGraph"]


@dataclass(frozen=True)
class LoweredGraph:
    """A Keras training step lowered to the solver's Graph, with the mapping back to TF ops.

    Attributes
    ----------
    graph:
        The solver's view: op level (one node per data-producing op) or layer level (one forward and
        one backward node per Keras layer).
    level:
        ``"op"`` or ``"layer"``.
    function:
        The plain traced training step, a ``ConcreteFunction`` ``(x, y) -> (loss, *grads)`` with the
        gradients in ``model.trainable_variables`` order. Its ``.graph.as_graph_def()`` is what code
        generation rewrites.
    node_ops:
        For each graph node, the names of the TF ops (in ``function.graph``) it stands for, in a
        topological order. One (re)computation of the node runs exactly these ops.
    op_node:
        Op name -> node id, for every op that belongs to a node. Ops in no node (placeholders,
        constants, shape arithmetic, reads of variables the step never assigns, the final outputs'
        identities) are "static": code generation runs them once, they are never recomputed and their
        memory is not an activation.
    input_names / label_names:
        Names of the placeholder ops fed with the batch's features and labels.
    loss_tensor / grad_tensors:
        Tensor names (``"op:idx"``) of the loss and of each gradient, in ``model.trainable_variables``
        order.
    variables:
        The model's trainable variables, in the order of ``grad_tensors``.
    metadata:
        Free-form facts worth reporting (batch size, cost model, warnings raised while lowering).
    strategy:
        The ``tf.distribute`` strategy the step was traced under (one replica's step, its batch the
        replica's share), or ``None``.
    capture_variables:
        Under a strategy, for each tensor ``function`` captures, the distributed variable whose
        replica copy it is the handle of (``None`` for other captures); empty without a strategy.
    """

    graph: Graph
    level: str
    function: Any
    node_ops: tuple[tuple[str, ...], ...]
    op_node: Mapping[str, int]
    input_names: tuple[str, ...]
    label_names: tuple[str, ...]
    loss_tensor: str
    grad_tensors: tuple[str, ...]
    variables: tuple[Any, ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)
    strategy: Any = None
    capture_variables: tuple[Any, ...] = ()
