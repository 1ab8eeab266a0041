"""The claims package: definitions as data, one verdict vocabulary, Holm-adjusted p-values and the dry run.

* Holm's adjustment against a family worked by hand, and the one-sided p-value against scipy's
  t-test;
* every claim definition is complete and consistent with its group's gate;
* IMA's premise rule on synthetic FedAvg curves; 1c's learning rate chosen on validation
  accuracy alone;
* the dry run lists every arm x seed under the folder a measurement trains into, sees a run
  once it is in the cache, counts the local steps from the resolved configuration and writes
  nothing.
"""
from __future__ import annotations

import math
import os
import re

import numpy as np
import pytest
from scipy import stats

from landscape import ConfigError
from landscape.claims import Outcome, Verdict
from landscape.claims.statistics import CLAIMED, holm, p_value
from paper_claims import cli, dry_run, fedgucci
from paper_claims.context import Context
from paper_claims.definitions import (
    CLAIMS,
    DEFERRED,
    FEDGUCCI_ROUNDS,
    GROUPS,
    IMA_GATE_TOL,
    LR_FACTORS,
    PREMISE_TOL,
    SETTINGS,
    VALIDATION_FRACTION,
    VARIANTS,
)
from paper_claims.fedgucci import sweep, tuned_lr
from paper_claims.ima import premise, premise_failures, premise_summary
from paper_claims.rows import ClaimRow, enough, holm_column, markdown_table


def test_holm_matches_a_family_adjusted_by_hand():
    # sorted: 0.005 (x4 = 0.02), 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1 = 0.04 -> max(0.06, 0.04) = 0.06)
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.3, 0.6]) == pytest.approx([0.6, 0.6])  # 2 x 0.3, then max(0.6, 1 x 0.6)
    assert holm([0.9, 0.8]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert holm([]) == []
    with pytest.raises(ConfigError, match="p-values must lie in"):
        holm([0.1, 1.5])


def test_one_sided_p_value_is_scipys_t_test_on_the_claimed_side():
    a, b = [0.71, 0.74, 0.69, 0.75, 0.72], [0.70, 0.70, 0.70, 0.71, 0.69]
    d = np.subtract(a, b)
    assert p_value(a, b, "greater") == pytest.approx(stats.ttest_1samp(d, 0.0, alternative="greater").pvalue)
    assert p_value(a, b, "less") == pytest.approx(stats.ttest_1samp(d, 0.0, alternative="less").pvalue)
    assert p_value(a, b, "not_less", tol=0.01) == pytest.approx(
        stats.ttest_1samp(d, -0.01, alternative="greater").pvalue)
    assert p_value(a, claimed="below", bound=0.8) == pytest.approx(
        stats.ttest_1samp(a, 0.8, alternative="less").pvalue)
    assert p_value([1.0, 1.0], [0.5, 0.5], "greater") == 0.0  # no spread, on the claimed side
    with pytest.raises(ConfigError, match="at least two values"):
        p_value([1.0], claimed="above")


def test_holm_column_adjusts_the_decided_rows_only():
    rows = [ClaimRow("1a", "s", "m", ("A", "B"), [0.6, 0.7, 0.65], [0.5, 0.55, 0.5], "greater"),
            ClaimRow("1b", "s", "m", ("A", "B"), [0.6, 0.7, 0.65], [0.5, 0.55, 0.5], "greater", blocked="arm x"),
            ClaimRow("1c", "s", "m", ("A", ""), [0.01, 0.03, 0.02], claimed="below", bound=0.05)]
    assert [r.verdict.decided for r in rows] == [True, False, True]
    column = holm_column(rows)
    assert math.isnan(column[1])
    assert [column[0], column[2]] == pytest.approx(holm([rows[0].p_value, rows[2].p_value]))


def test_one_vocabulary_for_checks_rules_and_rows():
    assert Outcome("no verdict: not converged") is Outcome.NOT_CONVERGED and f"{Outcome.NOT_TESTABLE}" == "not testable"
    assert [o.decided for o in Outcome] == [True, True, True, False, False, False]
    v = Verdict(kind="k", claim="c", status="reproduced", reason="r", numbers={}, thresholds={})
    assert v.status is Outcome.REPRODUCED and v.holds and v.to_dict()["status"] == "reproduced"
    with pytest.raises(ConfigError, match="status must be one of"):
        Verdict(kind="k", claim="c", status=Outcome.NOT_CONVERGED, reason="r", numbers={}, thresholds={})
    assert ClaimRow("1a", "s", "m", ("A", "B"), []).verdict is Outcome.NOT_MEASURED


def test_every_definition_is_complete_and_its_group_gates_with_one_of_its_tolerances():
    assert list(CLAIMS) == sorted(CLAIMS, key=lambda c: (int(c[0]), c[1:]))
    setting = {**SETTINGS, "factor": 1.05, "pool": 8, "weak_pool": 3, "k_min": 2, "k_max": 8, "part": 0.25,
               "fedavg_epochs": "8, 16, 32", "lrs": "0.02, 0.04, 0.08", "chosen": "seed 0: lr 0.04", "rounds": 800,
               "double": 1600, "small_model": "mnist1d_lenet", "small_share": 0.011, "base_model": "mnist1d_cnn",
               "base_share": 0.24, "small_seeds": "0, 1, 2, 3, 4", "matched": "round 9", "base": 150}
    for c in CLAIMS.values():
        texts = c.filled(**setting)
        assert c.group in GROUPS and c.claimed in CLAIMED and c.tol >= 0 and c.rationale
        assert not re.search(r"[{}|]", texts["statement"] + texts["metric"] + "".join(texts["arms"])), c.id  # | splits
        assert (texts["arms"][1] == "") == (c.claimed in ("below", "above")), c.id
    gated = {g.name: g.gate_tol for g in GROUPS.values() if g.gate_tol is not None}
    assert gated == {"fedgucci": CLAIMS["1a"].tol, "central": CLAIMS["2c"].tol, "ima": CLAIMS["4a"].tol,
                     "floco": CLAIMS["5a"].tol}


def test_claim_1_keeps_accuracy_rows_and_claim_4_has_its_control_and_premise():
    assert [c for c in CLAIMS if c.startswith("1")] == ["1a", "1b", "1c"]  # no client-model barriers in FL
    assert "near zero by construction" in CLAIMS["1a"].note and "2a-3b" in CLAIMS["1a"].note
    assert (CLAIMS["1c"].tol, CLAIMS["1c"].claimed) == (CLAIMS["1a"].tol, "greater")
    assert "global test set plays no part" in CLAIMS["1c"].note and "untuned" in CLAIMS["1c"].note
    assert [c for c in CLAIMS if c.startswith("4")] == ["4a", "4b", "4c", "4d", "4e"]
    assert (CLAIMS["4e"].arms, CLAIMS["4e"].claimed, CLAIMS["4e"].tol) == (("IMA at R", "FedAvg at 2R"), "greater",
                                                                           IMA_GATE_TOL)
    assert PREMISE_TOL == IMA_GATE_TOL / 2 and f"{PREMISE_TOL:g}" in GROUPS["ima"].gate.format(**SETTINGS)
    assert LR_FACTORS == (0.5, 1.0, 2.0) and VALIDATION_FRACTION == 0.1


def test_each_group_names_its_recipe_and_ima_and_lss_have_variants(tmp_path):
    for paper in {g.paper for g in GROUPS.values()}:  # groups that share a paper share its variant
        assert len({g.variant for g in GROUPS.values() if g.paper == paper}) == 1, paper
    assert VARIANTS == {"ima": "plateau", "lss": "official"}
    ctx = Context([0], quick=True, cache=tmp_path, kernels="native")
    assert [ctx.recipe(p) for p in ("fedgucci", "ima", "floco", "lss")] == [
        "fedgucci-mnist1d", "ima-mnist1d-plateau", "floco-mnist1d", "lss-mnist1d-official"]
    assert Context([0], quick=True, cache=tmp_path, dataset="cifar10").recipe("ima") == "ima-cifar10"  # no variant
    assert sweep(ctx) == [0.02, 0.04, 0.08]


def test_a_group_continues_the_seeds_to_its_fewest_and_a_quick_run_keeps_them(tmp_path):
    ctx = Context([0, 1, 2, 3, 4], quick=False, cache=tmp_path, kernels="native")
    assert GROUPS["floco"].seeds == 10 and ctx.group("floco").seeds == list(range(10))
    assert ctx.group("ima").seeds == [0, 1, 2, 3, 4]
    assert Context([3, 7], quick=False, cache=tmp_path).group("floco").seeds == [3, 7, *range(8, 16)]
    assert Context([0, 1], quick=True, cache=tmp_path).group("floco").seeds == [0, 1]


def test_a_failed_premise_is_not_testable_and_leaves_the_holm_family():
    row = ClaimRow("6f", "s", "m", ("A", "B"), [0.6, 0.7, 0.65], [0.5, 0.55, 0.5], "greater",
                   untestable="seed 1: loss 0.4 vs 0.6")
    assert row.verdict is Outcome.NOT_TESTABLE and math.isnan(holm_column([row])[0])
    assert "not testable (seed 1: loss 0.4 vs 0.6)" in markdown_table([row])
    missing = ClaimRow("6i", "s", "m", ("A", ""), [float("nan"), 0.2], claimed="above", untestable="no spread")
    assert missing.interval is None and missing.verdict is Outcome.NOT_TESTABLE


def test_the_half_width_column_compares_the_interval_with_the_tolerance():
    tight = ClaimRow("1a", "s", "m", ("A", "B"), [0.700, 0.702, 0.701, 0.703], [0.6, 0.6, 0.6, 0.6], tol=0.009)
    half = (tight.interval.high - tight.interval.low) / 2
    assert half < 0.009 and enough(tight) == "yes"
    wide = ClaimRow("1a", "s", "m", ("A", "B"), [0.7, 0.8, 0.6], [0.6, 0.6, 0.6], tol=0.009)
    assert enough(wide) == "no"
    threshold = ClaimRow("5d", "s", "m", ("A", ""), [0.010, 0.011, 0.012], claimed="below", bound=0.02)
    assert enough(threshold) == "yes"  # half-width 0.0025 < distance 0.009 from the bound
    header, _, line = markdown_table([tight]).splitlines()
    assert "| n | hw <= tol | Holm p |" in header and "| 4 | yes | " in line


def test_lss_rows_hold_the_official_protocol_its_baselines_and_the_sensitivity_rows():
    assert [c for c in CLAIMS if c.startswith("6")] == [f"6{x}" for x in "abcdefghijklm"]
    assert CLAIMS["6b"].arms == ("LSS", "FedAvg, head only") and "frozen" in CLAIMS["6b"].metric
    assert "{LOSS_MATCH_PERCENT:g}%" in CLAIMS["6f"].note and SETTINGS["LOSS_MATCH_PERCENT"] == 10
    assert "calibrated" in CLAIMS["6m"].arms[0] and CLAIMS["6k"].tol == CLAIMS["6a"].tol
    assert [c for c in CLAIMS if c.startswith("5")] == ["5a", "5b", "5c", "5d", "5e", "5f"]
    assert CLAIMS["5e"].tol == CLAIMS["5f"].tol == CLAIMS["5a"].tol
    assert set(DEFERRED) <= set(CLAIMS) and all(reason.startswith("not measured") for reason in DEFERRED.values())


def curve(values, start=1):
    """Per-round metrics with test accuracies ``values`` from round ``start``."""
    return [{"round": start + i, "test_accuracy": v} for i, v in enumerate(values)]


def test_the_premise_holds_on_a_seed_whose_fedavg_stopped_moving_before_t_s():
    flat = curve([0.5] * 20 + [0.87] * 40)                             # plateau from round 21, t_s = 40, R = 60
    rising = curve([0.5] * 20 + list(np.linspace(0.80, 0.90, 40)))    # still climbing after t_s
    assert premise(flat, 40) == pytest.approx((0.87, 0.87))
    at_ts, at_r = premise(rising, 40)
    assert at_ts == pytest.approx(np.mean(np.linspace(0.80, 0.90, 40)[10:20]))   # rounds 31..40
    assert at_r == pytest.approx(np.mean(np.linspace(0.80, 0.90, 40)[-10:]))     # rounds 51..60
    assert at_r - at_ts >= PREMISE_TOL
    assert premise_failures("FedAvg", [0, 1], [premise(flat, 40), premise(flat, 40)]) == ""
    text = premise_failures("FedAvg", [0, 1], [premise(flat, 40), premise(rising, 40)])
    assert "seed 1 (" in text and "seed 0" not in text and "|" not in text
    edge = (0.8, 0.8 + PREMISE_TOL + 1e-12)                            # the rule is strict: |difference| < tol
    assert "seed 3" in premise_failures("FedAvg", [3], [edge]) and not premise_failures("FedAvg", [3], [(0.8, 0.79)])
    assert "holds on 1 of 2 seeds" in premise_summary("FedAvg", [0, 1], [premise(flat, 40), premise(rising, 40)])
    row = ClaimRow("4a", "s", "m", ("IMA", "FedAvg"), [0.9, 0.91], [0.8, 0.8], blocked=text)
    assert row.verdict is Outcome.NOT_CONVERGED  # a failed premise: no verdict, with the reason


def test_the_tuned_learning_rate_is_the_validation_argmax_and_ignores_test_accuracy():
    def records(val, test):
        return [{"round": r, "validation_accuracy": v, "test_accuracy": test} for r, v in enumerate(val)]

    curves = {0.02: records([0.70, 0.72], test=0.99), 0.04: records([0.80, 0.82], test=0.10),
              0.08: records([0.75, 0.76], test=0.50)}
    assert tuned_lr(curves) == 0.04  # test accuracy would pick 0.02
    flipped = {lr: [{**m, "test_accuracy": 1 - m["test_accuracy"]} for m in rs] for lr, rs in curves.items()}
    assert tuned_lr(flipped) == 0.04
    no_test = {lr: [{"validation_accuracy": m["validation_accuracy"]} for m in rs] for lr, rs in curves.items()}
    assert tuned_lr(no_test) == 0.04
    assert tuned_lr({0.02: records([0.5], 0.0), 0.04: records([0.5], 1.0)}) == 0.02  # ties: the first (smaller) lr


def test_the_dry_run_lists_every_arm_and_seed_and_sees_the_cache(tmp_path, monkeypatch):
    ctx = Context([0, 1], quick=True, cache=tmp_path / "cache", kernels="native")
    planned = [r.arm for r in dry_run.plan(ctx, ["fedgucci"])]
    assert planned == [a for a in ("FedGuCci", "FedAvg", "FedAvg lr x 1.05") for _ in (0, 1)]  # 1c deferred
    monkeypatch.setattr(fedgucci, "DEFERRED", {})  # every arm of claim 1, as when the controls are measured
    planned = dry_run.plan(ctx, ["fedgucci"])
    arms = ("FedGuCci", "FedAvg", "FedAvg lr x 1.05", *[f"FedAvg lr {lr:g}, 10% held out" for lr in (0.02, 0.04, 0.08)],
            "FedAvg lr 0.02 (if chosen)", "FedAvg lr 0.08 (if chosen)")
    assert [(r.arm, r.seed) for r in planned] == [(a, s) for a in arms for s in (0, 1)]
    assert not (tmp_path / "cache").exists() and not any(r.cached for r in planned)
    config = dry_run.fl_config(ctx, "fedgucci", {"seed": 0, "algorithm": None})
    samples = 4000  # MNIST-1D's training signals
    per_round = round(config["participation"] * config["clients"]) * config["local_epochs"] * math.ceil(
        samples / config["clients"] / config["batch_size"])
    assert (config["rounds"], planned[0].steps_per_round) == (4, per_round) and planned[0].steps == 4 * per_round
    ctx.train(fedgucci.arms(ctx)["FedAvg"])  # the FedAvg arm, both seeds, into the cache
    again = dry_run.plan(ctx, ["fedgucci"])
    assert [r.cached for r in again] == [False, False, True, True] + [False] * 12
    assert [r.folder for r in again[2:4]] == [ctx.folder("fedgucci", s, "fedavg", rounds=FEDGUCCI_ROUNDS)
                                             for s in (0, 1)]
    text = dry_run.report(again, {"fedgucci-mnist1d": 0.002})
    assert "fedgucci / FedAvg seed 0: cached" in text
    held = sum(r.steps for r in again[6:12])  # the validation runs (as the dry run counts them)
    assert f"16 runs, 2 in the cache, 14 to train ({8 * 4 * per_round + held} local steps)" in text


def test_the_dry_run_command_writes_nothing(tmp_path, capsys):
    before = sorted(os.listdir(tmp_path))
    assert cli.main(["--dry-run", "--quick", "--seeds", "0", "--only", "ima", "central", "--kernels", "native",
                     "--cache", str(tmp_path / "cache"), "--doc", str(tmp_path / "claims.md")]) == 0
    out = capsys.readouterr().out
    assert sorted(os.listdir(tmp_path)) == before
    assert "ima / IMA seed 0: 2/4 rounds stored" in out  # a branched IMA run trains only the rounds after its branch
    assert "central / central model: to train" in out and "Nothing was written." in out
