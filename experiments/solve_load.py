"""The first plan of ``auto`` with and without a busy process beside the solver.

A loaded machine (a CI runner, a shared GPU's host) gives the solver less CPU within the same time
limit. For each graph and budget this solves once with ``strategy="auto"`` and the default first-plan
limit of ``RematModel`` (20 s), then once with ``--busy`` processes spinning beside it, and prints one
JSON line per solve: wall and CPU seconds, the predicted overhead and the strategy's status.

The graphs are ``results/graphs/real/{efficientnetv2b0,nasnetmobile}.json``: what ``RematModel``
solves for keras.applications EfficientNetV2B0 and NASNetMobile (64x64, batch 8, ``level="auto"``,
profiled costs), saved at its solve call.

    python experiments/solve_load.py
    python experiments/solve_load.py --graphs nasnetmobile --budgets "50% activations" --busy 2
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

GRAPHS = HERE / "results" / "graphs" / "real"


def _spin(stop) -> None:
    """Busy CPU work until ``stop`` is set: the load of another process on the machine."""
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x += 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", default="efficientnetv2b0,nasnetmobile", help="comma-separated names in graphs/real")
    ap.add_argument("--budgets", default="50% activations,70% activations", help="comma-separated budgets")
    ap.add_argument("--busy", type=int, default=1, help="busy processes beside the loaded solves")
    ap.add_argument("--time-limit", type=float, default=20.0, help="the solve's time limit (seconds)")
    args = ap.parse_args(argv)

    import checkmate
    from checkmate.graph import load_graph

    for busy in (0, args.busy):
        stop = multiprocessing.Event()
        spinners = [multiprocessing.Process(target=_spin, args=(stop,), daemon=True) for _ in range(busy)]
        for p in spinners:
            p.start()
        try:
            for name in args.graphs.split(","):
                graph = load_graph(GRAPHS / f"{name}.json")
                for budget in args.budgets.split(","):
                    wall, cpu = time.perf_counter(), time.process_time()
                    try:
                        r = checkmate.solve(graph, budget, strategy="auto", time_limit_s=args.time_limit)
                        overhead, status = round(r.overhead, 4), r.status
                    except checkmate.CheckmateError as exc:
                        overhead, status = None, f"{type(exc).__name__}: {exc}"
                    print(json.dumps({"graph": name, "nodes": graph.n, "budget": budget, "busy": busy,
                                      "wall_s": round(time.perf_counter() - wall, 2),
                                      "cpu_s": round(time.process_time() - cpu, 2), "overhead": overhead,
                                      "status": status}), flush=True)
        finally:
            stop.set()
            for p in spinners:
                p.join()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
