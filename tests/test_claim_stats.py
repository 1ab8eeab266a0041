"""paper_claims.rows: effect sizes and verdict rules of the claims table; p-values and Holm's adjustment."""
from __future__ import annotations

import math

import numpy as np
import pytest

from landscape.claims.outcome import Outcome
from landscape.claims.statistics import INCONCLUSIVE, NOT_REPRODUCED, NOT_TESTABLE, REPRODUCED, Interval, decide
from paper_claims.rows import ClaimRow, markdown_table, mean_std

NOT_CONVERGED, NOT_MEASURED = Outcome.NOT_CONVERGED, Outcome.NOT_MEASURED


def row(a, b=(), claimed="greater", tol=0.0, bound=0.0) -> ClaimRow:
    return ClaimRow("1a", "s", "m", ("A", "B"), list(a), list(b), claimed, tol, bound)


def test_effect_is_paired_cohens_d():
    a, b = [0.5, 0.7, 0.9], [0.4, 0.5, 0.6]
    d = np.array(a) - np.array(b)  # 0.1, 0.2, 0.3: mean 0.2, sample std 0.1
    assert row(a, b).effect == pytest.approx(d.mean() / d.std(ddof=1)) == pytest.approx(2.0)
    assert row([1.0, 1.0], [0.5, 0.5]).effect == math.inf
    assert row([1.0, 1.0], [1.0, 1.0]).effect == 0.0
    assert math.isnan(row([1.0]).effect)
    assert mean_std([2.0]) == (2.0, 0.0)


@pytest.mark.parametrize("a, b, claimed, tol, verdict", [
    ([0.6, 0.65, 0.7, 0.75, 0.8], [0.5] * 5, "greater", 0.01, REPRODUCED),      # CI [0.10, 0.30]
    ([0.6, 0.65, 0.7, 0.75, 0.8], [0.5] * 5, "less", 0.01, NOT_REPRODUCED),     # CI on the wrong side
    ([0.6, 0.4, 0.8, 0.45, 0.55], [0.5] * 5, "greater", 0.01, INCONCLUSIVE),    # CI contains 0
    ([0.501, 0.502, 0.503, 0.502, 0.502], [0.5] * 5, "greater", 0.01, NOT_REPRODUCED),  # CI inside the band
    ([0.6, 0.7, 0.8], [0.5] * 3, "greater", 0.01, INCONCLUSIVE),  # every seed agrees, but 3 seeds: CI [-0.05, 0.45]
    ([0.495, 0.497, 0.5, 0.498, 0.496], [0.5] * 5, "not_less", 0.01, REPRODUCED),
    ([0.3, 0.35, 0.4, 0.33, 0.37], [0.5] * 5, "not_less", 0.01, NOT_REPRODUCED),
])
def test_comparison_verdicts(a, b, claimed, tol, verdict):
    assert row(a, b, claimed, tol).verdict == verdict


def test_interval_is_the_student_t_interval_of_the_paired_differences():
    from scipy import stats

    a, b = [0.61, 0.55, 0.72, 0.58, 0.66], [0.52, 0.56, 0.61, 0.50, 0.60]
    d = np.array(a) - np.array(b)
    half = stats.t.ppf(0.975, 4) * d.std(ddof=1) / np.sqrt(5)
    iv = row(a, b).interval
    assert (iv.mean, iv.low, iv.high, iv.n) == pytest.approx((d.mean(), d.mean() - half, d.mean() + half, 5))


def test_the_old_tables_rows_4a_and_1b_under_the_rule():
    # 4a was "reproduced" with the paired 95% interval [-0.017, +0.045] (mean +0.015, 3 seeds): it contains 0
    assert decide(Interval(0.015, -0.017, 0.045, 3), "greater", tol=0.005) == INCONCLUSIVE
    # 1b: accuracy barriers of 0.001-0.003 on 1,000 test signals at accuracy ~0.5, where one sample moves a
    # barrier by 1 / (1000 * 0.5) = 0.002: both arms sit at the metric's resolution
    one_sample = 1 / (1000 * 0.5)
    b1 = row([0.001, 0.002, 0.003], [0.002, 0.001, 0.003], "less", 0.005)
    b1.resolution = one_sample
    assert b1.verdict == NOT_TESTABLE
    b1.resolution = 0.0
    assert b1.verdict == NOT_REPRODUCED  # without the floor: "no difference", which is not what was measured


def test_threshold_verdicts_and_table():
    assert row([1e-9, 2e-9], claimed="below", bound=1e-5).verdict == REPRODUCED
    assert row([1e-9, 1.0], claimed="below", bound=1e-5).verdict == INCONCLUSIVE
    assert row([0.1, 0.11, 0.12], claimed="above", bound=0.5).verdict == NOT_REPRODUCED
    assert row([0.1, 0.2], claimed="above", bound=0.5).verdict == INCONCLUSIVE  # 2 values: CI [-0.49, 0.79]
    assert row([]).verdict == NOT_MEASURED
    table = markdown_table([row([0.6, 0.7, 0.8], [0.5, 0.5, 0.5]), row([0.1, 0.2], claimed="below", bound=0.5)])
    lines = table.splitlines()
    assert len(lines) == 4 and all(line.count("|") == 13 for line in lines)
    assert "A: 0.700 ± 0.100" in lines[2] and "+2.00" in lines[2] and INCONCLUSIVE in lines[2]
    assert "+0.2 [-0.04841, +0.4484]" in lines[2]
    assert "bound < 0.5" in lines[3]


def test_an_arm_that_did_not_converge_gets_no_verdict():
    clear = row([0.6, 0.65, 0.7, 0.75, 0.8], [0.5] * 5, "greater", 0.01)
    assert clear.verdict == REPRODUCED
    clear.blocked = "FedAvg (r): seed 3 still changing"  # the same numbers from a run still climbing measure training
    assert clear.verdict == NOT_CONVERGED
    assert f"{NOT_CONVERGED} (FedAvg (r): seed 3 still changing)" in markdown_table([clear])
