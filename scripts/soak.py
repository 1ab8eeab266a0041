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

TESTS = Path(__file__).resolve().parent.parent / "tests"


def main(argv: list[str] | None = None) -> int:
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
                while counts["plane"][0] < args.plane_kills:
                    cache = root / f"plane-{counts['plane'][1]}" / "plane.h5"
                    cache.parent.mkdir()
                    want = min(args.per_campaign, args.plane_kills - counts["plane"][0])
                    kills, _ = tf.plane_campaign(zygote, cache, reference, rng, want)
                    if kills == 0:
                        raise RuntimeError("a campaign ended before its first kill: the job is too fast")
                    counts["plane"][0] += kills
                    counts["plane"][1] += 1
                    print(f"plane campaign {counts['plane'][1]}: {kills} kills survived", flush=True)
            if args.fl_kills > 0:
                reference = tf.fl_job(str(root / "fl-reference"))
                while counts["fl"][0] < args.fl_kills:
                    out = root / f"fl-{counts['fl'][1]}"
                    want = min(args.per_campaign, args.fl_kills - counts["fl"][0])
                    kills, _ = tf.fl_campaign(zygote, out, reference, rng, want)
                    if kills == 0:
                        raise RuntimeError("a campaign ended before its first kill: the job is too fast")
                    counts["fl"][0] += kills
                    counts["fl"][1] += 1
                    print(f"FL campaign {counts['fl'][1]}: {kills} kills survived", flush=True)
        finally:
            zygote.close()
    total = counts["plane"][0] + counts["fl"][0]
    print(f"kills survived: {total} (plane {counts['plane'][0]} in {counts['plane'][1]} campaigns, "
          f"FL run {counts['fl'][0]} in {counts['fl'][1]} campaigns); every file stayed readable, "
          f"nothing flushed was lost, every result equals the uninterrupted run "
          f"({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
