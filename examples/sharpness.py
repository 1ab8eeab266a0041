"""Worst-case sharpness of a small MNIST-1D model: L2, adaptive L2 and L-infinity balls.

Trains the MNIST-1D paper's MLP (``mnist1d_mlp``, width 32) centrally with SGD on MNIST-1D's
pretraining draw (``fl.pretrain``: 5000 signals disjoint from the standard split), then measures
the sharpness of its training loss on a fixed subset of those signals with
``landscape.sharpness`` (projected gradient ascent with restarts, docs/sharpness.md):

* L2 sharpness ``max_{||e||_2 <= rho} L(w + e) - L(w)`` and its second-order estimate
  ``rho^2 lambda_max / 2``;
* adaptive L2 sharpness (ASAM), the ball scaled elementwise by ``|w|``;
* L-infinity sharpness, the box ``|e_i| <= rho``;

prints them as a table and draws the ascent trajectories (``figures.sharpness_figure``).

Converged: the first table records :func:`fl.convergence.assess` of the per-epoch test accuracy
(``fl.pretrain(on_epoch=...)``). Measured once (seed 0): after the default 20 epochs the slope is
below 0.1 points per epoch and the plateau (0.581) is within 0.01 of a 120-epoch run's (0.591).

    python examples/sharpness.py                 # the table and timing on docs/sharpness.md
    python examples/sharpness.py --quick         # a smoke test, seconds
    python examples/sharpness.py --doc           # rewrite docs/sharpness.md's table from this run
"""
from __future__ import annotations

import argparse
import sys
import time

import landscape
from figures import sharpness_figure, sharpness_plotly
from fl.datasets import load_dataset
from fl.models import build_model
from fl.pretrain import pretrain, pretraining_data

from _common import Example, accuracy_tracker, report_epochs
from _docs import add_doc_option, conditions, doc_refusal, markdown_table, publish

#: the columns of the table on docs/sharpness.md: page header -> key of the example's rows
PAGE_COLUMNS = {"kind": "kind", "ρ": "rho", "sharpness": "sharpness", "L(w)": "L(w)", "first order": "first order",
                "ρ²λ_max/2": "rho^2 lambda_max / 2", "‖e*‖₂": "perturbation L2 norm",
                "Hessian products": "Hessian products", "passes": "passes", "seconds": "seconds"}
TITLE = "Worst-case sharpness (best over restarts)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this example's options to ``parser``."""
    parser.add_argument("--model", default="mnist1d_mlp_w32", help="zoo model (fl.models)")
    parser.add_argument("--epochs", type=int, default=20, help="epochs of central SGD")
    parser.add_argument("--samples", type=int, default=1000,
                        help="training samples the loss is measured on")
    parser.add_argument("--steps", type=int, default=20, help="ascent steps per restart")
    parser.add_argument("--restarts", type=int, default=3)
    parser.add_argument("--rho-l2", type=float, default=0.5, help="radius of the L2 ball (weight units)")
    parser.add_argument("--rho-adaptive", type=float, default=0.05,
                        help="radius of the adaptive L2 ball (a fraction of |w|)")
    parser.add_argument("--rho-linf", type=float, default=0.005, help="half-width of the L-infinity box")
    add_doc_option(parser, "sharpness.md")


def page_parts(payload: dict) -> dict[str, str]:
    """The part of docs/sharpness.md that ``--doc`` writes: how the table was made, and the table.

    Parameters
    ----------
    payload : dict
        The example's ``tables.json`` (as stored in ``docs/data/sharpness.json``).

    Returns
    -------
    dict[str, str]
        ``{"table": Markdown}``.
    """
    a = payload["args"]
    made = (f"Made with `.venv/bin/python examples/sharpness.py --doc` (its defaults: `{a['model']}`, "
            f"{a['epochs']} epochs, the loss on {a['samples']} samples, {a['steps']} steps from each of "
            f"{a['restarts']} restarts, seed {payload['seed']}): {conditions(payload)}. `seconds` is the time of "
            "each `landscape.sharpness` call (for the L2 kinds with the Lanczos run of `ρ²λ_max/2`, whose "
            "products `Hessian products` counts).")
    return {"table": made + "\n\n" + markdown_table(payload["tables"][TITLE], PAGE_COLUMNS)}


def main(argv: list[str] | None = None) -> int:
    """Run the example; the exit status."""
    ex = Example("sharpness", __doc__.splitlines()[0], argv, add_arguments)
    a = ex.args
    refusal = doc_refusal(a, ex.parser)
    if refusal:
        ex.log(refusal)
        return 2
    epochs, samples, steps, restarts, max_iter = ((2, 200, 5, 2, 20) if ex.quick else
                                                  (a.epochs, a.samples, a.steps, a.restarts, 100))
    ex.log(f"training {a.model} for {epochs} epochs")
    train, data = pretraining_data("mnist1d"), load_dataset("mnist1d")
    model = build_model(a.model, num_classes=10, input_shape=data.input_shape, seed=ex.seed)
    records, on_epoch = accuracy_tracker(model, data.test_x, data.test_y)
    weights = pretrain("mnist1d", a.model, out=ex.out / "model.safetensors", epochs=epochs, seed=ex.seed,
                       progress=False, on_epoch=on_epoch)
    report_epochs(ex, a.model, records)
    model.load_state_dict(landscape.load_state_dict(weights))
    ev = landscape.Evaluator(model, (train.train_x[:samples], train.train_y[:samples]), device="cpu", progress=False)
    fit = ev.evaluate(model)
    test = landscape.Evaluator(model, (data.test_x, data.test_y), device="cpu", progress=False).evaluate(model)
    ex.log(f"accuracy {100 * float(fit.accuracy[0]):.1f}% on the {samples} training samples the sharpness is "
           f"measured on, {100 * float(test.accuracy[0]):.1f}% on the test set")
    kinds = {"l2": dict(kind="l2", rho=a.rho_l2), "adaptive l2": dict(kind="adaptive", rho=a.rho_adaptive),
             "linf": dict(kind="linf", rho=a.rho_linf)}
    results, rows = {}, []
    for name, kw in kinds.items():
        start = time.perf_counter()
        res = results[name] = landscape.sharpness(model, ev, steps=steps, restarts=restarts, seed=ex.seed,
                                                  bound_max_iter=max_iter, **kw)
        rows.append({"kind": name, "rho": res.rho, "sharpness": res.value, "L(w)": res.base_loss,
                     "relative (%)": res.relative, "first order": res.first_order,
                     "rho^2 lambda_max / 2": res.second_order if kw["kind"] != "linf" else None,
                     "perturbation L2 norm": res.perturbation_l2, "Hessian products": res.matvecs,
                     "passes": res.passes,
                     "seconds": time.perf_counter() - start})
    ex.table(TITLE, rows,
             note="relative: 100 sharpness / (1 + L(w)) (Keskar et al. 2017); first order: rho times the dual norm "
                  "of the (scaled) gradient; passes: forward-backward passes of the ascent.")
    ex.save("sharpness", sharpness_figure(results), sharpness_plotly(results))
    status = ex.finish()
    if a.doc:
        for path in publish("sharpness", ex.out, page_parts, "sharpness.md", figures=["sharpness.png"]):
            ex.log(f"wrote {path}")
    return status


if __name__ == "__main__":
    sys.exit(main())
