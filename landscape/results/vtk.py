"""A plane's loss surface as a VTK legacy file, for ParaView and other 3-D viewers.

:func:`write_plane_vtk` (also :meth:`PlaneResult.to_vtk <landscape.results.PlaneResult.to_vtk>`)
writes the legacy ASCII format (``# vtk DataFile Version 3.0``), a ``STRUCTURED_GRID`` of
``len(x) x len(y) x 1`` points ordered with ``x`` varying fastest (the C order of the result's
``(len(y), len(x))`` arrays). Point ``(i, j)`` is ``(x[j], y[i], loss[i, j])``, or
``(x[j], y[i], 0)`` with ``flat=True`` (then Warp By Scalar lifts it by any scale factor). Point
scalars:

* ``loss``: the loss;
* ``accuracy``: the accuracy (left out when no accuracy is finite: a regression loss);
* ``finite``: 1 where the values written are the computed ones, 0 where one was replaced.

VTK's legacy readers do not all parse ``nan`` or ``inf``, so none is written: a non-finite loss
(height and scalar) is replaced by the largest finite loss of the grid and a non-finite accuracy
by 0, and such points get ``finite = 0`` (ParaView: Filters > Threshold on ``finite`` between 1
and 1 removes them). Numbers are written with 17 significant digits, so float64 values read back
exactly. The file is written with :func:`landscape.infra.files.write_text`: atomically and never
through a symbolic link.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..infra.errors import ConfigError
from ..infra.files import write_text

if TYPE_CHECKING:
    from .geometry import PlaneResult

#: First line of every file written here (the legacy format's version line).
VTK_HEADER = "# vtk DataFile Version 3.0"


def _numbers(values: np.ndarray, per_line: int) -> list[str]:
    flat = [repr(float(v)) for v in np.asarray(values, dtype=np.float64).reshape(-1)]
    return [" ".join(flat[i:i + per_line]) for i in range(0, len(flat), per_line)]


def _scalars(name: str, values: np.ndarray) -> list[str]:
    return [f"SCALARS {name} double 1", "LOOKUP_TABLE default", *_numbers(values, 9)]


def plane_vtk_text(plane: "PlaneResult", *, flat: bool = False) -> str:
    """The VTK legacy ASCII text of a plane (see the module's documentation for its layout).

    Parameters
    ----------
    plane
        The plane.
    flat
        Put every point at height 0 instead of its loss.

    Returns
    -------
    str
        The file's content.

    Raises
    ------
    ConfigError
        If no loss of the grid is finite (there is no surface to write).
    """
    loss = np.asarray(plane.loss, dtype=np.float64)
    finite = np.isfinite(loss)
    if not finite.any():
        raise ConfigError("every loss of the plane is non-finite: there is no surface to export")
    loss = np.where(finite, loss, loss[finite].max())
    gx, gy = np.meshgrid(np.asarray(plane.x, dtype=np.float64), np.asarray(plane.y, dtype=np.float64))
    points = np.stack([gx.ravel(), gy.ravel(), np.zeros(loss.size) if flat else loss.ravel()], axis=1)
    kind = dict(plane.spec).get("kind", "plane")
    lines = [VTK_HEADER,
             f"landscape-fl {kind}: x along u, y along v, {'z = 0' if flat else 'z = loss'}; "
             "non-finite values replaced, see the finite scalar",
             "ASCII", "DATASET STRUCTURED_GRID", f"DIMENSIONS {loss.shape[1]} {loss.shape[0]} 1",
             f"POINTS {loss.size} double", *_numbers(points, 3),
             f"POINT_DATA {loss.size}", *_scalars("loss", loss)]
    accuracy = np.asarray(plane.accuracy, dtype=np.float64)
    if np.isfinite(accuracy).any():
        lines += _scalars("accuracy", np.where(np.isfinite(accuracy), accuracy, 0.0))
        finite &= np.isfinite(accuracy)
    lines += _scalars("finite", finite.astype(np.float64))
    return "\n".join(lines) + "\n"


def write_plane_vtk(plane: "PlaneResult", path: str | os.PathLike, *, flat: bool = False) -> Path:
    """Write a plane as a VTK legacy ASCII structured grid (``.vtk``) that ParaView opens.

    Parameters
    ----------
    plane
        The plane.
    path
        The ``.vtk`` file to write (atomically; a symbolic link at ``path`` or as its folder is
        refused).
    flat
        Put every point at height 0 (for ParaView's Warp By Scalar) instead of its loss.

    Returns
    -------
    Path
        ``path``.

    Raises
    ------
    ConfigError
        If ``path`` does not end in ``.vtk`` or no loss of the grid is finite.
    FileWriteError
        If ``path`` or its folder is a symbolic link, or the write failed.
    """
    path = Path(path)
    if path.suffix.lower() != ".vtk":
        raise ConfigError(f"{path}: a VTK legacy file ends in .vtk")
    return write_text(path, plane_vtk_text(plane, flat=flat))
