"""``landscape.check_alignment``: whether permutation alignment is valid for an architecture.

The permutation groups are traced (:func:`~.graph.discover`, with ``strict=False`` so that every
operation the trace cannot follow is listed rather than raised), every group is permuted at random
(:func:`moving_permutations`: every unit moves) and the outputs of the model and of its permuted copy are
compared: a correct spec changes them only by float rounding (Git Re-Basin, Ainsworth et al.
2023, Eq. 1; Entezari et al. 2022). The units that no group permutes are listed with the reasons
the trace recorded (:class:`~.spec.FixedUnits`); a spec given by the user is also compared with the
traced one tensor axis by tensor axis.
"""
from __future__ import annotations

import copy
from typing import Any, Sequence

import torch
from torch import nn

from ..infra.errors import ConfigError
from ..results.alignment import AlignmentCheck
from .align import example_input as guessed_input
from .graph import MODEL_OUTPUT, PermutationError, PermutationSpec, discover, output_tensors
from .permute import apply_permutation
from .spec import FixedUnits

#: The tolerance is this many float epsilons of the output dtype times the largest absolute output:
#: a permutation reorders the terms of the sums that meet the permuted units, so each sum rounds
#: differently, by a few epsilons of its magnitude per layer. Measured at initialisation on every
#: zoo model, torchvision's ResNet-18 and tiny ViT, GPT-2 and LLaMA models: at most 7.2 epsilons
#: of the output scale, so a correct spec passes with a wide margin, while a tensor left out of its
#: group changes the outputs by a fraction of their scale.
ROUNDING_EPSILONS = 256


def check_alignment(model: nn.Module, *, example_input: torch.Tensor | None = None, seed: int = 0,
                    spec: PermutationSpec | None = None, input_shape: Sequence[int] | None = None,
                    samples: int = 8, tolerance: float | None = None) -> AlignmentCheck:
    """Check that permuting the traced groups of ``model`` leaves its outputs unchanged.

    Parameters
    ----------
    model : torch.nn.Module
        The model (not modified; evaluated in eval mode).
    example_input : torch.Tensor, optional
        An input batch to trace and compare on; default ``samples`` random inputs (standard
        normal, or token ids below the first Embedding's size) of ``input_shape`` or of the shape
        :func:`~.align.example_input` guesses.
    seed : int
        Seed of the random inputs and of the permutations (their own generators; random cycles
        through each group's units, :func:`moving_permutations`).
    spec : PermutationSpec, optional
        A spec to check instead of the traced one (the model is still traced, when it can be, to
        list the units it fixes and where the given spec differs).
    input_shape : sequence of int, optional
        Input shape without the batch axis, when ``example_input`` is not given.
    samples : int
        Number of random inputs, when ``example_input`` is not given.
    tolerance : float, optional
        Largest accepted output difference; default ``ROUNDING_EPSILONS`` epsilons of the
        output dtype times the largest absolute output.

    Returns
    -------
    AlignmentCheck
        ``passed``, the difference and tolerance, the groups, the unpermutable units and why.

    Raises
    ------
    ConfigError
        If ``spec`` names a tensor the model lacks, or no input shape can be guessed.
    """
    base = copy.deepcopy(model).eval()
    x = example_input if example_input is not None else random_input(base, input_shape, samples, seed)
    device = next((t.device for t in base.state_dict().values()), torch.device("cpu"))
    x = x.to(device)
    error, traced = "", None
    try:
        traced = discover(base, x, strict=False)
    except PermutationError as exc:
        error = str(exc)
    shapes = {name: tuple(t.shape) for name, t in base.state_dict().items()}
    fields = {"model": type(model).__name__, "input_shape": tuple(x.shape), "seed": seed, "shapes": shapes,
              "tied": tied_names(base), "error": error}
    used = spec if spec is not None else traced
    if used is None:
        return AlignmentCheck(max_abs_diff=float("nan"), tolerance=float("nan"), output_scale=float("nan"),
                              tolerance_reason="nothing compared: the model could not be traced", groups=(),
                              spec={"function": "check_alignment", "seed": seed}, **fields)
    permuted = apply_permutation(base, used, moving_permutations(used, seed))
    with torch.no_grad():
        reference, outputs = output_tensors(base(x)), output_tensors(permuted(x))
    diff, scale, eps = compare(reference, outputs)
    reason = (f"{ROUNDING_EPSILONS} x epsilon {eps:.3g} of the output dtype x output scale {scale:.3g} (the "
              "largest |output|): reordered sums round differently")
    if tolerance is not None:
        reason = "given by the caller"
    listed = listed_axes(traced, used, shapes) if traced is not None else {"unpermutable": (), "fixed": ()}
    return AlignmentCheck(
        max_abs_diff=diff, tolerance=ROUNDING_EPSILONS * eps * scale if tolerance is None else float(tolerance),
        tolerance_reason=reason, output_scale=scale, groups=tuple(group_record(g) for g in used.groups),
        pinned=traced.pinned if traced is not None else (), **listed,
        differences=spec_differences(traced, spec, shapes) if spec is not None and traced is not None else (),
        spec={"function": "check_alignment", "seed": seed, "spec_given": spec is not None}, **fields)


def moving_permutations(spec: PermutationSpec, seed: int = 0) -> list[torch.Tensor]:
    """A random cyclic permutation of every group (of every GroupNorm block): each unit moves.

    A uniform permutation leaves some units in place (a group of two with probability one half),
    and a tensor left out of the group would go unnoticed there; a cycle through the units in a
    random order moves every one of them.

    Parameters
    ----------
    spec : PermutationSpec
        The groups.
    seed : int
        Seed of the orders' own ``torch.Generator``.

    Returns
    -------
    list[torch.Tensor]
        One permutation per group, without fixed points in groups (blocks) of two or more units.
    """
    gen = torch.Generator().manual_seed(seed)
    out = []
    for group in spec.groups:
        perm = torch.arange(group.size)
        block = group.block or group.size
        for start in range(0, group.size, block):
            order = torch.randperm(block, generator=gen) + start
            perm[order] = order.roll(-1)  # unit order[i] of the permuted model is unit order[i + 1]
        out.append(perm)
    return out


def random_input(model: nn.Module, input_shape: Sequence[int] | None, samples: int, seed: int) -> torch.Tensor:
    """``samples`` random inputs of the model's input shape.

    Parameters
    ----------
    model : torch.nn.Module
        The model (its first layer decides a guessed shape and whether inputs are token ids).
    input_shape : sequence of int, optional
        Input shape without the batch axis (guessed by :func:`~.align.example_input` if None).
    samples : int
        Batch size.
    seed : int
        Seed of the inputs' own generator.

    Returns
    -------
    torch.Tensor
        Standard normal inputs, or token ids uniform below the first Embedding's ``num_embeddings``.

    Raises
    ------
    ConfigError
        If no shape is given and none can be guessed.
    """
    try:
        shaped = guessed_input(model, None, input_shape)
    except ConfigError:
        raise ConfigError(f"cannot guess the input shape of {type(model).__name__}: pass example_input= "
                          "or input_shape=") from None
    gen = torch.Generator().manual_seed(seed)
    shape = (samples, *shaped.shape[1:])
    if shaped.dtype.is_floating_point:
        return torch.randn(shape, generator=gen).to(shaped.dtype)
    embedding = next((m for m in model.modules() if isinstance(m, nn.Embedding)), None)
    return torch.randint(0, embedding.num_embeddings if embedding is not None else 2, shape, generator=gen)


def compare(reference: list[torch.Tensor], outputs: list[torch.Tensor]) -> tuple[float, float, float]:
    """Largest absolute difference of two models' outputs, the output scale and the dtype's epsilon.

    Parameters
    ----------
    reference, outputs : list[torch.Tensor]
        The tensors of each model's output, in order.

    Returns
    -------
    tuple[float, float, float]
        ``max |reference - outputs|`` (infinite if the shapes differ), ``max |reference|`` and the
        epsilon of the first floating output's dtype (0 if none: integer outputs must be equal).
    """
    if [t.shape for t in reference] != [t.shape for t in outputs]:
        return float("inf"), 0.0, 0.0
    diff = max((float((a.double() - b.double()).abs().max()) for a, b in zip(reference, outputs) if a.numel()),
               default=0.0)
    scale = max((float(a.double().abs().max()) for a in reference if a.numel()), default=0.0)
    eps = next((torch.finfo(a.dtype).eps for a in reference if a.dtype.is_floating_point), 0.0)
    return diff, scale, eps


def tied_names(model: nn.Module) -> dict[str, str]:
    """Every alias of a tied tensor in the state_dict, with the first name holding the tensor.

    Parameters
    ----------
    model : torch.nn.Module
        The model.

    Returns
    -------
    dict[str, str]
        Alias -> first name (a language model's output layer -> its token embedding).
    """
    first: dict[int, str] = {}
    out = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        owner = first.setdefault(id(tensor), name)
        if owner != name:
            out[name] = owner
    return out


def group_record(group: Any) -> dict[str, Any]:
    """A group as JSON-ready data: its size, GroupNorm block and members.

    Parameters
    ----------
    group : Group
        A permutation group.

    Returns
    -------
    dict
        ``size``, ``block`` and ``members`` (``name``, ``axis``, ``outer``, ``units``, ``start``,
        ``size``, ``inner`` each).
    """
    members = [{"name": m.name, "axis": m.axis, "outer": m.outer, "units": m.units, "start": m.start,
                "size": m.size, "inner": m.inner} for m in group.members]
    return {"size": group.size, "block": group.block, "members": members}


def coverage(spec: PermutationSpec, shapes: dict[str, tuple[int, ...]]) -> dict[tuple[str, int], torch.Tensor]:
    """For each tensor axis a group reaches, which of its positions some group permutes.

    Parameters
    ----------
    spec : PermutationSpec
        The groups.
    shapes : dict[str, tuple[int, ...]]
        State-dict name -> shape.

    Returns
    -------
    dict[tuple[str, int], torch.Tensor]
        (name, axis) -> boolean mask over the axis.
    """
    masks: dict[tuple[str, int], torch.Tensor] = {}
    for group in spec.groups:
        for m in group.members:
            length = shapes[m.name][m.axis]
            mask = masks.setdefault((m.name, m.axis), torch.zeros(length, dtype=torch.bool))
            mask.view(m.outer, m.units, m.inner)[:, m.start:m.start + m.size] = True
    return masks


def is_unpermutable(fixed: FixedUnits, pinned: Sequence[str]) -> bool:
    """Whether fixed units could have been permuted but were not (rather than holding no units).

    Parameters
    ----------
    fixed : FixedUnits
        A fixed axis from the trace.
    pinned : sequence of str
        The operations the trace could not follow.

    Returns
    -------
    bool
        True for hidden units fixed by anything but being the model's outputs, and for anything
        fixed by an operation the trace could not follow.
    """
    return (fixed.hidden and fixed.why != MODEL_OUTPUT) or any(p in fixed.why for p in pinned)


def listed_axes(traced: PermutationSpec, used: PermutationSpec, shapes: dict[str, tuple[int, ...]]
                ) -> dict[str, tuple[dict, ...]]:
    """The traced fixed axes as JSON-ready entries, split into unpermutable units and positions.

    Parameters
    ----------
    traced : PermutationSpec
        The traced spec (its ``fixed`` axes and ``pinned`` operations).
    used : PermutationSpec
        The spec that was checked (how many positions of each axis it permutes).
    shapes : dict[str, tuple[int, ...]]
        State-dict name -> shape.

    Returns
    -------
    dict
        ``unpermutable`` and ``fixed``: entries ``name``, ``axis``, ``length``, ``permuted``, ``why``.
    """
    masks = coverage(used, shapes)
    found: dict[tuple[str, str, int], list[str]] = {}
    for f in traced.fixed:
        kind = "unpermutable" if is_unpermutable(f, traced.pinned) else "fixed"
        found.setdefault((kind, f.name, f.axis), []).append(f.why)
    out: dict[str, list[dict]] = {"unpermutable": [], "fixed": []}
    for (kind, name, axis), reasons in found.items():
        mask = masks.get((name, axis))
        out[kind].append({"name": name, "axis": axis, "length": shapes[name][axis],
                          "permuted": int(mask.sum()) if mask is not None else 0,
                          "why": "; ".join(dict.fromkeys(reasons))})
    return {kind: tuple(entries) for kind, entries in out.items()}


def spec_differences(traced: PermutationSpec, given: PermutationSpec, shapes: dict[str, tuple[int, ...]]
                     ) -> tuple[dict, ...]:
    """Tensor axes whose permuted positions differ between the traced spec and a given one.

    Parameters
    ----------
    traced, given : PermutationSpec
        The traced spec and the spec under check.
    shapes : dict[str, tuple[int, ...]]
        State-dict name -> shape.

    Returns
    -------
    tuple[dict, ...]
        ``name``, ``axis``, ``why`` (positions the given spec leaves out or adds).
    """
    mine, theirs = coverage(traced, shapes), coverage(given, shapes)
    out = []
    for key in sorted(set(mine) | set(theirs)):
        a = mine.get(key, torch.zeros(shapes[key[0]][key[1]], dtype=torch.bool))
        b = theirs.get(key, torch.zeros_like(a))
        if int((a & ~b).sum()):
            out.append({"name": key[0], "axis": key[1],
                        "why": f"the traced spec permutes {int((a & ~b).sum())} positions the given spec leaves out"})
        if int((b & ~a).sum()):
            out.append({"name": key[0], "axis": key[1],
                        "why": f"the given spec permutes {int((b & ~a).sum())} positions the trace fixes"})
    return tuple(out)
