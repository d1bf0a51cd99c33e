"""Measuring the peak memory of one step on the current device, from the allocator's own statistics.

``measure_peak_memory(fn, *args)`` runs ``fn`` once to warm up (tracing, instantiation and the
first-call allocations of kernels are not the step's memory), drops that call's outputs, resets the
device allocator's peak statistic and runs ``fn`` again. The result is the allocator's peak during
that call minus what was allocated when it started: the step's own working memory (activations,
gradients, temporaries), excluding the parameters, optimizer state and inputs that were resident
before the call, and excluding the previous call's outputs.

TF 2.21 keeps these statistics for CPU (oneDNN/BFC allocators) and GPU (BFC) through the public
``tf.config.experimental.get_memory_info`` / ``reset_memory_stats`` (docs/design.md §6). TF's default CPU
allocator counts only allocations of 256 KiB and more (smaller ones go to malloc, uncounted); both it
and ``TF_CPU_ALLOCATOR_USE_BFC=true`` count whole BFC chunks, not the bytes requested (below).

Measured versus predicted (the simulator's peak minus the resident parameters and batch). The
generated step frees a value when its last consumer in the plan has run, as the memory model does,
but TF differs from the model in these ways:

* it frees earlier, never later: a value the plan holds to the end of a stage without using it dies
  at its last use, and an input a layer node reads first (a ReLU output read only by its ReluGrad)
  dies before the node ends;
* elementwise kernels (Relu, BiasAdd, Add, Mul, ReluGrad, ...) write into their input's buffer when
  that input dies with them, so an op's output often costs nothing: measured below predicted;
* kernels allocate temporaries the graph does not show (convolution workspaces, oneDNN reorders), and
  at layer level a node's internal tensors are transient and not in ``mem``: measured above predicted;
* the BFC allocator hands a request the whole of a free chunk smaller than twice its size, so the
  bytes it counts exceed the tensors' bytes by an amount that depends on the allocation history (a
  measured peak is stable within a process, but can differ between processes): measured above
  predicted. TF's own allocation log (``TF_CPP_VMODULE=log_memory=2``) gives the tensors' bytes.

On a loaded machine (other processes on every core) the executor's threads are preempted anywhere, and
the ops a generated step leaves unordered run in orders an idle machine does not show. The bytes the
kernels ask for still stay within the plan in every run: 0.96-1.00x the plan's step peak on
experiments/wall_clock.py's residual MLP and transformer at 100/70/50%, idle, under four spinning
processes and after another model's steps (experiments/results/peak_load.md; the same plans with no
order held 1.46-2.13x). What a measured peak adds on top is the allocator's chunks, 0-8% there, and
more in a process with a longer allocation history or another layout of holes (the test MLP's plan at
50%: 1.10-1.25x in fresh processes, its tensors 0.994x).

These figures are for layer graphs with gradient nodes (``gradient_nodes=True``; what
``checkmate.tf2.compile`` uses by default for graphs this small). In the compact accounting the
parameter gradients count from the start of the step and a layer's whole output stays until its
backward runs, so measured/predicted is lower (``python experiments/execution.py --gradient-nodes no``
runs the zoo models that way). On this project's CPU runs, for
the schedules at 50% of the checkpoint-all peak of the test models (tests/tf2/test_compile.py, plain
step measured first in the same process, each in a fresh process), measured/predicted was 0.99 on
the residual CNN with BatchNorm, 1.05 on the U-Net-like model and 1.03-1.06 on the MLP (1 MiB
activations, 256 KiB weight gradients). The allocator's rounding depends on the schedule and on the
allocation history: a schedule that leaves 1 MiB activations in the 1.5 MiB holes between live
256 KiB weight gradients is charged 1.5 MiB for each of them.

experiments/execution.py (experiments/results/execution_cpu.csv, BFC allocator) measured 0.75-0.98
on its MLP, 1.00 on its residual CNN, 0.97-1.06 on its U-Net and 0.91-1.10 on its transformer block.
The transformer needed two changes to the layer-level lowering. Before them, most of its schedules
that recompute measured 1.25-1.49: TF's allocation log showed the peak inside the attention layer's
backward node, whose transient tensors (the 1 MiB gradients of the score tensors and of the softmax)
were workspace, which the memory model does not count. Such a node is now split into one node per op
(checkmate.tf2.lowering, ``WORKSPACE_SPLIT_FRACTION``), and views count once.

experiments/wall_clock.py's diffusion U-Net (GroupNorm, SiLU, skip concatenations) was predicted at an
11.8 MiB checkpoint-all step peak where TF's allocation log shows 10.7 MiB of tensors at its peak
(10.1-10.6 MiB measured, chunks of the BFC allocator). The largest GroupNorm backward is split for its
workspace, and as one node per op the plan held the broadcast group statistics (``Tile``) and their
in-place scaling (``RealDiv``) as two buffers, and a gradient whose only reader writes into it in
place (``Mul`` of ``2 * grad``) until an op ordered after it by a control edge had run. Ops that write
into one buffer are now one node: 11.1 MiB predicted. The rest of the difference is TF's in-place
kernels across nodes (GroupNorm's ``x - mean`` written into the concatenation it normalizes), which
the plan's one-block values cannot express. tests/tf2/test_memory_model.py checks measured over
predicted step peaks of checkpoint-all and chen_sqrtn on five graphs, this kind of U-Net among them.
"""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any, Callable

import tensorflow as tf

# TF reads TF_CPU_ALLOCATOR_USE_BFC once, when its CPU device starts (on or before this import): a
# process that sets it later (the CLI does, for a TF it has not started yet) still has the default
# allocator when TF was already running, so what was set here is what the CPU allocator does.
_CPU_BFC_AT_IMPORT = os.environ.get("TF_CPU_ALLOCATOR_USE_BFC", "").lower() in ("1", "true")

__all__ = ["measure_peak_memory", "PeakMeasurement", "measure_step", "default_device", "counts_every_allocation",
           "available_device_memory", "onednn_note"]


def default_device() -> str:
    """``"GPU:0"`` when TF sees a GPU, else ``"CPU:0"``: where a step without placement runs."""
    return "GPU:0" if tf.config.list_logical_devices("GPU") else "CPU:0"


@dataclass(frozen=True)
class PeakMeasurement:
    device: str
    peak_bytes: int            # allocator peak during the call minus bytes in use when it started
    baseline_bytes: int        # bytes in use when the measured call started
    absolute_peak_bytes: int   # the allocator's own peak statistic (baseline included)


def _drop(outputs: Any) -> None:
    del outputs
    gc.collect()


def measure_step(fn: Callable[..., Any], *args: Any, device: str | None = None, warmup: int = 1,
                 repeats: int = 1, reduce: str = "max") -> PeakMeasurement:
    """Measure ``fn(*args)``; with ``repeats > 1``, keep the largest (``reduce="max"``) or the smallest
    (``"min"``) of the measured peaks.

    The allocator's statistics are process-wide: anything another thread allocates meanwhile (a
    ``tf.data`` prefetch left running, another model) is counted too. ``"min"`` over a few repeats
    filters such noise out; ``"max"`` is the conservative figure for a step whose own peak varies
    from call to call (the plain executor's order is not fixed).
    """
    if reduce not in ("max", "min"):
        raise ValueError(f"reduce must be 'max' or 'min', got {reduce!r}")
    device = device or default_device()
    for _ in range(warmup):
        _drop(fn(*args))
    best: PeakMeasurement | None = None
    for _ in range(max(1, repeats)):
        gc.collect()
        tf.config.experimental.reset_memory_stats(device)
        baseline = int(tf.config.experimental.get_memory_info(device)["current"])
        outputs = fn(*args)
        peak = int(tf.config.experimental.get_memory_info(device)["peak"])
        _drop(outputs)
        m = PeakMeasurement(device, max(0, peak - baseline), baseline, peak)
        if best is None or (m.peak_bytes > best.peak_bytes if reduce == "max" else m.peak_bytes < best.peak_bytes):
            best = m
    assert best is not None
    return best


def counts_every_allocation(device: str | None = None) -> bool:
    """Whether ``device``'s allocator statistics count every allocation: a GPU's BFC allocator, or the
    CPU's when ``TF_CPU_ALLOCATOR_USE_BFC`` was set as TensorFlow started (this module is imported
    with it); TF's default CPU allocator leaves allocations under 256 KiB uncounted."""
    device = device or default_device()
    return not device.upper().startswith("CPU") or _CPU_BFC_AT_IMPORT


def measure_peak_memory(fn: Callable[..., Any], *args: Any, device: str | None = None, warmup: int = 1,
                        repeats: int = 1, reduce: str = "max") -> int:
    """Peak bytes the device allocator handed out while ``fn(*args)`` ran, above what was in use
    before the call (see the module docstring and :func:`measure_step`)."""
    return measure_step(fn, *args, device=device, warmup=warmup, repeats=repeats, reduce=reduce).peak_bytes


# Allocator fragmentation, kernel workspaces (cuDNN) and the CUDA context are not visible to the
# driver's "free" figure; leave this share of the GPU out of an automatic budget.
_GPU_SAFETY_FRACTION = 0.9


def _gpu_total_bytes(index: int) -> int | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=memory.total", "--format=csv,noheader,nounits", f"--id={index}"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
        return int(float(out.strip().splitlines()[0])) * 2**20
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def _cpu_available_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def available_device_memory(device: str | None = None) -> int:
    """Bytes a step may use on ``device``: the budget ``"auto"`` resolves to.

    CPU: the kernel's ``MemAvailable`` (free plus reclaimable memory). GPU: TF reserves the GPU for
    its own allocator, so the driver's free figure is meaningless once TF runs; the device's total
    memory (nvidia-smi) times a safety fraction, minus what TF has allocated now, is used instead.
    """
    device = device or default_device()
    if device.upper().startswith("GPU"):
        index = int(device.split(":")[1]) if ":" in device else 0
        total = _gpu_total_bytes(index)
        if total is not None:
            in_use = int(tf.config.experimental.get_memory_info(device)["current"])
            return max(0, int(total * _GPU_SAFETY_FRACTION) - in_use)
    return _cpu_available_bytes()


def onednn_note() -> str | None:
    """A sentence for a CPU step when TensorFlow runs without oneDNN's kernels on an x86 CPU (imported
    before checkmate with the variable unset, or with it set to 0); None otherwise or when unknown."""
    import platform

    from checkmate.kernels import ONEDNN_ENV, X86_MACHINES
    from checkmate.tf2 import _compat

    if platform.machine().lower() not in X86_MACHINES:
        return None
    enabled = _compat.onednn_enabled()
    if enabled is None or enabled:
        return None
    return ("TensorFlow runs Eigen's CPU kernels here (oneDNN's are off), whose convolution gradients "
            "allocate workspaces the plan does not count: measured peaks can be far above the plan; set "
            f"{ONEDNN_ENV}=1 before TensorFlow is imported")
