"""The claims package: definitions as data, one verdict vocabulary, Holm-adjusted p-values and the dry run.

* Holm's adjustment against a family worked by hand, and the one-sided p-value against scipy's
  t-test;
* every claim definition is complete and consistent with its group's gate;
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
from paper_claims import cli, dry_run
from paper_claims.context import Context
from paper_claims.definitions import CLAIMS, GROUPS, SETTINGS
from paper_claims.rows import ClaimRow, holm_column


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
               "fedavg_epochs": "8, 16, 32"}
    for c in CLAIMS.values():
        texts = c.filled(**setting)
        assert c.group in GROUPS and c.claimed in CLAIMED and c.tol >= 0 and c.rationale
        assert not re.search(r"[{}]", texts["statement"] + texts["metric"] + "".join(texts["arms"])), c.id
        assert (texts["arms"][1] == "") == (c.claimed in ("below", "above")), c.id
    gated = {g.name: g.gate_tol for g in GROUPS.values() if g.gate_tol is not None}
    assert gated == {"fedgucci": CLAIMS["1a"].tol, "central": CLAIMS["2c"].tol, "ima": CLAIMS["4a"].tol,
                     "floco": CLAIMS["5a"].tol}


def test_the_dry_run_lists_every_arm_and_seed_and_sees_the_cache(tmp_path):
    ctx = Context([0, 1], quick=True, cache=tmp_path / "cache", kernels="native")
    planned = dry_run.plan(ctx, ["fedgucci"])
    assert [(r.arm, r.seed) for r in planned] == [(a, s) for a in ("FedGuCci", "FedAvg", "FedAvg lr x 1.05")
                                                  for s in (0, 1)]
    assert not (tmp_path / "cache").exists() and not any(r.cached for r in planned)
    config = dry_run.fl_config(ctx, "fedgucci", {"seed": 0, "algorithm": None})
    samples = 4000  # MNIST-1D's training signals
    per_round = round(config["participation"] * config["clients"]) * config["local_epochs"] * math.ceil(
        samples / config["clients"] / config["batch_size"])
    assert (config["rounds"], planned[0].steps_per_round) == (4, per_round) and planned[0].steps == 4 * per_round
    ctx.train(ctx.plan("fedgucci", "FedAvg", algorithm="fedavg"))  # the FedAvg arm, both seeds, into the cache
    again = dry_run.plan(ctx, ["fedgucci"])
    assert [r.cached for r in again] == [False, False, True, True, False, False]
    assert [r.folder for r in again[2:4]] == [ctx.folder("fedgucci", s, "fedavg") for s in (0, 1)]
    text = dry_run.report(again, {"fedgucci-mnist1d": 0.002})
    assert "fedgucci / FedAvg seed 0: cached" in text
    assert f"6 runs, 2 in the cache, 4 to train ({4 * 4 * per_round} local steps)" in text
    assert f"estimated training time {4 * 4 * per_round * 0.002 / 60:.1f} min" in text


def test_the_dry_run_command_writes_nothing(tmp_path, capsys):
    before = sorted(os.listdir(tmp_path))
    assert cli.main(["--dry-run", "--quick", "--seeds", "0", "--only", "ima", "central", "--kernels", "native",
                     "--cache", str(tmp_path / "cache"), "--doc", str(tmp_path / "claims.md")]) == 0
    out = capsys.readouterr().out
    assert sorted(os.listdir(tmp_path)) == before
    assert "ima / IMA seed 0: 2/4 rounds stored" in out  # a branched IMA run trains only the rounds after its branch
    assert "central / central model: to train" in out and "Nothing was written." in out
