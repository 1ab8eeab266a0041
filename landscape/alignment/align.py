"""``landscape.align``: permute a model's hidden units to match a reference, and groups of models.

Permutation groups come from the traced graph (:mod:`.graph`); the permutation from weight
matching (:mod:`.weight_matching`, Git Re-Basin Alg. 1) or activation matching
(:mod:`.activation_matching`, Git Re-Basin section 3.1). The aligned model computes the same
function as the original (Entezari et al. 2022; Ainsworth et al. 2023, Eq. 1).
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from torch import nn

from ..evaluation.batches import first_inputs
from ..evaluation.evaluator import Evaluator
from ..evaluation.protocol import PointEvaluator
from ..infra.errors import ConfigError
from ..space.params import ParameterSpace
from .graph import PermutationSpec, discover
from .matchers import MATCHERS
from .permute import apply_permutation, permute_state, with_aliases
from .weight_matching import weight_matching

_GUESSED_SIDES = (32, 28, 16, 8, 64, 224)
_GUESSED_LENGTHS = (8, 4, 1)


@dataclass(frozen=True)
class Alignment:
    """The permutations that align a model to a reference, with what they were found from.

    Attributes
    ----------
    spec : PermutationSpec
        Permutation groups of the architecture.
    perms : tuple[torch.Tensor, ...]
        One permutation per group of ``spec``.
    method : str
        ``"weight"`` (Git Re-Basin Alg. 1) or ``"activation"`` (section 3.1).
    info : dict
        Diagnostics of the matching (objective or mean correlation before and after).
    seconds : float
        Wall-clock time of the matching, tracing included.
    """

    spec: PermutationSpec
    perms: tuple[torch.Tensor, ...]
    method: str
    info: dict = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def moved_units(self) -> int:
        """Units that the alignment moves (not mapped to themselves)."""
        return int(sum(int((p != torch.arange(len(p))).sum()) for p in self.perms))

    def apply(self, model: nn.Module) -> nn.Module:
        """A functionally identical copy of ``model`` with the permutations applied.

        Parameters
        ----------
        model : torch.nn.Module
            A model of the aligned architecture (not modified).

        Returns
        -------
        torch.nn.Module
            The permuted copy.
        """
        return apply_permutation(model, self.spec, self.perms)

    def __repr__(self) -> str:
        units = sum(len(p) for p in self.perms)
        return (f"Alignment({self.method} matching, {len(self.perms)} groups, {self.moved_units}/{units} units "
                f"moved, {self.seconds:.2f} s)")


def as_module(model: Any, template: nn.Module) -> nn.Module:
    """An ``nn.Module`` of ``template``'s architecture holding ``model``'s weights.

    Parameters
    ----------
    model : Any
        A module (returned as is) or another model-like (state_dict, checkpoint path, ...).
    template : torch.nn.Module
        The architecture.

    Returns
    -------
    torch.nn.Module
        ``model`` itself if it is a module, else a copy of ``template`` loaded with its weights.
    """
    if isinstance(model, nn.Module):
        return model
    space = ParameterSpace(template)
    out = copy.deepcopy(template)
    out.load_state_dict(space.state_dict(space.to_vector(model, dtype=torch.float64)))
    return out


def example_input(template: nn.Module, data: Any = None, input_shape: Sequence[int] | None = None
                  ) -> torch.Tensor:
    """A batch of two inputs to trace ``template`` with.

    Parameters
    ----------
    template : torch.nn.Module
        The architecture.
    data : Any, optional
        Data whose first two inputs are used.
    input_shape : Sequence[int], optional
        Input shape without the batch axis (zeros of the parameters' dtype), used without ``data``.

    Returns
    -------
    torch.Tensor
        Two inputs; without ``data`` or ``input_shape`` guessed from the first Linear/Conv/Embedding
        layer (a ConvNd gets the first of 32, 28, 16, 8, 64, 224 pixels per side the model accepts,
        an Embedding token ids 0 in the first of 8, 4, 1 positions it accepts).

    Raises
    ------
    ConfigError
        If no guessed shape is accepted by the model.
    """
    dtype = next((p.dtype for p in template.parameters()), torch.float32)
    if data is not None:
        return first_inputs(data, 2)
    if input_shape is not None:
        return torch.zeros(2, *input_shape, dtype=dtype)
    first = next((m for m in template.modules()
                  if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Embedding))), None)
    if isinstance(first, nn.Linear):
        candidates = [torch.zeros(2, first.in_features, dtype=dtype)]
    elif isinstance(first, nn.Embedding):
        candidates = [torch.zeros(2, length, dtype=torch.long) for length in _GUESSED_LENGTHS]
    elif first is not None:
        dims = {nn.Conv1d: 1, nn.Conv2d: 2, nn.Conv3d: 3}[type(first)]
        candidates = [torch.zeros(2, first.in_channels, *(side,) * dims, dtype=dtype) for side in _GUESSED_SIDES]
    else:
        candidates = []
    for x in candidates:
        try:
            with torch.no_grad():
                copy.deepcopy(template).eval()(x)
            return x
        except Exception:  # noqa: BLE001 - a rejected guess: try the next size
            continue
    raise ConfigError(f"cannot guess the input shape of {type(template).__name__}: pass data= or input_shape=")


def architecture(models: Sequence[Any], template: nn.Module | None, data: Any) -> nn.Module:
    """The module whose architecture the models share: ``template``, a model, or the evaluator's.

    Parameters
    ----------
    models : Sequence[Any]
        Model-likes (modules, state dicts, checkpoint paths); the first module among them is used.
    template : torch.nn.Module, optional
        The architecture, given explicitly.
    data : Any
        An :class:`~landscape.Evaluator` supplies its model's architecture (as for :func:`landscape.interpolate`).

    Returns
    -------
    torch.nn.Module

    Raises
    ------
    ConfigError
        If no architecture is known (every model is a state dict or a checkpoint path).
    """
    found = template or next((m for m in models if isinstance(m, nn.Module)), None)
    if found is None and isinstance(data, Evaluator):
        found = data.module
    if found is None:
        raise ConfigError("checkpoints and state dicts carry no architecture: pass template=<a module of it> or "
                          "data=<an Evaluator of it>")
    return found


def alignment_data(data: Any) -> Any:
    """The data alignment traces and matches activations on.

    Parameters
    ----------
    data : Any
        An :class:`~landscape.Evaluator`, data in any form :func:`match` takes, or None.

    Returns
    -------
    Any
        The evaluator's batches, or ``data`` itself.
    """
    return data.batches if isinstance(data, Evaluator) else data


def match(model: Any, *, to: Any, data: Any = None, method: str = "weight", seed: int = 0,
          template: nn.Module | None = None, input_shape: Sequence[int] | None = None, strict: bool = True,
          max_sweeps: int = 100, samples: int = 1024, spec: PermutationSpec | None = None) -> Alignment:
    """The permutations of ``model``'s hidden units that align it to ``to``.

    Parameters
    ----------
    model, to : model-like
        Model-likes (module, state_dict, checkpoint path) of one architecture.
    data : data, optional
        Inputs for activation matching (its first ``samples`` inputs) and for tracing; an
        :class:`~landscape.Evaluator` gives its data and, for checkpoint paths, the architecture.
    method : str
        ``"weight"`` (Git Re-Basin Alg. 1) or ``"activation"`` (section 3.1, needs data).
    seed : int
        Order of the coordinate-descent sweeps (weight matching).
    template : torch.nn.Module, optional
        The architecture when neither ``model`` nor ``to`` is an ``nn.Module``.
    input_shape : sequence of int, optional
        Input shape (without the batch axis) for tracing when no data are given.
    strict : bool
        Refuse operations that cannot be permuted (else leave their units in place).
    max_sweeps : int
        Bound on weight matching's sweeps.
    samples : int
        Number of inputs activation matching compares activations on.
    spec : PermutationSpec, optional
        Permutation groups found earlier for this architecture (skips the tracing).

    Returns
    -------
    Alignment

    Raises
    ------
    ConfigError
        If ``method`` is unknown, activation matching has no data, or no template is known.
    PermutationError
        If the model cannot be traced or (``strict``) has an operation that does not commute
        with a permutation.
    """
    matcher = MATCHERS.get(method)
    if matcher.needs_data and data is None:
        raise ConfigError("activation matching compares activations on data: pass data=")
    template = architecture((model, to), template, data)
    data = alignment_data(data)
    start = time.perf_counter()
    mod_b, mod_a = as_module(model, template), as_module(to, template)
    if spec is None:
        spec = discover(template, example_input(template, data, input_shape), strict=strict)
    perms, info = matcher(spec, mod_a, mod_b, data=data, samples=samples, seed=seed, max_sweeps=max_sweeps)
    return Alignment(spec, tuple(perms), method, info, time.perf_counter() - start)


def align(model: Any, *, to: Any, data: Any = None, method: str = "weight", seed: int = 0, **options: Any
          ) -> nn.Module:
    """A functionally identical copy of ``model`` whose hidden units are permuted to match ``to``.

    Parameters
    ----------
    model, to : model-like
        The model to permute and the model it is aligned to, as :func:`match`.
    data : data, optional
        As :func:`match`.
    method : str
        ``"weight"`` or ``"activation"``, as :func:`match`.
    seed : int
        As :func:`match`.
    **options
        The other options of :func:`match` (``template``, ``input_shape``, ``strict``, ``max_sweeps``,
        ``samples``, ``spec``).

    Returns
    -------
    nn.Module
        Same outputs as ``model`` (to float rounding), weights closer to ``to``'s.

    Examples
    --------
    Permuting the hidden units of an MLP, ``W1 -> P W1``, ``b1 -> P b1``, ``W2 -> W2 P^T``, leaves
    its function unchanged (Git Re-Basin, Ainsworth et al. 2023, section 2). Weight matching
    (their Algorithm 1) maximises ``sum_l <W_l^a, P_l W_l^b P_{l-1}^T>``, which for a permuted copy
    is largest at the inverse permutation: ``b``'s unit ``perms[0][i]`` is ``a``'s unit ``i``.

    >>> import torch, landscape
    >>> g = torch.Generator().manual_seed(0)
    >>> w1, b1, w2 = torch.randn(3, 2, generator=g), torch.randn(3, generator=g), torch.randn(1, 3, generator=g)
    >>> def mlp(w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor) -> torch.nn.Module:
    ...     model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
    ...     _ = model.load_state_dict({"0.weight": w1, "0.bias": b1, "2.weight": w2, "2.bias": torch.zeros(1)})
    ...     return model
    >>> perm = torch.tensor([2, 0, 1])
    >>> a, b = mlp(w1, b1, w2), mlp(w1[perm], b1[perm], w2[:, perm])
    >>> x = torch.randn(5, 2, generator=g)
    >>> torch.allclose(a(x), b(x))  # one function, two parametrisations
    True
    >>> landscape.alignment.match(b, to=a).perms[0]
    tensor([1, 2, 0])
    >>> aligned = landscape.align(b, to=a)
    >>> all(torch.equal(p, q) for p, q in zip(aligned.parameters(), a.parameters()))
    True
    """
    template = architecture((model, to), options.get("template"), data)
    found = match(model, to=to, data=data, method=method, seed=seed, **options)
    return found.apply(as_module(model, template))


def align_group(models: Sequence[Any], *, to: Any = None, data: Any = None, method: str = "weight", seed: int = 0,
                max_rounds: int = 20, **options: Any) -> list[nn.Module]:
    """Align every model of a group to a reference, or to each other (MergeMany).

    With ``to``, each model is aligned to ``to`` (clients to the global model). Without it,
    MergeMany (Git Re-Basin, Algorithm 3 of the appendix): in rounds, each model in turn is
    aligned to the average of the others (weight matching), until a round moves no unit or
    ``max_rounds`` rounds.

    Parameters
    ----------
    models : Sequence[Any]
        Model-likes of one architecture (at least two without ``to``).
    to : Any, optional
        Common reference; without it, MergeMany.
    data, method, seed : as :func:`match` (MergeMany needs ``method="weight"``; ``seed`` draws
        the visiting order and the sweeps' seeds).
    max_rounds : int
        Bound on MergeMany's rounds.
    **options : Any
        ``template``, ``input_shape``, ``strict``, ``spec`` and further options of :func:`match`
        (``max_sweeps`` for MergeMany).

    Returns
    -------
    list[nn.Module]
        The aligned models, each functionally identical to its original.

    Raises
    ------
    ConfigError
        If there are too few models, no template, or MergeMany with activation matching.
    """
    if len(models) < 2 and to is None:
        raise ConfigError("aligning a group to itself needs at least two models")
    template = architecture([*models, to], options.pop("template", None), data)
    data = alignment_data(data)
    mods = [as_module(m, template) for m in models]
    spec = options.pop("spec", None) or discover(
        template, example_input(template, data, options.pop("input_shape", None)),
        strict=options.pop("strict", True))
    if to is not None:
        return [align(m, to=to, data=data, method=method, seed=seed, template=template, spec=spec, **options)
                for m in mods]
    if method != "weight":
        raise ConfigError("MergeMany aligns models to the average of the others by weight matching: "
                          "use method='weight' or give to=")
    params = [n for n, _ in template.named_parameters()]
    states = [{k: v.detach().double() for k, v in m.state_dict().items()} for m in mods]
    gen = torch.Generator().manual_seed(seed)
    for _ in range(max_rounds):
        moved = False
        for i in torch.randperm(len(states), generator=gen).tolist():
            others = [s for j, s in enumerate(states) if j != i]
            mean = {k: sum(s[k] for s in others) / len(others) for k in params}
            perms, _info = weight_matching(spec, mean, {k: states[i][k] for k in params},
                                           seed=int(torch.randint(2**31, (1,), generator=gen)), **options)
            if any(not torch.equal(p, torch.arange(len(p))) for p in perms):
                states[i] = permute_state(states[i], spec, perms)
                moved = True
        if not moved:
            break
    out = []
    for m, s in zip(mods, states):
        copy_ = copy.deepcopy(m)
        copy_.load_state_dict(with_aliases(m, s))
        out.append(copy_)
    return out


def aligned_vector(model: torch.Tensor, *, to: torch.Tensor, evaluator: PointEvaluator, method: str = "weight",
                   seed: int = 0) -> torch.Tensor:
    """``model`` (a flat vector of the evaluator's space) with its hidden units permuted to match ``to``.

    The helper behind ``align=`` of :func:`landscape.interpolate` and :func:`landscape.group_barrier`.

    Parameters
    ----------
    model, to
        Flat float64 vectors of ``evaluator.space``.
    evaluator
        Gives the architecture (its template) and, for activation matching, the data.
    method, seed
        As :func:`match`.

    Returns
    -------
    torch.Tensor
        The aligned model's flat vector (the same function as ``model``).
    """
    space = evaluator.space
    data = None
    if MATCHERS.get(method).needs_data:
        data = (torch.cat([x.cpu() for x, _ in evaluator.batches]), torch.cat([y.cpu() for _, y in evaluator.batches]))
    module = align(space.state_dict(model), to=space.state_dict(to), data=data, method=method, seed=seed,
                   template=space.module)
    return evaluator.vector(module)
