"""Layer-level training graphs of the zoo's Keras models, for the solver benchmark.

Lowers each model (``checkmate.tf2.lowering.lower`` at layer level, the paper's granularity) at its
default input shape and a batch size at which activations, not weights, dominate memory, with the
FLOP cost model (profiling paper-sized models on this CPU would take hours and measures the CPU, not
an accelerator). Writes ``results/graphs/keras/<model>.json``, which ``solve_time.py`` benchmarks
alongside its synthetic graphs.

    python experiments/extract_graphs.py                 # all six models (about a minute)
    python experiments/extract_graphs.py --models unet,mobilenet
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

OUT = HERE / "results" / "graphs" / "keras"
# model -> batch size (the zoo's default input shapes: 224x224 for the classifiers, 256x256 for the
# segmentation models)
MODELS = {"vgg16": 32, "unet": 8, "fcn8": 32, "segnet": 8, "mobilenet": 32, "resnet50": 32}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated zoo names")
    ap.add_argument("--out", type=Path, default=OUT, help="folder for the graph files")
    args = ap.parse_args(argv)

    from checkmate.graph import save_graph
    from checkmate.tf2 import zoo
    from checkmate.tf2.lowering import lower

    unknown = [name for name in args.models.split(",") if name not in zoo.names()]
    if unknown:
        print(f"extract_graphs.py: unknown model(s) {', '.join(unknown)}; the zoo has {', '.join(zoo.names())}",
              file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.models.split(","):
        batch = MODELS.get(name, 8)
        started = time.perf_counter()
        model, loss, xs, ys = zoo.build_model(name, batch_size=batch)
        lowered = lower(model, loss, xs, ys, level="layer", cost_model="flops", name=f"keras-{name}")
        graph = lowered.graph
        path = args.out / f"{name}.json"
        save_graph(graph, path)
        print(f"{name:>10} batch {batch:>3}: {graph.n} nodes, {len(graph.edges)} edges, "
              f"{time.perf_counter() - started:.1f} s -> {path}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
