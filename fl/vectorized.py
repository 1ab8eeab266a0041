"""Vectorised client training: many clients of one small model trained at once.

The same local SGD as :func:`fl.algorithms.base.local_sgd`, for ``K`` clients in one
``torch.func.vmap`` forward pass and one backward pass per step instead of ``K`` Python loops:

* every client draws its mini-batch schedule from its own generator exactly as the
  sequential back end does (``minibatches(n_k, B, E, ctx.generator)``), so both back ends
  see the same batches in the same order;
* clients have different data sizes, so different numbers of steps and a short last batch
  per epoch: step ``t`` gathers a ``(K, B)`` block of sample indices padded with a valid
  sample and a 0/1 weight; the loss of client ``k`` is ``sum_i w_i ce_i / n_{k,t}`` (the
  mean over its real samples, as ``F.cross_entropy``); clients are sorted by their number
  of steps, so the clients still training at step ``t`` are a prefix of the stacked
  parameters, and only that prefix is computed and updated (in place).

Padding is exact only for models that treat samples independently, so BatchNorm (batch
statistics) and dropout (random masks the sequential back end draws from another stream)
are refused, as are algorithms that do not declare ``vectorizable = True`` (their client
update is not local SGD plus a batch-independent ``extra_loss``, which runs here through
``vmap`` as it runs in the sequential back end); :func:`unsupported_reason` says why. Results
equal the sequential back end's to floating-point tolerance (reduction order differs), not bit for bit. One difference
remains by design: a trainable parameter the loss does not use gets a zero gradient here
(the sequential back end skips it), which changes it only under weight decay.

Speed: a round takes as many stacked steps as its largest client takes steps (its critical
path), whatever the other clients' sizes; what it saves is the per-step cost of the others.
Its speed-up over the sequential back end is therefore at most ``sum_k S_k / max_k S_k``
(``S_k`` client ``k``'s steps) times the ratio of a plain step's cost to a stacked one's.
:func:`choose_backend` is the rule ``backend="auto"`` applies.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, vmap

from .algorithms.base import Algorithm, ClientUpdate, LocalContext, minibatches
from .outputs import logits_of


def unsupported_reason(alg: Algorithm, module: nn.Module) -> str | None:
    """Why the vectorised back end cannot train ``module`` with ``alg``.

    Parameters
    ----------
    alg : Algorithm
        The run's algorithm (a wrapper reports its base's flag).
    module : nn.Module
        The training module.

    Returns
    -------
    str or None
        The reason, or None when it can.
    """
    dtypes = {p.dtype for p in module.parameters() if p.requires_grad}
    if len(dtypes) > 1:
        return (f"the trainable parameters have several dtypes ({', '.join(sorted(map(str, dtypes)))}); "
                "the clients' parameters are stacked in one matrix of one dtype")
    if not alg.vectorizable:
        return (f"algorithm {alg.label!r} does not declare vectorizable = True (its client update is not "
                "local SGD plus a loss term independent of the mini-batch)")
    for name, m in module.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            return f"the model has BatchNorm ({name}); padded mini-batches would change its statistics"
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0:
            return f"the model has dropout ({name}), whose random masks cannot match the sequential back end"
    return None


def _schedule(contexts: Sequence[LocalContext], offsets: Sequence[int]
              ) -> tuple[Tensor, Tensor, Tensor, list[int]]:
    """The batch schedule of the vectorised clients.

    Indices (S, K, B) into the pooled data, weights (S, K, B), counts (S, K), and the
    number of clients still training at each step.

    ``contexts`` must be sorted by decreasing number of steps, so the clients training at
    step ``t`` are a prefix. Each client's batches come from its own generator, as in the
    sequential back end; padding entries point at sample 0 of the pool with weight 0.
    """
    per_client = [list(minibatches(len(c.y), c.batch_size, c.local_epochs, c.generator)) for c in contexts]
    steps = max((len(b) for b in per_client), default=0)
    width = max((len(i) for b in per_client for i in b), default=0)
    k = len(contexts)
    index = torch.zeros(steps, k, width, dtype=torch.int64)
    weight = torch.zeros(steps, k, width)
    count = torch.zeros(steps, k)
    for j, (batches, off) in enumerate(zip(per_client, offsets)):
        for t, idx in enumerate(batches):
            index[t, j, :len(idx)] = idx + off
            weight[t, j, :len(idx)] = 1.0
            count[t, j] = len(idx)
    active = [sum(len(b) > t for b in per_client) for t in range(steps)]
    return index, weight, count, active


_CONVOLUTIONS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)


def choose_backend(alg: Algorithm, module: nn.Module, device: torch.device) -> tuple[str, str]:
    """The back end ``backend="auto"`` trains a run with, and why.

    A fixed rule of the algorithm, the model and the device (never a timing, so the same
    configuration always takes the same back end and gives the same numbers):

    * ``"sequential"`` when :func:`unsupported_reason` names a reason;
    * ``"sequential"`` on a CPU when the model has a convolution: there ``vmap`` turns the
      ``K`` clients' convolutions into one grouped convolution, which the CPU kernels run
      5-8x slower than ``K`` plain ones (``benchmarks/bench_fl.py``, FedGuCci's CNN);
    * ``"vectorized"`` otherwise (GPUs, and fully connected models on a CPU, where one
      stacked step replaces ``K`` small ones).

    Parameters
    ----------
    alg : Algorithm
        The run's algorithm.
    module : nn.Module
        The training module.
    device : torch.device
        Where the run trains.

    Returns
    -------
    tuple[str, str]
        ``("sequential" | "vectorized", reason)``.
    """
    reason = unsupported_reason(alg, module)
    if reason is not None:
        return "sequential", reason
    if device.type == "cpu":
        conv = next((name for name, m in module.named_modules() if isinstance(m, _CONVOLUTIONS)), None)
        if conv is not None:
            return "sequential", f"a convolution ({conv}) on the CPU, where vmapped convolutions are slower than a loop"
    return "vectorized", f"{type(module).__name__} on {device.type}: the clients' steps are stacked"


def _num_steps(ctx: LocalContext) -> int:
    return ctx.local_epochs * -(-len(ctx.y) // ctx.batch_size)


def train_clients(alg: Algorithm, contexts: Sequence[LocalContext]) -> dict[int, ClientUpdate]:
    """Local SGD of every context's client at once (see the module docstring).

    Clients are sorted by their number of steps, so each step computes only the clients
    that still train: a prefix of the rows of one ``(K, P)`` matrix holding every client's
    ``P`` trainable parameters. A step is one vmapped forward pass of the prefix's models
    and one ordinary backward pass of the sum of their losses: client ``k``'s row of the
    gradient of ``sum_j L_j`` is ``grad L_k``, since ``L_j`` does not depend on row ``k``
    for ``j != k``. The update (weight decay, momentum, step) is then three operations on
    the matrix, whatever the number of parameter tensors.

    Parameters
    ----------
    alg : Algorithm
        A vectorisable algorithm; its ``extra_loss`` is added to each client's objective.
    contexts : Sequence[LocalContext]
        One per client; all share the round, the received model, ``lr``, ``local_epochs``,
        ``batch_size``, ``momentum`` and ``weight_decay`` (they do within an engine round).

    Returns
    -------
    dict[int, ClientUpdate]
        Client id -> update (state, sample count, ``train_loss``), equal to the sequential
        back end's to floating-point tolerance.
    """
    contexts = sorted(contexts, key=_num_steps, reverse=True)
    first = contexts[0]
    module = first.module
    module.train()
    device = first.device
    start = first.global_state
    names = [n for n, p in module.named_parameters() if p.requires_grad]
    shapes = [start[n].shape for n in names]
    numels = [start[n].numel() for n in names]
    flat = torch.cat([start[n].detach().to(device).reshape(-1) for n in names]).repeat(len(contexts), 1)
    fixed = {n: t.detach().to(device) for n, t in start.items() if n not in names}
    sizes = [len(c.y) for c in contexts]
    offsets = torch.tensor([0] + sizes[:-1]).cumsum(0).tolist()
    pool_x = torch.cat([c.x for c in contexts])
    pool_y = torch.cat([c.y for c in contexts])
    index, weight, count, active = _schedule(contexts, offsets)
    index, count = index.to(device), count.to(device)
    weight = weight.to(device, pool_x.dtype if pool_x.is_floating_point() else torch.float32)

    def client_objective(row: Tensor, x: Tensor, y: Tensor, w: Tensor, n: Tensor) -> tuple[Tensor, Tensor]:
        p = dict(zip(names, (t.view(s) for t, s in zip(row.split(numels), shapes))))
        logits = logits_of(functional_call(module, {**p, **fixed}, (x,)))
        loss = (F.cross_entropy(logits, y, reduction="none") * w).sum() / n
        extra = alg.extra_loss(first, p, x, y, logits)
        return (loss if extra is None else loss + extra), loss

    objectives = vmap(client_objective)
    momentum_buf = torch.zeros_like(flat)
    total = torch.zeros(len(contexts), dtype=torch.float64, device=device)
    lr, mom, wd = first.lr, first.momentum, first.weight_decay
    for t, m in enumerate(active):
        idx = index[t, :m]
        rows = flat[:m].detach().requires_grad_()
        objective, loss = objectives(rows, pool_x[idx], pool_y[idx], weight[t, :m], count[t, :m])
        (g,) = torch.autograd.grad(objective.sum(), rows)
        total[:m] += loss.detach().double() * count[t, :m].double()
        with torch.no_grad():
            d = g.add_(flat[:m], alpha=wd) if wd else g
            if mom:  # b = momentum * b + d; from b = 0 the first step gives b = d exactly
                d = momentum_buf[:m].mul_(mom).add_(d)
            flat[:m].add_(d, alpha=-lr)
    seen = count.sum(0).double().cpu()
    losses = (total.cpu() / seen.clamp(min=1)).tolist()
    trained = dict(zip(names, (t.view(len(contexts), *s) for t, s in zip(flat.split(numels, dim=1), shapes))))
    out: dict[int, ClientUpdate] = {}
    for j, ctx in sorted(enumerate(contexts), key=lambda jc: jc[1].client):
        state = {n: (trained[n][j].clone() if n in trained else fixed[n]) for n in start}
        out[ctx.client] = ClientUpdate(state, sizes[j], None, {"train_loss": losses[j]})
    return out
