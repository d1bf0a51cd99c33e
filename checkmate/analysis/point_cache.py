"""Results of long experiment runs, kept per point so an interrupted run resumes where it stopped.

A *point* is one unit of work of a sweep or search (one strategy at one budget, one batch-size probe).
Its key is a JSON-able description of everything its result depends on (model, input shape, memory
limit, strategy, budget, solver options); the result is a JSON-able dict. Each result is its own file,
named by a hash of the key and written atomically (:mod:`checkmate.io`), so a run killed at any moment
leaves only complete results behind, and a rerun with the same settings reads them instead of
recomputing. The key is stored beside the result and compared on reading, so a hash collision or a
file from an older format reads as a miss, never as a wrong answer; so does a result that the
caller's ``valid`` check refuses (a damaged or hand-edited file).

The cache only saves work: a result that cannot be stored (a full disk, an entry that is a
directory) is reported as a warning and the run goes on with it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Callable

from checkmate.errors import CheckmateError, OutputPathError
from checkmate.io import atomic_write_json
from checkmate.solvers.types import json_native

__all__ = ["PointCache", "point_key"]

# Bumped whenever the meaning of a cached result changes, so older files read as misses.
_FORMAT_VERSION = 1

_logger = logging.getLogger("checkmate")


def point_key(key: Any) -> str:
    """The canonical text of a key: sorted JSON, so equal keys built in different orders match."""
    return json.dumps(key, sort_keys=True, separators=(",", ":"), default=str)


class PointCache:
    """Per-point results under ``directory`` (created on first write).

    ``PointCache(None)`` is a cache that stores nothing, so callers need no special case for runs
    that should not be cached.
    """

    def __init__(self, directory: str | os.PathLike | None):
        if directory is not None and not isinstance(directory, (str, os.PathLike)):
            raise OutputPathError(f"cache directory must be a path, got {type(directory).__name__}")
        if directory is not None and os.fspath(directory) == "":
            # Path("") is the current directory: an empty argument is a mistake, not a choice
            raise OutputPathError("cache directory '': not a directory name")
        self.directory = Path(directory) if directory is not None else None
        self.hits = 0
        self.misses = 0
        self.write_failures = 0
        if self.directory is not None:
            # checked before any work starts, so a run does not fail at its first finished point
            blocker = next((p for p in (self.directory, *self.directory.parents) if p.exists()), None)
            if blocker is not None and not blocker.is_dir():
                raise OutputPathError(f"cache directory {self.directory}: {blocker} is not a directory")
            if blocker is not None and not os.access(blocker, os.W_OK | os.X_OK):
                raise OutputPathError(f"cache directory {self.directory}: {blocker} is not writable")

    def _path(self, text: str) -> Path:
        assert self.directory is not None
        digest = hashlib.sha256(text.encode()).hexdigest()[:32]
        return self.directory / f"{digest}.json"

    def get(self, key: Any, valid: Callable[[dict], bool] | None = None) -> dict | None:
        """The stored result of ``key``, or ``None`` if it has none, an unreadable one, or one that
        ``valid`` (a check of every field the caller reads) refuses or raises on."""
        if self.directory is None:
            return None
        text = point_key(key)
        path = self._path(text)
        try:
            stored = json.loads(path.read_text())
        except (OSError, ValueError, RecursionError):  # RecursionError: a file nested thousands deep
            return None
        if not isinstance(stored, dict) or stored.get("version") != _FORMAT_VERSION or stored.get("key") != text:
            return None
        result = stored.get("result")
        if not isinstance(result, dict) or not result:  # every result names at least one field
            return None
        if valid is not None:
            try:
                if not valid(result):
                    return None
            except (TypeError, ValueError, KeyError, AttributeError, OverflowError, RecursionError):
                return None
        return result

    def put(self, key: Any, result: dict) -> bool:
        """Store ``result``; False (with a warning) when it cannot be written. Never raises for the
        file system: losing one cache entry must not lose the run whose result it is."""
        if self.directory is None:
            return False
        text = point_key(key)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            atomic_write_json(self._path(text), {"version": _FORMAT_VERSION, "key": text,
                                                 "result": json_native(result)}, allow_nan=False)
        except (OSError, CheckmateError, RecursionError) as exc:
            self.write_failures += 1
            # one warning per cache: a full disk would otherwise repeat it for every point
            level = logging.WARNING if self.write_failures == 1 else logging.DEBUG
            _logger.log(level, "warning: could not write a result to the cache %s (%s); the run goes on "
                        "without caching it", self.directory, _why(exc))
            return False
        return True

    def get_or_compute(self, key: Any, compute: Callable[[], dict],
                       valid: Callable[[dict], bool] | None = None) -> dict:
        """The cached result of ``key`` (if ``valid`` accepts it), computing and storing it on a miss."""
        found = self.get(key, valid)
        if found is not None:
            self.hits += 1
            return found
        self.misses += 1
        result = compute()
        self.put(key, result)
        return result

    def __len__(self) -> int:
        if self.directory is None or not self.directory.is_dir():
            return 0
        return sum(1 for _ in self.directory.glob("*.json"))


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    return str(exc) or type(exc).__name__
