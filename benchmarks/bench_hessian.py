"""Hessian top-k eigenvalues and trace: landscape.curvature against PyHessian; GGN and Fisher beside them.

Same model (a small CNN, trained for a few full-batch Adam steps on the 1,797 digits), same
data (all of it, in batches of ``--batch-size``; PyHessian gets the same batches as its
"dataloader"), same tolerance and iteration cap. For each task the table gives the median
wall time over interleaved repeats, the number of Hessian-vector products (HVPs), the RSS
growth over the iterations (resident memory sampled after every HVP, minus the value
before the first), and the largest relative error of the eigenvalues against ARPACK
(``scipy.sparse.linalg.eigsh`` on a float64 LinearOperator of our exact HVP, tol 1e-10),
or of the trace against a float64 Hutch++ estimate with a large budget.

Beside the Hessian, the table times the top-5 eigenvalues of the other curvature operators with
the same solver, tolerance and budget: the generalised Gauss-Newton matrix (``ggn``), the
Monte-Carlo Fisher (``fisher``, one label per input, seeded), the empirical Fisher, and the
Kronecker-factored K-FAC and EKFAC approximations of the GGN (their times include building the
factors: one pass over the data, two for EKFAC); each is checked against ARPACK on a float64
operator of its own kind (the Fisher with the same seed, so the same drawn labels); their "HVPs"
column counts that operator's products. A line before the table gives the cost of one product
of the GGN and of K-FAC, and of building K-FAC. PyHessian has no such operators: their speed-up
column is empty. When
``pyhessian`` is not installed, its rows are left out (and every speed-up with them).

Tolerances differ in meaning: PyHessian stops power iteration when the Rayleigh quotient
changes by less than ``tol`` (relative) and Hutchinson when the running mean does; we stop
Lanczos when every residual ``||Hx - theta x|| <= tol |theta|`` (which bounds the
eigenvalue error by ``tol``) and Hutchinson when the standard error is below ``tol`` times
the estimate.

    .venv/bin/python benchmarks/bench_hessian.py              # full table (a few minutes on 2 cores)
    .venv/bin/python benchmarks/bench_hessian.py --samples 512 --repeats 1   # quick
"""
from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from landscape import Evaluator
from landscape.curvature.at_point import curvature_operator
from landscape.curvature.functions import hessian_eigen, hessian_trace
from landscape.curvature.operators import CurvatureOperator
from landscape.curvature.registry import OPERATOR_KINDS

from _timing import format_table, machine_load, side_by_side
from _workloads import digits, small_cnn

#: The curvature operators timed beside the Hessian (top-5 eigenvalues).
OTHER_KINDS = ("ggn", "fisher", "empirical_fisher", "kfac", "ekfac")


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int) -> nn.Module:
    """Train ``model`` on ``(x, y)`` by ``steps`` full-batch Adam steps (in place); the model."""
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model.eval()


def rss_bytes() -> int:
    """Resident memory of this process, in bytes."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Counter:
    """Counts HVPs of a contender and samples resident memory after each one."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Zero the count and restart the memory sampling."""
        self.hvps = 0
        self.start = rss_bytes()
        self.peak = self.start

    def tick(self) -> None:
        """Count one HVP and sample the memory."""
        self.hvps += 1
        self.peak = max(self.peak, rss_bytes())

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` with a :meth:`tick` after every call."""
        def counted(*args, **kwargs):
            out = fn(*args, **kwargs)
            self.tick()
            return out
        return counted

    @property
    def growth_mib(self) -> float:
        """Peak growth of resident memory since :meth:`reset`, in MiB."""
        return (self.peak - self.start) / 2 ** 20


def pyhessian_contenders(model: nn.Module, batches: list, args: argparse.Namespace, counter: Counter):
    """PyHessian's top eigenvalues and trace as timed callables."""
    from pyhessian import hessian as PyHessian

    def fresh():
        h = PyHessian(model, nn.CrossEntropyLoss(), dataloader=batches, cuda=False)
        h.dataloader_hv_product = counter.wrap(h.dataloader_hv_product)
        return h

    def top(k: int):
        def run():
            counter.reset()
            torch.manual_seed(args.seed)  # PyHessian draws from the global RNG; seed it for repeatability
            values, _ = fresh().eigenvalues(maxIter=args.max_iter, tol=args.tol, top_n=k)
            return np.sort(values)[::-1], counter.hvps, counter.growth_mib
        return run

    def trace():
        counter.reset()
        torch.manual_seed(args.seed)
        samples = fresh().trace(maxIter=args.max_iter, tol=args.tol)
        return float(np.mean(samples)), counter.hvps, counter.growth_mib

    return top, trace


def ours_contenders(model: nn.Module, evaluator: Evaluator, args: argparse.Namespace, counter: Counter):
    """Our top eigenvalues and trace as timed callables (products counted)."""
    def counting(original: Callable) -> Callable:
        def counted(self, v):
            out = original(self, v)
            counter.tick()
            return out
        return counted

    # count and sample memory per product, every kind, those with their own product too (benchmark only)
    for cls in {CurvatureOperator, *OPERATOR_KINDS.entries().values()}:
        if "matvec" in vars(cls):
            cls.matvec = counting(vars(cls)["matvec"])

    def top(k: int, method: str = "lanczos", hvp: str = "forward-over-reverse", kind: str = "hessian"):
        def run():
            counter.reset()
            res = hessian_eigen(model, evaluator, k=k, tol=args.tol, max_iter=args.max_iter, seed=args.seed,
                                method=method, hvp=hvp if kind == "hessian" else "auto", kind=kind)
            return res.values, res.matvecs, counter.growth_mib
        return run

    def trace(method: str, hvp: str = "forward-over-reverse"):
        def run():
            counter.reset()
            res = hessian_trace(model, evaluator, tol=args.tol, max_iter=args.max_iter, seed=args.seed,
                                method=method, hvp=hvp)
            return res.value, res.matvecs, counter.growth_mib
        return run

    return top, trace


def product_costs(model: nn.Module, evaluator: Evaluator, products: int = 20) -> str:
    """One line: the median time of one GGN and one K-FAC product, and of building K-FAC (its factors).

    Parameters
    ----------
    model : nn.Module
        The model.
    evaluator : Evaluator
        Its data.
    products : int
        Products timed per kind.

    Returns
    -------
    str
    """
    t0 = time.perf_counter()
    kfac = curvature_operator(model, evaluator, kind="kfac")
    build = time.perf_counter() - t0
    ggn = curvature_operator(model, evaluator, kind="ggn")
    v = torch.randn(ggn.size, generator=torch.Generator().manual_seed(0))
    medians = {}
    for name, op in (("GGN", ggn), ("K-FAC", kfac)):
        times = []
        for _ in range(products):
            t0 = time.perf_counter()
            op.matvec(v)
            times.append(time.perf_counter() - t0)
        medians[name] = float(np.median(times))
    return (f"one product (median of {products}): GGN {1e3 * medians['GGN']:.3g} ms, K-FAC "
            f"{1e3 * medians['K-FAC']:.3g} ms (ratio {medians['GGN'] / medians['K-FAC']:.1f}); building "
            f"K-FAC's factors {1e3 * build:.3g} ms")


def main() -> None:
    """Run the benchmark and print its tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1797)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--train-steps", type=int, default=150)
    parser.add_argument("--tol", type=float, default=1e-3)
    parser.add_argument("--max-iter", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trace-reference-hvps", type=int, default=600)
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    x, y = digits(args.samples)
    model = train(small_cnn(args.seed), x, y, args.train_steps)
    evaluator = Evaluator(model, (x, y), device="cpu", batch_size=args.batch_size)
    batches = [(b[0].clone(), b[1].clone()) for b in evaluator.batches]
    dim = sum(p.numel() for p in model.parameters())
    print(f"model: small CNN, {dim} parameters; data: {len(y)} digits in {len(batches)} batches; "
          f"tol={args.tol} max_iter={args.max_iter}; {machine_load()}")

    # high-accuracy reference: ARPACK on float64 HVPs
    from scipy.sparse.linalg import eigsh

    ref_ev = Evaluator(model, (x, y), device="cpu", batch_size=args.batch_size, dtype=torch.float64)
    arpack = {}
    for kind in ("hessian", *OTHER_KINDS):
        op64 = curvature_operator(model, ref_ev, kind=kind, seed=args.seed)
        t0 = time.perf_counter()
        arpack[kind] = np.sort(eigsh(op64.to_scipy(), k=5, which="LA", tol=1e-10, return_eigenvectors=False))[::-1]
        print(f"ARPACK reference, {kind} (float64, tol 1e-10): {np.round(arpack[kind], 5).tolist()} "
              f"in {time.perf_counter() - t0:.1f} s, {op64.matvecs} products")
    ref_trace = hessian_trace(model, ref_ev, tol=0.0, max_iter=args.trace_reference_hvps, seed=args.seed + 1,
                              method="hutch++")
    print(f"trace reference (float64 Hutch++, {ref_trace.matvecs} HVPs): {ref_trace.value:.5g} "
          f"+- {ref_trace.stderr:.2g}")

    print(product_costs(model, evaluator))
    counter = Counter()
    our_top, our_trace = ours_contenders(model, evaluator, args, counter)
    try:
        pyh_top, pyh_trace = pyhessian_contenders(model, batches, args, counter)
    except ImportError:
        print("pyhessian is not installed: its rows (and the speed-ups) are left out")
        pyh_top = pyh_trace = None
    contenders = {
        "top-1 ours (lanczos)": our_top(1), "top-1 ours (lanczos, retained)": our_top(1, hvp="retained"),
        "top-1 PyHessian": pyh_top and pyh_top(1),
        "top-5 ours (lanczos)": our_top(5), "top-5 ours (lanczos, retained)": our_top(5, hvp="retained"),
        "top-5 PyHessian": pyh_top and pyh_top(5),
        **{f"top-5 ours {kind} (lanczos)": our_top(5, kind=kind) for kind in OTHER_KINDS},
        "trace ours (hutchinson)": our_trace("hutchinson"), "trace ours (hutch++)": our_trace("hutch++"),
        "trace ours (hutch++, retained)": our_trace("hutch++", "retained"), "trace PyHessian": pyh_trace,
    }
    timings = side_by_side({name: run for name, run in contenders.items() if run is not None},
                           repeats=args.repeats, warmup=1)
    rows, record = [], {}
    base = {task: timings[f"{task} PyHessian"].median
            for task in ("top-1", "top-5", "trace") if f"{task} PyHessian" in timings}
    for name, timing in timings.items():
        value, hvps, growth = timing.result
        task = name.split()[0]
        kind = next((k for k in OTHER_KINDS if f" {k} " in name), "hessian")
        if task == "trace":
            err = f"{100 * abs(value - ref_trace.value) / abs(ref_trace.value):.3g}%"
            shown = f"{value:.4g}"
        else:
            k = len(value)
            err_val = float(np.max(np.abs(np.asarray(value) - arpack[kind][:k]) / np.abs(arpack[kind][:k])))
            err = f"{100 * err_val:.3g}%"
            shown = ", ".join(f"{v:.4g}" for v in value)
        speedup = base[task] / timing.median if kind == "hessian" and task in base else None
        rows.append([name, timing.median, hvps, f"{speedup:.2f}x" if speedup is not None else "",
                     f"{growth:.1f}", err, shown])
        record[name] = {"seconds": timing.seconds, "hvps": hvps, "rss_growth_mib": growth,
                        "values": np.atleast_1d(value).tolist(), "speedup_vs_pyhessian": speedup}
    print(format_table(["task", "median s", "HVPs", "speed-up vs PyH", "RSS growth MiB",
                        "rel err vs reference", "values"], rows))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"arpack": {kind: values.tolist() for kind, values in arpack.items()},
                       "trace_reference": [ref_trace.value, ref_trace.stderr],
                       "contenders": record, "machine": machine_load(),
                       "args": vars(args)}, fh, indent=2)


if __name__ == "__main__":
    main()
