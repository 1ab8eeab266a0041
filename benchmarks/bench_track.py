"""The cost of landscape tracking during training (``fl.run(..., track=fl.Track())``).

Part 1, whole runs: the MNIST-1D recipe (``fedgucci-mnist1d``, FedAvg and FedGuCci) for
``--rounds`` rounds without tracking and with the default ``fl.Track`` (or ``--every``), side by
side in one process: one warm-up run each (it pays the one-off imports, e.g. SciPy's Lanczos),
then interleaved repeats, medians. Fewer rounds than the recipe's 150 overstate the cost: round 0
and the last round are always tracked, so a short run tracks a larger share of its rounds. On a
loaded machine the wall times of whole runs vary by more than tracking costs; the run records
its own training and measuring times, so the table also gives their ratio inside the tracked run
("recorded") and the ratio projected to the recipe's rounds from the median round and the median
tracked round.

Part 2, one tracked round: each measure of ``fl.Track`` alone on the last round of a short run
(the same clients, global model and evaluation set), side by side, against the time of one
training round of that run; the row ``all`` is the default set.

    .venv/bin/python benchmarks/bench_track.py                  # CPU defaults (30 rounds)
    .venv/bin/python benchmarks/bench_track.py --device cuda    # on a GPU
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

import fl
from fl.datasets import load_dataset
from fl.tracker import Tracker
from fl.tracking import MEASURES

try:
    from _timing import format_table, machine_load, side_by_side
except ImportError:  # imported as benchmarks.bench_track
    from benchmarks._timing import format_table, machine_load, side_by_side


def run_table(args: argparse.Namespace) -> str:
    """Wall time of whole runs, untracked and tracked, per algorithm, with the ratio."""
    rows = []
    track = fl.Track(**({"every": args.every} if args.every else {}))
    for algorithm in args.algorithms.split(","):
        folder = Path(tempfile.mkdtemp(prefix=f"bench-track-{algorithm}-"))
        count = {"n": 0}

        def train(tracked: bool, algorithm: str = algorithm, folder: Path = folder) -> fl.Run:
            count["n"] += 1  # a fresh folder each time: every call trains
            return fl.run(algorithm, recipe=args.recipe, rounds=args.rounds, device=args.device, progress=False,
                          save_clients="none", track=track if tracked else None, out=folder / str(count["n"]))

        timings = side_by_side({"untracked": lambda: train(False), "tracked": lambda: train(True)},
                               repeats=args.repeats, device=args.device)
        run = timings["tracked"].result
        table = run.track()
        ratio = timings["tracked"].median / timings["untracked"].median
        per_round = statistics.median(m["time"] for m in run.metrics[1:])  # training, without the measuring
        per_track = statistics.median(table["time"][1:])  # a tracked training round (round 0 pays the imports)
        full = int(fl.RECIPES[args.recipe].settings["rounds"])
        share = sum(track.due(r, full) for r in range(full + 1)) / full
        rows.append([algorithm, args.rounds, len(table), timings["untracked"].median, timings["tracked"].median,
                     f"{100 * (ratio - 1):+.1f} %", per_round, per_track,
                     f"{100 * float(sum(table['time'])) / sum(m['time'] for m in run.metrics):.1f} %",
                     f"{100 * share * per_track / per_round:.1f} %"])
    title = (f"Whole runs of {args.recipe} for {args.rounds} rounds, Track(every={track.every}, "
             f"samples={track.samples}), device {args.device}, median of {args.repeats}; added (recorded): the "
             f"tracked run's measuring time over its training time; projected: at {full} rounds, from the medians")
    return title + "\n" + format_table(["algorithm", "rounds", "tracked rounds", "untracked s", "tracked s",
                                        "added (wall)", "s/round", "s/tracked round", "added (recorded)",
                                        "projected"], rows)


def measure_table(args: argparse.Namespace) -> str:
    """Seconds of each measure alone at one tracked round, against one training round."""
    folder = Path(tempfile.mkdtemp(prefix="bench-track-measures-"))
    run = fl.run("fedavg", recipe=args.recipe, rounds=2, device=args.device, progress=False, save_clients="all",
                 out=folder / "run")
    bundle = load_dataset(run.config["dataset"])
    parts = run.store.read_partition()[0]
    device = torch.device(args.device)
    states = {k: {n: t.to(device) for n, t in s.items()} for k, s in run.client_states(2).items()}
    glob = {n: t.to(device) for n, t in run.global_state(2).items()}
    chosen = {"all": list(MEASURES), **{m: [m] for m in MEASURES}}
    trackers = {name: Tracker({"measures": measures}, 2, run.module(), [], bundle.train_x.to(device),
                              bundle.train_y.to(device), parts, device, run.store)
                for name, measures in chosen.items()}
    first = time.perf_counter()
    trackers["all"].record(2, glob, states)  # the first of the process: it loads the analysis core and SciPy
    first = time.perf_counter() - first
    timings = side_by_side({name: (lambda t=t: t.record(2, glob, states)) for name, t in trackers.items()},
                           repeats=args.repeats + 2, device=args.device)
    training = statistics.median(m["time"] for m in run.metrics[1:])
    rows = [[name, t.median, f"{100 * t.median / training:.1f} %"] for name, t in timings.items()]
    title = (f"One tracked round of fedavg on {args.recipe} ({len(states)} clients, {len(trackers['all'].samples)} "
             f"samples), against one training round ({training:.3f} s); the first in the process (it loads the "
             f"analysis core and SciPy) took {first:.2f} s")
    return title + "\n" + format_table(["measure", "s", "of a training round"], rows)


def main() -> None:
    """Run the benchmark and print its tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="fedgucci-mnist1d")
    parser.add_argument("--algorithms", default="fedavg,fedgucci", help="comma-separated")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--every", type=int, default=0, help="Track(every=...); 0: the default")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--runs", action=argparse.BooleanOptionalAction, default=True,
                        help="also time whole runs (part 1; minutes)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(machine_load())
    print(measure_table(args))
    if args.runs:
        print()
        print(run_table(args))
    print(machine_load())


if __name__ == "__main__":
    main()
