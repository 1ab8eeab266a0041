"""Sets of points in parameter space, materialised a chunk at a time.

A path, a plane grid or a group of models is ``origin + coeffs @ directions``: the flat
vectors of a chunk are built only when that chunk is evaluated, so a 101x101 plane of a
large model never exists in memory at once.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from ..infra.errors import WeightOverflowError
from .params import vector_digest


def check_headroom(vec: torch.Tensor, dtype: torch.dtype, source: str) -> None:
    """Refuse a model whose weights leave no room for point arithmetic in ``dtype``.

    Points of paths, planes and groups are built in the evaluation dtype from differences of
    models and coordinates in parameter-norm units (distances between models). These stay finite
    when every model's norm is below half of the dtype's largest value, which this checks.

    Parameters
    ----------
    vec
        The model's flat vector (any floating dtype; measured in float64).
    dtype
        The evaluation dtype.
    source
        What the model came from (a checkpoint path, a class name), for the message.

    Raises
    ------
    WeightOverflowError
        Naming ``source``, its largest ``|w|`` and the dtype.
    """
    limit = torch.finfo(dtype).max / 2
    norm = float(vec.double().norm())
    if norm <= limit:
        return
    name = str(dtype).removeprefix("torch.")
    wider = ", or evaluate with dtype='float64'" if dtype != torch.float64 else ""
    raise WeightOverflowError(
        f"{source}: weights so large (max |w| = {float(vec.double().abs().max()):.3g}, norm {norm:.3g}) that path "
        f"and plane arithmetic overflows {name} (distances between models must stay below {limit:.3g}); such "
        f"weights come from a diverged run: use an earlier checkpoint{wider}")


@dataclass(frozen=True)
class PointSet:
    """Points ``origin + coeffs[i] @ directions`` (coeffs (P, k), directions (k, D)).

    With ``index`` (a parameter subset, :mod:`landscape.space.subsets`), the directions have
    the subset's length S and move only the entries ``index`` of the full-size ``origin``:
    point i is ``origin`` with ``origin[index] + coeffs[i] @ directions`` written at ``index``.

    Attributes
    ----------
    origin
        Flat vector ``(D,)`` shared by every point (full size).
    directions
        ``(k, D)`` directions (one row each), or ``(k, S)`` with ``index``.
    coeffs
        ``(P, k)`` coefficients of the P points (float64).
    index
        None (the directions are full size), or the ``(S,)`` int64 positions the directions move.
    """

    origin: torch.Tensor
    directions: torch.Tensor
    coeffs: torch.Tensor
    index: torch.Tensor | None = None

    @staticmethod
    def explicit(vectors: torch.Tensor) -> "PointSet":
        """The given (P, D) vectors themselves.

        Parameters
        ----------
        vectors
            ``(P, D)`` flat vectors, one per point.

        Returns
        -------
        PointSet
            Origin 0, the vectors as directions and the identity as coefficients.
        """
        p, d = vectors.shape
        return PointSet(torch.zeros(d, dtype=vectors.dtype), vectors,
                        torch.eye(p, dtype=torch.float64))

    @staticmethod
    def line(a: torch.Tensor, b: torch.Tensor, alphas: torch.Tensor, index: torch.Tensor | None = None
             ) -> "PointSet":
        """``(1 - alpha) a + alpha b`` for each alpha (the linear path of FedGuCci Eq. 3/4).

        Parameters
        ----------
        a, b
            Flat vectors ``(D,)`` of the endpoints (alpha = 0 and alpha = 1).
        alphas
            Interpolation coefficients, any shape (flattened).
        index
            Positions of a parameter subset: only they move (``b`` is read there only).

        Returns
        -------
        PointSet
            Origin ``a``, one direction ``b - a`` (on ``index``), one coefficient per alpha.
        """
        diff = b - a if index is None else b[index] - a[index]
        return PointSet(a, diff.unsqueeze(0), alphas.reshape(-1, 1).to(torch.float64), index)

    def __len__(self) -> int:
        return int(self.coeffs.shape[0])

    def chunk(self, start: int, stop: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """Flat vectors of points ``start:stop`` on ``device``.

        Each vector is ``origin + sum_k c_k d_k`` over its non-zero coefficients, added in
        the order of the directions with elementwise operations, so its bits depend only on
        the point, never on which other points share the chunk (a matrix product's rounding
        can change with the number of rows). Shards, resumed runs and uninterrupted runs
        therefore evaluate identical vectors.

        Parameters
        ----------
        start, stop
            Range of point indices (Python slice semantics).
        device
            Where the vectors are built.
        dtype
            Their dtype (the arithmetic runs in it).

        Returns
        -------
        torch.Tensor
            ``(stop - start, D)`` flat vectors.
        """
        moving = self.moving(start, stop, device, dtype)
        if self.index is None:
            return moving
        full = self.origin.to(device, dtype).expand(len(moving), -1).clone()
        full[:, self.index.to(device)] = moving
        return full

    def moving(self, start: int, stop: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """The entries of points ``start:stop`` that the directions move.

        With a subset ``index``, only its ``S`` entries (the rest of every point is
        ``origin``); else the whole vectors. The arithmetic is :meth:`chunk`'s, so these are
        bit for bit the entries :meth:`chunk` writes.

        Parameters
        ----------
        start, stop, device, dtype
            As for :meth:`chunk`.

        Returns
        -------
        torch.Tensor
            ``(stop - start, S)`` with ``index``, else ``(stop - start, D)``.
        """
        coeffs = self.coeffs[start:stop]
        origin = self.origin.to(device, dtype)
        if self.index is not None:
            origin = origin[self.index.to(device)]
        out = origin.expand(len(coeffs), -1).clone()
        dirs = self.directions.to(device, dtype)
        scales = coeffs.to(dtype).tolist()
        for row, (point, scale) in enumerate(zip(coeffs.tolist(), scales)):
            for k, c in enumerate(point):
                if c:
                    out[row].add_(dirs[k] * scale[k])
        return out

    def rows(self, start: int, stop: int, *, keep_directions: bool = True) -> "PointSet":
        """Points ``start:stop`` of this set (a shard of it).

        Parameters
        ----------
        start, stop
            The run of points.
        keep_directions
            Keep every direction (the shard's points are then built exactly as the whole
            set's); False drops the directions none of these points uses (less to send to a
            worker; the vectors are the same, since a zero coefficient adds nothing).

        Returns
        -------
        PointSet
        """
        coeffs = self.coeffs[start:stop]
        if keep_directions:
            return PointSet(self.origin, self.directions, coeffs, self.index)
        used = (coeffs != 0).any(0)
        return PointSet(self.origin, self.directions[used], coeffs[:, used], self.index)

    def digest(self) -> str:
        """SHA-256 of the origin, directions, coefficients and subset index (names the set in caches and shards).

        Returns
        -------
        str
            Hexadecimal digest.
        """
        h = hashlib.sha256()
        for t in (self.origin, self.directions, self.coeffs):
            h.update(vector_digest(t).encode())
        if self.index is not None:  # a subset's points never share a key with a full set's
            h.update(b"subset:" + vector_digest(self.index).encode())
        return h.hexdigest()
