"""On-disk layout of an FL run directory (safe formats only: JSON, safetensors, npz).

::

    <run>/config.json                      full configuration (fl.run arguments, resolved options)
    <run>/partition.npz                    client index arrays: train_KKKKK, test_KKKKK (local test split)
    <run>/metrics.jsonl                    one JSON object per round (round 0 = initial model)
    <run>/global/round_RRRR.safetensors    global model after round R (plain architecture)
    <run>/clients/round_RRRR/client_KKKKK.safetensors   client models trained in round R
    <run>/state/round_RRRR.safetensors     algorithm server state after round R
    <run>/train/round_RRRR.safetensors     training-architecture global state (only when the
                                           algorithm trains another architecture, e.g. FLOCO)
    <run>/client_state/round_RRRR.safetensors  per-client server-side state ("K/name" keys),
                                           latest round only, for resume
    <run>/manifest.json                    digests of all the files above (fl.manifest), per round
    <run>/progress.json                    {"round": R, "complete": bool}: written last, atomically

A round is complete once ``progress.json`` names it; files of later rounds are leftovers
of an interrupted run and are overwritten on resume. Every file is written atomically and
never through a link (:func:`landscape.infra.files.write_atomic`; the metrics log is appended
through a descriptor opened with ``O_NOFOLLOW``); temporary files of a killed writer are
removed by the next one when it takes the lock. A run folder whose expected files or folders
are symbolic links is refused with a ``CheckpointError`` before anything is read or written, and
every file is read through :mod:`landscape.infra.reading` (a FIFO, a device, a folder or a file
larger than its kind can be is refused, never read).
Every file read is checked against the schema of :mod:`fl.run_schema` (types and ranges,
partition indices, client file names). A failed write (full disk, read-only location) raises
an error naming the file and leaves the previous version in place.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import zipfile
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np
import torch

from landscape.infra.errors import CheckpointError, ConfigError, LandscapeError, NonFiniteWeightsError
from landscape.infra.files import exclusive_lock, is_temporary, write_atomic
from landscape.infra.reading import load_json, open_file, read_file
from landscape.infra.write_failures import write_error
from landscape.space.checkpoints import load_state_dict, save_state_dict

from .run_schema import check_partition, check_progress, check_record, client_files, refuse_links

State = dict[str, torch.Tensor]
#: Keys every config.json holds (written by ``fl.api.build_config``).
CONFIG_KEYS = ("version", "algorithm", "dataset", "model", "clients", "rounds", "seed", "options")
#: Files and folders of a run folder (none of them may be a symbolic link).
FILES = ("config.json", "partition.npz", "metrics.jsonl", "manifest.json", "progress.json", ".lock")
FOLDERS = ("global", "clients", "state", "train", "client_state")


class RunStore:
    """Reads and writes the files of one run directory."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    # ------------------------------------------------------------------- paths
    @property
    def config_path(self) -> Path:
        """The run's configuration file."""
        return self.path / "config.json"

    @property
    def metrics_path(self) -> Path:
        """The per-round metrics file (one JSON line per round)."""
        return self.path / "metrics.jsonl"

    @property
    def progress_path(self) -> Path:
        """The progress marker (last round written, completeness)."""
        return self.path / "progress.json"

    @property
    def partition_path(self) -> Path:
        """The stored client partition."""
        return self.path / "partition.npz"

    @property
    def manifest_path(self) -> Path:
        """The manifest of every file written, with digests."""
        return self.path / "manifest.json"

    def global_path(self, round: int) -> Path:
        """The global model checkpoint of ``round``."""
        return self.path / "global" / f"round_{round:04d}.safetensors"

    def train_path(self, round: int) -> Path:
        """The global model in the training architecture at ``round`` (algorithms that train another)."""
        return self.path / "train" / f"round_{round:04d}.safetensors"

    def state_path(self, round: int) -> Path:
        """The algorithm's server state at ``round``."""
        return self.path / "state" / f"round_{round:04d}.safetensors"

    def client_path(self, round: int, client: int) -> Path:
        """The checkpoint of ``client``'s model trained in ``round``."""
        return self.path / "clients" / f"round_{round:04d}" / f"client_{client:05d}.safetensors"

    def client_state_path(self, round: int) -> Path:
        """The clients' persisted states after ``round``."""
        return self.path / "client_state" / f"round_{round:04d}.safetensors"

    def check_links(self) -> None:
        """Refuse a run folder whose expected files, folders or round folders are links.

        Raises
        ------
        CheckpointError
            Naming the first symbolic link found.
        """
        refuse_links([self.path / name for name in FILES + FOLDERS])
        for name in FOLDERS:
            folder = self.path / name
            if folder.is_dir():
                refuse_links(sorted(folder.iterdir()))

    def _stored(self, key: str) -> int | None:
        """An integer of the stored configuration (None while there is none)."""
        if not self.config_path.exists():
            return None
        return int(self.read_config()[key])

    # ------------------------------------------------------------------ config
    def write_config(self, config: Mapping[str, Any]) -> None:
        """Write the configuration (atomically, links refused)."""
        self.check_links()
        write_atomic(self.config_path, (json.dumps(config, indent=2, sort_keys=True) + "\n").encode())

    def read_config(self) -> dict[str, Any]:
        """The stored configuration, checked with ``fl.config.check_stored_config`` (types and ranges of every field).

        Returned exactly as stored.
        """
        from .config import check_stored_config

        self.check_links()
        try:
            config = load_json(read_file(self.config_path, "JSON file", CheckpointError))
        except FileNotFoundError:
            raise CheckpointError(self.path, "is not an FL run directory (no config.json); "
                                             "pass the folder fl.run wrote") from None
        except (ValueError, RecursionError) as exc:  # not JSON, not text, or an over-long integer
            raise CheckpointError(self.config_path, f"corrupt JSON: {exc}") from None
        missing = [k for k in CONFIG_KEYS if k not in config] if isinstance(config, dict) else list(CONFIG_KEYS)
        if missing:
            raise CheckpointError(self.config_path, f"is not a run configuration (lacks {', '.join(missing)}); "
                                                    "the file is corrupt or was not written by fl.run")
        check_stored_config(config, str(self.config_path))
        return config

    # --------------------------------------------------------------- partition
    def write_partition(self, train: list[np.ndarray], test: list[np.ndarray]) -> None:
        """Write the clients' training and local test index arrays (atomically, links refused)."""
        self.check_links()
        arrays = {f"train_{k:05d}": np.asarray(p, dtype=np.int64) for k, p in enumerate(train)}
        arrays.update({f"test_{k:05d}": np.asarray(p, dtype=np.int64) for k, p in enumerate(test)})
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        write_atomic(self.partition_path, buffer.getbuffer())

    def read_partition(self, num_samples: int | None = None) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """(train index arrays, local test index arrays), one per client.

        Parameters
        ----------
        num_samples : int, optional
            Size of the training pool; when given, indices at or above it are refused.

        Returns
        -------
        tuple[list[np.ndarray], list[np.ndarray]]
            Checked with :func:`fl.run_schema.check_partition` against the configured
            number of clients (when config.json exists).
        """
        refuse_links([self.partition_path])
        try:
            with open_file(self.partition_path, "partition file", CheckpointError) as fh, \
                    np.load(fh, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        except FileNotFoundError:
            raise CheckpointError(self.partition_path, "missing; the run directory is incomplete") from None
        except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
            raise CheckpointError(self.partition_path, f"unreadable (corrupt or truncated?): {exc}") from None
        return check_partition(arrays, self.partition_path, self._stored("clients"), num_samples)

    # ---------------------------------------------------------------- progress
    def _progress(self) -> tuple[int, bool] | None:
        refuse_links([self.progress_path])
        try:
            marker = load_json(read_file(self.progress_path, "JSON file", CheckpointError))
        except FileNotFoundError:
            return None
        except (ValueError, RecursionError) as exc:
            raise CheckpointError(self.progress_path, f"corrupt progress marker: {exc}; delete it to "
                                                      "restart the run from round 0") from None
        return check_progress(marker, self.progress_path, self._stored("rounds"))

    def read_progress(self) -> int | None:
        """The last complete round, or None when no round (not even round 0) is complete."""
        marker = self._progress()
        return None if marker is None else marker[0]

    def is_complete(self) -> bool:
        """Whether the progress marker says the run finished."""
        marker = self._progress()
        return marker is not None and marker[1]

    def mark(self, round: int, complete: bool) -> None:
        """Write the progress marker: ``round`` is the last round stored, ``complete`` whether the run ended."""
        write_atomic(self.progress_path, json.dumps({"round": int(round), "complete": bool(complete)}).encode())

    # ----------------------------------------------------------------- metrics
    def append_metrics(self, record: Mapping[str, Any]) -> None:
        """Append one line; a line cut by a crash or a full disk is dropped when the run resumes.

        Non-finite numbers are refused (``ValueError`` from ``json.dumps``): the log is strict JSON.
        """
        line = (json.dumps(record, sort_keys=True, allow_nan=False) + "\n").encode()
        refuse_links([self.metrics_path])
        try:
            fd = os.open(self.metrics_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o644)
        except OSError as exc:
            raise write_error(self.metrics_path, exc, len(line)) from None
        try:
            os.write(fd, line)
            os.fsync(fd)
        except OSError as exc:
            raise write_error(self.metrics_path, exc, len(line)) from None
        finally:
            os.close(fd)

    def read_metrics(self, upto: int | None = None) -> list[dict[str, Any]]:
        """Per-round records of complete rounds 0..``upto`` (default: the last complete round).

        Only the last line may be unreadable (cut by a kill or a full disk, without its
        newline); any other damage, a record failing :func:`fl.run_schema.check_record`, or
        a missing round raises ``CheckpointError``.
        """
        if upto is None:
            upto = self.read_progress()
        if upto is None or upto < 0:
            return []
        refuse_links([self.metrics_path])
        try:
            text = read_file(self.metrics_path, "metrics log", CheckpointError).decode()
        except FileNotFoundError:
            raise CheckpointError(self.metrics_path, f"missing, but rounds 0..{upto} are complete") from None
        except UnicodeDecodeError as exc:
            raise CheckpointError(self.metrics_path, f"is not text: {exc}") from None
        clients = self._stored("clients")
        lines = text.splitlines()
        records = []
        for i, line in enumerate(lines):
            try:
                rec = load_json(line, parse_constant=_refuse_constant)
            except (ValueError, RecursionError) as exc:
                if i == len(lines) - 1 and not text.endswith("\n"):
                    continue  # the line being written when the run was interrupted
                raise CheckpointError(self.metrics_path, f"line {i + 1} is corrupt: {exc}") from None
            check_record(rec, self.metrics_path, i + 1, clients)
            if rec["round"] <= upto:
                records.append(rec)
        found = [rec["round"] for rec in records]
        if found != list(range(upto + 1)):
            raise CheckpointError(self.metrics_path, f"holds records of rounds {found}, but rounds 0..{upto} "
                                                     "are complete; the file is damaged")
        return records

    def truncate_metrics(self, upto: int) -> None:
        """Keep only the records of rounds <= ``upto`` (used when resuming)."""
        records = self.read_metrics(upto)
        text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in records)
        write_atomic(self.metrics_path, text.encode())

    # ------------------------------------------------------------------ states
    def write_state(self, path: Path, state: Mapping[str, torch.Tensor]) -> None:
        """Write a state dict to ``path`` (atomically, links refused)."""
        self.check_links()
        save_state_dict(state, path)

    def read_state(self, path: Path, digest: str | None = None) -> State:
        """A checkpoint of the folder; with ``digest`` (its manifest entry), only that exact file."""
        refuse_links([path, path.parent])
        return load_state_dict(path, digest=digest)

    def read_optional_state(self, path: Path, digest: str | None = None) -> State:
        """A state file that may legitimately be absent (empty algorithm state) unless ``digest`` is given."""
        return self.read_state(path, digest) if path.exists() or path.is_symlink() or digest else {}

    def client_checkpoints(self, round: int) -> dict[int, Path]:
        """``{client id: path}`` of the client models stored for ``round``.

        Strict names, see :func:`fl.run_schema.client_files`; empty when the round stored
        none.

        Raises
        ------
        CheckpointError
            For links, unexpected files or client ids out of range in the round folder.
        """
        folder = self.client_path(round, 0).parent
        refuse_links([folder.parent])
        if not folder.is_dir() and not folder.is_symlink():
            return {}
        return client_files(folder, self._stored("clients"))

    def write_client_states(self, round: int, states: Mapping[int, Mapping[str, torch.Tensor]]) -> None:
        """Write the clients' persisted states after ``round`` into one file (nothing when there are none)."""
        flat = {f"{k}/{name}": t for k, st in states.items() for name, t in st.items()}
        if flat:
            self.write_state(self.client_state_path(round), flat)

    def read_client_states(self, round: int, digest: str | None = None) -> dict[int, State]:
        """Client id -> persisted state after ``round`` (empty when none was stored)."""
        flat = self.read_optional_state(self.client_state_path(round), digest)
        out: dict[int, State] = {}
        for key, t in flat.items():
            k, name = key.split("/", 1)
            out.setdefault(int(k), {})[name] = t
        return out

    def prune_client_states(self, keep: int) -> None:
        """Delete per-client state files of rounds other than ``keep``."""
        folder = self.path / "client_state"
        if folder.is_dir() and not folder.is_symlink():
            for f in folder.glob("round_*.safetensors"):
                if f.name != self.client_state_path(keep).name:
                    f.unlink(missing_ok=True)

    # -------------------------------------------------------------------- lock
    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Exclusive writer lock on the run directory (fails fast when held).

        The lock file is opened without following links and never truncated; a folder whose
        expected files are links is refused. Temporary files left by a killed writer are
        removed (unlinked, never followed).
        """
        refuse_links([self.path / ".lock"])

        def busy() -> ConfigError:
            return ConfigError(f"{self.path} is being written by another process; wait for it "
                               "to finish or choose another out=")

        with exclusive_lock(self.path / ".lock", timeout=0, busy=busy):
            self.check_links()
            for folder in (self.path, *(self.path / name for name in FOLDERS)):
                if folder.is_dir():
                    for entry in folder.iterdir():
                        if is_temporary(entry.name):
                            entry.unlink(missing_ok=True)
            clients = self.path / "clients"
            if clients.is_dir():
                for round_folder in clients.iterdir():
                    if round_folder.is_dir() and not round_folder.is_symlink():
                        for entry in round_folder.iterdir():
                            if is_temporary(entry.name):
                                entry.unlink(missing_ok=True)
            yield


def _refuse_constant(name: str) -> float:
    """``json.loads`` hook: NaN and Infinity are not JSON and never written by the store."""
    raise ValueError(f"{name} is not a valid number in a run file")


class RunDivergedError(NonFiniteWeightsError):
    """Training produced a non-finite global model or loss; the round was not stored."""

    def __init__(self, round: int, names: list[str]):
        self.names = list(names)
        self.round = round
        LandscapeError.__init__(
            self, f"the run diverged in round {round}: non-finite values in {', '.join(names[:6])}"
                  f"{' ...' if len(names) > 6 else ''}. Round {round} was not stored"
                  f"{f'; the folder keeps rounds 0..{round - 1}' if round > 0 else ''}. Lower the learning "
                  "rate (or momentum) and start a new run")


def check_round_finite(round: int, state: Mapping[str, torch.Tensor], record: Mapping[str, Any]) -> None:
    """Refuse to store a round whose global model or metrics are not finite.

    Parameters
    ----------
    round : int
        The training round.
    state : Mapping[str, torch.Tensor]
        The new global (training-architecture) state.
    record : Mapping[str, Any]
        The round's metrics record.

    Raises
    ------
    RunDivergedError
        Naming the round and the non-finite tensors or metrics.
    """
    bad = [n for n, t in state.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    bad += [k for k, v in record.items() if isinstance(v, float) and not np.isfinite(v)]
    if bad:
        raise RunDivergedError(round, bad)
