"""experiments/common.py write_run_report: the exact command beside the results, and a reader's findings
under an earlier run's table kept when the table is written again (no TensorFlow run here)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))

from common import write_run_report  # noqa: E402


def test_the_command_is_recorded_and_findings_survive_a_rerun(tmp_path):
    started = 1_700_000_000.0
    path = write_run_report(tmp_path, "run", "step_order.py", ["--models", "a b", "--label", "run"], started,
                            lambda meta: f"# table 1\n\n{meta['command']}\n")
    meta = json.loads((tmp_path / "run.meta.json").read_text())
    assert meta["command"] == "python experiments/step_order.py --models 'a b' --label run"
    assert meta["started"] == "2023-11-14 22:13:20" and meta["seconds"] > 0 and meta["device"]
    assert path.read_text() == "# table 1\n\npython experiments/step_order.py --models 'a b' --label run\n"

    path.write_text(path.read_text() + "\n## Findings\n\nWhat the table shows.\n")
    write_run_report(tmp_path, "run", "step_order.py", [], started, lambda meta: "# table 2\n")
    text = path.read_text()
    assert text.startswith("# table 2\n") and text.endswith("## Findings\n\nWhat the table shows.\n")
    assert "# table 1" not in text


def test_a_file_without_findings_is_replaced_whole(tmp_path):
    (tmp_path / "run.md").write_text("# old table\n")
    write_run_report(tmp_path, "run", "peak_load.py", [], 0.0, lambda meta: "# new table\n")
    assert (tmp_path / "run.md").read_text() == "# new table\n"
