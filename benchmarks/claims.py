"""Measure the papers' claims over paired seeds; write docs/claims.md.

Every FL run comes from a recipe of :mod:`fl.recipes` (``<paper>-<dataset>``; a baseline is
the same recipe run by another algorithm); central training (claims 2-3) uses the Trainer of
``examples/transitivity.py``. Runs are stored under ``--cache`` and reused by a rerun. Each
claim prints per-seed values, the paired 95% interval and a verdict (rules in
``benchmarks/claim_stats.py``); a claim whose arms did not converge gets no verdict. The
table, the FedAvg plateau of every setting and the log are written to ``--doc``.

The CPU kernels are pinned (``benchmarks/claim_kernels.py``): the script restarts itself with
the pinned environment before torch is imported, so it and its workers compute the same bits
on any x86-64 CPU with AVX2; each run folder records its kernels (``kernels.json``) and is
reused only under the same ones. ``--kernels native`` keeps the host's faster kernels.

    .venv/bin/python benchmarks/claims.py --jobs 2                      # the measurement (MNIST-1D, CPU)
    .venv/bin/python benchmarks/claims.py --only ima --seeds 0 1        # one paper's claims
    .venv/bin/python benchmarks/claims.py --quick --doc /tmp/claims.md  # smoke test (tiny settings)
    .venv/bin/python benchmarks/claims.py --device cuda --dataset cifar10 --data-root DIR --doc claims-cifar10.md
"""
from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "examples")]
import claim_kernels  # noqa: E402

if __name__ == "__main__":  # before torch is imported: restart with the pinned kernels
    claim_kernels.reexec(sys.argv)

import torch  # noqa: E402

from claim_checks import transitivity_claims  # noqa: E402
from claim_context import ArmRecord, Context  # noqa: E402
from claim_doc import write_doc  # noqa: E402
from claim_fedgucci import claim1  # noqa: E402
from claim_floco import claim5  # noqa: E402
from claim_ima import claim4  # noqa: E402
from claim_lss import claim6  # noqa: E402
from claim_stats import ClaimRow  # noqa: E402

#: Claim groups in the order of the page.
STEPS: dict[str, Callable[[Context], list[ClaimRow]]] = {
    "fedgucci": claim1, "central": transitivity_claims, "ima": claim4, "floco": claim5, "lss": claim6}
#: Groups that train in their own process (central training is not an FL run of the pool).
OWN_PROCESS = ("central",)


def context(args: argparse.Namespace, pool: Executor | None = None) -> Context:
    """The run context the arguments describe, training its FL runs in ``pool`` when given."""
    return Context(args.seeds, args.quick, args.cache, dataset=args.dataset, device=args.device,
                   data_root=args.data_root, threads=args.threads, pool=pool, kernels=args.kernels)


def measure(ctx: Context, name: str) -> tuple[list[ClaimRow], list[str], list[ArmRecord]]:
    """One claim group: rows, log lines and arm records."""
    return STEPS[name](ctx), ctx.log_lines, ctx.arms


def run_step(args: argparse.Namespace, name: str) -> tuple[list[ClaimRow], list[str], list[ArmRecord]]:
    """One claim group in a process of its own (a pool worker)."""
    torch.set_num_threads(args.threads)
    claim_kernels.apply(args.kernels)
    return measure(context(args), name)


def measure_all(args: argparse.Namespace, names: list[str]) -> dict[str, Any]:
    """Every group's rows, log lines and arm records.

    With ``--jobs N`` the groups run side by side in threads of this process; their FL runs
    (and each ``OWN_PROCESS`` group) queue on one pool of N worker processes, so the workers
    stay busy until the last run however unequal the groups' costs are. The analyses of the
    finished runs run here, in the groups' threads.
    """
    if args.jobs <= 1:
        return {n: measure(context(args), n) for n in names}
    spawn = multiprocessing.get_context("spawn")  # this process has threads: no fork
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=spawn) as pool, \
            ThreadPoolExecutor(max_workers=len(names)) as threads:
        futures = {n: pool.submit(run_step, args, n) if n in OWN_PROCESS else
                   threads.submit(measure, context(args, pool), n) for n in names}
        return {n: f.result() for n, f in futures.items()}


def main(argv: list[str] | None = None) -> int:
    """Measure the selected claim groups and write the claims page; the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--only", nargs="+", choices=list(STEPS), default=list(STEPS), help="claim groups to run")
    parser.add_argument("--quick", action="store_true", help="tiny settings: a smoke test, not a measurement")
    parser.add_argument("--cache", type=Path, default=Path("runs") / "claims", help="folder of the stored runs")
    parser.add_argument("--doc", type=Path, default=Path("docs") / "claims.md", help="Markdown file written")
    parser.add_argument("--dataset", default="mnist1d", help="data set of the recipes (<paper>-<dataset>)")
    parser.add_argument("--data-root", default=None, help="folder holding a torchvision data set's files")
    parser.add_argument("--device", default="cpu", help="torch device of the runs")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads per process")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes training the runs")
    parser.add_argument("--kernels", choices=claim_kernels.SETTINGS, default="pinned",
                        help="CPU kernels: pinned (the same bits on any x86-64 CPU with AVX2) or native (faster)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    claim_kernels.apply(args.kernels)
    ctx = context(args)
    names = [n for n in STEPS if n in args.only]
    results = measure_all(args, names)
    rows: list[ClaimRow] = []
    for n in names:
        step_rows, lines, arms = results[n]
        rows += step_rows
        ctx.log_lines += lines
        ctx.arms += arms
    command = ".venv/bin/python benchmarks/claims.py " + " ".join(argv if argv is not None else sys.argv[1:])
    write_doc(args.doc, rows, ctx, command.strip(), omitted=[n for n in STEPS if n not in names])
    ctx.log(f"wrote {args.doc} after {(time.time() - ctx.started) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
