"""Every public callable of the analysis core has the numpy sections ruff cannot require.

ruff (``tests/test_ruff.py``, rules in ``pyproject.toml``) checks every package from the source:
that each public module, class, function, method and property has a docstring (pydocstyle D1),
that it is laid out in the numpy convention (D2-D4), and that a ``Parameters`` section names every
parameter of its function (D417). What it cannot check, because numpy style lets a docstring
omit a section, is that the sections exist; this test does, for every module of ``landscape``
(found by walking its subpackages and imported with ``importlib``) and every public function,
class and public method *defined there*:

* a callable with parameters other than ``self``/``cls`` has a ``Parameters`` section;
* it has a ``Returns`` (or ``Yields``) section unless its return annotation is ``None``;
* a class's constructor parameters are named in the class's or ``__init__``'s ``Parameters``
  (ruff reads only ``__init__``'s own docstring);
* a dataclass names the fields it declares in an ``Attributes`` section.

A callable without a docstring is ruff's to report and is skipped here.
"""
from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import re
from types import ModuleType
from typing import Any, Protocol

import pytest

import landscape

SECTION = re.compile(r"^(?P<title>[A-Z][A-Za-z ]+)\n-{3,}$", re.MULTILINE)


def _modules() -> list[str]:
    """Names of ``landscape`` and every module below it."""
    names = [landscape.__name__]
    for info in pkgutil.walk_packages(landscape.__path__, prefix=landscape.__name__ + "."):
        names.append(info.name)
    return sorted(names)


def _sections(doc: str) -> dict[str, str]:
    """The numpy-style sections of a cleaned docstring: title -> body."""
    matches = list(SECTION.finditer(doc))
    return {m["title"]: doc[m.end():(matches[i + 1].start() if i + 1 < len(matches) else len(doc))]
            for i, m in enumerate(matches)}


def _names(body: str) -> set[str]:
    """Names documented in a Parameters/Attributes section (entries start at column 0)."""
    names: set[str] = set()
    for line in body.splitlines():
        if line and not line[0].isspace():
            for name in line.split(" : ")[0].split(","):
                names.add(name.strip().lstrip("*"))
    return names


def _function_problems(qualname: str, func: Any) -> list[str]:
    """The sections missing from one function's docstring."""
    doc = inspect.getdoc(func)
    if not doc:
        return []
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):  # some builtins have none
        return []
    sections = _sections(doc)
    problems = []
    if any(p not in ("self", "cls") for p in signature.parameters) and "Parameters" not in sections:
        problems.append(f"{qualname}: no Parameters section")
    returns = signature.return_annotation
    if returns not in (None, "None") and not {"Returns", "Yields"} & sections.keys():
        problems.append(f"{qualname}: no Returns section")
    return problems


def _class_problems(qualname: str, cls: type) -> list[str]:
    """What is missing from a class's docstring and the sections of its public methods'."""
    doc = inspect.getdoc(cls)
    if not doc or cls.__doc__ is None or cls.__doc__.startswith(cls.__name__ + "("):
        return []  # (dataclasses write their signature as __doc__)
    problems = []
    init = vars(cls).get("__init__")
    # (a typing.Protocol gets typing's generic constructor, which it does not document)
    if inspect.isfunction(init) and not dataclasses.is_dataclass(cls) and init.__module__ != "typing":
        params = [p for p in inspect.signature(init).parameters if p != "self"]
        documented = _names(_sections(doc).get("Parameters", "")) | _names(
            _sections(inspect.getdoc(init) or "").get("Parameters", ""))
        missing = [p for p in params if p not in documented]
        if missing:
            problems.append(f"{qualname}: constructor parameters not documented: {missing}")
    if dataclasses.is_dataclass(cls):
        own = inspect.get_annotations(cls)  # fields declared here, not inherited (e.g. Result.spec)
        fields = [f.name for f in dataclasses.fields(cls) if f.name in own]
        documented = _names(_sections(doc).get("Attributes", ""))
        missing = [f for f in fields if f not in documented]
        if missing:
            problems.append(f"{qualname}: attributes not documented: {missing}")
    for name, member in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(member, (staticmethod, classmethod)):
            problems += _function_problems(f"{qualname}.{name}", member.__func__)
        elif inspect.isfunction(member):
            problems += _function_problems(f"{qualname}.{name}", member)
    return problems


def _problems(module: ModuleType) -> list[str]:
    """Every documentation problem of the public names defined in ``module``."""
    problems = []
    for name, obj in vars(module).items():
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isclass(obj):
            problems += _class_problems(name, obj)
        elif inspect.isfunction(obj):
            problems += _function_problems(name, obj)
    return problems


@pytest.mark.parametrize("name", _modules())
def test_public_api_has_its_sections(name: str) -> None:
    problems = _problems(importlib.import_module(name))
    assert problems == [], f"{name}:\n" + "\n".join(problems)


def test_checker_catches_missing_sections() -> None:
    def documented(a: int, b: int, *, c: str = "") -> int:
        """Sum.

        Parameters
        ----------
        a, b : int
            Terms.
        c : str
            Unused.

        Returns
        -------
        int
        """
        return a + b

    def no_sections(a: int) -> int:
        """Identity."""
        return a

    def undocumented(a: int) -> int:
        return a

    @dataclasses.dataclass
    class Point:
        """A point.

        Attributes
        ----------
        x : float
            Abscissa.
        """

        x: float
        y: float

    class Shape:
        """A shape."""

        def __init__(self, sides: int) -> None:
            self.sides = sides

        def area(self, scale: float) -> float:
            """Area."""
            return scale

    assert _function_problems("documented", documented) == []
    assert _function_problems("no_sections", no_sections) == [
        "no_sections: no Parameters section", "no_sections: no Returns section"]
    assert _function_problems("undocumented", undocumented) == []  # ruff's D103
    assert _class_problems("Shape", Shape) == [
        "Shape: constructor parameters not documented: ['sides']", "Shape.area: no Parameters section",
        "Shape.area: no Returns section"]
    assert _class_problems("Point", Point) == ["Point: attributes not documented: ['y']"]

    class Sized(Protocol):
        """Has a size."""

        size: int

    assert inspect.isfunction(vars(Sized)["__init__"])  # typing's constructor, not checked
    assert _class_problems("Sized", Sized) == []
