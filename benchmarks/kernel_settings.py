"""Which CPU kernel settings change the bits of a training run (the measurement behind paper_claims.kernels).

Each setting trains the same short ``fl.run`` in a fresh interpreter (torch reads the
variables once, at import), one thread; the final global models are compared tensor by
tensor with the first setting's (``torch.equal`` and the largest absolute difference), and
settings giving bit-identical models are grouped. ``pinned`` is the claims' setting
(``paper_claims.kernels.PIN``, oneDNN off); ``pinned, AVX2-host limits`` adds what an older host
imposes (oneDNN and MKL capped at AVX2 and SSE4.2), so it must equal ``pinned``.

    .venv/bin/python benchmarks/kernel_settings.py                       # digits MLP, MNIST-1D CNN
    .venv/bin/python benchmarks/kernel_settings.py --cases floco --settings native pinned
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from paper_claims import kernels as claim_kernels

#: name -> (environment variables, --kernels of the child).
SETTINGS = {
    "native": ({}, "native"),
    "ATen avx2": ({"ATEN_CPU_CAPABILITY": "avx2"}, "native"),
    "ATen avx2, oneDNN AVX2": ({"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}, "native"),
    "ATen avx2, oneDNN AVX2, MKL_CBWR AVX2": ({"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
                                                "MKL_CBWR": "AVX2"}, "native"),
    "MKL_CBWR AVX2 alone": ({"MKL_CBWR": "AVX2"}, "native"),
    "ATen scalar (default)": ({"ATEN_CPU_CAPABILITY": "default"}, "native"),
    "pinned": (claim_kernels.PIN, "pinned"),
    "pinned, AVX2-host limits": ({**claim_kernels.PIN, "ONEDNN_MAX_CPU_ISA": "AVX2",
                                  "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}, "pinned"),
}
#: name -> fl.run arguments of a short run.
CASES = {
    "digits-mlp": {"algorithm": "fedavg", "dataset": "digits", "clients": 4, "seed": 0},
    "mnist1d-cnn": {"algorithm": "fedavg", "recipe": "fedgucci-mnist1d", "local_epochs": 1, "clients": 5, "seed": 0},
    "floco": {"algorithm": "floco", "recipe": "floco-mnist1d", "tau": 2, "local_epochs": 1, "seed": 0},
}


def child(case: str, rounds: int, out: Path, kernels: str) -> None:
    """Train ``case`` for ``rounds`` rounds under this process's kernels; write its model and numbers to ``out``."""
    import torch

    import fl
    import landscape

    torch.set_num_threads(1)
    claim_kernels.apply(kernels)
    settings = dict(CASES[case])
    algorithm = settings.pop("algorithm")
    with tempfile.TemporaryDirectory() as folder:
        started = time.process_time()
        run = fl.run(algorithm, rounds=rounds, out=Path(folder) / "run", progress=False, device="cpu", **settings)
        cpu = time.process_time() - started
        landscape.save_state_dict(run.global_state(-1), out)
        accuracy = run.metrics[-1]["test_accuracy"]
    out.with_suffix(".json").write_text(json.dumps({**claim_kernels.record(), "accuracy": accuracy, "cpu": cpu}))


def measure(case: str, names: list[str], rounds: int, folder: Path) -> list[str]:
    """Train ``case`` under each setting of ``names``; the table lines comparing them with the first."""
    import torch

    import landscape

    base = {k: v for k, v in os.environ.items() if not k.startswith(("ATEN_", "MKL_", "ONEDNN_", "DNNL_"))}
    models, lines = {}, [f"{case}, {rounds} rounds: setting | ATen | identical to | max |diff| vs {names[0]} | "
                         "test accuracy | CPU s"]
    for name in names:
        env, kernels = SETTINGS[name]
        out = folder / f"{case}-{len(models)}.safetensors"
        subprocess.run([sys.executable, __file__, "--child", case, str(out), "--rounds", str(rounds), "--kernels",
                        kernels], env={**base, "OMP_NUM_THREADS": "1", **env}, check=True)
        models[name] = landscape.load_state_dict(out)
        info = json.loads(out.with_suffix(".json").read_text())
        first = models[names[0]]
        same = next(n for n in models if all(torch.equal(models[n][k], models[name][k]) for k in first))
        diff = max(float((models[name][k] - first[k]).abs().max()) for k in first)
        lines.append(f"{name} | {info['aten']} | {same} | {diff:.2e} | {info['accuracy']:.4f} | {info['cpu']:.1f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Print one table per case; the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=["digits-mlp", "mnist1d-cnn"])
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", nargs=2, metavar=("CASE", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--kernels", choices=claim_kernels.SETTINGS, default="native", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child[0], args.rounds, Path(args.child[1]), args.kernels)
        return 0
    with tempfile.TemporaryDirectory() as folder:
        for case in args.cases:
            print("\n".join(measure(case, args.settings, args.rounds, Path(folder))), "", sep="\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
