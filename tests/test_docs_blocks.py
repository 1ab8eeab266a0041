"""Every code block of the documentation runs as written or says what it needs; quoted numbers are generated.

``scripts/docs_blocks.py`` holds the convention (a ``<!-- fragment: ... -->``, ``<!-- slow: ... -->``,
``<!-- signatures -->`` or ``<!-- output -->`` comment above a block) and the checks; this suite runs
them on ``README.md`` and ``docs/``: unmarked Python blocks run in fresh processes, fragments name what
they use, slow blocks and fragments compile and import existing names, shell commands parse. The
table of ``docs/sharpness.md`` must be what ``examples/sharpness.py --doc`` renders from the results it
stored, measured with the example's current defaults (likewise ``docs/curvature-views.md`` and the
BatchNorm modes table of ``docs/batchnorm.md``, from ``scripts/batchnorm_modes.py --doc``). The checks
themselves are tested on small pages.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "scripts"), str(ROOT / "examples")]

from _blocks import Block, all_blocks, extract, python_problems, syntax_error, undefined_names  # noqa: E402
from _docs import differences, splice  # noqa: E402
from _shell_blocks import command_problem, shell_commands  # noqa: E402
from docs_blocks import (  # noqa: E402
    import_problems,
    output_problems,
    run_blocks,
    same_output,
    static_problems,
)


@pytest.fixture(scope="module")
def blocks() -> list[Block]:
    return all_blocks()


def test_every_block_is_marked_or_self_contained(blocks):
    python = [b for b in blocks if b.lang == "python"]
    assert len(python) >= 40 and {"run", "fragment", "slow", "signatures"} <= {b.kind for b in python}
    assert any(b.lang == "bash" for b in blocks)
    problems = static_problems(blocks)
    assert not problems, "\n".join(problems)


def test_blocks_that_do_not_run_here_compile_and_import_existing_names(blocks):
    checked = [b for b in blocks if b.lang == "python" and b.kind in ("fragment", "slow")]
    assert all(syntax_error(b) is None for b in checked)
    problems = import_problems(checked)
    assert not problems, "\n".join(problems)


def test_blocks_run_as_written_and_print_what_the_pages_show(blocks):
    runnable = [b for b in blocks if b.lang == "python" and b.kind == "run"]
    assert {"docs/sharpness.md", "docs/index.md"} <= {b.page for b in runnable}
    results = run_blocks(runnable, jobs=2, timeout=600)
    problems = [failure for failure, _ in results.values() if failure] + output_problems(blocks, results)
    assert not problems, "\n\n".join(problems)


# ---------------------------------------------------------------------------- numbers quoted by pages
def load_example(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"example_{name}", ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name, page, table, key", [
    ("sharpness", "sharpness.md", "Worst-case sharpness (best over restarts)", "sharpness"),
    ("curvature_views", "curvature-views.md", "Hessian curvature by block (mnist1d_mlp)", "trace"),
    ("tracking", "tracking.md", "Last tracked round (mean over seeds)", "top_eigenvalue")])
def test_page_shows_what_the_example_stored_with_its_current_defaults(name, page, table, key):
    from _common import build_parser

    example = load_example(name)
    stored = json.loads((ROOT / "docs" / "data" / f"{name}.json").read_text(encoding="utf-8"))
    stale = differences(stored["args"], build_parser(name, "", example.add_arguments))
    assert not stale and not stored["quick"], f"rerun examples/{name}.py --doc: stored with {stale}"
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    assert splice(text, name, example.page_parts(stored)) == text, f"rerun examples/{name}.py --doc"
    assert f" {stored['tables'][table][0][key]:.4g} |" in text  # the stored numbers are the page's


def test_batchnorm_page_shows_what_the_script_stored_with_its_current_defaults():
    import batchnorm_modes

    stored = json.loads((ROOT / "docs" / "data" / "batchnorm_modes.json").read_text(encoding="utf-8"))
    stale = differences(stored["args"], batchnorm_modes.build_parser())
    assert not stale, f"rerun {batchnorm_modes.SCRIPT} --doc: stored with {stale}"
    text = (ROOT / "docs" / "batchnorm.md").read_text(encoding="utf-8")
    parts = batchnorm_modes.page_parts(stored)
    assert splice(text, "batchnorm_modes", parts, batchnorm_modes.SCRIPT) == text, \
        f"rerun {batchnorm_modes.SCRIPT} --doc"
    rows = [r for r in stored["rows"] if r["mode"] == "recompute"]
    assert len(rows) == stored["args"]["pairs"]
    barriers = [r["loss barrier"] for r in rows]  # the mean and sample deviation, computed here
    mean = sum(barriers) / len(barriers)
    std = (sum((b - mean) ** 2 for b in barriers) / (len(barriers) - 1)) ** 0.5
    assert f"| {mean:.3f} +- {std:.3f} |" in text


def test_a_stored_run_with_other_settings_than_the_defaults_is_stale():
    from _common import build_parser

    example = load_example("sharpness")
    parser = build_parser("sharpness", "", example.add_arguments)
    stored = dict(vars(parser.parse_args([])), out="elsewhere", doc=True)
    assert differences(stored, parser) == []  # the output folder and --doc do not change the numbers
    assert differences(dict(stored, epochs=30), parser) == ["epochs=30 (default 20)"]
    assert differences({k: v for k, v in stored.items() if k != "rho_l2"}, parser) == \
        ["rho_l2='<missing>' (default 0.5)"]  # an option added since the run was stored


def test_the_page_splice_replaces_only_the_marked_part():
    from _docs import doc_markers

    (b1, e1), (b2, e2) = doc_markers("x", "table"), doc_markers("x", "text")
    page = f"intro\n{b1}\nold table\n{e1}\nmiddle\n{b2}\nold text\n{e2}\noutro\n"
    assert splice(page, "x", {"table": "new table\n", "text": "new"}) == \
        f"intro\n{b1}\n\nnew table\n\n{e1}\nmiddle\n{b2}\n\nnew\n\n{e2}\noutro\n"
    with pytest.raises(ValueError, match="once each around x's table"):
        splice(page.replace(e1, ""), "x", {"table": "t"})
    b3, e3 = doc_markers("x", "table", "scripts/x.py")  # a script outside examples/ names itself
    assert "written by scripts/x.py --doc from docs/data/x.json" in b3 and "scripts/x.py --doc writes" in e3
    with pytest.raises(ValueError, match="once each"):  # the markers of examples/x.py are not its own
        splice(page, "x", {"table": "t"}, "scripts/x.py")


# ---------------------------------------------------------------------------- the checks catch mistakes
def page(tmp_path: Path, text: str) -> list[Block]:
    path = tmp_path / "page.md"
    path.write_text(text, encoding="utf-8")
    return extract(path, root=tmp_path)


def test_markers_are_read_from_the_line_above_the_fence(tmp_path):
    found = page(tmp_path, "text\n\n<!-- fragment: needs `ev` -->\n```python\nev.x\n```\n\n```python\nx = 1\n```\n"
                           "  <!-- slow: minutes -->\n  ```python\n  import os\n  ```\n")
    assert [(b.line, b.kind, b.note, b.code) for b in found] == [
        (4, "fragment", "needs `ev`", "ev.x\n"), (8, "run", "", "x = 1\n"), (12, "slow", "minutes", "import os\n")]
    assert found[0].padded.splitlines()[found[0].line] == "ev.x"  # 0-based: the page's line after the fence
    with pytest.raises(ValueError, match="unknown block marker 'fragmnet'"):
        page(tmp_path, "<!-- fragmnet: x -->\n```python\nx\n```\n")
    with pytest.raises(ValueError, match="never closed"):
        page(tmp_path, "```python\nx = 1\n")


def test_undefined_names_are_what_a_fresh_interpreter_would_miss():
    code = ("import torch, landscape as L\nfrom a import b\nx = 1\ndef f(y):\n    return [x + k + w for k in y], g\n"
            "class C:\n    q = x\nprint(x, m, C, f, len(ev))\nfor i in range(3):\n    pass\n")
    assert undefined_names(code) == {"w", "g", "m", "ev"}


def test_a_block_using_an_undefined_name_must_be_a_fragment_naming_it():
    def block(kind, note, code="print(model, ev)\n"):
        return Block("p.md", 3, "python", code, kind, note)

    assert "uses `ev`, `model` without defining them" in python_problems(block("run", ""))[0]
    assert "uses `ev`, `model`" in python_problems(block("slow", "minutes"))[0]
    assert python_problems(block("fragment", "needs `model` and its Evaluator `ev`")) == []
    assert "does not name `ev`" in python_problems(block("fragment", "needs `model` and an Evaluator ev"))[0]
    assert "does not compile" in python_problems(block("run", "", "f(a, *, b=1) -> R\n"))[0]
    assert python_problems(block("run", "", "import os\nprint(os.sep)\n")) == []


def test_marker_misuse_is_reported(tmp_path):
    found = page(tmp_path, "<!-- output -->\n```text\n1\n```\n<!-- slow: x -->\n```bash\nmake test\n```\n"
                           "<!-- fragment: -->\n```python\nx = 1\n```\n")
    problems = static_problems(found)
    assert any("follows no block that runs" in p for p in problems)
    assert any("<!-- slow --> marker above a bash block" in p for p in problems)
    assert any("does not say what it needs" in p for p in problems)


def test_shell_commands_are_split_and_checked():
    assert shell_commands("OMP_NUM_THREADS=1 nice -n 10 python a.py --x 1 && cp a b  # note\nmake \\\n  demo\n") == \
        [["python", "a.py", "--x", "1"], ["cp", "a", "b"], ["make", "demo"]]
    assert command_problem(["landscape", "path", "--run", "r", "--models", "global", "client:0"]) is None
    assert "unrecognized arguments: --no-such-flag" in command_problem(["landscape", "path", "--no-such-flag"])
    assert "invalid choice" in command_problem(["fl-run", "--recipe", "NAME"])
    assert command_problem([".venv/bin/python", "examples/sharpness.py", "--doc", "--out", "x"]) is None
    assert "has no option --no-such-flag" in command_problem(["python", "examples/sharpness.py", "--no-such-flag"])
    assert "no file" in command_problem(["python", "examples/nowhere.py"])
    assert command_problem(["python", "-m", "landscape.cache.upgrade"]) is None
    assert "no Makefile target" in command_problem(["make", "nothing"]) and command_problem(["make", "demo"]) is None
    assert "unknown program 'wget'" in command_problem(["wget", "x"])


def test_outputs_compare_numbers_to_a_tolerance():
    assert same_output("0.0 0.0057\n[3.69 3.53 ] True\n", "0.0 0.00570001\n[3.6900001 3.53] True")
    assert not same_output("0.0 0.0057\n", "0.0 0.0\n")          # a barrier that went away
    assert not same_output("[3.69 3.53] True\n", "[3.69 3.53] False\n")
    assert not same_output("1 2\n", "1 2 3\n")
    shown = Block("p.md", 9, "text", "1.5\n", "output")
    ran = Block("p.md", 3, "python", "print(1.5)\n")
    assert output_problems([ran, shown], {ran.label: (None, "1.5\n")}) == []
    assert "another output than p.md:3" in output_problems([ran, shown], {ran.label: (None, "2.5\n")})[0]
