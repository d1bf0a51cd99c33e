"""The ``checkmate`` command (console script ``checkmate``, or ``python -m checkmate``).

This package owns every subcommand, its printing and its exit codes (docs/design.md §5): 0 success,
2 bad input, 3 infeasible budget, 4 solver failure. Importing it imports neither TensorFlow nor
matplotlib; a command that needs them imports them when it runs.
"""

from __future__ import annotations

from checkmate.cli._common import (EXIT_BAD_INPUT, EXIT_INFEASIBLE, EXIT_OK, EXIT_SOLVER, stdout_to_stderr)
from checkmate.cli.app import build_parser, main

__all__ = ["main", "build_parser", "stdout_to_stderr", "EXIT_OK", "EXIT_BAD_INPUT", "EXIT_INFEASIBLE",
           "EXIT_SOLVER"]
