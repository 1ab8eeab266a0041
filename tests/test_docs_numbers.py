"""No new hand-copied measurement in ``docs/``: a number with a unit of time, speed-up or share is generated.

A number quoted in the docs comes from the script that makes it: inside a part written by a script's
``--doc`` (``examples/_docs.py``), in an ``<!-- output -->`` block checked against a run, or not at all
(a pointer to the benchmark that prints it). This suite lists the numbers with a unit (``s``, ``ms``,
``x``, ``%``, minutes, times) in the prose and tables of the pages, outside code, inline code and
generated parts, and fails on one that :data:`ALLOWED` does not list with its reason.
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: pages generated whole by a script (``python -m paper_claims``, ``examples/merging.py``, ``scripts/cli_help.py``)
GENERATED_PAGES = {"claims.md", "merging.md", "cli.md"}

#: a number or a range of numbers, then a unit; not a shape (``1 x 28 x 28``) nor part of a name or version
QUANTITY = re.compile(r"(?<![\w.`/-])\d+(?:\.\d+)?(?:\s*(?:-|–|to)\s*\d+(?:\.\d+)?)?\s?"
                      r"(?:ms|s|x|%|minutes?|seconds?|hours?|times)(?![\w(])(?!\s*\d)")

#: (page, quantity) -> why it may stay: a setting rather than a measurement, or a measurement not yet generated
ALLOWED = {
    ("api.md", "95%"): "a confidence level, a setting",
    ("connectivity.md", "95%"): "a confidence level, a setting",
    ("connectivity.md", "8-24 s"): "benchmarks/claim_aligned.py's run time, copied with its table (not yet generated)",
    ("connectivity.md", "45%"): "benchmarks/claim_aligned.py's accuracy group barrier (not yet generated)",
    ("connectivity.md", "23%"): "benchmarks/claim_aligned.py's accuracy group barrier (not yet generated)",
    ("barriers.md", "4.9x"): "bench_adaptive_barrier.py's ratio, copied from its table (not yet generated)",
    ("barriers.md", "3.0x"): "bench_adaptive_barrier.py's ratio, copied from its table (not yet generated)",
    ("curvature-operators.md", "1%"): "a probability bound of a test, a setting",
    ("flower.md", "20 s"): "the connect-timeout the guide sets",
    ("flower.md", "10 s"): "a default timeout in the options table",
    ("methods/fedgucci.md", "1 times"): "N + 1 optimiser steps, a count",
    ("methods/landscape.md", "20%"): "PyHessian's eigenvalue error, measured once (not yet generated)",
    ("methods/landscape.md", "0.5%"): "a default bandwidth, a setting",
    ("methods/lss.md", "0.1 times"): "a default coefficient, a setting",
    ("methods/lss.md", "1%"): "the regulariser's share of the gradient, measured once (not yet generated)",
    ("planes.md", "0.1%"): "a threshold, a setting",
    ("planes.md", "5%"): "a threshold, a setting",
    ("transformers.md", "40 to 110 s"): "the LoRA block's run time, which its slow marker needs (re-measured by hand)",
    ("transformers.md", "30 s"): "the LoRA block's CPU time, which its slow marker needs (re-measured by hand)",
    ("transformers.md", "590 s"): "the LoRA block's run time with default threads (re-measured by hand)",
}


def blank(match: re.Match) -> str:
    """The matched text as blank lines (line numbers stay the page's)."""
    return "\n" * match.group().count("\n")


def quantities(text: str) -> list[tuple[int, str]]:
    """The numbers with a unit in a page's prose and tables: (line, quantity) each.

    Fenced code, inline code, HTML comments and the parts a script writes between its
    ``--doc`` markers are left out.
    """
    text = re.sub(r"<!-- (\w+): written by .*?<!-- end of the \1 .*?-->", blank, text, flags=re.S)
    text = re.sub(r"^\s*(```|~~~).*?^\s*\1", blank, text, flags=re.S | re.M)
    text = re.sub(r"<!--.*?-->", blank, text, flags=re.S)
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        found += [(number, m.group()) for m in QUANTITY.finditer(re.sub(r"`[^`]*`", "", line))]
    return found


def test_quantities_are_found_in_prose_and_tables_only():
    page = ("took 28 s and 1.2x; 10 to 45 s; 3.5-4.5% of it\n| a | 140 ms |\nshape 1 x 28 x 28, v1.5x2, `9 s`\n"
            "```bash\nsleep 5s  # 3 s\n```\n<!-- table: written by x.py --doc from y; z -->\n| 7 s |\n"
            "<!-- end of the table x.py --doc writes -->\n2 minutes\n")
    assert quantities(page) == [(1, "28 s"), (1, "1.2x"), (1, "10 to 45 s"), (1, "3.5-4.5%"), (2, "140 ms"),
                                (10, "2 minutes")]


def test_docs_quote_no_hand_copied_measurement():
    found, used = [], set()
    for path in sorted((ROOT / "docs").rglob("*.md")):
        page = path.relative_to(ROOT / "docs").as_posix()
        if page in GENERATED_PAGES:
            continue
        for line, quantity in quantities(path.read_text(encoding="utf-8")):
            if (page, quantity) in ALLOWED:
                used.add((page, quantity))
            else:
                found.append(f"docs/{page}:{line}: {quantity}")
    assert not found, ("numbers with units copied by hand (generate them with the script's --doc, point to the "
                       "benchmark that prints them, or list them in ALLOWED with why):\n" + "\n".join(found))
    assert not set(ALLOWED) - used, f"ALLOWED lists quantities no page quotes: {sorted(set(ALLOWED) - used)}"
