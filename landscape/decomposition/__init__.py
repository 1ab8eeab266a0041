"""The IMA paper's bias-variance-covariance decomposition of a federated model's loss (``ima``), and what
averaging does to client models (``similarity``: averaging curves, linear CKA).
"""
from .ima import decompose, decompose_run
from .similarity import averaging_curve, cka_matrix, linear_cka

__all__ = ["averaging_curve", "cka_matrix", "decompose", "decompose_run", "linear_cka"]
