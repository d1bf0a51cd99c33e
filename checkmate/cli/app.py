"""The ``checkmate`` command line: the parser of every subcommand and the entry point.

Each subcommand lives in a module of this package (:mod:`.solve`, :mod:`.extract`, :mod:`.compile`,
:mod:`.sweep`, :mod:`.max_batch`, :mod:`.plot`) that declares its arguments and runs it. Exit codes
(docs/design.md §5): 0 success, 2 bad input, 3 infeasible budget, 4 solver failure, 130 interrupted by
Ctrl-C (SIGINT), 143 terminated (SIGTERM). Every error path prints exactly one line on stderr; set
``CHECKMATE_DEBUG=1`` to see the traceback instead. Commands that need TensorFlow import it only when
they run.

SIGTERM is handled like Ctrl-C: one line (``checkmate: terminated``), worker and solver processes
stopped, temporary files removed, exit 143 (128 + 15, what a shell reports for a process ended by
SIGTERM). A reader of stdout that goes away (``checkmate strategies | head -1``) ends the command
quietly with exit 0, as it does for the standard Unix tools: the reader asked for no more; output files
are written as usual.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
from typing import Sequence

# each subcommand's module by its own name (the package's __init__ imports this module)
import checkmate.cli.compile as compile_command
import checkmate.cli.extract as extract
import checkmate.cli.max_batch as max_batch
import checkmate.cli.plot as plot
import checkmate.cli.solve as solve
import checkmate.cli.sweep as sweep
from checkmate.cli._common import (EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_OK, EXIT_TERMINATED, Parser,
                                   describe_error, exit_code_for)

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
    _reopen_closed_stdout()
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        from checkmate import __version__

        print(__version__)
        return EXIT_OK
    if not getattr(args, "handler", None):
        parser.print_help()
        return EXIT_BAD_INPUT
    watch = _InterruptWatch.start()
    try:
        code = int(args.handler(args) or EXIT_OK)
        sys.stdout.flush()  # a reader gone by now is reported here, as below, not at interpreter exit
        return code
    except KeyboardInterrupt as exc:
        if watch is not None and not watch.claim():
            _wait_forever()  # the watch is already ending the process with its own line
        _end_workers()
        word, code = _stop_words()
        print(f"checkmate: {word}{f'; {exc}' if str(exc) else ''}", file=sys.stderr)
        return code
    except BrokenPipeError:
        # The reader of stdout went away (``checkmate ... | head``): it wants no more, as for any Unix
        # tool, so the command ends quietly with success. stdout now goes nowhere, since Python would
        # complain again when it flushes stdout at exit.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except MemoryError as exc:
        # the memory a solver held is released as the traceback unwinds; the report needs little
        print(f"checkmate: {describe_error(exc)}", file=sys.stderr)
        return exit_code_for(exc)
    except Exception as exc:  # one line per error; CHECKMATE_DEBUG=1 shows the traceback
        if os.environ.get("CHECKMATE_DEBUG"):
            raise
        print(f"checkmate: {describe_error(exc)}", file=sys.stderr)
        return exit_code_for(exc)
    finally:
        if watch is not None:
            watch.stop()


# How long Ctrl-C may take to unwind through Python before the process is ended from outside: a solver
# running in native code (HiGHS, TensorFlow) sees KeyboardInterrupt only when it returns, which may be
# minutes later; the unwinding itself (writing a sweep's finished rows) takes well under a second.
INTERRUPT_GRACE_S = 2.0
# The same for SIGTERM, shorter: whoever sends it (a job scheduler, a supervisor, a test harness)
# expects the process and its children gone within a couple of seconds, before its SIGKILL.
TERMINATE_GRACE_S = 1.0

# The stop signal received, if any: SIGTERM is raised as KeyboardInterrupt, so that every clean-up
# written for Ctrl-C (killing workers, writing a sweep's finished rows) runs for it too; this tells
# the two apart for the final line and the exit code.
_received: list[int] = []


def _terminate(signum, frame) -> None:
    _received.append(signum)
    raise KeyboardInterrupt()


def _stop_words(signum: int | None = None) -> tuple[str, int]:
    """The final line's word and the exit code for the stop signal ``signum`` (None: the one the
    handlers saw; KeyboardInterrupt without a handled SIGTERM is Ctrl-C)."""
    if signum == signal.SIGTERM or (signum is None and signal.SIGTERM in _received):
        return "terminated", EXIT_TERMINATED
    return "interrupted", EXIT_INTERRUPTED


class _InterruptWatch:
    """Ends the process within :data:`INTERRUPT_GRACE_S` of a Ctrl-C that Python cannot act on.

    Python's SIGINT handler only raises ``KeyboardInterrupt`` when the main thread next runs Python
    code. The C-level handler also writes the signal number to a wakeup file descriptor at once; a
    thread waiting on it gives the main thread the grace period, then kills the worker processes,
    prints the one line and exits with 130. Whoever claims the interrupt first reports it.
    """

    def __init__(self, read_fd: int, write_fd: int, previous: int):
        self._read_fd, self._write_fd, self._previous = read_fd, write_fd, previous
        self._previous_term: object = None
        self._lock = threading.Lock()
        self._claimed = False
        self._stopped = False

    @classmethod
    def start(cls) -> "_InterruptWatch | None":
        if threading.current_thread() is not threading.main_thread():
            return None  # signals reach the main thread only; an embedding caller handles them
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            # a shell starts background commands with SIGINT ignored; the command still stops on it
            signal.signal(signal.SIGINT, signal.default_int_handler)
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        try:
            previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        except ValueError:
            os.close(read_fd)
            os.close(write_fd)
            return None
        watch = cls(read_fd, write_fd, previous)
        # SIGTERM as Ctrl-C, unless the embedding program handles it itself
        watch._previous_term = signal.getsignal(signal.SIGTERM)
        if watch._previous_term in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, _terminate)
        threading.Thread(target=watch._run, name="checkmate-interrupt", daemon=True).start()
        return watch

    def claim(self) -> bool:
        with self._lock:
            if self._claimed:
                return False
            self._claimed = True
            return True

    def _run(self) -> None:
        try:
            while True:
                data = os.read(self._read_fd, 64)
                if self._stopped or not data:
                    return
                if signal.SIGTERM in data:
                    grace = TERMINATE_GRACE_S
                    break
                if signal.SIGINT in data:
                    grace = INTERRUPT_GRACE_S
                    break
            time.sleep(grace)
            if self._stopped or not self.claim():
                return
            _end_workers()
            _remove_temporaries()
            # the Python-level handler may not have run (the main thread is in native code): the
            # signal read here says which one came
            word, code = _stop_words(signal.SIGTERM if grace == TERMINATE_GRACE_S else signal.SIGINT)
            os.write(2, f"checkmate: {word}\n".encode())
            os._exit(code)
        finally:
            if self._stopped:
                os.close(self._read_fd)

    def stop(self) -> None:
        self._stopped = True
        with contextlib.suppress(ValueError):
            signal.set_wakeup_fd(self._previous)
        if signal.getsignal(signal.SIGTERM) is _terminate:  # main() called in a longer-lived process
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(signal.SIGTERM, self._previous_term if self._previous_term is not None
                              else signal.SIG_DFL)
        with contextlib.suppress(OSError):
            os.write(self._write_fd, b"\0")  # wake the thread so that it can leave
        os.close(self._write_fd)


def _end_workers() -> None:
    from checkmate.analysis.executors import terminate_descendants

    terminate_descendants()


def _remove_temporaries() -> None:
    """What a process ended by ``os._exit`` would leave: half-written outputs and multiprocessing's
    temporary folder (``pymp-*``), normally removed as the interpreter exits."""
    from checkmate.io import remove_temporaries

    remove_temporaries()
    with contextlib.suppress(Exception):
        import multiprocessing.util as mp_util
        import shutil

        folder = mp_util.process.current_process()._config.get("tempdir")  # set only once one was made
        if folder:
            shutil.rmtree(folder, ignore_errors=True)


def _wait_forever() -> None:
    while True:
        time.sleep(INTERRUPT_GRACE_S)


def _reopen_closed_stdout() -> None:
    """A command started with stdout closed (``checkmate ... >&-``) still runs and writes its output
    files; what it would print is discarded. Without this, Python has ``sys.stdout = None`` and the
    solver libraries' writes to fd 1 would land in whatever file is opened next as fd 1."""
    try:
        os.fstat(1)
    except OSError:
        fd = os.open(os.devnull, os.O_WRONLY)
        if fd != 1:
            os.dup2(fd, 1)
            os.close(fd)
    if sys.stdout is None:
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 (lives as long as the process)
