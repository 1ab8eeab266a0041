"""Embedded federated-learning engine: train FedAvg, FedProx, IMA, FedGuCci(+), FLOCO(+)
and LSS on a partitioned dataset and store every round's checkpoints for analysis.

>>> run = fl.run("fedavg", dataset="digits", clients=10, rounds=20, out="runs/fedavg")
>>> run.metrics[-1]["test_accuracy"], run.global_state(), run.client_states(5)
"""
from .api import Run, load_run, run

__all__ = ["Run", "load_run", "run"]
