"""The CPU kernels of the claims runs: pinned, so a rerun on another x86-64 CPU gives the same bits.

On a CPU, torch picks its kernels by the host: ATen's vectorised kernels by the widest
instruction set (``torch.backends.cpu.get_cpu_capability()``: AVX512 or AVX2), oneDNN's JIT
convolutions by instruction set and cache sizes, MKL's GEMM by processor and vendor. Each
choice changes the order of floating-point sums, and a training run amplifies the last bit
into different per-seed numbers (FLOCO seed 0's plateau: 0.632 on an AVX-512 host, 0.608 on
an AVX2 host). The pinned setting (``PIN``, applied by :func:`reexec` and :func:`apply`):

* ``ATEN_CPU_CAPABILITY=avx2``: ATen's AVX2 kernels, the same compiled code on every x86-64
  CPU with AVX2 and FMA (a host without them is refused, not silently run another way);
* ``MKL_CBWR=COMPATIBLE`` with ``MKL_DYNAMIC=FALSE``: MKL's conditional-numerical-
  reproducibility branch that MKL documents as bitwise reproducible on Intel and compatible
  processors for a fixed number of threads (``MKL_CBWR=AVX2`` is not: on an AMD CPU MKL falls
  back to its AUTO branch, as ``MKL_VERBOSE`` shows, ``CNR:AUTO``);
* oneDNN off (``torch.backends.mkldnn.enabled = False``): its JIT convolutions are
  reproducible only on the same platform (oneDNN's own statement), so convolutions run as
  ATen's im2col + MKL GEMM, above;
* the thread count of ``--threads`` (1 by default), the same for every run.

Measured with ``benchmarks/kernel_settings.py`` on an AVX-512 host (AMD EPYC, torch 2.14.1, one
thread; 3-round runs of FedAvg on the digits MLP and the MNIST-1D CNN, and of FLOCO): under the pin
the final models are bit-identical from run to run and whatever limits the host puts on oneDNN
(AVX2, AVX512_CORE) and MKL (AVX2, SSE4.2). Every other setting gives other bits (largest
difference after 3 rounds 7e-9 to 2.4e-7, after 4 full rounds of the fedgucci-mnist1d recipe
3e-3): the host's default; ATen at avx2, alone, with oneDNN at AVX2 and with ``MKL_CBWR=AVX2``
(for the MLP these three agree: only ATen's choice matters there); ``MKL_CBWR=AVX2`` alone (on
this AMD host the bits of ``MKL_CBWR=AUTO``); ATen's scalar kernels. What one host cannot show
is another vendor's or another cache size's bits; there the pin rests on ATen's fixed code and
MKL's documented COMPATIBLE branch, and leaves out oneDNN, which promises nothing across
platforms. The cost: 10 rounds of FedAvg in the fedgucci-mnist1d recipe took 7.1 s of CPU pinned
against 4.1-5.0 s native (about 1.5x). ``--kernels native`` keeps the host's kernels.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from landscape.infra.errors import ConfigError  # imports no torch: this module runs before torch is imported

#: Environment of every claims process, set before torch is imported (torch and MKL read it once).
PIN = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE", "MKL_DYNAMIC": "FALSE", "OMP_DYNAMIC": "FALSE"}
#: The kernel settings ``--kernels`` accepts.
SETTINGS = ("pinned", "native")
#: Variables a kernel record keeps (the pin's and the host-capability limits that could change kernels).
RECORDED = (*PIN, "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
#: File of a run folder (or of a folder of central models) that records the kernels it was trained with.
RECORD = "kernels.json"


def requested(argv: Sequence[str]) -> str:
    """The ``--kernels`` setting of a command line (``"pinned"`` when not given).

    Parameters
    ----------
    argv : sequence of str
        The arguments after the script name.

    Returns
    -------
    str
        One of :data:`SETTINGS`.
    """
    args = list(argv)
    for i, arg in enumerate(args):
        if arg.startswith("--kernels="):
            return arg.split("=", 1)[1]
        if arg == "--kernels" and i + 1 < len(args):
            return args[i + 1]
    return "pinned"


def pinned(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether ``environ`` holds every variable of :data:`PIN` at its pinned value."""
    return all(environ.get(k) == v for k, v in PIN.items())


def reexec(argv: Sequence[str]) -> None:
    """Restart this interpreter with :data:`PIN` in its environment unless it is there or ``--kernels native``.

    Call it before torch is imported: ``os.execve`` replaces the process, so the new one
    imports torch under the pinned variables and every worker it spawns inherits them. The
    package's folder is put on the new process's ``PYTHONPATH``, so the restart finds the
    package however this process found it.

    Parameters
    ----------
    argv : sequence of str
        The interpreter's arguments: a script and its arguments (``sys.argv``), or ``-m``, a
        module and its arguments.
    """
    if requested(argv[1:]) == "pinned" and not pinned():
        root = str(Path(__file__).resolve().parents[1])
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
        os.execve(sys.executable, [sys.executable, *argv], {**os.environ, **PIN, "PYTHONPATH": path})


def apply(setting: str) -> None:
    """Put this process's torch in ``setting`` (call in the main process and in every worker).

    Parameters
    ----------
    setting : str
        ``"pinned"`` turns oneDNN off and checks that the pinned kernels are in use;
        ``"native"`` changes nothing.

    Raises
    ------
    ConfigError
        When pinned but the environment lacks :data:`PIN` (torch was imported before
        :func:`reexec`) or the CPU has no AVX2 (ATen fell back to other kernels).
    """
    import torch

    if setting != "pinned":
        return
    if not pinned():
        raise ConfigError(f"the pinned kernels need {PIN} in the environment before torch is imported; "
                           "start through python -m paper_claims, or pass --kernels native")
    capability = torch.backends.cpu.get_cpu_capability()
    if capability != "AVX2":
        raise ConfigError(f"the pinned kernels need a CPU with AVX2, torch runs {capability}; "
                           "pass --kernels native (results then differ from an AVX2 host's)")
    torch.backends.mkldnn.enabled = False


def record() -> dict[str, Any]:
    """The kernels of this process: what a run's ``kernels.json`` holds.

    Returns
    -------
    dict
        ``pinned``, ``aten`` (the ATen capability in use), ``onednn`` (enabled), ``threads``,
        ``torch`` (version) and the :data:`RECORDED` environment variables that are set.
    """
    import torch

    return {"pinned": pinned() and not torch.backends.mkldnn.enabled,
            "aten": torch.backends.cpu.get_cpu_capability(), "onednn": bool(torch.backends.mkldnn.enabled),
            "threads": torch.get_num_threads(), "torch": torch.__version__,
            "env": {k: os.environ[k] for k in RECORDED if k in os.environ}}


def same_kernels(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two records name the same kernels (ATen capability, oneDNN, threads, torch, pin)."""
    keys = ("pinned", "aten", "onednn", "threads", "torch")
    return all(a.get(k) == b.get(k) for k in keys)


def check(folder: Path) -> None:
    """Refuse to reuse ``folder`` (a stored run or models) trained with other kernels than this process's.

    Parameters
    ----------
    folder : Path
        A run folder or a folder of models; nothing is checked when it holds no record.

    Raises
    ------
    ConfigError
        Naming the folder and both kernel settings.
    """
    path = Path(folder) / RECORD
    if path.exists():
        stored, now = json.loads(path.read_text()), record()
        if not same_kernels(stored, now):
            raise ConfigError(f"{folder} was trained with other kernels ({stored}) than this process's ({now}); "
                               "use another --cache or the same --kernels and --threads")


def stamp(folder: Path) -> None:
    """Record this process's kernels in ``folder`` (checked against a record already there).

    Parameters
    ----------
    folder : Path
        An existing folder this process trains into.
    """
    check(folder)
    path = Path(folder) / RECORD
    if not path.exists():
        path.write_text(json.dumps(record(), sort_keys=True))
