"""Running many independent solves: in this process, on local processes, or on a Ray cluster.

All three executors share one code path: a module-level task function ``fn(shared, task)`` is applied
to every task, where ``shared`` is a read-only payload (typically a graph as a dict) sent to each worker
once rather than with every task. Results are yielded as ``(index, result)`` in completion order, so
callers can drive a progress bar; :func:`run_tasks` returns them in task order.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import signal
import sys
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any, Callable, Iterator, Sequence

from checkmate._lifetime import die_with_parent
from checkmate.errors import BackendUnavailableError, InvalidArgumentError

__all__ = ["EXECUTORS", "run_tasks", "iter_tasks", "default_workers", "terminate_descendants", "executor_session"]

EXECUTORS = ("process", "ray", "serial")

TaskFn = Callable[[Any, Any], Any]

_WORKER_SHARED: Any = None


def default_workers() -> int:
    """One worker per core this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not on Linux
        return max(1, os.cpu_count() or 1)


def _init_worker(shared: Any, owner_pid: int | None = None, owner_tempdir: str | None = None) -> None:
    global _WORKER_SHARED
    _WORKER_SHARED = shared
    # Ctrl-C at a terminal reaches the whole process group; the parent decides what stops and ends the
    # workers itself, so a worker must neither die mid-task with a traceback nor outlive the parent.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A parent killed outright (SIGKILL) cannot end its workers: they end themselves. The forkserver,
    # not the sweep, is a worker's parent, so the sweep's pid is watched explicitly; the forkserver
    # and multiprocessing's resource tracker exit on their own once no worker holds their pipes.
    # multiprocessing's temporary folder (pymp-*) is the sweep's to remove at exit; killed, it cannot.
    die_with_parent(owner_pid, None if owner_tempdir is None else
                    lambda: shutil.rmtree(owner_tempdir, ignore_errors=True))


def _call_in_worker(fn: TaskFn, task: Any) -> Any:
    return fn(_WORKER_SHARED, task)


def _multiprocessing_tempdir() -> str | None:
    """The folder multiprocessing keeps this process's sockets in (it makes it on first use)."""
    try:
        import multiprocessing.util as mp_util

        return mp_util.get_temp_dir()
    except OSError:
        return None


def _mp_context():
    # Never plain fork: a child forked from a process whose solver (HiGHS) or TensorFlow thread pools
    # are already running inherits their locks held and deadlocks. A forkserver starts clean once and
    # forks each worker from there.
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


def iter_tasks(fn: TaskFn, tasks: Sequence[Any], *, shared: Any = None, executor: str = "process",
               workers: int | None = None) -> Iterator[tuple[int, Any]]:
    """Yield ``(index, fn(shared, tasks[index]))`` for every task, in completion order.

    Exceptions raised by ``fn`` propagate; task functions that want to record failures should catch
    them and return a value describing the failure.
    """
    if executor not in EXECUTORS:
        raise InvalidArgumentError(f"unknown executor {executor!r}; choose one of: {', '.join(EXECUTORS)}")
    if not tasks:
        return
    workers = workers or default_workers()
    if executor == "serial" or (executor == "process" and (workers == 1 or len(tasks) == 1)):
        for index, task in enumerate(tasks):
            yield index, fn(shared, task)
    elif executor == "process":
        yield from _iter_process(fn, tasks, shared, min(workers, len(tasks)))
    else:
        yield from _iter_ray(fn, tasks, shared, workers)


def _iter_process(fn: TaskFn, tasks: Sequence[Any], shared: Any, workers: int) -> Iterator[tuple[int, Any]]:
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=_mp_context(), initializer=_init_worker,
                               initargs=(shared, os.getpid(), _multiprocessing_tempdir()))
    finished = False
    try:
        pending = {pool.submit(_call_in_worker, fn, task): index for index, task in enumerate(tasks)}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                index = pending.pop(future)
                yield index, future.result()
        finished = True
    finally:
        if finished:
            pool.shutdown(wait=True)
        else:
            # Interrupted, failed, or abandoned by the caller: a running solve may take minutes to
            # reach its time limit, so the workers are ended rather than waited for.
            workers_now = list((getattr(pool, "_processes", None) or {}).values())
            pool.shutdown(wait=False, cancel_futures=True)
            for process in workers_now:
                with contextlib.suppress(Exception):
                    process.kill()


def _ray_call(fn: TaskFn, shared: Any, task: Any) -> Any:
    return fn(shared, task)


def _import_ray():
    try:
        import ray
    except ImportError:
        raise BackendUnavailableError(
            "the ray executor needs Ray: pip install 'checkmate[ray]' (or use --executor process)") from None
    return ray


def _start_ray(ray, workers: int) -> bool:
    """Connect to Ray unless this process already is; True when this call started the connection."""
    if ray.is_initialized():
        return False
    # RAY_ADDRESS selects an existing cluster; without it a local instance sized to ``workers`` starts,
    # without the dashboard (a web server nobody reads here, and seconds of start-up).
    address = os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    else:
        ray.init(num_cpus=workers, include_dashboard=False, ignore_reinit_error=True, log_to_driver=False)
    return True


@contextlib.contextmanager
def executor_session(executor: str, workers: int | None = None) -> Iterator[None]:
    """Keep the executor's workers up across several :func:`run_tasks` calls inside the block.

    Ray takes seconds to start; a caller with several rounds of tasks (a sweep's frontier, then its
    grid) starts it once here and shuts it down on leaving, where each round alone would start and
    stop its own. For the other executors it does nothing.
    """
    if executor != "ray":
        yield
        return
    ray = _import_ray()
    started_here = _start_ray(ray, workers or default_workers())
    try:
        yield
    finally:
        if started_here:
            ray.shutdown()


def _iter_ray(fn: TaskFn, tasks: Sequence[Any], shared: Any, workers: int) -> Iterator[tuple[int, Any]]:
    ray = _import_ray()
    started_here = _start_ray(ray, workers)
    try:
        remote = ray.remote(num_cpus=1)(_ray_call)
        shared_ref = ray.put(shared)
        pending = {remote.remote(fn, shared_ref, task): index for index, task in enumerate(tasks)}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                index = pending.pop(ref)
                yield index, ray.get(ref)
    finally:
        if started_here:
            ray.shutdown()


def run_tasks(fn: TaskFn, tasks: Sequence[Any], *, shared: Any = None, executor: str = "process",
              workers: int | None = None, progress: bool = False, desc: str = "solving",
              into: list[Any] | None = None, on_result: Callable[[int, Any], None] | None = None) -> list[Any]:
    """Apply ``fn(shared, task)`` to every task; results in task order. ``progress`` shows a tqdm bar.

    ``into``, a list of ``len(tasks)`` Nones, receives each result as it arrives, so that a caller
    interrupted meanwhile (``KeyboardInterrupt``) still has the results that were complete.
    ``on_result(index, result)`` is called in this process as each result arrives (to store it in a
    cache, say), whichever executor ran it.
    """
    results: list[Any] = [None] * len(tasks) if into is None else into
    bar = None
    if progress and tasks:  # nothing to run (every point cached, say): no empty bar
        from tqdm.auto import tqdm

        bar = tqdm(total=len(tasks), desc=desc, unit="solve", file=sys.stderr, leave=False)
    try:
        for index, result in iter_tasks(fn, tasks, shared=shared, executor=executor, workers=workers):
            results[index] = result
            if on_result is not None:
                on_result(index, result)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return results


def terminate_descendants() -> None:
    """Kill every process started under this one (pool workers, a forkserver, a local Ray), found
    through /proc: used when the command is interrupted and must not leave solves running."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])  # the command name may contain spaces
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    # multiprocessing's resource tracker cleans up shared memory when this process exits; killed, it
    # would be relaunched at exit and complain about what its predecessor had recorded
    from multiprocessing import resource_tracker

    keep = {getattr(getattr(resource_tracker, "_resource_tracker", None), "_pid", None)}
    stack, found = [os.getpid()], []
    while stack:
        for child in children.get(stack.pop(), []):
            if child in keep:
                continue
            found.append(child)
            stack.append(child)
    for pid in found:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
