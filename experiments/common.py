"""Helpers shared by the experiment scripts: command line, results folder, CSV and Markdown tables.

Every script takes ``--quick`` (a setting that finishes in minutes, used by the tests) and
``--out DIR`` (default: ``experiments/results``), writes its CSV and PNG there, then regenerates
``results/README.md`` from every result file present (:mod:`results_readme`).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

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


def fmt_float(value: Any, digits: int = 3) -> str:
    if value in (None, ""):
        return "–"
    return f"{float(value):.{digits}f}"


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
