"""The ``checkmate`` command line: the parser of every subcommand and the entry point.

Each subcommand lives in a module of this package (:mod:`.solve`, :mod:`.extract`, :mod:`.compile`,
:mod:`.sweep`, :mod:`.max_batch`, :mod:`.plot`) that declares its arguments and runs it. Exit codes
(docs/design.md §5): 0 success, 2 bad input, 3 infeasible budget, 4 solver failure. Every error path
prints exactly one line on stderr; set ``CHECKMATE_DEBUG=1`` to see the traceback instead. Commands
that need TensorFlow import it only when they run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Sequence

from checkmate.cli import compile as compile_command
from checkmate.cli import extract, max_batch, plot, solve, sweep
from checkmate.cli._common import (EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_OK, Parser, describe_error,
                                   exit_code_for)

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="checkmate", description="Optimal tensor rematerialization for TensorFlow 2.")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    solve.add_parsers(sub)              # strategies, solve
    extract.add_parser(sub)
    compile_command.add_parser(sub)
    sweep.add_parser(sub)
    max_batch.add_parser(sub)
    plot.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # TensorFlow's C++ INFO/WARNING logs would bury the command's own one-line messages; a user who
    # wants them can set the variable explicitly.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        from checkmate import __version__

        print(__version__)
        return EXIT_OK
    if not getattr(args, "handler", None):
        parser.print_help()
        return EXIT_BAD_INPUT
    try:
        return int(args.handler(args) or EXIT_OK)
    except KeyboardInterrupt:
        print("checkmate: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # the reader of stdout went away (``checkmate ... | head``): nothing more can be shown there,
        # and Python would complain again when it flushes stdout at exit
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_INTERNAL
    except Exception as exc:  # one line per error; CHECKMATE_DEBUG=1 shows the traceback
        if os.environ.get("CHECKMATE_DEBUG"):
            raise
        print(f"checkmate: {describe_error(exc)}", file=sys.stderr)
        return exit_code_for(exc)
