"""Memory facts: the closed-form checkpoint-all peak equals the simulator's replay of that schedule."""

from __future__ import annotations

from hypothesis import given, settings

from cases import SMALL_CASES, random_dags
from checkmate import synthetic
from checkmate.bounds import checkpoint_all_peak, checkpoint_all_schedule
from checkmate.simulate import simulate


@settings(max_examples=80, deadline=None)
@given(random_dags(max_nodes=14))
def test_checkpoint_all_peak_matches_the_simulator(graph):
    assert checkpoint_all_peak(graph) == simulate(graph, checkpoint_all_schedule(graph)).peak_memory_bytes


def test_checkpoint_all_peak_on_training_graphs():
    graphs = [make() for make in SMALL_CASES.values()] + [synthetic.resnet(6), synthetic.unet(3),
                                                         synthetic.random_forward(60, seed=1)]
    for graph in graphs:
        assert checkpoint_all_peak(graph) == simulate(graph, checkpoint_all_schedule(graph)).peak_memory_bytes
