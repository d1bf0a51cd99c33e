"""Figures: the budget-sweep plot (compute overhead against memory budget) and a schedule's picture
(its R and S matrices above its memory-over-time curve).

matplotlib is imported inside each function, with the non-interactive Agg backend, so importing this
module costs nothing and plotting works without a display.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np

from checkmate.analysis.sweep_data import SweepResult, SweepRow
from checkmate.errors import InvalidArgumentError, MissingDependencyError, OutputPathError
from checkmate.graph import Graph
from checkmate.io import atomic_output
from checkmate.schedule import Schedule
from checkmate.simulate import simulate
from checkmate.solvers.registry import STRATEGIES

__all__ = ["plot_budget_sweep", "plot_schedule", "plot_max_batch", "byte_unit", "pyplot", "save_figure", "figure_format", "label"]

# Display names and a stable colour/marker per strategy, so every figure reads the same way.
_LABELS = {
    "checkpoint_all": "Checkpoint all (no recomputation)",
    "checkpoint_last_node": "Checkpoint last node",
    "chen_sqrtn": "Chen et al. sqrt(n)",
    "chen_greedy": "Chen et al. greedy",
    "chen_sqrtn_linearized": "Chen sqrt(n), linearized",
    "chen_greedy_linearized": "Chen greedy, linearized",
    "griewank_logn": "Griewank & Walther log(n)",
    "checkmate_lp_rounding": "Checkmate LP rounding",
    "checkmate_milp": "Checkmate MILP",
    "lower_bound_lp": "LP lower bound",
    "hierarchical": "Hierarchical (blocks + DP)",
    "auto": "Auto",
}
_STYLE = {
    "checkpoint_all": ("tab:gray", "s"),
    "checkpoint_last_node": ("tab:brown", "v"),
    "chen_sqrtn": ("tab:blue", "o"),
    "chen_greedy": ("tab:orange", "^"),
    "chen_sqrtn_linearized": ("tab:cyan", "o"),
    "chen_greedy_linearized": ("gold", "^"),
    "griewank_logn": ("tab:purple", "D"),
    "checkmate_lp_rounding": ("tab:green", "P"),
    "checkmate_milp": ("tab:red", "*"),
    "lower_bound_lp": ("black", None),
    "hierarchical": ("tab:pink", "X"),
    "auto": ("tab:olive", "h"),
}


def label(strategy: str) -> str:
    return _LABELS.get(strategy, strategy)


def _style(strategy: str, index: int) -> tuple[str, str | None]:
    if strategy in _STYLE:
        return _STYLE[strategy]
    palette = ["tab:olive", "tab:pink", "darkblue", "darkgreen"]
    return palette[index % len(palette)], "x"


def _is_bound_only(strategy: str) -> bool:
    spec = STRATEGIES.get(strategy)
    return spec is not None and spec.bound_only


def byte_unit(max_bytes: float) -> tuple[str, float]:
    """The binary unit in which ``max_bytes`` reads best, and its size in bytes."""
    for name, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if max_bytes >= size:
            return name, float(size)
    return "B", 1.0


def pyplot():
    """matplotlib's pyplot on the Agg backend; :class:`MissingDependencyError` when it is not installed."""
    try:
        import matplotlib
    except ImportError:
        raise MissingDependencyError("drawing a plot needs matplotlib, which is not installed here: "
                                     "pip install matplotlib") from None

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def figure_format(path: str | os.PathLike) -> str:
    """The image format that ``path``'s suffix names; :class:`OutputPathError` when matplotlib has none."""
    pyplot()
    from matplotlib.backend_bases import FigureCanvasBase

    suffix = Path(path).suffix
    supported = FigureCanvasBase.get_supported_filetypes()
    if suffix[1:].lower() not in supported:
        raise OutputPathError(f"cannot write a figure to {str(path)!r}: unknown image format {suffix or '(none)'!r}; "
                              f"use one of {', '.join('.' + k for k in sorted(supported))}")
    return suffix[1:].lower()


def save_figure(fig, path: str | os.PathLike, dpi: int, image_format: str | None = None) -> Path:
    """Write ``fig`` atomically (:mod:`checkmate.io`) in ``image_format``, by default the one that
    ``path``'s suffix names."""
    path = Path(path)
    fmt = image_format or figure_format(path)
    try:
        with atomic_output(path) as tmp:
            fig.savefig(tmp, dpi=dpi, bbox_inches="tight", format=fmt)
    except BaseException:
        pyplot().close(fig)  # the caller closes it after a success only
        raise
    return path


# ------------------------------------------------------------------------------------ budget sweep
def plot_budget_sweep(result: SweepResult | Sequence[SweepRow], path: str | os.PathLike, *,
                      title: str | None = None, ax=None, dpi: int = 150,
                      image_format: str | None = None) -> Path | None:
    """Compute overhead (x of one plain step) against memory budget, one line per strategy.

    Budgets below the smallest feasible one are shaded: no strategy of the sweep fits there, and the
    dotted line marks the bound no schedule can beat (computing the largest op with its inputs).
    A strategy's line starts at the first budget it fits: the gap between line starts is what a
    better scheduler buys. Pass ``ax`` to draw into an existing axes (then nothing is saved).
    """
    if isinstance(result, SweepResult):
        rows = list(result.rows)
        strategies = list(result.strategies)
        frontier = result.min_feasible_budget_bytes
        trivial = result.trivial_bound_bytes
        name = result.graph_name
        budgets = list(result.budgets)
    else:
        rows = list(result)
        strategies = list(dict.fromkeys(r.strategy for r in rows))
        feasible = [r.budget_bytes for r in rows if r.feasible and r.compute_cost is not None]
        frontier = min(feasible) if feasible else None
        trivial = None
        name = rows[0].graph if rows else ""
        budgets = sorted({r.budget_bytes for r in rows})
    if not rows:
        raise InvalidArgumentError("nothing to plot: the sweep has no rows")

    plt = pyplot()
    own_figure = ax is None
    if own_figure:
        fig, ax = plt.subplots(figsize=(7.0, 4.2))
    unit, scale = byte_unit(max(budgets))
    drawn = 0
    for index, strategy in enumerate(strategies):
        srows = sorted((r for r in rows if r.strategy == strategy), key=lambda r: r.budget_bytes)
        color, marker = _style(strategy, index)
        if _is_bound_only(strategy) or all(r.compute_cost is None for r in srows):
            pts = [(r.budget_bytes / scale, r.lower_bound / r.baseline_cost) for r in srows
                   if r.lower_bound is not None and r.baseline_cost > 0 and r.feasible is not False]
            if _is_bound_only(strategy) and pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, linestyle="--", color=color, linewidth=1.0, label=label(strategy), zorder=2)
                drawn += 1
            continue
        pts = [(r.budget_bytes / scale, r.overhead) for r in srows if r.feasible and r.overhead is not None]
        if not pts:
            continue
        xs, ys = zip(*pts)
        emphasis = strategy == "checkmate_milp"
        ax.plot(xs, ys, color=color, marker=marker, markersize=8 if marker == "*" else 5,
                linewidth=2.2 if emphasis else 1.4, label=label(strategy), zorder=4 if emphasis else 3,
                drawstyle="default")
        drawn += 1
        if emphasis:
            # "optimal" means proven: points the solver stopped short of proving are drawn hollow
            unproven = [(r.budget_bytes / scale, r.overhead) for r in srows
                        if r.feasible and r.overhead is not None and not r.optimal]
            if unproven:
                ux, uy = zip(*unproven)
                ax.plot(ux, uy, linestyle="none", marker=marker, markersize=11, markerfacecolor="white",
                        markeredgecolor=color, zorder=5, label=f"{label(strategy)}: not proven optimal")
    if drawn == 0:
        ax.text(0.5, 0.5, "no strategy fits any budget of the grid", transform=ax.transAxes, ha="center")
    lo, hi = min(budgets) / scale, max(budgets) / scale
    pad = max((hi - lo) * 0.04, hi * 0.01)
    left = lo - pad
    if trivial is not None:
        left = min(left, trivial / scale - pad)
    ax.set_xlim(left, hi + pad)
    if frontier is not None:
        ax.axvspan(left, frontier / scale, color="0.85", alpha=0.6, zorder=0, linewidth=0,
                   label="no strategy fits")
    if trivial is not None and trivial / scale >= left:
        ax.axvline(trivial / scale, color="0.35", linestyle=":", linewidth=1.0, zorder=1,
                   label="lower bound on any schedule's memory")
    ax.axhline(1.0, color="0.6", linewidth=0.8, zorder=1)
    ax.set_xlabel(f"memory budget ({unit})")
    ax.set_ylabel("compute overhead (x of one training step)")
    ax.set_title(title or f"{name}: overhead vs. budget")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="best", framealpha=0.85)
    if own_figure:
        out = save_figure(fig, path, dpi, image_format)
        plt.close(fig)
        return out
    return None


# ------------------------------------------------------------------------------------ schedules
def plot_schedule(graph: "Graph", schedule: "Schedule", path: str | os.PathLike, *, title: str | None = None,
                  budget_bytes: int | None = None, dpi: int = 150) -> Path:
    """The schedule's R (what runs in each stage) and S (what is kept into each stage) matrices side by
    side, above the memory in use while each op runs, from :func:`checkmate.simulate.simulate`."""
    from matplotlib.colors import ListedColormap

    if schedule.recompute.shape != (graph.n, graph.n):
        raise InvalidArgumentError(f"the schedule is for {schedule.recompute.shape[0]} nodes, the graph has {graph.n}")
    sim = simulate(graph, schedule)
    plt = pyplot()
    fig = plt.figure(figsize=(10.0, 8.0))
    grid = fig.add_gridspec(2, 2, height_ratios=[1.25, 1.0], hspace=0.32, wspace=0.18)
    ax_r, ax_s = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1])
    ax_m = fig.add_subplot(grid[1, :])

    n = graph.n
    first = np.eye(n, dtype=bool)
    r_img = np.where(schedule.recompute & first, 2, np.where(schedule.recompute, 1, 0))
    cmap_r = ListedColormap(["white", "tab:orange", "tab:blue"])
    ax_r.imshow(r_img, cmap=cmap_r, vmin=0, vmax=2, interpolation="nearest", aspect="auto")
    ax_r.set_title(f"R: computed in stage ({schedule.recompute_count} recomputations)", fontsize=9)
    ax_s.imshow(schedule.retain, cmap=ListedColormap(["white", "tab:green"]), vmin=0, vmax=1,
                interpolation="nearest", aspect="auto")
    ax_s.set_title(f"S: held on entry to stage ({int(schedule.retain.sum())} cells)", fontsize=9)
    n_fwd = len(graph.forward_nodes)
    for ax in (ax_r, ax_s):
        ax.set_xlabel("node (topological order)")
        ax.set_ylabel("stage")
        if 0 < n_fwd < n and not graph.backward[:n_fwd].any():
            ax.axvline(n_fwd - 0.5, color="0.5", linewidth=0.6, linestyle="--")
            ax.axhline(n_fwd - 0.5, color="0.5", linewidth=0.6, linestyle="--")

    timeline = sim.timeline
    values = np.array([s.memory_bytes for s in timeline], dtype=float)
    budget = budget_bytes if budget_bytes is not None else schedule.budget_bytes
    unit, scale = byte_unit(max(values.max(initial=0.0), float(budget or 0)))
    steps = np.arange(len(timeline))
    ax_m.step(steps, values / scale, where="mid", color="tab:blue", linewidth=1.2, label="memory in use")
    recomputed = np.array([s.recompute for s in timeline], dtype=bool)
    if recomputed.any():
        ax_m.scatter(steps[recomputed], values[recomputed] / scale, s=9, color="tab:orange", zorder=3,
                     label="recomputation")
    peak_index = int(values.argmax()) if len(values) else 0
    if len(values):
        ax_m.scatter([peak_index], [values[peak_index] / scale], s=40, color="tab:red", zorder=4,
                     label=f"peak {values[peak_index] / scale:.3g} {unit}")
    if budget:
        ax_m.axhline(budget / scale, color="tab:red", linestyle="--", linewidth=1.0,
                     label=f"budget {budget / scale:.3g} {unit}")
    if graph.fixed_mem:
        ax_m.axhline(graph.fixed_mem / scale, color="0.5", linestyle=":", linewidth=1.0, label="fixed memory")
    # Stage boundaries as faint ticks on the x axis: where the frontier advances.
    stages = np.array([s.stage for s in timeline])
    if len(stages) > 1 and n <= 400:
        for x in np.flatnonzero(np.diff(stages)) + 0.5:
            ax_m.axvline(x, color="0.9", linewidth=0.5, zorder=0)
    ax_m.set_xlabel("op executed (in plan order)")
    ax_m.set_ylabel(f"memory ({unit})")
    ax_m.set_ylim(bottom=0)
    ax_m.set_title(f"memory over time: cost {sim.compute_cost:.4g} ({sim.compute_cost / graph.total_cost:.3f}x "
                   f"of checkpoint-all)" if graph.total_cost > 0 else "memory over time", fontsize=9)
    ax_m.grid(True, alpha=0.3)
    ax_m.legend(fontsize=7, loc="upper left")
    heading = title or f"{graph.name}: {schedule.strategy or 'schedule'}"
    fig.suptitle(heading, fontsize=11)
    out = save_figure(fig, path, dpi)
    plt.close(fig)
    return out


# ------------------------------------------------------------------------------------ max batch
def plot_max_batch(results: Sequence[dict], path: str | os.PathLike, *, title: str = "maximum batch size",
                   dpi: int = 150) -> Path:
    """Grouped bars: for each model, the largest batch size of each strategy.

    ``results`` are dicts with ``model``, ``strategy`` and ``max_batch_size`` (None or 0: nothing fits).
    """
    plt = pyplot()
    models = list(dict.fromkeys(r["model"] for r in results))
    strategies = list(dict.fromkeys(r["strategy"] for r in results))
    value = {(r["model"], r["strategy"]): (r.get("max_batch_size") or 0) for r in results}
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(models) + 2), 4.2))
    width = 0.8 / max(1, len(strategies))
    for j, strategy in enumerate(strategies):
        color, _ = _style(strategy, j)
        # a strategy searched for only some models gets no bar (and no "0") where it was not run
        shown = [i for i, m in enumerate(models) if (m, strategy) in value]
        xs = np.array(shown, dtype=float) + (j - (len(strategies) - 1) / 2) * width
        ys = [value[(models[i], strategy)] for i in shown]
        bars = ax.bar(xs, ys, width=width * 0.95, color=color, label=label(strategy))
        for bar, y in zip(bars, ys):
            ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(), str(y), ha="center", va="bottom",
                    fontsize=6)
    ax.set_xticks(np.arange(len(models)))
    ax.set_xticklabels(models)
    ax.set_ylabel("largest batch size that fits")
    ax.set_title(title)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7)
    out = save_figure(fig, path, dpi)
    plt.close(fig)
    return out
