"""Studies built on the solvers: budget sweeps, maximum batch size search, and their plots.

Nothing here is imported by ``checkmate`` itself. matplotlib is imported lazily, inside the
plotting functions of :mod:`checkmate.analysis.plots`, and always with the Agg backend.
"""

from __future__ import annotations

__all__ = ["sweep", "max_batch", "plots"]
