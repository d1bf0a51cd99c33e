"""Figures: the schedule picture (R, S, memory curve), the budget-sweep plot and the max-batch bars."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cases import training_chain, unet_like
from checkmate import synthetic
from checkmate.analysis.plots import byte_unit, plot_budget_sweep, plot_max_batch, plot_schedule
from checkmate.analysis.sweep import SweepRow
from checkmate.cli import main
from checkmate.graph import save_graph
from checkmate.schedule import save_schedule
from checkmate.solvers import solve

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def assert_png(path, min_bytes: int = 10_000):
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path} is not a PNG"
    assert len(data) >= min_bytes, f"{path} is suspiciously small ({len(data)} bytes)"


def _available(name: str) -> bool:
    from checkmate.analysis.sweep import available_strategies

    return name in available_strategies()


def test_plot_schedule_writes_png(tmp_path):
    g = synthetic.unet(2)
    r = solve(g, "100%", strategy="checkpoint_all")
    out = plot_schedule(g, r.schedule, tmp_path / "s.png")
    assert_png(out)


@pytest.mark.parametrize("strategy", ["chen_sqrtn", "checkmate_milp"])
def test_plot_schedule_with_recomputation(tmp_path, strategy):
    if not _available(strategy):
        pytest.skip(f"{strategy} is not available yet")
    g = training_chain(8)
    r = solve(g, "70%" if strategy == "checkmate_milp" else "100%", strategy=strategy)
    assert r.schedule.recompute_count > 0 or strategy != "checkmate_milp"
    out = plot_schedule(g, r.schedule, tmp_path / "s.png")
    assert_png(out)


def test_cli_plot(tmp_path, capsys):
    g = unet_like(3)
    save_graph(g, tmp_path / "g.json")
    save_schedule(solve(g, "100%", strategy="checkpoint_all").schedule, tmp_path / "s.json")
    code = main(["plot", str(tmp_path / "s.json"), "--graph", str(tmp_path / "g.json"), "--out",
                 str(tmp_path / "out" / "schedule.png")])
    assert code == 0
    assert_png(tmp_path / "out" / "schedule.png")
    assert "peak" in capsys.readouterr().out


def test_cli_plot_rejects_schedule_of_another_graph(tmp_path, capsys):
    save_graph(training_chain(3), tmp_path / "small.json")
    big = training_chain(5)
    save_schedule(solve(big, "100%", strategy="checkpoint_all").schedule, tmp_path / "s.json")
    code = main(["plot", str(tmp_path / "s.json"), "--graph", str(tmp_path / "small.json"), "--out",
                 str(tmp_path / "x.png")])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("checkmate:") and "\n" not in err
    assert not (tmp_path / "x.png").exists()


def test_cli_plot_missing_file(tmp_path, capsys):
    save_graph(training_chain(3), tmp_path / "g.json")
    code = main(["plot", str(tmp_path / "nope.json"), "--graph", str(tmp_path / "g.json"), "--out",
                 str(tmp_path / "x.png")])
    assert code == 2


def _row(strategy, budget, cost, feasible=True, bound=None):
    return SweepRow(graph="g", strategy=strategy, budget_bytes=budget, feasible=feasible,
                    compute_cost=cost if feasible else None, baseline_cost=10.0,
                    overhead=(cost / 10.0) if feasible else None, peak_memory_bytes=budget if feasible else None,
                    lower_bound=bound, best_lower_bound=bound, gap=None, solve_seconds=0.1, optimal=True, status="ok")


def test_plot_budget_sweep_from_rows(tmp_path):
    rows = [_row("checkpoint_all", b, 10.0, feasible=b >= 400) for b in (100, 200, 300, 400)]
    rows += [_row("checkmate_milp", b, c, bound=c) for b, c in ((100, 14.0), (200, 12.0), (300, 11.0), (400, 10.0))]
    rows += [_row("lower_bound_lp", b, 0.0, bound=c) for b, c in ((100, 13.0), (200, 11.5), (300, 10.5), (400, 10.0))]
    rows = [r if r.strategy != "lower_bound_lp" else SweepRow(**{**r.__dict__, "compute_cost": None, "overhead": None})
            for r in rows]
    out = plot_budget_sweep(rows, tmp_path / "sweep.png", title="test")
    assert_png(out)


def test_plot_max_batch(tmp_path):
    results = [{"model": m, "strategy": s, "max_batch_size": b}
               for m, s, b in (("a", "checkpoint_all", 4), ("a", "checkmate_milp", 9), ("b", "checkpoint_all", 0),
                               ("b", "checkmate_milp", 3))]
    assert_png(plot_max_batch(results, tmp_path / "mb.png"), min_bytes=5_000)


def test_byte_unit():
    assert byte_unit(512) == ("B", 1.0)
    assert byte_unit(3 * 2**20)[0] == "MiB"
    assert byte_unit(5 * 2**30)[0] == "GiB"


def test_matplotlib_is_not_imported_by_core_or_sweep():
    code = ("import sys, checkmate, checkmate.cli, checkmate.analysis.sweep, checkmate.analysis.plots, "
            "checkmate.analysis.max_batch; "
            "bad = [m for m in ('matplotlib', 'tensorflow') if m in sys.modules]; "
            "print(','.join(bad)); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_budget_sweep_marks_milp_points_not_proven_optimal(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    proven = [_row("checkmate_milp", b, c) for b, c in ((100, 14.0), (200, 12.0), (300, 11.0))]
    unproven = SweepRow(**{**proven[1].__dict__, "optimal": False, "gap": 0.01, "status": "within 1%"})

    def legend(rows):
        fig, ax = plt.subplots()
        plot_budget_sweep(rows, tmp_path / "unused.png", ax=ax)
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        plt.close(fig)
        return [text for text in labels if text.startswith("Checkmate")]

    assert legend(proven) == ["Checkmate MILP"]
    assert legend([proven[0], unproven, proven[2]]) == ["Checkmate MILP", "Checkmate MILP: not proven optimal"]
