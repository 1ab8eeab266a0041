"""The claims command: measure the papers' claims over paired seeds and write docs/claims.md.

Every FL run comes from a recipe of :mod:`fl.recipes` (``<paper>-<dataset>``; a baseline is
the same recipe run by another algorithm); central training (claims 2-3) uses
:class:`fl.central.Trainer`. The claims are data (:mod:`paper_claims.definitions`). Runs are
stored under ``--cache`` and reused by a rerun. Each claim prints per-seed values, the paired
95% interval and a verdict (:mod:`paper_claims.rows`); a claim whose arms did not converge gets
no verdict. The table, the FedAvg plateau of every setting and the log are written to ``--doc``.
``--dry-run`` lists every arm x seed, what the cache holds and the estimated training time,
and writes nothing (:mod:`paper_claims.dry_run`).

The CPU kernels are pinned (:mod:`paper_claims.kernels`): the command restarts itself with the
pinned environment before torch is imported, so it and its workers compute the same bits on
any x86-64 CPU with AVX2; each run folder records its kernels (``kernels.json``) and is reused
only under the same ones. ``--kernels native`` keeps the host's faster kernels.

    .venv/bin/python -m paper_claims --jobs 2                      # the measurement (MNIST-1D, CPU)
    .venv/bin/python -m paper_claims --dry-run                     # what it would train, and how long
    .venv/bin/python -m paper_claims --only ima --seeds 0 1        # one paper's claims
    .venv/bin/python -m paper_claims --quick --doc /tmp/claims.md  # smoke test (tiny settings)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import kernels as cpu_kernels  # imports no torch: the restart below comes first
from .definitions import GROUPS


def parser() -> argparse.ArgumentParser:
    """The command's parser."""
    p = argparse.ArgumentParser(prog="python -m paper_claims", description=(__doc__ or "").splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--only", nargs="+", choices=list(GROUPS), default=list(GROUPS), help="claim groups to run")
    p.add_argument("--quick", action="store_true", help="tiny settings: a smoke test, not a measurement")
    p.add_argument("--cache", type=Path, default=Path("runs") / "claims", help="folder of the stored runs")
    p.add_argument("--doc", type=Path, default=Path("docs") / "claims.md", help="Markdown file written")
    p.add_argument("--dataset", default="mnist1d", help="data set of the recipes (<paper>-<dataset>)")
    p.add_argument("--data-root", default=None, help="folder holding a torchvision data set's files")
    p.add_argument("--device", default="cpu", help="torch device of the runs")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads per process")
    p.add_argument("--jobs", type=int, default=1, help="worker processes training the runs")
    p.add_argument("--kernels", choices=cpu_kernels.SETTINGS, default="pinned",
                   help="CPU kernels: pinned (the same bits on any x86-64 CPU with AVX2) or native (faster)")
    p.add_argument("--dry-run", action="store_true",
                   help="list every arm x seed, what the run cache holds and the estimated time; write nothing")
    return p


def main(argv: list[str] | None = None) -> int:
    """Measure the selected claim groups and write the claims page (or print the dry run); the exit status.

    Parameters
    ----------
    argv : list of str or None
        The arguments; None reads the command line and, for pinned kernels, first restarts the
        process with them (before torch is imported).

    Returns
    -------
    int
        0.
    """
    if argv is None:
        argv = sys.argv[1:]
        cpu_kernels.reexec(["-m", "paper_claims", *argv])
    args = parser().parse_args(argv)
    import torch

    from .runner import context, measure_and_write

    torch.set_num_threads(args.threads)
    cpu_kernels.apply(args.kernels)
    if args.dry_run:
        from .dry_run import dry_run

        print(dry_run(context(args), [n for n in GROUPS if n in args.only]), flush=True)
        return 0
    measure_and_write(args, " ".join([".venv/bin/python -m paper_claims", *argv]))
    return 0
