"""Activation matching: pair B's units with A's by the correlation of their activations.

Git Re-Basin (Ainsworth et al. 2023), section 3.1: for each group, the permutation maximising
``sum_i corr(Z^A_i, Z^B_{perm[i]})``, where ``Z`` are the units' activations on the same data
(every sample and spatial position is an observation), is a linear assignment problem. The
activations of a group are read at its probe nodes (:class:`~.graph.Group`, the last few
nonlinearity outputs and residual sums its units pass through), by running the traced ATen
graph; the correlation matrices of the probes are averaged.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..evaluation.batches import first_inputs
from ..infra.errors import ConfigError
from .graph import Member, PermutationSpec, trace, unique_state
from .matchers import MATCHERS, Matcher
from .permute import unit_view
from .weight_matching import assignment


def probe_activations(module: nn.Module, spec: PermutationSpec, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Outputs of the probe nodes of every group on inputs ``x`` (no gradients).

    Parameters
    ----------
    module : torch.nn.Module
        The model to run (traced to its ATen graph; not modified).
    spec : PermutationSpec
        Permutation groups whose probe nodes are read.
    x : torch.Tensor
        Input batch (moved to the model's device).

    Returns
    -------
    dict[str, torch.Tensor]
        Probe node name -> its detached output.

    Raises
    ------
    ConfigError
        If the graph traced at this batch size lacks some probe node.
    """
    graph, names = trace(module, x)
    wanted = {name for g in spec.groups for name, _ in g.probes}
    captured: dict[str, torch.Tensor] = {}

    class Capture(torch.fx.Interpreter):
        def run_node(self, n: Any) -> Any:
            out = super().run_node(n)
            if n.name in wanted:
                captured[n.name] = out.detach()
            return out

    state = unique_state(module)
    device = next(iter(state.values())).device if state else x.device
    with torch.no_grad():
        Capture(graph).run([state[k] for k in names], x.to(device))
    missing = wanted - set(captured)
    if missing:
        raise ConfigError(f"the traced graph at batch size {len(x)} lacks nodes {sorted(missing)[:3]}: the model's "
                          "graph depends on the batch size; pass data with the example batch's size")
    return captured


def _units(value: torch.Tensor, m: Member) -> torch.Tensor:
    """The member's units of an activation as rows: (units, observations)."""
    return unit_view(value, m)[:, m.start:m.start + m.size].transpose(0, 1).reshape(m.size, -1)


def correlation(za: torch.Tensor, zb: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Pearson correlation matrix of the rows of two activation matrices (Ainsworth et al. 2023, Sec. 3.1).

    Parameters
    ----------
    za, zb : torch.Tensor
        (n, obs) activations of A's and B's units, one row per unit.
    eps : float
        Added to the norms so that constant units give 0 rather than NaN.

    Returns
    -------
    torch.Tensor
        (n, n) float64 matrix, ``[i, j] = corr(za[i], zb[j])``.
    """
    za = za.double() - za.double().mean(1, keepdim=True)
    zb = zb.double() - zb.double().mean(1, keepdim=True)
    za = za / (za.norm(dim=1, keepdim=True) + eps)
    zb = zb / (zb.norm(dim=1, keepdim=True) + eps)
    return za @ zb.T


def activation_matching(spec: PermutationSpec, a: nn.Module, b: nn.Module, x: torch.Tensor
                        ) -> tuple[list[torch.Tensor], dict]:
    """Permutations of ``b``'s units that maximise the correlation of its activations with ``a``'s.

    Parameters
    ----------
    spec : PermutationSpec
        Permutation groups of the architecture.
    a, b : torch.nn.Module
        Reference model and model to permute (evaluated in eval mode, not modified).
    x : torch.Tensor
        Input batch on which activations are compared.

    Returns
    -------
    (perms, info)
        One permutation per group, and ``{"mean_correlation_before", "mean_correlation"}``:
        the mean over groups of the matched units' mean correlation, before and after.
    """
    acts_a, acts_b = probe_activations(a, spec, x), probe_activations(b, spec, x)
    perms, before, after = [], [], []
    for group in spec.groups:
        if not group.probes:  # units that never carry data: nothing to correlate
            perms.append(torch.arange(group.size))
            continue
        corr = sum(correlation(_units(acts_a[node], m), _units(acts_b[node], m)) for node, m in group.probes)
        corr = corr / len(group.probes)
        perm = assignment(corr, group.block)
        perms.append(perm)
        before.append(float(corr.diagonal().mean()))
        after.append(float(corr[torch.arange(group.size), perm].mean()))
    return perms, {"mean_correlation_before": _mean(before), "mean_correlation": _mean(after)}


def _mean(values: list[float]) -> float:
    """Mean of ``values``; NaN for none."""
    return sum(values) / len(values) if values else float("nan")


def match_activations(spec: PermutationSpec, reference: nn.Module, model: nn.Module, *, data: Any,
                      samples: int = 1024, **unused: Any) -> tuple[list[torch.Tensor], dict[str, Any]]:
    """:func:`activation_matching` on the first ``samples`` inputs of ``data`` (the ``"activation"`` method).

    Parameters
    ----------
    spec : PermutationSpec
        The permutation groups.
    reference, model : nn.Module
        The model aligned to, and the model whose units are permuted (both put in eval mode).
    data : Any
        Inputs (a tensor, an ``(x, y)`` pair or batches).
    samples : int
        How many inputs the activations are compared on.
    **unused
        The options of other methods (``seed``, ``max_sweeps``).

    Returns
    -------
    tuple
        The permutations and the search's numbers.
    """
    return activation_matching(spec, reference.eval(), model.eval(), first_inputs(data, samples))


MATCHERS.add("activation", Matcher(match_activations, needs_data=True))
