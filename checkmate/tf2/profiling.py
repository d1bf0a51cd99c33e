"""Node costs: measured run times on the current device, a calibrated estimate, and a FLOP count.

``profile_nodes`` (the default cost model of ``checkmate.tf2.compile``, ``RematModel`` and the CLI)
measures every node inside the plain step itself: the step runs a few times under TF's profiler, on
the device TF places its ops on by default (a GPU when present), and each executed op's time goes to
the node that holds it (a fused op's time shared with the ops it absorbed), and the time of each run
that no op filled (scheduling) goes to the nodes per op that ran; a node's time is the median over
the runs after dropping outliers. Results are cached on disk per device, op wiring,
input shapes and dtypes (see :func:`cache_dir`). Nodes the trace cannot attribute are timed alone,
one small program each, largest estimates first, while the time budget (``time_budget_s``) lasts;
a node measured neither way costs its calibrated estimate.

A node's traced cost is its share of the plain step's time where it ran there: a chain's forward
nodes ran alone and cost their whole duration, backward nodes that ran side by side on the inter-op
threads cost a part of theirs (half, on two free cores). A recomputed copy of a forward node runs in
the backward pass, beside other ops, and on a CPU with a core to spare costs less than that price;
the prediction, a sum of one cost per computation, does not model it (on two idle cores a residual
MLP at 50% measured 1.074x against 1.183x; experiments/results/wall_clock_fid5_evidence.md). How
much the backward nodes shared depends on what else the machine ran while the step was traced, so
on a shared machine their costs, and a plan's predicted overhead, move from one profiling to another.

``estimate_cost`` is that estimate: for each op, the larger of its FLOPs over the device's measured
FLOP rate and the bytes it reads and writes over the device's measured memory bandwidth, plus a
per-op launch time (a roofline). Memory-bound ops (normalization, activations, elementwise, copies)
cost their bytes, which the FLOP count misses. The device figures are measured once by
:func:`calibrate` and cached with the profiles; within one profiling run the estimate is further
scaled by the median ratio of measured to estimated time of the nodes that were measured.

``flops_cost`` is deterministic: floating-point operations of the node's ops, from their static
shapes (matrix products and convolutions exactly, elementwise ops and reductions as one operation per
element). Every node costs at least 1, so that no recomputation is free.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import tensorflow as tf

from checkmate.io import atomic_write_json
from checkmate.tf2 import _compat

__all__ = ["flops_cost", "op_flops", "op_bytes", "profile_nodes", "ProfileResult", "ProfileCache", "cache_dir",
           "device_description", "PROFILE_FORMAT", "CACHE_ENV", "Calibration", "calibrate", "estimate_cost",
           "robust_median", "DEFAULT_TIME_BUDGET_S", "trace_op_groups"]


def _elements(t: tf.Tensor) -> int:
    if not t.shape.is_fully_defined():
        return 0
    return int(t.shape.num_elements())


def op_flops(op) -> float:
    """Floating-point operations of one op, from static shapes (0 for ops with no data outputs)."""
    kind = op.type
    outs = sum(_elements(t) for t in op.outputs)
    ins = [t for t in op.inputs if t.dtype != tf.resource]
    if kind in ("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"):
        a = op.inputs[0]
        transpose_a = False
        for attr in ("transpose_a", "adj_x"):
            try:
                transpose_a = bool(op.get_attr(attr))
                break
            except ValueError:
                continue
        if a.shape.rank is None or a.shape.rank < 2:
            return float(outs)
        k = a.shape[-2] if transpose_a else a.shape[-1]
        return 2.0 * outs * int(k or 1)
    if kind in ("Conv2D", "Conv3D", "DepthwiseConv2dNative"):
        filt = op.inputs[1].shape
        if not filt.is_fully_defined():
            return float(outs)
        window = int(np.prod(filt[:-1])) if kind != "DepthwiseConv2dNative" else int(np.prod(filt[:-2]))
        return 2.0 * outs * window
    if kind in ("Conv2DBackpropInput", "Conv3DBackpropInputV2", "DepthwiseConv2dNativeBackpropInput"):
        # Same work as the forward convolution producing the incoming gradient.
        grad = op.inputs[2].shape
        filt = op.inputs[1].shape
        if not (grad.is_fully_defined() and filt.is_fully_defined()):
            return float(outs)
        window = int(np.prod(filt[:-1])) if "Depthwise" not in kind else int(np.prod(filt[:-2]))
        return 2.0 * int(grad.num_elements()) * window
    if kind in ("Conv2DBackpropFilter", "Conv3DBackpropFilterV2", "DepthwiseConv2dNativeBackpropFilter"):
        grad = op.inputs[2].shape
        out = op.outputs[0].shape
        if not (grad.is_fully_defined() and out.is_fully_defined()):
            return float(outs)
        window = int(np.prod(out[:-1])) if "Depthwise" not in kind else int(np.prod(out[:-2]))
        return 2.0 * int(grad.num_elements()) * window
    if kind in ("Einsum",):
        # Output elements times the product of the contracted dimensions.
        try:
            equation = op.get_attr("equation").decode()
            lhs, out_spec = equation.split("->")
            dims: dict[str, int] = {}
            for spec, t in zip(lhs.split(","), op.inputs):
                spec = spec.replace("...", "")
                for letter, d in zip(spec[::-1], list(t.shape)[::-1]):
                    dims[letter] = int(d or 1)
            contracted = int(np.prod([d for k, d in dims.items() if k not in out_spec] or [1]))
            return 2.0 * outs * contracted
        except (ValueError, TypeError):
            return float(outs)
    # Elementwise ops, reductions, pooling, data movement: one operation per element read or written.
    return float(max(outs, max((_elements(t) for t in ins), default=0)))


# Ops that move no data: views of their input, metadata, variable reads (which alias the variable).
_NO_DATA_OPS = frozenset({"Identity", "IdentityN", "Reshape", "Squeeze", "ExpandDims", "Shape", "ShapeN", "Size",
                          "Rank", "Const", "NoOp", "ReadVariableOp", "StopGradient", "Placeholder", "Snapshot"})


def op_bytes(op) -> float:
    """Bytes an op reads and writes (its non-resource inputs and its outputs), from static shapes;
    0 for views, metadata and variable reads."""
    if op.type in _NO_DATA_OPS:
        return 0.0
    total = 0
    for t in list(op.inputs) + list(op.outputs):
        if t.dtype == tf.resource or t.dtype == tf.variant:
            continue
        total += _elements(t) * t.dtype.size
    return float(total)


def flops_cost(graph: tf.Graph, op_names: Iterable[str]) -> float:
    """Analytic cost of a node: the FLOPs of its ops (at least 1)."""
    total = 0.0
    for name in op_names:
        total += op_flops(graph.get_operation_by_name(name))
    return max(1.0, total)


# ------------------------------------------------------------------------------------------ profiling
# /2: a node's time_us is its time alone; the step's scheduling share is an entry of its own per step
# /3: a traced node's time_us holds its share of the traced runs' time no op filled (per executed op)
PROFILE_FORMAT = "checkmate-profile/3"
_STEP_PREFIX = "step-launch:"
CACHE_ENV = "CHECKMATE_CACHE_DIR"
# Below this the measurement is call overhead, not work: no node is cheaper than this (microseconds).
MIN_TIME_US = 1.0


def cache_dir(path: "str | os.PathLike | None" = None) -> Path:
    """Where profiles are cached: ``path``, else ``$CHECKMATE_CACHE_DIR``, else ``~/.cache/checkmate/profiles``."""
    if path is not None:
        return Path(path)
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    return Path.home() / ".cache" / "checkmate" / "profiles"


def device_description() -> str:
    """The device kernels run on by default: GPU model when there is one, else the CPU model, plus the
    TF version and intra-op thread setting (both change timings), and ``kernels=eigen`` for a CPU
    whose TensorFlow runs Eigen's kernels rather than oneDNN's (checkmate.kernels), which cost
    otherwise."""
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        try:
            name = tf.config.experimental.get_device_details(gpus[0]).get("device_name") or "GPU"
        except (ValueError, RuntimeError):
            name = "GPU"
        device = f"GPU {name}"
    else:
        device = f"CPU {_cpu_model()}"
    threads = tf.config.threading.get_intra_op_parallelism_threads()
    kernels = " | kernels=eigen" if not gpus and _compat.onednn_enabled() is False else ""
    return f"{device} | tensorflow {tf.__version__} | intra_op_threads={threads or 'default'}{kernels}"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _slug(text: str) -> str:
    readable = re.sub(r"[^A-Za-z0-9]+", "-", text.split("|")[0]).strip("-")[:60]
    return f"{readable}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


class ProfileCache:
    """Measured node times for one device, in one JSON file (written atomically; never pickled)."""

    def __init__(self, directory: "str | os.PathLike | None" = None, device: str | None = None):
        self.device = device or device_description()
        # the format in the name: a cache of another format (with other meanings of time_us) is left
        # to the version that reads it rather than overwritten
        self.path = cache_dir(directory) / f"{_slug(self.device)}-{PROFILE_FORMAT.rsplit('/', 1)[1]}.json"
        self.entries: dict[str, dict] = {}
        self.calibration: dict | None = None     # the device's figures for the estimate (calibrate())
        self._dirty = False
        try:
            data = json.loads(self.path.read_text())
            if data.get("format") == PROFILE_FORMAT and data.get("device") == self.device:
                self.entries = dict(data.get("entries", {}))
                self.calibration = data.get("calibration") if isinstance(data.get("calibration"), dict) else None
        except (OSError, ValueError, AttributeError):
            self.entries = {}

    def get(self, key: str) -> float | None:
        entry = self.entries.get(key)
        if isinstance(entry, dict) and isinstance(entry.get("time_us"), (int, float)):
            return float(entry["time_us"])
        return None

    def put(self, key: str, time_us: float, **info) -> None:
        self.entries[key] = {"time_us": float(time_us), **info}
        self._dirty = True

    def save(self) -> None:
        if not self._dirty:
            return
        # Merge with entries written meanwhile by another process, then replace atomically.
        merged = {}
        calibration = self.calibration
        try:
            data = json.loads(self.path.read_text())
            if data.get("format") == PROFILE_FORMAT and data.get("device") == self.device:
                merged.update(data.get("entries", {}))
                calibration = calibration or data.get("calibration")
        except (OSError, ValueError, AttributeError):
            pass
        merged.update(self.entries)
        content = {"format": PROFILE_FORMAT, "device": self.device, "entries": merged}
        if calibration:
            content["calibration"] = calibration
        atomic_write_json(self.path, content, indent=0, sort_keys=True)
        self._dirty = False


@dataclass
class ProfileResult:
    """Per-node times (microseconds) and how many came from the cache."""

    costs: list[float]
    hits: int
    misses: int
    cache_path: str | None
    estimated: int = 0      # nodes that cost their calibrated estimate (time budget spent, or not runnable alone)
    # each op's share of the plain step's scheduling time, in every node's cost (0 for a traced step,
    # whose nodes' times hold it)
    launch_us_per_op: float = 0.0
    # the plain step's time over the sum of its nodes' times (for nodes timed alone only when that sum
    # is larger: ops ran side by side, or slowed each other down): every node's time is scaled by it,
    # so that the costs add up to the step's time, what a user pays
    overlap_scale: float = 1.0
    measured_share: float = 1.0     # share of the summed calibrated estimates in the measured (or cached) nodes
    traced: int = 0                 # nodes measured now in the trace of the whole step
    seconds: float = 0.0            # time this call took


@dataclass
class _NodeProgram:
    graph_def: Any
    feeds: list[str]  # placeholder names, in the order of ``inputs``
    inputs: list[str]  # tensor names in the profiled function's graph fed to those placeholders
    fetches: list[str]  # tensor names ("op:idx") or op names (side-effect ops without outputs)
    key: str
    summary: str


def _node_program(graph: tf.Graph, graph_def, op_names: Sequence[str],
                  nodes_by_name: dict | None = None) -> _NodeProgram:
    """A standalone GraphDef running ``op_names`` on placeholders fed with their external inputs.

    Constant inputs are copied in (their values shape the work: reduction axes, target shapes).
    ``nodes_by_name``: ``graph_def``'s nodes by name, built once by a caller that makes many programs
    (built per call, it made a 2621-node NASNetMobile's programs quadratic in the graph: minutes).
    """
    members = set(op_names)
    if nodes_by_name is None:
        nodes_by_name = {nd.name: nd for nd in graph_def.node}
    out = tf.compat.v1.GraphDef()
    out.versions.CopyFrom(graph_def.versions)
    if graph_def.library.function and _calls_functions(graph_def, nodes_by_name, op_names):
        out.library.CopyFrom(graph_def.library)
    feeds, inputs, fed = [], [], {}
    consts: dict[str, str] = {}
    signature_inputs = []
    for name in op_names:
        op = graph.get_operation_by_name(name)
        for t in op.inputs:
            if t.op.name in members or t.name in fed or t.op.name in consts:
                continue
            if t.op.type == "Const":
                consts[t.op.name] = t.op.name
                copied = out.node.add()
                copied.CopyFrom(nodes_by_name[t.op.name])
                del copied.input[:]  # a constant's only inputs are control edges from outside the node
                value = nodes_by_name[t.op.name].attr["value"].tensor.SerializeToString(deterministic=True)
                signature_inputs.append(["const", hashlib.sha256(value).hexdigest()[:16]])
                continue
            placeholder = f"checkmate_profile_input_{len(feeds)}"
            nd = out.node.add()
            nd.name = placeholder
            nd.op = "Placeholder"
            nd.attr["dtype"].type = t.dtype.as_datatype_enum
            if t.dtype != tf.resource:
                nd.attr["shape"].shape.CopyFrom(t.shape.as_proto())
            fed[t.name] = placeholder
            feeds.append(placeholder)
            inputs.append(t.name)
            signature_inputs.append(["fed", t.dtype.name, t.shape.as_list() if t.shape.rank is not None else None])
    local = {}
    signature_ops = []
    for k, name in enumerate(op_names):
        local[name] = k
        src = nodes_by_name[name]
        nd = out.node.add()
        nd.CopyFrom(src)
        del nd.input[:]
        refs = []
        for text in src.input:
            control = text.startswith("^")
            base = text[1:] if control else text
            op_name, _, idx = base.partition(":")
            tensor = f"{op_name}:{idx or 0}"
            if op_name in members:
                nd.input.append(text)
                refs.append(("^" if control else "") + f"@{local.get(op_name, op_name)}:{idx or 0}")
            elif control:
                continue
            elif op_name in consts:
                nd.input.append(text)
                refs.append(f"const:{op_name}")
            else:
                nd.input.append(fed[tensor])
                refs.append(f"in{feeds.index(fed[tensor])}")
        attrs = {a: hashlib.sha256(src.attr[a].SerializeToString(deterministic=True)).hexdigest()[:16]
                 for a in sorted(src.attr) if not a.startswith("_")}
        signature_ops.append([src.op, attrs, refs])
    fetches = []
    for name in op_names:
        op = graph.get_operation_by_name(name)
        if op.outputs:
            fetches.extend(t.name for t in op.outputs)
        else:
            fetches.append(name)
    # Const names inside refs are replaced by their content hash so that equal layers share a key.
    const_hash = {n: h for n, (_, h) in zip(consts, [s for s in signature_inputs if s[0] == "const"])}
    for op_sig in signature_ops:
        op_sig[2] = [f"const:{const_hash[r[6:]]}" if r.startswith("const:") else r for r in op_sig[2]]
    key = hashlib.sha256(json.dumps({"ops": signature_ops, "inputs": [s for s in signature_inputs if s[0] == "fed"]},
                                    sort_keys=True).encode()).hexdigest()
    summary = ",".join(graph.get_operation_by_name(n).type for n in op_names[:8])
    if len(op_names) > 8:
        summary += f",...(+{len(op_names) - 8})"
    return _NodeProgram(out, feeds, inputs, fetches, key, summary)


def _calls_functions(graph_def, nodes_by_name: dict, op_names: Sequence[str]) -> bool:
    """Whether one of ``op_names`` runs a function of ``graph_def``'s library (its type, or a function
    attribute): only then does the node's program need a copy of the library."""
    library = {f.signature.name for f in graph_def.library.function}
    for name in op_names:
        nd = nodes_by_name[name]
        if nd.op in library:
            return True
        for value in nd.attr.values():
            if value.HasField("func") or (value.HasField("list") and len(value.list.func)):
                return True
    return False


def _compile(graph_def, feeds: Sequence[str], fetches: Sequence[str], args: Sequence[Any]):
    """A concrete function running ``graph_def`` with ``feeds`` (placeholder names) bound to its
    arguments and returning the ``fetches`` that are tensors (op fetches run as side effects).

    Importing inside ``tf.function`` runs ~10x faster per call than ``wrap_function(...).prune``
    (measured on TF 2.21, CPU), which matters when timing small ops.
    """
    def body(*values):
        results = tf.graph_util.import_graph_def(
            graph_def, input_map={(f if ":" in f else f + ":0"): v for f, v in zip(feeds, values)},
            return_elements=list(fetches), name="")
        return [r for r in results if isinstance(r, tf.Tensor)]

    specs = [tf.TensorSpec(v.shape, v.dtype) for v in args]
    return tf.function(body, autograph=False).get_concrete_function(*specs)


def _batch_values(function, input_names: Sequence[str], label_names: Sequence[str], seed: int):
    """Deterministic stand-in batch: normal features, zero labels (class 0 is always a valid label)."""
    graph = function.graph
    values = []
    for k, name in enumerate((*input_names, *label_names)):
        t = graph.get_operation_by_name(name).outputs[0]
        if t.dtype.is_floating:
            if name in label_names:
                v = tf.random.stateless_uniform(t.shape, seed=(seed, k), dtype=t.dtype)
            else:
                v = tf.random.stateless_normal(t.shape, seed=(seed, k), dtype=t.dtype)
        else:
            v = tf.zeros(t.shape, t.dtype)
        values.append(v)
    return values


def _written_variables(function) -> list[tuple[Any, Any]]:
    """(handle, dtype) of every captured variable the step writes, to snapshot and restore."""
    out = []
    graph = function.graph
    for handle, placeholder in zip(function.captured_inputs, graph.internal_captures):
        if handle.dtype != tf.resource:
            continue
        consumers = placeholder.consumers()
        writes = [op for op in consumers if op.type.startswith("Assign") or op.type.startswith("ResourceApply")]
        if not writes:
            continue
        dtype = None
        for op in consumers:
            try:
                dtype = op.get_attr("dtype")
                break
            except ValueError:
                continue
        if dtype is not None:
            out.append((handle, tf.as_dtype(dtype)))
    return out


# Profiling is on the path to the first batch: no traced run of the step starts after this many
# seconds once three ran, and nodes the trace left are timed alone only until then (the rest take
# their calibrated estimate). Measured: experiments/results/README.md, section i.
DEFAULT_TIME_BUDGET_S = 5.0
# A sample further than this many median absolute deviations above the median is an outlier (another
# process took the core, a page fault, a lazy allocation) and is dropped before the median is taken.
OUTLIER_MADS = 3.0


# traced runs of a generated step that price its recomputed copies in place (in_place_share)
IN_PLACE_RUNS = 5


def robust_median(samples: Sequence[float]) -> float:
    """Median of ``samples`` after dropping the slow outliers (more than :data:`OUTLIER_MADS` median
    absolute deviations above the median). Noise on a shared machine only ever adds time."""
    values = np.asarray(samples, dtype=np.float64)
    if values.size == 0:
        raise ValueError("no samples")
    median = float(np.median(values))
    mad = float(np.median(np.abs(values - median)))
    kept = values[values <= median + OUTLIER_MADS * max(mad, 1e-3 * abs(median))]
    return float(np.median(kept)) if kept.size else median


@dataclass(frozen=True)
class Calibration:
    """What the estimate needs of a device: FLOPs and bytes per microsecond, and an op's launch time."""

    flops_per_us: float
    bytes_per_us: float
    op_launch_us: float

    def op_time_us(self, op) -> float:
        return max(op_flops(op) / self.flops_per_us, op_bytes(op) / self.bytes_per_us) + self.op_launch_us


_CALIBRATIONS: dict[str, Calibration] = {}


def calibrate(cache: "ProfileCache | None" = None) -> Calibration:
    """Measure (or read from ``cache``) the device's FLOP rate (a 512x512 matrix product), memory
    bandwidth (adding two 4 MiB vectors) and op launch time (adding two scalars, less the call)."""
    device = cache.device if cache is not None else device_description()
    keys = ("flops_per_us", "bytes_per_us", "op_launch_us")
    if device not in _CALIBRATIONS and cache is not None:
        entry = cache.calibration
        if isinstance(entry, dict) and all(isinstance(entry.get(k), (int, float)) and entry[k] > 0 for k in keys):
            _CALIBRATIONS[device] = Calibration(*(float(entry[k]) for k in keys))
    if device in _CALIBRATIONS:
        cal = _CALIBRATIONS[device]
        if cache is not None and not cache.calibration:
            cache.calibration = {k: getattr(cal, k) for k in keys}
            cache._dirty = True
        return cal

    def timed(fn, *args) -> float:
        return _time_us(tf.function(fn, autograph=False).get_concrete_function(*args), args, 9, 2)

    n = 512
    a = tf.random.stateless_normal((n, n), seed=(0, 1))
    matmul_us = timed(tf.linalg.matmul, a, a)
    v = tf.random.stateless_normal((1 << 20,), seed=(0, 2))
    add_us = timed(tf.math.add, v, v)
    s = tf.constant(1.0)
    tiny_us = timed(tf.math.add, s, s)
    overhead = _call_overhead_us(7, 2)
    launch = max(0.5, tiny_us - overhead)
    cal = Calibration(flops_per_us=2.0 * n ** 3 / max(matmul_us - overhead, 1.0),
                      bytes_per_us=3.0 * 4 * (1 << 20) / max(add_us - overhead, 1.0), op_launch_us=launch)
    _CALIBRATIONS[device] = cal
    if cache is not None:
        cache.calibration = {k: getattr(cal, k) for k in keys}
        cache._dirty = True
    return cal


def estimate_cost(graph: tf.Graph, op_names: Iterable[str], calibration: Calibration) -> float:
    """Calibrated estimate of a node's time in microseconds (see the module docstring)."""
    total = sum(calibration.op_time_us(graph.get_operation_by_name(name)) for name in op_names)
    return max(MIN_TIME_US, total)


# ------------------------------------------------------------------------------------ step tracing
# The name of the profiler event around each traced run of the step (it separates the runs).
_RUN_MARKER = "checkmate_profile_run"
# Ops that hold no data work: a rewritten op (a fusion) never absorbed one of them.
_NOT_ABSORBED = frozenset({"Const", "Placeholder", "ReadVariableOp", "VarHandleOp", "NoOp", "Identity"})
# Untraced runs of the step timed beside the trace, for the step's own time.
_UNTRACED_RUNS = 3
# Traced runs of the step (at least; ``repeats`` when larger), within the time budget: the median over
# more runs steadies the nodes' shares of the step on a loaded machine. One U-Net plan at 50%, profiled
# four times each: predicted 1.372-1.421x from 7 runs, 1.368-1.419x from 21, 1.386-1.400x from 41
# (1.3-5.8 s each). Measured: experiments/results/README.md, section i.
TRACE_RUNS = 41
# How far back from a fused op its absorbed producers are looked for (Grappler's remapper fuses chains
# of up to four ops: convolution or matrix product, bias, normalization or add, activation).
_FUSION_DEPTH = 3


@dataclass
class _Trace:
    """Per-node times (microseconds, robust median over the traced runs) read from a trace of the
    whole step, the number of runs, and how long tracing took."""

    times_us: dict[int, float]
    runs: int
    seconds: float
    step_us: float | None = None    # robust median of untraced runs of the step (the call included)


def _op_events(space, known: set[str]) -> tuple[list[tuple[float, float]], list[tuple[str, str, float, float, bool]]]:
    """(run intervals, op events) of a profiler trace; times in microseconds from the trace's clock.

    An op event is (op name, executed op type, start, duration, on a device): host threads record
    each executed op as an event named ``name:type``; on a GPU the kernels carry a ``tf_op`` stat of
    that form, and their time on the device is the op's.
    """
    runs: list[tuple[float, float]] = []
    events: list[tuple[str, str, float, float, bool]] = []
    for plane in space.planes:
        names = {k: v.name for k, v in plane.event_metadata.items()}
        device = plane.name.startswith("/device:")
        stat_names = {k: v.name for k, v in plane.stat_metadata.items()}
        tf_op_stat = next((k for k, v in stat_names.items() if v == "tf_op"), None)
        for line in plane.lines:
            base_us = line.timestamp_ns * 1e-3
            for ev in line.events:
                start = base_us + ev.offset_ps * 1e-6
                duration = ev.duration_ps * 1e-6
                label = names.get(ev.metadata_id, "")
                if device:
                    if tf_op_stat is None:
                        continue
                    label = ""
                    for stat in ev.stats:
                        if stat.metadata_id == tf_op_stat:
                            label = stat.str_value or stat_names.get(stat.ref_value, "")
                            break
                    if not label:
                        continue
                elif label == _RUN_MARKER:
                    runs.append((start, start + duration))
                    continue
                op_name, sep, op_type = label.rpartition(":")
                if not sep:
                    continue
                if op_name not in known:
                    op_name = _renamed_origin(op_name, known)
                if op_name is not None:
                    events.append((op_name, op_type, start, duration, device))
    runs.sort()
    return runs, events


_RENAMED = re.compile(r"^(.*)/\w*Optimizer/(\w+)$")


def _renamed_origin(name: str, known: set[str]) -> str | None:
    """The op of the step's graph that an executed op renamed by a Grappler pass stands for, or None.

    The arithmetic optimizer replaces a chain of additions (a normalization's ``x * scale + offset``)
    by ``<dir>/ArithmeticOptimizer/AddOpsRewrite_<op>`` (and ``..._Internal_<k>_<op>``), named after
    the last op of the chain it replaced, in that op's directory. Left unattributed, that work was in no
    node's cost, and the fusion that follows (a ``_MklSwish`` of the next activation) took the
    replaced ops for ones it absorbed, pricing a share of the activation in the normalization.
    """
    m = _RENAMED.match(name)
    if m is None:
        return None
    folder, tail = m.groups()
    parts = tail.split("_")
    for k in range(1, len(parts)):      # the longest suffix after an underscore that names a known op
        candidate = f"{folder}/{'_'.join(parts[k:])}"
        if candidate in known:
            return candidate
    return None


def _fusion_shares(graph: tf.Graph, rewritten: Iterable[str], executed: set[str],
                   calibration: Calibration) -> dict[str, list[tuple[str, float]]]:
    """For each op that ran rewritten (another type than in the step's graph: a Grappler fusion
    such as ``_FusedConv2D``, a oneDNN ``_Mkl*`` op), the ops it ran for and each one's share of its time.

    A fused op keeps the name of one original op (the last of the chain); the ops it absorbed did not
    run under their own names. They are found among its producers (up to :data:`_FUSION_DEPTH` ops
    back) that left no event in the trace, and the time is shared in proportion to each op's roofline
    time (FLOPs and bytes), so that a convolution fused into the next layer's add still costs its layer.
    """
    shares = {}
    for name in rewritten:
        op = graph.get_operation_by_name(name)
        members = [op]
        frontier = [op]
        seen = {name}
        for _ in range(_FUSION_DEPTH):
            nxt = []
            for cur in frontier:
                for t in cur.inputs:
                    src = t.op
                    if src.name in seen or src.name in executed or src.type in _NOT_ABSORBED:
                        continue
                    seen.add(src.name)
                    members.append(src)
                    nxt.append(src)
            frontier = nxt
        weights = [max(op_flops(m) / calibration.flops_per_us, op_bytes(m) / calibration.bytes_per_us)
                   for m in members]
        total = sum(weights)
        if len(members) == 1 or total <= 0:
            shares[name] = [(name, 1.0)]
        else:
            shares[name] = [(m.name, w / total) for m, w in zip(members, weights) if w > 0]
    return shares


def _exclusive_times(intervals: Sequence[tuple[float, float]]) -> list[float]:
    """Each interval's share of the wall time: every instant is split evenly among the intervals
    running then. Ops that run side by side on the inter-op threads slow each other down (two
    convolution gradients on two cores each take about twice their time alone), so their own
    durations add up to more than the step; their shares add up to the time the step was busy, and
    each op's is the time it adds (ResNet50V2 at 64x64 on two CPU cores: with the durations, the
    forward nodes held 13-15% of the step against 30% timed alone and 34% of the FLOPs)."""
    points = sorted([(start, 1, k) for k, (start, _) in enumerate(intervals)]
                    + [(end, 0, k) for k, (_, end) in enumerate(intervals)])
    out = [0.0] * len(intervals)
    active: set[int] = set()
    last = None
    for t, is_start, k in points:
        if active and last is not None and t > last:
            piece = (t - last) / len(active)
            for j in active:
                out[j] += piece
        last = t
        if is_start:
            active.add(k)
        else:
            active.discard(k)
    return out


def _attribute(graph: tf.Graph, runs: Sequence[tuple[float, float]],
               events: Sequence[tuple[str, str, float, float, bool]], op_node: dict[str, int], n_nodes: int,
               calibration: Calibration, call_us: float) -> tuple[np.ndarray, np.ndarray]:
    """(each node's time in each run, whether the trace timed the node) from a trace's run intervals
    and op events (:func:`_op_events`); ``call_us``: the time of calling the step that is no op's.

    An op's time is its exclusive time (:func:`_exclusive_times`), a rewritten op's shared with the
    ops it absorbed (:func:`_fusion_shares`); on the host, the run's time no op filled is shared per
    executed op.
    """
    executed = {e[0] for e in events}
    on_device = {e[0] for e in events if e[4]}
    rewritten = {e[0] for e in events if e[1] != graph.get_operation_by_name(e[0]).type}
    shares = _fusion_shares(graph, rewritten, executed, calibration)
    starts = np.asarray([r[0] for r in runs])
    per_run = np.zeros((len(runs), n_nodes))
    attributed = np.zeros(n_nodes, dtype=bool)
    kept = []
    for op_name, _, start, duration, device in events:
        if op_name in on_device and not device:
            continue       # the op's kernels ran on a GPU: its host event is the launch, not the work
        r = int(np.searchsorted(starts, start, side="right")) - 1
        if r < 0 or start > runs[r][1]:
            continue
        kept.append((op_name, start, duration, device, r))
    # executed ops per node and run (a fused op counted once, shared as its time is), and the time
    # the host's ops kept busy in each run
    launches = np.zeros_like(per_run)
    busy = np.zeros(len(runs))
    for on_gpu in (False, True):
        group = [e for e in kept if e[3] == on_gpu]
        exclusive = _exclusive_times([(e[1], e[1] + e[2]) for e in group])
        for (op_name, _, _, _, r), duration in zip(group, exclusive):
            if not on_gpu:
                busy[r] += duration
            for member, share in shares.get(op_name, ((op_name, 1.0),)):
                k = op_node.get(member)
                if k is not None:
                    per_run[r, k] += duration * share
                    launches[r, k] += share
                    attributed[k] = True
    if not on_device:
        # The run's time that no op filled: the executor scheduling each op after its inputs, waking a
        # thread, between one op's end and the next one's start. Each executed op pays it (an op of
        # the graph that never ran, a view or one fused away, does not): it is shared per executed
        # op, from the same run as the ops' times. Shared per op of the graph instead, from untraced
        # runs taken at another moment of a shared machine's load, it was 19 us per op in one
        # profiling of the diffusion U-Net: a GroupNorm node of 14 ops (5 never ran) cost 539 us
        # against 209 us of its ops in the trace, and plans that recompute it were over-priced.
        for r, (start, end) in enumerate(runs):
            total = launches[r].sum()
            gap = (end - start) - busy[r] - call_us
            if total > 0 and gap > 0:
                per_run[r] += gap * launches[r] / total
    return per_run, attributed


def _trace_node_times(function, args: Sequence[Any], node_ops: Sequence[Sequence[str]], calibration: Calibration,
                      repeats: int, warmup: int, deadline: float | None, progress: bool) -> _Trace:
    """Time every node inside one program, the whole plain step, from TF's profiler trace.

    ``warmup`` untimed runs, :data:`_UNTRACED_RUNS` timed ones (the step's own time), then up to
    ``repeats`` traced runs (after ``deadline``, a ``time.perf_counter()`` value, no further run starts
    once three ran).
    Each executed op is attributed to the node holding its name (an op a Grappler pass renamed, to the
    op it replaced: :func:`_renamed_origin`); a rewritten op's time is shared with the ops it absorbed
    (:func:`_fusion_shares`); the run's time no op filled is shared per executed op (:func:`_attribute`).
    A node's time in a run is the sum of its ops' and its share; its time is the :func:`robust_median`
    over the runs. Nodes none of whose ops ran under a known name
    (all folded away or fused into nodes that absorbed nothing of them) are left out.
    """
    from tqdm.auto import tqdm

    started = time.perf_counter()
    graph = function.graph
    op_node = {op: k for k, ops in enumerate(node_ops) for op in ops}
    for _ in range(warmup):
        function(*args)
    _compat.sync_devices()
    # The step's own time, untraced (the profiler slows each op's scheduling a little): what the
    # nodes' times are set against (ProfileResult.launch_us_per_op, overlap_scale).
    untraced = []
    for _ in range(_UNTRACED_RUNS):
        t0 = time.perf_counter()
        function(*args)
        _compat.sync_devices()
        untraced.append((time.perf_counter() - t0) * 1e6)
    bar = tqdm(total=repeats, desc="profiling the step", unit="run", disable=None if progress else True,
               leave=False)

    def body():
        for r in range(repeats):
            if r >= 3 and deadline is not None and time.perf_counter() > deadline:
                break
            with _compat.profiler_marker(_RUN_MARKER):
                function(*args)
                _compat.sync_devices()
            bar.update(1)

    try:
        space = _compat.profiler_trace(body)
    finally:
        bar.close()
    runs, events = _op_events(space, set(op_node))
    if not runs:
        return _Trace({}, 0, time.perf_counter() - started)
    per_run, attributed = _attribute(graph, runs, events, op_node, len(node_ops), calibration,
                                     _call_overhead_us(repeats, warmup))
    times = {k: max(MIN_TIME_US, robust_median(per_run[:, k])) for k in np.flatnonzero(attributed)}
    step_us = robust_median(untraced)
    return _Trace({int(k): float(v) for k, v in times.items()}, len(runs), time.perf_counter() - started, step_us)


def trace_op_groups(function, args: Sequence[Any], groups: Sequence[Sequence[str]], runs: int = 21,
                    warmup: int = 2) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each group of ops' time in each of ``runs`` traced runs of ``function(*args)`` (after ``warmup``
    untraced ones), attributed as :func:`profile_nodes` attributes a step's ops to its nodes: for
    reading where a program's time goes, such as a generated step's recomputed copies against the
    plain step's nodes (op names are ``function.graph``'s).

    Returns ``(exclusive_us, busy_us, run_us)``: ``exclusive_us[r, g]`` is group ``g``'s share of run
    ``r``'s wall time (each instant split among the ops running then, a fused op's time shared with
    the ops it absorbed, the time no op filled shared per executed op: what a node costs);
    ``busy_us[r, g]`` the same ops' own durations, unshared, so that ``busy / exclusive`` is how many
    ops ran beside the group's on average (1 when it ran alone); ``run_us[r]`` the runs' times.
    """
    graph = function.graph
    op_group = {op: g for g, ops in enumerate(groups) for op in ops}
    calibration = calibrate()
    for _ in range(warmup):
        function(*args)
    _compat.sync_devices()

    def body():
        for _ in range(runs):
            with _compat.profiler_marker(_RUN_MARKER):
                function(*args)
                _compat.sync_devices()

    space = _compat.profiler_trace(body)
    intervals, events = _op_events(space, set(op_group))
    exclusive, _ = _attribute(graph, intervals, events, op_group, len(groups), calibration, 0.0)
    executed = {e[0] for e in events}
    rewritten = {e[0] for e in events if e[1] != graph.get_operation_by_name(e[0]).type}
    shares = _fusion_shares(graph, rewritten, executed, calibration)
    on_device = {e[0] for e in events if e[4]}
    starts = np.asarray([r[0] for r in intervals])
    busy = np.zeros_like(exclusive)
    for op_name, _, start, duration, device in events:
        if op_name in on_device and not device:
            continue
        r = int(np.searchsorted(starts, start, side="right")) - 1
        if r < 0 or start > intervals[r][1]:
            continue
        for member, share in shares.get(op_name, ((op_name, 1.0),)):
            g = op_group.get(member)
            if g is not None:
                busy[r, g] += duration * share
    return exclusive, busy, np.asarray([end - start for start, end in intervals])


def in_place_share(function, args: Sequence[Any], first_groups: Sequence[Sequence[str]],
                   copy_groups: Sequence[Sequence[str]], runs: int = IN_PLACE_RUNS, warmup: int = 1) -> float | None:
    """The time a generated step spends in its recomputed copies over the time of its first copies,
    from ``runs`` traced runs of ``function(*args)`` (:func:`trace_op_groups`): the overhead the
    recomputations add with each copy priced where it runs.

    ``first_groups`` are the ops of every node's first computation (together, the plain step's
    work), ``copy_groups`` those of the recomputations. Both are timed in the same runs, so that the
    profiler's own cost per op cancels from the ratio. A copy placed in the backward pass shares the
    cores with backward ops that leave one of them idle: it takes less wall time than the same ops in
    the plain step's forward pass, where the profile priced them (0.5-0.98 of that price in the
    recomputations this was measured on). The ops that are neither (the step's ordering anchors and
    identities) are left out: untraced, the plan that recomputes nothing runs as fast as the plain step.
    Returns the :func:`robust_median` over the runs, or None when no run timed a first copy.
    """
    groups = [list(g) for g in first_groups] + [list(g) for g in copy_groups]
    exclusive, _, _ = trace_op_groups(function, args, groups, runs=runs, warmup=warmup)
    n = len(first_groups)
    first = exclusive[:, :n].sum(axis=1)
    copies = exclusive[:, n:].sum(axis=1)
    shares = [c / f for c, f in zip(copies, first) if f > 0]
    return float(robust_median(shares)) if shares else None


def profile_nodes(function, node_ops: Sequence[Sequence[str]], input_names: Sequence[str],
                  label_names: Sequence[str], *, batch: Sequence[Any] | None = None, repeats: int = 7,
                  warmup: int = 2, cache_dir: "str | os.PathLike | None" = None, use_cache: bool = True,
                  progress: bool = True, seed: int = 0,
                  time_budget_s: float | None = DEFAULT_TIME_BUDGET_S, trace: bool = True) -> ProfileResult:
    """Time every node of a lowered step on the current device, on its real input values.

    With ``trace`` (the default) the whole plain step runs under TF's profiler: ``warmup`` untimed
    runs, then up to :data:`TRACE_RUNS` (or ``repeats`` where larger) traced ones, and each node's
    time is the :func:`robust_median` over the runs of its ops' times in the trace (see
    :func:`_trace_node_times`): every node measured in the step's own program, as it runs there, in
    a few step times. Nodes the trace cannot attribute
    (every op folded away or renamed by Grappler), or all of them when the profiler cannot run, are
    then measured alone as below while the time budget lasts.

    Without ``trace``, or for those nodes: the step runs once (on ``batch``, or a deterministic
    stand-in batch) to record every tensor that a node reads from outside; then each node's ops run
    alone, as one pruned function fed with those values: ``warmup`` untimed calls, then ``repeats``
    timed ones (up to three times as many while the samples spread by more than 20%). The time is
    the :func:`robust_median` time minus the measured overhead of calling an empty function, at
    least ``MIN_TIME_US`` microseconds.

    A traced node's time holds its share of the step's scheduling: the time of each traced run that
    no op filled, shared per executed op of that run. Every cost is then scaled by the untraced
    step's time over the nodes' sum (``ProfileResult.overlap_scale``): one factor, which sets the
    unit and changes no ratio between costs. Without a trace, a node's cost is its time plus its ops'
    share of the step's scheduling time: the plain step's time beyond the sum of its nodes' times,
    per op (``ProfileResult.launch_us_per_op``), the same share for every node of the step, measured
    or read from the cache; when the nodes' times add up to more than the step's, each is instead
    scaled by the step's time over their sum.
    Nodes with equal keys are measured once. Results are cached per device under :func:`cache_dir`,
    keyed by the node's op types, attributes, wiring, constant inputs and input shapes and dtypes (a
    node's time alone), and per step (its share); variables the step assigns (BatchNorm statistics,
    dropout seeds) are restored afterwards. A cached time measured alone where no trace was tried does
    not price a step that was never traced: the trace measures that node again, and every node the
    trace times takes the trace's time, cached or not (one step's costs from one run).

    ``time_budget_s`` bounds the measuring (None: no bound). The trace takes ``warmup`` step runs
    and three untraced ones, then stops starting traced runs once the budget is spent and three ran:
    at most the budget plus one step time, or ``warmup`` + 6 step times where that is longer, plus
    reading the trace, whatever the node count (a 1654-node NASNetMobile step at 64x64, batch 8, on
    two shared CPU cores: every node measured in 8-11 s). A step never run before first pays for TF
    optimizing its graph, in its first warm-up run (the same NASNetMobile in a fresh process: 36.6 s
    in all; timing its nodes alone then measured none of them in 28-41 s). Nodes left are measured alone in decreasing
    order of their calibrated estimate (:func:`estimate_cost`) until the budget is spent. Those left then, or that
    cannot run alone, cost their estimate scaled by the median measured/estimated ratio of the nodes
    measured in this run. ``ProfileResult.estimated`` counts them; they are not cached.
    ``ProfileResult.measured_share`` is the share of the step's estimated cost (the sum of every
    node's calibrated estimate) in the nodes that were measured (now or in the cache).
    """
    if repeats < 1 or warmup < 0:
        raise ValueError("repeats must be >= 1 and warmup >= 0")
    from tqdm.auto import tqdm

    graph = function.graph
    graph_def = graph.as_graph_def()
    nodes_by_name = {nd.name: nd for nd in graph_def.node}
    programs = [_node_program(graph, graph_def, list(ops), nodes_by_name) for ops in node_ops]
    cache = ProfileCache(cache_dir) if use_cache else None
    # A node's cached time is its own (measured alone); the scheduling share below belongs to the step
    # the node runs in, so it is cached per step (every node's key and op count), not per node: a node
    # read from the cache then costs what a measured one does, in whichever step it was first measured.
    step_key = _STEP_PREFIX + hashlib.sha256(json.dumps([[p.key, len(ops)] for p, ops in zip(programs, node_ops)])
                                             .encode()).hexdigest()
    alone: list[float | None] = [cache.get(p.key) if cache else None for p in programs]
    launch_us = cache.get(step_key) if cache else None
    tracing = trace and (time_budget_s is None or time_budget_s > 0)
    step_traced = isinstance(cache.entries.get(step_key), dict) and bool(cache.entries[step_key].get("traced")) \
        if cache is not None else False
    if tracing and not step_traced and cache is not None and not all(
            a is None or _traced_entry(cache.entries.get(p.key)) for a, p in zip(alone, programs)):
        # A node timed alone where no trace was tried (by an earlier version, or with trace=False) is
        # measured again inside this step: alone, its ops run back to back on inputs kept hot in
        # the processor's caches by the repeated calls, which a memory-bound node does not see in the step
        # (the diffusion U-Net's GroupNorm forward: 205 us alone, 502 us in the step's trace), and a plan
        # that recomputes it then costs more than predicted. Once this step was traced (its entry says
        # so), its times are kept whatever their source. The step's scheduling share is computed again
        # beside the new times.
        alone = [a if a is None or _traced_entry(cache.entries.get(p.key)) else None for a, p in zip(alone, programs)]
        launch_us = None
    step_entry = cache.entries.get(step_key) if cache and launch_us is not None else None
    overlap = float(step_entry.get("overlap_scale", 1.0)) if isinstance(step_entry, dict) else 1.0
    hits = sum(c is not None for c in alone)
    todo = [k for k, c in enumerate(alone) if c is None]
    estimated: set[int] = set()
    measured_keys: dict[str, float] = {}
    raw: dict[str, tuple[float, float]] = {}
    step_us: float | None = None
    values = None
    sources: dict[str, str] = {}
    n_traced = 0
    refreshed: list[int] = []
    traced_ran = False
    started = time.perf_counter()
    calibration = calibrate(cache)
    guess_all = [estimate_cost(graph, ops, calibration) for ops in node_ops]
    snapshot = [(h, dt, tf.raw_ops.ReadVariableOp(resource=h, dtype=dt)) for h, dt in _written_variables(function)] \
        if todo or launch_us is None else []
    try:
        if todo:
            guess = {k: guess_all[k] for k in todo}
            # one measurement per distinct key, largest estimates first
            order: list[int] = []
            first_of: dict[str, int] = {}
            for k in sorted(todo, key=lambda k: -guess[k]):
                if programs[k].key not in first_of:
                    first_of[programs[k].key] = k
                    order.append(k)
            deadline = started + time_budget_s if time_budget_s is not None else None
            if tracing:
                try:
                    traced = _trace_node_times(function, _step_args(function, input_names, label_names, batch, seed),
                                               node_ops, calibration, max(repeats, TRACE_RUNS), warmup, deadline,
                                               progress)
                except (tf.errors.OpError, ValueError, TypeError, KeyError, RuntimeError):
                    traced = _Trace({}, 0, 0.0)     # no profiler here: every node is measured alone
                # the traced runs' times are the step's: its nodes' times and its scheduling in one run
                step_us = traced.step_us
                traced_ran = traced.runs > 0
                # nodes with equal keys (a repeated block's layers) share one time: their median
                by_key: dict[str, list[float]] = {}
                for k in range(len(programs)):
                    if k in traced.times_us:
                        by_key.setdefault(programs[k].key, []).append(traced.times_us[k])
                for key, times in by_key.items():
                    measured_keys[key] = float(np.median(times))
                    raw[key] = (measured_keys[key], 0.0)
                    sources[key] = f"trace of {traced.runs} runs"
                # Every node the trace timed takes this trace's time, cached ones too: the costs of one
                # step then come from one run under one load, not from steps traced at other times
                # (their ratios, not their sum, decide what a plan predicts).
                refreshed = [k for k in range(len(programs)) if k not in todo and programs[k].key in measured_keys]
                for k in refreshed:
                    alone[k] = measured_keys[programs[k].key]
                n_traced = sum(programs[k].key in measured_keys for k in range(len(programs)))
            order = [k for k in order if programs[k].key not in measured_keys]
            if order and (deadline is None or time.perf_counter() < deadline):
                try:
                    values = _record_inputs(function, graph_def, programs, order, input_names, label_names, batch,
                                            seed)
                except (tf.errors.OpError, ValueError, TypeError, KeyError):
                    values = None        # the step cannot run here: these nodes take their estimate
            overhead = _call_overhead_us(repeats, warmup) if values is not None else 0.0
            bar = tqdm(order, desc="profiling", unit="node", disable=None if progress else True, leave=False)
            for k in bar:
                if values is None or (deadline is not None and time.perf_counter() > deadline):
                    break
                p = programs[k]
                try:
                    args = [values[name] for name in p.inputs]
                    fn = _compile(p.graph_def, p.feeds, p.fetches, args)
                    median = _time_us(fn, args, repeats, warmup)
                except (tf.errors.OpError, ValueError, TypeError, KeyError):
                    continue     # a node that cannot run alone keeps its estimate
                measured_keys[p.key] = max(MIN_TIME_US, median - overhead)
                raw[p.key] = (median, overhead)
                if traced_ran:
                    sources[p.key] = _UNTRACEABLE
            ratios = [measured_keys[programs[k].key] / guess[k] for k in todo if programs[k].key in measured_keys]
            estimate_scale = float(np.median(ratios)) if ratios else 1.0
            for k in todo:
                if programs[k].key in measured_keys:
                    alone[k] = measured_keys[programs[k].key]
                else:
                    alone[k] = max(MIN_TIME_US, guess[k] * estimate_scale)
                    estimated.add(k)
        if launch_us is None and step_us is None:
            step_us = _step_time_us(function, values, input_names, label_names, repeats, warmup, batch, seed)
    finally:
        for h, _, value in snapshot:
            tf.raw_ops.AssignVariableOp(resource=h, value=value)
    # Each op also costs its scheduling inside the step, which a node timed alone does not show (the
    # call overhead subtracted above is the function's, not its ops'): the plain step's time beyond
    # the nodes' sum is shared out per op, so that a recomputation of many small ops (a
    # LayerNormalization) costs what it adds to the step.
    fresh_share = launch_us is None
    if launch_us is None:
        launch_us = 0.0
        if step_us is not None:
            ops_total = sum(len(ops) for ops in node_ops)
            net_us = step_us - _call_overhead_us(repeats, warmup)
            if n_traced > 0 and net_us > 0:
                # Traced nodes already hold their share of the step's scheduling, from the same runs
                # (_trace_node_times): the untraced runs, at another moment of the machine's load, only
                # set the unit, one scale for every node, which changes no plan's predicted ratio.
                overlap = net_us / sum(alone)
            else:
                launch_us = max(0.0, net_us - sum(alone)) / max(1, ops_total)
                # Timed inside the step (the trace), ops that ran side by side on the inter-op threads
                # add up to more than the step took (ResNet50V2 at 64x64 on two CPU cores: 2.3x): each
                # node then costs its share of the step's time.
                if 0 < net_us < sum(alone):
                    overlap = net_us / sum(alone)
    # the overlap's scaling keeps every node at the least measurable time, as its own timing does
    costs = [max(MIN_TIME_US, float(a) * overlap + launch_us * len(ops)) for a, ops in zip(alone, node_ops)]
    if cache is not None:
        for k in [*todo, *refreshed]:
            key = programs[k].key
            if key in measured_keys:
                median, call_us = raw[key]
                cache.put(key, alone[k], ops=programs[k].summary, repeats=repeats, median_us=median,
                          overhead_us=call_us, source=sources.get(key, "alone"))
        # a share computed with estimated nodes in its sum is not cached: it changes once they are measured
        if fresh_share and step_us is not None and not estimated:
            cache.put(step_key, launch_us, kind="step_launch_us_per_op", nodes=len(programs), step_us=step_us,
                      overlap_scale=overlap, traced=n_traced > 0)
        cache.save()
    total_guess = sum(guess_all)
    share = sum(g for k, g in enumerate(guess_all) if k not in estimated) / total_guess if total_guess > 0 else 1.0
    return ProfileResult(costs, hits, len(todo), str(cache.path) if cache else None,
                         estimated=len(estimated), launch_us_per_op=float(launch_us), measured_share=float(share),
                         overlap_scale=float(overlap),
                         traced=n_traced, seconds=time.perf_counter() - started)


# The source of a node's time measured alone after a trace of its step ran without attributing it.
_UNTRACEABLE = "alone, not in the trace"


def _traced_entry(entry: Any) -> bool:
    """Whether a cached node time is the best a trace gives: read from a trace of a whole step, or timed
    alone because such a trace could not attribute the node (no trace will)."""
    source = str(entry.get("source", "")) if isinstance(entry, dict) else ""
    return source.startswith("trace") or source == _UNTRACEABLE


def _step_args(function, input_names, label_names, batch, seed) -> list:
    """The step's arguments: ``batch`` flattened, or the deterministic stand-in batch."""
    args = list(batch) if batch is not None else _batch_values(function, input_names, label_names, seed)
    return [tf.convert_to_tensor(v) for v in tf.nest.flatten(args)]


def _step_time_us(function, values: dict | None, input_names, label_names, repeats: int, warmup: int,
                  batch=None, seed: int = 0) -> float | None:
    """Robust median time of the whole plain step on the recorded batch (``values``; without it, on
    ``batch`` or the stand-in batch) (None if it cannot run)."""
    try:
        if values is not None:
            args = [values[f"{name}:0"] for name in (*input_names, *label_names)]
        else:
            args = list(batch) if batch is not None else _batch_values(function, input_names, label_names, seed)
            args = [tf.convert_to_tensor(v) for v in tf.nest.flatten(args)]
        return _time_us(lambda *a: function(*a), args, repeats, warmup)
    except (tf.errors.OpError, ValueError, TypeError, KeyError):
        return None


def _record_inputs(function, graph_def, programs, todo, input_names, label_names, batch, seed) -> dict:
    graph = function.graph
    needed = sorted({name for k in todo for name in programs[k].inputs})
    captured = {p.op.name: h for h, p in zip(function.captured_inputs, graph.internal_captures)}
    values: dict[str, Any] = {}
    fetch = []
    for name in needed:
        op_name = name.rsplit(":", 1)[0]
        if op_name in captured:
            values[name] = captured[op_name]
        else:
            fetch.append(name)
    batch_values = list(batch) if batch is not None else _batch_values(function, input_names, label_names, seed)
    batch_values = [tf.convert_to_tensor(v) for v in tf.nest.flatten(batch_values)]
    feeds = [*input_names, *label_names]
    if len(batch_values) != len(feeds):
        raise ValueError(f"batch has {len(batch_values)} tensors, the step takes {len(feeds)}")
    for name, v in zip(feeds, batch_values):
        values[f"{name}:0"] = v
    fetch = [f for f in fetch if f not in values]
    if fetch:
        feed_names = feeds + list(captured)
        args = [*batch_values, *[captured[n] for n in captured]]
        run = _compile(graph_def, feed_names, fetch, args)
        # Run once, only to read values: Grappler's passes over the whole step with every recorded
        # tensor an output took 32-37 s of DenseNet121's 64x64 profiling, against 13-19 s without them.
        previous = tf.config.optimizer.get_experimental_options().get("disable_meta_optimizer")
        tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
        try:
            outputs = run(*args)
        finally:
            tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": previous})
        values.update(zip(fetch, outputs))
    return values


def _time_us(fn, args, repeats: int, warmup: int) -> float:
    """:func:`robust_median` of ``repeats`` timed calls after ``warmup`` untimed ones; while the
    samples spread by more than 20% (median absolute deviation over median), up to ``2 * repeats``
    more are taken."""
    for _ in range(warmup):
        fn(*args)
    _compat.sync_devices()
    samples: list[float] = []

    def sample(count: int) -> None:
        for _ in range(count):
            start = time.perf_counter()
            fn(*args)
            _compat.sync_devices()
            samples.append((time.perf_counter() - start) * 1e6)

    sample(repeats)
    for _ in range(2):
        median = float(np.median(samples))
        if float(np.median(np.abs(np.asarray(samples) - median))) <= 0.2 * median:
            break
        sample(repeats)
    return robust_median(samples)


_OVERHEAD: dict[tuple[int, int], float] = {}


def _call_overhead_us(repeats: int, warmup: int) -> float:
    """Time of calling a pruned function that does nothing (one Identity on a scalar)."""
    key = (repeats, warmup)
    if key not in _OVERHEAD:
        gdef = tf.compat.v1.GraphDef()
        p = gdef.node.add()
        p.name, p.op = "x", "Placeholder"
        p.attr["dtype"].type = tf.float32.as_datatype_enum
        i = gdef.node.add()
        i.name, i.op = "y", "Identity"
        i.input.append("x")
        i.attr["T"].type = tf.float32.as_datatype_enum
        arg = tf.constant(0.0)
        fn = _compile(gdef, ["x"], ["y:0"], [arg])
        _OVERHEAD[key] = min(_time_us(fn, [arg], max(repeats, 5), max(warmup, 2)) for _ in range(3))
    return _OVERHEAD[key]
