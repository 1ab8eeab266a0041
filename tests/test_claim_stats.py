"""benchmarks/claim_stats.py: effect sizes and verdict rules of the claims table."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from claim_stats import (INCONCLUSIVE, NOT_MEASURED, NOT_REPRODUCED, REPRODUCED, ClaimRow,  # noqa: E402
                         markdown_table, mean_std)


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
    ([0.6, 0.7, 0.8], [0.5, 0.5, 0.5], "greater", 0.01, REPRODUCED),
    ([0.6, 0.7, 0.8], [0.5, 0.5, 0.5], "less", 0.01, NOT_REPRODUCED),        # every seed the other way
    ([0.6, 0.4, 0.8], [0.5, 0.5, 0.5], "greater", 0.01, INCONCLUSIVE),       # seeds disagree
    ([0.501, 0.502, 0.503], [0.5, 0.5, 0.5], "greater", 0.01, NOT_REPRODUCED),  # below the tolerance
    ([0.49, 0.495, 0.5], [0.5, 0.5, 0.5], "not_less", 0.01, REPRODUCED),
    ([0.3, 0.35, 0.4], [0.5, 0.5, 0.5], "not_less", 0.01, NOT_REPRODUCED),
])
def test_comparison_verdicts(a, b, claimed, tol, verdict):
    assert row(a, b, claimed, tol).verdict == verdict


def test_threshold_verdicts_and_table():
    assert row([1e-9, 2e-9], claimed="below", bound=1e-5).verdict == REPRODUCED
    assert row([1e-9, 1.0], claimed="below", bound=1e-5).verdict == INCONCLUSIVE
    assert row([0.1, 0.2], claimed="above", bound=0.5).verdict == NOT_REPRODUCED
    assert row([]).verdict == NOT_MEASURED
    table = markdown_table([row([0.6, 0.7, 0.8], [0.5, 0.5, 0.5]), row([0.1, 0.2], claimed="below", bound=0.5)])
    lines = table.splitlines()
    assert len(lines) == 4 and all(line.count("|") == 8 for line in lines)
    assert "A: 0.700 ± 0.100" in lines[2] and "+2.00" in lines[2] and REPRODUCED in lines[2]
    assert "bound < 0.5" in lines[3]
