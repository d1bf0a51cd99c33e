"""What every ``checkmate`` command shares: the exit codes, the argument parser and its value types,
the one-line error messages, keeping stdout clean for ``--json`` and importing TensorFlow quietly.

Exit codes (docs/design.md §5): 0 success (also when the reader of stdout goes away early), 2 bad
input (output paths included, and an output that would replace an input), 3 infeasible budget, 4 solver
failure (running out of memory included), 130 interrupted (SIGINT), 143 terminated (SIGTERM).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Callable, Iterator

from checkmate.errors import CheckmateError, InfeasibleBudgetError, MissingDependencyError, SolverError
from checkmate.logs import verbose_logging

__all__ = ["EXIT_OK", "EXIT_INTERNAL", "EXIT_BAD_INPUT", "EXIT_INFEASIBLE", "EXIT_SOLVER", "EXIT_INTERRUPTED",
           "EXIT_TERMINATED",
           "Parser", "positive_int", "positive_float", "gap_fraction", "add_mip_gap", "shape", "path", "strategy_list",
           "command", "exit_code_for", "describe_error", "stdout_to_stderr", "import_tensorflow_quietly"]

EXIT_OK = 0               # also when the reader of stdout goes away before the end (``| head``)
EXIT_INTERNAL = 1          # an unexpected error (a bug)
EXIT_BAD_INPUT = 2         # also argparse's own code for a usage error
EXIT_INFEASIBLE = 3
EXIT_SOLVER = 4
EXIT_INTERRUPTED = 130     # the shell's code for a process ended by SIGINT (128 + 2)
EXIT_TERMINATED = 143      # the shell's code for a process ended by SIGTERM (128 + 15)


class Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line with exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


# ------------------------------------------------------------------------------------ argument types
def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def gap_fraction(text: str) -> float:
    """A relative MILP gap: a fraction in [0, 1) (``0.01``) or a percentage (``1%``)."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a gap such as 0.01 or 1%, got {text!r}") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a gap in [0, 1) such as 0.01 or 1%, got {text!r}")
    return value


def add_mip_gap(parser: argparse.ArgumentParser) -> None:
    """``--mip-gap``: where the MILP may stop; results looser than the proven tolerance are not optimal."""
    parser.add_argument("--mip-gap", type=gap_fraction, default=None, metavar="GAP",
                        help="relative gap at which the MILP may stop, e.g. 0.01 or 1%% (default 1e-4: "
                             "proven optimal; a looser result is reported as 'within X%%', not optimal)")


def shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(p) for p in text.replace("x", ",").split(",") if p.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a shape like 224,224,3, got {text!r}") from None
    if not dims or any(d <= 0 for d in dims):
        raise argparse.ArgumentTypeError(f"expected a shape like 224,224,3, got {text!r}")
    return dims


def path(text: str) -> str:
    """A file or directory argument: an empty one would silently mean the current directory."""
    if text == "":
        raise argparse.ArgumentTypeError("expected a path, got an empty string")
    return text


def strategy_list(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected a comma-separated list of strategy names")
    return names


# ------------------------------------------------------------------------------------ running a command
def command(run: Callable[[argparse.Namespace], int], *,
            tensorflow: bool | Callable[[argparse.Namespace], bool] = False,
            counts_memory: bool = False) -> Callable[[argparse.Namespace], int]:
    """The handler of a subcommand: prepares TensorFlow when the command needs it, then runs it.

    ``tensorflow`` is True, or a test of the arguments, for commands that import TensorFlow; it is then
    imported here, quietly, before ``run``. ``counts_memory`` marks commands that measure peaks.
    """
    def handler(args: argparse.Namespace) -> int:
        if counts_memory and "tensorflow" not in sys.modules:
            # Commands that measure peaks: TF's default CPU allocator leaves allocations under 256 KiB
            # uncounted; its BFC allocator counts every one. Read once, when TF starts; a value the
            # user set is kept.
            os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
        if tensorflow is True or (callable(tensorflow) and tensorflow(args)):
            import_tensorflow_quietly()
        # long work (lowering, profiling, solving) says what it does on stderr
        with verbose_logging(True):
            return run(args)

    return handler


def import_tensorflow_quietly() -> None:
    """Import TensorFlow with its C++ start-up log (written straight to fd 2) held back.

    TF 2.21 prints oneDNN and CUDA-probe notices before its logging is configured, so no environment
    variable silences them; they would bury the command's own messages. If the import fails, the held
    back text is shown with the error.
    """
    import tempfile

    if "tensorflow" in sys.modules:
        return
    from checkmate.kernels import prefer_onednn

    prefer_onednn()     # the CPU kernels whose temporaries the plan accounts for (checkmate.kernels)
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as held:
        os.dup2(held.fileno(), 2)
        try:
            import tensorflow as tf

            tf.constant(0.0)  # the device probe logs on first use; run it while fd 2 is held
        except ImportError as exc:
            os.dup2(saved, 2)
            if exc.name not in ("tensorflow", "keras"):
                raise
            raise MissingDependencyError("this command lowers Keras models and needs TensorFlow, which is not "
                                         "installed here: pip install 'checkmate[tf]'") from None
        except BaseException:
            os.dup2(saved, 2)
            held.seek(0)
            sys.stderr.write(held.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


@contextlib.contextmanager
def stdout_to_stderr(active: bool = True) -> Iterator[None]:
    """Send whatever is written to stdout meanwhile, by Python or by native code, to stderr.

    ``--json`` promises exactly one JSON object on stdout, but solver libraries print banners and
    logs straight to file descriptor 1 (HiGHS announces itself when a model is created). The C
    library's buffer is flushed before fd 1 is restored, so no held-back text lands on stdout later.
    """
    if not active:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        _flush_c_stdio()
        os.dup2(saved, 1)
        os.close(saved)


def _flush_c_stdio() -> None:
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):  # no C library to reach (not a POSIX build): nothing buffered there
        pass


# ------------------------------------------------------------------------------------ errors
def exit_code_for(exc: BaseException) -> int:
    if isinstance(exc, InfeasibleBudgetError):
        return EXIT_INFEASIBLE
    if isinstance(exc, (SolverError, MemoryError)):
        return EXIT_SOLVER
    # every other checkmate error is about the input (graph, schedule, argument, unsupported op)
    if isinstance(exc, (CheckmateError, OSError)):  # OSError: a file or path the user named
        return EXIT_BAD_INPUT
    return EXIT_INTERNAL


def describe_error(exc: BaseException) -> str:
    """The one line a failed command prints on stderr (after ``checkmate: ``)."""
    if isinstance(exc, InfeasibleBudgetError):
        text = str(exc)
        if exc.min_feasible_budget_bytes is not None and "minimum feasible budget" not in text:
            text += f"; minimum feasible budget: {exc.min_feasible_budget_bytes} bytes"
        return f"infeasible budget: {text}"
    if isinstance(exc, MemoryError):
        return ("out of memory: the problem is too large for this machine's memory; try a larger budget, "
                "a time limit, or --strategy hierarchical")
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    if isinstance(exc, SolverError):
        return f"solver failed: {exc}"
    if isinstance(exc, CheckmateError):
        return str(exc)
    return f"internal error: {type(exc).__name__}: {exc}"
