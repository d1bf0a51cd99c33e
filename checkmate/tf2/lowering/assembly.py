"""Assembling the lowered step: the :class:`~checkmate.graph.Graph` of the groups, its costs, and the
:class:`~checkmate.tf2.lowered.LoweredGraph` with its node <-> op mapping and metadata (docs/design.md §1).

Nodes are emitted in a topological order of the groups' dependencies (a group depends on another
when one of its ops reads, through a data or a control edge, an op of the other), ties broken by
each group's position in the step. A node is flagged ``output`` when it holds an op producing a
step output: the loss and, with gradient nodes or at op level, the parameter gradients (docs/design.md
§3 keeps such a node resident from its computation to the end of the step). Node costs come from the
analytic FLOP estimate or from timing each node on the current device
(:mod:`checkmate.tf2.profiling`).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import networkx as nx

from checkmate.graph import Graph, Node
from checkmate.tf2.lowered import LoweredGraph, flat_names
from checkmate.tf2.lowering.accounting import node_mem
from checkmate.tf2.lowering.grouping import Group, group_dependencies
from checkmate.tf2.lowering.ops import OpGraph, OpInfo
from checkmate.tf2.lowering.trace import TracedStep

__all__ = ["build_graph", "node_costs", "with_costs", "lowered_graph"]


def build_graph(traced: TracedStep, infos: Sequence[OpInfo], op_graph: OpGraph, groups: list[Group], level: str,
                name: str, fixed: int, grads_resident: bool
                ) -> tuple[Graph, tuple[tuple[str, ...], ...], dict[str, int], tuple[int, ...], list[int]]:
    """The graph of ``groups``; also its node ops, each op's node, each node's workspace and, per node,
    the index of its group."""
    dg = group_dependencies(groups, op_graph)
    first = [g.sort_key for g in groups]
    order = list(nx.lexicographical_topological_sort(dg, key=first.__getitem__))
    new_id = {old: new for new, old in enumerate(order)}

    if grads_resident:
        # Compact layer level: the parameter gradients are in fixed_mem, so a layer's backward node is
        # an output only through the loss, and its value is what it passes to other nodes.
        output_tensors = {traced.loss_tensor, *flat_names(traced.pred_structure)}
        resident = frozenset(traced.gradient_outputs)
    else:
        # The loss and the parameter gradients are step outputs: resident from their computation on
        # (op level: the gradient ops; layer level: the :params nodes, see grouping).
        output_tensors = {traced.loss_tensor, *traced.gradient_outputs, *flat_names(traced.pred_structure)}
        resident = frozenset()
    output_ops = {t.rsplit(":", 1)[0] for t in output_tensors}
    nodes, node_ops, workspace = [], [], []
    used_names: dict[str, int] = {}
    for new, old in enumerate(order):
        g = groups[old]
        mem, ws = node_mem(g.ops, infos, op_graph, level, output_tensors, resident)
        label = g.name
        if label in used_names:
            used_names[label] += 1
            label = f"{label}#{used_names[label]}"
        else:
            used_names[label] = 0
        nodes.append(Node(id=new, name=label, cost=1.0, mem=int(mem), backward=g.backward,
                          output=any(infos[i].op.name in output_ops for i in g.ops),
                          recomputable=g.recomputable))
        node_ops.append(tuple(infos[i].op.name for i in sorted(g.ops)))
        workspace.append(int(ws))
    edges = [(new_id[d], new_id[k]) for d, k in dg.edges]
    graph = Graph(nodes, edges, name=name, fixed_mem=fixed)
    assert graph.source_ids == tuple(range(graph.n)), "lowering must emit nodes in a topological order"
    op_node = {op: nid for nid, ops in enumerate(node_ops) for op in ops}
    return graph, tuple(node_ops), op_node, tuple(workspace), order


def node_costs(traced: TracedStep, node_ops: Sequence[Sequence[str]], cost_model: str,
               profile_options: Mapping[str, Any] | None, progress: bool
               ) -> tuple[list[float], str, dict[str, Any]]:
    """(cost of each node, the cost unit, facts about the profiling run for the metadata)."""
    from checkmate.tf2 import profiling

    if cost_model == "flops":
        costs = [profiling.flops_cost(traced.function.graph, ops) for ops in node_ops]
        unit = "flops"
        profile_info = {}
    else:
        result = profiling.profile_nodes(traced.function, node_ops, traced.input_names, traced.label_names,
                                         progress=progress, **dict(profile_options or {}))
        costs = result.costs
        profile_info = {"profile_cache_hits": result.hits, "profile_cache_misses": result.misses,
                        "profile_estimated": result.estimated, "profile_measured_share": result.measured_share,
                        "profile_traced": result.traced, "profile_seconds": result.seconds,
                        "profile_cache": result.cache_path, "device": profiling.device_description()}
        unit = "us"
    return costs, unit, profile_info


def with_costs(graph: Graph, costs: Sequence[float]) -> Graph:
    nodes = [Node(nd.id, nd.name, float(c), nd.mem, nd.backward, nd.output, nd.recomputable)
             for nd, c in zip(graph.nodes, costs)]
    return Graph(nodes, graph.edges, name=graph.name, fixed_mem=graph.fixed_mem)


def lowered_graph(traced: TracedStep, infos: Sequence[OpInfo], graph: Graph, node_ops: tuple[tuple[str, ...], ...],
                  op_node: dict[str, int], *, level: str, cost_model: str, cost_unit: str,
                  warnings: Sequence[str], workspace: tuple[int, ...], parameter_and_batch_bytes: int,
                  grad_bytes: int, grads_resident: bool, gradient_nodes: bool, compact_nodes: int | None,
                  split_workspace_nodes: Sequence[str], profile_info: Mapping[str, Any],
                  fused_batch_norm: bool = False, split_layers: Sequence[str] = ()) -> LoweredGraph:
    """The :class:`LoweredGraph` of ``graph`` (costs included), with the lowering's metadata."""
    batch = [graph_tensor.shape[0] for graph_tensor in traced.function.inputs[: len(traced.input_names)]]
    metadata = {
        "batch_size": int(batch[0]) if batch and batch[0] is not None else None,
        "cost_model": cost_model,
        "cost_unit": cost_unit,
        "level": level,
        "warnings": tuple(warnings),
        "workspace_bytes": workspace,
        "static_ops": tuple(info.op.name for info in infos if info.static and not info.dead),
        "dead_ops": tuple(info.op.name for info in infos if info.dead),
        "parameter_and_batch_bytes": parameter_and_batch_bytes,
        # bytes of the parameter gradients: part of fixed_mem in the compact layer-level accounting,
        # else the values of the output nodes that compute them
        "grad_bytes": grad_bytes,
        "grad_bytes_in_fixed_mem": grads_resident,
        # whether the parameter gradients are output nodes (layer level: the :params/:saved splits)
        "gradient_nodes": gradient_nodes,
        "fused_batch_norm": fused_batch_norm,
        # node count of the compact layer graph (None at op level): what "auto" decided on
        "compact_nodes": compact_nodes,
        # layer nodes split into one node per op for their workspace (WORKSPACE_SPLIT_FRACTION)
        "split_workspace_nodes": tuple(split_workspace_nodes),
        # level="auto": the layers split below one node per layer, and why (one line each)
        "split_layers": tuple(split_layers),
        **profile_info,
    }
    return LoweredGraph(
        graph=graph,
        level=level,
        function=traced.function,
        node_ops=node_ops,
        op_node=op_node,
        input_names=traced.input_names,
        label_names=traced.label_names,
        loss_tensor=traced.loss_tensor,
        grad_tensors=traced.grad_tensors,
        grad_indices=traced.grad_indices,
        variables=traced.variables,
        metadata=metadata,
        pred_structure=traced.pred_structure,
        distribution=traced.distribution,
        capture_variables=traced.capture_variables,
    )
