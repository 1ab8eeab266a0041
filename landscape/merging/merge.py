"""``landscape.merge``: merge models one tensor at a time, then check the merge on the landscape.

The merge reads the same tensor of every model (and of the base), applies the method's rule
(:mod:`landscape.merging.methods`) in at least float32, casts the result back to the models'
dtype and moves on, in the order of the tensors' names: the memory beyond the output is one
tensor per model (for ``.safetensors`` checkpoints, which are read tensor by tensor). Non-float
tensors (``num_batches_tracked``) and, with ``params=``, the tensors outside the subset are those
of the reference model (the base, or the first model), and every model must equal it outside the
subset. Floating-point buffers (BatchNorm statistics) are merged like weights, as FedAvg averages
a state_dict. Tied weights (known from the architecture) are merged once.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import torch
from torch import nn

from ..evaluation.evaluator import Evaluator
from ..geometry.paths import AlphasLike
from ..infra.errors import ConfigError
from ..results.merging import MergeResult
from ..space.params import ModelLike, ParameterSpace
from ..space.subsets import ParamsLike, Subspace
from .options import MergeOptions
from .registry import METHODS, MergeMethod
from .sources import Source, check_compatible, open_source


def merge(models: Sequence[ModelLike], method: str = "mean", *, base: ModelLike | None = None,
          weights: Sequence[float] | None = None, evaluator: Evaluator | None = None, params: ParamsLike = None,
          labels: Sequence[str] | None = None, template: nn.Module | None = None, align: str | bool | None = None,
          curvature: bool = False, rho: float = 0.05, alphas: AlphasLike = "adaptive", tol: float | None = None,
          **options: Any) -> MergeResult:
    """Merge models, and with an ``evaluator`` check the merge on the loss landscape.

    Methods (``docs/merging.md``): ``"mean"`` (uniform soup, or weighted with ``weights``),
    ``"greedy_soup"`` (Wortsman et al. 2022, Recipe 1), ``"task_arithmetic"`` (Ilharco et al.
    2023: ``base + lambda sum_i tau_i``, ``tau_i = theta_i - base``), ``"ties"`` (Yadav et al.
    2023, Algorithm 1: trim, elect sign, disjoint mean), ``"dare"`` (Yu et al. 2024: drop with
    probability ``p``, rescale by ``1 / (1 - p)``, then task arithmetic or TIES) and ``"slerp"``
    (two models, spherical interpolation per tensor).

    Parameters
    ----------
    models
        The models to merge: ``nn.Module``, state_dict or checkpoint path (``.safetensors`` files
        are read tensor by tensor; ``.pt`` files whole, never unpickled).
    method
        A registered method (:data:`landscape.merging.registry.METHODS`).
    base
        The model the others were fine-tuned from: required by the task-vector methods
        (``task_arithmetic``, ``ties``, ``dare``), refused by the others.
    weights
        One number per model; its meaning is the method's (the weighted mean's weights; the
        per-task coefficients of the task-vector methods); ``slerp`` and ``greedy_soup`` take none.
    evaluator
        Measure the merge: its loss and accuracy, those of each model (and of the base), the
        barrier of the path from the merge to each model (FedGuCci Eq. 3/4); it also gives the
        architecture. ``greedy_soup`` chooses on it unless ``held_out=`` is given.
    params
        Merge only these parameters: ``"trainable"`` (those with ``requires_grad=True``: LoRA
        adapters of one base), or ``fnmatch`` patterns; everything else is the reference's, and
        every model must equal the reference there. Needs an architecture.
    labels
        Names of the models (default ``"model i"``).
    template
        The architecture (an ``nn.Module``) when neither a model nor the evaluator gives it.
    align
        ``"weight"`` (or True) or ``"activation"``: permute each model's hidden units to match the
        base (or the first model) first (:func:`landscape.align`); the numbers of the plain merge
        are kept in ``result.unaligned``.
    curvature
        With an evaluator: also the L2 sharpness (radius ``rho``) and the top Hessian eigenvalue of
        the merge and of each model (:func:`landscape.sharpness`).
    rho
        Radius of the sharpness ball.
    alphas, tol
        Of each path from the merge to a model (:func:`landscape.interpolate`; adaptive by default).
    **options
        The method's options (``scale``, ``density``, ``p``, ``combine``, ``seed``, ``t``,
        ``held_out``, ...; ``docs/api.md`` lists them per method).

    Returns
    -------
    MergeResult
        ``state_dict()`` and ``model`` of the merge, and the measurements when an evaluator is given.

    Raises
    ------
    ConfigError
        An unknown method or option, an option out of range (``density`` in (0, 1], ``p`` in
        [0, 1), ``t`` in [0, 1]), a missing or superfluous base, a wrong number of models or
        weights, ``params`` without an architecture or with ``align``, a model that differs from the
        reference outside ``params``, tensors of different dtypes (naming the model and tensor).
    ArchitectureMismatchError
        A model lacks tensors of the reference, has others, or has another shape (naming it).
    CheckpointError
        A checkpoint is missing, unreadable or does not match its stored SHA-256.
    """
    found = METHODS.get(method)
    opts = found.options.from_mapping(options, owner=f"{method} option ")
    align = "weight" if align is True else None if align is False else align
    general = {"method": method, "align": align, "curvature": curvature, "rho": rho, "tol": tol,
               **({"alphas": alphas} if isinstance(alphas, (int, str)) else {})}
    MergeOptions.from_mapping(general)
    models = list(models)
    labels = _labels(labels, len(models))
    _check_inputs(found, method, models, base, weights, labels)
    template = template if template is not None else evaluator.space.module if evaluator is not None else \
        next((m for m in [*models, base] if isinstance(m, nn.Module)), None)
    if params is not None and (template is None or align is not None):
        raise ConfigError("params= needs the architecture (pass template= or evaluator=)" if template is None else
                          "align permutes the whole model and params= merges a subset: pass one of them")
    spec: dict[str, Any] = {"kind": "merge", "method": method, "source": found.source,
                            **({"params": params} if params is not None else {}),
                            **({"weights": [float(w) for w in weights]} if weights is not None else {})}
    plain = _merged(models, base, weights, labels, found, opts, evaluator, template, params)
    numbers = _measured(plain[0], models, base, evaluator, params, alphas, tol, curvature, rho)
    if align is not None:
        from ..alignment.align import align as align_model

        if template is None:
            raise ConfigError("align= needs the architecture (pass template= or evaluator=)")
        data = evaluator.batches if evaluator is not None and align == "activation" else None
        if align == "activation" and data is None:
            raise ConfigError("align='activation' compares activations on the evaluator's data: pass evaluator=")
        reference = base if base is not None else models[0]
        models = [m if base is None and i == 0 else
                  align_model(m, to=reference, data=_tensors(data), method=align, template=template)
                  for i, m in enumerate(models)]
        spec.update(align=align, unaligned=_summary(numbers, plain[1]))
        plain = _merged(models, base, weights, labels, found, opts, evaluator, template, params)
        numbers = _measured(plain[0], models, base, evaluator, params, alphas, tol, curvature, rho)
    if evaluator is not None:
        spec.update(evaluator=evaluator.fingerprint(), rho=rho, alphas=alphas if isinstance(alphas, (int, str))
                    else [float(a) for a in alphas])
    state, members, selection = plain
    return MergeResult(method=method, labels=labels, members=[labels[i] for i in members], options=_plain(opts),
                       selection=selection, **numbers, spec=spec, state=state, module=template)


def _labels(labels: Sequence[str] | None, n: int) -> list[str]:
    out = list(labels) if labels is not None else [f"model {i}" for i in range(n)]
    if len(out) != n:
        raise ConfigError(f"{len(out)} labels for {n} models")
    return out


def _check_inputs(found: MergeMethod, method: str, models: list, base: Any, weights: Sequence[float] | None,
                  labels: list[str]) -> None:
    """Refuse a model count, base or weights the method does not take (one line naming the problem)."""
    lo, hi = found.models
    if len(models) < lo or (hi is not None and len(models) > hi):
        want = f"exactly {lo}" if lo == hi else f"at least {lo}"
        raise ConfigError(f"{method} merges {want} model{'s' if (hi or lo) > 1 else ''}, got {len(models)}")
    if found.needs_base and base is None:
        raise ConfigError(f"{method} adds task vectors theta_i - base to the base: pass base= (the model that "
                          f"{', '.join(labels)} were fine-tuned from)")
    if base is not None and not found.needs_base:
        raise ConfigError(f"{method} uses no base model: leave base= out (task_arithmetic, ties and dare take one)")
    if weights is None:
        return
    if not found.weights:
        raise ConfigError(f"{method} takes no weights")
    w = [float(x) for x in weights]
    if len(w) != len(models):
        raise ConfigError(f"{len(w)} weights for {len(models)} models")
    bad = next((labels[i] for i, x in enumerate(w) if not math.isfinite(x)), None)
    if bad is not None:
        raise ConfigError(f"the weight of {bad} is not a finite number")
    if found.nonnegative_weights and (min(w) < 0 or sum(w) <= 0):
        raise ConfigError(f"the weights of {method} must be non-negative and not all zero (they are normalised to "
                          f"sum to one), got {w}")


def _merged(models: list, base: Any, weights: Sequence[float] | None, labels: list[str], found: MergeMethod,
            opts: Any, evaluator: Evaluator | None, template: nn.Module | None, params: ParamsLike
            ) -> tuple[dict[str, torch.Tensor], list[int], dict[str, Any]]:
    """The merged state, the indices of the models merged and the selection record."""
    members, selection = list(range(len(models))), {}
    if found.select is not None:
        members, selection = found.select(models, labels, evaluator, opts)
    space = ParameterSpace(template) if template is not None else None
    names = list(template.state_dict()) if template is not None else None
    opened: list[Source] = []
    try:
        base_src = open_source(base, "base", names) if base is not None else None
        opened += [base_src] if base_src is not None else []
        for m, label in zip(models, labels):
            opened.append(open_source(m, label, names))
        state = _combine(opened[len(opened) - len(models):], base_src, members, weights, found, opts, space, params)
        for src in opened:
            src.verify()
    finally:
        for src in opened:
            src.close()
    return state, members, selection


def _combine(sources: list[Source], base: Source | None, members: list[int], weights: Sequence[float] | None,
             found: MergeMethod, opts: Any, space: ParameterSpace | None, params: ParamsLike
             ) -> dict[str, torch.Tensor]:
    """Apply the method's rule tensor by tensor, in name order (see the module docstring)."""
    reference = base if base is not None else sources[0]
    check_compatible([s for s in sources if s is not reference], reference, reference.names)
    aliases = space.aliases if space is not None else {}
    floating = {n for n in reference.names if reference.dtype(n).is_floating_point}
    selected = floating if params is None else set(Subspace(space, params).names)  # type: ignore[arg-type]
    missing = sorted(selected - set(reference.names))
    if missing:
        raise ConfigError(f"{reference.label} has no tensor {missing[0]} of params={params!r}")
    w = None if weights is None else torch.tensor([float(weights[i]) for i in members], dtype=torch.float64)
    generator = torch.Generator().manual_seed(int(getattr(opts, "seed", 0)))
    merged: dict[str, torch.Tensor] = {}
    for name in sorted(reference.names):
        if name in aliases and aliases[name] in reference.names:
            continue
        ref = reference.read(name)
        if name in selected:
            dtype = torch.promote_types(ref.dtype, torch.float32)
            thetas = torch.stack([sources[i].read(name).to(ref.device, dtype) for i in members])
            b = ref.to(dtype) if base is not None else None
            merged[name] = found.rule(thetas, b, w, opts, generator).to(ref.dtype)
            continue
        if name in floating and params is not None:
            for src in sources:
                if src is not reference and not torch.equal(src.read(name).to(ref.device), ref):
                    raise ConfigError(f"{src.label} differs from {reference.label} outside params={params!r} "
                                      f"(first differing tensor: {name}); only the selected parameters are merged, "
                                      "so widen params or pass params=None")
        merged[name] = ref.clone()
    for alias, target in aliases.items():
        if alias in reference.names and target in merged:
            merged[alias] = merged[target]
    return {n: merged[n] for n in reference.names}


def _measured(state: dict[str, torch.Tensor], models: list, base: Any, evaluator: Evaluator | None,
              params: ParamsLike, alphas: AlphasLike, tol: float | None, curvature: bool, rho: float) -> dict:
    """The measurements of a merge (none without an evaluator)."""
    if evaluator is None:
        return {}
    from .measure import measure

    return measure(state, models, base, evaluator, params=params, alphas=alphas, tol=tol, curvature=curvature,
                   rho=rho)


def _summary(numbers: dict[str, Any], members: list[int]) -> dict[str, Any]:
    """The plain merge's numbers kept beside an aligned merge's (arrays as lists, no paths)."""
    return {"members": members, **{k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in numbers.items()
                                   if k != "paths"}}


def _tensors(batches: Any) -> Any:
    """The evaluator's batches as one ``(inputs, targets)`` pair (for activation matching), or None."""
    if batches is None:
        return None
    return torch.cat([x.cpu() for x, _ in batches]), torch.cat([y.cpu() for _, y in batches])


def _plain(opts: Any) -> dict[str, Any]:
    """A method's options as JSON-ready values (an evaluator passed as ``held_out`` by its class name)."""
    return {k: (v if v is None or isinstance(v, (bool, int, float, str)) else type(v).__name__)
            for k, v in opts.to_dict().items()}
