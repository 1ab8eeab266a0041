"""The rest of the package sees an evaluator only through ``PointEvaluator``.

Every attribute that code outside ``landscape/evaluation`` reads from an evaluator is a member of
the protocol, and the concrete ``Evaluator`` provides every member.
"""
from __future__ import annotations

import re
from pathlib import Path

import torch

import landscape
from landscape.evaluation.protocol import PointEvaluator

ROOT = Path(__file__).resolve().parents[1]
#: ``evaluator.x``, ``ev.x``, ``self.evaluator.x``, ``ctx.evaluator.x`` in the source
USE = re.compile(r"\b(?:self\.|ctx\.)?(?:evaluator|ev)\.([a-z_]\w*)\b")
MEMBERS = {n for n in dir(PointEvaluator) if not n.startswith("_")} | set(PointEvaluator.__annotations__)


def uses_outside_evaluation(text_by_file: dict[str, str]) -> dict[str, set[str]]:
    """Attribute name -> files, for evaluator attributes read outside the evaluation package."""
    found: dict[str, set[str]] = {}
    for name, text in text_by_file.items():
        for attr in USE.findall(text):
            found.setdefault(attr, set()).add(name)
    return found


def _sources() -> dict[str, str]:
    files = [p for pkg in ("landscape", "fl", "figures", "landscape_cli") for p in (ROOT / pkg).rglob("*.py")
             if "evaluation" not in p.relative_to(ROOT).parts]
    return {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in files}


def test_code_outside_the_evaluation_package_uses_only_the_protocol():
    fingerprint_dicts = {"get"}  # results and figures read a stored fingerprint (a dict) named evaluator
    outside = {a: f for a, f in uses_outside_evaluation(_sources()).items() if a not in MEMBERS | fingerprint_dicts}
    assert not outside, outside


def test_a_planted_use_of_an_internal_is_caught():
    planted = {"landscape/geometry/x.py": "n = evaluator.runner.strategy\nm = ev.scorer.loss\n"}
    assert set(uses_outside_evaluation(planted)) - MEMBERS == {"runner", "scorer"}


def test_the_evaluator_provides_every_member():
    ev = landscape.Evaluator(torch.nn.Linear(3, 2), (torch.randn(4, 3), torch.tensor([0, 1, 0, 1])), progress=False)
    missing = [m for m in sorted(MEMBERS) if not hasattr(ev, m)]
    assert not missing, missing
    assert not hasattr(ev, "compile")  # options are read from ev.options, not forwarded as attributes
