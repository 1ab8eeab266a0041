"""Run every benchmark script in this folder (``bench_*.py``) and print all their tables.

Each script runs in its own process with the same Python, one after the other, with its
CPU defaults, or with the GPU presets below (``--gpu``). Exits non-zero if any failed.

    .venv/bin/python benchmarks/run_all.py                  # all, CPU defaults
    .venv/bin/python benchmarks/run_all.py --only plane,fl  # a subset
    .venv/bin/python benchmarks/run_all.py --gpu            # the GPU targets (presets below)
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: Arguments of the GPU runs: an 11x11 ResNet-20 plane on 10,000 CIFAR-sized inputs (every contender
#: side by side; the full 51x51 target is timed by gpu_plane_target.py); 50 clients of the FedGuCci CNN;
#: the cost of landscape tracking on the GPU.
GPU_ARGS: dict[str, list[str]] = {
    "plane": ["--models", "resnet20", "--resolution", "11", "--samples", "10000", "--batch-size", "10000",
              "--device", "cuda", "--bf16", "--compile", "--max-points", "16", "--repeats", "2"],
    "fl": ["--device", "cuda", "--clients", "50", "--cases", "mlp:64:500,fedgucci_cnn:3x32x32:500",
           "--run-clients", "50"],
    "track": ["--device", "cuda"],
}


def scripts(only: set[str] | None) -> list[Path]:
    """The benchmark scripts, all or those named in ``only``."""
    found = sorted(HERE.glob("bench_*.py"))
    return [p for p in found if only is None or p.stem.removeprefix("bench_") in only]


def main() -> None:
    """Run every selected benchmark script in turn."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated names (plane, fl, hessian, distributed, dry_run, ...)")
    parser.add_argument("--gpu", action="store_true", help="use the GPU presets where a script has one")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per script")
    args = parser.parse_args()
    only = set(args.only.split(",")) if args.only else None
    chosen = scripts(only)
    if not chosen:
        raise SystemExit(f"no benchmark matches {args.only!r}; scripts: "
                         f"{', '.join(p.stem for p in scripts(None))}")
    failed = []
    for path in chosen:
        name = path.stem.removeprefix("bench_")
        extra = GPU_ARGS.get(name, []) if args.gpu else []
        command = [sys.executable, str(path), *extra]
        print(f"=== {path.name} {' '.join(extra)}".rstrip(), flush=True)
        start = time.perf_counter()
        try:
            code = subprocess.run(command, timeout=args.timeout).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
        print(f"=== {path.name}: {'ok' if code == 0 else f'FAILED ({code})'} in "
              f"{time.perf_counter() - start:.0f} s\n", flush=True)
        if code != 0:
            failed.append(path.name)
    if failed:
        raise SystemExit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
