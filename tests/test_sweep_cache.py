"""Resuming sweeps: with a cache directory, a sweep interrupted part-way and run again solves only the
points it had not finished, and ends with the rows of a sweep that was never interrupted."""

from __future__ import annotations

import dataclasses

import pytest

import checkmate.analysis.sweep as sweep_module
from cases import unet_like
from checkmate.analysis.sweep import SweepInterrupted, available_strategies, read_sweep_csv, sweep
from checkmate.cli import main
from checkmate.graph import save_graph

AVAILABLE = set(available_strategies())
# Budget-unaware baselines (one solve each) and budget-aware strategies (one solve per budget), so that
# both phases of a sweep, the frontier probes and the grid, go through the cache.
STRATEGIES = [s for s in ("checkpoint_all", "chen_sqrtn", "chen_greedy", "checkmate_lp_rounding", "lower_bound_lp")
              if s in AVAILABLE]
BUDGETS = 5


def _comparable(rows):
    # Solve times are measured, so they differ between any two runs; everything else must match.
    return [dataclasses.replace(r, solve_seconds=0.0) for r in rows]


class _Counting:
    """Stands in for the sweep's task function (serial executor: in this process) and records each
    solve; with ``stop_after`` it raises KeyboardInterrupt at that solve, as Ctrl-C would."""

    def __init__(self, real, stop_after: int | None = None):
        self.real, self.stop_after, self.solved = real, stop_after, []

    def __call__(self, payload, task):
        if self.stop_after is not None and len(self.solved) == self.stop_after:
            raise KeyboardInterrupt
        row = self.real(payload, task)
        self.solved.append((task.strategy, task.budget_bytes))
        return row


@pytest.mark.parametrize("stop_after", [2, 9])  # during the frontier probes, and during the grid
def test_interrupted_sweep_resumes_with_only_the_missing_solves(tmp_path, monkeypatch, stop_after):
    if "checkmate_lp_rounding" not in AVAILABLE:
        pytest.skip("needs a budget-aware strategy")
    g = unet_like(3)
    real = sweep_module._solve_task
    every = _Counting(real)
    monkeypatch.setattr(sweep_module, "_solve_task", every)
    reference = sweep(g, STRATEGIES, budgets=BUDGETS, executor="serial")
    assert len(every.solved) > stop_after

    cache = tmp_path / "cache"
    first = _Counting(real, stop_after=stop_after)
    monkeypatch.setattr(sweep_module, "_solve_task", first)
    with pytest.raises(KeyboardInterrupt) as info:
        sweep(g, STRATEGIES, budgets=BUDGETS, executor="serial", cache_dir=cache)
    assert len(first.solved) == stop_after
    if isinstance(info.value, SweepInterrupted):  # interrupted in the grid: the finished rows come back
        assert info.value.rows

    second = _Counting(real)
    monkeypatch.setattr(sweep_module, "_solve_task", second)
    resumed = sweep(g, STRATEGIES, budgets=BUDGETS, executor="serial", cache_dir=cache)
    assert len(second.solved) == len(every.solved) - stop_after
    assert not set(second.solved) & set(first.solved)
    assert sorted(first.solved + second.solved) == sorted(every.solved)
    assert resumed.budgets == reference.budgets
    assert _comparable(resumed.rows) == _comparable(reference.rows)
    assert resumed.meta["cached_solves"] == stop_after and resumed.meta["solves"] == len(second.solved)

    # Complete: a third run solves nothing and gives the same rows again.
    third = _Counting(real)
    monkeypatch.setattr(sweep_module, "_solve_task", third)
    again = sweep(g, STRATEGIES, budgets=BUDGETS, executor="serial", cache_dir=cache)
    assert third.solved == [] and again.rows == resumed.rows


def test_cache_key_separates_graphs_and_options(tmp_path, monkeypatch):
    g = unet_like(3)
    cache = tmp_path / "cache"
    sweep(g, ["chen_sqrtn"], budgets=3, executor="serial", cache_dir=cache)
    counting = _Counting(sweep_module._solve_task)
    monkeypatch.setattr(sweep_module, "_solve_task", counting)
    sweep(unet_like(4), ["chen_sqrtn"], budgets=3, executor="serial", cache_dir=cache)  # another graph
    sweep(g, ["chen_sqrtn"], budgets=3, executor="serial", cache_dir=cache, time_limit_s=7.0)  # other options
    assert len(counting.solved) == 2


def test_process_executor_reads_and_fills_the_cache(tmp_path):
    g = unet_like(3)
    names = STRATEGIES[:3]
    cache = tmp_path / "cache"
    first = sweep(g, names, budgets=4, executor="process", workers=2, cache_dir=cache)
    assert first.meta["cached_solves"] == 0 and first.meta["solves"] >= len(names)
    again = sweep(g, names, budgets=4, executor="process", workers=2, cache_dir=cache)
    assert again.meta["solves"] == 0 and again.rows == first.rows


def test_cli_sweep_cache_dir(tmp_path, monkeypatch, capsys):
    g = unet_like(3)
    save_graph(g, tmp_path / "g.json")
    argv = ["sweep", str(tmp_path / "g.json"), "--budgets", "4", "--strategies", ",".join(STRATEGIES[:3]),
            "--executor", "serial", "--cache-dir", str(tmp_path / "cache")]
    real = sweep_module._solve_task
    first, second, uncached = _Counting(real), _Counting(real), _Counting(real)
    monkeypatch.setattr(sweep_module, "_solve_task", first)
    assert main(argv + ["--out", str(tmp_path / "a")]) == 0, capsys.readouterr().err
    monkeypatch.setattr(sweep_module, "_solve_task", second)
    assert main(argv + ["--out", str(tmp_path / "b")]) == 0, capsys.readouterr().err
    assert first.solved and second.solved == []
    assert read_sweep_csv(tmp_path / "b" / "sweep.csv") == read_sweep_csv(tmp_path / "a" / "sweep.csv")
    # Off by default: without --cache-dir every point is solved.
    monkeypatch.setattr(sweep_module, "_solve_task", uncached)
    assert main(argv[:-2] + ["--out", str(tmp_path / "c")]) == 0
    assert sorted(uncached.solved) == sorted(first.solved)
