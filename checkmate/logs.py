"""The ``checkmate`` logger and the ``verbose=`` switch of long-running calls.

Every module logs under ``checkmate`` (``logging.getLogger("checkmate.<area>")``): lowering, profiling
and solving say what they start and how long it took, at INFO. Library calls are silent unless the
application configures logging or passes ``verbose=True``, which shows those messages on stderr for
the duration of the call; the command-line interface turns it on for every command.
"""

from __future__ import annotations

import logging
import sys
from contextlib import contextmanager
from typing import Iterator

__all__ = ["logger", "verbose_logging"]

logger = logging.getLogger("checkmate")
# a library's logger: silent until the application, or verbose=True, gives it a handler
logger.addHandler(logging.NullHandler())


@contextmanager
def verbose_logging(verbose: bool | int = True) -> Iterator[None]:
    """Show the ``checkmate`` logger's INFO messages (DEBUG for ``verbose >= 2``) on stderr inside
    the block; nested blocks and an application's own configuration are left as they are."""
    if not verbose or any(getattr(h, "_checkmate_verbose", False) for h in logger.handlers):
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("checkmate: %(message)s"))
    handler._checkmate_verbose = True
    level = logging.DEBUG if int(verbose) >= 2 else logging.INFO
    previous = logger.level
    logger.addHandler(handler)
    if previous == logging.NOTSET or previous > level:
        logger.setLevel(level)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)
