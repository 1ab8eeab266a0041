r"""The CPU MLP plane under memory pressure: ours against the forward floor, in three conditions.

The digits MLP plane (``bench_plane.py``'s ``mlp`` case: 21x21 points, 1,797 samples in
one batch, one intra-op thread) is memory-hungry per point: every layer reads and writes
``samples x units`` matrices (460 kB here). Its time can therefore move with what else
uses the memory system, and with how the C allocator serves those matrices. Each condition
runs in a fresh child process, which times three contenders side by side (interleaved
repeats, medians; ``_timing.py``):

* ``ours``: ``landscape.plane`` with a fresh ``Evaluator`` (input-layer expansion and
  class-major scoring on, as chosen by default), ``ours, no input shortcut``, and the
  ``forward floor`` (plain forward passes at fixed parameters, the same number).

Conditions:

* ``quiet``: nothing else runs;
* ``bandwidth load``: a second process copies two 64 MiB arrays back and forth the whole
  time (far past any cache), taking memory bandwidth and last-level cache;
* ``mmap allocator``: ``MALLOC_MMAP_THRESHOLD_=65536`` for the child: glibc serves every
  allocation over 64 kB by ``mmap``, so each fresh matrix costs page faults. By default
  glibc's threshold starts at 128 kB and rises as large blocks are freed, so a process can
  sit in either regime depending on its allocation history (hence plane times that differ
  between processes of the same code).

The table gives each contender's median per condition, its ratio to ``quiet`` (a contender
whose ratio stays at or below the floor's varies no more than plain forward passes do), and
the minor page faults per point of one more call (a count, not a timing: it shows which
allocations reach the operating system, whatever the machine's noise). With a low trim
threshold instead (``MALLOC_TRIM_THRESHOLD_=131072``) the floor itself is bimodal: 0 or
about 450 faults per point depending on the process's earlier allocations.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_plane_memory.py
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONDITIONS = ("quiet", "bandwidth load", "mmap allocator")
CONTENDERS = ("ours", "ours, no input shortcut", "forward floor")


def child(args: argparse.Namespace) -> None:
    """Time the contenders in this process; print one JSON line of medians."""
    import copy

    import torch

    sys.path.insert(0, str(HERE))
    from landscape import Evaluator, plane

    from _timing import side_by_side
    from bench_plane import case, forward_floor

    torch.set_num_threads(1)
    models, data = case("mlp", 0)
    batches = [(data[0], data[1])]
    floor_model = copy.deepcopy(models[0]).eval()
    points = args.resolution ** 2

    def ours(**options: object):
        return lambda: plane(*models, Evaluator(models[0], data, progress=False, batch_size=len(data[1]), **options),
                             resolution=args.resolution)

    contenders = {"ours": ours(), "ours, no input shortcut": ours(input_shortcut=False),
                  "forward floor": lambda: forward_floor(floor_model, batches, points)}
    timings = side_by_side(contenders, repeats=args.repeats)
    faults = {}
    for name, call in contenders.items():  # minor page faults of one more call, per point
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        call()
        faults[name] = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / points
    print(json.dumps({"seconds": {name: t.median for name, t in timings.items()}, "faults": faults}))


def bandwidth_load(seconds: float) -> subprocess.Popen:
    """A process copying two 64 MiB arrays back and forth for ``seconds``."""
    code = ("import numpy as np, time\n"
            "a = np.ones(8 * 2**20); b = np.empty_like(a); end = time.time() + %f\n"
            "while time.time() < end:\n    np.copyto(b, a); np.copyto(a, b)\n" % seconds)
    return subprocess.Popen([sys.executable, "-c", code])


def measure(condition: str, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Medians (``"seconds"``) and page faults per point (``"faults"``) of the contenders in a child process."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if condition == "mmap allocator":
        env["MALLOC_MMAP_THRESHOLD_"] = "65536"
    hog = bandwidth_load(3600) if condition == "bandwidth load" else None
    try:
        if hog is not None:
            time.sleep(1.0)
        out = subprocess.run([sys.executable, __file__, "--child", "--repeats", str(args.repeats),
                              "--resolution", str(args.resolution)],
                             env=env, capture_output=True, text=True, check=True)
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    """Run every condition ``--rounds`` times (rotated) and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resolution", type=int, default=21)
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats inside each child")
    parser.add_argument("--rounds", type=int, default=2, help="child processes per condition (medians pooled)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    sys.path.insert(0, str(HERE))
    from _timing import format_table, machine_load

    print(machine_load())
    results: dict[str, list[dict[str, float]]] = {c: [] for c in CONDITIONS}
    for r in range(args.rounds):
        order = CONDITIONS[r % 3:] + CONDITIONS[:r % 3]
        for condition in order:
            results[condition].append(measure(condition, args))
    med = {c: {n: statistics.median(m["seconds"][n] for m in runs) for n in CONTENDERS}
           for c, runs in results.items()}
    faults = {c: {n: statistics.median(m["faults"][n] for m in runs) for n in CONTENDERS}
              for c, runs in results.items()}
    rows = []
    for name in CONTENDERS:
        quiet = med["quiet"][name]
        rows.append([name, *(med[c][name] for c in CONDITIONS),
                     *(med[c][name] / quiet for c in CONDITIONS[1:]), quiet / med["quiet"]["forward floor"],
                     *(f"{faults[c][name]:.0f}" for c in CONDITIONS)])
    print(f"mlp: {args.resolution}x{args.resolution} plane on 1797 digits, one batch, one thread; median of "
          f"{args.repeats} per child, {args.rounds} child(ren) per condition; faults: minor page faults per point")
    print(format_table(["contender", *(f"{c} s" for c in CONDITIONS), "load / quiet", "mmap / quiet",
                        "quiet x floor", *(f"faults {c}" for c in CONDITIONS)], rows))


if __name__ == "__main__":
    main()
