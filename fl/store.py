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
    <run>/progress.json                    {"round": R, "complete": bool}: written last, atomically

A round is complete once ``progress.json`` names it; files of later rounds are leftovers
of an interrupted run and are overwritten on resume. Every file is written atomically
(temporary file, fsync, rename); temporary files of a killed writer are removed by the next
one when it takes the lock. A failed write (full disk, read-only location) raises
``CheckpointError`` naming the file and leaves the previous version in place.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import zipfile
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np
import torch

from landscape.infra.files import discard, write_atomic, write_error
from landscape.space.checkpoints import load_state_dict, save_state_dict
from landscape.infra.errors import CheckpointError, ConfigError

State = dict[str, torch.Tensor]
#: Keys every config.json holds (written by ``fl.api.build_config``).
CONFIG_KEYS = ("version", "algorithm", "dataset", "model", "clients", "rounds", "seed", "options")


class RunStore:
    """Reads and writes the files of one run directory."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    # ------------------------------------------------------------------- paths
    @property
    def config_path(self) -> Path:
        return self.path / "config.json"

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def progress_path(self) -> Path:
        return self.path / "progress.json"

    @property
    def partition_path(self) -> Path:
        return self.path / "partition.npz"

    def global_path(self, round: int) -> Path:
        return self.path / "global" / f"round_{round:04d}.safetensors"

    def train_path(self, round: int) -> Path:
        return self.path / "train" / f"round_{round:04d}.safetensors"

    def state_path(self, round: int) -> Path:
        return self.path / "state" / f"round_{round:04d}.safetensors"

    def client_path(self, round: int, client: int) -> Path:
        return self.path / "clients" / f"round_{round:04d}" / f"client_{client:05d}.safetensors"

    def client_state_path(self, round: int) -> Path:
        return self.path / "client_state" / f"round_{round:04d}.safetensors"

    # ------------------------------------------------------------------ config
    def write_config(self, config: Mapping[str, Any]) -> None:
        write_atomic(self.config_path, (json.dumps(config, indent=2, sort_keys=True) + "\n").encode())

    def read_config(self) -> dict[str, Any]:
        try:
            config = json.loads(self.config_path.read_text())
        except FileNotFoundError:
            raise CheckpointError(self.path, "is not an FL run directory (no config.json); "
                                             "pass the folder fl.run wrote") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CheckpointError(self.config_path, f"corrupt JSON: {exc}") from None
        missing = [k for k in CONFIG_KEYS if k not in config] if isinstance(config, dict) else list(CONFIG_KEYS)
        if missing:
            raise CheckpointError(self.config_path, f"is not a run configuration (lacks {', '.join(missing)}); "
                                                    "the file is corrupt or was not written by fl.run")
        return config

    # --------------------------------------------------------------- partition
    def write_partition(self, train: list[np.ndarray], test: list[np.ndarray]) -> None:
        arrays = {f"train_{k:05d}": np.asarray(p, dtype=np.int64) for k, p in enumerate(train)}
        arrays.update({f"test_{k:05d}": np.asarray(p, dtype=np.int64) for k, p in enumerate(test)})
        tmp = self.partition_path.with_name(f".partition.tmp-{os.getpid()}.npz")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            np.savez(tmp, **arrays)
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, self.partition_path)
        except OSError as exc:
            discard(tmp)
            raise write_error(self.partition_path, exc) from None
        except BaseException:
            discard(tmp)
            raise

    def read_partition(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """(train index arrays, local test index arrays), one per client."""
        try:
            with np.load(self.partition_path, allow_pickle=False) as z:
                train = [z[k] for k in sorted(k for k in z.files if k.startswith("train_"))]
                test = [z[k] for k in sorted(k for k in z.files if k.startswith("test_"))]
        except FileNotFoundError:
            raise CheckpointError(self.partition_path, "missing; the run directory is incomplete") from None
        except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
            raise CheckpointError(self.partition_path, f"unreadable (corrupt or truncated?): {exc}") from None
        if not train or len(train) != len(test) or not all(np.issubdtype(p.dtype, np.integer) for p in train + test):
            raise CheckpointError(self.partition_path, "does not hold one integer index array per client "
                                                       "for training and for local test data")
        return train, test

    # ---------------------------------------------------------------- progress
    def _progress(self) -> tuple[int, bool] | None:
        try:
            marker = json.loads(self.progress_path.read_text())
            return int(marker["round"]), bool(marker["complete"])
        except FileNotFoundError:
            return None
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(self.progress_path, f"corrupt progress marker: {exc!r}; delete it to "
                                                      "restart the run from round 0") from None

    def read_progress(self) -> int | None:
        """The last complete round, or None when no round (not even round 0) is complete."""
        marker = self._progress()
        return None if marker is None else marker[0]

    def is_complete(self) -> bool:
        marker = self._progress()
        return marker is not None and marker[1]

    def mark(self, round: int, complete: bool) -> None:
        write_atomic(self.progress_path, json.dumps({"round": round, "complete": complete}).encode())

    # ----------------------------------------------------------------- metrics
    def append_metrics(self, record: Mapping[str, Any]) -> None:
        """Append one line; a line cut by a crash or a full disk is dropped when the run resumes."""
        try:
            with open(self.metrics_path, "a") as fh:
                fh.write(json.dumps(record, sort_keys=True) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            raise write_error(self.metrics_path, exc) from None

    def read_metrics(self, upto: int | None = None) -> list[dict[str, Any]]:
        """Per-round records of complete rounds 0..``upto`` (default: the last complete round).

        Only the last line may be unreadable (cut by a kill or a full disk, without its
        newline); any other damage, or a missing round, raises ``CheckpointError``.
        """
        if upto is None:
            upto = self.read_progress()
        if upto is None or upto < 0:
            return []
        try:
            text = self.metrics_path.read_text()
        except FileNotFoundError:
            raise CheckpointError(self.metrics_path, f"missing, but rounds 0..{upto} are complete") from None
        except UnicodeDecodeError as exc:
            raise CheckpointError(self.metrics_path, f"is not text: {exc}") from None
        lines = text.splitlines()
        records = []
        for i, line in enumerate(lines):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                if i == len(lines) - 1 and not text.endswith("\n"):
                    continue  # the line being written when the run was interrupted
                raise CheckpointError(self.metrics_path, f"line {i + 1} is corrupt: {exc}") from None
            if not isinstance(rec, dict) or not isinstance(rec.get("round"), int):
                raise CheckpointError(self.metrics_path, f"line {i + 1} is not a round record")
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
        save_state_dict(state, path)

    def read_state(self, path: Path) -> State:
        return load_state_dict(path)

    def read_optional_state(self, path: Path) -> State:
        """A state file that may legitimately be absent (empty algorithm state)."""
        return load_state_dict(path) if path.exists() else {}

    def write_client_states(self, round: int, states: Mapping[int, Mapping[str, torch.Tensor]]) -> None:
        flat = {f"{k}/{name}": t for k, st in states.items() for name, t in st.items()}
        if flat:
            save_state_dict(flat, self.client_state_path(round))

    def read_client_states(self, round: int) -> dict[int, State]:
        flat = self.read_optional_state(self.client_state_path(round))
        out: dict[int, State] = {}
        for key, t in flat.items():
            k, name = key.split("/", 1)
            out.setdefault(int(k), {})[name] = t
        return out

    def prune_client_states(self, keep: int) -> None:
        """Delete per-client state files of rounds other than ``keep``."""
        folder = self.path / "client_state"
        if folder.is_dir():
            for f in folder.glob("round_*.safetensors"):
                if f.name != self.client_state_path(keep).name:
                    f.unlink(missing_ok=True)

    # -------------------------------------------------------------------- lock
    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Exclusive writer lock on the run directory (fails fast when held)."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            fh = open(self.path / ".lock", "w")
        except OSError as exc:
            raise write_error(self.path / ".lock", exc) from None
        try:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ConfigError(f"{self.path} is being written by another process; wait for it "
                                  "to finish or choose another out=") from None
            for stale in self.path.rglob(".*.tmp-*"):  # left by a killed writer: no one else writes now
                stale.unlink(missing_ok=True)
            yield
        finally:
            fh.close()
