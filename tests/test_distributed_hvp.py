"""Curvature products of one model split over 2 gloo worker processes equal one process's.

Tolerance of the products, fixed from the arithmetic before measuring: each rank computes each of
its batches' shares ``t_b = (1/N) sum_{i in b} H_i v`` with the single-process code on the same
batch, the same ``1/N``, product mode and thread count (1), so every ``t_b`` is bitwise the one
process's; only the float32 sum over the ``B`` batches runs in another order (each rank sums its
block in float32, the ranks' sums are added in float64 and rounded once to float32). Each order
errs by at most ``(B - 1) u sum_b |t_b|`` per entry (``u`` the float32 unit roundoff), so the two
results differ by at most ``2 B u sum_b |t_b|``, entry by entry.

Top eigenvalues: both runs use Lanczos with the same seed to relative residual ``tol``; a converged
Ritz value lies within its residual of an eigenvalue of its operator, and the two operators differ
by the rounding above (about ``1e-7`` relative, far below ``tol``), so the two top eigenvalues
differ by at most ``2 tol |lambda|``.

Every call passes ``timeout=`` (and the tests a pytest timeout), so a hang fails instead of waiting.
"""
from __future__ import annotations

import functools
import multiprocessing
import os
import signal

import pytest
import torch
import torch.distributed as dist

from landscape.curvature.at_point import curvature_operator
from landscape.curvature.distributed import distributed_operator
from landscape.curvature.distributed_launch import distributed_curvature, distributed_hessian_eigenvalues
from landscape.curvature.functions import eigen_result, hessian_eigenvalues
from landscape.evaluation.evaluator import Evaluator
from landscape.infra.errors import ConfigError, DistributedError
from landscape.results.curvature import HessianEigen

from conftest import FLOAT32_UNIT_ROUNDOFF, make_bn_cnn, make_mlp

WORKERS = 2
TIMEOUT = 90.0  # seconds for one launched computation (spawning 2 workers takes 5 to 15 s here)
TOL, MAX_ITER = 1e-4, 200  # Lanczos's relative residual and product budget
pytestmark = pytest.mark.timeout(240)


# ------------------------------------------------------------------ run on every rank (picklable)
def _products_and_top(op, vs: torch.Tensor, tol: float) -> tuple[torch.Tensor, HessianEigen]:
    """Products of every vector gathered from every rank, (ranks, vectors, dim), and Lanczos's top eigenpair."""
    mine = torch.stack([op.matvec(v) for v in vs])
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    top = eigen_result(op, k=1, tol=tol, max_iter=MAX_ITER, seed=3, method="lanczos", return_vectors=False)
    return torch.stack(everyone), top


def _fail_on_rank_one(op) -> None:
    if dist.get_rank() == 1:
        raise ValueError("rank one refuses")
    op.matvec(torch.zeros(op.size))  # rank 0 waits in the collective for its failed peer


def _killed_on_rank_one(op) -> None:
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer would
    op.matvec(torch.zeros(op.size))  # rank 0's collective then fails on the closed connection


# ------------------------------------------------------------------ problems
def _mlp_problem() -> tuple[torch.nn.Module, Evaluator]:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(300, 64, generator=g), torch.randint(0, 10, (300,), generator=g)
    model = make_mlp()
    return model, Evaluator(model, (x, y), batch_size=64, progress=False)  # 5 batches, the last of 44


def _cnn_problem() -> tuple[torch.nn.Module, Evaluator]:
    g = torch.Generator().manual_seed(1)
    model = make_bn_cnn()
    for m in model.modules():  # non-trivial running statistics, used as they are (eval mode)
        if isinstance(m, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d)):
            m.running_mean.copy_(0.3 * torch.randn(m.num_features, generator=g))
            m.running_var.copy_(0.5 + torch.rand(m.num_features, generator=g))
    x, y = torch.randn(200, 1, 8, 8, generator=g), torch.randint(0, 10, (200,), generator=g)
    return model, Evaluator(model, (x, y), batch_size=48, progress=False)  # 5 batches, the last of 8


@pytest.mark.parametrize("problem", [_mlp_problem, _cnn_problem], ids=["mlp", "bn_cnn"])
def test_products_and_top_eigenvalue_equal_one_process(problem):
    model, ev = problem()
    op = curvature_operator(model, ev)
    vs = torch.randn(3, op.size, generator=torch.Generator().manual_seed(2))
    single = torch.stack([op.matvec(v) for v in vs])
    magnitude = torch.stack([sum(op.batch_product(i, x, y, v).abs() for i, (x, y) in enumerate(ev.batches))
                             for v in vs])
    bound = 2 * len(ev.batches) * FLOAT32_UNIT_ROUNDOFF * magnitude
    top = hessian_eigenvalues(model, ev, k=1, tol=TOL, max_iter=MAX_ITER, seed=3)

    ranks, spread = distributed_curvature(functools.partial(_products_and_top, vs=vs, tol=TOL), model, ev,
                                          workers=WORKERS, timeout=TIMEOUT)

    assert ranks.shape == (WORKERS, *single.shape)
    assert torch.equal(ranks[0], ranks[1])  # every rank holds exactly the same full-data product
    assert bool(((ranks[0] - single).abs() <= bound).all()), float((ranks[0] - single).abs().max())
    assert float(single.abs().max()) > 1e-3  # the products are not trivially zero
    assert top.converged and spread.converged
    assert abs(spread.values[0] - top[0]) <= 2 * TOL * abs(top[0])


def _new_children(before: set) -> list:
    """Child processes started since ``before`` (other tests may keep a loky pool alive)."""
    return [p for p in multiprocessing.active_children() if p not in before]


def test_failed_worker_is_one_line_error_and_no_worker_survives():
    model, ev = _mlp_problem()
    before = set(multiprocessing.active_children())
    with pytest.raises(DistributedError, match=r"^worker 1 of 2 failed: ValueError: rank one refuses$"):
        distributed_curvature(_fail_on_rank_one, model, ev, workers=WORKERS, timeout=TIMEOUT)
    assert _new_children(before) == []


def test_a_killed_worker_is_named_as_the_cause_and_no_worker_survives():
    model, ev = _mlp_problem()
    before = set(multiprocessing.active_children())
    with pytest.raises(DistributedError, match=r"^worker 1 of 2 (was killed by signal 9|died \(exit code -9\))"):
        distributed_curvature(_killed_on_rank_one, model, ev, workers=WORKERS, timeout=TIMEOUT)
    assert _new_children(before) == []


def test_timeout_stops_every_worker():
    model, ev = _mlp_problem()
    before = set(multiprocessing.active_children())
    with pytest.raises(DistributedError, match=r"did not finish within timeout=0\.5 s"):
        distributed_hessian_eigenvalues(model, ev, workers=WORKERS, timeout=0.5)
    assert _new_children(before) == []


def test_refusals_before_any_process_starts():
    model, ev = _mlp_problem()
    before = set(multiprocessing.active_children())
    with pytest.raises(ConfigError, match="no torch.distributed process group"):
        distributed_operator(model, ev)
    with pytest.raises(ConfigError, match="kind='fisher' draws its labels"):
        distributed_curvature(_fail_on_rank_one, model, ev, kind="fisher")
    with pytest.raises(ConfigError, match=r"^curvature kind 'empirical_fisher' has no option 'per_sampl' \(did you"):
        distributed_curvature(_fail_on_rank_one, model, ev, kind="empirical_fisher", kind_options={"per_sampl": "vmap"})
    with pytest.raises(ConfigError, match=r"^curvature kind 'ggn' has no option 'hvp'; it takes none$"):
        distributed_hessian_eigenvalues(model, ev, kind="ggn", hvp="retained")
    with pytest.raises(ConfigError, match="has 5 batch\\(es\\), fewer than the 6 workers"):
        distributed_curvature(_fail_on_rank_one, model, ev, workers=6)
    with pytest.raises(ConfigError, match="max_iter"):
        distributed_hessian_eigenvalues(model, ev, max_iter=0)
    with pytest.raises(ConfigError, match="compute cannot be sent to the workers"):
        distributed_curvature(lambda op: None, model, ev)
    assert _new_children(before) == []


def test_kind_options_pass_through_a_process_group(tmp_path):
    """In a group of one process (no worker started): the kind's options reach the local operator, "auto" resolved."""
    model, ev = _mlp_problem()
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        batched = distributed_operator(model, ev, kind="empirical_fisher", kind_options={"per_sample": "jvp-vjp"})
        assert batched.mode == "jvp-vjp" and distributed_operator(model, ev, kind="empirical_fisher").mode == "vmap"
        v = torch.randn(batched.size, generator=torch.Generator().manual_seed(4))
        alone = curvature_operator(model, ev, kind="empirical_fisher", kind_options={"per_sample": "jvp-vjp"})
        assert torch.equal(batched.matvec(v), alone.matvec(v))  # one rank: the same batches, the same sum
        hessian = distributed_operator(model, ev, kind_options={"hvp": "auto"})
        assert hessian.mode == curvature_operator(model, ev).mode  # "auto" chosen on the whole data
        assert distributed_operator(model, ev, hvp="reverse-over-reverse").mode == "reverse-over-reverse"
    finally:
        dist.destroy_process_group()
