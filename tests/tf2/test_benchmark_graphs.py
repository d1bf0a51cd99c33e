"""The Keras layer graphs the solver benchmark runs on match what the lowering produces today."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("tensorflow")

from checkmate.graph import load_graph  # noqa: E402

pytestmark = pytest.mark.tf

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"


def _extract_module():
    spec = importlib.util.spec_from_file_location("extract_graphs", EXPERIMENTS / "extract_graphs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_unet_graph_is_what_extract_graphs_writes(tmp_path):
    module = _extract_module()
    assert module.main(["--models", "unet", "--out", str(tmp_path)]) == 0
    fresh = load_graph(tmp_path / "unet.json")
    committed = load_graph(EXPERIMENTS / "results" / "graphs" / "keras" / "unet.json")
    assert fresh.name == committed.name == "keras-unet"
    assert fresh.n == committed.n and fresh.edges == committed.edges
    assert list(fresh.mem) == list(committed.mem)
    assert fresh.fixed_mem == committed.fixed_mem
    assert json.loads((tmp_path / "unet.json").read_text())["format"] == "checkmate-graph/1"
    # the compact layer granularity: one forward and at most one backward node per layer, gradients
    # in fixed memory
    assert not any(node.name.endswith(":params") for node in fresh.nodes)
