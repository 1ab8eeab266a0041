"""Check and run the code blocks of the documentation (``docs/**/*.md`` and ``README.md``).

A page says what each ```` ```python ```` block is with an HTML comment on the line above its opening
fence (invisible on the site, visible in the Markdown):

* no comment: the block **runs as written**, on its own, in a fresh Python process started in an
  empty temporary folder (the repository importable, one torch thread);
* ``<!-- fragment: needs `model`, `ev` (a model and an Evaluator of it) -->``: the block does not
  run on its own; the comment says what it needs and names, in backticks, every name the block uses
  without defining it (checked). Fragments are compiled and the names they import must exist;
* ``<!-- slow: why -->``: the block runs as written but takes longer than the test suite allows;
  the suite compiles it and checks its imports, ``--all`` runs it;
* ``<!-- signatures -->``: a listing of call signatures, not Python (``-> Result``, a bare ``*``);
  ``tests/test_docs.py`` checks that the names in it exist;
* ``<!-- output -->`` above a ```` ```text ```` block right after a block that runs: what that block
  prints (numbers to a relative or absolute 1e-3); ``--write-outputs`` rewrites it from the run.

```` ```bash ```` blocks are checked, not run (``_shell_blocks.py``): the commands, the files and the
options they name must exist.

    .venv/bin/python scripts/docs_blocks.py                    # check every block, run the quick ones
    .venv/bin/python scripts/docs_blocks.py --all              # run the slow ones too
    .venv/bin/python scripts/docs_blocks.py --all docs/sharpness.md

``tests/test_docs_blocks.py`` runs the same checks (without ``--all``).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _blocks import ROOT, Block, all_blocks, import_statements, python_problems, syntax_error
from _shell_blocks import shell_problems

#: a number as Python and numpy print it
NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
#: how far a printed number may be from the one the page shows (relative or absolute)
TOLERANCE = 1e-3


def static_problems(blocks: list[Block]) -> list[str]:
    """Every problem found without running anything (imports excluded: :func:`import_problems`).

    Parameters
    ----------
    blocks : list[Block]
        The blocks of one or more pages, in page order.

    Returns
    -------
    list[str]
        One line per problem, starting with ``page:line``.
    """
    found = []
    for previous, b in zip([None, *blocks], blocks):
        if b.lang == "python" and b.kind not in ("signatures", "output"):
            found += python_problems(b)
        elif b.lang in ("bash", "sh"):
            found += shell_problems(b)
        if b.kind == "output":
            if previous is None or previous.page != b.page or previous.lang != "python" or \
                    previous.kind not in ("run", "slow"):
                found.append(f"{b.label}: an <!-- output --> block follows no block that runs")
        elif b.kind != "run" and b.lang != "python":
            found.append(f"{b.label}: a <!-- {b.kind} --> marker above a {b.lang or 'plain'} block")
        if b.kind == "fragment" and not b.note:
            found.append(f"{b.label}: the fragment's comment does not say what it needs")
    return found


IMPORT_CHECK = """
import json, sys
failed = []
for label, statement in json.load(sys.stdin):
    try:
        exec(statement, {})
    except Exception as exc:
        failed.append(f"{label}: {statement} fails: {type(exc).__name__}: {exc}")
print(json.dumps(failed))
"""


def import_problems(blocks: list[Block], timeout: float = 300.0) -> list[str]:
    """Run every import statement of ``blocks`` in one fresh process (the repository importable).

    Parameters
    ----------
    blocks : list[Block]
        Python blocks that compile.
    timeout : float
        Seconds.

    Returns
    -------
    list[str]
        ``page:line: from x import y fails: ImportError: ...`` per statement that fails.
    """
    statements = [(f"{b.page}:{line}", s) for b in blocks for line, s in import_statements(b)]
    done = subprocess.run([sys.executable, "-c", IMPORT_CHECK], input=json.dumps(statements), text=True,
                          capture_output=True, env=block_env(), cwd=tempfile.gettempdir(), timeout=timeout)
    if done.returncode:
        return [f"the import check failed: {done.stderr.strip().splitlines()[-1:]}"]
    return json.loads(done.stdout.strip().splitlines()[-1])


def block_env() -> dict[str, str]:
    """The environment a block runs in: the repository first on the path, one thread, no display.

    Returns
    -------
    dict[str, str]
    """
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", MPLBACKEND="Agg", PYTHONHASHSEED="0")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def run_block(block: Block, timeout: float = 300.0) -> tuple[str | None, str]:
    """Run a block as written: its own process, an empty temporary working folder.

    Parameters
    ----------
    block : Block
        A Python block.
    timeout : float
        Seconds before the process is killed.

    Returns
    -------
    tuple[str | None, str]
        None when it exits with status 0, else what went wrong with the end of its output (line
        numbers in the traceback are the page's); and what it printed on stdout.
    """
    with tempfile.TemporaryDirectory(prefix="docs-block-") as tmp:
        script, work = Path(tmp) / "block.py", Path(tmp) / "work"
        work.mkdir()
        script.write_text(block.padded, encoding="utf-8")
        try:
            done = subprocess.run([sys.executable, str(script)], cwd=work, env=block_env(), capture_output=True,
                                  text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return f"{block.label}: still running after {timeout:.0f} s (mark it <!-- slow: ... -->?)", ""
    if done.returncode == 0:
        return None, done.stdout
    tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-25:])
    return f"{block.label}: exit status {done.returncode} (traceback lines are the page's)\n{tail}", done.stdout


def run_blocks(blocks: list[Block], jobs: int = 2, timeout: float = 300.0) -> dict[str, tuple[str | None, str]]:
    """:func:`run_block` over ``blocks``, ``jobs`` at a time.

    Parameters
    ----------
    blocks : list[Block]
        Python blocks.
    jobs : int
        Processes at once.
    timeout : float
        Seconds per block.

    Returns
    -------
    dict[str, tuple[str | None, str]]
        Block label -> its failure (None: it ran) and what it printed.
    """
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        return dict(zip([b.label for b in blocks], pool.map(lambda b: run_block(b, timeout), blocks)))


def same_output(shown: str, printed: str) -> bool:
    """Whether a page's ``output`` block shows what a block printed.

    Parameters
    ----------
    shown : str
        The output block's text.
    printed : str
        The block's stdout.

    Returns
    -------
    bool
        True when the texts agree with every number replaced by a placeholder and whitespace
        removed, and the numbers agree to :data:`TOLERANCE` (relative or absolute).
    """
    def split(text: str) -> tuple[str, list[float]]:
        return re.sub(r"\s+", "", NUMBER.sub("#", text)), [float(n) for n in NUMBER.findall(text)]

    (form, numbers), (printed_form, printed_numbers) = split(shown), split(printed)
    return form == printed_form and all(math.isclose(a, b, rel_tol=TOLERANCE, abs_tol=TOLERANCE)
                                        for a, b in zip(numbers, printed_numbers))


def output_problems(blocks: list[Block], results: dict[str, tuple[str | None, str]], write: bool = False
                    ) -> list[str]:
    """Compare every ``output`` block with what the block above it printed (when it ran).

    Parameters
    ----------
    blocks : list[Block]
        The blocks of one or more pages, in page order.
    results : dict
        :func:`run_blocks`'s result.
    write : bool
        Rewrite a differing output block with what was printed instead of reporting it.

    Returns
    -------
    list[str]
        One line per output block that differs (none when ``write``).
    """
    found, rewrites = [], []
    for previous, b in zip(blocks, blocks[1:]):
        ran = results.get(previous.label)
        if b.kind != "output" or ran is None or ran[0] is not None or same_output(b.code, ran[1]):
            continue
        if write:
            rewrites.append((b, ran[1]))
        else:
            found.append(f"{b.label}: the page shows another output than {previous.label} prints now:\n{ran[1]}"
                         "(rerun with --write-outputs, and check the text around it)")
    for b, printed in sorted(rewrites, key=lambda r: -r[0].line):  # from the bottom: line numbers stay valid
        path = ROOT / b.page
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        lines[b.line:b.line + len(b.code.splitlines())] = [printed if printed.endswith("\n") else printed + "\n"]
        path.write_text("".join(lines), encoding="utf-8")
        print(f"rewrote the output at {b.label}; check the text around it")
    return found


def main(argv: list[str] | None = None) -> int:
    """Check every block, run the ones that run as written (with ``--all`` the slow ones too).

    Parameters
    ----------
    argv : list[str], optional
        Arguments (default ``sys.argv[1:]``).

    Returns
    -------
    int
        0 when nothing failed, else 1.
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pages", nargs="*", type=Path, help="pages to check (default: README.md and docs/)")
    parser.add_argument("--all", action="store_true", help="also run the blocks marked slow")
    parser.add_argument("--write-outputs", action="store_true",
                        help="rewrite the <!-- output --> blocks that differ from what their block printed")
    parser.add_argument("--jobs", type=int, default=2, help="blocks run at once")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per block")
    args = parser.parse_args(argv)
    blocks = all_blocks([p.resolve() for p in args.pages] or None)
    python = [b for b in blocks if b.lang == "python" and b.kind != "signatures"]
    runnable = [b for b in python if b.kind == "run" or (args.all and b.kind == "slow")]
    problems = static_problems(blocks)
    problems += import_problems([b for b in python if b not in runnable and not syntax_error(b)])
    start = time.perf_counter()
    print(f"running {len(runnable)} blocks, {args.jobs} at a time", flush=True)
    results = run_blocks(runnable, args.jobs, args.timeout)
    problems += [failure for failure, _ in results.values() if failure]
    problems += output_problems(blocks, results, write=args.write_outputs)
    counts = {k: sum(b.kind == k for b in python) for k in ("run", "fragment", "slow")}
    print(f"{len(python)} Python blocks {counts}; ran {len(runnable)} in {time.perf_counter() - start:.0f} s; "
          f"{len(problems)} problems", flush=True)
    print("\n".join(problems))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
