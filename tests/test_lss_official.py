"""The baselines of LSS's claims: FedAvg as one-member LSS, head-only training and the loss-matched round.

* LSS with one member, no regularisers and one combination per batch is FedAvg: under SGD
  its global models equal ``fl.run("fedavg")``'s bit for bit, so under Adam it is FedAvg with
  LSS's optimiser (the claims page's FedAvg (Adam) arm);
* a ``"<model>+head"`` model trains and averages its classifier only: every other tensor of
  every round's global model equals the initial one, the classifier moves, and the run
  records the frozen names;
* ``mnist1d_lenet`` has the parameter count of its docstring's formula, its classifier about
  1% of it (FLOCO's SimpleCNN proportion);
* the loss-matched round is the stored round whose training loss is nearest the target,
  computed independently.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import fl
import landscape
from fl.models import HEAD_ONLY, build_model, classifier_name
from paper_claims.lss import AS_FEDAVG, loss_matched, training_data

SMALL = {"recipe": "lss-mnist1d-official", "seed": 0, "rounds": 2, "local_epochs": 1, "clients": 3,
         "progress": False}


def test_one_member_lss_without_regularisers_is_fedavg_bit_for_bit(tmp_path):
    torch.set_num_threads(1)
    sgd = {"lr": 0.01, "momentum": 0.9}
    lss = fl.run("lss", optimizer="sgd", out=tmp_path / "lss", **AS_FEDAVG, **sgd, **SMALL)
    fedavg = fl.run("fedavg", out=tmp_path / "fedavg", **sgd, **SMALL)
    for r in (1, 2):
        a, b = lss.global_state(r), fedavg.global_state(r)
        assert all(torch.equal(a[k], b[k]) for k in a), r
    assert lss.metrics[-1]["test_accuracy"] == fedavg.metrics[-1]["test_accuracy"]


def test_a_head_only_model_trains_and_averages_its_classifier_only(tmp_path):
    run = fl.run("lss", model="mnist1d_cnn" + HEAD_ONLY, out=tmp_path / "head", **AS_FEDAVG, **SMALL)
    head = classifier_name(run.module())
    start, end = run.global_state(0), run.global_state(-1)
    frozen = [k for k in start if not k.startswith(head + ".")]
    assert sorted(run.config["frozen"]) == sorted(frozen) and frozen
    assert all(torch.equal(start[k], end[k]) for k in frozen)
    assert not torch.equal(start[f"{head}.weight"], end[f"{head}.weight"])
    plain = build_model("mnist1d_cnn", num_classes=10, input_shape=(1, 40), seed=3)
    frozen_model = build_model("mnist1d_cnn" + HEAD_ONLY, num_classes=10, input_shape=(1, 40), seed=3)
    assert all(torch.equal(p, q) for p, q in zip(plain.state_dict().values(), frozen_model.state_dict().values()))
    assert [n for n, p in frozen_model.named_parameters() if p.requires_grad] == [f"{head}.weight", f"{head}.bias"]


@pytest.mark.parametrize("width", [16, 64])
def test_the_lenet_has_its_documented_size_and_a_one_percent_classifier(width):
    model = build_model(f"mnist1d_lenet_w{width}", num_classes=10, input_shape=(1, 40))
    total = sum(p.numel() for p in model.parameters())
    assert total == 6 * width**2 + 608 * width + 10284 + 85 * 10
    default = build_model("mnist1d_lenet", num_classes=10, input_shape=(1, 40))
    share = sum(p.numel() for p in default.classifier.parameters()) / sum(p.numel() for p in default.parameters())
    assert 0.009 < share < 0.013 and classifier_name(default) == "classifier"


def test_the_loss_matched_round_is_the_nearest_stored_training_loss(tmp_path):
    run = fl.run("lss", out=tmp_path / "matched", **AS_FEDAVG, **{**SMALL, "rounds": 3})
    ev = landscape.Evaluator(run.module(), training_data(run), progress=False)
    losses = ev.evaluate([run.global_state(r) for r in (1, 2, 3)]).loss
    target = float(losses[1]) + 1e-4
    chosen, loss, log_top = loss_matched(run, target)
    assert chosen == 1 + int(np.argmin(np.abs(np.asarray(losses) - target))) == 2
    assert loss == pytest.approx(float(losses[1]), rel=1e-6)
    top = landscape.hessian_eigenvalues(run.global_state(2), ev, k=1, max_iter=60)[0]
    assert log_top == pytest.approx(float(np.log(top)), rel=1e-5)
