r"""End to end: the ``fl-run`` command against ``flwr run`` of the same FedAvg run (Flower's Message API).

Both sides are launched as a user would, in a fresh process, every process on one torch
thread (``OMP_NUM_THREADS=1``), with the same configuration (dataset, clients, rounds, one
local epoch, seed; so the same partition, initial model and mini-batches):

* ``fl-run --algorithm fedavg ...``: the embedded engine, sequential back end;
* ``flwr run APP --stream``: an app folder whose ``pyproject.toml`` names
  ``fl.flower.apps:server`` and ``fl.flower.apps:client`` (docs/flower.md), a fresh
  ``FLWR_HOME`` whose local SuperLink runs one simulated SuperNode per client; the SuperLink
  is started by ``flwr run`` and stopped after each repeat, so every repeat pays for it.

Where the time goes is read the same way on both sides: a thread polls the run folder's
``progress.json`` (written when a round is stored) every 20 ms, so the table splits the wall
time into start-up (process start to round 0 stored: imports, data, model; for Flower also
the SuperLink, the ServerApp process and the SuperNodes' partition query), round 1 (for
Flower also the simulation's workers starting and importing torch), the later rounds, and the
exit (last round stored to the command returning). Repeats alternate the two sides; medians.
Each run folder's own per-round ``time`` (the engine's round, the clients' training on the
federation included, file writing not) is printed for the first repeat.
Both folders' global models are compared at the end (equal bit for bit on one thread).

    .venv/bin/python benchmarks/bench_flwr_run.py [--dataset digits] [--clients 5] [--rounds 10] [--repeats 2]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def watch(run_dir: Path, stop: threading.Event, seen: dict[int, float], start: float) -> None:
    """Record, per round, the first time ``progress.json`` names it (seconds after ``start``)."""
    marker = run_dir / "progress.json"
    while not stop.is_set():
        try:
            r = int(json.loads(marker.read_text())["round"])
        except (OSError, ValueError, KeyError):
            r = -1
        now = time.perf_counter() - start
        for k in range(r + 1):
            seen.setdefault(k, now)
        stop.wait(0.02)


def timed(command: list[str], env: dict[str, str], run_dir: Path) -> dict[str, float]:
    """Run ``command``; wall time split at the rounds stored in ``run_dir``."""
    seen: dict[int, float] = {}
    stop = threading.Event()
    start = time.perf_counter()
    thread = threading.Thread(target=watch, args=(run_dir, stop, seen, start), daemon=True)
    thread.start()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    total = time.perf_counter() - start
    stop.set()
    thread.join()
    if done.returncode != 0:
        raise SystemExit(f"{command[0]} failed:\n{(done.stdout + done.stderr)[-3000:]}")
    last = max(seen)
    return {"total": total, "start-up": seen[0], "round 1": seen[1] - seen[0],
            "later rounds": (seen[last] - seen[1]) / max(1, last - 1), "exit": total - seen[last], "rounds": last}


def stop_superlink(home: Path) -> None:
    """Kill the processes a ``flwr run`` left behind under ``home`` (its local SuperLink)."""
    import psutil

    for proc in psutil.process_iter(["cmdline"]):
        if any(str(home) in part for part in (proc.info["cmdline"] or [])):
            proc.kill()


def main() -> None:
    """Run both sides ``--repeats`` times, alternating, and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--clients", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--keep", action="store_true", help="keep the run folders (their path is printed)")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from fl.flower.app_folder import write_app, write_local_superlink

    from _timing import machine_load

    bin_dir = Path(sys.executable).parent
    settings = {"algorithm": "fedavg", "dataset": args.dataset, "clients": args.clients, "rounds": args.rounds,
                "local-epochs": 1, "seed": 0, "save-clients": "none"}
    root = Path(tempfile.mkdtemp(prefix="bench-flwr-run-"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    results: dict[str, list[dict[str, float]]] = {"fl-run": [], "flwr run": []}
    try:
        for rep in range(args.repeats):
            for side in (("fl-run", "flwr run") if rep % 2 == 0 else ("flwr run", "fl-run")):
                out = root / f"{side.replace(' ', '-')}-{rep}"
                if side == "fl-run":
                    command = [str(bin_dir / "fl-run"), "--out", str(out), "--no-progress",
                               *(f"--{k}={v}" for k, v in settings.items())]
                    results[side].append(timed(command, env, out))
                    continue
                home, app = root / f"home-{rep}", root / f"app-{rep}"
                write_local_superlink(home, args.clients)
                write_app(app, {**settings, "run-dir": str(out)}, name="bench-app")
                try:
                    results[side].append(timed([str(bin_dir / "flwr"), "run", str(app), "--stream"],
                                               {**env, "FLWR_HOME": str(home)}, out))
                finally:
                    stop_superlink(home)
        import torch

        import fl

        engine, flower = fl.load_run(root / "fl-run-0"), fl.load_run(root / "flwr-run-0")
        equal = all(torch.equal(a, b) for r in range(args.rounds + 1)
                    for a, b in zip(engine.global_state(r).values(), flower.global_state(r).values()))
        # the run folders' own per-round "time" (the engine's round: sampling, training here or through the
        # federation, aggregation, evaluation; not the writing of files)
        inside = {side: [m["time"] for m in run.metrics if m["round"] > 0]
                  for side, run in (("fl-run", engine), ("flwr run", flower))}
    finally:
        if args.keep:
            print(f"run folders kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    print(machine_load())
    print(f"FedAvg on {args.dataset}: {args.clients} clients, {args.rounds} rounds, 1 local epoch, seed 0; "
          f"every process on one torch thread; median of {args.repeats}; global models equal: {equal}")
    parts = ("start-up", "round 1", "later rounds", "exit", "total")
    med = {side: {p: statistics.median(r[p] for r in runs) for p in parts} for side, runs in results.items()}
    print(f"{'':10s}" + "".join(f"{p + ' s':>16s}" for p in parts))
    for side in results:
        print(f"{side:10s}" + "".join(f"{med[side][p]:16.3f}" for p in parts))
    ratio = {p: med["flwr run"][p] / med["fl-run"][p] for p in parts}
    print(f"{'ratio':10s}" + "".join(f"{ratio[p]:16.2f}" for p in parts))
    print("(later rounds: seconds per round; ratio: flwr run / fl-run)")
    for side, times in inside.items():
        print(f"{side} rounds 1..{args.rounds} as its server timed them (s): " + " ".join(f"{t:.3f}" for t in times))

if __name__ == "__main__":
    main()
