"""Curvature per block of parameters: the top eigenvalues and trace of each diagonal Hessian block.

A block is a set of parameters (a module's own parameters, or those matched by name patterns).
Its curvature is that of the Hessian *restricted to the block* -- the diagonal block
``H_BB = d^2 L / d theta_B^2`` of the full Hessian, the other parameters held at the model (or
the block of another curvature ``kind``, with its ``kind_options``) -- computed by
:func:`~.functions.hessian_eigen` and :func:`~.functions.hessian_trace` with the block's
patterns as ``params`` (so every block's numbers are cached on their own).
"""
from __future__ import annotations

import glob
import warnings
from typing import Mapping, Sequence

import numpy as np
import torch

from ..evaluation.protocol import PointEvaluator
from ..infra.errors import ConfigError
from ..results.curvature_views import BlockCurvature
from ..space.params import ModelLike, ParameterSpace, vector_digest
from .at_point import KindOptions, flat_point, operator_options
from .functions import hessian_eigen, hessian_trace, spec_of

Blocks = str | Sequence[str] | Mapping[str, str | Sequence[str]]
#: the label of parameters owned by the root module itself (a scalar gain, say)
ROOT_LABEL = "(root)"


def curvature_by_block(model: ModelLike | torch.Tensor, evaluator: PointEvaluator, *, blocks: Blocks = "modules",
                       top_k: int = 1,
                       trace: bool = True, tol: float = 1e-3, max_iter: int = 100, seed: int = 0,
                       method: str = "lanczos", trace_method: str = "hutch++", trace_tol: float = 5e-2,
                       trace_max_iter: int = 100, hvp: str = "auto", include_frozen: bool = False,
                       kind: str = "hessian", kind_options: KindOptions = None) -> BlockCurvature:
    """Top eigenvalues and trace of the Hessian restricted to each block of parameters, as a table.

    Each row is the diagonal block ``H_BB`` of the full Hessian for the block's parameters ``B``
    (the other parameters fixed at the model), not the full Hessian's spectrum projected on them.
    By Cauchy interlacing a block's top eigenvalue is at most the full Hessian's; the traces of
    blocks that partition the parameters add up to the full trace.

    Parameters
    ----------
    model
        A model-like or a flat vector of the evaluator's space.
    evaluator
        The :class:`~landscape.Evaluator` whose loss is differentiated.
    blocks
        ``"modules"``: one block per module that owns parameters directly (each ``Linear``,
        ``Conv``, norm layer; parameters of the root module itself form ``"(root)"``; a tied
        weight counts in the module that registered it first). A list of ``fnmatch`` patterns:
        one block per pattern, labelled by it. A mapping ``{label: pattern or patterns}``: one
        block per label. Patterns are those of ``params=`` of the curvature functions.
    top_k
        Eigenvalues per block (at least 1; NaN beyond a block's size).
    trace
        Also estimate each block's trace (with its standard error).
    tol, max_iter, seed, method
        Eigen-solver options, as for :func:`~landscape.curvature.functions.hessian_eigen`.
    trace_method, trace_tol, trace_max_iter
        Trace estimator options (``method``, ``tol``, ``max_iter`` of
        :func:`~landscape.curvature.functions.hessian_trace`; its ``seed`` is ``seed``).
    hvp, include_frozen, kind, kind_options
        As for :func:`~landscape.curvature.functions.hessian_eigen`: the blocks are those of the
        ``kind``'s matrix (default the Hessian), with its options.

    Returns
    -------
    BlockCurvature
        One row per block (label, parameter count, eigenvalues, trace and standard error); prints
        as an aligned table, renders in a notebook, ``.rows()`` and ``.to_pandas()`` convert it.
        One warning names the blocks whose solver or estimator did not reach its tolerance.

    Raises
    ------
    ConfigError
        ``top_k < 1``, a ``blocks`` value of another form, no block, a block whose patterns
        match no trainable parameter (the message names the block), or a bad kind or kind option.
    """
    if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1:
        raise ConfigError(f"top_k must be an integer >= 1 (eigenvalues per block), got {top_k!r}")
    operator, resolved = operator_options(kind, kind_options, include_frozen, hvp=hvp)
    space = evaluator.space
    named = resolve_blocks(space, blocks, include_frozen=include_frozen)
    point = flat_point(model, evaluator)
    sizes, values, residuals, eig_ok, traces, stderrs, trace_ok = [], [], [], [], [], [], []
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"hessian_(eigen|trace): ")  # one summary warning instead
        for _, patterns, size in named:
            k = min(int(top_k), size)
            eig = hessian_eigen(point, evaluator, k=k, tol=tol, max_iter=max_iter, seed=seed, method=method,
                                params=patterns, include_frozen=include_frozen, kind=kind, kind_options=resolved)
            sizes.append(size)
            values.append(np.pad(np.asarray(eig.values, dtype=np.float64), (0, top_k - k), constant_values=np.nan))
            residuals.append(np.pad(np.asarray(eig.residuals, dtype=np.float64), (0, top_k - k),
                                    constant_values=np.nan))
            eig_ok.append(bool(eig.converged))
            if trace:
                est = hessian_trace(point, evaluator, tol=trace_tol, max_iter=trace_max_iter, seed=seed,
                                    method=trace_method, params=patterns, include_frozen=include_frozen, kind=kind,
                                    kind_options=resolved)
                traces.append(est.value)
                stderrs.append(est.stderr)
                trace_ok.append(bool(est.converged))
    labels = [label for label, _, _ in named]
    _warn_unconverged(labels, eig_ok, trace_ok)
    options = dict(top_k=int(top_k), trace=bool(trace), tol=tol, max_iter=max_iter, seed=seed, method=method,
                   trace_method=trace_method, trace_tol=trace_tol, trace_max_iter=trace_max_iter, **operator)
    return BlockCurvature(
        labels=labels, patterns=[list(p) for _, p, _ in named], sizes=np.asarray(sizes, dtype=np.int64),
        eigenvalues=np.stack(values), residuals=np.stack(residuals), eigen_converged=np.asarray(eig_ok),
        trace=np.asarray(traces, dtype=np.float64) if trace else None,
        trace_stderr=np.asarray(stderrs, dtype=np.float64) if trace else None,
        trace_converged=np.asarray(trace_ok) if trace else None,
        spec={"kind": "curvature_by_block", "point": vector_digest(point), **spec_of(evaluator, **options)})


def resolve_blocks(space: ParameterSpace, blocks: Blocks, *, include_frozen: bool = False
                   ) -> list[tuple[str, list[str], int]]:
    """``(label, patterns, parameter count)`` of each block, every block checked to select something.

    Parameters
    ----------
    space
        The evaluator's parameter space (its ``module`` gives the modules).
    blocks
        ``"modules"``, a list of patterns or a ``{label: pattern(s)}`` mapping (see
        :func:`curvature_by_block`).
    include_frozen
        Count parameters with ``requires_grad=False`` too.

    Returns
    -------
    list of tuple
        In the order given (module order for ``"modules"``).

    Raises
    ------
    ConfigError
        A ``blocks`` of another form, no block, or a block that selects no trainable parameter.
    """
    if isinstance(blocks, str):
        if blocks != "modules":
            raise ConfigError(f"blocks must be 'modules', a list of parameter-name patterns or a {{label: pattern}} "
                              f"mapping, got the string {blocks!r} (a single pattern goes in a list: [{blocks!r}])")
        pairs = _module_blocks(space, include_frozen)
    elif isinstance(blocks, Mapping):
        pairs = [(str(label), [p] if isinstance(p, str) else list(p)) for label, p in blocks.items()]
    elif isinstance(blocks, Sequence):
        pairs = [(p, [p]) for p in blocks]
    else:
        raise ConfigError(f"blocks must be 'modules', a list of patterns or a mapping, got {type(blocks).__name__}")
    if not pairs:
        raise ConfigError("blocks is empty: give at least one block (or blocks='modules')")
    out = []
    for label, patterns in pairs:
        if not patterns or not all(isinstance(p, str) for p in patterns):
            raise ConfigError(f"block {label!r}: patterns must be non-empty strings, got {patterns!r}")
        try:
            mask = space.select(patterns, include_frozen=include_frozen)
        except ConfigError as exc:
            raise ConfigError(f"block {label!r}: {exc}") from None
        out.append((label, patterns, int(mask.sum())))
    return out


def _module_blocks(space: ParameterSpace, include_frozen: bool) -> list[tuple[str, list[str]]]:
    """One block per module owning parameters directly, of the entries the space differentiates."""
    eligible = {e.name for e in space.entries
                if e.kind == "parameter" and (include_frozen or e.name not in space.frozen)}
    pairs = []
    for name, module in space.module.named_modules():
        own = [f"{name}.{p}" if name else p for p, _ in module.named_parameters(recurse=False)]
        own = [glob.escape(p) for p in own if p in eligible]  # a name is a pattern matching itself
        if own:
            pairs.append((name or ROOT_LABEL, own))
    if not pairs:
        raise ConfigError("no module owns a trainable parameter (frozen parameters are left out unless "
                          "include_frozen=True)")
    return pairs


def _warn_unconverged(labels: list[str], eig_ok: list[bool], trace_ok: list[bool]) -> None:
    eig_bad = [label for label, ok in zip(labels, eig_ok) if not ok]
    trace_bad = [label for label, ok in zip(labels, trace_ok) if not ok]
    parts = ([f"eigenvalues of {eig_bad} (raise max_iter or tol)"] if eig_bad else []) + \
        ([f"traces of {trace_bad} (raise trace_max_iter or trace_tol)"] if trace_bad else [])
    if parts:
        warnings.warn("curvature_by_block: did not reach the tolerance: " + "; ".join(parts)
                      + "; the table's converged column marks them", stacklevel=3)
