"""Wall time of ``checkmate solve`` for every baseline on ~350-node, ~750-edge graph files.

The bar: each baseline answers in under a second, Python start-up, graph parsing and the
percentage budget included. Every run is a fresh ``checkmate solve ... --json`` process; the best of
``--repeats`` runs is kept (the minimum is the least disturbed by other load on the machine).

    python experiments/baseline_cli_time.py --quick     # one budget, 2 repeats
    python experiments/baseline_cli_time.py             # two budgets, 5 repeats
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import finish, parser, write_csv, write_meta

from checkmate.graph import save_graph
from checkmate.synthetic import chain, random_forward, resnet

BASELINES = ["checkpoint_all", "checkpoint_last_node", "chen_sqrtn", "chen_greedy", "chen_sqrtn_linearized",
             "chen_greedy_linearized", "griewank_logn"]


def time_cli(graph_path: Path, strategy: str, budget: str, repeats: int) -> dict:
    best = None
    doc = None
    for _ in range(repeats):
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "checkmate", "solve", str(graph_path), "--budget", budget,
                               "--strategy", strategy, "--json"], capture_output=True, text=True)
        seconds = time.perf_counter() - start
        best = seconds if best is None else min(best, seconds)
        doc = json.loads(proc.stdout) if proc.stdout.strip() else {"status": proc.stderr.strip()}
    return {"strategy": strategy, "budget": budget, "wall_seconds": round(best, 3), "feasible": doc.get("feasible"),
            "overhead": doc.get("overhead"), "peak_memory_bytes": doc.get("peak_memory_bytes")}


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=None)
    args = p.parse_args()
    started = time.perf_counter()
    repeats = args.repeats or (2 if args.quick else 5)
    budgets = ["80%"] if args.quick else ["80%", "50%"]
    graphs = [resnet(29), random_forward(170, seed=1), chain(174)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for g in graphs:
            path = Path(tmp) / f"{g.name}.json"
            save_graph(g, path)
            for budget in budgets:
                for strategy in BASELINES:
                    row = {"graph": g.name, "nodes": g.n, "edges": len(g.edges), **time_cli(path, strategy, budget, repeats)}
                    rows.append(row)
                    print(f"{g.name:>16} {budget:>4} {strategy:<24} {row['wall_seconds']:.3f} s")
    name = "baseline_cli_time_quick" if args.quick else "baseline_cli_time"
    write_csv(args.out / f"{name}.csv", rows)
    write_meta(args.out / f"{name}.meta.json", "quick" if args.quick else "full",
               {"max_wall_seconds": max(r["wall_seconds"] for r in rows)}, started)
    worst = max(rows, key=lambda r: r["wall_seconds"])
    print(f"slowest: {worst['strategy']} on {worst['graph']} at {worst['budget']}: {worst['wall_seconds']:.3f} s")
    finish(args)


if __name__ == "__main__":
    main()
