"""Whether permutation alignment is valid for an architecture: the result of a permutation check.

Computed by :func:`landscape.alignment.check.check_alignment`: the model's permutation groups
(Git Re-Basin, Ainsworth et al. 2023, Appendix A), the largest change of its outputs under a
random permutation of every group (none, to float rounding, if the groups are right: their
Eq. 1), and the units that no permutation moves, with the reasons the trace gave.

Exported as JSON (:meth:`AlignmentCheck.to_json`, written atomically by
:func:`landscape.infra.files.write_text`) and read back by :meth:`AlignmentCheck.from_json`.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Mapping

from ..infra.files import write_text
from .base import Result, jsonable, register
from .base import from_json as decoded

#: Version of the JSON export (``"format"`` key).
FORMAT = "landscape alignment check 1"


@register
@dataclass(frozen=True, eq=False)
class AlignmentCheck(Result):
    """A traced permutation spec, checked by permuting every group of a model at random.

    Attributes
    ----------
    model : str
        Class name of the model.
    input_shape : tuple[int, ...]
        Shape of the inputs it was traced and checked on (batch axis first).
    seed : int
        Seed of the random inputs (when none were given) and of the permutations.
    max_abs_diff : float
        Largest absolute difference between the outputs of the model and of its permuted copy
        (NaN when nothing could be compared: ``error``).
    tolerance : float
        Largest difference that float rounding explains.
    tolerance_reason : str
        How ``tolerance`` was set.
    output_scale : float
        Largest absolute output of the model on the inputs.
    groups : tuple[dict, ...]
        The permutation groups: ``size``, ``block`` (GroupNorm blocks; 0 free) and ``members``, each
        ``name`` (state-dict name), ``axis`` and the view ``outer``, ``units``, ``inner`` of the axis
        whose units ``start:start + size`` the group permutes.
    unpermutable : tuple[dict, ...]
        Tensor axes holding units that could be reordered but no group permutes: ``name``,
        ``axis``, ``length``, ``permuted`` (positions some group moves) and ``why`` (the trace's
        reasons: an operation without a permutation rule, a constant such as a position-encoding
        buffer, a tie to the model's input, ...).
    fixed : tuple[dict, ...]
        Tensor axes (or parts) that hold no permutable units, as ``unpermutable``: input features,
        output units, token ids, kernel positions, axes the forward pass never reaches.
    pinned : tuple[str, ...]
        Operations the trace could not follow (``strict=True`` alignment refuses them).
    tied : Mapping[str, str]
        Alias -> the state-dict name it shares its tensor with (permuted with it).
    differences : tuple[dict, ...]
        For a spec given to the check: tensor axes where it differs from the traced one (``name``,
        ``axis``, ``why``), such as running statistics left out of their group.
    shapes : Mapping[str, tuple[int, ...]]
        Every state-dict entry and its shape.
    error : str
        Why the model could not be traced ("" when it was); without a given spec nothing is then
        compared.
    """

    model: str
    input_shape: tuple[int, ...]
    seed: int
    max_abs_diff: float
    tolerance: float
    tolerance_reason: str
    output_scale: float
    groups: tuple[dict, ...]
    unpermutable: tuple[dict, ...] = ()
    fixed: tuple[dict, ...] = ()
    pinned: tuple[str, ...] = ()
    tied: Mapping[str, str] = field(default_factory=dict)
    differences: tuple[dict, ...] = ()
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    error: str = ""

    summary_fields: ClassVar[tuple[str, ...]] = ("passed", "max_abs_diff", "tolerance", "units",
                                                 "unpermutable_axes")

    @property
    def passed(self) -> bool:
        """Whether the permuted copy's outputs are within ``tolerance`` (False when nothing was compared)."""
        return math.isfinite(self.max_abs_diff) and self.max_abs_diff <= self.tolerance

    @property
    def units(self) -> int:
        """Hidden units in all groups."""
        return sum(int(g["size"]) for g in self.groups)

    @property
    def unpermutable_axes(self) -> int:
        """Number of tensor axes with units that no group permutes."""
        return len(self.unpermutable)

    def numbers(self) -> dict[str, Any]:
        """The check in a few numbers and lines (for a table).

        Returns
        -------
        dict
            ``passed``, ``max_abs_diff``, ``tolerance`` and its reason, the counts of groups, units
            and unpermutable axes, and one line per unpermutable axis, pinned operation, spec
            difference and tie.
        """
        lines = [f"{u['name']} axis {u['axis']}: {u['why']}" for u in self.unpermutable]
        return {"passed": self.passed, "max_abs_diff": self.max_abs_diff, "tolerance": self.tolerance,
                "tolerance_reason": self.tolerance_reason, "groups": len(self.groups), "units": self.units,
                "unpermutable": lines, "pinned": list(self.pinned),
                "differences": [f"{d['name']} axis {d['axis']}: {d['why']}" for d in self.differences],
                "tied": [f"{alias} = {name}" for alias, name in self.tied.items()],
                **({"error": self.error} if self.error else {})}

    def to_json(self, path: str | os.PathLike | None = None) -> str:
        """The check as JSON text, and written to ``path`` if given.

        Parameters
        ----------
        path : str or os.PathLike, optional
            File to write (atomically, never through a link: :func:`landscape.infra.files.write_text`).

        Returns
        -------
        str
            A JSON object: ``format``, ``passed`` and every field.
        """
        record = {"format": FORMAT, "passed": self.passed,
                  **{f.name: jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}}
        text = json.dumps(record, indent=2) + "\n"
        if path is not None:
            write_text(Path(path), text)
        return text

    @classmethod
    def from_json(cls, text: str) -> "AlignmentCheck":
        """The check written by :meth:`to_json`.

        Parameters
        ----------
        text : str
            Its JSON text.

        Returns
        -------
        AlignmentCheck
            Equal to the check that was written.
        """
        record = json.loads(text)
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: decoded(v) for k, v in record.items() if k in names}
        values["input_shape"] = tuple(values["input_shape"])
        values["shapes"] = {k: tuple(v) for k, v in values.get("shapes", {}).items()}
        for name in ("groups", "unpermutable", "fixed", "pinned", "differences"):
            values[name] = tuple(values.get(name, ()))
        return cls(**values)
