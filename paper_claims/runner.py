"""Measure the claim groups, side by side on a pool of worker processes, and write the page.

With ``jobs > 1`` the groups run side by side in threads of this process; their FL runs (and
each ``OWN_PROCESS`` group) queue on one pool of worker processes, so the workers stay busy
until the last run however unequal the groups' costs are. The analyses of the finished runs
run here, in the groups' threads.
"""
from __future__ import annotations

import argparse
import multiprocessing
import time
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any, Callable

import torch

from . import kernels as cpu_kernels
from .context import ArmRecord, Context
from .fedgucci import claim1
from .floco import claim5
from .ima import claim4
from .lss import claim6
from .page import write_doc
from .rows import ClaimRow
from .transitivity import transitivity_claims

#: Claim groups in the order of the page (the keys of ``paper_claims.definitions.GROUPS``).
STEPS: dict[str, Callable[[Context], list[ClaimRow]]] = {
    "fedgucci": claim1, "central": transitivity_claims, "ima": claim4, "floco": claim5, "lss": claim6}
#: Groups that train in their own process (central training is not an FL run of the pool).
OWN_PROCESS = ("central",)


def context(args: argparse.Namespace, pool: Executor | None = None, group: str | None = None) -> Context:
    """The run context the arguments describe (of ``group``: its seeds), training its FL runs in ``pool`` if given."""
    ctx = Context(args.seeds, args.quick, args.cache, dataset=args.dataset, device=args.device,
                  data_root=args.data_root, threads=args.threads, pool=pool, kernels=args.kernels)
    return ctx if group is None else ctx.group(group)


Measured = tuple[list[ClaimRow], list[str], list[ArmRecord], list[tuple[str, str, int, float]]]


def measure(ctx: Context, name: str) -> Measured:
    """One claim group: rows, log lines, arm records and arm timings."""
    return STEPS[name](ctx), ctx.log_lines, ctx.arms, ctx.timings


def run_step(args: argparse.Namespace, name: str) -> Measured:
    """One claim group in a process of its own (a pool worker)."""
    torch.set_num_threads(args.threads)
    cpu_kernels.apply(args.kernels)
    return measure(context(args, group=name), name)


def measure_all(args: argparse.Namespace, names: list[str]) -> dict[str, Any]:
    """Every group's rows, log lines and arm records (see the module docstring for ``--jobs``)."""
    if args.jobs <= 1:
        return {n: measure(context(args, group=n), n) for n in names}
    spawn = multiprocessing.get_context("spawn")  # this process has threads: no fork
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=spawn) as pool, \
            ThreadPoolExecutor(max_workers=len(names)) as threads:
        futures = {n: pool.submit(run_step, args, n) if n in OWN_PROCESS else
                   threads.submit(measure, context(args, pool, n), n) for n in names}
        return {n: f.result() for n, f in futures.items()}


def measure_and_write(args: argparse.Namespace, command: str) -> list[ClaimRow]:
    """Measure the groups of ``args.only`` and write the page ``args.doc``; the rows.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed command line (``paper_claims.cli``).
    command : str
        The command that produced the page, printed on it.

    Returns
    -------
    list of ClaimRow
        The measured rows, in the page's order.
    """
    ctx = context(args)
    names = [n for n in STEPS if n in args.only]
    results = measure_all(args, names)
    rows: list[ClaimRow] = []
    for n in names:
        step_rows, lines, arms, timings = results[n]
        rows += step_rows
        ctx.log_lines += lines
        ctx.arms += arms
        ctx.timings += timings
    write_doc(args.doc, rows, ctx, command, omitted=[n for n in STEPS if n not in names])
    ctx.log(f"wrote {args.doc} after {(time.time() - ctx.started) / 60:.1f} min")
    return rows
