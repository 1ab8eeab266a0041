"""The IMA paper's bias-variance-covariance decomposition, and what averaging does to client models.

``ima``: the decomposition of a federated model's loss; ``similarity``: averaging curves, linear CKA.
"""
from .ima import decompose, decompose_run
from .similarity import averaging_curve, cka_matrix, linear_cka

__all__ = ["averaging_curve", "cka_matrix", "decompose", "decompose_run", "linear_cka"]
