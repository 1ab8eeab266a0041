"""What a long job will cost, said before it runs: :class:`JobEstimate` (the answer of every ``dry_run=True``).

A dry run counts the job's units of work (forward passes of points over batches, Hessian-vector
products, gradient steps, FL local steps), looks the job's cache keys up (without computing or
writing anything), estimates the peak memory from its parts and times one unit after a warm-up
(:func:`time_once`: the median of :data:`TIMED_REPEATS` calls); the estimated time is
``sum(todo * seconds_each)`` over the units.
Times vary with the machine and its load; counts and cache lookups do not.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch

from .host_memory import format_bytes

#: Timed calls of one unit of work (after a warm-up call); the estimate takes their median.
TIMED_REPEATS = 3


@dataclass(frozen=True)
class Work:
    """One kind of unit of work of a job.

    Attributes
    ----------
    unit : str
        What one unit is (``"forward pass"``, ``"Hessian-vector product"``, ``"gradient step"``,
        ``"local step"``).
    count : int
        Units the whole job needs.
    todo : int
        Units left after the cache (``count`` when nothing is stored).
    seconds_each : float
        Time of one unit, measured once after a warm-up.
    detail : str
        How ``count`` arises (``"441 points x 4 batches"``).
    """

    unit: str
    count: int
    todo: int
    seconds_each: float
    detail: str = ""

    @property
    def seconds(self) -> float:
        """Estimated time of the units left: ``todo * seconds_each``."""
        return self.todo * self.seconds_each


@dataclass(frozen=True)
class CacheLookup:
    """What one cache key (or run folder) of a job already holds.

    Attributes
    ----------
    what : str
        The entry looked up (``"plane points"``, ``"hessian_eigen result"``, ``"run folder runs/x"``).
    found : int
        Parts already stored (points, rounds; 1 for a whole stored result).
    total : int
        Parts the job needs.
    key : str
        The cache key (empty for a run folder).
    """

    what: str
    found: int
    total: int
    key: str = ""


@dataclass(frozen=True)
class JobEstimate:
    """A dry run's answer: the work, the memory, the cache hits and the time of a job; nothing computed.

    Attributes
    ----------
    job : str
        The job (``"plane"``, ``"hessian_eigen"``, ``"fl.run"``, ...).
    work : tuple of Work
        Its units of work.
    memory : Mapping[str, int]
        Parts of the peak memory in bytes (parameters, chunk, activations, data, solver vectors).
    cache : tuple of CacheLookup
        What the cache (or run folder) already holds.
    notes : tuple of str
        Further remarks (what was timed, upper bounds).

    Examples
    --------
    >>> from landscape.infra.estimate import JobEstimate, Work
    >>> est = JobEstimate("plane", (Work("forward pass", 50, 50, 0.01, "25 points x 2 batches"),), {"data": 1024})
    >>> est.count("forward pass"), est.seconds, est.peak_bytes
    (50, 0.5, 1024)
    """

    job: str
    work: tuple[Work, ...]
    memory: Mapping[str, int] = field(default_factory=dict)
    cache: tuple[CacheLookup, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def seconds(self) -> float:
        """Estimated time of the work left after the cache, in seconds."""
        return float(sum(w.seconds for w in self.work))

    @property
    def peak_bytes(self) -> int:
        """Estimated peak memory: the sum of the parts of ``memory``."""
        return int(sum(self.memory.values()))

    def count(self, unit: str) -> int:
        """Units of kind ``unit`` the whole job needs (0 when it has none).

        Parameters
        ----------
        unit : str
            ``"forward pass"``, ``"Hessian-vector product"``, ``"gradient step"`` or ``"local step"``.

        Returns
        -------
        int
        """
        return sum(w.count for w in self.work if w.unit == unit)

    def todo(self, unit: str) -> int:
        """Units of kind ``unit`` left after the cache.

        Parameters
        ----------
        unit : str
            As for :meth:`count`.

        Returns
        -------
        int
        """
        return sum(w.todo for w in self.work if w.unit == unit)

    def to_dict(self) -> dict[str, Any]:
        """The estimate as JSON-ready built-in types.

        Returns
        -------
        dict
            ``job``, ``work`` (one dict per unit), ``seconds``, ``memory``, ``peak_bytes``, ``cache``, ``notes``.
        """
        return {"job": self.job,
                "work": [{"unit": w.unit, "count": w.count, "todo": w.todo, "seconds_each": w.seconds_each,
                          "detail": w.detail} for w in self.work],
                "seconds": self.seconds, "memory": dict(self.memory), "peak_bytes": self.peak_bytes,
                "cache": [{"what": c.what, "found": c.found, "total": c.total, "key": c.key} for c in self.cache],
                "notes": list(self.notes)}

    def __str__(self) -> str:
        lines = [f"dry run of {self.job}: nothing computed, nothing written"]
        for w in self.work:
            detail = f" ({w.detail})" if w.detail else ""
            each = f", {w.seconds_each * 1e3:.3g} ms each" if w.todo else ""
            lines.append(f"  {w.count:,} {plural(w.unit, w.count)}{detail}, {w.todo:,} to compute{each}")
        lines.append(f"  time: about {format_seconds(self.seconds)} (from a timed unit; times vary)")
        parts = ", ".join(f"{k} {format_bytes(v)}" for k, v in self.memory.items())
        lines.append(f"  memory: peak about {format_bytes(self.peak_bytes)}" + (f" ({parts})" if parts else ""))
        for c in self.cache:
            key = f" [{c.key[:12]}]" if c.key else ""
            lines.append(f"  cache: {c.what}: {c.found:,} of {c.total:,} stored{key}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __repr__(self) -> str:
        units = dict.fromkeys(w.unit for w in self.work)
        work = ", ".join(f"{self.count(u):,} {plural(u, self.count(u))}" for u in units)
        return f"JobEstimate({self.job}: {work}, ~{format_seconds(self.seconds)}, peak {format_bytes(self.peak_bytes)})"


def combined(job: str, estimates: Sequence[JobEstimate], notes: Sequence[str] = ()) -> JobEstimate:
    """One estimate of jobs run one after the other (a curve's training, then its evaluation).

    Parameters
    ----------
    job : str
        Name of the whole.
    estimates : sequence of JobEstimate
        The parts, in order.
    notes : sequence of str
        Further remarks.

    Returns
    -------
    JobEstimate
        Their work and cache lookups concatenated; each memory part the largest of the parts' (the
        jobs do not run at once).
    """
    memory: dict[str, int] = {}
    for est in estimates:
        for name, size in est.memory.items():
            memory[name] = max(memory.get(name, 0), int(size))
    return JobEstimate(job, tuple(w for e in estimates for w in e.work), memory,
                       tuple(c for e in estimates for c in e.cache),
                       tuple(dict.fromkeys([n for e in estimates for n in e.notes] + list(notes))))


def time_once(fn: Callable[[], Any], device: torch.device | str = "cpu", repeats: int = TIMED_REPEATS) -> float:
    """Seconds of one call of ``fn``: the median of ``repeats`` timed calls after one untimed warm-up call.

    The warm-up pays one-time costs (allocations, kernel selection, compilation); the median of a
    few calls keeps one call slowed down (or sped up) by other work on a shared machine from deciding
    the estimate. CUDA work is synchronised before each clock read.

    Parameters
    ----------
    fn : callable
        The unit of work (a few points, one product, one client update, one file write).
    device : torch.device or str
        Where ``fn`` runs.
    repeats : int
        Timed calls (at least 1).

    Returns
    -------
    float
        Seconds (at least 1e-9).
    """
    device = torch.device(device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    fn()
    sync()
    times = []
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return max(statistics.median(times), 1e-9)


def tensor_bytes(tensors: Any) -> int:
    """Bytes of every tensor in a (nested) tuple, list or dict.

    Parameters
    ----------
    tensors : Any
        A tensor or containers of them (other values count zero).

    Returns
    -------
    int
    """
    if isinstance(tensors, torch.Tensor):
        return tensors.numel() * tensors.element_size()
    if isinstance(tensors, Mapping):
        return sum(tensor_bytes(v) for v in tensors.values())
    if isinstance(tensors, (tuple, list)):
        return sum(tensor_bytes(v) for v in tensors)
    return 0


def output_bytes(module: torch.nn.Module, call: Callable[[], Any]) -> int:
    """Bytes of every tensor the submodules of ``module`` output while ``call()`` runs (forward hooks).

    Parameters
    ----------
    module : torch.nn.Module
        The model whose submodules are watched.
    call : callable
        Runs one forward pass (of one batch).

    Returns
    -------
    int
        The sum over the submodules' outputs: the activations one forward pass holds.
    """
    total = 0

    def hook(_m: torch.nn.Module, _i: tuple, out: object) -> None:
        nonlocal total
        if isinstance(out, torch.Tensor):
            total += out.numel() * out.element_size()

    handles = [m.register_forward_hook(hook) for m in module.modules()]
    try:
        call()
    finally:
        for h in handles:
            h.remove()
    return total


def plural(unit: str, n: int) -> str:
    """``unit`` with an ``s`` or ``es`` (``"forward passes"``, ``"batches"``) unless ``n == 1``.

    Parameters
    ----------
    unit : str
        The unit's name.
    n : int
        How many.

    Returns
    -------
    str
    """
    if n == 1:
        return unit
    return unit + ("es" if unit.endswith(("ss", "ch", "sh", "x")) else "s")


def format_seconds(seconds: float) -> str:
    """A duration in the unit that reads best (``"850 ms"``, ``"12.3 s"``, ``"4.2 min"``, ``"3.1 h"``).

    Parameters
    ----------
    seconds : float
        The duration.

    Returns
    -------
    str
    """
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 7200:
        return f"{seconds / 60:.3g} min"
    return f"{seconds / 3600:.3g} h"
