"""The context every curvature product runs in: operations that have second derivatives.

``torch.nn.functional.scaled_dot_product_attention`` (and ``nn.MultiheadAttention``, which calls
it) picks a fused kernel by default; on CPU the flash kernel has neither a double backward nor
forward-mode AD, so a Hessian-vector product (or the forward-mode Jacobian-vector product of the
Gauss-Newton and Fisher operators) through it fails. The math kernel computes the same
attention from matrix products and a softmax, which are twice differentiable: curvature runs
with it (:data:`ATTENTION_KERNEL`, recorded in each curvature result's spec). Any other operation
without a second (or forward-mode) derivative is reported as a :class:`~landscape.infra.errors.CurvatureError`
naming it, instead of PyTorch's internal message.
"""
from __future__ import annotations

import contextlib
import re
from typing import Iterator

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..infra.errors import CurvatureError

#: The ``scaled_dot_product_attention`` kernel gradients and products run with: the math kernel is
#: twice differentiable, the fused ones (flash, memory-efficient, the CPU flash kernel) are not.
ATTENTION_KERNEL = "math"
#: PyTorch's messages for an operation without a second derivative (reverse or forward mode).
_NO_SECOND_DERIVATIVE = re.compile(r"derivative for (\S+) is not implemented"
                                   r"|forward AD with (\S+) that does not support it"
                                   r"|implement the (jvp) function for (custom autograd\.Function)")


@contextlib.contextmanager
def second_order(mode: str, kind: str, forward_fix: str) -> Iterator[None]:
    """Context of a curvature product.

    The twice-differentiable attention kernel, and a
    :class:`~landscape.infra.errors.CurvatureError` naming an operation that lacks a derivative the
    product needs (a double backward, or forward-mode AD).

    Parameters
    ----------
    mode : str
        How the product is computed (for the Hessian one of ``HVP_MODES`` of :mod:`.hessian`), for
        the message.
    kind : str
        The operator's kind (``"hessian"``, ``"ggn"``, ...), for the message.
    forward_fix : str
        What avoids forward-mode AD for this kind (the operator's ``forward_mode_fix``), for the
        message about an operation without it.

    Yields
    ------
    None

    Raises
    ------
    CurvatureError
        PyTorch reports an operation without a double backward (or without forward-mode AD).
    """
    with sdpa_kernel(SDPBackend.MATH):
        try:
            yield
        except (RuntimeError, NotImplementedError) as exc:
            found = _NO_SECOND_DERIVATIVE.search(str(exc))
            if found is None:
                raise
            if found.group(1) is not None:
                base = found.group(1).removeprefix("aten::").removesuffix("_backward")
                problem, fix = (f"{base} has no double backward ({found.group(1)} is not differentiable)",
                                "replace it with a twice-differentiable formulation")
            else:
                problem, fix = f"{found.group(2) or found.group(4)} has no forward-mode derivative", forward_fix
            raise CurvatureError(f"{kind} products by {mode!r} need derivatives that PyTorch {torch.__version__} "
                                 f"lacks: {problem}; {fix}") from None
