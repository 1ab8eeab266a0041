"""Geometry of the probability simplex used by FLOCO and LSS.

Coordinates live on the standard simplex ``{a in R^n : a >= 0, sum(a) = 1}`` with ``n`` the
number of vertices (endpoints / pool members). Every sampler takes an explicit
``torch.Generator``; nothing here touches the global RNG.
"""
from __future__ import annotations

import math

import torch

from landscape.infra.errors import ConfigError

SUBREGION_SAMPLERS = ("exact", "reference")
Z_GRID = (1e-4, 1.0, 1000)  # FLOCO's simplex scales z (reference implementation)
MIN_DISTANCE = 1e-4         # distances clamped in the Riesz energy (reference implementation)


def project_to_simplex(v: torch.Tensor, z: float = 1.0) -> torch.Tensor:
    """Euclidean projection of each row of ``v`` onto ``{b >= 0, sum(b) = z}``.

    FLOCO Eq. 9 (Blondel, Fujino & Ueda 2014): ``b = max(v - lam, 0)`` with the threshold
    ``lam`` found exactly by sorting (the paper's bisection converges to the same point).
    ``v`` has shape ``(..., n)``; the result has the same shape and dtype.
    """
    if z <= 0:
        raise ConfigError(f"simplex scale z must be positive, got {z}")
    u, _ = torch.sort(v, dim=-1, descending=True)
    cssv = torch.cumsum(u, dim=-1) - z
    ranks = torch.arange(1, v.shape[-1] + 1, dtype=v.dtype, device=v.device)
    positive = (u - cssv / ranks) > 0
    # the largest rank r with u_r - (sum_{i<=r} u_i - z) / r > 0 (rank 1 always qualifies)
    r = (positive * ranks).amax(dim=-1, keepdim=True)
    lam = torch.gather(cssv, -1, r.long() - 1) / r
    return torch.clamp(v - lam, min=0.0)


def simplex_centre(n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The barycentre ``(1/n, ..., 1/n)`` (FLOCO's global-model coordinate, Sec. 3.4)."""
    return torch.full((n,), 1.0 / n, dtype=dtype)


def sample_uniform_simplex(n: int, count: int, generator: torch.Generator,
                           concentration: float = 1.0) -> torch.Tensor:
    """``count`` points from Dirichlet(concentration * 1_n); ``concentration=1`` is uniform.

    Uniform case uses normalised Exp(1) variables (FLOCO Eq. 7, LSS Sec. 3.3.1); other
    concentrations use normalised Gamma variables (Marsaglia-Tsang, seeded by ``generator``).
    """
    if n < 1 or count < 0:
        raise ConfigError(f"need n >= 1 vertices and count >= 0, got n={n}, count={count}")
    if concentration <= 0:
        raise ConfigError(f"Dirichlet concentration must be positive, got {concentration}")
    if concentration == 1.0:
        u = torch.rand(count, n, generator=generator, dtype=torch.float64)
        g = -torch.log1p(-u)  # Exp(1); 1-u in (0, 1] avoids log(0)
    else:
        g = _gamma(torch.full((count, n), float(concentration), dtype=torch.float64), generator)
    return (g / g.sum(dim=1, keepdim=True)).float()


def _gamma(shape_param: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Gamma(k, 1) samples by Marsaglia & Tsang (2000), seeded from ``generator`` only."""
    k = shape_param
    boost = k < 1
    d = torch.where(boost, k + 1, k) - 1.0 / 3.0
    c = 1.0 / torch.sqrt(9.0 * d)
    out = torch.empty_like(k)
    todo = torch.ones_like(k, dtype=torch.bool)
    while bool(todo.any()):
        x = torch.randn(k.shape, generator=generator, dtype=k.dtype)
        u = torch.rand(k.shape, generator=generator, dtype=k.dtype)
        v = (1 + c * x) ** 3
        ok = (v > 0) & (torch.log(u.clamp_min(1e-300)) < 0.5 * x ** 2 + d - d * v
                        + d * torch.log(v.clamp_min(1e-300)))
        take = ok & todo
        out[take] = (d * v)[take]
        todo &= ~ok
    u = torch.rand(k.shape, generator=generator, dtype=k.dtype)
    return torch.where(boost, out * u ** (1.0 / k), out)


def sample_subregion(centre: torch.Tensor, rho: float, count: int, generator: torch.Generator,
                     method: str = "exact", max_batches: int = 1000) -> torch.Tensor:
    """``count`` points of FLOCO's subregion ``R_k = {a in simplex : |a - centre|_1 <= rho}``.

    ``method="exact"`` (default) is uniform on ``R_k`` (Sec. 3.1 asks for uniform samples).
    A zero-sum step ``d = p - q`` splits into its positive part ``p`` (on a set ``S``) and
    negative part ``q`` (on the complement ``C``) with equal mass ``s = |d|_1 / 2``. For a
    fixed sign pattern the uniform measure factorises into ``s`` with density
    ``~ s^(n-2)`` on ``[0, rho/2]`` and independent uniform (Dirichlet(1)) shapes of ``p``
    and ``q``; the pattern with ``|C| = j`` has volume ``~ 1/((n-j-1)! (j-1)!)``. Negative
    coordinates must lie where ``centre > 0``, so only those patterns are drawn; points with
    ``q_i > centre_i`` (outside the simplex) are rejected. This is exact, and the
    acceptance is 1 when every positive ``centre_i >= rho/2``.
    ``method="reference"`` reproduces the authors' sampler: ``centre + r u`` with
    ``u = v/|v|_1``, ``v ~ U(-1,1)^n`` and ``r ~ U(0, rho)``; it is neither uniform nor
    confined to the simplex (its points need not sum to 1 or be non-negative).
    """
    centre = centre.detach().to(torch.float64).flatten()
    n = centre.numel()
    if rho <= 0:
        raise ConfigError(f"subregion radius rho must be positive, got {rho}")
    if n < 2:
        raise ConfigError(f"a simplex subregion needs at least 2 vertices, got {n}")
    if method == "reference":
        v = torch.rand(count, n, generator=generator, dtype=torch.float64) * 2 - 1
        u = v / v.abs().sum(dim=1, keepdim=True)
        r = torch.rand(count, 1, generator=generator, dtype=torch.float64) * rho
        return (centre + r * u).float()
    if method != "exact":
        raise ConfigError(f"unknown subregion sampler {method!r}; use one of {SUBREGION_SAMPLERS}")
    support = torch.nonzero(centre > 0).flatten()
    m = support.numel()
    sizes = torch.arange(1, min(m, n - 1) + 1, dtype=torch.float64)
    log_weight = (torch.lgamma(torch.tensor(m + 1.0)) - torch.lgamma(sizes + 1) - torch.lgamma(m - sizes + 1)
                  - torch.lgamma(n - sizes) - torch.lgamma(sizes))
    size_prob = torch.softmax(log_weight, dim=0)
    batch = max(64, 2 * count)
    kept: list[torch.Tensor] = []
    have = 0
    for _ in range(max_batches):
        j = torch.multinomial(size_prob, batch, replacement=True, generator=generator) + 1
        rank = torch.argsort(torch.rand(batch, m, generator=generator, dtype=torch.float64), dim=1)
        negative = torch.zeros(batch, n, dtype=torch.bool)
        negative[:, support] = rank < j[:, None]
        e = -torch.log1p(-torch.rand(batch, n, generator=generator, dtype=torch.float64))
        p = torch.where(negative, 0.0, e)
        q = torch.where(negative, e, 0.0)
        s = 0.5 * rho * torch.rand(batch, 1, generator=generator, dtype=torch.float64) ** (1.0 / (n - 1))
        points = centre + s * (p / p.sum(dim=1, keepdim=True) - q / q.sum(dim=1, keepdim=True))
        ok = (points >= 0).all(dim=1)
        kept.append(points[ok])
        have += int(ok.sum())
        if have >= count:
            return torch.cat(kept)[:count].float()
    raise ConfigError(f"drew fewer than {count} points of the L1 ball of radius {rho} around "
                      f"{centre.tolist()} inside the simplex in {max_batches} batches; "
                      "the centre must be a point of the simplex (non-negative, summing to 1)")


# ------------------------------------------- FLOCO's client representation (Sec. 3.2)
def pca_scores(signals: torch.Tensor, n_components: int) -> torch.Tensor:
    """PCA coordinates ``(K, n_components)`` of the rows of ``signals`` (centred SVD).

    Each principal axis is signed so that its largest-magnitude entry is positive; when
    fewer components exist (``K - 1`` or the signal dimension), the rest are zero.
    """
    x = signals.detach().double()
    x = x - x.mean(dim=0, keepdim=True)
    u, s, vh = torch.linalg.svd(x, full_matrices=False)
    lead = vh.abs().argmax(dim=1)
    signs = torch.sign(vh[torch.arange(len(vh)), lead])
    signs[signs == 0] = 1.0
    k = min(n_components, len(s))
    out = torch.zeros(len(x), n_components, dtype=torch.float64)
    out[:, :k] = (u[:, :k] * s[:k]) * signs[:k]
    return out


def riesz_energy(points: torch.Tensor) -> torch.Tensor:
    """``log(mean_{i<j} 1 / max(|p_i - p_j|_2, 1e-4)^2)`` for point sets ``(..., K, E)``.

    Eq. 8 with s = 2, up to the constant ``log(#pairs)``.
    """
    k = points.shape[-2]
    i, j = torch.triu_indices(k, k, offset=1)
    d = (points[..., i, :] - points[..., j, :]).norm(dim=-1).clamp_min(MIN_DISTANCE)
    return torch.log((d ** -2).sum(dim=-1)) - math.log(len(i))


def assign_points(kappa: torch.Tensor, grid: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, float, torch.Tensor, torch.Tensor]:
    """Client points ``alpha_k = proj_z(kappa_k) / z`` at the ``z`` of least Riesz energy.

    Returns ``(points (K, E), z, energy over the grid, grid)``; non-finite energies are skipped.
    """
    if kappa.shape[0] < 2:
        raise ConfigError("FLOCO's subregion assignment needs at least 2 clients")
    grid = torch.linspace(*Z_GRID, dtype=torch.float64) if grid is None else grid.double()
    candidates = project_to_simplex(kappa.double()[None] / grid[:, None, None])  # proj_z(k)/z
    energy = riesz_energy(candidates)
    finite = torch.isfinite(energy)
    if not bool(finite.any()):
        raise ConfigError("FLOCO: the Riesz energy is not finite for any simplex scale")
    best = int(torch.where(finite, energy, torch.inf).argmin())
    return candidates[best], float(grid[best]), energy, grid
