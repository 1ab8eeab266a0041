"""Figures drawn from result objects: matplotlib (publication) and plotly (interactive HTML).

Every figure has a ``*_figure`` function returning a :class:`matplotlib.figure.Figure` and a
``*_plotly`` function returning a :class:`plotly.graph_objects.Figure`, built from the same
result object (:data:`FIGURES` lists them; :func:`draw` picks the one for a result's type);
:func:`save` writes PNG/PDF/SVG or standalone offline HTML, and
:class:`Report` assembles an HTML page. Global matplotlib state is never changed.
"""
from .curvature import (
                        curvature_path_figure,
                        curvature_path_plotly,
                        eigen_line_figure,
                        eigen_line_plotly,
                        spectral_density_figure,
                        spectral_density_plotly,
)
from .decomposition import (
                            averaging_figure,
                            averaging_plotly,
                            decomposition_bars_figure,
                            decomposition_bars_plotly,
                            decomposition_figure,
                            decomposition_plotly,
)
from .fl_curves import fl_curves_figure, fl_curves_plotly
from .groups import barrier_matrix_figure, barrier_matrix_plotly, group_size_figure, group_size_plotly
from .html import plotly_bundle, plotly_div, save, to_standalone_html
from .merging import merge_figure, merge_plane_figure, merge_plane_plotly, merge_plotly
from .paths import path_figure, path_plotly
from .planes import plane_figure, plane_plotly
from .registry import FIGURES, FigureKind, draw, kind_of
from .report import Report
from .sharpness import sharpness_figure, sharpness_plotly
from .simplex import simplex_figure, simplex_plotly, simplex_projection
from .style import OKABE_ITO, ROLES, role_of, style_context
from .tracking import tracking_figure, tracking_plotly

__all__ = [
    "FIGURES", "FigureKind", "draw", "kind_of", "OKABE_ITO", "ROLES", "Report", "averaging_figure", "averaging_plotly",
    "barrier_matrix_figure",
    "barrier_matrix_plotly", "curvature_path_figure", "curvature_path_plotly", "decomposition_bars_figure",
    "decomposition_bars_plotly", "decomposition_figure",
    "decomposition_plotly", "eigen_line_figure", "eigen_line_plotly", "fl_curves_figure", "fl_curves_plotly",
    "group_size_figure", "group_size_plotly", "merge_figure", "merge_plane_figure", "merge_plane_plotly",
    "merge_plotly", "path_figure", "path_plotly", "plane_figure", "plane_plotly",
    "plotly_bundle", "plotly_div", "role_of", "save", "simplex_figure", "simplex_plotly", "simplex_projection",
    "spectral_density_figure", "spectral_density_plotly", "style_context", "to_standalone_html",
    "sharpness_figure", "sharpness_plotly", "tracking_figure", "tracking_plotly",
]
