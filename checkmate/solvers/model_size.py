"""How big the flat MILP/LP of a graph will be, estimated from the graph alone, and whether it can be
built and solved within the memory and time available; :func:`checkmate.solvers.solve` asks before a
model is built, because building is where a large graph spends its memory (the model of a 5,000-node
chain needs tens of GiB) and its time limit (construction is not interruptible).

The model has ``R``, ``S`` and ``U`` cells for every (stage, node) pair below the diagonal and a
``FREE`` cell per (stage, edge); its rows touch each cell a small constant number of times. Measured
on chains, ResNets and U-Nets of 60 to 1,200 nodes (docs/design.md §7), the nonzeros are
``n * (4 n + 4 |E|)`` within 10% (an overestimate on all but the smallest graphs), construction peaks
at about 100 bytes per nonzero (index and value arrays, then the CSR copy), a solver's copy of the
matrix adds a fifth of that, and construction runs at 2 to 3 million nonzeros per second on one core.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from typing import TYPE_CHECKING

from checkmate.budgets import format_bytes

if TYPE_CHECKING:  # pragma: no cover
    from checkmate.graph import Graph

__all__ = ["ModelSize", "estimate_model_size", "available_memory_bytes", "model_fits", "MODEL_STRATEGIES"]

# Bytes of memory per nonzero at the model's peak: construction (~100, measured) plus a solver's copy.
BYTES_PER_NONZERO = 120
# Nonzeros built per second: the slow end of what was measured, since the machine may be shared.
NONZEROS_PER_SECOND = 2_000_000
# The share of available memory the model may take: the solver's factorization and search tree, the
# baselines run alongside it and the rest of the process need the remainder.
MEMORY_SHARE = 0.5
# The share of the time limit that construction may take: the LP and branch and bound need the rest.
BUILD_TIME_SHARE = 0.5
# Builds shorter than this are never refused for time: on a small graph the limit binds the solver,
# which honours it, and a tight limit there means "the best incumbent you have", not "give up".
MIN_REFUSED_BUILD_S = 5.0
# The strategies that build the flat model (the hierarchical strategy builds one per small segment).
MODEL_STRATEGIES = ("checkmate_milp", "checkmate_lp_rounding", "lower_bound_lp")


@dataclass(frozen=True)
class ModelSize:
    variables: int
    nonzeros: int
    bytes: int
    build_seconds: float

    def describe(self) -> str:
        return (f"about {self.variables:,} variables and {self.nonzeros:,} nonzeros: ~{format_bytes(self.bytes)} "
                f"of memory and ~{self.build_seconds:.0f} s to build")


def estimate_model_size(graph: "Graph") -> ModelSize:
    """The flat model's size for ``graph`` (see the module docstring for where the constants come from)."""
    n, edges = graph.n, len(graph.edges)
    cells = n * (n + 1) // 2
    variables = 3 * cells + n * edges // 2   # R, S, U below the diagonal; FREE per (stage, edge) on average
    nonzeros = n * (4 * n + 4 * edges)
    return ModelSize(variables, nonzeros, nonzeros * BYTES_PER_NONZERO, nonzeros / NONZEROS_PER_SECOND)


def available_memory_bytes() -> int | None:
    """Memory this process can still take: the system's available memory, capped by an address-space
    limit (``RLIMIT_AS``, ``ulimit -v``) less what the process already maps. ``None`` when unknown."""
    limits: list[int] = []
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    limits.append(int(line.split()[1]) * 1024)
                    break
    except (OSError, ValueError, IndexError):
        pass
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        limits.append(max(0, soft - _mapped_bytes()))
    return min(limits) if limits else None


def _mapped_bytes() -> int:
    try:
        with open(f"/proc/{os.getpid()}/statm") as fh:
            return int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def model_fits(graph: "Graph", time_limit_s: float | None) -> str | None:
    """``None`` when the flat model of ``graph`` can be built and solved here, else why not (one clause)."""
    size = estimate_model_size(graph)
    available = available_memory_bytes()
    if available is not None and size.bytes > MEMORY_SHARE * available:
        return f"the flat model of {graph.n} nodes needs {size.describe()}, and {format_bytes(available)} is available"
    if (time_limit_s is not None and size.build_seconds > MIN_REFUSED_BUILD_S
            and size.build_seconds > BUILD_TIME_SHARE * float(time_limit_s)):
        return (f"the flat model of {graph.n} nodes needs {size.describe()}, more than half the time limit of "
                f"{float(time_limit_s):g} s")
    return None
