"""The tutorial notebook runs from top to bottom (so it cannot rot) and shows its figures."""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("tensorflow")

# two minutes of MILPs and compiles: in `make test-slow`, out of the default run
pytestmark = [pytest.mark.tf, pytest.mark.slow]

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "tutorial.ipynb"
# Per-cell limit: the slowest cells solve a few MILPs and compile two steps.
CELL_TIMEOUT_S = 600


def test_tutorial_notebook_executes(tmp_path):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 2, "the sweep and the schedule figures should be displayed"
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert "largest gradient difference" in text and "loss per epoch" in text
