"""FedGuCci launched with ``flwr run`` (the ServerApp in its own process, a local SuperLink) equals fl.run.

The app folder holds only a ``pyproject.toml`` naming the components ``fl.flower.apps:server``
and ``fl.flower.apps:client`` and the run's ``[tool.flwr.app.config.fl]`` table, as docs/flower.md
shows. Flower starts a local SuperLink (simulation runtime, 3 SuperNodes) in the background;
the test stops it afterwards.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("flwr", reason="Flower is not installed: pip install -c constraints.txt '.[flower]'")
psutil = pytest.importorskip("psutil")

import fl  # noqa: E402
from fl.flower.app_folder import write_app, write_local_superlink  # noqa: E402

SETTINGS = {"algorithm": "fedgucci", "dataset": "digits", "clients": 3, "rounds": 2, "seed": 5,
            "save-clients": "all", "beta": 0.5}


def _stop_local_superlink(home: Path) -> None:
    for proc in psutil.process_iter(["cmdline"]):
        if any(str(home) in part for part in (proc.info["cmdline"] or [])):
            proc.kill()


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("flwr-run")
    home, app, out = root / "flwr-home", root / "app", root / "run"
    write_local_superlink(home, 3)
    write_app(app, {**SETTINGS, "run-dir": str(out)}, name="fedgucci-app")
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    # every process of the federation (SuperLink, ServerApp, ClientApps) computes on one thread, as the
    # suite does (tests/conftest.py): the reference below then takes the same reduction order on any CPU
    env = {**os.environ, "FLWR_HOME": str(home), "PATH": path, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    try:
        done = subprocess.run([str(Path(sys.executable).parent / "flwr"), "run", str(app), "--stream"], env=env,
                              capture_output=True, text=True, timeout=400)
    finally:
        _stop_local_superlink(home)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return out


def test_flwr_run_records_the_run(launched: Path) -> None:
    run = fl.load_run(launched)
    assert run.complete and run.rounds == [0, 1, 2]
    assert sorted(run.client_states(2)) == [0, 1, 2]
    assert '"AlgorithmStrategy"' in (launched / "flower.json").read_text()


def test_flwr_run_equals_fl_run(launched: Path, tmp_path: Path) -> None:
    """Bit for bit: the same code path on the same thread count.

    A thread count other than the federation's changes float32 reduction orders on AVX-512 kernels
    (1e-7 in round 1 growing to 2e-2 in round 2 of FedGuCci), so any difference in what travels or
    how clients train shows here.
    """
    assert torch.get_num_threads() == 1  # tests/conftest.py; the federation ran with OMP_NUM_THREADS=1
    settings = {k.replace("-", "_"): v for k, v in SETTINGS.items()}
    reference = fl.run(settings.pop("algorithm"), out=tmp_path / "engine", progress=False, **settings)
    flower = fl.load_run(launched)
    assert flower.config == reference.config
    for r in reference.rounds:
        for key, value in reference.global_state(r).items():
            assert torch.equal(flower.global_state(r)[key], value), (r, key)
        for k, state in reference.client_states(r).items():
            for key, value in state.items():
                assert torch.equal(flower.client_states(r)[k][key], value), (r, k, key)
