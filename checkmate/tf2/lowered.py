"""The contract between lowering (Keras model -> Graph) and code generation (Schedule -> tf.function).

Kept in its own module, free of TensorFlow imports, so both sides (and tests) agree on one structure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from checkmate.graph import Graph

__all__ = ["LoweredGraph", "flat_names"]


def flat_names(structure: Any) -> tuple[str, ...]:
    """The tensor names of a nest of names (dicts by sorted key, as ``tf.nest`` and Keras order them)."""
    if structure is None:
        return ()
    if isinstance(structure, str):
        return (structure,)
    if isinstance(structure, dict):
        return tuple(name for key in sorted(structure) for name in flat_names(structure[key]))
    return tuple(name for item in structure for name in flat_names(item))


@dataclass(frozen=True)
class LoweredGraph:
    """A Keras training step lowered to the solver's Graph, with the mapping back to TF ops.

    Attributes
    ----------
    graph:
        The solver's view: op level (one node per data-producing op) or layer level (one forward and
        one backward node per Keras layer).
    level:
        ``"op"``, ``"layer"`` or ``"mixed"`` (``level="auto"`` looked inside nested models or composite
        layers: layer nodes and op nodes; ``metadata["split_layers"]`` says what was split and why).
    function:
        The plain traced training step, a ``ConcreteFunction`` ``(x, y) -> (loss, *grads, *indices)``
        with the gradients in ``model.trainable_variables`` order (``indices``: see ``grad_indices``). Its ``.graph.as_graph_def()`` is what code
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
        order. A gradient the tape gives as ``tf.IndexedSlices`` (an untied embedding's) is named by
        its values tensor, one row per occurrence of an index.
    grad_indices:
        Aligned with ``grad_tensors``: a sliced gradient's indices tensor, ``None`` for a dense one
        (empty when every gradient is dense). The step returns the indices after the gradients.
    variables:
        The model's trainable variables, in the order of ``grad_tensors``.
    metadata:
        Free-form facts worth reporting (batch size, cost model, warnings raised while lowering).
    pred_structure:
        With predictions (``lower(..., predictions=True)``): the model's output in the training forward
        pass, a nest of tensor names that the step returns after the gradients; ``None`` otherwise.
    distribution:
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
    grad_indices: tuple[str | None, ...] = ()

    @property
    def indices_tensors(self) -> tuple[str, ...]:
        """The sliced gradients' indices tensor names in the order the step returns them."""
        return tuple(t for t in self.grad_indices if t is not None)

    @property
    def pred_tensors(self) -> tuple[str, ...]:
        """The predictions' tensor names in the order the step returns them (empty without)."""
        return flat_names(self.pred_structure)
    metadata: Mapping[str, Any] = field(default_factory=dict)
    pred_structure: Any = None
    distribution: Any = None
    capture_variables: tuple[Any, ...] = ()
