"""Sharding of independent work units over local processes, Ray or Dask.

A *shard* is a picklable payload handed to a module-level function ``fn(payload)`` in a worker: a
contiguous block of grid or path points, a model whose curvature is wanted, or one client update of
an FL round. :func:`iter_shards` / :func:`run_shards` run them on a :class:`Backend`:

* ``"local"``: in this process, one shard after another (joblib's sequential backend);
* ``"loky"`` / ``"processes"``: a pool of ``n_jobs`` local worker processes;
* ``"ray"``: Ray tasks (at most ``n_jobs`` at a time); attaches to a running cluster given by
  ``address`` (or ``RAY_ADDRESS``; ``"auto"`` finds a local head), otherwise starts a local
  one with ``n_jobs`` CPUs (an already initialised Ray is used as it is);
* ``"dask"``: a ``dask.distributed`` cluster given by ``address``, the current client, or a
  temporary local cluster of ``n_jobs`` processes;
* any other registered joblib backend name (``"threading"``, ...).

Guarantees (``docs/distributed.md``): a shard's result depends only on its payload (seeds travel
inside it, never per worker), so all back ends give the same numbers up to floating-point
round-off; only the calling process writes the HDF5 cache, storing each shard as it arrives, so an
interrupted run resumes with the missing shards only; a shard whose function raises or whose worker
dies is retried up to ``retries`` times (a dead worker aborts a joblib pool, so every unfinished
shard of that pass counts one attempt; with Ray only its own task does).

Devices: ``devices=["cuda:0", "cuda:1"]`` gives each worker process one, claimed round-robin through
lock files and kept for life (the lock files live in a folder of mode 0700 in the temporary folder,
opened without following links; such a folder that is a link, belongs to another user or is
writable by others is refused with :class:`FileWriteError`); with Ray, request GPUs per task
(``ray_remote_args={"num_gpus": 1}``).
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import fcntl
import hashlib
import os
import stat
import tempfile
import threading
import traceback
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch

from .backends import Backend, ShardError, as_backend
from .errors import ConfigError, FileWriteError
from .files import open_lock_at
from .reading import what_is

# ----------------------------------------------------------------------- worker side
_WORKER_DEVICE: dict[str, str] = {}   # devices token -> device claimed by this process
_SLOT_LOCKS: list[int] = []           # fds of held slot locks (released when the process exits)
_RUNNING = threading.local()         # .device: the device of the shard running in this thread


def current_device() -> str | None:
    """The device assigned to the shard running in this thread (None outside a device-assigning back end).

    Returns
    -------
    str or None
    """
    return getattr(_RUNNING, "device", None)


def worker_device(default: str | torch.device = "auto") -> str:
    """The device assigned to the current worker by the backend, else ``default``.

    Parameters
    ----------
    default
        Returned (as a string) outside a device-assigning back end.

    Returns
    -------
    str
    """
    device = current_device()
    return device if device is not None else str(default)


def _devices_token(devices: tuple[str, ...]) -> str:
    """A short digest of ``devices``: names their slot folder and this process's claim on one of them."""
    return hashlib.sha256("|".join(devices).encode()).hexdigest()[:16]


def _slot_folder(token: str) -> tuple[Path, int]:
    """The private folder of the slot lock files of the devices ``token`` names, and its descriptor.

    The folder lies in the temporary folder.

    Created with mode 0700; an existing one is used only if it is a real folder (not a link) of
    this user that no one else may write to, since anyone can create names in the temporary
    folder. The caller closes the descriptor.
    """
    folder = Path(tempfile.gettempdir()) / f"landscape-devices-{token}"
    advice = "remove it (or set TMPDIR to a private folder): the device-slot lock files belong in a private folder"
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o700)
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        found = what_is(os.lstat(folder).st_mode) if os.path.lexists(folder) else exc.strerror
        raise FileWriteError(folder, f"is {found}, not a folder of this user; {advice}") from None
    st = os.fstat(fd)
    problem = (f"is owned by uid {st.st_uid}, not by this user (uid {os.getuid()})" if st.st_uid != os.getuid()
               else f"is writable by other users (mode {stat.S_IMODE(st.st_mode):o})" if st.st_mode & 0o022
               else None)
    if problem is not None:
        os.close(fd)
        raise FileWriteError(folder, f"{problem}; {advice}")
    return folder, fd


def _claim_device(devices: tuple[str, ...]) -> str:
    """The device of the calling process: the first free slot of ``devices`` (lock files), kept for life."""
    token = _devices_token(devices)
    if token not in _WORKER_DEVICE:
        folder, folder_fd = _slot_folder(token)
        chosen = os.getpid() % len(devices)  # every slot taken: share
        try:
            for i in range(len(devices)):
                fd = open_lock_at(folder_fd, folder / f"slot-{i}", mode=0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                _SLOT_LOCKS.append(fd)
                chosen = i
                break
        finally:
            os.close(folder_fd)
        _WORKER_DEVICE[token] = devices[chosen]
    return _WORKER_DEVICE[token]


def _attempt(fn: Callable[[Any], Any], index: int, payload: Any,
             devices: tuple[str, ...] | None) -> tuple[int, bool, Any]:
    """Run one shard in a worker; exceptions come back as text instead of aborting the pool."""
    try:
        _RUNNING.device = _claim_device(devices) if devices else None
        return index, True, fn(payload)
    except Exception as exc:  # reported to the caller, which retries the shard
        return index, False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=-3)}"
    finally:
        _RUNNING.device = None


# ----------------------------------------------------------------------- caller side
@contextmanager
def _joblib_context(backend: Backend) -> Iterator[None]:
    """The joblib configuration for ``backend``; joins or starts a Dask cluster as needed."""
    import joblib

    with ExitStack() as stack:
        if backend.name == "dask":
            try:
                from distributed import Client, LocalCluster, get_client
            except ImportError:
                raise ConfigError("backend='dask' needs dask.distributed: "
                                  "pip install 'landscape-fl[dask]'") from None
            if backend.address is not None:
                stack.enter_context(Client(backend.address))
            else:
                try:
                    get_client()
                except ValueError:  # no client yet: a temporary local cluster
                    threads = str(max(1, (os.cpu_count() or 1) // backend.workers))  # as loky does
                    cluster = stack.enter_context(LocalCluster(
                        n_workers=backend.workers, threads_per_worker=1, processes=True,
                        dashboard_address=None, env={"OMP_NUM_THREADS": threads}))
                    stack.enter_context(Client(cluster))
        stack.enter_context(joblib.parallel_config(backend=backend.joblib_name, n_jobs=backend.n_jobs,
                                                   **backend.options))
        yield


def _joblib_pass(fn: Callable[[Any], Any], payloads: Sequence[Any], pending: Sequence[int],
                 backend: Backend) -> Iterator[tuple[int, bool, Any]]:
    """One attempt at every pending shard through joblib; raises if the pool itself fails."""
    from joblib import Parallel, delayed
    from joblib.parallel import get_active_backend

    with _joblib_context(backend):
        # pools that cannot stream results run in waves of one shard per worker, so that
        # finished work still reaches the caller (and its cache) early
        streams = get_active_backend()[0].supports_return_generator
        wave = len(pending) if streams else backend.workers
        with Parallel(return_as="generator_unordered" if streams else "list") as parallel:
            for start in range(0, len(pending), wave):
                yield from parallel(delayed(_attempt)(fn, i, payloads[i], backend.devices)
                                    for i in pending[start:start + wave])


def _ray_pass(fn: Callable[[Any], Any], payloads: Sequence[Any], pending: Sequence[int],
              backend: Backend) -> Iterator[tuple[int, bool, Any]]:
    """One attempt at every pending shard as Ray tasks (at most ``n_jobs`` in flight).

    Ray tasks rather than ``ray.util.joblib``: Ray keeps its worker processes (and the
    evaluators they rebuilt) between calls, streams results, and a crashed worker fails
    only its own task.
    """
    try:
        import ray
    except ImportError:
        raise ConfigError("backend='ray' needs ray: pip install 'landscape-fl[ray]'") from None
    if not ray.is_initialized():
        local = {"num_cpus": backend.n_jobs} if backend.address is None and backend.n_jobs > 0 else {}
        ray.init(address=backend.address, include_dashboard=False, log_to_driver=False, **local)
    task = ray.remote(max_retries=0, **{"num_cpus": 1, **dict(backend.ray_remote_args or {})})(_attempt)
    limit = backend.n_jobs if backend.n_jobs > 0 else len(pending)
    queue = list(pending)
    running: dict[Any, int] = {}
    while queue or running:
        while queue and len(running) < limit:
            i = queue.pop(0)
            running[task.remote(fn, i, payloads[i], backend.devices)] = i
        ready, _ = ray.wait(list(running), num_returns=1)
        i = running.pop(ready[0])
        try:
            yield ray.get(ready[0])
        except ray.exceptions.RayError as exc:  # the worker died or could not run the task
            yield i, False, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def iter_shards(fn: Callable[[Any], Any], payloads: Sequence[Any],
                backend: Backend | str | None = None, **overrides: Any) -> Iterator[tuple[int, Any]]:
    """Yield ``(index, fn(payloads[index]))`` as shards finish (any order), retrying failures.

    Parameters
    ----------
    fn, payloads, backend, overrides
        A module-level function, one payload per shard, and a :class:`Backend` or a name with
        :class:`Backend` fields to replace (``n_jobs=``, ``retries=``, ``devices=``, ...).

    Yields
    ------
    tuple of (int, object)

    Raises
    ------
    ShardError
        If a shard still fails after ``retries`` extra attempts.
    FileWriteError
        With ``devices=``: the folder of the device-slot lock files is a link, another user's or
        writable by others.
    """
    backend = as_backend(backend, **overrides)
    if backend.devices:  # the same check as in the workers, so that a refusal is one clear error here
        os.close(_slot_folder(_devices_token(backend.devices))[1])
    run_pass = _ray_pass if backend.name == "ray" else _joblib_pass
    attempts = [0] * len(payloads)
    errors: dict[int, str] = {}
    pending = list(range(len(payloads)))
    while pending:
        done: set[int] = set()
        try:
            for index, ok, value in run_pass(fn, payloads, pending, backend):
                if ok:
                    done.add(index)
                    yield index, value
                else:
                    errors[index] = value
        except GeneratorExit:
            raise
        except Exception as exc:  # the pool itself failed (a worker died): retry what is left
            for i in pending:
                if i not in done:
                    errors.setdefault(i, f"worker pool failed: {type(exc).__name__}: {exc}")
        pending = [i for i in pending if i not in done]
        for i in pending:
            attempts[i] += 1
            if attempts[i] > backend.retries:
                raise ShardError(f"shard {i} of {len(payloads)} failed {attempts[i]} time(s) on backend "
                                 f"{backend.name!r}; last error: {errors[i].strip()}\nFix the cause, or raise "
                                 "retries= if the failure is transient (finished shards are kept).")


def run_shards(fn: Callable[[Any], Any], payloads: Sequence[Any],
               backend: Backend | str | None = None, **overrides: Any) -> list[Any]:
    """``[fn(p) for p in payloads]`` computed on ``backend`` (see :func:`iter_shards`).

    Parameters
    ----------
    fn, payloads, backend, overrides
        As for :func:`iter_shards`.

    Returns
    -------
    list
    """
    out: list[Any] = [None] * len(payloads)
    for index, value in iter_shards(fn, payloads, backend, **overrides):
        out[index] = value
    return out


# ------------------------------------------------------------------ function calls
def to_device(obj: Any, device: str | torch.device) -> Any:
    """``obj`` with every tensor, module and ``torch.device`` inside it moved to ``device``.

    Containers searched: dicts, lists, tuples and dataclasses; other values (generators,
    numbers) are kept as they are. Modules are copied before moving, never moved in place.

    Parameters
    ----------
    obj, device
        Any value, and the device to move its tensors to.

    Returns
    -------
    object
    """
    device = torch.device(device)
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, torch.device):
        return device
    if isinstance(obj, torch.nn.Module):
        tensors = [*obj.parameters(), *obj.buffers()]
        if all(t.device == device for t in tensors):
            return obj
        return copy.deepcopy(obj).to(device)
    if isinstance(obj, Mapping):
        return {k: to_device(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(to_device(v, device) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: to_device(getattr(obj, f.name), device)
                                           for f in dataclasses.fields(obj) if f.init})
    return obj


@dataclass(frozen=True)
class Call:
    """``fn(*args)``: ``fn`` a module-level function or a bound method of a picklable object.

    Attributes
    ----------
    fn, args
        The function and its positional arguments.
    """

    fn: Callable[..., Any]
    args: tuple[Any, ...]


def call_on_worker(call: Call) -> Any:
    """Run a :class:`Call` in a worker.

    When the backend assigned the worker a device, the arguments are moved there and the
    result back to the CPU.

    Parameters
    ----------
    call
        The function and its arguments.

    Returns
    -------
    object
    """
    device = current_device()
    if device is None:
        return call.fn(*call.args)
    return to_device(call.fn(*to_device(call.args, device)), "cpu")


def map_calls(fn: Callable[..., Any], args_list: Sequence[tuple[Any, ...]],
              backend: Backend | str | None = None, **overrides: Any) -> list[Any]:
    """``[fn(*args) for args in args_list]`` on ``backend`` (see :func:`call_on_worker`).

    The FL client updates of a round: ``map_calls(algorithm.client_update, [(ctx,) for ctx
    in contexts], "ray")``. Each call must be a pure function of its arguments (seeded
    generators travel inside them), so every back end returns the same results.

    Parameters
    ----------
    fn, args_list, backend, overrides
        The function, one argument tuple per call, and the back end (as for :func:`iter_shards`).

    Returns
    -------
    list
    """
    return run_shards(call_on_worker, [Call(fn, tuple(args)) for args in args_list], backend, **overrides)


