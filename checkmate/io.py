"""Writing output files without ever destroying what was there: every file checkmate writes (graphs,
schedules, sweep CSV/JSON, figures, the profile cache) goes through this module.

An output is written to a temporary file beside its target and renamed over it only once it is
complete, so a reader sees the old file or the new one, never half of one. The target is checked
first: a symbolic link is followed (its target is what gets replaced, the link stays); a target that
is not a regular file (a directory, a device, a pipe) or that is read-only is refused with
:class:`~checkmate.errors.OutputPathError`, as is a parent path that runs through a file. A write that
fails removes its temporary file and leaves the target as it was. :class:`StagedOutputs` stages
several files and renames them together at the end, so a run that fails late changes none of them.
The temporary files being written are also known to :func:`remove_temporaries`, which a process ended
from outside (the command line's handling of Ctrl-C and SIGTERM) calls before it exits.

:func:`refuse_input_as_output` keeps a command from writing its result over one of its own inputs.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

from checkmate.errors import OutputPathError

__all__ = ["output_target", "atomic_output", "atomic_write_text", "atomic_write_bytes", "atomic_write_json",
           "json_text", "StagedOutputs", "read_text", "remove_temporaries", "refuse_input_as_output",
           "check_path_argument"]

# The permission bits a new output gets before the umask, as ``open(path, "w")`` would give it.
_NEW_FILE_MODE = 0o666
_WRITE_BITS = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH


# Temporary files that exist right now (written, not yet renamed or removed); a set, since outputs may
# be staged from several threads.
_LIVE_TEMPORARIES: set[Path] = set()


def remove_temporaries() -> None:
    """Remove every temporary output file this process is still writing: for a process that is about
    to end without unwinding (``os._exit``), which would otherwise leave them beside their targets."""
    for tmp in list(_LIVE_TEMPORARIES):
        _discard(tmp)


def check_path_argument(path: Any, what: str) -> str | os.PathLike:
    """``path`` if it is a non-empty path; an empty one would silently mean the current directory."""
    if not isinstance(path, (str, os.PathLike)):
        raise OutputPathError(f"{what} must be a path, got {type(path).__name__}")
    if os.fspath(path) == "":
        raise OutputPathError(f"{what} is empty: give a file or directory name")
    return path


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def refuse_input_as_output(output: str | os.PathLike, *inputs: str | os.PathLike | None,
                           option: str = "--out") -> None:
    """Raise :class:`OutputPathError` if writing ``output`` would replace one of ``inputs`` (the same
    file, through a symbolic or hard link, or the same path)."""
    out = Path(os.path.realpath(output))
    for given in inputs:
        if given is None or os.fspath(given) == "":
            continue
        source = Path(os.path.realpath(given))
        if out == source or _same_file(out, source):
            raise OutputPathError(f"{option} {str(output)!r} is the input file {str(given)!r}: writing it would "
                                  "replace the input; choose another output")


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def output_target(path: str | os.PathLike) -> Path:
    """The regular file that writing ``path`` will replace, after following symbolic links.

    Creates missing parent directories. Raises :class:`OutputPathError` for a target that is not a
    regular file, is read-only, or lies under something that is not a directory.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise OutputPathError(f"an output path must be a str or path, got {type(path).__name__}")
    given = Path(path)
    if str(path) == "" or given.name in ("", ".", ".."):
        raise OutputPathError(f"cannot write {str(path)!r}: not a file name")
    target = Path(os.path.realpath(given))
    try:
        st = os.stat(target)
    except FileNotFoundError:
        st = None
    except NotADirectoryError:
        raise OutputPathError(f"cannot write {str(path)!r}: a parent of it is not a directory") from None
    except OSError as exc:
        raise OutputPathError(f"cannot write {str(path)!r}: {exc.strerror or exc}") from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise OutputPathError(f"cannot write {str(path)!r}: it is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise OutputPathError(f"cannot write {str(path)!r}: it is not a regular file")
        # root may write anything, so os.access alone would let a read-only file be overwritten
        if not st.st_mode & _WRITE_BITS or not os.access(target, os.W_OK):
            raise OutputPathError(f"cannot write {str(path)!r}: the file is read-only")
    parent = target.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise OutputPathError(f"cannot write {str(path)!r}: a parent of it is not a directory") from None
    except OSError as exc:
        raise OutputPathError(f"cannot create the directory of {str(path)!r}: {exc.strerror or exc}") from None
    if not parent.is_dir():
        raise OutputPathError(f"cannot write {str(path)!r}: a parent of it is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputPathError(f"cannot write {str(path)!r}: its directory is not writable")
    return target


def _temp_beside(target: Path) -> Path:
    try:
        fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise OutputPathError(f"cannot write {str(target)!r}: {exc.strerror or exc}") from None
    os.close(fd)
    _LIVE_TEMPORARIES.add(Path(name))
    return Path(name)


def _mode_for(target: Path) -> int:
    try:
        return stat.S_IMODE(os.stat(target).st_mode)  # replacing a file keeps its permissions
    except OSError:
        return _NEW_FILE_MODE & ~_current_umask()


def _discard(tmp: Path) -> None:
    with contextlib.suppress(OSError):
        tmp.unlink()
    _LIVE_TEMPORARIES.discard(tmp)


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path to write; on success it replaces ``path``'s target, on error it is removed."""
    target = output_target(path)
    tmp = _temp_beside(target)
    try:
        yield tmp
        os.chmod(tmp, _mode_for(target))
        os.replace(tmp, target)
        _LIVE_TEMPORARIES.discard(tmp)
    except BaseException:
        _discard(tmp)
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    with atomic_output(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def json_text(data: Any, *, indent: int | None = 1, **dumps: Any) -> str:
    """``data`` as JSON text that a person can read and a large document is quick to write: an object's
    members one per line (``indent`` spaces a level), a list of objects one object per line, and every
    other value (a list of numbers, of pairs, an object inside a list) on one line, written by the
    json module's C encoder. ``json.dumps`` with an ``indent`` writes every number of a list on a line of
    its own in pure Python: seconds and tens of megabytes for a schedule of a few thousand nodes, whose
    ``retain`` holds hundreds of thousands of pairs. ``indent=None``: one line. The text parses to the
    same value as ``json.dumps(data, **dumps)``'s."""
    if indent is None:
        return json.dumps(data, **dumps)
    step = " " * int(indent)

    def text(value: Any, level: int) -> str:
        inner = step * (level + 1)
        if isinstance(value, dict) and value and all(isinstance(k, str) for k in value):
            keys = sorted(value) if dumps.get("sort_keys") else list(value)
            members = [f"{inner}{json.dumps(k, **dumps)}: {text(value[k], level + 1)}" for k in keys]
            return "{\n" + ",\n".join(members) + "\n" + step * level + "}"
        if isinstance(value, (list, tuple)) and any(isinstance(v, dict) for v in value):
            return "[\n" + ",\n".join(inner + json.dumps(v, **dumps) for v in value) + "\n" + step * level + "]"
        return json.dumps(value, **dumps)

    return text(data, 0)


def atomic_write_json(path: str | os.PathLike, data: Any, *, indent: int | None = 1, **dumps: Any) -> Path:
    """``data`` written atomically as :func:`json_text`."""
    return atomic_write_text(path, json_text(data, indent=indent, **dumps) + "\n")


class StagedOutputs:
    """Several outputs that appear together or not at all.

    ``stage(path, write)`` checks the target, creates a temporary file beside it and calls
    ``write(tmp_path)``; ``commit()`` renames every staged file over its target. Leaving the ``with``
    block by an exception (or without ``commit``) removes every temporary file and changes no target.
    """

    def __init__(self) -> None:
        self._staged: list[tuple[Path, Path]] = []

    def __enter__(self) -> "StagedOutputs":
        return self

    def stage(self, path: str | os.PathLike, write: Callable[[Path], Any]) -> Path:
        target = output_target(path)
        tmp = _temp_beside(target)
        self._staged.append((tmp, target))
        write(tmp)
        return Path(path)

    def commit(self) -> None:
        for tmp, target in self._staged:
            os.chmod(tmp, _mode_for(target))
        for tmp, target in self._staged:
            os.replace(tmp, target)
            _LIVE_TEMPORARIES.discard(tmp)
        self._staged.clear()

    def __exit__(self, *exc_info: Any) -> None:
        for tmp, _ in self._staged:
            _discard(tmp)
        self._staged.clear()


def read_text(path: str | os.PathLike, what: str, error: type[Exception]) -> str:
    """A UTF-8 text input file (a byte-order mark allowed), with unreadable or undecodable files raised
    as ``error`` naming ``what`` and the path."""
    try:
        return Path(path).read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise error(f"cannot read {what} {str(path)!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte {exc.start}): not a JSON {what}") from None
