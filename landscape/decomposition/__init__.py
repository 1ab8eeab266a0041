"""The IMA paper's bias-variance-covariance decomposition of a federated model's loss, and related tools."""
from .ima import averaging_curve, cka_matrix, decompose, decompose_run, linear_cka

__all__ = ["averaging_curve", "cka_matrix", "decompose", "decompose_run", "linear_cka"]
