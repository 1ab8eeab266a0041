"""Embedded federated-learning engine.

Train FedAvg, FedProx, IMA, FedGuCci(+), FLOCO(+) and LSS on a partitioned dataset and
store every round's checkpoints for analysis.

>>> run = fl.run("fedavg", dataset="digits", clients=10, rounds=20, out="runs/fedavg")
>>> run.metrics[-1]["test_accuracy"], run.global_state(), run.client_states(5)

Layout: ``api`` (``fl.run``), ``config`` (``RunConfig``: every setting, typed, on the option
machinery of ``landscape.infra.options``), ``resolve (recipe, defaults and options -> stored
configuration), ``rundir``/``store`` (the run folder), ``template`` (the model), ``initial``
(the initial model from ``init=`` weights), ``pretrain`` (``fl.pretrain``: central
pretraining on data disjoint from the federation's), ``reader`` (``Run``),
``engine``/``vectorized`` (the round loop), ``algorithms/`` (one file per algorithm, found
by the registry; ``algorithms.robust``: the robust aggregation rules any algorithm uses),
``tracking``/``tracker`` (``fl.Track``: landscape measures recorded during training, read back by
``Run.track()``), ``aggregates`` (``fl.plain_aggregate``: a round's FedAvg mean beside a robust run's model),
``recipes`` (papers' settings), ``branching`` (``fl.branch``: a run whose first rounds are
copied from a stored run of the algorithm it trains as until then, IMA from FedAvg), ``cli``
(``fl-run``), ``flower`` (Flower's Message API: records any Flower strategy's run as a run
folder, and runs this package's algorithms on a Flower federation; needs the ``flower`` extra,
not imported here).
"""
from .aggregates import plain_aggregate
from .api import run
from .branching import branch
from .config import RunConfig
from .manifest import seal as seal_run
from .pretrain import pretrain
from .reader import Run, load_run
from .recipes import RECIPES, Recipe
from .tracking import Track

__all__ = ["RECIPES", "Recipe", "Run", "RunConfig", "Track", "branch", "load_run", "plain_aggregate", "pretrain",
           "run", "seal_run"]
