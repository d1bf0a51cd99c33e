"""What each install gives: the core (graphs, solvers, the command line's solve, sweep and plot) needs
neither TensorFlow nor Keras; commands that need a missing package say what to install."""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import setuptools

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "checkmate" / "data" / "examples" / "unet_train.json"


def _setup_arguments(monkeypatch) -> dict:
    captured: dict = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kwargs: captured.update(kwargs))
    monkeypatch.chdir(ROOT)
    runpy.run_path(str(ROOT / "setup.py"), run_name="__main__")
    return captured


def _names(requirements) -> set[str]:
    return {r.split(">")[0].split("=")[0].split("[")[0].strip().lower() for r in requirements}


def test_the_core_requires_neither_tensorflow_nor_keras(monkeypatch):
    args = _setup_arguments(monkeypatch)
    core = _names(args["install_requires"])
    extras = {name: _names(reqs) for name, reqs in args["extras_require"].items()}
    assert not core & {"tensorflow", "keras", "tf-keras"}
    assert {"numpy", "scipy", "highspy", "matplotlib"} <= core
    assert {"tensorflow", "keras"} <= extras["tf"]
    # the test extra (what `make install` sets up) is everything: every other extra and TensorFlow
    assert set().union(*(reqs for name, reqs in extras.items() if name != "test")) <= extras["test"]


def _run_without(blocked: list[str], argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``checkmate ARGV`` in a fresh interpreter where ``blocked`` packages are not installed (importing
    them fails as it does for a package that is absent)."""
    code = ("import sys\n"
            "class Missing:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            f"        if name.split('.')[0] in {blocked!r}:\n"
            "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
            "sys.meta_path.insert(0, Missing())\n"
            "from checkmate.cli import main\n"
            f"sys.exit(main({argv!r}))\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=cwd)


def test_solve_sweep_and_plot_run_without_tensorflow(tmp_path):
    no_tf = ["tensorflow", "keras", "tf_keras"]
    schedule = tmp_path / "schedule.json"
    proc = _run_without(no_tf, ["solve", str(EXAMPLE), "--budget", "70%", "--strategy", "checkmate_lp_rounding",
                                "--json", "--out", str(schedule)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["feasible"] is True
    proc = _run_without(no_tf, ["sweep", str(EXAMPLE), "--out", str(tmp_path / "sweep"), "--budgets", "2",
                                "--strategies", "checkpoint_all,chen_sqrtn", "--executor", "serial"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "sweep" / "sweep.csv").exists() and (tmp_path / "sweep" / "sweep.png").exists()
    proc = _run_without(no_tf, ["plot", str(schedule), "--graph", str(EXAMPLE), "--out", str(tmp_path / "s.png")],
                        tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "s.png").stat().st_size > 0


def test_plot_without_matplotlib_says_what_to_install(tmp_path):
    schedule = tmp_path / "schedule.json"
    proc = _run_without([], ["solve", str(EXAMPLE), "--budget", "100%", "--strategy", "checkpoint_all",
                             "--out", str(schedule)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    proc = _run_without(["matplotlib"],
                        ["plot", str(schedule), "--graph", str(EXAMPLE), "--out", str(tmp_path / "s.png")], tmp_path)
    assert proc.returncode == 2
    assert "pip install matplotlib" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "s.png").exists()


@pytest.mark.parametrize("argv", [["compile", "--model", "mlp", "--budget", "50%"],
                                  ["extract", "--model", "mlp", "--batch-size", "4", "--out", "g.json"]])
def test_commands_that_lower_models_say_how_to_get_tensorflow(tmp_path, argv):
    proc = _run_without(["tensorflow", "keras"], argv, tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "pip install 'checkmate[tf]'" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
