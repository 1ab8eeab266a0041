"""A ready Flower app that runs an ``fl`` algorithm: point ``flwr run`` at these components.

In the app's ``pyproject.toml``::

    [tool.flwr.app.components]
    serverapp = "fl.flower.apps:server"
    clientapp = "fl.flower.apps:client"

    [tool.flwr.app.config.fl]
    algorithm = "fedgucci"
    run-dir = "runs/fedgucci-flower"
    dataset = "mnist1d"
    clients = 10
    rounds = 50

``server`` builds an :class:`~fl.flower.algorithms.AlgorithmStrategy` from the run
configuration inside ``main`` (so it works when ``flwr run`` starts the ``ServerApp`` in its own
process) and trains every round; ``client`` is :func:`~fl.flower.algorithms.client_app` for zoo
models and the configuration's dataset.
"""
from __future__ import annotations

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from .algorithms import AlgorithmStrategy, client_app

server = ServerApp()
client = client_app()


@server.main()
def main(grid: Grid, context: Context) -> None:
    """Train the run that ``context.run_config``'s ``fl.*`` keys describe.

    Parameters
    ----------
    grid : Grid
        The federation.
    context : Context
        The ``ServerApp``'s context (``run_config`` holds ``fl.run-dir``, ``fl.algorithm``, ...).
    """
    AlgorithmStrategy.from_run_config(context.run_config).start(grid)
