"""One option mechanism: every flag comes from an option set, and the option sets agree with the API.

* no module of ``landscape_cli`` or ``fl`` writes a flag by hand (``add_argument`` appears only in
  the generator, :mod:`landscape.infra.flags`), and no command offers a flag twice;
* each option set that names the functions it ``configures`` has their defaults;
* the generator turns each kind of field into the flag it promises (bounds, choices, booleans
  as ``--x/--no-x``, lists, pairs, repeated flags, renamed flags, required flags, parsers), and
  a bad value is one line naming the flag.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

from landscape import ConfigError
from landscape.infra.flags import add_option_flags, flag_dest, option_values
from landscape.infra.options import Options, option, seed_option
from landscape_cli.main import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
OPTION_MODULES = ("landscape.evaluation.options", "landscape.geometry.options", "landscape.curvature.options",
                  "landscape.claims.options", "landscape.connectivity.options", "landscape.alignment.options",
                  "landscape.decomposition.options", "landscape.merging.options")


def add_argument_calls(folder: Path) -> list[str]:
    """``file:line`` of every ``.add_argument(...)`` call in the Python files under ``folder``."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "add_argument"):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_no_flag_is_written_by_hand():
    assert add_argument_calls(ROOT / "landscape_cli") == []
    assert add_argument_calls(ROOT / "fl") == []
    assert len(add_argument_calls(ROOT / "landscape" / "infra")) == 1  # the generator's own call


def parsers(parser: argparse.ArgumentParser, name: str = "landscape") -> dict[str, argparse.ArgumentParser]:
    """Every parser below ``parser`` (subcommands of subcommands included), by command line."""
    found = {name: parser}
    for action in parser._actions:  # argparse has no public accessor for its subcommands
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                found.update(parsers(sub, f"{name} {sub_name}"))
    return found


def test_every_command_has_each_flag_and_destination_once():
    from fl.cli import build_parser as fl_parser

    commands = {**parsers(build_parser()), **parsers(fl_parser(), "fl-run")}
    assert {"landscape check shared-basin", "landscape train", "fl-run"} <= set(commands)
    for name, parser in commands.items():
        strings = [s for a in parser._actions for s in a.option_strings]
        dests = [a.dest for a in parser._actions if a.option_strings and a.dest != "help"]
        assert len(strings) == len(set(strings)), name
        assert len(dests) == len(set(dests)), name
    for name in ("fl-run", "landscape train"):
        listing = [a for a in commands[name]._actions if "--list-algorithms" in a.option_strings]
        assert len(listing) == 1 and listing[0].default is False


def option_sets() -> list[type[Options]]:
    """The option sets of the analysis core."""
    return [cls for module in OPTION_MODULES for cls in vars(importlib.import_module(module)).values()
            if isinstance(cls, type) and issubclass(cls, Options) and cls is not Options
            and cls.__module__ == module]


def default_mismatches(cls: type[Options]) -> list[str]:
    """What disagrees between ``cls`` and the functions it configures.

    Fields whose default differs from such a function's keyword default, and fields no such function takes.
    """
    import landscape

    problems = []
    taken = set()
    for dotted in cls.configures:
        path, name = dotted.rsplit(".", 1)
        function = getattr(importlib.import_module(path) if path != "landscape" else landscape, name)
        params = inspect.signature(function).parameters
        for field, default in cls.defaults().items():
            if field in params:
                taken.add(field)
                if params[field].default != default:
                    problems.append(f"{cls.__name__}.{field}: {default!r} but {dotted} has {params[field].default!r}")
    problems += [f"{cls.__name__}.{f}: no function of {cls.configures} takes it"
                 for f in cls.fields() if f not in taken]
    return problems


def test_option_sets_have_the_defaults_of_the_functions_they_configure():
    classes = option_sets()
    assert {"PlaneOptions", "EigenOptions", "CurveOptions", "SharedBasinOptions"} <= {c.__name__ for c in classes}
    for cls in classes:
        if cls.__name__ != "EvaluatorOptions":  # the Evaluator takes its fields as **options_by_name
            assert cls.configures, cls.__name__
            assert default_mismatches(cls) == [], cls.__name__


def test_a_drifted_default_is_caught():
    @dataclass(frozen=True)
    class Drifted(Options):
        configures = ("landscape.plane",)
        resolution: int = option(31, help="grid points per axis")
        spacing: float = option(1.0, help="not a keyword of landscape.plane")

    assert default_mismatches(Drifted) == ["Drifted.resolution: 31 but landscape.plane has 21",
                                           "Drifted.spacing: no function of ('landscape.plane',) takes it"]


# ------------------------------------------------------------------ what the generator makes of each kind of field
NAMES = ["alpha", "beta"]


def _even(text: str) -> int:
    value = int(text)
    if value % 2:
        raise ConfigError(f"count must be even, got {value}")
    return value


@dataclass(frozen=True)
class Sample(Options):
    """Every kind of field the generator handles."""

    count: int = option(3, ge=1, le=10, source="the paper", help="a bounded count")
    scale: float | None = option(None, gt=0, help="an optional positive number")
    mode: Literal["fast", "exact"] = option("fast", help="a literal choice")
    name: str = option("alpha", choices=lambda: list(NAMES), help="a live choice")
    strict: bool = option(True, help="a switch on by default")
    no_figures: bool = option(False, help="a negative switch")
    weights: list[float] | None = option(None, ge=0, help="non-negative numbers")
    pair: tuple[float, float] = option((0.0, 1.0), metavar=("LO", "HI"), help="two numbers")
    tag: list[str] | None = option(None, repeat=True, help="repeatable")
    batch_size: int = option(8, ge=1, flag="--train-batch-size", help="renamed")
    even: int = option(2, parse=_even, help="parsed and checked")
    target: str | None = option(None, required=True, help="must be given")
    seed: int = seed_option("a seed")

    def check(self) -> None:
        if self.scale is not None and self.scale > 100:
            raise ConfigError("scale must be at most 100 (a check of the option set)")


class OneLine(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise ValueError(message)


def sample_parser() -> argparse.ArgumentParser:
    parser = OneLine(prog="sample")
    add_option_flags(parser, Sample)
    return parser


def test_each_kind_of_field_becomes_its_flag():
    args = sample_parser().parse_args(["--target", "t", "--count", "10", "--scale", "2.5", "--mode", "exact",
                                       "--name", "beta", "--no-strict", "--no-figures", "--weights", "0", "1.5",
                                       "--pair", "-1", "2", "--tag", "a", "--tag", "b", "--train-batch-size", "4",
                                       "--even", "6", "--seed", "7"])
    assert flag_dest(Sample.fields()["batch_size"]) == "train_batch_size" and args.train_batch_size == 4
    values = option_values(Sample, args)
    assert values == {"count": 10, "scale": 2.5, "mode": "exact", "name": "beta", "strict": False, "no_figures": True,
                      "weights": [0.0, 1.5], "pair": [-1.0, 2.0], "tag": ["a", "b"], "batch_size": 4, "even": 6,
                      "target": "t", "seed": 7}
    assert Sample.from_mapping(values).pair == (-1.0, 2.0)
    defaults = option_values(Sample, sample_parser().parse_args(["--target", "t"]))
    assert defaults == {**Sample.defaults(), "target": "t"}
    NAMES.append("gamma")  # live choices: a name registered after the class was declared counts
    try:
        assert sample_parser().parse_args(["--target", "t", "--name", "gamma"]).name == "gamma"
    finally:
        NAMES.remove("gamma")


@pytest.mark.parametrize("argv, message", [
    (["--count", "0"], "argument --count: must be an integer >= 1 and <= 10, got '0'"),
    (["--count", "2.5"], "argument --count: must be an integer >= 1 and <= 10, got '2.5'"),
    (["--scale", "nan"], "argument --scale: must be a finite number > 0, got 'nan'"),
    (["--scale", "500"], "argument --scale: scale must be at most 100 (a check of the option set)"),
    (["--mode", "slow"], "argument --mode: invalid choice: 'slow'"),
    (["--name", "gamma"], "argument --name: invalid choice: 'gamma'"),
    (["--weights", "1", "-1"], "argument --weights: must be a finite number >= 0, got '-1'"),
    (["--pair", "1"], "argument --pair: expected 2 arguments"),
    (["--even", "3"], "argument --even: count must be even, got 3"),
    (["--even", "three"], "argument --even: invalid value 'three'"),
    (["--seed", str(2**63)], "argument --seed: must be an integer >= 0 and <= 9223372036854775807"),
    (["--batch-size", "4"], "unrecognized arguments: --batch-size 4"),
])
def test_a_bad_value_names_its_flag(argv, message):
    with pytest.raises(ValueError) as refused:
        sample_parser().parse_args(["--target", "t", *argv])
    assert str(refused.value).startswith(message), str(refused.value)


def test_a_required_flag_must_be_given():
    with pytest.raises(ValueError, match="the following arguments are required: --target"):
        sample_parser().parse_args([])


def test_help_shows_range_source_and_default():
    text = " ".join(sample_parser().format_help().split())
    assert "a bounded count (default 3; >= 1 and <= 10; the paper)" in text
    assert "--strict, --no-strict a switch on by default --no-figures" in text  # the formatter shows bools' defaults
    assert "--no-figures a negative switch" in text and "--no-no-figures" not in text
    assert "--pair LO HI" in text and "[--tag TAG]" in text


def test_suppressed_flags_stay_out_of_the_namespace_and_write_the_default_into_the_help():
    parser = OneLine(prog="sample")
    add_option_flags(parser, Sample, skip=("target",), suppress=True, validate=False, notes={"count": "for a, b"})
    assert vars(parser.parse_args(["--count", "4"])) == {"count": 4}
    text = " ".join(parser.format_help().split())
    assert "a bounded count (default 3; >= 1 and <= 10; the paper; for a, b)" in text
    assert "--strict, --no-strict a switch on by default (default True)" in text


def test_booleans_take_both_forms_on_the_command_line():
    parser = build_parser()
    base = ["align", "--module", "mlp", "--checkpoints", "a.pt", "b.pt", "--data", "digits", "--save", "x.pt"]
    assert parser.parse_args(base).strict is True
    assert parser.parse_args([*base, "--no-strict"]).strict is False
    assert parser.parse_args([*base, "--json"]).json is True
    assert parser.parse_args([*base, "--json", "--no-json"]).json is False
    assert parser.parse_args([*base, "--no-cache"]).no_cache is True


def test_check_shared_basin_reads_its_global_checkpoint(tmp_path, capsys):
    args = build_parser().parse_args(["check", "shared-basin", "--global", "g.pt"])
    assert vars(args)["global"] == "g.pt"
    code = main(["check", "shared-basin", "--module", "mlp", "--checkpoints", "a.pt", "b.pt", "--data", "digits",
                 "--resolution", "1"])
    err = capsys.readouterr()[1]
    assert code == 2 and err.count("\n") == 1 and "argument --resolution: must be an integer >= 2" in err, err


def test_options_from_python_refuse_what_the_flags_refuse():
    from landscape.curvature.options import EigenOptions, OperatorOptions
    from landscape.geometry.options import GroupOptions, PlaneOptions

    with pytest.raises(ConfigError, match=r"method must be one of 'lanczos', 'power'.*got 'lanczo' "
                                          r"\(did you mean 'lanczos'\?\)"):
        EigenOptions.from_mapping({"method": "lanczo"})
    with pytest.raises(ConfigError, match="span must be a positive number or 'auto', got 'autox'"):
        PlaneOptions.from_mapping({"span": "autox"})
    with pytest.raises(ConfigError, match="weights must not all be zero"):
        GroupOptions.from_mapping({"weights": [0, 0]})
    with pytest.raises(ConfigError, match=r"hvp must be one of .*'retained', got 'fast'"):
        OperatorOptions.from_mapping({"hvp": "fast"})
    assert PlaneOptions.from_mapping({"span": "auto"}).span == "auto"
