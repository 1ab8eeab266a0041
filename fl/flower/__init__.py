"""Flower (https://flower.ai) and this toolkit (``pip install .[flower]``).

Two ways in, both with Flower's Message API (``ServerApp`` with ``main(grid, context)``,
``ClientApp`` with ``@app.train``, launched by ``flwr run``):

* **Record any Flower strategy**: :class:`RecordedStrategy` wraps a ``flwr.serverapp``
  strategy and writes every round (global model with test metrics, client models of chosen
  rounds under their partition ids) into a run folder that :func:`fl.load_run`,
  ``landscape report --run`` and ``landscape.claims`` open (:mod:`fl.flower.messages`).
* **Run the papers' algorithms on a federation**: :class:`AlgorithmStrategy` and
  :func:`client_app` run FedAvg, FedProx, FedGuCci(+), FLOCO(+), LSS, IMA, Ditto, ... with
  ``fl``'s own client and server steps (:mod:`fl.flower.algorithms`); :mod:`fl.flower.apps`
  holds a ready ``ServerApp``/``ClientApp`` pair configured by ``[tool.flwr.app.config.fl]``.

:class:`RecordingStrategy` records runs of Flower's legacy strategy API
(``flwr.server.strategy``) while Flower ships it. See docs/flower.md.
"""
from __future__ import annotations

try:
    import flwr  # noqa: F401
except ImportError as exc:  # the optional extra is missing
    raise ImportError("fl.flower needs Flower: pip install -c constraints.txt '.[flower]'") from exc

from ..update_checks import ClientRefused, FederationError
from .algorithms import AlgorithmStrategy, client_app, train_reply
from .legacy import PARTITION_KEY, RecordingStrategy
from .messages import RecordedStrategy, client_models, partition_id, partition_metrics
from .nodes import find_partitions
from .recorder import CONFIG_PREFIX, FlowerRecorder, settings_from_run_config
from .replies import NUM_EXAMPLES, PARTITION_ID

__all__ = ["AlgorithmStrategy", "CONFIG_PREFIX", "ClientRefused", "FederationError", "FlowerRecorder",
           "NUM_EXAMPLES", "PARTITION_ID", "PARTITION_KEY", "RecordedStrategy", "RecordingStrategy", "client_app",
           "client_models", "find_partitions", "partition_id", "partition_metrics", "settings_from_run_config",
           "train_reply"]
