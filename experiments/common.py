"""Helpers shared by the experiment scripts: command line, results folder, CSV and Markdown tables.

Every script takes ``--quick`` (a setting that finishes in minutes, used by the tests) and
``--out DIR`` (default: ``experiments/results``), writes its CSV and PNG there, then regenerates
``results/README.md`` from every result file present (:mod:`results_readme`). The long-running
scripts also take ``--cache-dir``/``--no-cache`` (:func:`add_cache_arguments`): each finished point is
kept there, so a run stopped part-way resumes where it stopped.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"

if str(HERE) not in sys.path:  # scripts run as files import their siblings
    sys.path.insert(0, str(HERE))


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="small shapes and few points: finishes in minutes")
    p.add_argument("--out", type=Path, default=RESULTS, help="results folder (default: experiments/results)")
    p.add_argument("--workers", type=int, default=None, help="parallel solves (default: one per core)")
    p.add_argument("--no-readme", action="store_true", help="do not regenerate results/README.md")
    return p


# Finished points of long runs (one file per point, see checkmate.analysis.point_cache); beside the
# profile cache, under the user's cache folder, so that reruns from any checkout share them.
POINT_CACHE = Path.home() / ".cache" / "checkmate" / "points"


def add_cache_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cache-dir", type=Path, default=POINT_CACHE,
                   help=f"keep each finished point here and reuse those found (default: {POINT_CACHE})")
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the point cache")


def point_cache_dir(args: argparse.Namespace) -> Path | None:
    """The point cache folder the command line asked for, or None with ``--no-cache``."""
    return None if args.no_cache else args.cache_dir


def write_csv(path: Path, rows: Sequence[dict], columns: Sequence[str] | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    columns = list(columns or (rows[0].keys() if rows else []))
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in columns})
    return path


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def write_meta(path: Path, setting: str, extra: dict | None = None, started: float | None = None) -> Path:
    """A small JSON next to the results: which setting produced them, where, how long it took."""
    data = {
        "setting": setting,
        "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    if started is not None:
        data["wall_seconds"] = round(time.perf_counter() - started, 1)
    if extra:
        data.update(extra)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def write_run_report(out: Path, label: str, script: str, argv: Sequence[str], started: float,
                     render: Callable[[dict], str]) -> Path:
    """``<label>.meta.json`` (the exact command, the device, when the run started and how long it took)
    and ``<label>.md``, ``render(meta)`` followed by the section headed "## Findings" that a reader
    wrote under an earlier run's table, kept. ``started`` is a ``time.time()``."""
    from checkmate.tf2.profiling import device_description

    out.mkdir(parents=True, exist_ok=True)
    meta = {"command": f"python experiments/{script} " + shlex.join(list(argv)),
            "device": device_description(), "seconds": round(time.time() - started, 1),
            "started": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started))}
    (out / f"{label}.meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    path = out / f"{label}.md"
    old = path.read_text() if path.exists() else ""
    kept = "\n" + old[old.index("## Findings"):] if "## Findings" in old else ""
    path.write_text(render(meta) + kept)
    return path


def markdown_table(rows: Iterable[dict], columns: Sequence[tuple[str, str]]) -> str:
    """``columns`` are (key, heading) pairs; values are printed as they are in the row."""
    rows = list(rows)
    lines = ["| " + " | ".join(h for _, h in columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(k)) for k, _ in columns) + " |")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None or value == "":
        return "–"
    return str(value)


def _missing_value(value: Any) -> bool:
    return value is None or value == ""


def fmt_sig(value: Any, sig: int = 3) -> str:
    """``value`` to ``sig`` significant figures, trailing zeros kept (``0.356``, ``81.30``); values
    with more integer digits than that print as whole numbers with thousands separators (``742,765``)."""
    if _missing_value(value):
        return "–"
    v = float(value)
    text = f"{v:#.{sig}g}"
    if abs(v) >= 10 ** sig or ("e" in text and abs(v) >= 1):  # 999.7 rounds up to "1.00e+03"
        return f"{v:,.0f}"
    return text.rstrip(".")


def fmt_int(value: Any) -> str:
    """A count, with thousands separators."""
    if _missing_value(value):
        return "–"
    return f"{round(float(value)):,d}"


def fmt_seconds(value: Any) -> str:
    """Seconds to three significant figures: ``0.356 s``, ``13.6 s``, ``302 s``."""
    if _missing_value(value):
        return "–"
    return f"{fmt_sig(value, 3)} s"


def fmt_ratio(value: Any, sig: int = 4) -> str:
    """A ratio (overhead, measured / predicted) to ``sig`` significant figures: ``1.253x``."""
    if _missing_value(value):
        return "–"
    return f"{fmt_sig(value, sig)}x"


def fmt_percent(fraction: Any, decimals: int = 2) -> str:
    """A fraction as a percentage: ``0.0009`` -> ``0.09%``; a positive value that would round to zero
    prints as ``<0.01%``, so that it is not mistaken for an exact zero."""
    if _missing_value(fraction):
        return "–"
    pct = 100 * float(fraction)
    if pct == 0:
        return "0%"
    smallest = 10.0 ** -decimals
    if 0 < pct < smallest / 2:
        return f"<{smallest:.{decimals}f}%"
    return f"{pct:.{decimals}f}%"


def fmt_cost(value: Any) -> str:
    """A compute cost (the graph's own unit): four significant figures below 1,000, whole numbers
    with thousands separators up to a billion, four significant figures in powers of ten above
    (``2.973e12``), where more digits are noise."""
    if _missing_value(value):
        return "–"
    v = float(value)
    if abs(v) >= 1e9:
        mantissa, exponent = f"{v:.3e}".split("e")
        return f"{mantissa}e{int(exponent)}"
    return fmt_sig(v, 4)


def fmt_small(value: Any) -> str:
    """A small quantity such as a relative gradient difference: two significant figures in powers of
    ten (``1.6e-03``); an exact zero prints as ``0``."""
    if _missing_value(value):
        return "–"
    v = float(value)
    return "0" if v == 0 else f"{v:.1e}"


def fmt_bytes(value: Any) -> str:
    if value in (None, ""):
        return "–"
    from checkmate.solvers import format_bytes

    return format_bytes(float(value))


def finish(args: argparse.Namespace) -> None:
    if not args.no_readme:
        from results_readme import write_readme

        path = write_readme(args.out)
        print(f"updated {path}")
