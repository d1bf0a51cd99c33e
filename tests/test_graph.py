import json
import math

import numpy as np
import pytest

from checkmate import Graph, GraphBuilder, InvalidGraphError, Node, load_graph, save_graph
from checkmate.graph import graph_from_dict


def native(nodes, edges, **extra):
    return {"format": "checkmate-graph/1", "name": "g",
            "nodes": [{"id": i, "name": f"n{i}", "cost": c, "mem": m, "backward": False, "output": False}
                      for i, c, m in nodes], "edges": edges, **extra}


def test_builder_deps_users_and_arrays():
    b = GraphBuilder("tiny", fixed_mem=7)
    a = b.add_node("a", 1.5, 10)
    c = b.add_node("c", 2.0, 20, [a])
    d = b.add_node("d", 3.0, 30, [a, c], backward=True, output=True)
    g = b.build()
    assert g.n == 3 and g.fixed_mem == 7
    assert g.deps == ((), (0,), (0, 1)) and g.users == ((1, 2), (2,), ())
    assert g.cost.tolist() == [1.5, 2.0, 3.0] and g.mem.tolist() == [10, 20, 30]
    assert g.backward.tolist() == [False, False, True] and g.output.tolist() == [False, False, True]
    assert g.forward_nodes == (0, 1) and g.total_cost == 6.5
    with pytest.raises(ValueError):
        g.mem[0] = 1  # immutable


def test_non_topological_ids_are_relabelled_stably():
    data = native([(10, 1, 1), (5, 2, 2), (7, 3, 3)], [[7, 10], [5, 7]])
    g = graph_from_dict(data)
    assert g.source_ids == (5, 7, 10)
    assert [nd.name for nd in g.nodes] == ["n5", "n7", "n10"]
    assert g.deps == ((), (0,), (1,))
    assert [nd.id for nd in g.nodes] == [0, 1, 2]


def test_already_topological_order_is_kept():
    data = native([(0, 1, 1), (1, 1, 1), (2, 1, 1), (3, 1, 1)], [[0, 3], [1, 3], [2, 3]])
    assert graph_from_dict(data).source_ids == (0, 1, 2, 3)


@pytest.mark.parametrize("nodes, edges, fragment", [
    ([(0, 1, 1), (1, 1, 1)], [[0, 1], [1, 0]], "cycle"),
    ([(0, 1, 1)], [[0, 3]], "node 3, which does not exist"),
    ([(0, 1, -5)], [], "negative"),
    ([(0, float("nan"), 5)], [], "finite"),
    ([(0, 1, 1), (0, 2, 2)], [], "duplicate node id 0"),
    ([], [], "no nodes"),
    ([(0, 1, 1.5)], [], "whole number"),
    ([(0, 1, 1)], [[0, 0]], "self-loop"),
])
def test_invalid_graphs_name_the_culprit(nodes, edges, fragment):
    with pytest.raises(InvalidGraphError, match=fragment):
        graph_from_dict(native(nodes, edges))


def test_cycle_message_names_nodes():
    with pytest.raises(InvalidGraphError) as info:
        graph_from_dict(native([(0, 1, 1), (1, 1, 1), (2, 1, 1)], [[0, 1], [1, 2], [2, 1]]))
    assert "n1" in str(info.value) and "n2" in str(info.value)


def test_malformed_json_file(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"nodes": [ {"id": 0, ')
    with pytest.raises(InvalidGraphError, match="malformed JSON"):
        load_graph(path)
    with pytest.raises(InvalidGraphError, match="cannot read"):
        load_graph(tmp_path / "missing.json")
    path.write_text("[1, 2]")
    with pytest.raises(InvalidGraphError, match="JSON object"):
        load_graph(path)
    path.write_text('{"format": "checkmate-graph/1", "nodes": [{"id": 0, "name": "x", "mem": 3}], "edges": []}')
    with pytest.raises(InvalidGraphError, match="cost"):
        load_graph(path)


@pytest.mark.parametrize("key", ["links", "edges"])
def test_networkx_node_link_graph(tmp_path, key):
    data = {"directed": True, "multigraph": False, "graph": {"name": "nl"},
            "nodes": [{"id": 2, "cost_cpu": 5.0, "cost_ram": 100, "backward": True, "name": "grad"},
                      {"id": 0, "cost_cpu": 1.0, "cost_ram": 10, "backward": False, "name": "x"},
                      {"id": 1, "cost_cpu": 2.0, "cost_ram": 20, "backward": False, "name": "y"}],
            key: [{"source": 0, "target": 1}, {"source": 1, "target": 2}, {"source": 0, "target": 2}]}
    path = tmp_path / "nl.json"
    path.write_text(json.dumps(data))
    g = load_graph(path)
    assert g.name == "nl" and g.names == ("x", "y", "grad")
    assert g.cost.tolist() == [1.0, 2.0, 5.0] and g.mem.tolist() == [10, 20, 100]
    assert g.backward.tolist() == [False, False, True]
    assert g.deps[2] == (0, 1)


def test_round_trip_native(tmp_path):
    b = GraphBuilder("rt", fixed_mem=123)
    a = b.add_node("a", 1.25, 10)
    c = b.add_node("c", 2, 20, [a], recomputable=False)
    b.add_node("d", 3, 30, [a, c], backward=True, output=True)
    g = b.build()
    path = tmp_path / "g.json"
    save_graph(g, path)
    g2 = load_graph(path)
    assert g2 == g
    assert g2.recomputable.tolist() == [True, False, True]
    assert json.loads(path.read_text())["format"] == "checkmate-graph/1"


def test_articulation_points():
    # chain a-b-c-d: interior nodes separate it
    b = GraphBuilder()
    ids = [b.add_node(str(i), 1, 1, [i - 1] if i else []) for i in range(4)]
    assert b.build().articulation_points() == (1, 2)
    # a skip edge 0 -> 2 hides node 1
    b = GraphBuilder()
    for i in range(4):
        b.add_node(str(i), 1, 1, [i - 1] if i else [])
    b.add_edge(0, 2)
    assert b.build().articulation_points() == (2,)
