"""The claims' finishing gate (paper_claims.context): every seed of every arm of a row is judged, and the page says why.

Arm records hold :class:`fl.convergence.Progress` as the claims code builds it: from real short
runs on digits (``Context.track``) or from curves with their schedule; a row built from arms of
which one has not finished gets no verdict and names that arm, its seed and its numbers.
"""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

import fl
from fl.convergence import RULE, Progress, judge
from fl.resolve import build_config
from landscape import ConfigError
from landscape.claims.outcome import Outcome
from landscape.claims.statistics import REPRODUCED
from paper_claims import page as claim_doc
from paper_claims.context import ArmRecord, Context, blockers
from paper_claims.rows import ClaimRow, markdown_table

NOT_CONVERGED = Outcome.NOT_CONVERGED

TOL = 0.01
#: Schedules at their end: annealed (the last rate 1e-4 of the peak) and constant.
ANNEALED = dict(lr_end=5e-6, lr_peak=0.05)
CONSTANT = dict(lr_end=0.05, lr_peak=0.05)


def record(label: str, lr: dict, changes: list[float]) -> ArmRecord:
    """An arm of len(changes) seeds whose accuracy moves by ``changes[i]`` from round 20 to 40."""
    progress = [Progress("test-accuracy plateau", rounds=(20, 40), values=(0.8, 0.8 + c), **lr) for c in changes]
    return ArmRecord("recipe-x", label, list(range(len(changes))), [0.8 + c for c in changes], progress)


def comparison(blocked: str) -> ClaimRow:
    return ClaimRow("9a", "A beats B", "accuracy", ("arm 0", "arm 1"), [0.6, 0.65, 0.7, 0.75, 0.8], [0.5] * 5,
                    "greater", TOL, blocked=blocked)


def test_every_arm_is_checked_and_the_row_is_blocked_naming_arm_2():
    arms = [record("arm 0", ANNEALED, [0.03] * 5),  # rising at its end, but annealed: finished
            record("arm 1", CONSTANT, [0.001, -0.002, 0.0, 0.004, 0.001]),  # settled: every |change| < 0.005
            record("arm 2", CONSTANT, [0.001, 0.002, 0.02, 0.0, 0.001])]  # seed 2 still climbs 2 points
    assert blockers(arms[:2], TOL) == ""
    assert comparison(blockers(arms[:2], TOL)).verdict == REPRODUCED
    why = blockers(arms, TOL)
    assert why == ("arm 2 (recipe-x; test-accuracy plateau, limit 0.0050): seed 2 still changing (0.8000 at round 20 "
                   "-> 0.8200 at round 40, change +0.0200; lr at the end 100% of its peak)")
    assert blockers([arms[2], arms[2], arms[0]], TOL) == why  # an arm listed twice is judged once
    row = comparison(why)
    assert row.verdict == NOT_CONVERGED
    line = markdown_table([row]).splitlines()[2]
    assert f"{NOT_CONVERGED} ({why})" in line and line.count("|") == 13
    # the threshold is the row's: with a tolerance of 5 points the same 2-point climb is settled
    assert blockers(arms, 0.05) == ""
    both = blockers([record("arm 3", CONSTANT, [0.0, 0.03]), arms[2]], TOL)
    assert both.startswith("arm 3 (recipe-x; test-accuracy plateau, limit 0.0050): seed 1 still changing")
    assert both.endswith(" / " + why)
    # with seeds, only those are judged (their union over the arm's listings); a bare listing judges all
    assert blockers([(arms[2], {0, 1})], TOL) == ""
    assert blockers([(arms[2], {0}), (arms[2], {2})], TOL) == why
    assert blockers([(arms[2], {0}), arms[2]], TOL) == why


def test_context_gate_judges_every_tracked_run_from_real_runs(tmp_path):
    common = dict(dataset="digits", clients=4, rounds=8, progress=False, device="cpu", seed=1)
    climbing = fl.run("fedavg", lr=0.01, out=tmp_path / "climbing", **common)  # constant lr, still rising
    annealed = fl.run("fedavg", lr=0.05, lr_decay=0.7, out=tmp_path / "annealed", **common)  # lr x 0.3 per round
    flat = SimpleNamespace(  # a plateaued constant-lr curve with the schedule of a stored configuration
        path=tmp_path / "flat", config=build_config("fedavg", dataset="digits", clients=4, rounds=8, lr=0.05)[0],
        metrics=[{"round": r, "test_accuracy": 0.9} for r in range(9)])
    flat.convergence = lambda: fl.convergence.assess(flat.metrics)
    ctx = Context([1], quick=False, cache=tmp_path)
    for label, run in (("annealed", annealed), ("flat", flat), ("climbing", climbing)):
        ctx.track("digits", label, [run])
    assert [judge(a.progress[0], TOL).reason for a in ctx.arms] == ["annealed", "settled", "still changing"]
    assert ctx.gate(TOL, [annealed], [flat]) == ""
    why = ctx.gate(TOL, [annealed], [flat], [climbing])
    change = ctx.arms[2].progress[0].change
    assert why.startswith("climbing (digits; test-accuracy plateau, limit 0.0050): seed 1 still changing")
    assert f"change {change:+.4f}; lr at the end 100% of its peak" in why
    assert ctx.gate(TOL, [SimpleNamespace(path=tmp_path / "untracked")]) == ""  # fixed-budget protocols: not judged
    assert all("lr at the end / peak" in line for line in ctx.log_lines)


def test_the_page_prints_the_rule_and_names_the_blocking_arm(tmp_path):
    ctx = Context([0, 1, 2, 3, 4], quick=False, cache=tmp_path)
    ctx.arms = [record("arm 0", ANNEALED, [0.03] * 5), record("arm 2", CONSTANT, [0.0, 0.0, 0.02, 0.0, 0.0])]
    ctx.started = time.time()
    claim_doc.write_doc(tmp_path / "claims.md", [comparison(blockers(ctx.arms, TOL))], ctx, "claims.py")
    text = (tmp_path / "claims.md").read_text()
    method = text.split("## Convergence", 1)[1].split("## Results", 1)[0]
    assert RULE in method and claim_doc.GATES in method and "below 1% of the schedule's peak" in RULE
    assert "recipe-x / arm 2: plateau" in method and "lr at the end / peak: 0.01%" in method
    assert "| 9a |" in text and "no verdict: not converged (arm 2 (recipe-x; test-accuracy plateau" in text


@pytest.mark.parametrize("tol", [0.0, -1.0])
def test_a_row_without_a_positive_gate_tolerance_is_refused(tol):
    with pytest.raises(ConfigError, match="tolerance > 0"):
        blockers([record("arm 0", CONSTANT, [0.0])], tol)


def test_the_gate_judges_only_the_seeds_a_row_uses(tmp_path):
    def stored(seed: int, rise: float) -> SimpleNamespace:
        """A constant-lr run of ``seed`` whose accuracy rises by ``rise`` per round from round 4 on."""
        config = build_config("fedavg", dataset="digits", clients=4, rounds=8, lr=0.05, seed=seed)[0]
        run = SimpleNamespace(path=tmp_path / f"seed{seed}", config=config,
                              metrics=[{"round": r, "test_accuracy": 0.9 + rise * max(r - 4, 0)} for r in range(9)])
        run.convergence = lambda: fl.convergence.assess(run.metrics)
        return run

    flat, climbing = stored(0, 0.0), stored(1, 0.02)
    ctx = Context([0, 1], quick=False, cache=tmp_path)
    ctx.track("digits", "arm", [flat, climbing])
    assert ctx.gate(TOL, [flat]) == ""  # a row of seed 0 only: seed 1's run does not block it
    why = ctx.gate(TOL, [flat, climbing])
    assert "seed 1 still changing" in why and "seed 0" not in why
