"""Soak test: SIGKILL a plane computation and an FL run many times at random moments.

The longer variant of ``tests/test_faults.py`` (same jobs, checks and helper process):
campaigns of kills are repeated until the requested number of kills has happened; after
every kill the cache or run directory must read back with only correct values, and every
campaign must end bit-identical to an uninterrupted run. Prints the counts.

    python scripts/soak.py --plane-kills 100 --fl-kills 40 --seed 0
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

TESTS = Path(__file__).resolve().parent.parent / "tests"


def main(argv: list[str] | None = None) -> int:
    """Run the soak campaigns and print their tallies; the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plane-kills", type=int, default=50, help="kills of the plane computation")
    parser.add_argument("--fl-kills", type=int, default=20, help="kills of the FL run")
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill moments")
    parser.add_argument("--per-campaign", type=int, default=8,
                        help="kills before a campaign resumes to the end and starts afresh")
    args = parser.parse_args(argv)

    sys.path.insert(0, str(TESTS))
    import numpy as np
    import torch

    torch.set_num_threads(1)
    import test_faults as tf

    rng = np.random.default_rng(args.seed)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        root = Path(tmp)
        zygote = tf.Zygote(root / "zygote.log")
        try:
            counts = {"plane": [0, 0], "fl": [0, 0]}  # kills, campaigns
            if args.plane_kills > 0:
                _, reference = tf.plane_job(None)

                def plane(i: int, want: int) -> int:
                    cache = root / f"plane-{i}" / "plane.h5"
                    cache.parent.mkdir()
                    return tf.plane_campaign(zygote, cache, reference, rng, want)[0]

                _campaigns("plane", plane, args.plane_kills, args.per_campaign, counts["plane"])
            if args.fl_kills > 0:
                fl_reference = tf.fl_job(str(root / "fl-reference"))

                def fl_run(i: int, want: int) -> int:
                    return tf.fl_campaign(zygote, root / f"fl-{i}", fl_reference, rng, want)[0]

                _campaigns("FL", fl_run, args.fl_kills, args.per_campaign, counts["fl"])
        finally:
            zygote.close()
    total = counts["plane"][0] + counts["fl"][0]
    print(f"kills survived: {total} (plane {counts['plane'][0]} in {counts['plane'][1]} campaigns, "
          f"FL run {counts['fl'][0]} in {counts['fl'][1]} campaigns); every file stayed readable, "
          f"nothing flushed was lost, every result equals the uninterrupted run "
          f"({time.perf_counter() - start:.0f} s)")
    return 0


def _campaigns(label: str, campaign: Callable[[int, int], int], total: int, per_campaign: int,
               count: list[int]) -> None:
    """Run ``campaign(index, kills wanted)`` (returns the kills survived) until ``total`` kills.

    ``count`` is updated in place as ``[kills, campaigns]``.
    """
    while count[0] < total:
        kills = campaign(count[1], min(per_campaign, total - count[0]))
        if kills == 0:
            raise RuntimeError("a campaign ended before its first kill: the job is too fast")
        count[0] += kills
        count[1] += 1
        print(f"{label} campaign {count[1]}: {kills} kills survived", flush=True)


if __name__ == "__main__":
    sys.exit(main())
