"""The run manifest, ``manifest.json``: what a run folder must hold, checked as a whole.

Each file of a run folder checks only itself (JSON syntax, schema, the SHA-256 a checkpoint
carries of its own tensors). The manifest ties them together, so that another run's global
model, two swapped rounds or clients, a deleted checkpoint, an edited metric or an edited
configuration is refused instead of read as this run:

.. code-block:: text

    {"format": 1,
     "round": R,                       the last round recorded
     "config": SHA-256 of config.json (its JSON, keys sorted, no spaces),
     "partition": SHA-256 of the partition's index arrays (names, dtypes, shapes, bytes),
     "metrics": [SHA-256 of round 0's record, ..., of round R's],
     "checkpoints": {"global/round_0000.safetensors": {"round": 0, "client": null, "sha256": ...},
                     "clients/round_0001/client_00003.safetensors": {"round": 1, "client": 3, ...}, ...},
     "digest": SHA-256 of all the fields above}

A checkpoint's ``sha256`` is the digest of its tensors that it carries in its metadata
(:data:`landscape.space.checkpoints.DIGEST_KEY`). The writer records each round after its
files and metrics line and before ``progress.json`` (:func:`record_round`), so the manifest
is never behind the progress marker: after a kill it may be one round ahead, and that round is
recorded again when the run resumes. :func:`verify` checks a folder against it up to the last
complete round. The partition is checked where it is read against a fresh draw from the run's
seed (:func:`fl.rundir.checked_partition`), which is stronger than its recorded digest.
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from landscape.infra.errors import CheckpointError
from landscape.infra.files import write_json
from landscape.infra.reading import load_json, read_file
from landscape.space.checkpoints import DIGEST_KEY, stored_digest

from .run_schema import refuse_links
from .store import RunStore

FORMAT = 1
_ROUND_FILE = re.compile(r"round_(\d{4,})\.safetensors")
#: Folders of per-round checkpoints of the server (client checkpoints live in ``clients/``).
SERVER_FOLDERS = ("global", "train", "state", "client_state")
_RESTORE = "restore the run folder from a copy, or rerun it into a new folder"
_SEAL = ("a folder written before run manifests existed can be sealed once, after you have checked it: "
         "fl.seal_run(PATH)")


def json_digest(value: Any) -> str:
    """SHA-256 of ``value`` as JSON with sorted keys and no spaces (as config and records are read back).

    Parameters
    ----------
    value : Any
        A JSON value (a configuration, a metrics record).

    Returns
    -------
    str
        Hex digest.
    """
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":"),
                                     allow_nan=False).encode()).hexdigest()


def partition_digest(train: Sequence[np.ndarray], test: Sequence[np.ndarray]) -> str:
    """SHA-256 of a client partition: each array's name, dtype, shape and bytes, in client order.

    Parameters
    ----------
    train, test : Sequence[np.ndarray]
        Training and local test index arrays, one of each per client.

    Returns
    -------
    str
        Hex digest.
    """
    h = hashlib.sha256()
    for kind, arrays in (("train", train), ("test", test)):
        for k, a in enumerate(arrays):
            a = np.ascontiguousarray(a, dtype=np.int64)
            h.update(f"{kind}_{k:05d}|{a.shape}|".encode())
            h.update(a.tobytes())
    return h.hexdigest()


class Manifest:
    """A run folder's manifest, read and checked against its own digest.

    Parameters
    ----------
    store : RunStore
        The run folder.
    data : Mapping[str, Any]
        The parsed ``manifest.json``.
    """

    def __init__(self, store: RunStore, data: Mapping[str, Any]):
        self.store = store
        self.data = dict(data)
        self.checked = -1  # the last round :func:`verify` checked the folder against

    @property
    def path(self) -> Path:
        """The manifest file."""
        return self.store.manifest_path

    @classmethod
    def read(cls, store: RunStore) -> "Manifest":
        """Read ``manifest.json`` and check its structure and its own digest.

        Parameters
        ----------
        store : RunStore
            The run folder.

        Returns
        -------
        Manifest
            The manifest.

        Raises
        ------
        CheckpointError
            When the file is missing, a link, not a regular file, or damaged.
        """
        path = store.manifest_path
        refuse_links([path])
        try:
            data = load_json(read_file(path, "run manifest", CheckpointError))
        except FileNotFoundError:
            raise CheckpointError(path, "missing: every run folder written by fl.run records its content "
                                        "there, so this folder is incomplete, was not written by fl.run, or was "
                                        f"written by an older version; {_RESTORE}; {_SEAL}") from None
        except (ValueError, RecursionError) as exc:  # not JSON, not text, or an over-long integer
            raise CheckpointError(path, f"corrupt JSON: {exc}; {_RESTORE}") from None
        if not _well_formed(data):
            raise CheckpointError(path, f"is not a run manifest of format {FORMAT}; {_RESTORE}")
        if json_digest({k: v for k, v in data.items() if k != "digest"}) != data["digest"]:
            raise CheckpointError(path, f"is damaged: its content does not match its own digest; {_RESTORE}")
        return cls(store, data)

    @property
    def round(self) -> int:
        """The last round recorded."""
        return int(self.data["round"])

    def digest_of(self, path: Path) -> str | None:
        """The SHA-256 recorded for a checkpoint of the folder, or None when it is not listed.

        Parameters
        ----------
        path : Path
            A checkpoint path inside the run folder.

        Returns
        -------
        str or None
            The digest its metadata must hold.
        """
        entry = self.data["checkpoints"].get(path.relative_to(self.store.path).as_posix())
        return None if entry is None else entry["sha256"]


def verify(store: RunStore, upto: int, *, client_state: bool = False) -> Manifest:
    """Check a run folder against its manifest for rounds ``0..upto``.

    The configuration, every metrics record and every checkpoint of those rounds (``global``,
    ``train``, ``state``, ``clients``) must be the ones recorded: no file missing, none added,
    none with another digest.

    Parameters
    ----------
    store : RunStore
        The run folder.
    upto : int
        The last complete round (``progress.json``).
    client_state : bool
        Also check ``client_state`` of round ``upto`` (read only to resume; a writer replaces
        it every round, so readers of a run in progress skip it).

    Returns
    -------
    Manifest
        The checked manifest.

    Raises
    ------
    CheckpointError
        One line naming the first file that differs and how.
    """
    manifest = Manifest.read(store)
    if manifest.round < upto:
        raise CheckpointError(manifest.path, f"records rounds 0..{manifest.round}, but progress.json says round "
                                             f"{upto} is complete; {_RESTORE}")
    if json_digest(store.read_config()) != manifest.data["config"]:
        raise CheckpointError(store.config_path, "differs from the configuration recorded in the run's manifest "
                                                 f"(edited after the run was written?); {_RESTORE}")
    for record in store.read_metrics(upto):
        if json_digest(record) != manifest.data["metrics"][record["round"]]:
            raise CheckpointError(store.metrics_path, f"the record of round {record['round']} differs from the one "
                                                      f"recorded in the run's manifest (edited?); {_RESTORE}")
    listed = {name: e for name, e in manifest.data["checkpoints"].items() if e["round"] <= upto and
              (not name.startswith("client_state/") or (client_state and e["round"] == upto))}
    found = _checkpoints(store, upto, client_state)
    missing, extra = sorted(set(listed) - found), sorted(found - set(listed))
    if missing:
        raise CheckpointError(store.path / missing[0], f"is missing, but the run's manifest lists it as "
                                                       f"{_what(missing[0], listed[missing[0]])}; {_RESTORE}")
    if extra:
        raise CheckpointError(store.path / extra[0], "is not listed in the run's manifest (a file of another "
                                                     "run?); remove it")
    recorded = {e["sha256"]: name for name, e in manifest.data["checkpoints"].items()}
    for name, entry in sorted(listed.items()):
        digest = stored_digest(store.path / name)
        if digest is None:
            raise CheckpointError(store.path / name, f"carries no SHA-256 of its tensors ({DIGEST_KEY}): it was "
                                                     f"re-saved by another tool or replaced; {_RESTORE}")
        if digest != entry["sha256"]:
            other = recorded.get(digest)
            why = f"it holds the model recorded as {other} (files swapped?)" if other else \
                "another model was put in its place"
            raise CheckpointError(store.path / name, f"is not {_what(name, entry)} recorded in the run's "
                                                     f"manifest: {why}; {_RESTORE}")
    manifest.checked = upto
    return manifest


def record_round(store: RunStore, round: int, record: Mapping[str, Any],
                 previous: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Record round ``round`` in the manifest: its checkpoints (as found on disk) and metrics record.

    Called by the writer after the round's files and metrics line and before ``progress.json``;
    round 0 also records the configuration and the partition. Entries of later rounds (left by
    an interrupted attempt) and ``client_state`` entries older than the previous round are dropped.

    Parameters
    ----------
    store : RunStore
        The run folder.
    round : int
        The round just written.
    record : Mapping[str, Any]
        Its metrics record, as appended to ``metrics.jsonl``.
    previous : Mapping[str, Any], optional
        The manifest of the previous rounds as this writer last recorded it (what this
        function returned, or the ``data`` of a verified :class:`Manifest`); None reads it from
        the folder. A writer that keeps it avoids re-reading a file that grows with every round.

    Returns
    -------
    dict[str, Any]
        The manifest written (pass it as ``previous`` of the next round).

    Raises
    ------
    CheckpointError
        When a checkpoint just written carries no digest, or the manifest of the previous
        rounds is missing or damaged.
    """
    if round > 0 and previous is None:
        previous = Manifest.read(store).data
    data = _with_round(store, round, record, previous)
    write_json(store.manifest_path, data, indent=1, sort_keys=True)
    return data


def _with_round(store: RunStore, round: int, record: Mapping[str, Any],
                previous: Mapping[str, Any] | None) -> dict[str, Any]:
    """The manifest ``previous`` (None for round 0) with round ``round`` recorded, sealed by its digest."""
    if round == 0:
        previous = {"config": json_digest(store.read_config()),
                    "partition": partition_digest(*store.read_partition()), "metrics": [], "checkpoints": {}}
    keep = {name: e for name, e in previous["checkpoints"].items() if e["round"] < round and
            (not name.startswith("client_state/") or e["round"] == round - 1)}
    for name, client in _round_checkpoints(store, round).items():
        digest = stored_digest(store.path / name)
        if digest is None:
            raise CheckpointError(store.path / name, f"was written without its SHA-256 ({DIGEST_KEY})")
        keep[name] = {"round": round, "client": client, "sha256": digest}
    data = {"format": FORMAT, "round": round, "config": previous["config"], "partition": previous["partition"],
            "metrics": previous["metrics"][:round] + [json_digest(dict(record))], "checkpoints": keep}
    data["digest"] = json_digest(data)
    return data


def _well_formed(data: Any) -> bool:
    """Whether parsed JSON has the manifest's fields and types."""
    keys = {"format", "round", "config", "partition", "metrics", "checkpoints", "digest"}
    if not isinstance(data, dict) or set(data) != keys or data["format"] != FORMAT:
        return False
    entries = data["checkpoints"]
    return (isinstance(data["round"], int) and not isinstance(data["round"], bool) and data["round"] >= 0
            and all(isinstance(data[k], str) for k in ("config", "partition", "digest"))
            and isinstance(data["metrics"], list) and len(data["metrics"]) == data["round"] + 1
            and all(isinstance(d, str) for d in data["metrics"]) and isinstance(entries, dict)
            and all(isinstance(e, dict) and set(e) == {"round", "client", "sha256"} and isinstance(e["round"], int)
                    and isinstance(e["sha256"], str) and (e["client"] is None or isinstance(e["client"], int))
                    for e in entries.values()))


def _what(name: str, entry: Mapping[str, Any]) -> str:
    """What a manifest entry is, in words (``client 3's model of round 2``)."""
    if entry["client"] is not None:
        return f"client {entry['client']}'s model of round {entry['round']}"
    kind = {"global": "the global model", "train": "the training-architecture state", "state": "the algorithm "
            "state", "client_state": "the per-client server state"}.get(name.split("/")[0], "the checkpoint")
    return f"{kind} of round {entry['round']}"


def _round_checkpoints(store: RunStore, round: int) -> dict[str, int | None]:
    """Relative path -> client id (None for server files) of the checkpoints of ``round`` on disk."""
    paths: dict[Path, int | None] = {p: None for p in (store.global_path(round), store.train_path(round),
                                                       store.state_path(round), store.client_state_path(round))}
    paths.update({p: k for k, p in store.client_checkpoints(round).items()})
    return {p.relative_to(store.path).as_posix(): k for p, k in paths.items() if p.exists() or p.is_symlink()}


def _checkpoints(store: RunStore, upto: int, client_state: bool) -> set[str]:
    """Relative paths of the checkpoints of rounds ``0..upto`` on disk.

    With ``client_state``, also the client state of round ``upto``.
    """
    found = set()
    for folder in SERVER_FOLDERS if client_state else SERVER_FOLDERS[:-1]:
        if (store.path / folder).is_dir():
            for entry in (store.path / folder).iterdir():
                match = _ROUND_FILE.fullmatch(entry.name)
                if match and int(match.group(1)) <= upto and (folder != "client_state" or
                                                               int(match.group(1)) == upto):
                    found.add(f"{folder}/{entry.name}")
    for r in range(1, upto + 1):
        found.update(p.relative_to(store.path).as_posix() for p in store.client_checkpoints(r).values())
    return found


def seal(path: str | Path) -> Path:
    """Write the manifest of a complete-round run folder that has none (written by an older fl).

    Every checkpoint must carry its own SHA-256 (:data:`DIGEST_KEY`) and match it, and the
    metrics and partition must be readable; the manifest then records the folder as it is.
    Seal only a folder you trust: from then on any change to it is refused.

    Parameters
    ----------
    path : str or Path
        The run folder.

    Returns
    -------
    Path
        The manifest written.

    Raises
    ------
    CheckpointError
        When the folder already has a manifest, holds no complete round, or a checkpoint
        lacks or differs from its digest.
    """
    store = RunStore(Path(path))
    target = store.manifest_path
    if target.exists() or target.is_symlink():
        raise CheckpointError(target, "exists: this run is sealed already (fl.load_run checks it)")
    last = store.read_progress()
    if last is None:
        raise CheckpointError(store.path, "holds no complete round to seal")
    metrics = store.read_metrics(last)
    data: dict[str, Any] | None = None
    for r in range(last + 1):
        for name in _round_checkpoints(store, r):
            if stored_digest(store.path / name) is None:  # no digest to seal the file with
                raise CheckpointError(store.path / name, f"carries no SHA-256 of its tensors ({DIGEST_KEY}); "
                                                         "it cannot be sealed: restore the original")
            store.read_state(store.path / name)  # its tensors are checked against that digest
        data = _with_round(store, r, metrics[r], data)
    return write_json(target, data, indent=1, sort_keys=True)
