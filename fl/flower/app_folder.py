"""A Flower app folder for ``flwr run`` that runs an ``fl`` algorithm, and a Flower home for a local SuperLink.

The folder holds only the ``pyproject.toml`` docs/flower.md describes: the components
``fl.flower.apps:server`` and ``fl.flower.apps:client`` and the run's settings in its
``[tool.flwr.app.config.fl]`` table (keys as ``fl.run``'s, ``-`` for ``_``, ``run-dir`` included).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

PYPROJECT = """[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "{name}"
version = "1.0.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "{publisher}"

[tool.flwr.app.components]
serverapp = "fl.flower.apps:server"
clientapp = "fl.flower.apps:client"

[tool.flwr.app.config.fl]
{table}
"""
LOCAL_SUPERLINK = """[superlink]
default = "local"

[superlink.local]
address = ":local:"
options.num-supernodes = {supernodes}
"""


def write_app(folder: Path, settings: Mapping[str, Any], *, name: str = "fl-app", publisher: str = "landscape") -> Path:
    """Write ``folder/pyproject.toml`` of an app that runs ``settings`` (``flwr run folder``).

    Parameters
    ----------
    folder : Path
        The app folder (created).
    settings : Mapping[str, Any]
        The ``[tool.flwr.app.config.fl]`` table: strings, numbers and booleans.
    name, publisher : str
        The app's project name and Flower publisher.

    Returns
    -------
    Path
        The ``pyproject.toml`` written.
    """
    folder.mkdir(parents=True, exist_ok=True)
    table = "\n".join(f"{k} = {json.dumps(v)}" for k, v in settings.items())
    path = folder / "pyproject.toml"
    path.write_text(PYPROJECT.format(name=name, publisher=publisher, table=table))
    return path


def write_local_superlink(home: Path, supernodes: int) -> Path:
    """Write ``home/config.toml``: a local SuperLink with ``supernodes`` simulated SuperNodes (``FLWR_HOME=home``).

    Parameters
    ----------
    home : Path
        The Flower home folder (created).
    supernodes : int
        SuperNodes the local simulation starts (one per client of the run).

    Returns
    -------
    Path
        The ``config.toml`` written.
    """
    home.mkdir(parents=True, exist_ok=True)
    path = home / "config.toml"
    path.write_text(LOCAL_SUPERLINK.format(supernodes=int(supernodes)))
    return path
