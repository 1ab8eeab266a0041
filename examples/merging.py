"""Model merging checked on the landscape: two MNIST-1D fine-tunes and two LoRA adapters (docs/merging.md).

1. The MNIST-1D paper's MLP (``mnist1d_mlp``) is pretrained centrally on MNIST-1D's pretraining
   draw (``fl.pretrain``, disjoint from the standard split), then fine-tuned twice with SGD on
   the standard training signals: task A on the digits 0-4, task B on 5-9. Every merge method of
   ``landscape.merge`` combines the two fine-tunes (the task-vector methods from the pretrained
   base); each merge is measured on the full test set (loss, accuracy, barriers of the paths to
   both fine-tunes, L2 sharpness and top Hessian eigenvalue) and on each task's test digits. The
   greedy soup chooses on 500 held-out training signals. The plane through the base and the two
   fine-tunes is drawn with the merges marked.
2. Align first: two MLPs pretrained from different seeds are averaged as they are and after
   weight matching (``align="weight"``).
3. A tiny ViT over the signals seen as 1 x 40 images (docs/transformers.md) is pretrained on the
   pretraining draw; two LoRA adapters (rank 4 on the query and value projections, plus a trainable
   copy of the classifier) are fine-tuned on tasks A and B and merged with ``params="trainable"``.

    python examples/merging.py                                  # about two minutes on one CPU core
    python examples/merging.py --docs docs/figures              # also the figures of docs/merging.md
    python examples/merging.py --quick                          # a smoke test, seconds
"""
from __future__ import annotations

import argparse
import copy
import math
import shutil
from pathlib import Path
from typing import Any

import torch

import landscape
from figures import merge_figure, merge_plane_figure, merge_plane_plotly, merge_plotly
from fl.datasets import load_dataset
from fl.models import build_model
from fl.pretrain import pretrain, pretraining_data

from _common import Example

MODEL = "mnist1d_mlp"
#: (name in the tables, method, options); the task-vector methods get the base
MLP_MERGES = [("mean", "mean", {}), ("greedy_soup", "greedy_soup", {}),
              ("task_arithmetic", "task_arithmetic", {}), ("task_arithmetic 0.5", "task_arithmetic", {"scale": 0.5}),
              ("ties", "ties", {}), ("ties 0.5", "ties", {"density": 0.5}),
              ("dare", "dare", {"p": 0.5, "seed": 0}), ("dare+ties", "dare", {"p": 0.5, "seed": 0, "combine": "ties"}),
              ("slerp", "slerp", {})]
LORA_MERGES = [("mean", "mean", {}), ("task_arithmetic", "task_arithmetic", {}), ("ties 0.5", "ties", {"density": 0.5}),
               ("dare", "dare", {"p": 0.5, "seed": 0})]
TASK_VECTOR_METHODS = ("task_arithmetic", "ties", "dare")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this example's options to ``parser``."""
    parser.add_argument("--pretrain-epochs", type=int, default=20, help="epochs of central SGD of the MLP base")
    parser.add_argument("--finetune-epochs", type=int, default=5, help="epochs of SGD of each MLP fine-tune")
    parser.add_argument("--vit-epochs", type=int, default=6, help="epochs of Adam of the ViT base")
    parser.add_argument("--lora-epochs", type=int, default=3, help="epochs of Adam of each LoRA adapter")
    parser.add_argument("--docs", default=None, help="also write the PNG figures of docs/merging.md to this folder")


class SignalViT(torch.nn.Module):
    """A Hugging Face ViT over MNIST-1D signals ``(N, 1, 40)`` seen as ``1 x 40`` images."""

    def __init__(self, vit: torch.nn.Module):
        super().__init__()
        self.vit = vit

    def forward(self, x: torch.Tensor) -> Any:
        """The ViT's output (its ``logits`` are the classes')."""
        return self.vit(pixel_values=x.unsqueeze(2))


def train(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int, opt: torch.optim.Optimizer,
          seed: int) -> torch.nn.Module:
    """Mini-batches of 64 in a seeded order, cross-entropy on the logits."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for idx in torch.randperm(len(y), generator=g).split(64):
            opt.zero_grad()
            out = model(x[idx])
            torch.nn.functional.cross_entropy(getattr(out, "logits", out), y[idx]).backward()
            opt.step()
    return model


def finetune_sgd(base: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int, seed: int) -> torch.nn.Module:
    """A copy of ``base`` trained with SGD (lr 0.05, momentum 0.9)."""
    model = copy.deepcopy(base)
    return train(model, x, y, epochs, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), seed)


def split_evaluators(module: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, **options: Any
                     ) -> dict[str, landscape.Evaluator]:
    """Evaluators on all test signals and on those of each task (digits 0-4, 5-9)."""
    return {name: landscape.Evaluator(module, (x[mask], y[mask]), progress=False, **options)
            for name, mask in (("all", y >= 0), ("0-4", y < 5), ("5-9", y >= 5))}


def merge_row(name: str, result: landscape.MergeResult, evs: dict[str, landscape.Evaluator]) -> dict[str, Any]:
    """One table row: the merge's numbers, its accuracy on each task's digits, its barriers."""
    state = result.state_dict()
    curvature = math.isfinite(result.sharpness)
    return {"merge": name, "test loss": result.loss, "test acc (%)": 100 * result.accuracy,
            "acc 0-4 (%)": 100 * float(evs["0-4"].evaluate(state).accuracy[0]),
            "acc 5-9 (%)": 100 * float(evs["5-9"].evaluate(state).accuracy[0]),
            "loss barrier A": result.loss_barrier[0], "loss barrier B": result.loss_barrier[1],
            "acc barrier A": result.accuracy_barrier[0], "acc barrier B": result.accuracy_barrier[1],
            "sharpness": result.sharpness if curvature else None,
            "lambda_max": result.lambda_max if curvature else None}


def model_rows(models: dict[str, Any], evs: dict[str, landscape.Evaluator]) -> list[dict[str, Any]]:
    """Loss and accuracies of the base and the fine-tunes."""
    rows = []
    for name, model in models.items():
        full = evs["all"].evaluate(model)
        rows.append({"model": name, "test loss": float(full.loss[0]), "test acc (%)": 100 * float(full.accuracy[0]),
                     "acc 0-4 (%)": 100 * float(evs["0-4"].evaluate(model).accuracy[0]),
                     "acc 5-9 (%)": 100 * float(evs["5-9"].evaluate(model).accuracy[0])})
    return rows


def mlp_part(ex: Example, data: Any, quick: bool) -> None:
    """Merges of two MNIST-1D fine-tunes of one pretrained MLP, and align-first on two independent MLPs."""
    a = ex.args
    pre_epochs, ft_epochs = (2, 1) if quick else (a.pretrain_epochs, a.finetune_epochs)
    ex.log(f"pretraining {MODEL} for {pre_epochs} epochs, fine-tuning two copies for {ft_epochs}")
    base = build_model(MODEL, num_classes=10, input_shape=data.input_shape, seed=ex.seed)
    base.load_state_dict(landscape.load_state_dict(pretrain("mnist1d", MODEL, out=ex.out / "base.safetensors",
                                                            epochs=pre_epochs, seed=ex.seed, progress=False)))
    x, y = data.train_x[:3500], data.train_y[:3500]  # the last 500 training signals are the held-out set
    tuned = {"A": finetune_sgd(base, x[y < 5], y[y < 5], ft_epochs, ex.seed + 1),
             "B": finetune_sgd(base, x[y >= 5], y[y >= 5], ft_epochs, ex.seed + 2)}
    n_test = 200 if quick else len(data.test_y)
    evs = split_evaluators(base, data.test_x[:n_test], data.test_y[:n_test])
    held_out = landscape.Evaluator(base, (data.train_x[3500:], data.train_y[3500:]), progress=False)
    ex.table("Models: the pretrained MLP and its fine-tunes (A on digits 0-4, B on 5-9)",
             model_rows({"base": base, **tuned}, evs))
    alphas = 5 if quick else "adaptive"
    results = {}
    for name, method, options in MLP_MERGES:
        extra = {"base": base} if method in TASK_VECTOR_METHODS else {"held_out": held_out} \
            if method == "greedy_soup" else {}
        results[name] = landscape.merge(list(tuned.values()), method, evaluator=evs["all"], labels=list(tuned),
                                        curvature=not quick, alphas=alphas, **extra, **options)
        ex.log(f"merged: {name}")
    ex.table("Merges of the two MNIST-1D fine-tunes", [merge_row(n, r, evs) for n, r in results.items()],
             note="Barriers (FedGuCci Eq. 3/4) of the straight path from the merge to fine-tune A and B; "
                  "sharpness: L2, rho = 0.05; lambda_max: top Hessian eigenvalue (test loss).")
    soup = results["greedy_soup"]
    ex.table("Greedy soup (held-out accuracy, 500 training signals)",
             [{"model": m, "held-out acc (%)": 100 * s, "added": ok} for m, s, ok in
              zip(soup.selection["order"], [soup.selection["score"][soup.labels.index(m)]
                                            for m in soup.selection["order"]], soup.selection["accepted"])])
    if not quick:
        first = results["mean"]
        ex.table("Curvature of the fine-tunes", [
            {"model": m, "sharpness": float(s), "lambda_max": float(lam)}
            for m, s, lam in zip(first.labels, first.endpoint_sharpness, first.endpoint_lambda_max)])
    shown = ["mean", "task_arithmetic", "ties", "dare", "slerp"]
    placed = {"base": base, **tuned, **{n: results[n].state_dict() for n in shown}}
    plane = landscape.plane(base, tuned["A"], tuned["B"], evs["all"], labels=("base", "A", "B"),
                            resolution=7 if quick else 21, extra={n: placed[n] for n in shown})
    ex.table("Models in the plane through the base and the fine-tunes",
             [dict(zip(("model", "x", "y", "off-plane distance"), (m, *plane.project(model))))
              for m, model in placed.items()])
    ex.save("merging_plane", merge_plane_figure(plane, shown, base="base", log_scale=True),
            merge_plane_plotly(plane, shown, base="base", log_scale=True))
    align_part(ex, data, pre_epochs, evs, alphas)


def align_part(ex: Example, data: Any, epochs: int, evs: dict[str, landscape.Evaluator], alphas: Any) -> None:
    """The mean of two independently pretrained MLPs, as they are and after weight matching."""
    models = []
    for seed in (ex.seed + 10, ex.seed + 11):
        model = build_model(MODEL, num_classes=10, input_shape=data.input_shape, seed=seed)
        model.load_state_dict(landscape.load_state_dict(pretrain("mnist1d", MODEL, out=ex.out / f"indep{seed}.pt",
                                                                 epochs=epochs, seed=seed, progress=False)))
        models.append(model)
    result = landscape.merge(models, "mean", evaluator=evs["all"], align="weight", alphas=alphas, labels=["C", "D"])
    plain = result.unaligned
    ex.table("Align first: the mean of two independently pretrained MLPs", [
        {"merge": "mean", "test loss": plain["loss"], "test acc (%)": 100 * plain["accuracy"],
         "max loss barrier": max(plain["loss_barrier"]), "max acc barrier": max(plain["accuracy_barrier"])},
        {"merge": "mean after weight matching", "test loss": result.loss, "test acc (%)": 100 * result.accuracy,
         "max loss barrier": result.worst_loss_barrier, "max acc barrier": result.worst_accuracy_barrier}])


def lora_part(ex: Example, data: Any, quick: bool) -> None:
    """Merges of two LoRA adapters of one tiny pretrained ViT (``params="trainable"``)."""
    import transformers
    from peft import LoraConfig, get_peft_model

    a = ex.args
    vit_epochs, lora_epochs, n = (1, 1, 500) if quick else (a.vit_epochs, a.lora_epochs, None)
    ex.log(f"pretraining the tiny ViT for {vit_epochs} epochs, two LoRA adapters for {lora_epochs}")
    torch.manual_seed(ex.seed)
    config = transformers.ViTConfig(image_size=(1, 40), patch_size=(1, 4), num_channels=1, hidden_size=32,
                                    num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, num_labels=10)
    model = SignalViT(transformers.ViTForImageClassification(config))
    pre = pretraining_data("mnist1d")
    train(model, pre.train_x[:n], pre.train_y[:n], vit_epochs, torch.optim.Adam(model.parameters(), lr=3e-3), ex.seed)
    lora = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                            modules_to_save=["classifier"]))
    start = {k: v.clone() for k, v in lora.state_dict().items()}
    x, y = data.train_x[:3500][:n], data.train_y[:3500][:n]
    adapters = {}
    for name, mask, seed in (("A", y < 5, 1), ("B", y >= 5, 2)):
        tuned = copy.deepcopy(lora)
        opt = torch.optim.Adam([p for p in tuned.parameters() if p.requires_grad], lr=1e-2)
        adapters[name] = train(tuned, x[mask], y[mask], lora_epochs, opt, ex.seed + seed).state_dict()
    n_test = 200 if quick else len(data.test_y)
    evs = split_evaluators(lora, data.test_x[:n_test], data.test_y[:n_test], output="logits")
    trainable = sum(p.numel() for p in lora.parameters() if p.requires_grad)
    ex.table(f"Models: the ViT with untrained adapters and two LoRA fine-tunes ({trainable} trainable entries)",
             model_rows({"base": start, **adapters}, evs))
    results = {name: landscape.merge(list(adapters.values()), method, evaluator=evs["all"], labels=list(adapters),
                                     params="trainable", alphas=5 if quick else "adaptive",
                                     **({"base": start} if method in TASK_VECTOR_METHODS else {}), **options)
               for name, method, options in LORA_MERGES}
    ex.table("Merges of the two LoRA adapters", [merge_row(n, r, evs) for n, r in results.items()])
    shown = {n: results[n] for n in ("mean", "ties 0.5")}
    ex.save("merging_lora_paths", merge_figure(shown), merge_plotly(shown))


def main(argv: list[str] | None = None) -> int:
    """Run the example; the exit status."""
    ex = Example("merging", __doc__.splitlines()[0], argv, add_arguments)
    data = load_dataset("mnist1d")
    mlp_part(ex, data, ex.quick)
    lora_part(ex, data, ex.quick)
    if ex.args.docs:
        docs = Path(ex.args.docs)
        for stem in ("merging_plane", "merging_lora_paths"):
            shutil.copyfile(ex.out / f"{stem}.png", docs / f"{stem}.png")
        ex.log(f"copied the PNG figures to {docs}")
    return ex.finish()


if __name__ == "__main__":
    raise SystemExit(main())
